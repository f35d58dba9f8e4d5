"""Every tool in tools/ runs: on the CPU on a tiny dataset where it can, else up to where it needs CUDA.

The figures these tools produce come from the GPU machines (``python -m tools.reproduce``); here they must
only run, refuse what they cannot do with one clear line, and agree with BENCHMARKS.md's sections.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tools import lossless_cost, pack_crc_cost, parity_merge, reproduce
from tools.device import (
    allreduce_bw,
    amp_steps,
    augment_bench,
    decode_ceiling,
    epochs_ab,
    evict,
    gpu_gaps,
    io_probe,
    kernel_top,
    monitor_overhead,
    setup_timeline,
    step_ab,
    syncs,
    val_equality,
)

ROOT = Path(__file__).resolve().parent.parent
SHELL = sorted((ROOT / "tools" / "device").glob("*.sh"))
PARITY_REPORTS = [ROOT / "docs" / "parity" / f"yolo11n-seeds{s}.json" for s in ("0-3", "4-7")]


# -- tools.reproduce and BENCHMARKS.md -----------------------------------------------------------------------------
def test_every_benchmarks_section_names_a_reproduce_section_and_back():
    text = (ROOT / "BENCHMARKS.md").read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    named = set(re.findall(r"`python -m tools\.reproduce ([a-z0-9-]+)`", text))
    assert named and named <= set(reproduce.SECTIONS), named - set(reproduce.SECTIONS)
    for s in reproduce.SECTIONS.values():
        assert s.heading in headings, f"section {s.name}: no '## {s.heading}' in BENCHMARKS.md"
        assert s.name in named, f"BENCHMARKS.md never says how to run section {s.name}"
    for h in headings:  # each section of figures says how to reproduce them
        body = text.split(f"## {h}\n", 1)[1].split("\n## ", 1)[0]
        assert "python -m tools.reproduce" in body, f"'## {h}' names no reproduce section"


def test_reproduce_lists_sections_and_prints_without_running(capsys, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("--print ran a command"))
    assert reproduce.main([]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in reproduce.SECTIONS)
    assert reproduce.main(["ddp", "--print", "--bundle"]) == 0
    out = capsys.readouterr().out
    assert "source tools/device/setup.sh" in out and "device=0,1" in out and "pack_out.sh" in out


def test_reproduce_runs_several_sections_as_one_script_making_each_dataset_once(capsys, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("--print ran a command"))
    assert reproduce.main(["throughput", "multi-scale", "no-triton", "--print"]) == 0
    out = capsys.readouterr().out
    assert out.count(reproduce.SYNTH_10K) == 1 and out.count(reproduce.PACK_10K + "\n") == 1
    assert out.count("source tools/device/setup.sh") == 1
    assert out.index("out=$OUT/bench_yolo11n") < out.index("multi_scale=0.5") < out.index("tools.device.no_triton")


def test_reproduce_refuses_a_gpu_section_without_cuda_before_running_anything(capsys, monkeypatch):
    monkeypatch.setattr(reproduce, "cuda_devices", lambda: 1)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("ran without the GPUs it needs"))
    assert reproduce.main(["parity"]) == 2  # two GPUs wanted, one seen
    err = capsys.readouterr().err
    assert "needs 2 CUDA device(s) (nvidia-h200-x2); torch sees 1" in err
    assert reproduce.main(["no-such-section"]) == 2
    assert "the sections are: throughput" in capsys.readouterr().err


def test_reproduce_runs_a_cpu_section(monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, cwd: calls.append((cmd, cwd)) or subprocess.CompletedProcess(
        cmd, 0))
    monkeypatch.setattr(reproduce, "cuda_devices", lambda: pytest.fail("a CPU section asked for CUDA"))
    assert reproduce.main(["parity-merge"]) == 0
    (cmd, cwd), = calls
    assert cmd[:2] == ["bash", "-c"] and "python3 -m tools.parity_merge docs/parity/" in cmd[2] and cwd == ROOT


# -- shell tools -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", SHELL, ids=[s.name for s in SHELL])
def test_shell_tools_parse_and_say_how_to_use_them(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    if script.read_text().startswith("#!"):  # run as commands (the rest are sourced)
        r = subprocess.run(["bash", str(script), "-h"], capture_output=True, text=True, cwd=ROOT, timeout=10)
        assert r.returncode == 0 and "Usage: bash tools/device/" in r.stdout, r.stdout + r.stderr


def _cgroup_root() -> Path | None:
    """Where in_memory_limit.sh makes its groups, if this process may (root with a memory cgroup tree)."""
    v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")
    root = v2 if (v2 / "cgroup.controllers").is_file() else v1
    return root if os.geteuid() == 0 and root.is_dir() and os.access(root, os.W_OK) else None


@pytest.mark.skipif(_cgroup_root() is None, reason="needs root and a writable memory cgroup tree")
def test_in_memory_limit_stopped_alone_stops_its_command_and_removes_its_group(tmp_path):
    """SIGTERM to the script alone (as timeout sends it) used to leave the command running and the group behind."""
    import signal
    import time

    alive = tmp_path / "alive"
    child = f"import time, pathlib; pathlib.Path({str(alive)!r}).write_text('x'); time.sleep(60)"
    p = subprocess.Popen(["bash", str(ROOT / "tools/device/in_memory_limit.sh"), "200M", sys.executable, "-c", child],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    group = _cgroup_root() / f"yolofeed-limit-{p.pid}"
    for _ in range(200):  # the child has started inside the group
        if alive.exists():
            break
        time.sleep(0.05)
    pids = (group / "cgroup.procs").read_text().split()
    assert pids
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=20)
    assert "stopping the command still running" in err and not group.exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


# -- CPU tools -----------------------------------------------------------------------------------------------------
def test_parity_merge_combines_reports_and_refuses_mixed_or_repeated_runs(tmp_path, capsys):
    parity_merge.main([str(p) for p in PARITY_REPORTS] + ["--plot", str(tmp_path / "new" / "p.png")])
    out = capsys.readouterr().out
    assert "+0.09" in out and "loss bands overlap" in out  # the 8-seed rows of BENCHMARKS.md
    assert (tmp_path / "new" / "p.png").read_bytes()[:4] == b"\x89PNG"  # its folder made
    parity_merge.main([str(ROOT / "docs" / "parity" / f"yolo26n-seeds{s}.json") for s in ("0-2", "3-7")])
    assert "+0.16" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="appears twice"):
        parity_merge.merge([PARITY_REPORTS[0], PARITY_REPORTS[0]])
    other = json.loads(PARITY_REPORTS[1].read_text())
    other["config"]["epochs"] += 1
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="not the same comparison"):
        parity_merge.merge([PARITY_REPORTS[0], tmp_path / "other.json"])


def test_no_triton_hides_triton_from_yolofeed_and_runs_the_module():
    probe = ("from tools.device.no_triton import hide_triton; hide_triton()\n"
             "from yolofeed.augment.warp import triton_kernels\n"
             "assert triton_kernels() is None\n"
             "try:\n    import triton\nexcept ImportError:\n    print('hidden')\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "hidden", out.stderr
    out = subprocess.run([sys.executable, "-m", "tools.device.no_triton", "yolofeed", "version"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr


def test_lossless_cost_names_size_and_cores_for_each_way(capsys):
    lossless_cost.main(["--imgsz", "64", "--repeats", "1", "--rate", "100"])
    out = capsys.readouterr().out
    assert "bus.jpg 48x64: raw 9 KB; jpeg q95" in out  # Ultralytics' bundled photo, resized as load_image does
    ways = re.findall(r"  (zlib level 1|zlib level 6|png): ([\d.]+)x smaller, one core decodes [\d,]+ img/s: "
                      r"[\d.]+ cores for 100 img/s", out)
    assert len(ways) == 6 and all(float(x) > 1 for _, x in ways)  # two photos, three ways each; each smaller


def test_pack_crc_cost_measures_a_tiny_pack(dataset, capsys):
    pack_crc_cost.main([str(dataset), "--batch", "4", "--imgsz", "64", "--repeats", "1"])
    out = capsys.readouterr().out
    assert re.search(r"gather \(the loader's copy, one thread\): [\d.]+ GB/s", out)
    assert re.search(r"crc32 of the same payloads .*: [\d.]+ GB/s", out) and "Pack.damaged()" in out


def test_io_probe_writes_and_removes_its_file(tmp_path, capsys):
    target = tmp_path / "probe.bin"
    io_probe.main([str(target), "--images", "8", "--bytes", "4096", "--workers", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and all("GB/s" in line and "fsync" in line for line in lines)
    assert not target.exists()
    with pytest.raises(SystemExit, match="GB free"):
        io_probe.main([str(target), "--images", "1000", "--bytes", str(1 << 50)])


def test_allreduce_bw_times_gloo_and_predicts_a_models_gradient_all_reduce(tmp_path):
    # in a child process: torch.multiprocessing's spawn leaves a resource tracker process behind until its parent
    # exits, which later tests would take for a leaked worker
    out = subprocess.run([sys.executable, "-m", "tools.device.allreduce_bw", "--cpu", "2", "--max-mb", "1", "--iters",
                          "1", "--model", "yolo11n.yaml"], cwd=ROOT, env=os.environ | {"OUT": str(tmp_path)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads((tmp_path / "allreduce_bw.json").read_text())
    assert res["world"] == 2 and res["backend"] == "gloo"
    assert res["gradient_bytes"] == 4 * 2_624_064  # Ultralytics' summary of yolo11n: "2,624,064 gradients"
    assert [r["bytes"] for r in res["sizes"]] == [1 << 20, res["gradient_bytes"]] and res["allreduce_ms"] > 0
    assert "MB of float32 gradients" in out.stdout
    assert allreduce_bw.bus_factor(2) == 1.0 and allreduce_bw.bus_factor(8) == 1.75
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs 2 or more CUDA GPUs"):
            allreduce_bw.main([])


def test_decode_ceiling_reads_every_image(synth_root):
    images, nbytes = decode_ceiling.rate(str(synth_root / "data.yaml"), 1, imgsz=64)
    assert images > 0 and nbytes > 0


def test_augment_bench_cpu_smoke(dataset):
    res = augment_bench.bench(str(dataset / "data.yaml"), "cpu", batch=4, imgsz=64, iters=1)
    assert res["device"] == "cpu" and res["full_default_ms"] > 0 and res["op_compose_mixup_hsv_ms"] > 0
    assert not any(k.startswith("graphed") for k in res)  # CUDA graphs: CUDA only
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            augment_bench.bench(str(dataset / "data.yaml"), "cuda", batch=4, imgsz=64, iters=1)


def test_val_equality_same_metrics_through_both_loaders(dataset, tmp_path):
    from ultralytics import YOLO

    weights = tmp_path / "untrained.pt"
    YOLO("yolo11n.yaml").save(weights)
    res = val_equality.compare(str(weights), str(dataset / "data.yaml"), {"imgsz": 64, "batch": 4, "device": "cpu"})
    assert set(res["stock"]) == set(res["yolofeed_val_loader"]) and res["largest_difference"] < 1e-3
    with pytest.raises(SystemExit, match="Usage"):
        val_equality.main([str(weights)])


# -- tools that look inside training steps ------------------------------------------------------------------------
def _event(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_gpu_gaps_charges_each_idle_stretch_to_the_loop_phase():
    """Two kernels with a 30 us gap while the loop sat in backward; the next kernel was launched after the gap."""
    events = [_event("python_function", "trainer.py(1): _do_train", 0, 1000),
              _event("python_function", "loss.py(9): backward", 100, 200),
              _event("cuda_runtime", "cudaLaunchKernel", 150, 5, correlation=1),
              _event("cuda_runtime", "cudaStreamSynchronize", 200, 40),
              _event("cuda_runtime", "cudaLaunchKernel", 245, 5, correlation=2),
              _event("kernel", "gemm", 160, 50, tid=7, correlation=1),
              _event("kernel", "relu", 240, 10, tid=7, correlation=2)]
    r = gpu_gaps.gaps(events)
    assert r["n"] == 1 and r["idle_us"] == 30 and r["window_us"] == 90
    assert r["phase"]["loss.py(9): backward"] == 30 and r["runtime"]["cudaStreamSynchronize"] == 30
    assert r["late"] == {"host late: next work launched after the GPU ran dry": 30}
    assert "GPU idle 0.0 ms (33.3 %) in 1 gaps" in gpu_gaps.report(r, 1, "t")
    assert gpu_gaps.gaps([e for e in events if e["cat"] != "kernel"])["n"] == 0  # a CPU trace: no GPU work


def test_gpu_gaps_threads_split_host_time_and_stream_time():
    """The training thread: 30 of 100 us in ops; a loader thread's sync; the main stream idles while another works."""
    events = [_event("python_function", "trainer.py(1): _do_train", 0, 100),
              _event("cpu_op", "aten::conv", 0, 20), _event("cpu_op", "aten::add", 10, 20),  # overlap: 30 us, not 40
              _event("cuda_runtime", "cudaLaunchKernel", 12, 5, correlation=1),
              _event("cpu_op", "aten::copy_", 0, 10, tid=2),
              _event("cuda_runtime", "cudaStreamSynchronize", 20, 50, tid=2),
              _event("kernel", "gemm", 0, 40, tid=7, stream=7), _event("kernel", "gemm", 60, 40, tid=7, stream=7),
              _event("kernel", "decode", 30, 50, tid=8, stream=9)]
    r = gpu_gaps.threads(events)
    assert r["window_us"] == 100 and r["main"] == 1
    assert r["threads"][1]["ops_us"] == 30 and r["threads"][2]["runtime"]["cudaStreamSynchronize"] == 50
    assert r["streams"][7]["busy_us"] == 80 and r["streams"][9]["busy_us"] == 50
    text = gpu_gaps.threads_report(r, 1)
    assert "thread 1 (training loop): ops 0.03, outside ops 0.07; cudaLaunchKernel 0.01" in text
    assert "stream 7: busy 0.08, idle 0.02, 2 items" in text
    no_stacks = [e for e in events if e["cat"] != "python_function"]
    no_stacks += [_event("cpu_op", f"aten::mul{i}", 40 + 5 * i, 2, tid=2) for i in range(5)]  # the busier thread
    assert gpu_gaps.threads(no_stacks)["main"] == 2  # most ops, with nothing better to go on
    no_stacks.append(_event("user_annotation", "Optimizer.step#AdamW.step", 90, 5))
    assert gpu_gaps.threads(no_stacks)["main"] == 1  # the thread that steps the optimiser


