"""Step accounting (fake clock), the system sampler, and a tiny CPU ``yolofeed bench``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

from helpers import FakeClock
from yolofeed.monitor import StepClock, SystemSampler
from yolofeed.monitor.steps import PHASES


def test_step_rates_and_data_wait():
    clock = FakeClock()
    timer = StepClock(clock=clock)
    timer.step_done(8)  # starts the clock
    for k in range(8):  # steps of 0.5 s: 0.1 waiting for data, 0.4 computing; warm-up steps are slower
        clock.t += 0.1 if k >= 2 else 1.0
        timer.batch_ready()
        clock.t += 0.4
        timer.step_done(8)
    s = timer.compute(skip=2, window=2)
    assert s.steps == 6 and s.images_per_s == pytest.approx(16.0) and s.step_ms == pytest.approx(500.0)
    assert s.data_wait_fraction == pytest.approx(0.2)
    assert len(s.windows) == 3


def test_mean_step_beside_the_median_when_batches_come_in_bursts():
    """A loader that delivers in bursts: every 4th step waits 1 s for data, the other three are served from its
    queue in 0.1 s. The median step is a fast one and hides the waiting; the mean step (wall time / steps) is what
    the img/s beside it implies (batch / mean step)."""
    clock = FakeClock()
    timer = StepClock(clock=clock)
    timer.step_done(64)  # starts the clock
    for k in range(16):
        clock.t += 1.0 if k % 4 == 0 else 0.0  # the burst's first step waits for the loader
        timer.batch_ready()
        clock.t += 0.1
        timer.step_done(64)
    s = timer.compute(window=4)
    assert s.step_ms == pytest.approx(100.0)  # the median: a step from the queue
    assert s.mean_step_ms == pytest.approx(1e3 * (16 * 0.1 + 4 * 1.0) / 16)  # 350 ms: wall time / steps
    assert 64 / (s.mean_step_ms / 1e3) == pytest.approx(s.images_per_s)  # the row agrees with img/s
    assert s.mean_step_ms > 3 * s.step_ms


def test_step_without_batch_ready_counts_no_wait():
    clock = FakeClock()
    timer = StepClock(clock=clock)
    timer.step_done(4)
    clock.t += 2.0
    timer.step_done(4)
    s = timer.compute(window=1)
    assert s.data_wait_fraction == 0.0 and s.images_per_s == pytest.approx(2.0)


def test_an_epoch_start_times_the_first_step_and_an_epoch_end_closes_the_clock():
    """The first step of an epoch waits from the epoch's start, not from the last step of the epoch before (which
    would count the validation in between as data wait)."""
    from yolofeed.monitor.live import TrainingMonitor

    c = FakeClock()
    clock = StepClock(clock=c)
    for _epoch in range(2):
        clock.epoch_start()
        for _step in range(3):
            c.t += 0.25
            clock.batch_ready()
            c.t += 0.75
            clock.step_done(4)
        clock.epoch_end()
        c.t += 30.0  # validation
        clock.step_done(4)  # a step outside an epoch (none in Ultralytics' loop) is not recorded
    waits = [r.ms["data_wait"] for r in clock.resolved()]
    assert clock.steps == len(waits) == 6 and waits == pytest.approx([250.0] * 6)
    assert clock.epochs == 2 and clock.seconds == pytest.approx(6.0) and clock.images == 24
    assert {"on_train_epoch_start", "on_train_epoch_end"} <= set(TrainingMonitor().callbacks())  # it marks them too


def test_system_sampler_reports_host_load():
    """A child process spinning on one core shows up as the cores it really got, in this process's count and the
    machine's. On a loaded machine it gets less than a core, so the reference is its own CPU time, not 1.0."""
    import subprocess
    import sys
    import time

    import psutil

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        child = psutil.Process(spin.pid)
        s = SystemSampler(interval=0.05).start()
        t0, c0 = time.monotonic(), sum(child.cpu_times()[:2])
        deadline = time.monotonic() + 20
        while len(s) < 5 and time.monotonic() < deadline:  # wait for samples, not for a duration
            time.sleep(0.05)
        got = (sum(child.cpu_times()[:2]) - c0) / (time.monotonic() - t0)  # cores the spinner had meanwhile
        stats = s.stop()
    finally:
        spin.kill()
        spin.wait()
    assert stats.samples >= 5 and got > 0.1
    # the spinner is our child (the probe process itself is not counted); the test's own sleeps add a little
    assert 0.6 * got < stats.own_cores_busy < got + 0.4
    assert stats.cpu_cores_busy > 0.6 * got and stats.busiest_core > 0.6 * got
    assert 0 < stats.ram_used_gb and stats.swap_used_gb is not None and stats.swap_used_gb >= 0
    assert stats.gpu_util is None or 0 <= stats.gpu_util <= 100


