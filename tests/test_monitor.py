"""Live monitoring: the alert (fake clock), the Prometheus names, ports and addresses, the train keys, the summary
line beside the progress bar, TensorBoard as an option, and a monitored CPU run."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import FakeClock
from yolofeed.monitor import LowUtilAlert, MonitorConfig, StepClock
from yolofeed.monitor.live import TrainingMonitor
from yolofeed.monitor.system import SystemStats


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


def test_step_clock_splits_the_step_into_phases_on_a_fake_clock():
    c = FakeClock()
    p = StepClock(cuda=False, clock=c)
    p.step_done(8)  # the first step only starts the clock
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


class FakeSampler:
    """The system sampler's interface with made-up readings: a machine with or without an NVIDIA GPU."""

    def __init__(self, gpu: bool, samples: int = 5):
        self.gpu, self.samples = gpu, samples

    def recent(self, seconds: float) -> SystemStats:
        g = self.gpu
        return SystemStats(samples=self.samples, gpu_util=35.0 if g else None, gpu_mem_gb=2.5 if g else None,
                           cpu_cores_busy=1.5, disk_read_mb_s=3.0, own_cores_busy=1.25, iowait=0.02, cores=2,
                           gpu_clock_mhz=1980.0 if g else None, gpu_power_w=310.0 if g else None, ram_used_gb=3.0,
                           swap_used_gb=0.5)

    def start(self, device=None):
        return self

    def stop(self):
        return self.recent(0)


def _monitored(tmp_path, gpu: bool, steps: int = 4, device: str | None = None,
               **cfg) -> tuple[TrainingMonitor, FakeClock]:
    """A monitor over ``steps`` hand-made steps (0.1 s data wait, 0.3 s compute, batch 4), published once; its run
    on ``device`` (by default cuda:0 with a GPU, else the CPU)."""
    clock = FakeClock()
    mon = TrainingMonitor(MonitorConfig(**{"prometheus_port": 0, "tensorboard": False, **cfg}), clock=clock,
                          sampler=FakeSampler(gpu))
    mon.timer = StepClock(cuda=False, clock=clock)
    mon.open(tmp_path / "train3", device or ("cuda:0" if gpu else "cpu"))
    mon.timer.step_done(4)  # opens the clock
    for _ in range(steps):
        clock.t += 0.1
        mon.timer.batch_ready()
        for phase in ("forward", "loss", "backward", "optimizer"):
            clock.t += 0.05
            mon.timer.mark(phase)
        clock.t += 0.1
        mon.timer.step_done(4)
    mon.publish()
    return mon, clock