@pytest.mark.slow
def test_gpu_gaps_runs_a_few_cpu_steps(dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    gpu_gaps.main([str(dataset / "data.yaml"), "yolofeed", "--batch", "4", "--imgsz", "32", "--warmup", "1",
                   "--steps", "1"])
    assert "yolofeed, yolo11n.yaml, batch 4, imgsz 32" in (tmp_path / "gpu_gaps_yolofeed.txt").read_text()


def test_step_variants_set_the_trainer_options():
    assert step_ab.trainer_class("yolofeed_stock_step").sync_free_step is False
    assert step_ab.trainer_class("yolofeed_stock_loss").sync_free_loss is False
    assert step_ab.trainer_class("ceiling_stock_musgd").fast_musgd is False
    assert step_ab.trainer_class("ceiling").fast_musgd is True
    ceiling = step_ab.trainer_class("ceiling_sync_free_loss")
    assert ceiling.sync_free_loss is True and ceiling.__name__ == "CeilingTrainer"
    assert step_ab.trainer_class("yolofeed_jpeg_no_nvjpeg").pack_format == "jpeg"
    with pytest.raises(ValueError, match="use it on yolofeed_jpeg"):
        step_ab.trainer_class("yolofeed_no_place")  # a raw pack has no jpeg loader to change
    assert step_ab.trainer_class("yolofeed_blocking_sync").__name__ == "FastDetectionTrainer"
    with pytest.raises(ValueError, match="unknown mode 'yolofeed_fast'"):
        step_ab.main(["data.yaml", "yolo11n.yaml", "yolofeed,yolofeed_fast"])  # before any training
    with pytest.raises(ValueError, match="unknown mode"):
        kernel_top.main(["data.yaml", "ceiling,nope"])


def test_jpeg_ablations_leave_out_the_decode_or_the_placing_and_are_undone(pack, monkeypatch):
    import torchvision.io

    from yolofeed.pack.codecs import jpeg

    jpg = pack(160, "jpeg")
    idx = np.arange(6)
    full = torch.zeros((6, 160, 160, 3), dtype=torch.uint8)
    jpg.codec.decode(jpg, idx, full)
    decode, place = jpeg.Jpeg.decode, jpeg.place

    def refuse(*a, **k):
        raise AssertionError("nvJPEG's stand-in called the decoder")

    with step_ab.patched("yolofeed_jpeg_no_place"):
        kept = torch.full_like(full, 7)
        jpg.codec.decode(jpg, idx, kept)
        assert torch.equal(kept, torch.full_like(full, 7))  # decoded, never written
    placed = []
    with monkeypatch.context() as m, step_ab.patched("yolofeed_jpeg_no_nvjpeg"):
        m.setattr(torchvision.io, "decode_jpeg", refuse)
        m.setattr(jpeg, "place", lambda images, hw, out: placed.append((images, hw)))
        jpg.codec.decode(jpg, idx, full)
    images, hw = placed[0]  # blank images of each file's decoded size, to be placed at its delivered size
    assert [tuple(images[k].shape) for k in range(6)] == [(3, h0, w0) for h0, w0 in jpg.ori_shapes[idx].tolist()]
    assert hw == [tuple(x) for x in jpg.shapes[idx].tolist()]
    with monkeypatch.context() as m, step_ab.patched("yolofeed_jpeg_no_decode"):
        m.setattr(torchvision.io, "decode_jpeg", refuse)
        m.setattr(jpeg, "place", refuse)
        kept = torch.full_like(full, 7)
        jpg.codec.decode(jpg, idx, kept)
        assert torch.equal(kept, torch.full_like(full, 7))  # nothing decoded, nothing written
    assert jpeg.Jpeg.decode is decode and jpeg.place is place  # undone
    assert step_ab.trainer_class("yolofeed_train_priority").__name__ == "FastDetectionTrainer"
    assert step_ab.split_patches("yolofeed_jpeg_no_place_pageable_files") == ("yolofeed_jpeg", ["_no_place",
                                                                                                 "_pageable_files"])
    with pytest.raises(ValueError, match="use it on yolofeed_jpeg"):
        step_ab.trainer_class("yolofeed_pageable_files_train_priority")
    with step_ab.patched("yolofeed_jpeg_pageable_files"):
        assert jpg.codec.staging_bytes(jpg, 6) == 0  # each file its own tensor again
    assert jpg.codec.staging_bytes(jpg, 6) > 0
    with step_ab.patched("yolofeed_jpeg_indexed_place"):  # the indexed write: the same pixels
        indexed = torch.zeros_like(full)
        jpg.codec.decode(jpg, idx, indexed)
    assert torch.equal(indexed, full) and jpeg.place is place
    kernels = jpeg.triton_kernels
    with step_ab.patched("yolofeed_jpeg_torch_place"):
        assert jpeg.triton_kernels() is None  # the torch ops, even on CUDA
    assert jpeg.triton_kernels is kernels
    with step_ab.patched("yolofeed_train_priority"):  # without CUDA: says so and changes nothing
        pass


@pytest.mark.parametrize("sync", [True, False])
def test_placing_on_the_training_side_delivers_the_same_batches(pack, sync):
    from yolofeed.loader.prefetch import Prefetcher
    from yolofeed.pack.codecs import jpeg

    jpg = pack(160, "jpeg")
    batches = [np.arange(k, k + 5) for k in range(0, 15, 5)]

    def images():  # each image's own rows and columns: the rest of a slot is whatever its buffer held
        p = Prefetcher(jpg, "cpu", 5, sync=sync, decode="torchvision")
        return [torch.cat([im[:h, :w].flatten() for im, (h, w) in zip(b.source.images, b.source.hw.tolist())])
                for b in p.iterate(batches)]

    plain = images()
    with step_ab.patched("yolofeed_jpeg_place_on_train"):
        deferred = images()
        assert jpeg.place is not step_ab._place_index  # the stash stands in for it while patched
    assert all(torch.equal(a, b) for a, b in zip(plain, deferred)) and len(deferred) == len(batches)


def test_uncached_packs_are_read_from_storage_every_epoch(pack, capsys):
    from yolofeed.loader.prefetch import Prefetcher
    from yolofeed.pack.store import Pack

    jpg = pack(160, "jpeg")
    init, batches = Prefetcher.__init__, [np.arange(k, k + 4) for k in range(0, len(jpg) - 3, 4)]

    def epoch(p) -> int:
        before = step_ab.read_bytes()
        for _ in p.iterate(batches):
            pass
        return step_ab.read_bytes() - before

    probe = jpg.path.with_name("probe.bin")  # are this filesystem's reads counted as storage reads?
    probe.write_bytes(bytes(1 << 20))
    evict.evict(str(probe))
    before = step_ab.read_bytes()
    probe.read_bytes()
    probe.unlink()
    if step_ab.read_bytes() == before:
        pytest.skip("this filesystem's reads are not counted as storage reads (/proc/self/io): a tmpfs?")
    with step_ab.patched("yolofeed_jpeg_uncached"):
        p = Prefetcher(jpg, "cpu", 4, decode="cv2")  # its pack dropped from memory as it opens
        for _ in range(2):
            assert epoch(p) >= 0.9 * int(jpg.index["nbytes"][:len(batches) * 4].sum())  # each byte read
            step_ab.page_out(jpg)  # what the variant's thread does every second
    assert Prefetcher.__init__ is init
    out = capsys.readouterr().out
    assert re.search(rf"_uncached: [\d.]+ GB read from storage in \d+ s .*packs {jpg.path}$", out, re.M)
    assert "stays in memory" not in out

    twin = Pack.open(jpg.path)  # a second map of the file, as an earlier variant's live pack: its pages stay
    epoch(Prefetcher(twin, "cpu", 4, decode="cv2"))
    with step_ab.patched("yolofeed_jpeg_uncached"):
        p = Prefetcher(jpg, "cpu", 4, decode="cv2")
        assert epoch(p) < 0.5 * int(jpg.index["nbytes"][:len(batches) * 4].sum())
    assert re.search(rf"_uncached: \d+% of {jpg.path} stays in memory", capsys.readouterr().out)


def test_warming_the_full_batch_only_leaves_the_last_batch_to_the_epoch():
    from yolofeed.loader.sampler import EpochSampler
    from yolofeed.train import trainer, warmup

    sampler = EpochSampler(np.arange(10000), 128)
    assert warmup.batch_sizes(sampler) == [128, 16]
    with step_ab.patched("yolofeed_warm_full_only"):
        assert warmup.batch_sizes(sampler) == trainer.batch_sizes(sampler) == [128]
        assert warmup.batch_sizes(EpochSampler(np.arange(5), 128)) == [5]  # one batch, smaller than the batch size
    assert warmup.batch_sizes(sampler) == trainer.batch_sizes(sampler) == [128, 16]  # undone


def test_epoch_alone_loads_each_epoch_when_it_is_iterated_and_is_undone(pack, monkeypatch):
    from yolofeed.loader import TrainLoader

    with step_ab.patched("yolofeed_epoch_alone"):
        loader = TrainLoader(pack(64), 5, "cpu")
        loader.prime()
        assert not loader.prefetcher._queued  # nothing primed
        list(loader)
        assert not loader.prefetcher._queued  # nothing loaded ahead: the thread ends with the epoch
    loader = TrainLoader(pack(64), 5, "cpu")
    list(loader)
    assert len(loader.prefetcher._queued) == 1  # undone: the next epoch's batches load
    loader.close()


def test_epochs_ab_rates_each_epoch_against_the_later_epochs_steady_step():
    # two epochs of 10 images at batch 4 (4, 4, 2): 0.1 s a full step; epoch 1 starts 1 s late, epoch 2 0.05 s late
    row = {"mode": "m", "images": 10, "batch": 4, "epoch_start_s": [5.0, 7.0], "epoch_end_s": [6.3, 7.35],
           "step_end_s": [[6.0, 6.1, 6.3], [7.05, 7.15, 7.25, 7.35]]}
    s = epochs_ab.summary(row)
    assert s["steady_step_ms"] == pytest.approx(100) and s["steady_img_s"] == pytest.approx(40)
    first, second = s["epochs"]
    assert first["wall_s"] == pytest.approx(1.3) and first["first_step_s"] == pytest.approx(1.0)
    assert first["of_steady"] == pytest.approx(10 / 1.3 / 40, abs=1e-3) and first["gap_before_s"] is None
    assert second["of_steady"] == pytest.approx(10 / 0.35 / 40, abs=1e-3) and second["gap_before_s"] == 0.7
    assert s["first_step_at_s"] == 6.0


def test_setup_timeline_times_each_call_of_a_set_up_method_from_the_build():
    class Trainer:
        def __init__(self):
            self.calls = 0

        def get_dataloader(self, n):
            self.calls += 1
            time.sleep(0.02)
            return n * 2

    events, t0 = [], [0.0]
    t = setup_timeline.timed_class(Trainer, events, t0)()
    assert t0[0] > 0 and t.get_dataloader(3) == 6 and t.get_dataloader(4) == 8 and t.calls == 2
    assert [e["event"] for e in events] == ["get_dataloader", "get_dataloader"]  # each call: train and val
    assert all(e["took_s"] >= 0.02 for e in events) and 0 <= events[0]["at_s"] < events[1]["at_s"]
    assert not hasattr(setup_timeline.timed_class(Trainer, [], [0.0]), "_warm_up")  # only methods the class has
    for module, name in setup_timeline.FUNCTIONS:  # a rename fails here, not on the GPU machine
        assert callable(getattr(importlib.import_module(module), name))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")
def test_step_ab_names_the_threads_that_used_the_cpu():
    done, stop = threading.Event(), threading.Event()

    def spin():
        sum(i * i for i in range(3_000_000))  # ~0.2 s of CPU
        done.set()
        stop.wait()  # alive while it is counted

    with step_ab.ThreadCpu(every=0.01) as cpu:
        t = threading.Thread(target=spin, name="spinner")
        t.start()
        done.wait()
        deadline = time.monotonic() + 10  # a reading after the spin, while the thread lives (a busy machine is slow)
        while cpu.after.get(t.native_id, ("", 0.0))[1] < 0.05 and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        t.join()  # ended: its last reading stays
    assert cpu.after[t.native_id][0] == "spinner" and cpu.after[t.native_id][1] >= 0.05  # the wait above ends there
    assert step_ab.busiest(cpu.before, cpu.after, 1.0, n=1).startswith("spinner 0.")  # the busiest, in cores


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_syncs_refuses_to_count_without_cuda():
    with pytest.raises(SystemExit, match="needs CUDA"):
        syncs.main(["data.yaml", "yolofeed"])


@pytest.mark.gpu
def test_step_tools_on_cuda(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    data = str(dataset / "data.yaml")
    syncs.main([data, "yolofeed", "--batch", "8", "--imgsz", "64"])
    assert "synchronising CUDA calls a step" in (tmp_path / "syncs_yolofeed_yolo11n.txt").read_text()
    step_ab.main([data, "yolo11n.yaml", "yolofeed_stock_step,yolofeed", "--batch", "8", "--imgsz", "64", "--steps",
                  "4", "--warmup", "2"])
    assert len(json.loads((tmp_path / "step_ab_yolo11n.json").read_text())) == 2
    kernel_top.main([data, "yolofeed", "--batch", "8", "--imgsz", "64", "--warmup", "2", "--steps", "2"])
    assert "GPU time" in (tmp_path / "kernel_top_yolofeed_yolo11n.txt").read_text()


@pytest.mark.slow
def test_monitor_overhead_alternates_windows_on_the_cpu(dataset):
    res = monitor_overhead.measure(str(dataset / "data.yaml"), "yolo11n.yaml", batch=4, imgsz=32, windows=1,
                                   window=1, warmup=1, device="cpu")
    assert len(res["windows_on"]) == len(res["windows_off"]) == 1 and res["median_on"] > 0


@pytest.mark.slow
def test_amp_steps_records_every_optimiser_step(dataset, tmp_path):
    amp_steps.main(["t", "yolofeed", "0", str(dataset / "data.yaml"), str(tmp_path), "model=yolo11n.yaml",
                    "imgsz=32", "batch=8", "nbs=8", "device=cpu", "stop_after=1", "sync_free_step=False"])
    r = json.loads((tmp_path / "t.json").read_text())
    assert len(r["epochs"]) == 1 and len(r["steps"]) == 3  # 24 images, batch 8 = nbs: a step every batch
    assert all(epoch == 0 and norm >= 0 for epoch, norm, *_ in r["steps"])
    assert r["options"] == {"sync_free_step": False}
    with pytest.raises(SystemExit, match="Usage"):
        amp_steps.main(["t", "sideways", "0", "d", "o"])


# -- first epoch, host memory and the jpeg decode ---------------------------------------------------------------
def _tool(module: str, *args: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", f"tools.device.{module}", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize("storage", ["raw", "jpeg"])
def test_loader_memory_reports_each_epoch(pack, storage, tmp_path):
    p = pack(64, storage)
    r = _tool("loader_memory", str(p.path), "--device", "cpu", "--batch", "4", "--epochs", "2", "--label", storage,
              out=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / f"loader_memory-{storage}.json").read_text())
    assert report["storage"] == storage and [e["images"] for e in report["epochs"]] == [len(p)] * 2
    assert all(e["rss_anon"] > 0 and e["img_s"] > 0 for e in report["epochs"])


def test_jpeg_decode_times_each_part(pack, tmp_path):
    r = _tool("jpeg_decode", str(pack(64, "jpeg").path), "--device", "cpu", "--batch", "4", "--batches", "6",
              out=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "jpeg_decode.json").read_text())
    assert report["batches"] == 1 and all(report[k]["ms"] > 0 for k in ("host_copy", "decode_jpeg", "decode_into"))


def test_shape_cost_times_each_new_batch_size(tmp_path):
    r = _tool("shape_cost", "--batch", "2", "--last", "1", "--imgsz", "64", "--background", out=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "shape_cost.jsonl").read_text().splitlines()[-1])
    names = [name for name, _ in report["calls_ms"]]
    assert names[0] == "batch 2, first" and "batch 1, first" in names and "batch 3, first" in names
    assert report["background_warm_s"] > 0