def test_a_probe_that_ignores_sigterm_is_killed_and_the_stop_returns(monkeypatch):
    """The teardown of a stopped run waits for nothing without end: a probe stuck (here: SIGTERM ignored) is killed
    after ``PROBE_STOP_S``."""
    from yolofeed.monitor import system

    stuck = ("import json, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "print(json.dumps({'ready': 1, 'cores': 1}), flush=True); time.sleep(60)")
    probe = types.SimpleNamespace(**{k: getattr(subprocess, k) for k in ("PIPE", "DEVNULL", "TimeoutExpired")},
                                  Popen=lambda args, **kw: subprocess.Popen([sys.executable, "-c", stuck], **kw))
    monkeypatch.setattr(system, "subprocess", probe)  # the probe's module alone: any other subprocess is untouched
    monkeypatch.setattr(system, "PROBE_STOP_S", 0.3)
    s = SystemSampler(interval=0.05).start()
    proc = s._proc
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < 10 and proc.returncode == -9 and s._proc is None


def test_a_probe_that_dies_is_said_once_and_its_last_figures_are_not_reported_as_now(caplog):
    """The probe killed (or failing) mid-run: the live gauges and the summary line kept its last sample for the rest
    of the run, and a probe killed before its first sample gave the doctor "0.0/2 cores" as a measurement (found by
    an adversarial tester). Now one warning says why, ``recent`` holds no sample, the summary line says "not
    sampled"; ``stop`` keeps the samples taken before, and ``lost`` says why for the doctor's and bench's tables."""
    import logging

    from yolofeed.monitor.live import TrainingMonitor

    s = SystemSampler(interval=0.05).start()
    deadline = time.monotonic() + 20
    while len(s) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.recent(60.0).samples >= 3 and s.lost is None
    with caplog.at_level(logging.WARNING, logger="yolofeed.monitor.system"):
        s._proc.kill()
        s._thread.join(10)
    assert s.lost == "it ended with exit code -9" and s.recent(60.0).samples == 0
    said = [r.getMessage() for r in caplog.records if "system probe" in r.getMessage()]
    assert len(said) == 1 and "stopped (it ended with exit code -9): CPU, GPU and disk figures are not sampled" in \
        said[0] and "training goes on" in said[0], said
    assert s.stop().samples >= 3  # the window's samples before it died stay the window's
    quiet = SystemSampler(interval=0.05).start()  # a Ctrl-C reaches the probe too: the training stops it, silently
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="yolofeed.monitor.system"):
        os.kill(quiet._proc.pid, signal.SIGINT)
        time.sleep(0.5)
        assert quiet._proc.poll() is None
        quiet.stop()
    assert quiet.lost is None and not [r for r in caplog.records if "system probe" in r.getMessage()]
    values = {"images_per_s": 10.0, "gpu_util": None, "cpu_cores_busy": None, **{f"ms_{p}": 1.0 for p in PHASES}}
    assert TrainingMonitor.line(values).endswith("| GPU and CPU not sampled")


def test_the_bench_table_says_not_sampled_where_the_probe_took_no_sample():
    from yolofeed.bench.run import table

    row = {"mode": "yolofeed", "images_per_s": 100.0, "gpu_util": None, "gpu_mem_peak_gb": None, "mean_step_ms": 80.0,
           "data_wait_fraction": 0.1, "own_cores_busy": 0.0, "cpu_cores_busy": 0.0, "machine_samples": 0}
    lines = table([row, {**row, "mode": "stock", "own_cores_busy": 1.5, "machine_samples": 40}]).splitlines()
    assert "not sampled" in lines[1] and "0.0" not in lines[1].split("%")[-1] and "not sampled" not in lines[2]
    assert "1.5" in lines[2]


def test_a_probe_error_is_one_reason_not_a_traceback_and_unsupported_nvml_reads_are_left_out(monkeypatch):
    """NVML's NotSupported for utilisation or power (GPUs that report N/A) killed the probe at its first sample, its
    traceback in the training's output: each reading that is not supported is left out, the others go on; any other
    failure reaches the sampler as one reason."""
    from yolofeed.monitor import probe

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
        pass

    def unsupported(handle):
        raise NVMLError_NotSupported("Not Supported")

    timeouts = iter([NVMLError("Timeout")])

    def clock(handle, kind):  # one failure of another kind: that sample goes without it, the next has it
        if (e := next(timeouts, None)) is not None:
            raise e
        return 1500

    fake = types.SimpleNamespace(NVMLError=NVMLError, NVMLError_NotSupported=NVMLError_NotSupported,
                                 nvmlInit=lambda: None, NVML_CLOCK_SM=1,
                                 nvmlDeviceGetHandleByIndex=lambda i: "h", nvmlDeviceGetUtilizationRates=unsupported,
                                 nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2e9),
                                 nvmlDeviceGetClockInfo=clock, nvmlDeviceGetPowerUsage=unsupported)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    read = probe._gpu("0")
    assert read() == {"mem": 2.0}
    assert read() == read() == {"mem": 2.0, "clock": 1500}
    s = SystemSampler()
    s._ready = threading.Event()
    lines = [json.dumps({"ready": True, "cores": 2}) + "\n", "not json\n",
             json.dumps({"error": "RuntimeError: boom"}) + "\n"]
    s._proc = types.SimpleNamespace(stdout=iter(lines), wait=lambda: 1, pid=4321)
    s._read(s._proc)
    assert s.lost == "RuntimeError: boom" and s.cores == 2 and s.recent(5).samples == 0


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux CPU affinity and two cores")
def test_system_sampler_counts_only_the_cores_the_run_may_use(monkeypatch):
    """Pinned to one core (a Slurm cpuset, taskset), a run's machine is that core: load on the others does
    not compete with it (counted, it read as CPU contention)."""
    import time
    from collections import namedtuple

    from yolofeed.monitor import probe

    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        assert probe.allowed_cpus(os.getpid()) == [min(before)]
        s = SystemSampler(interval=0.05).start()  # the probe reads this process's affinity, not its own
        deadline = time.monotonic() + 20
        while len(s) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = s.stop()
    finally:
        os.sched_setaffinity(0, before)
    assert stats.cores == 1 and stats.samples >= 3 and 0 <= stats.cpu_cores_busy <= 1.05
    assert probe.allowed_cpus(os.getpid()) is None  # every core: the whole machine, as before

    # the sums themselves, on a made-up 4-core machine: cores 1 and 3 busy 2 s and 3 s, 1 s iowait on core 3
    T = namedtuple("T", "user system idle iowait")
    cores = [T(9, 0, 1, 0), T(2, 0, 5, 0), T(9, 0, 1, 0), T(1, 2, 4, 1)]
    monkeypatch.setattr(probe.psutil, "cpu_times", lambda percpu=False: cores if percpu else None)
    assert probe._Cores([1, 3]).read() == ([2, 3], 1) and probe._Cores([1, 3]).n == 2


def test_nvml_reads_the_runs_gpu_by_uuid_not_by_cuda_index():
    from yolofeed.monitor.system import nvml_spec

    assert nvml_spec("cpu") == "-" and nvml_spec(None) == "0"


@pytest.mark.gpu
def test_cuda_device_maps_to_its_own_nvml_gpu():
    import pynvml
    import torch

    from yolofeed.monitor.system import nvml_spec

    pynvml.nvmlInit()
    for i in range(torch.cuda.device_count()):
        spec = nvml_spec(torch.device("cuda", i))
        handle = pynvml.nvmlDeviceGetHandleByUUID(spec)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        assert (uuid.decode() if isinstance(uuid, bytes) else uuid) == spec
        bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
        bus = bus.decode() if isinstance(bus, bytes) else bus
        assert int(bus.split(":")[-2], 16) == torch.cuda.get_device_properties(i).pci_bus_id


