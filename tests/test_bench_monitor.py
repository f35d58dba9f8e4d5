"""Step accounting (fake clock), the system sampler, and a tiny CPU ``yolofeed bench``."""

from __future__ import annotations

import json

import pytest

from helpers import FakeClock
from yolofeed.monitor import StepTimer, SystemSampler


def test_step_timer_rates_and_data_wait():
    clock = FakeClock()
    timer = StepTimer(warmup=2, window=2, clock=clock)
    timer.step_done(8)  # opens the clock
    for k in range(8):  # steps of 0.5 s: 0.1 waiting for data, 0.4 computing; warm-up steps are slower
        clock.t += 0.1 if k >= 2 else 1.0
        timer.batch_ready()
        clock.t += 0.4
        timer.step_done(8)
    s = timer.compute()
    assert s.steps == 6 and s.images_per_s == pytest.approx(16.0) and s.step_ms == pytest.approx(500.0)
    assert s.data_wait_fraction == pytest.approx(0.2)
    assert len(s.windows) == 3


def test_step_timer_without_batch_ready_counts_no_wait():
    clock = FakeClock()
    timer = StepTimer(warmup=0, window=1, clock=clock)
    timer.step_done(4)
    clock.t += 2.0
    timer.step_done(4)
    assert timer.compute().data_wait_fraction == 0.0 and timer.compute().images_per_s == pytest.approx(2.0)


def test_system_sampler_reports_host_load():
    """A child process spinning on one core shows up as about one busy core, of the machine and of this process."""
    import subprocess
    import sys
    import time

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        s = SystemSampler(interval=0.05).start()
        deadline = time.monotonic() + 20
        while len(s._cpu) < 5 and time.monotonic() < deadline:  # wait for samples, not for a duration
            time.sleep(0.05)
        stats = s.stop()
    finally:
        spin.kill()
        spin.wait()
    assert stats.samples >= 5 and stats.cpu_cores_busy > 0.5
    assert stats.own_cores_busy > 0.5  # the spinner is our child; the probe process itself is not counted
    assert stats.gpu_util is None or 0 <= stats.gpu_util <= 100


@pytest.mark.slow
def test_bench_runs_every_mode_and_writes_its_report(synth_root, tmp_path, capsys):
    from yolofeed.cli import main

    out = tmp_path / "bench"
    assert main(["bench", f"data={synth_root / 'data.yaml'}", "imgsz=64", "batch=4", "steps=4", "warmup=2",
                 "window=2", "device=cpu", "workers=0", f"out={out}",
                 "modes=stock,yolofeed,yolofeed_jpeg,yolofeed_inline,ceiling"]) == 0
    report = json.loads((out / "bench.json").read_text())
    assert [r["mode"] for r in report["results"]] == ["stock", "yolofeed", "yolofeed_jpeg", "yolofeed_inline",
                                                        "ceiling"]
    assert all(r["images_per_s"] > 0 and r["steps"] == 4 for r in report["results"])
    assert (out / "bench.png").stat().st_size > 1000
    text = capsys.readouterr().out
    assert "÷ ceiling" in text and "yolofeed" in text