def test_evict_drops_a_file_from_the_page_cache_and_says_how_to_use_it(tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 8192)
    assert _tool("evict", str(f), out=tmp_path).returncode == 0 and f.read_bytes() == b"x" * 8192
    r = _tool("evict", out=tmp_path)
    assert r.returncode == 1 and "Usage: python -m tools.device.evict FILE" in r.stderr
    # a missing file, a folder or a device: one line each, not a traceback, and the other files still evicted
    r = _tool("evict", str(tmp_path / "missing"), str(tmp_path), os.devnull, str(f), out=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [f"evict: {tmp_path / 'missing'}: No such file or directory",
                                     f"evict: {tmp_path}: not a regular file: name the files themselves",
                                     f"evict: {os.devnull}: not a regular file: name the files themselves"]


def test_capture_cost_times_each_call_an_epoch_makes(tmp_path):
    r = _tool("capture_cost", "--device", "cpu", "--batch", "4", "--imgsz", "64", "--last", "2", "--steady", "2",
              out=tmp_path)
    assert r.returncode == 0, r.stderr
    calls = [name for name, _ in json.loads((tmp_path / "capture_cost.json").read_text())["calls_ms"]]
    assert calls[0].startswith("first batch") and calls.count("steady") == 2
    assert "last batch of 2, first time" in calls and "batch of 5, first time" in calls


def test_build_parts_builds_with_each_part_taken_out(tmp_path, synth_root):
    r = _tool("build_parts", str(synth_root / "data.yaml"), "--workers", "2", "--imgsz", "64", "--repeats", "1",
              out=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "build_parts.json").read_text())
    assert report["decode_ceiling_img_s"] > 0
    assert set(report["variants"]) == {"as built", "no payload CRC32 (nor read-back)",
                                       "payloads not written (nor read-back)", "no read-back check",
                                       "reserved up front", "pages faulted in one by one (no MADV_POPULATE_WRITE)"}
    assert all(len(v) == 1 and v[0] > 0 for v in report["variants"].values())
    assert set(report["cpu_ms"]) == set(report["variants"])
    # reaped: counted (over all the variants: one variant's workers on 24 tiny images can fall inside one clock tick)
    assert sum(ms["workers_user"] + ms["workers_kernel"] for runs in report["cpu_ms"].values() for ms in runs) > 0
    assert all(sum(p[k] for k in ("plan", "start", "payloads", "check")) <= p["all"]
               for runs in report["phases_s"].values() for p in runs)  # the build's phases within the whole call
    r = _tool("build_parts", str(synth_root / "data.yaml"), "--workers", "1", "--imgsz", "64", "--repeats", "1",
              "--variants", "as built", "--dir", str(tmp_path), out=tmp_path)
    assert r.returncode == 0, r.stderr
    assert list(json.loads((tmp_path / "build_parts.json").read_text())["variants"]) == ["as built"]
    r = _tool("build_parts", str(synth_root / "data.yaml"), "--variants", "fastest", out=tmp_path)
    assert r.returncode == 2 and "names none of" in r.stderr