def _scrape(url: str) -> dict[str, list]:
    """Sample name -> [(labels, value)] from a /metrics page, parsed by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@pytest.fixture()
def said():
    """Messages the Ultralytics LOGGER emits during the test (it does not propagate to pytest's caplog)."""
    import logging

    from ultralytics.utils import LOGGER

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.messages: list[str] = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    keep = Keep()
    LOGGER.addHandler(keep)
    yield keep.messages
    LOGGER.removeHandler(keep)


def test_prometheus_names_units_and_the_run_label(tmp_path):
    mon, _ = _monitored(tmp_path, gpu=True)
    try:
        m = _scrape(mon.endpoint.url)
    finally:
        mon.close()
    yf = {k: v for k, v in m.items() if k.startswith("yolofeed_")}
    assert all(labels.get("run") == "train3" for series in yf.values() for labels, _ in series)
    assert not any("job" in labels for series in yf.values() for labels, _ in series)  # Prometheus sets job
    # counters end in _total, and hold the whole run's sums
    assert m["yolofeed_steps_total"][0][1] == 4 and m["yolofeed_images_total"][0][1] == 16
    assert m["yolofeed_data_wait_seconds_total"][0][1] == pytest.approx(0.4)
    phases = {labels["phase"]: v for labels, v in m["yolofeed_step_phase_seconds_total"]}
    assert phases["data_wait"] == pytest.approx(0.4) and phases["forward"] == pytest.approx(0.2)
    assert sum(phases.values()) == pytest.approx(4 * 0.4)  # the phases add up to the steps' wall time
    assert m["yolofeed_alerts_total"][0][1] == 0
    # ratios are shares of 0-1, units are base units
    assert m["yolofeed_data_wait_ratio"][0][1] == pytest.approx(0.25)
    assert m["yolofeed_gpu_utilization_ratio"][0][1] == pytest.approx(0.35)
    assert m["yolofeed_cpu_iowait_ratio"][0][1] == pytest.approx(0.02)
    assert m["yolofeed_gpu_memory_used_bytes"][0][1] == pytest.approx(2.5e9)
    assert m["yolofeed_gpu_sm_clock_hertz"][0][1] == pytest.approx(1.98e9)
    assert m["yolofeed_gpu_power_watts"][0][1] == pytest.approx(310)
    assert m["yolofeed_memory_used_bytes"][0][1] == pytest.approx(3e9)
    assert m["yolofeed_swap_used_bytes"][0][1] == pytest.approx(0.5e9)
    assert m["yolofeed_disk_read_bytes_total"][0][1] >= 0
    assert m["yolofeed_images_per_second"][0][1] == pytest.approx(10.0)
    assert m["yolofeed_run_info"][0][0]["device"] == "cuda:0"
    counters = {k for k in yf if k.endswith("_total")}
    assert counters == {"yolofeed_steps_total", "yolofeed_images_total", "yolofeed_data_wait_seconds_total",
                        "yolofeed_step_phase_seconds_total", "yolofeed_alerts_total", "yolofeed_disk_read_bytes_total"}
    assert not any(k.endswith(("_percent", "_fraction")) for k in yf)


def test_no_gpu_series_without_a_gpu(tmp_path):
    """A CPU run must not show a GPU at 0 % in Grafana: its GPU series are absent, not zero."""
    mon, _ = _monitored(tmp_path, gpu=False)
    try:
        m = _scrape(mon.endpoint.url)
    finally:
        mon.close()
    assert "yolofeed_steps_total" in m and "yolofeed_cpu_cores_busy" in m
    assert not [k for k in m if k.startswith("yolofeed_gpu_")]


@pytest.mark.parametrize("gpu, device, words", [
    (False, "cpu", "(a run on cpu)"),
    (False, "mps", "(a run on mps)"),
    (False, "cuda:0", "(NVML reads none for this GPU)"),
    (True, "cuda:0", None),
])
def test_a_run_without_gpu_utilisation_is_told_once_that_the_alert_cannot_fire(tmp_path, said, gpu, device, words):
    """A monitored CPU run (or a GPU that NVML does not read) never alerts: one line says so, rather than silence."""
    mon, clock = _monitored(tmp_path, gpu=gpu, device=device)
    for _ in range(3):
        clock.t += 2
        mon.publish()
    lines = [m for m in said if "alert cannot fire" in m]
    if words is None:
        assert lines == []
    else:
        assert lines == [f"yolofeed monitor: no GPU utilisation to read {words}: the low-utilisation alert cannot "
                         "fire; the step breakdown and Prometheus go on"]
    mon.close()


@pytest.mark.parametrize("port, tensorboard, going", [
    (None, False, "the step breakdown goes on"),
    (0, False, "the step breakdown and Prometheus go on"),
    (None, True, "the step breakdown and TensorBoard go on"),
    (0, True, "the step breakdown, Prometheus and TensorBoard go on"),
])
def test_the_line_on_a_run_without_utilisation_names_only_the_outputs_that_run(tmp_path, said, port, tensorboard,
                                                                             going):
    """The line said where no GPU utilisation can be read names what goes on: the endpoint and TensorBoard only where
    they were asked for and opened (it named both whatever was asked)."""
    if tensorboard:
        pytest.importorskip("torch.utils.tensorboard")
    mon, clock = _monitored(tmp_path, gpu=False, prometheus_port=port, tensorboard=tensorboard)
    clock.t += 2
    mon.publish()
    mon.close()
    assert [m.split("fire; ")[1] for m in said if "alert cannot fire" in m] == [going]


def test_the_counters_only_grow_and_the_alert_is_counted(tmp_path):
    mon, clock = _monitored(tmp_path, gpu=True, alert_util=60, alert_wait=0.1, alert_seconds=2, publish_seconds=0)
    try:
        before = _scrape(mon.endpoint.url)
        for _ in range(3):  # the fake GPU is 35 % busy and a quarter of each step waits: starved, held 2 s
            clock.t += 1.5
            mon.timer.batch_ready()
            clock.t += 0.1
            mon.timer.step_done(4)
            mon.publish()
        after = _scrape(mon.endpoint.url)
    finally:
        mon.close()
    for name in ("yolofeed_steps_total", "yolofeed_images_total", "yolofeed_data_wait_seconds_total"):
        assert after[name][0][1] > before[name][0][1]
    assert after["yolofeed_alerts_total"][0][1] == 1 and after["yolofeed_low_utilization_alert"][0][1] == 1


def test_a_port_in_use_moves_to_the_next_free_one(tmp_path, said):
    """A taken prometheus_port once aborted the run with OSError Errno 98; now the endpoint moves and says where."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        mon, _ = _monitored(tmp_path, gpu=False, prometheus_port=port)
        try:
            assert mon.endpoint is not None and mon.endpoint.port != port
            assert any(f"port {port} is in use" in m and str(mon.endpoint.port) in m for m in said)
            assert _scrape(mon.endpoint.url)["yolofeed_steps_total"][0][1] == 4
        finally:
            mon.close()


def test_no_port_to_be_had_warns_and_goes_on(said):
    import logging

    from yolofeed.monitor.exporter import Collector, serve

    log = logging.getLogger("test-exporter")
    seen = []
    log.addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: seen.append(r.getMessage())})())
    collector = Collector("r", dict)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve(collector, "127.0.0.1", port, log, tries=1) is None
    assert "in use" in seen[-1].lower() and "training goes on" in seen[-1]
    assert serve(collector, "192.0.2.1", 0, log) is None  # TEST-NET-1: an address this machine does not have
    assert "training goes on" in seen[-1]
    assert serve(collector, "192.0.2.1", 9600, log) is None  # one port tried, one named (was "9600-9609")
    assert "on 192.0.2.1:9600 (" in seen[-1] and "prometheus_addr=192.0.2.1 is not an address" in seen[-1]


def test_the_endpoint_binds_the_address_asked_for(tmp_path):
    mon, _ = _monitored(tmp_path, gpu=False)
    try:
        assert mon.endpoint.server.server_address[0] == "127.0.0.1"  # the safe default: this machine only
    finally:
        mon.close()
    mon, _ = _monitored(tmp_path, gpu=False, prometheus_addr="0.0.0.0")
    try:
        assert mon.endpoint.server.server_address[0] == "0.0.0.0"  # every interface: another host may scrape
        url = f"http://127.0.0.1:{mon.endpoint.port}/metrics"
        assert _scrape(url)["yolofeed_steps_total"][0][1] == 4
    finally:
        mon.close()


def test_an_endpoint_other_machines_can_reach_is_said_once_with_how_to_keep_it_local(tmp_path, said):
    """prometheus_addr=0.0.0.0 served every interface without a word, and the endpoint has no authentication and
    names the run's folder."""
    from yolofeed.monitor.exporter import exposure

    mon, _ = _monitored(tmp_path, gpu=False, prometheus_addr="0.0.0.0")
    try:
        for _ in range(3):
            mon.publish()
        warned = [m for m in said if "without authentication" in m]
        assert len(warned) == 1, said
        assert f"serves http://0.0.0.0:{mon.endpoint.port}/metrics on every network interface" in warned[0]
        assert str(tmp_path / "train3") in warned[0] and "use prometheus_addr=127.0.0.1" in warned[0]
    finally:
        mon.close()
    said.clear()
    mon, _ = _monitored(tmp_path, gpu=False)  # the default: this machine only, nothing to say
    mon.close()
    assert not [m for m in said if "without authentication" in m]
    assert [exposure(a) for a in ("127.0.0.1", "::1", "localhost", "127.0.0.2")] == [None] * 4
    assert exposure("::") == "on every network interface" and exposure("10.1.2.3") == "on 10.1.2.3"
    assert exposure("gpu-box.example") == "on gpu-box.example, as that name resolves"


def test_monitor_keys_reach_yolofeed_train():
    from yolofeed.cli import build_config
    from yolofeed.config import TrainConfig
    from yolofeed.errors import ConfigError
    from yolofeed.monitor.live import TRAIN_KEYS, options_from

    for k in TRAIN_KEYS:  # one default, two declarations: they must agree
        assert getattr(TrainConfig(model="m"), k) == getattr(MonitorConfig(), k), k
    base = ["model=yolo11n.yaml", "data=d.yaml"]
    assert options_from(build_config("train", base)) is None  # off by default
    assert options_from(build_config("train", base + ["tensorboard=False"])) is None  # asks for less: still off
    on = options_from(build_config("train", base + ["monitor=True"]))
    assert on == {k: getattr(MonitorConfig(), k) for k in TRAIN_KEYS}
    opts = options_from(build_config("train", base + ["alert_util=45", "alert_wait=0.3", "alert_seconds=10",
                                                      "summary_seconds=5", "tensorboard=False"]))
    assert opts["alert_util"] == 45 and opts["alert_wait"] == 0.3 and opts["alert_seconds"] == 10
    assert opts["summary_seconds"] == 5 and opts["tensorboard"] is False
    opts = options_from(build_config("train", base + ["prometheus_port=9400", "prometheus_addr=0.0.0.0"]))
    assert opts["prometheus_port"] == 9400 and opts["prometheus_addr"] == "0.0.0.0"
    with pytest.raises(ConfigError, match="prometheus_port="):
        options_from(build_config("train", base + ["prometheus_addr=0.0.0.0"]))
    for bad in ("alert_wait=1.5", "alert_util=-1", "prometheus_port=70000", "summary_seconds=-2"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            options_from(build_config("train", base + ["monitor=True", bad]))


@pytest.mark.parametrize("resumed", [False, True])
def test_monitor_false_with_a_key_that_asks_for_the_monitor_is_refused(resumed):
    """``yolofeed train monitor=False prometheus_port=0`` served the endpoint anyway (the port turned the monitor on
    and the explicit False lost without a word; on resume the False won, as silently): refused in one line naming both.
    ``monitor=False tensorboard=False`` asks for less, and is taken."""
    from yolofeed.cli import build_config
    from yolofeed.errors import ConfigError
    from yolofeed.train.run import given_keys, monitor_options

    recorded = {"monitor": {"prometheus_port": 9400}} if resumed else None
    for asked, named in ((["prometheus_port=0"], "prometheus_port=0"),
                         (["alert_util=50", "summary_seconds=5"], "alert_util=50.0, summary_seconds=5.0")):
        cfg = build_config("train", ["model=yolo11n.yaml", "data=d.yaml", "monitor=False", *asked])
        with pytest.raises(ConfigError, match=f"monitor=False and {named} ask for opposite things: drop "
                                              "monitor=False to run the monitor with"):
            monitor_options(cfg, given_keys(cfg), recorded)
    for less in (["tensorboard=False"], ["prometheus_port=None"], ["alert_util=60"]):  # at their defaults: no ask
        cfg = build_config("train", ["model=yolo11n.yaml", "data=d.yaml", "monitor=False", *less])
        assert monitor_options(cfg, given_keys(cfg), recorded) is None, less


def test_a_monitor_switch_that_is_not_a_bool_is_refused():
    """A config made in Python with ``monitor="False"`` turned the monitor on (a non-empty string is true)."""
    from yolofeed.config import TrainConfig
    from yolofeed.errors import ConfigError
    from yolofeed.train.run import given_keys, monitor_options

    cfg = TrainConfig(model="yolo11n.yaml", data="d.yaml", monitor="False")
    with pytest.raises(ConfigError, match="monitor='False': expected True or False"):
        monitor_options(cfg, given_keys(cfg), None)


def test_yolofeed_train_attaches_the_monitor_with_its_keys(synth_root, monkeypatch):
    """The wiring in train/run.py: the keys arrive in attach(), before training starts."""
    import ultralytics.engine.model

    import yolofeed.monitor.live as live
    from yolofeed.cli import build_config
    from yolofeed.train.run import run

    got = {}

    class Stop(Exception):
        pass

    def train(self, **kwargs):
        raise Stop

    monkeypatch.setattr(live, "attach", lambda target, **cfg: got.update(cfg))
    monkeypatch.setattr(ultralytics.engine.model.Model, "train", train)
    cfg = build_config("train", ["model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}", "alert_util=40",
                                 "summary_seconds=10"])
    with pytest.raises(Stop):
        run(cfg)
    assert got["alert_util"] == 40 and got["summary_seconds"] == 10 and got["prometheus_port"] is None


def test_the_summary_line_starts_a_line_of_its_own(monkeypatch):
    """Ultralytics' bar redraws with a carriage return and no newline: a line logged during a step must not be
    glued onto the bar's text."""
    import io
    import logging

    import ultralytics.utils.tqdm as utqdm
    from ultralytics.utils import LOGGER
    from ultralytics.utils.tqdm import TQDM

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(utqdm, "is_noninteractive_console", lambda: False)
    handler = next(h for h in LOGGER.handlers if isinstance(h, logging.StreamHandler))
    old = handler.setStream(out)  # the logger and the bar share one stream here, as in a terminal
    try:
        bar = TQDM(total=10, desc="1/2", mininterval=0)
        bar.update(3)
        TrainingMonitor._say("yolofeed: 1,234 img/s | summary", logging.INFO, bar=True)
        bar.update(3)
        bar.close()
    finally:
        handler.setStream(old)
    lines = out.getvalue().split("\n")
    assert "yolofeed: 1,234 img/s | summary" in lines, lines
    assert any("1/2" in line for line in lines[lines.index("yolofeed: 1,234 img/s | summary") + 1:])  # bar goes on


def test_a_run_shorter_than_the_summary_interval_says_its_one_line_at_its_end(synth_root, tmp_path, caplog):
    """attach() on a stock run of a few seconds: one summary line as it ends, where none came (found by a first-hour
    tester: the default 30 s interval said nothing for a short run)."""
    import logging

    from ultralytics import YOLO

    from yolofeed.monitor import attach

    model = YOLO("yolo11n.yaml")
    attach(model, summary_seconds=3600.0, prometheus_port=None)
    with caplog.at_level(logging.INFO):
        model.train(data=str(synth_root / "data.yaml"), epochs=1, imgsz=64, batch=8, device="cpu", workers=0,
                    plots=False, val=False, verbose=False, project=str(tmp_path), name="short", exist_ok=True)
    said = [r.getMessage() for r in caplog.records if " img/s | " in r.getMessage()]
    assert len(said) == 1 and "no GPU" in said[0], said


def test_tensorboard_is_optional(tmp_path, monkeypatch, said):
    """Without the tensorboard package the monitor runs and says once what is missing (and every module of yolofeed
    imports without it: tests/test_imports.py)."""
    import yolofeed.monitor.live as live

    for name in ("tensorboard", "torch.utils.tensorboard"):  # as if not installed: importing it raises ImportError
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(live, "_SAID", set())  # a fresh process: nothing said yet
    assert live.open_tensorboard(tmp_path / "a") is None and live.open_tensorboard(tmp_path / "b") is None
    missing = [m for m in said if "tensorboard package is missing" in m]
    assert len(missing) == 1 and "pip install tensorboard" in missing[0]


# a child's code (pytest has its own threading.excepthook): a thread that fails as a TensorBoard writer's does
FAILING_THREAD = """if True:
        import errno, threading
        from yolofeed.monitor import live
        class Failing(threading.Thread):
            def __init__(self, words):
                super().__init__()
                self.words = words
            def run(self):
                raise OSError(errno.ENOSPC, self.words)
"""


def test_a_broken_tensorboard_install_stops_tensorboard_alone(tmp_path, monkeypatch, said):
    """tensorboard installed but failing to import (a protobuf it does not match raises TypeError): one line, and
    Prometheus goes on. Was the whole monitor switched off, Prometheus with it, under a "please report this" traceback
    (found by a hostile pass)."""
    import types
    from types import SimpleNamespace

    import yolofeed.monitor.live as live

    broken = types.ModuleType("torch.utils.tensorboard")

    def fail(name):
        raise TypeError("Descriptors cannot be created directly.")

    broken.__getattr__ = fail
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", broken)
    monkeypatch.setattr(live, "_SAID", set())
    mon = TrainingMonitor(MonitorConfig(prometheus_port=0, tensorboard=True), sampler=FakeSampler(False))
    trainer = SimpleNamespace(device=SimpleNamespace(type="cpu"), save_dir=str(tmp_path / "run"))
    monkeypatch.setattr("yolofeed.monitor.live.mark_phases", lambda trainer, mark: lambda: None)
    callbacks = mon.callbacks()
    callbacks["on_train_start"](trainer)
    assert not mon.failed and mon.writer is None and "yolofeed_steps_total" in _scrape(mon.endpoint.url)
    lines = [m for m in said if "TensorBoard" in m or "switched off" in m]
    assert len(lines) == 1 and "the tensorboard package does not import (TypeError: Descriptors" in lines[0], lines
    callbacks["on_train_end"](trainer)


def test_a_writer_thread_that_fails_at_once_prints_no_traceback():
    """A read-only or full TensorBoard folder: the writer's thread fails on its first write, before the monitor could
    list it as its own, and Python printed its traceback beside the monitor's one line (found by a hostile pass).
    A tensorboard thread begun outside the monitor's making of a writer still prints its own."""
    import subprocess

    code = FAILING_THREAD + """
        import pathlib, sys, types
        Failing.__module__ = "tensorboard.summary.writer.event_file_writer"
        class Writer:
            def __init__(self, folder):
                thread = Failing("the writer thread's own")
                thread.start()
                thread.join()  # ended before SummaryWriter returns
                raise OSError(errno.EROFS, "Read-only file system")
        fake = types.ModuleType("torch.utils.tensorboard")
        fake.SummaryWriter = Writer
        sys.modules["torch.utils.tensorboard"] = fake
        assert live.open_tensorboard(pathlib.Path("unused")) is None
        outside = Failing("outside any writer's making")
        outside.start()
        outside.join()
        """
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stderr
    assert "outside any writer's making" in err and "the writer thread's own" not in err, err


@pytest.mark.parametrize("target", ["gone", "file", "loop", "folder"])
def test_a_link_at_the_tensorboard_folder_is_said_to_be_one(tmp_path, said, target):
    """A link planted at ``yolofeed_tb`` to nothing (or to a file) was said as "could not write ... (File exists)";
    one to a folder elsewhere was written through (an events file added there; found by an adversarial tester). The
    line now says it is a link, and to what; nothing is written through it. TensorBoard alone stops, as for any folder
    it cannot write."""
    pytest.importorskip("torch.utils.tensorboard")
    from yolofeed.monitor.live import open_tensorboard

    aim = tmp_path / target
    if target == "file":
        aim.write_text("not a folder")
    if target == "folder":
        aim.mkdir()
    if target == "loop":
        aim.symlink_to(tmp_path / "yolofeed_tb")
    (tmp_path / "yolofeed_tb").symlink_to(aim)
    assert open_tensorboard(tmp_path / "yolofeed_tb") is None
    lines = [m for m in said if "no TensorBoard scalars" in m]
    end = {"file": "a regular file", "gone": "which does not exist", "loop": "a link loop",
           "folder": "a folder"}[target]
    assert len(lines) == 1 and f"could not write {tmp_path / 'yolofeed_tb'} (it is a symbolic link to {aim} ({end}))" \
        in lines[0]
    assert (list(aim.iterdir()) == [] if target == "folder" else not aim.is_dir())
    assert "the monitor's other outputs go on" in lines[0]


def test_a_tensorboard_folder_that_cannot_be_written_stops_tensorboard_alone(tmp_path, monkeypatch, said):
    """A file where the TensorBoard folder goes (a read-only disk, or one that fills, alike): one line, and
    Prometheus and the summary line go on. Was the whole monitor switched off with a "please report this"
    traceback, the endpoint it had just opened closed."""
    import errno
    import subprocess
    from types import SimpleNamespace

    run = tmp_path / "run"
    run.mkdir()
    (run / "yolofeed_tb").write_text("not a folder")
    mon = TrainingMonitor(MonitorConfig(prometheus_port=0, tensorboard=True, publish_seconds=0.0),
                          sampler=FakeSampler(False))
    trainer = SimpleNamespace(device=SimpleNamespace(type="cpu"), save_dir=str(run))
    monkeypatch.setattr("yolofeed.monitor.live.mark_phases", lambda trainer, mark: lambda: None)
    callbacks = mon.callbacks()
    callbacks["on_train_start"](trainer)
    assert not mon.failed and mon.writer is None and mon.endpoint is not None
    assert "yolofeed_steps_total" in _scrape(mon.endpoint.url)
    lines = [m for m in said if ("TensorBoard" in m or "switched off" in m) and "alert cannot fire" not in m]
    assert len(lines) == 1 and "no TensorBoard scalars" in lines[0] and str(run / "yolofeed_tb") in lines[0], lines
    assert "tensorboard=False" in lines[0] and "please report" not in lines[0]
    callbacks["on_train_end"](trainer)

    # the disk fills mid-run: the writer's next call raises what its thread met
    said.clear()
    mon = TrainingMonitor(MonitorConfig(prometheus_port=0, tensorboard=True), sampler=FakeSampler(False))
    mon.timer = StepClock(cuda=False)
    mon.open(tmp_path / "full", "cpu")
    writer = mon.writer

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer, "add_scalar", full)
    monkeypatch.setattr(writer, "close", full)
    mon.publish()
    mon.publish()
    assert mon.writer is None and mon.endpoint is not None and "yolofeed_steps_total" in _scrape(mon.endpoint.url)
    lines = [m for m in said if ("TensorBoard" in m or "switched off" in m) and "alert cannot fire" not in m]
    assert len(lines) == 1 and "TensorBoard scalars stopped" in lines[0] and "No space left" in lines[0], lines
    mon.close()
    assert mon.endpoint is None

    # the monitor's writer's thread's own traceback of that error is left out; another thread's is not, nor that of a
    # writer the monitor did not make (in a process of its own: pytest has its own threading.excepthook)
    code = FAILING_THREAD + """
        ours = Failing("No space left on device")
        live._quiet({ours})
        for thread in (ours, Failing("another thread's")):
            thread.start()
            thread.join()
        """
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stderr
    assert "another thread's" in err and "No space left on device" not in err, err


@pytest.mark.slow
def test_monitored_stock_run_survives_a_taken_port_and_serves_prometheus(synth_root, tmp_path, monkeypatch):
    """A real (stock Ultralytics, CPU) run: the port asked for is taken, so the endpoint moves to the next one; the
    run completes, the endpoint serves while it trains, TensorBoard gets scalars, and every summary line stands on
    a line of its own between the progress bar's redraws."""
    import io
    import logging

    from ultralytics import YOLO
    from ultralytics.utils import LOGGER

    from yolofeed.monitor import attach

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    model = YOLO("yolo11n.yaml")
    # publish every step: a run of a few seconds gives the scraper many chances, not one or two
    mon = attach(model, prometheus_port=port, summary_seconds=0.0, publish_seconds=0.0)
    scraped: dict = {}

    def scrape():  # while training runs
        for _ in range(300):
            try:
                if mon.endpoint is not None and mon.step >= 5:  # published at least once
                    scraped["metrics"] = _scrape(mon.endpoint.url)
                    scraped["url"] = mon.endpoint.url
                    return
            except OSError:
                pass
            time.sleep(0.1)

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)  # the progress bar's stream ...
    handler = next(h for h in LOGGER.handlers if isinstance(h, logging.StreamHandler))
    old = handler.setStream(out)  # ... and the logger's, one stream as in a terminal
    t = threading.Thread(target=scrape)
    t.start()
    try:
        model.train(data=str(synth_root / "data.yaml"), epochs=2, imgsz=64, batch=4, device="cpu", workers=0,
                    project=str(tmp_path), name="mon", plots=False, verbose=False)
    finally:
        handler.setStream(old)
        t.join()
        taken.close()
    assert "metrics" in scraped, "the Prometheus endpoint never served the metrics"
    assert f":{port}/" not in scraped["url"]  # moved off the taken port
    m = scraped["metrics"]
    assert m["yolofeed_steps_total"][0][1] >= 5 and m["yolofeed_images_total"][0][1] >= 20
    assert m["yolofeed_run_info"][0][0]["run"] == "mon"
    s = mon.timer.summary()
    assert s.steps > 0 and all(s.ms[p] >= 0 for p in s.ms) and s.ms["forward"] > 0 and s.ms["backward"] > 0
    assert list((tmp_path / "mon" / "yolofeed_tb").glob("events.out.tfevents.*"))
    with pytest.raises(OSError):  # the endpoint is closed with the run
        urllib.request.urlopen(scraped["url"], timeout=1)
    text = out.getvalue()
    summaries = [line for line in text.split("\n") if "img/s |" in line]
    assert summaries and all(line.startswith("yolofeed: ") for line in summaries), summaries[:3]


