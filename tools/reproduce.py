"""Reproduce a section of BENCHMARKS.md: one command per section, run on the machine that section names.

Usage (from the repository root):
    python -m tools.reproduce                      list the sections: machine, time, what each measures
    python -m tools.reproduce SECTION...           print the sections' commands, then run them
    python -m tools.reproduce SECTION... --print   print them only

The sections named run in turn as one bash script: ``tools/device/setup.sh`` first (it installs wheels carried in
``.whl/`` where there are any, puts ``src/`` on the path and records the machine in ``$OUT/env.txt``), then each
command once (sections that make the same dataset make it once). Results
go to ``$OUT`` (default /tmp/out); ``--bundle`` packs them into ``$OUT/results.tgz`` at the end. A section that
needs GPUs stops before running anything where torch sees fewer CUDA devices than it needs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = "steps=100 warmup=30 workers=16 batch=128 imgsz=640 data=/tmp/synth/data.yaml"
BENCH_SHORT = BENCH.replace("steps=100 warmup=30", "steps=60 warmup=20")
SYNTH_10K = "python3 -m yolofeed synth out=/tmp/synth n_train=10000 n_val=500 seed=0"
PACK_10K = "python3 -m yolofeed pack data=/tmp/synth/data.yaml imgsz=640"
SMALL_320 = "python3 -m yolofeed synth out=/tmp/parity n_train=3000 n_val=500 imgsz=320 seed=0"
X2 = "export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"  # NVLink multicast off
LABELS_10K = ("python3 -c \"from ultralytics.data.dataset import YOLODataset; from ultralytics.cfg import get_cfg; "
              "from ultralytics.data.utils import check_det_dataset; d = check_det_dataset('/tmp/synth/data.yaml'); "
              "YOLODataset(img_path=d['train'], imgsz=640, augment=False, data=d, hyp=get_cfg())\" > /dev/null")
# stock's label cache, written before its bench as a user's second run finds it (the whole run: validation's too)
LABELS_10K_BOTH = LABELS_10K.replace("YOLODataset(img_path=d['train']", "[YOLODataset(img_path=d[s]").replace(
    "hyp=get_cfg())", "hyp=get_cfg()) for s in ('train', 'val')]")
PLANT_DATA = "[ -f /tmp/plant/data.yaml ] || python3 -m yolofeed synth out=/tmp/plant n_train=4000 n_val=2000 seed=0"
NO_WEIGHTS = "find $OUT -name '*.pt' -delete"
# each whole run under $OUT in a line: wall, set-up, first epoch, the later epochs' median, end
WHOLE_SUMMARY = ("python3 -c \"import json, glob, statistics as st; [print(f, r['mode'], r['wall_s'], r['setup_s'], "
                 "r['epochs'][0].get('epoch_s'), st.median([e.get('epoch_s', 0) for e in r['epochs'][1:]] or [0]), "
                 "st.median([e.get('train_s', 0) for e in r['epochs'][1:]] or [0]), r['final_s'], "
                 "round(sum(e.get('save_s', 0) for e in r['epochs']), 2)) for f in sorted(glob.glob("
                 "'$OUT/**/bench.json', recursive=True)) for r in json.load(open(f))['results'] if 'wall_s' in r]\"")
# what the runs left under $OUT but their reports (JSON, the tests' text) and the log, gone; the reports in one archive
# (what comes back from a device call is a few files, two folders deep)
KEEP_REPORTS = ("(cd $OUT && find . -type f \\( -name '*.json' -o -name '*.txt' \\) ! -name log.txt ! -name env.txt "
                "-print0 | tar czf reports.tgz --null -T - && find . -type f ! -name reports.tgz ! -name log.txt "
                "! -name env.txt -delete)")
BENCH_1 = "workers=16 batch=128 imgsz=640 data=/tmp/synth/data.yaml"  # a bench of one's own steps and warm-up
LEVER = f"steps=60 warmup=30 first_epoch=False isolate=True {BENCH_1}"  # the ceiling, one lever at a time


def task_bench(task: str, tag: str, limit: int) -> tuple[str, ...]:
    """A task's set of 10k images (``synth task=``), its pack, stock's label cache, and the bench of
    yolo11n-``tag`` side by side, stock, yolofeed and the ceiling, in ``limit`` seconds."""
    root = f"/tmp/synth-{tag}/"
    return (f"python3 -m yolofeed synth out={root[:-1]} n_train=10000 n_val=500 seed=0 task={task} 2>&1 | tail -2",
            f"python3 -m yolofeed pack data={root}data.yaml imgsz=640 task={task} 2>&1 | tail -2",
            LABELS_10K.replace("/tmp/synth/", root).replace("hyp=get_cfg())", f"hyp=get_cfg(), task='{task}')"),
            f"timeout {limit} python3 -m yolofeed bench model=yolo11n-{tag}.yaml modes=stock,yolofeed,ceiling steps=60 "
            f"warmup=20 {BENCH_1.replace('/tmp/synth/', root)} out=$OUT/bench_{tag}", NO_WEIGHTS)


SECTIONS_SEG = task_bench("segment", "seg", 360)
SECTIONS_POSE = task_bench("pose", "pose", 330)
SECTIONS_OBB = task_bench("obb", "obb", 330)


def whole_run(optimizer: str, limit: int, modes: str = "stock,yolofeed") -> tuple[str, ...]:
    """The whole run of 10 epochs, stock and yolofeed (or ``modes``), ``optimizer=``: the 10k set, its raw pack, both
    label caches; each run's line (``WHOLE_SUMMARY``) and its report in one archive (``KEEP_REPORTS``)."""
    return (SYNTH_10K, PACK_10K, LABELS_10K_BOTH,
            f"timeout {limit} python3 -m yolofeed bench model=yolo11n.yaml modes={modes} whole_run=10 "
            f"optimizer={optimizer} {BENCH_1} out=$OUT/whole_{optimizer}", NO_WEIGHTS, WHOLE_SUMMARY, KEEP_REPORTS)


def lever(model: str, modes: str, option: str, limit: int) -> str:
    """One bench at the ceiling with one of the step's levers set."""
    name = f"{model}_{option.replace('=', '-')}"
    return (f"timeout {limit} python3 -m yolofeed bench model={model}.yaml modes={modes} {option} {LEVER} "
            f"out=$OUT/levers_{name}")

# detection on polygon labels (the segment set's detection pack): the polygon path's GPU tests beside the CPU-bound
# synth and pack, the augmentation with and without the perspective's bound on the polygons it moves
# (polygon_bound), then yolo11n side by side. polygon-bound measured the bound, polygon-kernel the boxes' Triton
# kernel after it.
POLYGON_AUGMENT = (
    "timeout 240 python3 -m pytest -q -m gpu tests/test_augment_segments.py tests/test_train_detect_polygons.py "
    "tests/test_train_segment.py -p no:cacheprovider -rA > $OUT/gpu_tests_bound.txt 2>&1 &",
    SECTIONS_SEG[0], "python3 -m yolofeed pack data=/tmp/synth-seg/data.yaml imgsz=640 2>&1 | tail -2",
    LABELS_10K.replace("/tmp/synth/", "/tmp/synth-seg/"),
    "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_bound.txt | tail -20",
    "timeout 150 python3 -m tools.device.polygon_bound /tmp/synth-seg/data.yaml 2>&1 | grep -v Warning | tail -40",
    "timeout 240 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed,ceiling steps=60 warmup=20 "
    f"{BENCH_1.replace('/tmp/synth/', '/tmp/synth-seg/')} out=$OUT/bench_detect_polygons", NO_WEIGHTS)


@dataclass(frozen=True)
class Section:
    """One section of BENCHMARKS.md and the commands that reproduce its figures."""

    name: str
    heading: str  # the BENCHMARKS.md heading whose figures it reproduces
    kind: str  # the device kind it was measured on
    gpus: int  # CUDA devices it needs (0: none)
    minutes: int  # about, on that machine, once the machine is up
    commands: tuple[str, ...]


