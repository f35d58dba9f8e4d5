"""Every tool in tools/ runs: on the CPU on a tiny dataset where it can, else up to where it needs CUDA.

The figures these tools produce come from the GPU machines (``python -m tools.reproduce``); here they must
only run, refuse what they cannot do with one clear line, and agree with BENCHMARKS.md's sections.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tools import pack_crc_cost, parity_merge, reproduce
from tools.device import augment_bench, decode_ceiling, io_probe, monitor_overhead, step_ab, val_equality

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


# -- step_ab: bench modes side by side ------------------------------------------------------------------------------
def test_step_variants_set_the_trainer_options():
    assert step_ab.trainer_class("yolofeed_stock_step").sync_free_step is False
    assert step_ab.trainer_class("yolofeed_stock_loss").sync_free_loss is False
    assert step_ab.trainer_class("ceiling_stock_musgd").fast_musgd is False
    assert step_ab.trainer_class("ceiling").fast_musgd is True
    ceiling = step_ab.trainer_class("ceiling_sync_free_loss")
    assert ceiling.sync_free_loss is True and ceiling.__name__ == "CeilingTrainer"
    assert step_ab.trainer_class("yolofeed_jpeg").pack_format == "jpeg"
    with pytest.raises(ValueError, match="unknown mode 'yolofeed_fast'"):
        step_ab.main(["data.yaml", "yolo11n.yaml", "yolofeed,yolofeed_fast"])  # before any training


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


@pytest.mark.gpu
def test_step_ab_on_cuda(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    data = str(dataset / "data.yaml")
    step_ab.main([data, "yolo11n.yaml", "yolofeed_stock_step,yolofeed", "--batch", "8", "--imgsz", "64", "--steps",
                  "4", "--warmup", "2"])
    assert len(json.loads((tmp_path / "step_ab_yolo11n.json").read_text())) == 2


@pytest.mark.slow
def test_monitor_overhead_alternates_windows_on_the_cpu(dataset):
    res = monitor_overhead.measure(str(dataset / "data.yaml"), "yolo11n.yaml", batch=4, imgsz=32, windows=1,
                                   window=1, warmup=1, device="cpu")
    assert len(res["windows_on"]) == len(res["windows_off"]) == 1 and res["median_on"] > 0


# -- the pack build --------------------------------------------------------------------------------------------
def _tool(module: str, *args: str, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", f"tools.device.{module}", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


@pytest.mark.slow
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


def test_val_host_cost_runs_and_the_batched_metrics_agree(capsys):
    from tools import val_host_cost

    for plots in ([], ["--plots"]):  # with plots the confusion matrix is counted, and compared, too
        val_host_cost.main(["--images", "6", "--batch", "4", "--imgsz", "128", "--candidates", "0,40", "--repeat",
                            "1", *plots])
        rows = capsys.readouterr().out.strip().splitlines()[2:]
        assert len(rows) == 2 and all(r.split()[-1] == "yes" for r in rows)


def test_detect_polygon_boxes_compares_ultralytics_boxes_with_and_without_the_polygons(segment_dataset, dataset):
    """On polygon labels the two datasets draw alike and differ in some box; on box labels they are one and the
    same."""
    from tools import detect_polygon_boxes

    polygons = detect_polygon_boxes.compare(str(segment_dataset / "data.yaml"), 12, 128, {"degrees": 10.0})
    assert polygons["images"] == 12 and polygons["polygon_rows"] > 0 and polygons["matched_boxes"] > 0
    assert polygons["iou_below_0.99"] > 0
    boxes = detect_polygon_boxes.compare(str(dataset / "data.yaml"), 6, 128, {"degrees": 10.0})
    assert boxes["polygon_rows"] == 0 and boxes["images_count_differs"] == 0 and boxes["iou_below_0.99"] == 0


def test_step_levers_attributes_copies_to_layers_in_both_directions():
    """A forward op goes to the layer it runs in, a backward op to the layer whose forward made its autograd node."""
    from ultralytics.nn.tasks import DetectionModel

    from tools.step_levers import copies_by_layer

    model = DetectionModel("yolo11n.yaml", nc=80, verbose=False).to(memory_format=torch.channels_last).train()
    x = torch.rand(1, 3, 64, 64).to(memory_format=torch.channels_last)

    def step():
        sum(o.float().square().mean() for o in model(x)["feats"]).backward()
    rows = copies_by_layer(model, step, time_of=lambda e: e.self_cpu_time_total)
    found = {(layer.split()[-1], way, op) for _, _, layer, way, op in rows}
    assert ("C3k2", "forward", "aten::cat") in found
    assert ("Upsample", "backward", "aten::upsample_nearest2d_backward") in found
    assert any(way == "backward" and op == "aten::copy_" for _, way, op in found)


def test_loss_traffic_counts_less_with_the_assigners_levers(monkeypatch, capsys):
    """The counter runs on a tiny batch; the levers move less, and it leaves the levers as they were."""
    from tools import loss_traffic
    from yolofeed.train.loss import detect

    monkeypatch.setattr(detect, "GRID_CANDIDATES", "as set")
    monkeypatch.setattr(detect, "FOREGROUND_NORM", "as set")
    totals = []
    for grid, norm in ((False, False), (True, True)):
        traffic, _ = loss_traffic.loss_traffic("yolo11n.yaml", 2, 6, 128, grid, norm)
        totals.append(sum(v[1] for v in traffic.by.values()))
        assert not any(op in loss_traffic.VIEWS for op, _ in traffic.by)
    assert totals[1] < totals[0]
    loss_traffic.main(["--model", "yolo11n.yaml", "--batch", "2", "--boxes", "6", "--imgsz", "128", "--top", "3"])
    out = capsys.readouterr().out
    assert out.count("GB at batch 128") == 3 and out.count(" MB ") == 3, out
    assert detect.GRID_CANDIDATES == detect.FOREGROUND_NORM == "as set"


def test_save_profile_times_ultralytics_save_model_and_its_parts(tmp_path, capsys):
    from tools.device import save_profile

    assert save_profile.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for part in ("Ultralytics' save_model, atomic writes with fsync", "plain writes (as stock)", "EMA finite check",
                 "torch.save to memory", "one file, atomic without fsync"):
        assert re.search(re.escape(part) + r".* \d+\.\d ms", out), out
    assert (tmp_path / "last.pt").is_file() and (tmp_path / "plain-best.pt").is_file()


def test_setup_profile_puts_each_threads_samples_in_their_phase():
    """Its sampler reads another thread's stacks; its report counts each sample's seconds (the time since the tick
    before) in the phase its time falls in, per thread, and leaves out of the inclusive list what every sample holds."""
    from tools.device import setup_profile

    stop = threading.Event()

    def waits_here():
        stop.wait(0.01)

    def and_here():
        stop.wait(0.01)

    def turns():
        while not stop.is_set():
            waits_here()
            and_here()

    thread = threading.Thread(target=turns, name="profiled")
    sampler = setup_profile.Sampler(0.002)
    thread.start()
    sampler.start()
    time.sleep(0.2)
    sampler.stop()
    stop.set()
    thread.join()
    names = {f.split(" ")[0] for t, th, sid, w in sampler.samples if th == "profiled"
             for f in next(k for k, i in sampler.stacks.items() if i == sid)}
    assert {"turns", "waits_here", "and_here"} <= names and "setup-profile-sampler" not in {
        th for _, th, _, _ in sampler.samples}

    made = setup_profile.Sampler(0.005)  # a report of set samples: no clock
    a, b = ("main (x.py:1)", "waits_here (x.py:5)"), ("main (x.py:1)", "and_here (x.py:9)")
    made.stacks = {a: 0, b: 1}
    made.samples = [(1.0, "T", 0, 0.5), (1.5, "T", 1, 0.25), (2.5, "T", 0, 1.0), (2.6, "U", 1, 0.1), (0.5, "T", 0, 9)]
    marks = [(1.0, "build"), (2.0, "epoch1")]
    assert setup_profile.phase_of(0.5, marks) is None and setup_profile.phase_of(2.0, marks) == "epoch1"
    text = setup_profile.report(made, marks, top=5)
    build = text.split("== build / T: ")[1].split("\n==")[0]
    assert build.startswith("0.75 s seen") and "0.50 s  waits_here" in build and "0.25 s  and_here" in build
    assert "main (x.py:1)" not in build.split("at the top")[0]  # on every sample's stack
    assert "== epoch1 / T: 1.00 s seen" in text and "== epoch1 / U: 0.10 s seen" in text
    assert "9.00" not in text  # before the first mark


def test_gil_convoy_times_torch_calls_alone_and_beside_a_pickling_thread():
    from tools import gil_convoy

    rows = gil_convoy.main(["--calls", "50"])
    assert [r["switch_ms"] for r in rows] == [5.0, 0.5]
    assert all(r[k] > 0 for r in rows for k in ("torch_alone_s", "torch_beside_s", "python_alone_s",
                                                  "python_beside_s"))