@pytest.mark.slow
def test_bench_runs_every_mode_and_writes_its_report(synth_root, tmp_path, capfd):
    from yolofeed.cli import main

    out = tmp_path / "bench"
    assert main(["bench", f"data={synth_root / 'data.yaml'}", "imgsz=64", "batch=4", "steps=4", "warmup=2",
                 "window=2", "device=cpu", "workers=0", f"out={out}", "isolate=False",
                 "modes=stock,yolofeed,yolofeed_jpeg,yolofeed_inline,yolofeed_nopool,ceiling,ceiling_stock"]) == 0
    report = json.loads((out / "bench.json").read_text())
    modes = ["stock", "yolofeed", "yolofeed_jpeg", "yolofeed_inline", "yolofeed_nopool", "ceiling", "ceiling_stock"]
    assert [r["mode"] for r in report["results"]] == modes
    assert all(r["images_per_s"] > 0 and r["steps"] == 4 and r["batch"] == 4 for r in report["results"])
    assert all(r["mean_step_ms"] > 0 for r in report["results"])
    assert (out / "bench.png").stat().st_size > 1000
    captured = capfd.readouterr()
    text = captured.out
    assert "÷ ceiling" in text and "yolofeed" in text and "mean step" in text
    # the runs are where out= says, not in a deleted temporary folder
    assert all((out / "runs" / m / "args.yaml").is_file() for m in modes)
    env = report["environment"]
    assert env["command"].startswith("yolofeed bench ") and "modes=" in env["command"]
    assert env["date"] and env["ultralytics"] and env["torch"] and env["cpu"] and env["ram_gb"] > 0
    slower = [r for r in report["results"] if r["mode"].startswith("yolofeed")
              and r["images_per_s"] < report["results"][0]["images_per_s"]]
    said = [n for n in report["notes"] if "slower than stock" in n]
    assert len(said) == len(slower)  # said plainly, for each yolofeed mode slower than stock
    assert all(r["optimizer"] for r in report["results"])  # which optimiser optimizer=auto picked, for each mode
    assert all(f"NOTE: {n}" in text for n in report["notes"])
    assert any(n.startswith("yolofeed, yolofeed_jpeg, yolofeed_inline, yolofeed_nopool, ceiling, ceiling_stock "
                            "trained in this process after stock") for n in report["notes"])
    # the profile's own step bar, not Ultralytics' epoch bar with its 10**6 epochs
    assert "1000000" not in captured.out + captured.err and "Starting training" not in captured.out
    assert "training stopped" not in captured.out + captured.err  # the profile's own stop is no failed run
    assert f"{7 * (2 + 4 + 1)}/{7 * (2 + 4 + 1)}" in captured.err  # the bar ends exactly on its total
    # 24 images at batch 4: the first epoch ends inside the 7 steps, so every mode reports it, at no extra step
    assert all(r["first_epoch_images_per_s"] > 0 and r["first_epoch_s"] > 0 for r in report["results"])
    assert all(0 < r["first_step_s"] < r["first_epoch_s"] + 60 for r in report["results"])
    assert "1st epoch" in text and "÷ steady" in text and "1st step" in text
    # efficiency beside utilisation: 3 x Ultralytics' forward GFLOPs at imgsz 64; no MFU without a GPU's peak
    assert all(0 < r["forward_gflops"] < 1 and r["train_tflops"] == pytest.approx(
        r["images_per_s"] * 3 * r["forward_gflops"] / 1e3) and r["mfu"] is None for r in report["results"])
    assert "TFLOP/s (MFU)" in text


@pytest.mark.slow
def test_bench_trains_each_mode_in_a_process_of_its_own(synth_root, tmp_path, capfd, monkeypatch):
    """As a user's run does: each mode pays its own one-off costs, and its steps still count on the bench's bar."""
    import yolofeed.bench.run as bench
    from yolofeed.cli import main

    monkeypatch.setattr(bench, "run_mode", lambda *a, **k: pytest.fail("a mode trained in the bench's process"))
    out = tmp_path / "bench"
    assert main(["bench", f"data={synth_root / 'data.yaml'}", "imgsz=64", "batch=4", "steps=4", "warmup=2",
                 "window=2", "device=cpu", "workers=0", f"out={out}", "modes=stock,yolofeed"]) == 0  # the default
    report = json.loads((out / "bench.json").read_text())
    assert [r["mode"] for r in report["results"]] == ["stock", "yolofeed"]
    assert not any("trained in this process" in n for n in report["notes"])
    assert all(r["images_per_s"] > 0 and r["steps"] == 4 and r["first_step_s"] > 0 for r in report["results"])
    assert all((out / "runs" / m / "args.yaml").is_file() for m in ("stock", "yolofeed"))
    err = capfd.readouterr().err
    assert f"{2 * (2 + 4 + 1)}/{2 * (2 + 4 + 1)}" in err and "yolofeed (2/2)" in err  # the bar ends on its total