JPEG = "Raw and jpeg packs"
OBB = "Oriented boxes (OBB)"
SECTIONS = {s.name: s for s in (
    Section("throughput", "Training throughput", "nvidia-h200", 1, 9, (
        SYNTH_10K, PACK_10K,
        f"timeout 240 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed,ceiling,ceiling_stock {BENCH} "
        "out=$OUT/bench_yolo11n",
        f"timeout 140 python3 -m yolofeed bench model=yolo11s.yaml modes=stock,yolofeed,ceiling {BENCH} "
        "out=$OUT/bench_yolo11s",
        f"timeout 140 python3 -m yolofeed bench model=yolo26n.yaml modes=stock,yolofeed,ceiling {BENCH} "
        "out=$OUT/bench_yolo26n")),
    Section("throughput-11n", "Training throughput", "nvidia-h200", 1, 6, (
        # the first row of the throughput section alone: yolo11n side by side, stock, yolofeed and the ceiling
        SYNTH_10K, PACK_10K,
        f"timeout 300 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed,ceiling {BENCH} "
        "out=$OUT/bench_yolo11n", NO_WEIGHTS)),
    Section("whole-run", "The whole run", "nvidia-h200", 1, 8, (
        # the graphed step's GPU tests beside the CPU-bound synth and pack, then the whole run
        "timeout 200 python3 -m pytest -q -m gpu tests/test_graphed.py -p no:cacheprovider --tb=short -rA "
        "> $OUT/gpu_tests_graphed.txt 2>&1 &", *whole_run("auto", 430)[:2],
        "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed|Error' $OUT/gpu_tests_graphed.txt | tail -20",
        *whole_run("auto", 430)[2:])),
    Section("whole-run-musgd", "The whole run", "nvidia-h200", 1, 7, whole_run("MuSGD", 500)),
    Section("whole-run-beside", "The whole run", "nvidia-h200", 1, 9,
            whole_run("auto", 520, "stock,yolofeed_val_waited,yolofeed_val_inline")),
    Section("whole-run-overlap", "The whole run", "nvidia-h200", 1, 10, (
        # val_overlap's GPU test beside the CPU-bound synth and pack, then the whole run without it and with it (the
        # default)
        "timeout 200 python3 -m pytest -q -m gpu tests/test_val_overlap.py -p no:cacheprovider --tb=short -rA "
        "> $OUT/gpu_tests_overlap.txt 2>&1 &", *whole_run("auto", 540, "stock,yolofeed_val_waited,yolofeed")[:2],
        "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed|Error' $OUT/gpu_tests_overlap.txt | tail -20",
        *whole_run("auto", 540, "stock,yolofeed_val_waited,yolofeed")[2:])),
    Section("whole-run-default", "The whole run", "nvidia-h200", 1, 8, (
        # val_overlap's GPU tests (a capture waits for the validation beside it) beside the CPU-bound synth and pack,
        # then the whole run as a user gets it: val_overlap's default
        "timeout 240 python3 -m pytest -q -m gpu tests/test_val_overlap.py tests/test_augment_gpu.py "
        "tests/test_unplanned.py tests/test_saver.py tests/test_val_nms.py "
        "-k 'overlap or before_capture or unplanned or finite or cuda or batched_copy or batched_nms' "
        "-p no:cacheprovider --tb=short -rA > $OUT/gpu_tests_overlap.txt 2>&1 &",
        *whole_run("auto", 440)[:2],
        "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed|Error' $OUT/gpu_tests_overlap.txt | tail -20",
        # save_model's parts and yolofeed's hand-over to its checkpoint process, on this machine's GPU
        "timeout 90 python3 -m tools.device.save_profile /tmp/save_profile 2>&1 | tail -17",
        *whole_run("auto", 440)[2:])),
    Section("writes-ab", "The whole run", "nvidia-h200", 1, 5, (
        # the checkpoints written in the training thread (A: .base/src, 9466304's tree) and beside it (B: QueuedPath),
        # yolofeed's whole run of 10 epochs on 5,000 images in turn, A, B, A: each epoch's save_s
        "test -f .base/src/yolofeed/__init__.py || { echo 'carry .base: git archive <commit> src | tar -x -C .base'; "
        "exit 2; }",
        "python3 -m yolofeed synth out=/tmp/synth5k n_train=5000 n_val=500 seed=0",
        "python3 -m yolofeed pack data=/tmp/synth5k/data.yaml imgsz=640",
        "timeout 420 python3 -m tools.device.tree_ab base=.base/src name=$(cat .base/name 2>/dev/null) order=ABA "
        "out=$OUT/writes_ab -- model=yolo11n.yaml modes=yolofeed whole_run=10 optimizer=auto workers=16 batch=128 "
        "imgsz=640 data=/tmp/synth5k/data.yaml", NO_WEIGHTS)),
    Section("saver-ab", "The whole run", "nvidia-h200", 1, 5, (
        # yolofeed's whole run of 10 epochs on 5,000 images as the tree in .base/src has it (A) and as the library has
        # it (B), in turn, A, B, A (ORDER=): each epoch's save_s, train_s and epoch_s. Measured so: each checkpoint made
        # in the training thread (A: 7b0c932's tree) and in a process of its own (B: train/saver.py); the validation's
        # NMS image by image (A: 5975844's tree) and a group of images at a time (B: train/val_nms.py)
        "test -f .base/src/yolofeed/__init__.py || { echo 'carry .base: git archive <commit> src | tar -x -C .base'; "
        "exit 2; }",
        "python3 -m yolofeed synth out=/tmp/synth5k n_train=5000 n_val=500 seed=0",
        "python3 -m yolofeed pack data=/tmp/synth5k/data.yaml imgsz=640",
        "timeout 420 python3 -m tools.device.tree_ab base=.base/src name=$(cat .base/name 2>/dev/null) "
        "order=${ORDER:-ABA} out=$OUT/saver_ab -- model=yolo11n.yaml modes=yolofeed whole_run=10 optimizer=auto "
        "workers=16 batch=128 imgsz=640 data=/tmp/synth5k/data.yaml", NO_WEIGHTS,
        "python3 -c \"import json, glob, statistics as st; [print(f, r['wall_s'], r['setup_s'], r['final_s'], "
        "st.median(e['save_s'] for e in r['epochs'][1:]), st.median(e['train_s'] for e in r['epochs'][1:]), "
        "st.median(e['epoch_s'] for e in r['epochs'][1:9])) for f in sorted(glob.glob('$OUT/saver_ab/**/bench.json', "
        "recursive=True)) for r in json.load(open(f))['results']]\"")),
    Section("setup-profile", "The whole run", "nvidia-h200", 1, 5, (
        # where the set-up and the first epochs go, thread by thread (a sampling profile): stock's set-up and first
        # epoch; yolofeed's whole run of 1 epoch (its kernels compiled), then of 2 epochs (a user's second run: kept)
        SYNTH_10K, PACK_10K, LABELS_10K_BOTH,
        *(f"timeout {t} python3 -m tools.device.setup_profile trainer={tr} epochs={e} {BENCH_1} out={d} "
          f"> /tmp/{tr}_{e}.log 2>&1; grep -m1 ': wall ' /tmp/{tr}_{e}.log || tail -20 /tmp/{tr}_{e}.log"
          for tr, e, d, t in (("stock", 1, "$OUT", 150), ("yolofeed", 1, "/tmp/profile_first", 90),
                              ("yolofeed", 2, "$OUT", 100))), NO_WEIGHTS)),
    Section("host-profile", "The whole run", "nvidia-h200", 1, 4, (
        # py-spy (its wheel carried in .tools/) samples every thread's Python stacks through steady epochs of yolofeed's
        # run on 4,000 images; and torch._inductor's import from source and from bytecode
        "bash tools/device/host_profile.sh",)),
    Section("gil-convoy", "The whole run", "any (CPU)", 0, 1, ("python3 -m tools.gil_convoy",)),
    Section("first-epoch-ab", "The whole run", "nvidia-h200", 1, 9, (
        # yolofeed's whole run of 2 epochs (its set-up and first epoch) as three trees have it, C A B C A B: C the tree
        # in .base/c/src (21a9208: Triton's key at the first kernel launch), A the tree in .base/src (505cf8c: the key
        # computed beside the build; the train_batch grids handed the whole batch), B the library (the grids handed
        # the images they show); after a run that compiles the kernels. Then the library's run of 2 epochs profiled
        "test -f .base/src/yolofeed/__init__.py -a -f .base/c/src/yolofeed/__init__.py || { echo 'carry .base: git "
        "archive <commit> src | tar -x -C .base, and the third tree into .base/c'; exit 2; }", SYNTH_10K, PACK_10K,
        f"timeout 120 python3 -m yolofeed bench model=yolo11n.yaml modes=yolofeed whole_run=1 {BENCH_1} "
        "out=/tmp/compile > /tmp/compile.log 2>&1; tail -2 /tmp/compile.log",
        "timeout 360 python3 -m tools.device.tree_ab base=.base/src name=$(cat .base/name 2>/dev/null) "
        "base_c=.base/c/src name_c=$(cat .base/c/name 2>/dev/null) order=CABCAB out=$OUT/first_epoch_ab -- "
        f"model=yolo11n.yaml modes=yolofeed whole_run=2 optimizer=auto {BENCH_1}",
        f"timeout 80 python3 -m tools.device.setup_profile trainer=yolofeed epochs=2 {BENCH_1} out=$OUT/profile "
        "> /tmp/profile.log 2>&1; grep -m1 ': wall ' /tmp/profile.log || tail -20 /tmp/profile.log",
        NO_WEIGHTS, WHOLE_SUMMARY, KEEP_REPORTS)),
    Section("end-profile", "The whole run", "nvidia-h100-x1", 1, 4, (
        # the final validation's parts, yolofeed's then stock's, each training 2 epochs of 2,000 images
        "python3 -m yolofeed synth out=/tmp/s2k n_train=2000 n_val=500 seed=0",
        "python3 -m yolofeed pack data=/tmp/s2k/data.yaml imgsz=640",
        *(f"timeout 170 python3 -m tools.device.end_profile data=/tmp/s2k/data.yaml epochs=2 trainer={t} "
          f"out=$OUT/end > $OUT/end_{t}.log 2>&1; grep -A40 '^wall' $OUT/end_{t}.log | head -45"
          for t in ("yolofeed", "stock")), NO_WEIGHTS)),
    Section("end-ab", "The whole run", "nvidia-h100-x1", 1, 5, (
        # the final validation's parts (end_profile) as the tree in .base/src has it (A) and as the library has it
        # (B), in turn, A B A B, each yolofeed's EPOCHS= (2) epochs of 2,000 images; then each FLOPs count's thread,
        # start (from the final validation's) and seconds. Measured so: best.pt's FLOPs count made ahead in the
        # validation thread (A: 3e4151b's tree); the confusion matrix counted a batch at a time (EPOCHS=8, A: a9c3784's)
        "test -f .base/src/yolofeed/__init__.py || { echo 'carry .base: git archive <commit> src | tar -x -C .base'; "
        "exit 2; }",
        "python3 -m yolofeed synth out=/tmp/s2k n_train=2000 n_val=500 seed=0",
        "python3 -m yolofeed pack data=/tmp/s2k/data.yaml imgsz=640",
        *(f"{env}timeout 100 python3 -m tools.device.end_profile data=/tmp/s2k/data.yaml epochs=${{EPOCHS:-2}} "
          "trainer=yolofeed "
          f"out=$OUT/end_{k} > $OUT/end_{k}.log 2>&1; echo {k} $(cat .base/name 2>/dev/null); "
          f"grep -A12 '^wall' $OUT/end_{k}.log | head -13; python3 -c \"import json; [print('  get_flops', c[1][:20], "
          f"round(c[2], 3), round(c[3], 3)) for c in json.load(open('$OUT/end_{k}/calls_yolofeed.json')) "
          f"if c[0] == 'get_flops']\""
          for k, env in (("A1", "PYTHONPATH=$PWD/.base/src:$PYTHONPATH "), ("B1", ""),
                         ("A2", "PYTHONPATH=$PWD/.base/src:$PYTHONPATH "), ("B2", ""))), NO_WEIGHTS)),
    Section("musgd-phase", "The optimiser step with MuSGD", "nvidia-h200", 1, 2, (
        "timeout 120 python3 -m tools.device.optimizer_phase yolo11n.yaml yolo26n.yaml 2>&1 | grep -v 'optimizer:' "
        "| tee $OUT/optimizer_phase.txt",
        "timeout 150 python3 -m pytest -q -m gpu tests/test_musgd.py tests/test_step.py -p no:cacheprovider -rA 2>&1 "
        "| tail -30 | tee $OUT/gpu_tests_step.txt")),
    Section("musgd", "The optimiser step with MuSGD", "nvidia-h200", 1, 7, (
        SYNTH_10K, PACK_10K,
        "timeout 300 python3 -m tools.device.step_ab /tmp/synth/data.yaml yolo11n.yaml "
        "ceiling_stock_musgd,ceiling,yolofeed_stock_musgd,yolofeed --optimizer MuSGD --steps 60 --warmup 30",
        LABELS_10K,
        f"timeout 330 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed,ceiling steps=60 warmup=20 "
        f"first_epoch=True isolate=True optimizer=MuSGD {BENCH_1} out=$OUT/bench_musgd", NO_WEIGHTS)),
    Section("step-compile", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 10, (
        SYNTH_10K, PACK_10K, lever("yolo11n", "ceiling", "compile=False", 120),
        lever("yolo11n", "ceiling,yolofeed", "compile=True", 330), lever("yolo26n", "ceiling", "compile=False", 120),
        lever("yolo26n", "ceiling", "compile=True", 300), NO_WEIGHTS)),
    Section("step-deterministic", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 3, (
        SYNTH_10K, PACK_10K, lever("yolo11n", "ceiling", "deterministic=True", 120),
        lever("yolo11n", "ceiling", "deterministic=False", 120), NO_WEIGHTS)),
    Section("first-own", "First epoch", "nvidia-h200", 1, 6, (
        SYNTH_10K, PACK_10K, PACK_10K + " format=jpeg", LABELS_10K,
        f"timeout 220 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed,yolofeed_jpeg {BENCH_SHORT} "
        "first_epoch=True out=$OUT/first_own_yolo11n",
        f"timeout 160 python3 -m yolofeed bench model=yolo26n.yaml modes=stock,yolofeed {BENCH_SHORT} "
        "first_epoch=True out=$OUT/first_own_yolo26n")),
    Section("plan-threads", "First epoch", "nvidia-h200", 1, 2, (
        "timeout 120 python3 -m tools.device.plan_threads 2>&1 | grep -v Warning | tail -12",)),
    Section("plan-cost", "First epoch", "nvidia-h200", 1, 3, (
        "timeout 400 python3 -m tools.device.plan_cost out=$OUT/plan_cost 2>&1 | grep -v Warning | tail -12",)),
    Section("short-batches-ab", "First epoch", "nvidia-h200", 1, 8, (
        # the short batches' GPU test beside the CPU-bound synth and pack; then yolofeed's whole run of 2 epochs with
        # the short batches' set-up in the warm-up (A) and beside the first epoch (B), A B A; then plan-cost
        "timeout 150 python3 -m pytest -q -m gpu tests/test_short_batches.py tests/test_warmup.py -p no:cacheprovider "
        "-rA > $OUT/gpu_tests_short.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_short.txt | tail -8",
        "timeout 330 python3 -m tools.device.swap_ab off=short_batches out=$OUT/short_batches_ab -- "
        f"model=yolo11n.yaml modes=yolofeed whole_run=2 {BENCH_1}", NO_WEIGHTS,
        "timeout 150 python3 -m tools.device.plan_cost out=$OUT/plan_cost 2>&1 | grep -v Warning | tail -12")),
    Section("early-plans-ab", "The whole run", "nvidia-h200", 1, 9, (
        # the GPU tests of what moved (the capture in the early plans' thread, the short batches, the warm-up, the
        # validations' set-up) beside the CPU-bound synth and pack; then yolofeed's whole run of 2 epochs as the tree
        # in .base/src has it (A: made here with git archive, carried) and as the library has it (B), A B A B
        "test -f .base/src/yolofeed/__init__.py || { echo 'carry .base: git archive <commit> src | tar -x -C .base'; "
        "exit 2; }",
        "timeout 200 python3 -m pytest -q -m gpu tests/test_graphed.py tests/test_short_batches.py "
        "tests/test_warmup.py tests/test_validation_thread.py tests/test_val_overlap.py "
        "-k 'ahead or short or warm or set_up or overlap' "
        "-p no:cacheprovider -rA > $OUT/gpu_tests_plans.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_plans.txt | tail -12",
        "timeout 330 python3 -m tools.device.tree_ab base=.base/src name=$(cat .base/name 2>/dev/null) order=ABAB "
        f"out=$OUT/early_plans_ab -- model=yolo11n.yaml modes=yolofeed whole_run=2 {BENCH_1}", NO_WEIGHTS)),
    Section("short-conv", "First epoch", "nvidia-h100-x1", 1, 8, (
        # the GPU tests of the short batch as GEMMs beside the CPU-bound synth and pack; then the short batch's cost
        # with cuDNN's plans and as GEMMs, each case in a fresh process, channels-last as the trainer runs, at 16 and
        # 64 images; then yolofeed's whole run of 3 epochs with the short batch's cuDNN plans beside the first epoch
        # (A) and as GEMMs (B), A B A
        "timeout 200 python3 -m pytest -q -m gpu tests/test_unplanned.py tests/test_short_batches.py "
        "tests/test_warmup.py -p no:cacheprovider -rA > $OUT/gpu_tests_unplanned.txt 2>&1 &",
        SYNTH_10K, PACK_10K,
        "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_unplanned.txt | tail -12",
        "timeout 130 python3 -m tools.device.short_conv out=$OUT/short_conv_16 2>&1 | grep -v Warning | tail -4",
        "timeout 110 python3 -m tools.device.short_conv short=64 out=$OUT/short_conv_64 2>&1 | grep -v Warning "
        "| tail -4",
        "timeout 200 python3 -m tools.device.swap_ab off=unplanned out=$OUT/unplanned_ab -- model=yolo11n.yaml "
        f"modes=yolofeed whole_run=3 {BENCH_1}", NO_WEIGHTS)),
    Section("multi-scale", "Multi-scale training", "nvidia-h200", 1, 4, (
        SYNTH_10K, PACK_10K,
        f"timeout 200 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed {BENCH} multi_scale=0.5 "
        "out=$OUT/bench_multi_scale")),
    Section("no-triton", "Without Triton", "nvidia-h200", 1, 3, (
        SYNTH_10K, PACK_10K,
        f"timeout 150 python3 -m tools.device.no_triton yolofeed bench model=yolo11n.yaml modes=yolofeed,ceiling "
        f"{BENCH} out=$OUT/bench_no_triton",
        "python3 -m yolofeed synth out=/tmp/synth-aug n_train=1024 n_val=8 seed=0",
        "mkdir -p $OUT/triton $OUT/no_triton",
        "OUT=$OUT/triton python3 -m tools.device.augment_bench /tmp/synth-aug/data.yaml > /dev/null",
        "OUT=$OUT/no_triton python3 -m tools.device.no_triton tools.device.augment_bench /tmp/synth-aug/data.yaml "
        "> /dev/null")),
    Section("jpeg-parts", JPEG, "nvidia-h200", 1, 8, (
        SYNTH_10K, PACK_10K, PACK_10K + " format=jpeg",
        "timeout 480 python3 -m tools.device.step_ab /tmp/synth/data.yaml yolo11n.yaml yolofeed,yolofeed_jpeg,"
        "yolofeed_jpeg,yolofeed,yolofeed,yolofeed_jpeg,yolofeed_jpeg,yolofeed,yolofeed,yolofeed_jpeg",
        "timeout 240 python3 -m tools.device.step_ab /tmp/synth/data.yaml yolo11n.yaml yolofeed,yolofeed_jpeg,"
        "yolofeed_jpeg,yolofeed",
        "python3 -m pytest -q -m gpu tests/pack/test_codecs_jpeg.py -p no:cacheprovider 2>&1 | tail -3")),
    Section("coco-data", "COCO scale on one machine", "nvidia-h200", 0, 8, (
        "PHASE=data bash tools/device/coco_scale.sh",)),
    Section("coco-train", "COCO scale on one machine", "nvidia-h200", 1, 6, (
        "PHASE=train bash tools/device/coco_scale.sh",)),
    Section("pack", "Pack build rate", "nvidia-h200", 0, 8, (
        "bash tools/device/pack_bench.sh",
        "timeout 200 python3 -m tools.device.build_parts /tmp/synth/data.yaml --workers 16 --repeats 3 --dir /dev/shm "
        "--variants 'as built,reserved up front,payloads not written (nor read-back)'",
        "timeout 200 python3 -m tools.device.build_parts /tmp/synth/data.yaml --workers 16 --repeats 3 "
        "--dir /dev/shm")),
    Section("crc", "Checking pixels on every read", "any (CPU)", 0, 1, ("python3 -m tools.pack_crc_cost",)),
    Section("loader-polygons", "Detection on polygon labels", "any (CPU)", 0, 1,
            ("python3 -m tools.loader_polygon_cost",)),
    Section("augment", "GPU augmentation", "nvidia-h200", 1, 3, (
        "python3 -m yolofeed synth out=/tmp/synth-aug n_train=1024 n_val=8 seed=0",
        "python3 -m pytest -q -m gpu tests/test_augment_gpu.py -p no:cacheprovider -rA 2>&1 | tail -12",
        "python3 -m tools.device.augment_bench /tmp/synth-aug/data.yaml")),
    Section("doctor-1", "Doctor on planted bottlenecks", "nvidia-h200", 1, 6, (
        PLANT_DATA, "PLANT_DATA=/tmp/plant bash tools/device/doctor_plant.sh workers,augment,contention,gpu_bound")),
    Section("doctor-2", "Doctor on planted bottlenecks", "nvidia-h200", 1, 7, (
        PLANT_DATA, "PLANT_DATA=/tmp/plant bash tools/device/doctor_plant.sh small_batch,validation,disk")),
    Section("overhead", "Accounting overhead", "nvidia-h200", 1, 3, (
        PLANT_DATA, "python3 -m tools.device.monitor_overhead /tmp/plant/data.yaml")),
    Section("val-equality", "Validation through the pack", "nvidia-h200", 1, 6, (
        SMALL_320,
        "python3 -m yolofeed train model=yolo11n.yaml data=/tmp/parity/data.yaml epochs=30 imgsz=320 batch=64 "
        "seed=0 project=/tmp/runs name=val_equality exist_ok=True plots=False",
        "python3 -m tools.device.val_equality /tmp/runs/val_equality/weights/best.pt /tmp/parity/data.yaml "
        "imgsz=320 batch=32 device=0 | tee $OUT/val_equality.json")),
    Section("ddp", "Two GPUs (DDP)", "nvidia-h200-x2", 2, 4, (
        X2, SMALL_320, "python3 -m yolofeed pack data=/tmp/parity/data.yaml imgsz=320",
        "timeout 200 python3 -m yolofeed train model=yolo11n.yaml data=/tmp/parity/data.yaml imgsz=320 epochs=2 "
        "batch=128 device=0,1 project=$OUT/ddp name=yolofeed exist_ok=True plots=False 2>&1 | tail -25",
        "find $OUT/ddp -name '*.pt' -delete")),
    Section("parity", "Training quality", "nvidia-h200-x2", 2, 9, ("bash tools/device/parity.sh",)),
    Section("parity-more", "Training quality", "nvidia-h200-x2", 2, 8, (
        "NO_GPU_TESTS=1 NO_SMOKE=1 FIRST11=4 SEEDS11=4 PAR11=4 LIMIT=390 bash tools/device/parity.sh",)),
    Section("parity-26", "Training quality", "nvidia-h200-x2", 2, 7, (
        "SEEDS11=0 FIRST26=3 SEEDS26=5 PAR26=5 CORES26=0-31 LIMIT=450 bash tools/device/parity.sh",)),
    Section("parity-musgd", "Training quality", "nvidia-h200", 1, 8, (
        "DEVICES=0 EXTRA=optimizer=MuSGD SEEDS11=4 PAR11=8 CORES11=0-15 SEEDS26=0 N_TRAIN=1500 EPOCHS=30 LIMIT=500 "
        "NO_SMOKE=1 bash tools/device/parity.sh",)),
    Section("detect-polygons", "Detection on polygon labels", "any (CPU)", 0, 1, (
        "python3 -m yolofeed synth out=/tmp/segsmall n_train=200 n_val=20 imgsz=320 seed=0 task=segment",
        "python3 -m tools.detect_polygon_boxes /tmp/segsmall/data.yaml",
        "python3 -m tools.detect_polygon_boxes /tmp/segsmall/data.yaml degrees=10")),
    Section("parity-merge", "Training quality", "any (CPU)", 0, 1, (
        "python3 -m tools.parity_merge docs/parity/yolo11n-seeds0-3.json docs/parity/yolo11n-seeds4-7.json "
        "--plot $OUT/parity-yolo11n.png",
        "python3 -m tools.parity_merge docs/parity/yolo26n-seeds0-2.json docs/parity/yolo26n-seeds3-7.json "
        "--plot $OUT/parity-yolo26n.png",
        "python3 -m tools.parity_merge docs/parity/yolo11n-musgd-seeds0-3.json docs/parity/yolo11n-musgd-seeds4-7.json "
        "--plot $OUT/parity-yolo11n-musgd.png",
        "python3 -m tools.parity_merge docs/parity/yolo11n-graphed-seeds0-3.json "
        "docs/parity/yolo11n-graphed-seeds4-7.json --plot $OUT/parity-yolo11n-graphed.png",
        "python3 -m tools.parity_merge docs/parity/yolo11n-musgd-graphed-seeds0-3.json "
        "docs/parity/yolo11n-musgd-graphed-seeds4-7.json docs/parity/yolo11n-musgd-graphed-seeds8-11.json "
        "--plot $OUT/parity-yolo11n-musgd-graphed.png",
        "python3 -m tools.parity_merge docs/parity/yolo11n-halves-bce-seeds0-3.json "
        "docs/parity/yolo11n-halves-bce-seeds4-7.json --plot $OUT/parity-yolo11n-halves-bce.png",
        "python3 -m tools.parity_merge docs/parity/yolo11n-musgd-every-seeds0-3.json "
        "docs/parity/yolo11n-musgd-every-seeds8-11.json --plot $OUT/parity-yolo11n-musgd-every.png",
        "python3 -m tools.parity_merge docs/parity/yolo11n-current-seeds0-3.json "
        "docs/parity/yolo11n-current-seeds4-7.json --plot $OUT/parity-yolo11n-current.png",
        "python3 -m tools.parity_merge docs/parity/yolo11n-musgd-current-seeds0-3.json "
        "docs/parity/yolo11n-musgd-current-seeds4-7.json --plot $OUT/parity-yolo11n-musgd-current.png")),
    Section("parity-graphed", "Training quality", "nvidia-h200", 1, 9, (
        "DEVICES=0 SEEDS11=4 PAR11=8 CORES11=0-15 SEEDS26=0 N_TRAIN=1500 EPOCHS=30 LIMIT=490 NO_SMOKE=1 NO_GPU_TESTS=1 "
        "bash tools/device/parity.sh",)),
    Section("parity-graphed-more", "Training quality", "nvidia-h200", 1, 9, (
        "DEVICES=0 SEEDS11=4 FIRST11=4 PAR11=8 CORES11=0-15 SEEDS26=0 N_TRAIN=1500 EPOCHS=30 LIMIT=420 NO_SMOKE=1 "
        "NO_GPU_TESTS=1 bash tools/device/parity.sh",)),
    Section("parity-musgd-more", "Training quality", "nvidia-h200", 1, 9, (
        "DEVICES=0 EXTRA=optimizer=MuSGD SEEDS11=4 FIRST11=4 PAR11=8 CORES11=0-15 SEEDS26=0 N_TRAIN=1500 EPOCHS=30 "
        "LIMIT=470 NO_SMOKE=1 bash tools/device/parity.sh",)),
    Section("parity-musgd-graphed", "Training quality", "nvidia-h200", 1, 9, (
        "DEVICES=0 EXTRA=optimizer=MuSGD SEEDS11=4 PAR11=8 CORES11=0-15 SEEDS26=0 N_TRAIN=1500 EPOCHS=30 LIMIT=480 "
        "NO_SMOKE=1 NO_GPU_TESTS=1 bash tools/device/parity.sh",)),
    Section("parity-musgd-graphed-more", "Training quality", "nvidia-h200", 1, 7, (
        "DEVICES=0 EXTRA=optimizer=MuSGD SEEDS11=4 FIRST11=8 PAR11=8 CORES11=0-15 SEEDS26=0 N_TRAIN=1500 EPOCHS=30 "
        "LIMIT=380 NO_SMOKE=1 NO_GPU_TESTS=1 bash tools/device/parity.sh",)),
    Section("step-levers", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 6, (
        "timeout 200 python3 -m tools.step_levers model=yolo11n.yaml copies=1 "
        "levers=compiled_bn_silu,split_cv1,cuda_graph,bf16,nchw out=$OUT/levers",
        "timeout 150 python3 -m tools.step_levers model=yolo26n.yaml levers=compiled_bn_silu,split_cv1 "
        "out=$OUT/levers")),
    Section("step-fused-profile", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 3, (
        # the step the graph replays, launched eagerly: its kernels by kind and its copies with their callers
        "timeout 200 python3 -m tools.step_levers model=yolo11n.yaml base=fused_eager copies=1 levers= "
        "out=$OUT/levers_fused",)),
    Section("bn-silu-tune", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 4, (
        # the fused op's four kernels on yolo11n's 71 activations under several launch configurations
        "timeout 300 python3 -m tools.device.bn_silu_tune model=yolo11n.yaml "
        "stats=4096:4:512,4096:8:512,4096:8:1024,4096:8:2048,2048:4:1024,2048:4:2048,2048:8:2048,1024:4:2048,"
        "1024:4:4096,1024:2:4096,8192:8:1024,8192:16:1024 flat=4096:4,8192:4,8192:8,2048:4,16384:8 "
        "out=$OUT/bn_silu_tune",)),
    Section("bn-silu-ab", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # the fused op's kernels under more launch configurations beside the CPU-bound synth and pack; then the
        # ceiling under the configuration as it was and the fastest of them, in turn
        "timeout 300 python3 -m tools.device.bn_silu_tune model=yolo11n.yaml "
        "stats=4096:4:512,4096:8:512,4096:8:256,4096:16:512,4096:16:256,8192:8:512,8192:16:512,8192:16:256,"
        "2048:8:512,2048:8:256 flat=4096:4,2048:4,2048:8,1024:4,1024:2 out=$OUT/bn_silu_tune2 "
        "> $OUT/bn_silu_tune2.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; grep -v Warning $OUT/bn_silu_tune2.txt | tail -40",
        "timeout 420 python3 -m tools.device.bn_silu_ab tune=$OUT/bn_silu_tune2/yolo11n.json a=4096:4:512/4096:4 "
        f"out=$OUT/bn_ab -- model=yolo11n.yaml modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("bn-silu-ab-26n", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # the fused op's GPU tests and the graphed step's with the launch configuration bn-silu-ab chose, beside the
        # CPU-bound synth and pack; then yolo26n's ceiling under the configuration before it and that one, in turn
        "timeout 200 python3 -m pytest -q -m gpu tests/test_bn_silu.py tests/test_graphed.py tests/test_step.py "
        "-p no:cacheprovider --tb=short -rA > $OUT/gpu_tests_bn.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_bn.txt | tail -30",
        "timeout 330 python3 -m tools.device.bn_silu_ab a=4096:4:512/4096:4 b=4096:8:256/1024:2 out=$OUT/bn_ab_26n "
        f"-- model=yolo26n.yaml modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("bn-silu-unroll", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # the statistics passes reading several tiles an iteration (UNROLL) and pipelined over more or fewer stages
        # (num_stages), beside the CPU-bound synth and pack;
        # then the ceiling under the default and the fastest of them, in turn
        "timeout 240 python3 -m tools.device.bn_silu_tune model=yolo11n.yaml "
        "stats=4096:8:256:1,4096:8:256:2,4096:8:256:4,2048:8:256:2,2048:8:512:2,2048:8:512:4,4096:4:256:2,"
        "4096:8:512:2,1024:4:512:4,4096:8:256:1:1,4096:8:256:2:1,4096:8:256:1:5 flat=1024:2 out=$OUT/bn_silu_unroll "
        "> $OUT/bn_silu_unroll.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; grep -v Warning $OUT/bn_silu_unroll.txt | tail -40",
        "timeout 330 python3 -m tools.device.bn_silu_ab tune=$OUT/bn_silu_unroll/yolo11n.json "
        f"a=4096:8:256:1/1024:2 out=$OUT/bn_ab_unroll -- model=yolo11n.yaml modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("step-cat", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # the channel concatenations as the Triton copy: its GPU test, then the step alone, graphed with and without
        "timeout 150 python3 -m pytest -q -m gpu tests/test_channel_cat.py -p no:cacheprovider --tb=short -rA "
        "2>&1 | tail -5",
        "timeout 200 python3 -m tools.step_levers model=yolo11n.yaml "
        "levers=graphed,graphed+triton_cat,triton_cat,graphed+triton_cat_dense out=$OUT/levers_cat",
        "timeout 150 python3 -m tools.step_levers model=yolo26n.yaml "
        "levers=graphed,graphed+triton_cat,graphed+triton_cat_dense out=$OUT/levers_cat",
        # the step the graph replays, its copies by layer and direction
        "timeout 200 python3 -m tools.step_levers model=yolo11n.yaml base=fused_eager copies=1 levers= "
        "out=$OUT/levers_fused_layers")),
    Section("step-layout", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # the layout swaps' GPU tests and the step graphed without and with them beside the CPU-bound synth and pack
        # (graphed+triton_cat: the Triton cat, since then in the capture itself); then the ceiling without them, with
        # them, without them again
        f"({SYNTH_10K} && {PACK_10K}) > $OUT/synth_pack.txt 2>&1 &",
        "timeout 150 python3 -m pytest -q -m gpu tests/test_graphed.py -p no:cacheprovider --tb=short -rA 2>&1 "
        "| grep -E 'PASSED|FAILED|ERROR|passed|failed|Error' | tail -20",
        "timeout 150 python3 -m tools.step_levers model=yolo11n.yaml "
        "levers=graphed_stock_layout,graphed,graphed+triton_cat out=$OUT/levers_layout",
        "timeout 120 python3 -m tools.step_levers model=yolo26n.yaml levers=graphed_stock_layout,graphed "
        "out=$OUT/levers_layout",
        "wait; tail -2 $OUT/synth_pack.txt",
        f"timeout 300 python3 -m tools.device.swap_ab off=swap_layout out=$OUT/layout_ab -- model=yolo11n.yaml "
        f"modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("step-cast", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 6, (
        # the Triton cat's and the graphed step's GPU tests (the weights cast at once among them); then the step
        # graphed as the trainer makes it without the weights cast at once, with them, with Ultralytics' layout
        "timeout 200 python3 -m pytest -q -m gpu tests/test_channel_cat.py tests/test_graphed.py -p no:cacheprovider "
        "--tb=short -rA 2>&1 | grep -E 'PASSED|FAILED|ERROR|passed|failed|Error' | tail -20",
        "timeout 150 python3 -m tools.step_levers model=yolo11n.yaml "
        "levers=graphed_uncast,graphed,graphed_stock_layout out=$OUT/levers_cast",
        "timeout 120 python3 -m tools.step_levers model=yolo26n.yaml levers=graphed_uncast,graphed "
        "out=$OUT/levers_cast")),
    Section("cast-ab", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # the GPU tests of the Triton cat, the graphed step (the weights cast at once among them) and the fused op
        # (its statistics passes reading two tiles an iteration), beside the CPU-bound synth and pack; then the
        # ceiling without the weights cast at once and with one tile an iteration, as the library is, without again
        "timeout 300 python3 -m pytest -q -m gpu tests/test_channel_cat.py tests/test_graphed.py tests/test_bn_silu.py "
        "-p no:cacheprovider --tb=short -rA > $OUT/gpu_tests_cast.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_cast.txt | tail -30",
        f"timeout 340 python3 -m tools.device.swap_ab off=swap_convs knobs=_UNROLL=1 out=$OUT/cast_ab -- "
        f"model=yolo11n.yaml modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("halves-ab", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # the GPU tests of the fused op (its halves bit for bit against the whole op) and the graphed step (the halves
        # bit for bit against the chunked step, yolo11n and yolo26n), beside the CPU-bound synth and pack; then the
        # ceiling without C2f/C3k2's cv1 output as two dense halves, as the library is, without again
        "timeout 300 python3 -m pytest -q -m gpu tests/test_bn_silu.py tests/test_graphed.py "
        "-p no:cacheprovider --tb=short -rA > $OUT/gpu_tests_halves.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_halves.txt | tail -40",
        f"timeout 340 python3 -m tools.device.swap_ab off=swap_halves out=$OUT/halves_ab -- "
        f"model=yolo11n.yaml modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("bce-ab", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # the GPU tests of the loss's classification term as one fused pass each way (its gradient bit for bit
        # against ATen's, a whole detection loss with and without it), beside the CPU-bound synth and pack; then the
        # ceiling without the term fused, as the library is, without again
        "timeout 200 python3 -m pytest -q -m gpu tests/test_bce_sum.py tests/test_loss.py -p no:cacheprovider "
        "--tb=short -rA > $OUT/gpu_tests_bce.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_bce.txt | tail -30",
        f"timeout 340 python3 -m tools.device.swap_ab off=bce_sum out=$OUT/bce_ab -- model=yolo11n.yaml "
        f"modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("ceiling-26n", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # the fused classification term's and the warm-up's GPU tests beside the CPU-bound synth and pack; the
        # ceiling's kernels (yolo11n), in the graphs and out; then yolo26n's ceiling without the graphed step
        # (eager: no graph, no fused op, no swap; the classification term fused on both sides), as the library is,
        # without again
        "timeout 200 python3 -m pytest -q -m gpu tests/test_bce_sum.py tests/test_warmup.py -p no:cacheprovider "
        "--tb=short -rA > $OUT/gpu_tests_26n.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_26n.txt | tail -30",
        f"timeout 120 python3 -m tools.device.ceiling_kernels model=yolo11n.yaml {BENCH_1} steps=40 profile=5 "
        "out=$OUT/ceiling_kernels 2>&1 | grep -v Warning | tail -70",
        f"timeout 330 python3 -m tools.device.swap_ab off=install out=$OUT/graphed_ab_26n -- "
        f"model=yolo26n.yaml modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("before-after-26n", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # beside the CPU-bound synth and pack: val_overlap's GPU test without the wait before a capture and with the
        # validation thread's device syncs made stream syncs (tools/device/capture_beside.py), then FastMuSGD's
        # before_capture test; then yolo26n's ceiling with the step as it was before issue 29's levers (no graph, no
        # fused op or swap, the classification term unfused, Ultralytics' float32 image), as the library is, before
        "(timeout 150 python3 -m pytest -q -m gpu tests/test_val_overlap.py -k on_a_gpu -p tools.device.capture_beside "
        "-p no:cacheprovider --tb=short -rA -s; timeout 90 python3 -m pytest -q -m gpu tests/test_musgd.py -k "
        "before_capture -p no:cacheprovider --tb=short -rA) > $OUT/gpu_tests_capture.txt 2>&1 &",
        SYNTH_10K, PACK_10K,
        "wait; grep -E 'capture_beside:|PASSED|FAILED|ERROR|passed|failed|Error' $OUT/gpu_tests_capture.txt | tail -30",
        f"timeout 330 python3 -m tools.device.swap_ab off=install,bce_sum,half_input,grid_candidates,foreground_norm "
        f"out=$OUT/before_after_26n -- "
        f"model=yolo26n.yaml modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("before-after-11n", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 6, (
        # yolo11n's ceiling with the step as it was before issue 29's levers, as the library is, before again; then
        # where yolo26n's ceiling's kernels go, in the graphs and out
        SYNTH_10K, PACK_10K,
        f"timeout 120 python3 -m tools.device.ceiling_kernels model=yolo26n.yaml {BENCH_1} steps=40 profile=5 "
        "out=$OUT/ceiling_kernels_26n 2>&1 | grep -v Warning | tail -70",
        f"timeout 300 python3 -m tools.device.swap_ab off=install,bce_sum,half_input,grid_candidates,foreground_norm "
        f"out=$OUT/before_after_11n -- "
        f"model=yolo11n.yaml modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("before-after-26n-assigner", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 10, (
        # the losses' GPU tests beside a smaller synth and pack (the ceiling replays four GPU-resident batches: the
        # dataset's size does not enter its rate); then yolofeed's ceiling with yolo26n, in one call: the step before
        # issue 29's levers (A), the library without the assigner's two levers (C), the library (B), A again
        "timeout 150 python3 -m pytest -q -m gpu tests/test_loss.py -p no:cacheprovider --tb=short -rA "
        "> $OUT/gpu_tests_loss.txt 2>&1 &",
        "python3 -m yolofeed synth out=/tmp/synth2k n_train=2000 n_val=200 seed=0",
        "python3 -m yolofeed pack data=/tmp/synth2k/data.yaml imgsz=640",
        "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_loss.txt | tail -20",
        "timeout 520 python3 -m tools.device.swap_ab off=install,bce_sum,half_input,grid_candidates,foreground_norm "
        "also=grid_candidates,foreground_norm order=ACBA out=$OUT/before_after_26n_assigner -- model=yolo26n.yaml "
        "modes=ceiling " + LEVER.replace("/tmp/synth/", "/tmp/synth2k/"), NO_WEIGHTS)),
    Section("assigner-ab", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 9, (
        # the losses' GPU tests beside the CPU-bound synth and pack; then yolo26n's ceiling (two assigners a step)
        # without the assigner's two levers (the candidate mask made level by level, the normalisation on each
        # anchor's own box), with them, without again
        "timeout 200 python3 -m pytest -q -m gpu tests/test_loss.py -p no:cacheprovider --tb=short -rA "
        "> $OUT/gpu_tests_loss.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; grep -E 'PASSED|FAILED|ERROR|passed|failed' $OUT/gpu_tests_loss.txt | tail -20",
        f"timeout 330 python3 -m tools.device.swap_ab off=grid_candidates,foreground_norm out=$OUT/assigner_26n -- "
        f"model=yolo26n.yaml modes=ceiling {LEVER}", NO_WEIGHTS)),
    Section("step-bn-silu", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 4, (
        "timeout 240 python3 -m tools.step_levers model=yolo11n.yaml bn_shapes=1 "
        "levers=triton_bn_silu,triton_bn_silu_narrow,triton_bn_silu+cuda_graph out=$OUT/levers_bn",
        "timeout 150 python3 -m tools.step_levers model=yolo26n.yaml levers=triton_bn_silu,triton_bn_silu_narrow "
        "out=$OUT/levers_bn")),
    Section("step-graphed", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 4, (
        "timeout 200 python3 -m pytest -q -m gpu tests/test_graphed.py tests/test_bn_silu.py tests/test_step.py "
        "tests/test_loss.py -p no:cacheprovider --tb=short 2>&1 | tail -25 | tee $OUT/gpu_tests_graphed.txt",
        "timeout 120 python3 -m tools.step_levers model=yolo11n.yaml levers=graphed,graphed_unfused out=$OUT/levers_g",
        "timeout 100 python3 -m tools.step_levers model=yolo26n.yaml levers=graphed out=$OUT/levers_g")),
    Section("step-half-input", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 8, (
        # half_input's GPU tests beside the synth and pack; then the ceiling and yolofeed without it, with it, and
        # without it again (a drift of the machine shows as the two without it apart)
        "timeout 200 python3 -m pytest -q -m gpu tests/test_step_input.py tests/test_graphed.py -p no:cacheprovider "
        "--tb=short -rA > $OUT/gpu_tests_half.txt 2>&1 &",
        SYNTH_10K, PACK_10K, "wait; tail -12 $OUT/gpu_tests_half.txt",
        lever("yolo11n", "yolofeed,ceiling", "half_input=False", 150),
        lever("yolo11n", "yolofeed,ceiling", "half_input=True", 150),
        lever("yolo11n", "yolofeed,ceiling", "half_input=False", 150).replace("levers_yolo11n_half_input-False",
                                                                               "levers_yolo11n_half_input-False-2"),
        NO_WEIGHTS)),
    Section("graphed-ab", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 6, (
        "PARTS=tests,ab bash tools/device/graphed_bench.sh",)),
    Section("graphed-musgd-26n", "The step itself: where its time goes, and the levers", "nvidia-h200", 1, 6, (
        "PARTS=musgd,26n bash tools/device/graphed_bench.sh",)),
    Section("parity-pose", "Pose", "nvidia-h200", 1, 9, (
        "DEVICES=0 TASK=pose MODEL11=yolo11n-pose.yaml SEEDS11=4 PAR11=8 CORES11=0-15 SEEDS26=0 N_TRAIN=1500 EPOCHS=30 "
        "LIMIT=510 NO_SMOKE=1 NO_GPU_TESTS=1 bash tools/device/parity.sh",)),
    Section("pose-throughput", "Pose", "nvidia-h200", 1, 7, SECTIONS_POSE),
    Section("parity-obb", OBB, "nvidia-h200", 1, 9, (
        "DEVICES=0 TASK=obb MODEL11=yolo11n-obb.yaml SEEDS11=4 PAR11=8 CORES11=0-15 SEEDS26=0 N_TRAIN=1500 EPOCHS=30 "
        "LIMIT=510 NO_SMOKE=1 NO_GPU_TESTS=1 bash tools/device/parity.sh",)),
    Section("obb-throughput", OBB, "nvidia-h200", 1, 6, SECTIONS_OBB),
    Section("seg-throughput", "Segmentation", "nvidia-h200", 1, 8, SECTIONS_SEG),
    Section("detect-polygons-throughput", "Detection on polygon labels", "nvidia-h200", 1, 6, (
        # yolo11n (detection) on the segment set's polygon labels: its detection pack keeps the polygons; its GPU test
        # beside the CPU-bound synth and pack
        "timeout 200 python3 -m pytest -q -m gpu tests/test_train_detect_polygons.py -p no:cacheprovider -rA "
        "> $OUT/gpu_tests_detect_polygons.txt 2>&1 &",
        SECTIONS_SEG[0], "python3 -m yolofeed pack data=/tmp/synth-seg/data.yaml imgsz=640 2>&1 | tail -2",
        LABELS_10K.replace("/tmp/synth/", "/tmp/synth-seg/"), "wait; tail -5 $OUT/gpu_tests_detect_polygons.txt",
        "timeout 300 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed,ceiling steps=60 warmup=20 "
        f"{BENCH_1.replace('/tmp/synth/', '/tmp/synth-seg/')} out=$OUT/bench_detect_polygons", NO_WEIGHTS)),
    Section("polygon-ring", "Detection on polygon labels", "nvidia-h200", 1, 7, (
        # the polygons resampled as they enter the partner pool's ring, not the whole ring each batch: the
        # augmentation with a full pool (seg_profile), then yolo11n (detection) on the segment set's polygons
        *SECTIONS_SEG[:2], "timeout 200 python3 -m tools.device.seg_profile /tmp/synth-seg/data.yaml 2>&1 "
        "| grep '^{' | tail -1", "python3 -m yolofeed pack data=/tmp/synth-seg/data.yaml imgsz=640 2>&1 | tail -2",
        LABELS_10K.replace("/tmp/synth/", "/tmp/synth-seg/"),
        "timeout 300 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed,ceiling steps=60 warmup=20 "
        f"{BENCH_1.replace('/tmp/synth/', '/tmp/synth-seg/')} out=$OUT/bench_detect_polygons", NO_WEIGHTS)),
    Section("polygon-loader", "Detection on polygon labels", "nvidia-h200", 1, 9, (
        # the loader gathering a batch's real polygon points only: yolo11n (detection) on the segment set's
        # polygons, then yolo11n-seg, each side by side
        SECTIONS_SEG[0], "python3 -m yolofeed pack data=/tmp/synth-seg/data.yaml imgsz=640 2>&1 | tail -2",
        LABELS_10K.replace("/tmp/synth/", "/tmp/synth-seg/"),
        "timeout 240 python3 -m yolofeed bench model=yolo11n.yaml modes=stock,yolofeed,ceiling steps=60 warmup=20 "
        f"{BENCH_1.replace('/tmp/synth/', '/tmp/synth-seg/')} out=$OUT/bench_detect_polygons", NO_WEIGHTS,
        *SECTIONS_SEG[1:3], SECTIONS_SEG[3].replace("timeout 360", "timeout 280"), NO_WEIGHTS)),
    Section("polygon-bound", "Detection on polygon labels", "nvidia-h200", 1, 7, POLYGON_AUGMENT),
    Section("polygon-kernel", "Detection on polygon labels", "nvidia-h200", 1, 7, POLYGON_AUGMENT),
    Section("polygon-gpu-tests", "GPU tests", "nvidia-h200", 1, 2, (
        "timeout 250 python3 -m pytest -q -m gpu tests/test_augment_segments.py tests/test_train_detect_polygons.py "
        "tests/test_partners.py tests/test_train_segment.py tests/test_masks.py tests/test_loader.py "
        "-p no:cacheprovider -rA 2>&1 | grep -E 'PASSED|FAILED|ERROR|passed|failed' | tail -20",)),
    Section("seg-profile", "Segmentation", "nvidia-h200", 1, 3, (
        *SECTIONS_SEG[:2], "timeout 200 python3 -m tools.device.seg_profile /tmp/synth-seg/data.yaml 2>&1 "
        "| grep -v Warning")),
    Section("parity-seg", "Segmentation", "nvidia-h200", 1, 9, (
        # stock's segment runs take 2 cores each and about 25 s an epoch of 1,500 images: 20 epochs of 1,200 fit
        "DEVICES=0 TASK=segment MODEL11=yolo11n-seg.yaml SEEDS11=4 PAR11=8 CORES11=0-15 SEEDS26=0 N_TRAIN=1200 "
        "EPOCHS=20 LIMIT=480 NO_SMOKE=1 NO_GPU_TESTS=1 bash tools/device/parity.sh",)),
    Section("seg-first", "Segmentation", "nvidia-h200", 1, 9, (
        # the GPU tests beside the CPU-bound synth and pack; the bench waits for them and runs alone
        "timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider --tb=short -rA > $OUT/gpu_tests.txt 2>&1 &",
        *SECTIONS_SEG[:3], "wait; tail -40 $OUT/gpu_tests.txt", *SECTIONS_SEG[3:])),
    Section("val-metrics", "The whole run", "nvidia-h200", 1, 2, (
        "python3 -m yolofeed synth out=/tmp/synth-val n_train=16 n_val=500 seed=0 2>&1 | tail -1",
        "timeout 200 python3 -m tools.device.val_metrics_ab /tmp/synth-val/data.yaml --turns 2 | tail -12")),
    Section("seg-again", "Segmentation", "nvidia-h200", 1, 8, (
        # the segment loss's, the masks' and the augmenter's GPU tests beside the synth and pack; the loss A/B and the
        # bench wait for them
        "timeout 200 python3 -m pytest -q -m gpu tests/test_loss.py tests/test_masks.py tests/test_augment_gpu.py "
        "tests/test_train_segment.py -p no:cacheprovider --tb=short -rA > $OUT/gpu_tests_seg.txt 2>&1 &",
        *SECTIONS_SEG[:3], "wait; tail -25 $OUT/gpu_tests_seg.txt",
        "timeout 120 python3 -m tools.device.seg_loss_ab /tmp/synth-seg/data.yaml 2>&1 | tail -3", *SECTIONS_SEG[3:])),
    Section("pose-again", "Pose", "nvidia-h200", 1, 8, (
        # the segment set's GPU tests beside the CPU-bound pose synth and pack; the bench waits for them and runs alone
        "timeout 200 python3 -m pytest -q -m gpu tests/test_loss.py tests/test_masks.py tests/test_augment_gpu.py "
        "tests/test_train_segment.py -p no:cacheprovider --tb=short -rA > $OUT/gpu_tests_seg.txt 2>&1 &",
        *SECTIONS_POSE[:3], "wait; tail -25 $OUT/gpu_tests_seg.txt", *SECTIONS_POSE[3:])),
    Section("seg-copy-paste", "Segmentation", "nvidia-h200", 1, 9, (
        # copy-paste's GPU tests beside the segment set's synth and pack; then the bench with copy_paste on both sides
        "timeout 200 python3 -m pytest -q -m gpu tests/test_copy_paste.py tests/test_train_segment.py "
        "tests/test_augment_gpu.py tests/test_masks.py -p no:cacheprovider --tb=short -rA "
        "> $OUT/gpu_tests_cp.txt 2>&1 &",
        *SECTIONS_SEG[:3], "wait; tail -25 $OUT/gpu_tests_cp.txt",
        SECTIONS_SEG[3].replace("out=$OUT/bench_seg", "copy_paste=0.5 out=$OUT/bench_seg_cp"), NO_WEIGHTS)),
    Section("seg-profile-copy-paste", "Segmentation", "nvidia-h200", 1, 2, (
        "python3 -m yolofeed synth out=/tmp/synth-seg1k n_train=1000 n_val=8 seed=0 task=segment 2>&1 | tail -1",
        "timeout 200 python3 -m tools.device.seg_profile /tmp/synth-seg1k/data.yaml --copy-paste 0.5 2>&1 "
        "| grep -v Warning")),
    Section("first-epoch-pose-obb", "Pose", "nvidia-h200", 1, 8, (
        # the graphed step's and OBB's GPU tests beside the CPU-bound synths and packs; then yolofeed's first epoch
        # against its steady rate, pose then OBB (stock's and the ceiling's rates: pose-again, obb-throughput)
        "timeout 200 python3 -m pytest -q -m gpu tests/test_graphed.py tests/test_augment_obb.py -p no:cacheprovider "
        "--tb=short -rA > $OUT/gpu_tests_first.txt 2>&1 &",
        *SECTIONS_POSE[:2], *SECTIONS_OBB[:2], "wait; tail -14 $OUT/gpu_tests_first.txt",
        *(bench.replace("modes=stock,yolofeed,ceiling", "modes=yolofeed").replace("timeout 330", "timeout 150")
          for bench in (SECTIONS_POSE[3], SECTIONS_OBB[3])),
        NO_WEIGHTS)),
    Section("gpu-tests", "GPU tests", "nvidia-h200", 1, 4, (
        "python3 -m pytest -q -m gpu tests/ -p no:cacheprovider --tb=short -rA > $OUT/gpu_tests.txt 2>&1; "
        "tail -40 $OUT/gpu_tests.txt",)),
)}


