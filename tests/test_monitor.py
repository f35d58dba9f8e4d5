"""Live monitoring: the alert logic (fake clock), and a monitored CPU run serving Prometheus and TensorBoard."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from helpers import FakeClock
from yolofeed.monitor import LowUtilAlert, PhaseTimer
from yolofeed.monitor.live import TrainingMonitor


def test_alert_fires_once_per_episode_after_the_hold():
    c = FakeClock()
    a = LowUtilAlert(util=60, wait=0.2, hold=10, clock=c)
    fired = []
    for t, util, wait in [(0, 30, 0.5), (5, 30, 0.5), (10, 30, 0.5), (15, 30, 0.5),  # starved: fires at 10 s, once
                          (20, 95, 0.01),  # recovered: re-armed
                          (25, 20, 0.6), (30, 20, 0.6), (36, 20, 0.6),  # a second episode
                          (40, 30, 0.05)]:  # low util but no data wait: compute-bound, no alert
        c.t = t
        fired.append(a.update(util, wait))
    assert fired == [False, False, True, False, False, False, False, True, False]
    assert a.episodes == 2
    assert not LowUtilAlert(60, 0.2, 0, clock=c).update(None, 0.9)  # no GPU: never alerts


def test_phase_timer_splits_the_step_on_a_fake_clock():
    c = FakeClock()
    p = PhaseTimer(cuda=False, clock=c)
    p.step_done(8)  # a step that ends before any mark: only opens the clock
    for _ in range(4):
        c.t += 0.2  # data wait
        p.batch_ready()
        for phase, dt in (("forward", 0.05), ("loss", 0.1), ("backward", 0.02), ("optimizer", 0.1)):
            c.t += dt
            p.mark(phase)
        c.t += 0.03
        p.step_done(8)
    s = p.summary()
    assert s.steps == 4
    assert s.ms["data_wait"] == pytest.approx(200) and s.ms["preprocess"] == pytest.approx(50)
    assert s.ms["forward"] == pytest.approx(100) and s.ms["loss"] == pytest.approx(20)
    assert s.ms["backward"] == pytest.approx(100) and s.ms["optimizer"] == pytest.approx(30)
    assert s.step_ms == pytest.approx(500) and s.images_per_s == pytest.approx(16)
    p.mark("forward")  # outside a step (validation): ignored
    assert p.summary().steps == 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_monitored_stock_run_serves_prometheus_and_tensorboard(synth_root, tmp_path):
    from ultralytics import YOLO

    from yolofeed.monitor import attach

    port = _free_port()
    model = YOLO("yolo11n.yaml")
    # publish every step: a run of a few seconds gives the scraper many chances, not one or two
    mon = attach(model, prometheus_port=port, summary_seconds=0.0, publish_seconds=0.0)
    scraped: dict = {}

    def scrape():  # while training runs
        for _ in range(200):
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                if "yolofeed_step_phase_seconds{" in text and mon.step >= 5:  # published at least once
                    scraped["text"] = text
                    return
            except OSError:
                pass
            time.sleep(0.1)

    t = threading.Thread(target=scrape)
    t.start()
    model.train(data=str(synth_root / "data.yaml"), epochs=2, imgsz=64, batch=4, device="cpu", workers=0,
                project=str(tmp_path), name="mon", plots=False, verbose=False)
    t.join()
    assert "text" in scraped, "the Prometheus endpoint never served the metrics"
    names = {line.split("{")[0].split(" ")[0] for line in scraped["text"].splitlines() if line.startswith("yolofeed")}
    assert {"yolofeed_step_phase_seconds", "yolofeed_images_per_second", "yolofeed_data_wait_fraction",
            "yolofeed_cpu_cores_busy", "yolofeed_low_utilization_alert"} <= names
    s = mon.timer.summary()
    assert s.steps > 0 and all(s.ms[p] >= 0 for p in s.ms) and s.ms["forward"] > 0 and s.ms["backward"] > 0
    assert list((tmp_path / "mon" / "yolofeed_tb").glob("events.out.tfevents.*"))
    with pytest.raises(OSError):  # the endpoint is closed with the run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1)


def test_summary_line_reads_well():
    v = {"images_per_s": 1234.5, "data_wait_fraction": 0.1, "gpu_util": 91.0, "cpu_cores_busy": 1.2,
         "ms_data_wait": 5, "ms_preprocess": 5, "ms_forward": 20, "ms_loss": 10, "ms_backward": 50, "ms_optimizer": 10}
    line = TrainingMonitor.line(v)
    assert "1,234 img/s" in line and "GPU 91%" in line and "backward 50%" in line and "CPU 1.2 cores" in line