@pytest.mark.slow
def test_a_whole_run_times_each_epoch_with_its_validation_as_a_users_run(synth_root, tmp_path, capfd):
    """whole_run=E: each mode trains E epochs at Ultralytics' defaults (validation, checkpoints, plots, the final
    validation) in a process of its own, and every part of its wall time is accounted for."""
    from yolofeed.cli import main

    out = tmp_path / "bench"
    assert main(["bench", f"data={synth_root / 'data.yaml'}", "imgsz=64", "batch=8", "device=cpu", "workers=0",
                 f"out={out}", "whole_run=2"]) == 0  # the default modes, the ceiling left out
    report = json.loads((out / "bench.json").read_text())
    assert [r["mode"] for r in report["results"]] == ["stock", "yolofeed"]
    for r in report["results"]:
        run = out / "runs" / r["mode"]
        assert [e["epoch"] for e in r["epochs"]] == [1, 2] and r["images"] == 24 and r["optimizer"] == "AdamW"
        assert r["batch"] == 8
        for e in r["epochs"]:  # validated every epoch, inside the epoch's time
            assert 0 < e["train_s"] and 0 < e["val_s"] and e["train_s"] + e["val_s"] <= e["epoch_s"]
        assert r["epochs"][-1]["save_s"] > 0 and all(e["save_s"] < e["epoch_s"] for e in r["epochs"])  # checkpoints
        assert r["setup_s"] > 0 and r["final_s"] > 0
        assert r["setup_s"] + sum(e["epoch_s"] for e in r["epochs"]) + r["final_s"] <= r["wall_s"] + 0.05  # rounding
        parts = r["parts"]  # the set-up's and the end's parts lie inside them
        assert parts["build_s"] + parts["setup_train_s"] <= r["setup_s"] + 0.02
        assert 0 < parts["first_batch_s"] <= r["epochs"][0]["train_s"] + 0.01
        assert 0 < parts["final_val_s"] <= r["final_s"] + 0.01
        assert 0 < parts["final_val_batches_s"] <= parts["final_val_s"]  # the rest: its metrics and plots
        assert parts["warm_up_s"] is None  # on the CPU there is no warm-up
        assert (run / "weights" / "best.pt").is_file() and (run / "weights" / "last.pt").is_file()
        assert len((run / "results.csv").read_text().strip().splitlines()) == 1 + 2
        assert (run / "results.png").is_file()  # plots at their default
    captured = capfd.readouterr()
    assert "whole runs of 2 epochs" in captured.out and "speed-up" in captured.out and "1st epoch" in captured.out
    assert "   val   save  train img/s" in captured.out  # the later epochs' checkpoint beside their validation
    assert "yolofeed: set-up: trainer" in captured.out and "end: final validation" in captured.out
    assert "12/12" in captured.err  # the bar counts every batch of both runs: 2 x 2 epochs x 3 batches
    assert (out / "bench.png").stat().st_size > 1000


def test_a_whole_runs_warm_up_parts_are_reported_and_said():
    """The warm-up's parts (the trainer's ``warm_up_parts``) go into bench.json's parts and the breakdown's words."""
    from yolofeed.bench import whole

    marks = {"built": 2.0, "set_up": 20.0, "first_epoch": 21.0, "first_batch": 21.5}
    warm = {"full_batch_s": 5.004, "after_full_s": 3.0, "other_sizes_s": 4.0, "augmentation_s": 0.5}
    parts = whole.run_parts(marks, 0.0, 16.6, 9.7, None, warm)
    assert parts["warm_up_s"] == 16.6 and parts["warm_up_full_batch_s"] == 5.0 and parts["warm_up_other_sizes_s"] == 4
    said = whole.breakdown({"parts": parts})
    assert ("(warm-up 16.6 s: full batch 5.0 s, graph and validation set-up 3.0 s, other batch sizes 4.0 s, "
            "augmentation 0.5 s)") in said
    assert "(warm-up 16.6 s)" in whole.breakdown({"parts": whole.run_parts(marks, 0.0, 16.6, 9.7)})
    assert "final validation 9.7 s (its batches 2.5 s)" in whole.breakdown(
        {"parts": whole.run_parts(marks, 0.0, 16.6, 9.7, final_val_batches_s=2.5)})
    later = whole.run_parts(marks, 0.0, 16.6, 9.7, None, {**warm, "beside_s": 6.0})
    assert "other batch sizes' set-up 6.0 s beside an epoch" in whole.breakdown({"parts": later})
    early = whole.run_parts(marks, 0.0, 16.6, 9.7, None, {**warm, "early_s": 4.2})
    assert "augmentation 0.5 s); the full batch's early pass 4.2 s beside the trainer's build; first batch" in \
        whole.breakdown({"parts": early})


def test_a_whole_run_refuses_the_ceiling_and_a_second_epoch_count(synth_root, tmp_path, capsys):
    from yolofeed.cli import main

    for extra, said in ((["modes=stock,ceiling"], "a ceiling replays four batches"),
                        (["modes=stock,yolofeed", "epochs=3"], "whole_run= is the run's epochs"),
                        # time= ended each mode after its hours: the title said 2 epochs where a mode trained fewer
                        (["modes=stock,yolofeed", "time=0.0002"], "time=0.0002 with whole_run=2: time= ends each "
                                                                  "run after that many hours")):
        assert main(["bench", f"data={synth_root / 'data.yaml'}", "device=cpu", f"out={tmp_path}", "whole_run=2",
                     *extra]) != 0
        assert said in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()


def test_the_modes_that_differ_in_validation_need_a_whole_run(synth_root, tmp_path, capsys):
    """``modes=yolofeed_val_inline`` without ``whole_run=`` measured plain yolofeed steps (a bench of steps never
    validates) and reported them as a mode of their own: refused before any mode runs."""
    from yolofeed.cli import main

    assert main(["bench", f"data={synth_root / 'data.yaml'}", "device=cpu", f"out={tmp_path}", "steps=10",
                 "modes=stock,yolofeed_val_inline,yolofeed_val_waited"]) == 1
    assert ("modes yolofeed_val_inline, yolofeed_val_waited differ from yolofeed only in how epochs are validated, "
            "and steps without whole_run= never validate: time them in whole runs that validate (whole_run=10, "
            "without val=False), or bench modes=stock\n") in capsys.readouterr().err
    # val=False: a whole run validates its last epoch alone, in place, whatever the mode
    assert main(["bench", f"data={synth_root / 'data.yaml'}", "device=cpu", f"out={tmp_path}", "whole_run=2",
                 "val=False", "modes=yolofeed_val_overlap"]) == 1
    assert ("mode yolofeed_val_overlap differs from yolofeed only in how epochs are validated, and val=False "
            "validates the last epoch alone, in place: time it in whole runs that validate (whole_run=10, without "
            "val=False), or bench modes=yolofeed\n") in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()