def test_summary_line_reads_well():
    v = {"images_per_s": 1234.5, "data_wait_fraction": 0.1, "gpu_util": 91.0, "cpu_cores_busy": 1.2,
         "ms_data_wait": 5, "ms_preprocess": 5, "ms_forward": 20, "ms_loss": 10, "ms_backward": 50, "ms_optimizer": 10}
    line = TrainingMonitor.line(v)
    assert "1,234 img/s" in line and "GPU 91%" in line and "backward 50%" in line and "CPU 1.2 cores" in line


MONITORING = Path(__file__).resolve().parents[1] / "monitoring"


def _queries(node) -> list[str]:
    """Every PromQL query in a Grafana dashboard: panel targets' ``expr`` and template variables' queries."""
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "definition") and isinstance(v, str):
                found.append(v)
            elif k == "query" and isinstance(v, dict) and isinstance(v.get("query"), str):
                found.append(v["query"])
            else:
                found += _queries(v)
    elif isinstance(node, list):
        for v in node:
            found += _queries(v)
    return found


def test_every_dashboard_query_names_a_metric_the_exporter_serves(tmp_path):
    """The Grafana dashboard against a real scrape of the exporter (with a GPU, so every series is there): a renamed
    or dropped metric leaves an empty panel in Grafana without any error, so it has to fail here."""
    import re

    dash = json.loads((MONITORING / "grafana" / "yolofeed.json").read_text())
    mon, _ = _monitored(tmp_path, gpu=True)
    try:
        served = set(_scrape(mon.endpoint.url))
    finally:
        mon.close()
    queries = _queries(dash)
    named = {n for q in queries for n in re.findall(r"\byolofeed_[a-z0-9_]+", q)}
    assert named and named <= served, f"not exported: {sorted(named - served)}"
    exported = {n for n in served if n.startswith("yolofeed_")}
    assert exported <= named, f"exported but on no panel: {sorted(exported - named)}"
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert re.search(r"\byolofeed_", t["expr"]) and t["expr"].count("(") == t["expr"].count(")")
            assert '{run=~"$run"}' in t["expr"], (panel["title"], t["expr"])  # the run picker filters each query
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "run"}