def script(sections: list[Section], bundle: bool) -> str:
    """One bash script for ``sections`` in turn: set-up once, each command once (the first section to name a
    dataset's synth or pack runs it), and (``bundle``) the results packed into one archive.

    ``python3`` is the interpreter running this module (its folder goes first on PATH: a venv's, say).
    """
    commands = list(dict.fromkeys(c for s in sections for c in s.commands))
    lines = [f'export PATH="{Path(sys.executable).parent}:$PATH"', "source tools/device/setup.sh", "set +e", *commands]
    if bundle:
        lines.append("source tools/device/pack_out.sh")
    return "\n".join(lines) + "\n"


def listing() -> str:
    """The sections as a table: name, machine, GPUs, minutes, the BENCHMARKS.md heading."""
    rows = [f"{'section':<18} {'machine':<15} {'GPUs':>4} {'~min':>5}  BENCHMARKS.md section"]
    rows += [f"{s.name:<18} {s.kind:<15} {s.gpus:>4} {s.minutes:>5}  {s.heading}" for s in SECTIONS.values()]
    return "\n".join(rows)


def cuda_devices() -> int:
    """CUDA devices torch sees here (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.reproduce", description=__doc__.split("\n\n")[0])
    ap.add_argument("sections", nargs="*", metavar="SECTION", help="section names, run in turn; none: list them")
    ap.add_argument("--print", action="store_true", dest="print_only", help="print the commands, run nothing")
    ap.add_argument("--bundle", action="store_true", help="pack $OUT into $OUT/results.tgz at the end")
    a = ap.parse_args(argv)
    if not a.sections:
        print(listing())
        return 0
    unknown = [n for n in a.sections if n not in SECTIONS]
    if unknown:
        print(f"reproduce: no section {unknown[0]!r}; the sections are: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    chosen = [SECTIONS[n] for n in dict.fromkeys(a.sections)]
    text = script(chosen, a.bundle)
    for s in chosen:
        print(f"# {s.name}: BENCHMARKS.md, '{s.heading}' ({s.kind}, ~{s.minutes} min)")
    print(text, flush=True)
    if a.print_only:
        return 0
    need = max(s.gpus for s in chosen)
    have = cuda_devices() if need else 0
    if have < need:
        s = next(s for s in chosen if s.gpus > have)
        print(f"reproduce: section {s.name!r} needs {s.gpus} CUDA device(s) ({s.kind}); torch sees {have} here. "
              "Run it on that machine, or use --print to see the commands.", file=sys.stderr)
        return 2
    return subprocess.run(["bash", "-c", text], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