def test_a_whole_run_says_which_modes_stopped_short_of_its_epochs():
    """Ultralytics' early stopping (``patience=``) can end a mode's run before the epochs the title names."""
    from yolofeed.bench.run import stopped_short

    two, three = [{"epoch": 1}, {"epoch": 2}], [{"epoch": 1}, {"epoch": 2}, {"epoch": 3}]
    assert stopped_short([{"mode": "stock", "epochs": three}, {"mode": "yolofeed", "epochs": three}], 3) == []
    said = stopped_short([{"mode": "stock", "epochs": three}, {"mode": "yolofeed", "epochs": two}], 3)
    assert said == ["yolofeed trained 2 of the 3 epochs asked (early stopping: patience=): its wall time is of a "
                    "shorter run and compares with no other mode's"]


@pytest.mark.parametrize("window", ["0", "-2"])
def test_a_window_below_one_step_is_refused_before_any_mode_runs(synth_root, tmp_path, capsys, window):
    from yolofeed.cli import main

    assert main(["bench", f"data={synth_root / 'data.yaml'}", "device=cpu", f"out={tmp_path}", f"window={window}",
                 "steps=4", "modes=yolofeed"]) == 1
    assert f"window={window}: expected a whole number of steps, 1 or more" in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("modes", [",", " , "])
def test_modes_naming_no_mode_is_one_line_before_any_mode_runs(synth_root, tmp_path, capsys, modes):
    """Was an UnboundLocalError traceback after "profiling: 0 steps"."""
    from yolofeed.cli import main

    assert main(["bench", f"data={synth_root / 'data.yaml'}", "device=cpu", f"out={tmp_path}", f"modes={modes}"]) == 1
    assert f"modes={modes.strip() or modes}: names no mode; choose from " in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()