def test_the_compose_example_mounts_files_that_exist():
    import yaml

    compose = yaml.safe_load((MONITORING / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            assert (MONITORING / host).exists(), f"{name} mounts {host}, which is not in monitoring/"
    prom = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "yolofeed")
    assert "127.0.0.1:9400" in job["static_configs"][0]["targets"]
    ds = yaml.safe_load((MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"


def test_a_step_counts_the_images_its_batch_holds():
    """A short last batch, and a dataset smaller than the batch, count the images they hold (stock's trainer: what
    its ordered batch sampler hands each step), not ``batch_size``; yolofeed's trainer counts its own."""
    from types import SimpleNamespace

    from yolofeed.monitor.steps import images_in_step

    def trainer(n, batch, **kw):
        return SimpleNamespace(batch_size=batch, train_loader=SimpleNamespace(dataset=range(n)), **kw)

    assert [images_in_step(trainer(64, 48), k) for k in range(2)] == [48, 16]
    assert images_in_step(trainer(64, 200), 0) == 64
    assert [images_in_step(trainer(96, 48), k) for k in range(2)] == [48, 48]
    assert images_in_step(trainer(64, 48, batch_images=7), 0) == 7
    assert images_in_step(SimpleNamespace(batch_size=16, train_loader=None), 3) == 16  # no dataset to read


def _probes():
    import psutil

    return [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE
            and any("probe.py" in part for part in p.cmdline())]


@pytest.mark.parametrize("side", [pytest.param("yolofeed", marks=pytest.mark.slow), "stock"])
def test_a_run_that_raises_leaves_no_probe_no_port_and_no_open_writer(synth_root, tmp_path, side):
    """A run stopped by an exception has no on_train_end, where the monitor closes: yolofeed's trainer closes it as
    the run stops; on a stock run, ``attach`` has the model's train close it as the exception leaves it (what the run
    raised is raised as it was). Was: the probe process sampling on and the Prometheus port bound, in an interpreter
    that goes on (a notebook), one more each run (found by a test-order check; the stock side by a hostile pass)."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer
    from yolofeed.monitor import attach
    from yolofeed.monitor.live import monitors

    before = {p.pid for p in _probes()}

    def fail(trainer):
        raise RuntimeError("a callback failed")

    model = YOLO("yolo11n.yaml")
    monitor = {"prometheus_port": 0, "tensorboard": True}
    if side == "stock":
        mon, trainer = attach(model, **monitor), None
        attach(model, prometheus_port=None)  # attached twice: train is wrapped once
        assert not getattr(model.train.__wrapped__, "yolofeed_closes_monitors", False)
    else:
        trainer = FastDetectionTrainer.with_options(monitor=monitor)
    model.add_callback("on_model_save", fail)
    with pytest.raises(RuntimeError, match="a callback failed"):
        model.train(trainer=trainer, data=str(synth_root / "data.yaml"), epochs=2, imgsz=64, batch=8, device="cpu",
                    workers=0, plots=False, verbose=False, project=str(tmp_path), name="failed")
    if side == "yolofeed":
        (mon,) = monitors(model.trainer.callbacks)
    assert mon.endpoint is None and mon.writer is None and mon.sampler._proc is None
    assert {p.pid for p in _probes()} <= before


def test_attached_again_the_newest_monitor_replaces_the_one_before(caplog):
    """A second ``attach`` on one model: the first monitor is closed and its callbacks go, so only the second starts
    with the run (found by a first-hour tester: two monitors, and 'port 9480 is in use' about its own first one)."""
    import logging

    from ultralytics import YOLO

    from yolofeed.monitor import attach
    from yolofeed.monitor.live import monitors

    model = YOLO("yolo11n.yaml")
    first = attach(model, prometheus_port=9480)
    with caplog.at_level(logging.INFO):
        second = attach(model, prometheus_port=9480)
    assert monitors(model.callbacks) == [second] and first is not second
    for event in ("on_train_start", "on_train_batch_end", "on_train_end"):  # one monitor's callback an event
        assert sum(getattr(getattr(fn, "__wrapped__", None), "__self__", None) is not None
                   for fn in model.callbacks[event]) == 1, event
    assert "it replaces the monitor attached before" in caplog.text


def test_the_probe_says_nothing_where_the_training_it_samples_is_gone():
    """A kill -9 of the training while the probe lists its children: psutil.NoSuchProcess, which the probe printed
    as a traceback before it exited (found by a hostile pass); and a probe begun after the training ended."""
    import subprocess

    import psutil

    from yolofeed.monitor import probe

    tree = probe._Tree(psutil.Process().pid)

    class Gone:
        pid = -1

        def children(self, recursive=False):
            raise psutil.NoSuchProcess(-1)

        def cpu_times(self):
            raise psutil.NoSuchProcess(-1)

    tree.root = Gone()
    assert tree.cpu(time.perf_counter()) == 0.0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    r = subprocess.run([sys.executable, probe.__file__, str(dead.pid), "0.1", "-"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_a_monitor_that_starts_again_closes_what_the_run_before_left_open(tmp_path):
    """A monitor attached to a model whose last run raised (stock's trainer: no on_train_end, nothing closed it):
    its next run's start closes the old endpoint and writer first, and binds the same port again."""
    from types import SimpleNamespace

    with socket.socket() as s:  # a port free now, asked for by number: the second start must get it again
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mon = TrainingMonitor(MonitorConfig(prometheus_port=port, tensorboard=True), sampler=FakeSampler(False))
    trainer = SimpleNamespace(device=SimpleNamespace(type="cpu"), save_dir=str(tmp_path / "run"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("yolofeed.monitor.live.mark_phases", lambda trainer, mark: lambda: None)
        mon.on_train_start(trainer)  # the run that raised: left open
        first, writer = mon.endpoint, mon.writer
        assert first is not None and first.port == port and writer is not None
        mon.on_train_start(trainer)  # the next run
    assert mon.endpoint is not first and mon.endpoint.port == port and mon.writer is not writer
    with pytest.raises(OSError):  # the old endpoint's server is shut: only the new one answers
        first.server.socket.getsockname()
    mon.close()
    assert mon.endpoint is None and mon.writer is None


def test_a_monitor_that_fails_to_close_one_output_closes_the_others(tmp_path):
    mon = TrainingMonitor(MonitorConfig(prometheus_port=0, tensorboard=False), sampler=FakeSampler(False))
    mon.timer = StepClock(cuda=False)
    mon.open(tmp_path / "run", "cpu")

    def broken():
        raise RuntimeError("the probe would not stop")

    mon.sampler.stop = broken
    endpoint = mon.endpoint
    with pytest.raises(RuntimeError, match="would not stop"):
        mon.close()
    assert mon.endpoint is None
    with pytest.raises(OSError):
        endpoint.server.socket.getsockname()


def test_numpy_numbers_are_numbers_and_a_port_is_a_whole_one():
    """``prometheus_port=np.int64(9400)`` (a port read from an array or a config library) was refused as "expected a
    number"; a port of 9400.5 or 9400.0 is refused as not a whole number (found by a hostile pass)."""
    import numpy as np

    from yolofeed.errors import ConfigError

    cfg = MonitorConfig(prometheus_port=np.int64(9400), alert_util=np.float32(20.0))
    assert cfg.prometheus_port == 9400 and type(cfg.prometheus_port) is int
    for port in (9400.0, 9400.5, "9400"):
        with pytest.raises(ConfigError, match=r"prometheus_port=.*: expected a whole number \(a TCP port"):
            MonitorConfig(prometheus_port=port)


@pytest.mark.parametrize("key, value, expected", [
    ("tensorboard", "False", "tensorboard='False': expected True or False"),
    ("tensorboard", 0, "tensorboard=0: expected True or False"),
    ("prometheus_addr", 123, "prometheus_addr=123: expected a string"),
    ("prometheus_addr", ["127.0.0.1"], r"prometheus_addr=\['127.0.0.1'\]: expected a string"),
])
def test_a_switch_or_an_address_of_the_wrong_kind_is_refused_when_given(key, value, expected):
    """``tensorboard="False"`` turned TensorBoard on (a non-empty string is true), and ``prometheus_addr=123`` was taken
    and then switched the whole monitor off with a traceback at the run's start (found by a hostile pass): each is
    refused in one line where it is given, by ``attach`` and by ``with_options`` alike."""
    from types import SimpleNamespace

    from yolofeed import FastDetectionTrainer
    from yolofeed.errors import ConfigError
    from yolofeed.monitor import attach

    with pytest.raises(ConfigError, match=expected):
        MonitorConfig(**{key: value, "prometheus_port": 0})
    target = SimpleNamespace(add_callback=lambda *a: pytest.fail("attached despite the value"))
    with pytest.raises(ConfigError, match=expected):
        attach(target, **{key: value, "prometheus_port": 0})
    with pytest.raises(ConfigError, match=expected):
        FastDetectionTrainer.with_options(monitor={key: value, "prometheus_port": 0})


def test_numpy_switches_are_switches():
    import numpy as np

    cfg = MonitorConfig(tensorboard=np.False_)
    assert cfg.tensorboard is False


def test_attach_names_the_monitors_options_for_one_it_does_not_know():
    """``attach(model, bogus=1)`` was a bare TypeError from the dataclass; now one line with the options."""
    from types import SimpleNamespace

    from yolofeed.errors import ConfigError
    from yolofeed.monitor import attach

    target = SimpleNamespace(add_callback=lambda *a: pytest.fail("attached despite the unknown key"))
    with pytest.raises(ConfigError, match=r"attach: 'bogus' is not an option of the monitor; its options are "
                                          r"prometheus_port, prometheus_addr, "):
        attach(target, bogus=1, prometheus_port=0)


def test_the_last_steps_are_published_before_the_monitor_closes(tmp_path, monkeypatch, capsys):
    """The steps after the last once-a-second publish reached neither TensorBoard nor Prometheus (a short run had
    one point a scalar): the run's end publishes once more, then closes. A TensorBoard failure said during a step
    stands on a line of its own, after the progress bar's (found by a hostile pass)."""
    import errno
    from types import SimpleNamespace

    mon = TrainingMonitor(MonitorConfig(prometheus_port=0, tensorboard=True), sampler=FakeSampler(False))
    mon.timer = StepClock(cuda=False)
    mon.open(tmp_path / "run", "cpu")
    order = []
    publish, close = mon.publish, mon.close
    monkeypatch.setattr(mon, "publish", lambda *a, **k: order.append("publish") or publish(*a, **k))
    monkeypatch.setattr(mon, "close", lambda: order.append("close") or close())
    mon.on_train_end(SimpleNamespace())
    assert order == ["publish", "close"] and mon.endpoint is None

    mon = TrainingMonitor(MonitorConfig(prometheus_port=None, tensorboard=True), sampler=FakeSampler(False))
    mon.timer = StepClock(cuda=False)
    mon.open(tmp_path / "run2", "cpu")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mon.writer, "add_scalar", full)
    monkeypatch.setattr(mon.writer, "close", full)
    monkeypatch.setattr("yolofeed.monitor.live.progress_bar_drawn", lambda: True)
    capsys.readouterr()
    mon.publish(bar=True)
    assert capsys.readouterr().out.startswith("\n") and mon.writer is None
    mon.close()