def test_a_mode_failing_in_its_own_process_is_the_benchs_one_line_error(tmp_path, capsys):
    from yolofeed.cli import main

    empty = tmp_path / "images" / "train"
    empty.mkdir(parents=True)
    (tmp_path / "d.yaml").write_text(f"path: {tmp_path}\ntrain: images/train\nval: images/train\nnames: {{0: a}}\n")
    assert main(["bench", f"data={tmp_path / 'd.yaml'}", "imgsz=64", "batch=4", "device=cpu", "workers=0",
                 f"out={tmp_path / 'b'}", "modes=yolofeed", "isolate=True"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"yolofeed bench: error: {tmp_path / 'd.yaml'}: 'train:' no images found in ")
    assert str(empty) in err


def _bench_process(synth_root, out, **keys) -> subprocess.Popen:
    """``yolofeed bench`` of the yolofeed mode in its own process (isolate=True), steps without end."""
    args = {"data": synth_root / "data.yaml", "imgsz": 64, "batch": 4, "steps": 100000, "warmup": 2, "window": 2,
            "device": "cpu", "workers": 0, "out": out, "modes": "yolofeed", "isolate": True, **keys}
    return subprocess.Popen([sys.executable, "-m", "yolofeed", "bench", *(f"{k}={v}" for k, v in args.items())],
                            env=os.environ | {"YOLO_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _training_mode(bench: subprocess.Popen, out) -> list:
    """The bench's mode process, once its trainer is built (it trains): a list of one psutil.Process."""
    import psutil

    deadline = time.monotonic() + 120
    while not (out / "runs" / "yolofeed" / "args.yaml").is_file():
        assert bench.poll() is None and time.monotonic() < deadline, "the bench never started its mode"
        time.sleep(0.2)
    mode = [c for c in psutil.Process(bench.pid).children() if "mode_main" in " ".join(c.cmdline())]
    assert len(mode) == 1
    return mode


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_bench_stopped_alone_leaves_no_mode_training(synth_root, tmp_path, sig):
    import signal

    import psutil

    bench, mode = _bench_process(synth_root, tmp_path / "b"), []
    try:
        mode = _training_mode(bench, tmp_path / "b")
        os.kill(bench.pid, getattr(signal, sig))  # the bench's process alone, not its group
        bench.wait(timeout=30)
        mode[0].wait(timeout=10)  # raises psutil.TimeoutExpired while it still trains
        # SIGTERM: the bench stops its mode first, then exits as a SIGTERM'd build does
        assert bench.returncode == (-signal.SIGKILL if sig == "SIGKILL" else 128 + signal.SIGTERM)
        if sig == "SIGTERM":  # said in one line (it exited without a word)
            assert bench.stderr.read().strip().splitlines()[-1] == "yolofeed bench: stopped by SIGTERM"
    finally:
        for p in [bench, *mode]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                p.kill()


@pytest.mark.slow
def test_a_mode_process_killed_alone_is_the_benchs_one_line_error(synth_root, tmp_path):
    import psutil

    bench, mode = _bench_process(synth_root, tmp_path / "b"), []
    try:
        mode = _training_mode(bench, tmp_path / "b")
        mode[0].kill()  # as the OOM killer would
        _, err = bench.communicate(timeout=30)  # a bench still waiting for it fails here
        assert bench.returncode == 1
        assert err.strip().splitlines()[-1] == ("yolofeed bench: error: mode yolofeed's process ended without a "
                                                "result (killed by SIGKILL); its output above says why, or run it "
                                                "alone with modes=yolofeed isolate=False")
    finally:
        for p in [bench, *mode]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                p.kill()


class Odd(Exception):
    """Pickles (a module's class), but does not unpickle: its constructor takes other arguments than its args."""

    def __init__(self, a, b):
        super().__init__(f"{a}-{b}")


def test_a_modes_error_comes_back_whole_or_as_its_type_and_message(monkeypatch):
    """What the mode's process sends: its steps, then the error as it is, or as a RuntimeError where it would
    not survive the trip (a constructor with other arguments pickles, but does not unpickle)."""
    import multiprocessing

    import yolofeed.bench.run as bench
    from yolofeed.config import BenchConfig
    from yolofeed.errors import DatasetError

    for error, expect in ((DatasetError("no images"), DatasetError("no images")),
                          (Odd(1, 2), RuntimeError("Odd: 1-2"))):
        def run_mode(mode, cfg, project, progress, error=error):
            progress.grow(3)
            raise error

        monkeypatch.setattr(bench, "run_mode", run_mode)
        ours, theirs = multiprocessing.Pipe()
        ours.send(("stock", BenchConfig(data="d.yaml"), "runs"))
        bench.mode_main([str(os.dup(theirs.fileno())), str(os.getppid()), "0"])  # its own descriptor, as passed
        assert ours.recv() == ("grow", 3)
        kind, got = ours.recv()
        assert kind == "error" and type(got) is type(expect) and str(got) == str(expect)
        ours.close()
        theirs.close()


def test_a_mode_process_that_ends_before_it_reads_is_the_benchs_one_line_error(monkeypatch):
    """It leaves the bench's message unread, so the bench's read meets a reset connection, not an end of file."""
    import yolofeed.bench.run as bench
    from yolofeed.config import BenchConfig
    from yolofeed.errors import YolofeedError

    monkeypatch.setattr(bench, "_MODE_MAIN", "import os, time\ntime.sleep(0.5)\nos._exit(3)\n")
    with pytest.raises(YolofeedError, match=r"^mode stock's process ended without a result \(exit code 3\)"):
        bench.run_isolated("stock", BenchConfig(data="d.yaml"), "runs", None)


def test_the_bench_compiles_yolofeeds_kernels_in_an_untimed_run_before_its_modes(monkeypatch, tmp_path):
    """The first of yolofeed's modes would otherwise pay the Triton kernels' compile and a mode after it would not:
    the order of the modes would decide their first epochs. The CPU compiles nothing."""
    import torch

    import yolofeed.bench.run as bench
    from yolofeed.config import BenchConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench.kernel_mode(["stock", "yolofeed"], own=True, device="0") == "yolofeed"
    assert bench.kernel_mode(["stock", "yolofeed_jpeg", "yolofeed"], own=True, device="0") == "yolofeed_jpeg"
    assert bench.kernel_mode(["ceiling"], own=True, device="") == "ceiling"
    assert bench.kernel_mode(["stock"], own=True, device="0") is None  # stock compiles none of yolofeed's
    assert bench.kernel_mode(["yolofeed"], own=False, device="0") is None  # in one process: the note says so
    assert bench.kernel_mode(["yolofeed"], own=True, device="cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.kernel_mode(["yolofeed"], own=True, device="") is None

    runs = []
    monkeypatch.setattr(bench, "run_isolated", lambda mode, cfg, project, progress: runs.append((mode, cfg, project)))
    cfg = BenchConfig(data="d.yaml", whole_run=10, steps=100, warmup=30)
    bench.compile_kernels("yolofeed", cfg, tmp_path / "kernels")
    (mode, short, project), = runs
    assert mode == "yolofeed" and project == tmp_path / "kernels"
    assert (short.whole_run, short.steps, short.warmup, short.first_epoch) == (0, cfg.window, 1, False)
    assert short.model == cfg.model and short.batch == cfg.batch and short.imgsz == cfg.imgsz  # the same kernels


def test_a_mode_whose_bench_is_gone_stops_at_its_next_step():
    import multiprocessing

    import yolofeed.bench.run as bench

    ours, theirs = multiprocessing.Pipe()
    ours.close()
    with pytest.raises(bench._BenchGone):
        bench._ForwardedProgress(theirs).step()
    theirs.close()


@pytest.mark.parametrize("ignores_sigint", [False, True])
def test_a_mode_stopped_early_is_asked_with_sigint_then_sigterm(tmp_path, ignores_sigint):
    """SIGINT first (a pack build cleans up on it, as on Ctrl-C); one that ignores it gets SIGTERM."""
    import signal

    import yolofeed.bench.run as bench

    said = tmp_path / "said"
    handler = "signal.SIG_IGN" if ignores_sigint else "lambda *a: (open(said, 'w').write('SIGINT'), sys.exit(130))"
    child = subprocess.Popen([sys.executable, "-c", f"import signal, sys, time\nsaid = {str(said)!r}\n"
                              f"signal.signal(signal.SIGINT, {handler})\nopen(said + '.up', 'w').close()\n"
                              "time.sleep(60)\n"])
    while not (tmp_path / "said.up").exists():
        time.sleep(0.05)
    bench._stop(child, gently=True, waits=(0.2, 2.0, 2.0))
    if ignores_sigint:
        assert child.returncode == -signal.SIGTERM and not said.exists()
    else:
        assert child.returncode == 130 and said.read_text() == "SIGINT"


def test_bench_checks_out_before_training(synth_root, tmp_path, monkeypatch, capsys):
    """A bad out= costs a second, not the whole bench: nothing trains."""
    import yolofeed.bench.run as bench
    from yolofeed.cli import main

    monkeypatch.setattr(bench, "profile", lambda *a, **k: pytest.fail("profiled before checking out="))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.yaml").write_text((synth_root / "data.yaml").read_text())  # a data yaml (checked first)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["bench", "data=d.yaml", f"out={blocker / 'sub'}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(blocker / "sub") in err[0] and "out=" in err[0]


@pytest.mark.parametrize("fails", ["bench.json", "bench.png", "the second bench.json"])
def test_a_full_out_disk_keeps_the_measurement_and_prints_the_table(synth_root, tmp_path, monkeypatch, capsys,
                                                                    fails):
    """out= fills while the modes train: every mode is still measured and the table printed, then one line names
    the file, the cause and what an earlier write left; no half-written file is left. Was three chained tracebacks
    after the whole bench, no table, and a 0-byte bench.png."""
    import errno

    from test_doctor import _fake_profile

    import yolofeed.bench.run as bench
    from yolofeed import atomic
    from yolofeed.cli import main

    real = atomic.create_temp
    measured, tries = [], []

    def profile(mode, *a, **k):
        measured.append(mode)
        return _fake_profile(mode)

    def create_temp(path):  # the disk full as write_atomically meets it: at the temporary file
        tries.append(path.name)
        if fails == path.name or (fails == "the second bench.json" and tries.count("bench.json") == 2):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path)

    monkeypatch.setattr(bench, "profile", profile)
    monkeypatch.setattr(atomic, "create_temp", create_temp)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.yaml").write_text((synth_root / "data.yaml").read_text())
    out = tmp_path / "b"
    assert main(["bench", "data=d.yaml", "modes=stock,yolofeed", f"out={out}", "isolate=False", "device=cpu"]) == 1
    captured = capsys.readouterr()
    assert measured == ["stock", "yolofeed"] and "report: not written (No space left on device)" in captured.out
    rows = [line.split()[0] for line in captured.out.splitlines() if "img/s" not in line and "600" in line]
    assert rows == ["stock", "yolofeed"], captured.out  # the table: each mode's row, its 600 img/s
    errors = [line for line in captured.err.splitlines() if "error" in line]
    assert len(errors) == 1 and f"out={out}" in errors[0] and "the table above stands" in errors[0], errors
    name = "bench.png" if fails == "bench.png" else "bench.json"
    assert f"{name} could not be written in {out}: the disk is full (No space left on device)" in errors[0], errors
    assert ("holds the first 1 of 2 modes" in errors[0]) == (fails == "the second bench.json"), errors
    left = sorted(p.name for p in out.iterdir() if p.is_file())
    assert left == ([] if fails == "bench.json" else ["bench.json"]), left
    if fails == "the second bench.json":
        assert [r["mode"] for r in json.loads((out / "bench.json").read_text())["results"]] == ["stock"]


def test_the_title_names_the_batch_autobatch_picked():
    """batch=0 or -1 is Ultralytics' AutoBatch (16 on the CPU): the title said "batch 0" beside figures measured at
    16."""
    from yolofeed.bench.run import bench_title
    from yolofeed.config import BenchConfig

    assert bench_title(BenchConfig(batch=32), [{"batch": 32}]).startswith("yolo11n.yaml, batch 32, imgsz 640, ")
    assert ", batch=0 (AutoBatch: 16), " in bench_title(BenchConfig(batch=0), [{"batch": 16}, {"batch": 16}])
    assert ", batch=-1 (AutoBatch: 96/112), " in bench_title(BenchConfig(batch=-1), [{"batch": 96}, {"batch": 112}])


def test_a_batch_larger_than_the_set_is_titled_with_the_batch_trained():
    """Ultralytics' loader trains a set of 40 images at batch=128 a step of 40; the title said "batch 128"."""
    from yolofeed.bench.run import bench_title
    from yolofeed.config import BenchConfig

    assert ", batch 128 (the set's 40 images a step), " in bench_title(BenchConfig(batch=128), [{"images": 40}])
    assert ", batch 32, " in bench_title(BenchConfig(batch=32), [{"images": 40}, {"images": None}])


def test_the_title_says_where_it_was_measured(monkeypatch):
    """A chart shared alone says its device: the CPU, or the GPU by name (found by a first-hour tester: a CPU bench's
    chart did not say so)."""
    from yolofeed.bench.run import bench_title
    from yolofeed.config import BenchConfig

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert bench_title(BenchConfig(), [{"device": "cpu"}, {"device": "cpu"}]).endswith(", on cpu")
    gpus = ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert bench_title(BenchConfig(), [{"device": "cuda:1"}], gpus).endswith(", on NVIDIA H200")
    assert bench_title(BenchConfig(), [{"device": "cpu"}, {"device": "cuda:0"}], gpus).endswith(
        ", on cpu / NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert bench_title(BenchConfig(), [{"device": "cuda:0"}], gpus).endswith(", on cuda:0")
    assert ", on " not in bench_title(BenchConfig(), [{"batch": 16}])


def test_the_title_names_the_ultralytics_keys_given():
    """A chart of a bench on half the set, or without validation, says so (``bench.json`` recorded the keys, the
    title and the chart did not); the device is named once, at the end, by its GPU's name."""
    from yolofeed.bench.run import bench_title
    from yolofeed.config import BenchConfig

    title = bench_title(BenchConfig(extra={"fraction": 0.5, "val": False, "device": "cpu"}), [{"device": "cpu"}])
    assert title.endswith(", fraction=0.5, val=False, on cpu")
    assert "device=" not in title


def test_an_optimiser_step_that_outweighs_the_loaders_is_said_with_its_share():
    from yolofeed.bench.run import heavy_optimizer

    rows = [{"mode": "yolofeed_jpeg", "optimizer": "MuSGD", "mean_step_ms": 130.0, "phases_ms": {"optimizer": 45.0}},
            {"mode": "stock", "optimizer": "AdamW", "mean_step_ms": 80.0, "phases_ms": {"optimizer": 0.5}},
            {"mode": "ceiling", "optimizer": "SGD", "mean_step_ms": 0.0, "phases_ms": {}}]
    notes = heavy_optimizer(rows)
    assert len(notes) == 1 and notes[0].startswith("yolofeed_jpeg: the optimiser step (MuSGD) took 45 ms of its 130 ms")
    assert "more than 10,000 iterations" in notes[0] and notes[0].endswith("optimizer=AdamW compares the loaders at a "
                                                                             "lighter step")
    assert "10,000 iterations" not in heavy_optimizer(rows, asked="MuSGD")[0]  # chosen by hand: no auto to explain
    rows[1]["phases_ms"]["optimizer"] = 30.0  # a heavy AdamW step: said, with no lighter optimiser to offer
    assert heavy_optimizer(rows)[1] == "stock: the optimiser step (AdamW) took 30 ms of its 80 ms step"


def test_a_raw_pack_too_big_for_the_disk_names_the_jpeg_mode(synth_root, tmp_path, monkeypatch, capsys):
    """The bench's yolofeed modes name the raw pack; where it cannot fit, the one-line error offers the jpeg mode."""
    import yolofeed.bench.run as bench
    from yolofeed.cli import main
    from yolofeed.errors import PackSpaceError

    def profile(mode, *a, **k):
        if mode.startswith("yolofeed"):
            raise PackSpaceError(f"not enough free space for the train pack in {tmp_path} ({mode})")
        pytest.fail(f"{mode} trained after the error")

    monkeypatch.setattr(bench, "profile", profile)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.yaml").write_text((synth_root / "data.yaml").read_text())  # checked before any mode runs
    assert main(["bench", "data=d.yaml", "modes=yolofeed,stock", f"out={tmp_path / 'b'}", "isolate=False"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # the lines before it: the bench's progress bar
    assert "not enough free space" in err and err.endswith("modes=yolofeed_jpeg,stock")
    assert main(["bench", "data=d.yaml", "modes=yolofeed_inline,stock,yolofeed_nopool", f"out={tmp_path / 'b'}",
                 "isolate=False"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # both raw-pack modes give way to the one jpeg mode
    assert "raw pack's yolofeed_inline, yolofeed_nopool: modes=yolofeed_jpeg,stock" in err
    assert main(["bench", "data=d.yaml", "modes=yolofeed_jpeg", f"out={tmp_path / 'b'}", "isolate=False"]) == 1
    assert "bench the jpeg pack" not in capsys.readouterr().err  # the jpeg mode's own shortage: nothing to offer


def test_gpu_utilisation_is_a_median_over_the_rate_windows():
    """A one-off stall (cuDNN tuning the epoch's last, smaller batch) drags a mean down; the windows' median,
    like the img/s median beside it, keeps the steady state. Samples outside every window are ignored."""
    from yolofeed.monitor.steps import window_median

    t = [0.1 * k for k in range(100)]  # 10 s at 10 Hz, 5 windows of 2 s; the third is a stall
    util = [0.0 if 4.0 <= x < 6.0 else 90.0 for x in t]
    edges = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert sum(util) / len(util) == 72.0 and window_median(t, util, edges) == 90.0
    assert window_median(t, [50.0] * 100, edges) == 50.0  # steady: the same as the mean
    assert window_median(t, util, [20.0, 30.0]) is None  # no sample in any window
    assert window_median(t, util, [4.0, 6.0]) == 0.0  # a run that only stalls says so


def test_bench_modes_name_their_options():
    from yolofeed.bench.modes import MODES, trainer_class
    from yolofeed.pack import codecs

    yolofeed = {m: trainer_class(m) for m in MODES if m.startswith("yolofeed")}
    assert {m: c.pack_format for m, c in yolofeed.items()} == {
        "yolofeed": codecs.DEFAULT, "yolofeed_jpeg": "jpeg", "yolofeed_inline": codecs.DEFAULT,
        "yolofeed_nopool": codecs.DEFAULT, "yolofeed_val_inline": codecs.DEFAULT,
        "yolofeed_val_overlap": codecs.DEFAULT, "yolofeed_val_waited": codecs.DEFAULT}  # raw unless named, whatever
    # pack_format=auto would pick here
    assert yolofeed["yolofeed_nopool"].partner_pool == 0 and yolofeed["yolofeed"].partner_pool == "auto"
    assert yolofeed["yolofeed_val_inline"].validate_beside is False and yolofeed["yolofeed"].validate_beside is True
    assert yolofeed["yolofeed_val_overlap"].val_overlap is True and yolofeed["yolofeed"].val_overlap is None
    assert yolofeed["yolofeed_val_waited"].val_overlap is False
    assert yolofeed["yolofeed_inline"].augment_ahead is False and yolofeed["yolofeed"].augment_ahead is True
    with pytest.raises(ValueError, match="unknown mode"):
        trainer_class("yolofeed_fast")


def test_bench_step_switches_reach_yolofeed_and_the_ceiling_not_stock(tmp_path):
    from yolofeed.bench.modes import trainer_class
    from yolofeed.cli import build_config
    from yolofeed.ultralytics_seam import DetectionTrainer

    off = {"sync_free_step": False, "fast_musgd": False}
    for mode in ("yolofeed", "yolofeed_jpeg", "ceiling"):
        cls = trainer_class(mode, off)
        assert (cls.sync_free_step, cls.fast_musgd, cls.sync_free_loss) == (False, False, True), mode
        assert trainer_class(mode).fast_musgd is True
    assert trainer_class("stock", off) is DetectionTrainer
    stock_step = trainer_class("ceiling_stock", {"sync_free_loss": True})
    assert (stock_step.sync_free_step, stock_step.sync_free_loss, stock_step.fast_musgd) == (False, False, False)
    with pytest.raises(ValueError, match="unknown step switches"):
        trainer_class("ceiling", {"channels_last": True})
    cfg = build_config("bench", ["data=x.yaml", "fast_musgd=False", "deterministic=False"])
    assert cfg.fast_musgd is False and cfg.extra == {"deterministic": False}


def test_a_whole_run_stopped_by_yolofeeds_error_leaves_the_bench_the_cause_not_a_trains_resume():
    """A mode's training stopped by one of yolofeed's errors (a full disk at a checkpoint): its stop line, which names
    ``yolofeed train resume=``, is kept on the error (not logged); the bench's error line is the cause."""
    from yolofeed.bench import whole
    from yolofeed.errors import WriteError, say_stopped

    logged = []

    class Stopped:
        def __init__(self, overrides):
            self.callbacks = []

        def save_model(self):
            pass

        def add_callback(self, event, fn):
            self.callbacks.append(event)

        def train(self):
            e = WriteError("could not write last.pt: the disk is full")
            say_stopped(e, "training stopped in epoch 2 by WriteError: ... continue with: yolofeed train resume=x",
                        logged.append)
            raise e

    with pytest.raises(WriteError) as caught:
        whole.whole_run("yolofeed", Stopped, {}, 2)
    assert logged == [] and "yolofeed train resume" in caught.value.stopped
    assert str(caught.value) == "could not write last.pt: the disk is full"


def test_a_profiled_run_stopped_by_yolofeeds_error_leaves_its_caller_the_cause(monkeypatch):
    """bench's and the doctor's step profiles (measure/profile.py): a training stopped by one of yolofeed's errors
    keeps its stop line (yolofeed train's resume) on the error instead of logging it; the command says the cause."""
    from yolofeed.errors import PackError, say_stopped
    from yolofeed.measure import profile

    logged = []

    class Stopped:
        def __init__(self, overrides):
            self.callbacks = {}

        def add_callback(self, event, fn):
            self.callbacks.setdefault(event, []).append(fn)

    def stopped(trainer):
        e = PackError("train.yfpack is damaged: rebuild it with: yolofeed pack ...")
        say_stopped(e, "training stopped in epoch 1 ... continue with: yolofeed train resume=x", logged.append)
        raise e

    monkeypatch.setattr(profile, "train_until_stopped", stopped)
    with pytest.raises(PackError) as caught:
        profile.profile("yolofeed", Stopped, {}, steps=2, warmup=1)
    assert logged == [] and "yolofeed train resume" in caught.value.stopped
