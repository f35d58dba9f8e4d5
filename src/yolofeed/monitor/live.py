"""Live monitoring of any Ultralytics training run: step breakdown, GPU/CPU load, alert, Prometheus, TensorBoard.

``attach(model_or_trainer)`` adds callbacks to a stock ``YOLO(...)`` (before ``.train()``) or to a
trainer; ``yolofeed train monitor=True`` does it for you. All of it is a thin adapter: the numbers
come from ``StepClock`` and ``SystemSampler``, the decision from ``LowUtilAlert``, the Prometheus
names from ``exporter``. Monitoring never stops a run: a port in use, a missing tensorboard package, a
TensorBoard folder that cannot be written or an error inside the monitor is logged as a warning and training goes on.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from yolofeed.errors import ConfigError, describe
from yolofeed.monitor.exporter import Collector, Endpoint, exposed_warning, serve
from yolofeed.monitor.steps import PHASES, StepClock, images_in_step
from yolofeed.monitor.system import SystemSampler
from yolofeed.ultralytics_seam import LOGGER, mark_phases, progress_bar_drawn  # our lines go where Ultralytics' go


@dataclass(frozen=True)
class MonitorConfig:
    """What the live monitor publishes and when it alerts.

    Attributes:
        prometheus_port: serve metrics on ``prometheus_addr:<port>/metrics`` (None: off; 0: any free port;
            a port in use moves to the next free one).
        prometheus_addr: the address the endpoint binds. 127.0.0.1 (the default) lets only this machine
            scrape it: the endpoint has no authentication, and names the run's folder. 0.0.0.0 (or one of
            the host's addresses) lets a Prometheus server on another host scrape it.
        tensorboard: write scalars under ``<run>/yolofeed_tb`` (needs the tensorboard package; without it the
            monitor says so once and goes on).
        alert_util: GPU utilisation (%) under which, together with ``alert_wait``, the GPU counts as starved.
        alert_wait: share of step time waiting for data above which steps count as slow because of data.
        alert_seconds: how long both must hold before one alert is logged (once per episode).
        summary_seconds: how often the one-line summary is logged.
        publish_seconds: how often the Prometheus snapshot and TensorBoard scalars are updated (~1 ms each time).
    """

    prometheus_port: int | None = None
    prometheus_addr: str = "127.0.0.1"
    tensorboard: bool = True
    alert_util: float = 60.0
    alert_wait: float = 0.15
    alert_seconds: float = 30.0
    summary_seconds: float = 30.0
    publish_seconds: float = 1.0

    def __post_init__(self):
        def number(value: Any, kind: type = numbers.Real) -> bool:  # a string would fail the comparisons below;
            return isinstance(value, kind) and not isinstance(value, bool)  # numpy's scalars are numbers too

        port = self.prometheus_port
        if not (port is None or number(port, numbers.Integral)):
            raise ConfigError(f"prometheus_port={port!r}: expected a whole number (a TCP port, 0-65535), or None")
        if port is not None:
            object.__setattr__(self, "prometheus_port", int(port))  # frozen: a numpy integer made a plain one
            port = self.prometheus_port
        for name in ("alert_util", "alert_wait", "alert_seconds", "summary_seconds", "publish_seconds"):
            if not number(getattr(self, name)):
                raise ConfigError(f"{name}={getattr(self, name)!r}: expected a number")
        if not isinstance(self.tensorboard, (bool, np.bool_)):  # the string "False" would be True
            raise ConfigError(f"tensorboard={self.tensorboard!r}: expected True or False")
        object.__setattr__(self, "tensorboard", bool(self.tensorboard))  # frozen: numpy's made Python's
        if not isinstance(self.prometheus_addr, str):  # found at the bind, inside a callback: the monitor would go
            raise ConfigError(f"prometheus_addr={self.prometheus_addr!r}: expected a string, an address to bind, "
                              "e.g. '127.0.0.1' or '0.0.0.0'")
        for name, ok, expected in (
                ("prometheus_port", port is None or 0 <= port <= 65535, "a TCP port, 0-65535 (0: any free port)"),
                ("prometheus_addr", bool(self.prometheus_addr), "an address to bind, e.g. 127.0.0.1 or 0.0.0.0"),
                ("alert_util", 0 <= self.alert_util <= 100, "a GPU utilisation in %, 0-100"),
                ("alert_wait", 0 <= self.alert_wait <= 1, "a share of the step time, 0-1"),
                ("alert_seconds", self.alert_seconds >= 0, "seconds, >= 0"),
                ("summary_seconds", self.summary_seconds >= 0, "seconds, >= 0"),
                ("publish_seconds", self.publish_seconds >= 0, "seconds, >= 0")):
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)}: expected {expected}")


# the monitor's keys on 'yolofeed train' (config.TrainConfig declares them with MonitorConfig's defaults)
TRAIN_KEYS = ("prometheus_port", "prometheus_addr", "tensorboard", "alert_util", "alert_wait", "alert_seconds",
              "summary_seconds")


def options_from(cfg: Any) -> dict[str, Any] | None:
    """The monitor's options from ``yolofeed train``'s keys, or None when the monitor is off.

    ``monitor=True`` turns it on, and so does ``prometheus_port=`` or an alert or summary key set away
    from its default: a user who sets ``alert_util=50`` wants the alert, and ignoring the key silently
    would be worse. ``tensorboard=False`` alone asks for less, so it does not.

    Raises:
        ConfigError: ``prometheus_addr=`` without ``prometheus_port=`` (an address alone serves nothing).
    """
    given = {k: getattr(cfg, k) for k in TRAIN_KEYS}
    if given["prometheus_addr"] != MonitorConfig.prometheus_addr and given["prometheus_port"] is None:
        raise ConfigError(f"prometheus_addr={given['prometheus_addr']} needs a port: add prometheus_port=9400 "
                          "(or 0 for any free port)")
    if not cfg.monitor and not asking(cfg):
        return None
    MonitorConfig(**given)  # checks the values now, before the model is built
    return given


def asking(cfg: Any) -> list[str]:
    """The keys of ``yolofeed train``'s ``cfg`` that turn the monitor on: ``prometheus_port=`` or an alert or summary
    key set away from its default (``tensorboard=False`` asks for less, and an address serves only with a port)."""
    return [k for k in TRAIN_KEYS if k not in ("tensorboard", "prometheus_addr")
            and getattr(cfg, k) != getattr(MonitorConfig, k)]


class LowUtilAlert:
    """Fires once when the GPU stays starved for ``hold`` seconds; re-arms when it recovers."""

    def __init__(self, util: float, wait: float, hold: float, clock: Callable[[], float] = time.monotonic):
        self.util, self.wait, self.hold, self.clock = util, wait, hold, clock
        self._since: float | None = None
        self.active = False
        self.episodes = 0

    def update(self, gpu_util: float | None, wait_fraction: float) -> bool:
        """Returns True when a new episode starts (log it then)."""
        starved = gpu_util is not None and gpu_util < self.util and wait_fraction > self.wait
        now = self.clock()
        if not starved:
            self._since, self.active = None, False
            return False
        self._since = now if self._since is None else self._since
        if not self.active and now - self._since >= self.hold:
            self.active = True
            self.episodes += 1
            return True
        return False


_SAID: set[str] = set()  # what the monitor reported missing, once per process


def open_tensorboard(folder: Path) -> Any:
    """A TensorBoard ``SummaryWriter`` on ``folder``, or None (said once) when tensorboard is not installed or the
    folder cannot be written (a read-only disk, a file of that name, a full disk) or is a link (planted: not written
    through)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception as e:  # tensorboard is optional: torch imports it only here. Missing: ImportError; installed
        # but broken (a protobuf it does not match): TypeError, AttributeError...
        if "tensorboard" not in _SAID:
            _SAID.add("tensorboard")
            why = "is missing" if isinstance(e, ImportError) else "does not import"
            LOGGER.warning(f"yolofeed monitor: no TensorBoard scalars: the tensorboard package {why} "
                           f"({type(e).__name__}: {e}). pip install tensorboard (again, where it is broken), or "
                           "tensorboard=False to silence this; Prometheus and the summary line work without it.")
        return None
    if folder.is_symlink():  # planted: the writer would follow a link to a folder and write outside the run
        tensorboard_failed(folder, FileExistsError(f"{folder} is a link"), "no TensorBoard scalars")
        return None
    _install_quiet_hook()
    before = set(threading.enumerate())
    _OPENING.append(before)  # a writer thread that fails at once is quiet too (``_quiet``), before it is listed
    try:
        writer = SummaryWriter(str(folder))
    except Exception as e:  # OSError; with TensorFlow installed, its gfile's errors (tf.errors.OpError)
        writer = None
        tensorboard_failed(folder, e, "no TensorBoard scalars")
    finally:
        _quiet(set(threading.enumerate()) - before)
        _OPENING.remove(before)
    return writer


def tensorboard_failed(folder: Path, e: BaseException, what: str) -> None:
    """One line for a TensorBoard folder that cannot be written: the monitor's other outputs go on."""
    LOGGER.warning(tensorboard_failure(folder, e, what))


def tensorboard_failure(folder: Path, e: BaseException, what: str) -> str:
    said = getattr(e, "strerror", None) or getattr(e, "message", None) or str(e).strip().splitlines()[0]
    if folder.is_symlink():  # "File exists" says nothing of a link; one to a folder is not written through
        said = f"it is {describe(folder)}"
    return (f"yolofeed monitor: {what}: could not write {folder} ({said}); the monitor's other outputs go on. "
            "Make it a folder you can write, on a disk with room, or train with tensorboard=False to silence this.")


_OWN_WRITERS: weakref.WeakSet = weakref.WeakSet()  # the threads the monitor's SummaryWriters started
_OPENING: list[set[threading.Thread]] = []  # the threads alive as each SummaryWriter now being made began


def _quiet(threads: set[threading.Thread]) -> None:
    """A SummaryWriter writes its events in a thread of its own, which ends on a failed write with a traceback on
    stderr (``threading.excepthook``) and leaves the error for the writer's next call in this thread, where the
    monitor says it in one line (``tensorboard_failed``). The traceback of ``threads`` (the monitor's writers') is left
    out, and that of a tensorboard thread begun while the monitor makes its writer (``_OPENING``: one that fails on
    its first write, a read-only or full folder, ends before it can be listed); every other thread's, Ultralytics'
    own TensorBoard writer's among them, is not."""
    _OWN_WRITERS.update(threads)
    _install_quiet_hook()


def _install_quiet_hook() -> None:
    if "tensorboard thread" in _SAID:
        return
    _SAID.add("tensorboard thread")
    before = threading.excepthook

    def hook(args: Any) -> None:
        thread = args.thread
        opening = thread is not None and type(thread).__module__.startswith("tensorboard") and any(
            thread not in alive for alive in list(_OPENING))
        if thread not in _OWN_WRITERS and not opening:
            before(args)

    threading.excepthook = hook


def _disk_read_bytes() -> int | None:
    io = psutil.disk_io_counters()  # None where the machine exposes no disk counters (some containers)
    return io.read_bytes if io is not None else None


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


class TrainingMonitor:
    """Callbacks that time each training step's phases and publish them while the run goes on.

    Args:
        cfg: what to publish and when to alert.
        clock: seconds, for the alert and the publishing cadence (tests pass a fake one).
        sampler: the system sampler (tests pass one with made-up readings).
    """

    def __init__(self, cfg: MonitorConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 sampler: Any = None):
        self.cfg = cfg or MonitorConfig()
        self.clock = clock
        self.timer: StepClock | None = None
        self.sampler = sampler if sampler is not None else SystemSampler()
        self.alert = LowUtilAlert(self.cfg.alert_util, self.cfg.alert_wait, self.cfg.alert_seconds, clock)
        self.endpoint: Endpoint | None = None
        self.writer = None
        self.snapshot: dict[str, Any] = {}  # what a Prometheus scrape reads: replaced whole, never edited
        self.run = ""
        self.info: dict[str, str] = {}
        self.step = self.step_in_epoch = 0
        self.failed = False
        self._disk0: int | None = None
        self._last_publish = 0.0
        self._last_summary = 0.0
        self._summaries = 0  # summary lines said this run
        self._no_util_said = False  # that the alert cannot fire (no GPU utilisation to read), said once a monitor
        self._unmark: Callable[[], None] | None = None  # removes the phase marks from the trainer

    # -- Ultralytics callbacks -----------------------------------------------------------------
    def on_train_start(self, trainer: Any) -> None:
        self.close()  # a run before with this monitor that failed (no on_train_end): its probe, endpoint and writer
        self.timer = StepClock(cuda=trainer.device.type == "cuda")
        self._unmark = mark_phases(trainer, self.timer.mark)
        self.sampler.start(trainer.device)
        self.open(Path(trainer.save_dir), str(trainer.device))

    def on_train_epoch_start(self, trainer: Any) -> None:
        self.timer.epoch_start()  # the epoch's first step waits from here, not from the last epoch's validation
        self.step_in_epoch = 0

    def on_train_batch_start(self, trainer: Any) -> None:
        self.timer.batch_ready()

    def on_train_batch_end(self, trainer: Any) -> None:
        self.timer.step_done(images_in_step(trainer, self.step_in_epoch))
        self.step_in_epoch += 1
        self.step += 1
        now = self.clock()
        if now - self._last_publish >= self.cfg.publish_seconds:  # ~1 ms a time: once a second, not once a step
            self._last_publish = now
            self.publish(now, bar=True)

    def on_train_epoch_end(self, trainer: Any) -> None:
        self.timer.epoch_end()

    def on_train_end(self, trainer: Any) -> None:
        try:  # the steps since the last once-a-second publish: a short run's last point, the end's counters
            said_none = self._summaries == 0 and self.step > 0  # a run shorter than summary_seconds: its one line
            if self.timer is not None and (self.writer or self.endpoint or said_none):
                if said_none:
                    self._last_summary = -math.inf
                self.publish()
        finally:
            self.close()

    # -- outputs -------------------------------------------------------------------------------
    def open(self, save_dir: Path, device: str) -> None:
        """Start the outputs for the run in ``save_dir``: the Prometheus endpoint and TensorBoard (each optional).

        ``timer`` must be set (``on_train_start`` does it; tests drive a ``StepClock`` by hand).
        """
        self.run, self.info = save_dir.name, {"save_dir": str(save_dir), "device": device}
        self._disk0 = _disk_read_bytes()
        self.snapshot = self._counters()
        if self.cfg.prometheus_port is not None:
            self.endpoint = serve(Collector(self.run, lambda: self.snapshot), self.cfg.prometheus_addr,
                                  self.cfg.prometheus_port, LOGGER)
            if self.endpoint is not None:
                LOGGER.info(f"yolofeed monitor: Prometheus metrics on {self.endpoint.url}")
                warning = exposed_warning(self.endpoint, str(save_dir))
                if warning:  # once, as the endpoint opens: it serves every scrape after without a word
                    LOGGER.warning(warning)
        if self.cfg.tensorboard:
            self.writer = open_tensorboard(save_dir / "yolofeed_tb")
        self._last_publish = self._last_summary = self.clock()
        self._summaries = 0

    def _counters(self) -> dict[str, Any]:
        """The running totals (Prometheus counters): they only grow while the run goes on."""
        t = self.timer
        disk = _disk_read_bytes()
        return {"steps": t.steps, "images": t.images, "data_wait_seconds": t.sum_ms["data_wait"] / 1e3,
                "phase_seconds": {p: t.sum_ms.get(p, 0.0) / 1e3 for p in PHASES}, "alerts": self.alert.episodes,
                "disk_read_bytes": None if disk is None or self._disk0 is None else max(0, disk - self._disk0),
                "info": self.info}

    def publish(self, now: float | None = None, bar: bool = False) -> dict:
        """Update the Prometheus snapshot and TensorBoard; log the alert and, when due, the summary line.

        Args:
            bar: called during a training step, while Ultralytics' progress bar is on screen.

        Returns:
            The values written to TensorBoard (the summary line's too).
        """
        now = self.clock() if now is None else now
        s = self.timer.summary(last=50)
        load = self.sampler.recent(5.0)
        wait = s.fraction.get("data_wait", 0.0)
        if load.samples and load.gpu_util is None and not self._no_util_said:
            self._no_util_said = True
            device = self.info.get("device", "")
            where = "NVML reads none for this GPU" if device.startswith("cuda") else f"a run on {device or 'the CPU'}"
            parts = ["the step breakdown", *(["Prometheus"] if self.endpoint is not None else []),
                     *(["TensorBoard"] if self.writer is not None else [])]  # what runs, not what was asked
            going = f"{', '.join(parts[:-1])} and {parts[-1]} go" if len(parts) > 1 else f"{parts[0]} goes"
            self._say(f"yolofeed monitor: no GPU utilisation to read ({where}): the low-utilisation alert cannot "
                      f"fire; {going} on", logging.INFO, bar)
        if self.alert.update(load.gpu_util, wait):
            self._say(f"yolofeed monitor: GPU starved: {load.gpu_util:.0f} % busy while {100 * wait:.0f} % of each "
                      f"step waits for data (for {self.cfg.alert_seconds:.0f} s). Run 'yolofeed doctor' with this "
                      "setup, or train with 'yolofeed train' to feed the GPU from a pack.", logging.WARNING, bar)
        values = {"images_per_s": s.images_per_s, "data_wait_fraction": wait, "gpu_util": load.gpu_util,
                  "cpu_cores_busy": load.cpu_cores_busy if load.samples else None,
                  **{f"ms_{p}": s.ms.get(p, 0.0) for p in PHASES}}
        snap = {**self._counters(), "images_per_s": s.images_per_s if s.steps else None,
                "data_wait": wait if s.steps else None, "alert_active": float(self.alert.active)}
        if load.samples:  # no sample yet: leave the machine's series out rather than publish zeros
            snap.update(cores=load.cores, cpu_cores_busy=load.cpu_cores_busy, own_cores_busy=load.own_cores_busy,
                        iowait=load.iowait, ram_used_bytes=_scaled(load.ram_used_gb, 1e9),
                        swap_used_bytes=_scaled(load.swap_used_gb, 1e9), gpu_util=_scaled(load.gpu_util, 0.01),
                        gpu_mem_bytes=_scaled(load.gpu_mem_gb, 1e9), gpu_clock_hz=_scaled(load.gpu_clock_mhz, 1e6),
                        gpu_power_w=load.gpu_power_w)
        self.snapshot = snap  # one assignment: a scrape in the server's thread sees the old or the new, whole
        if self.writer:
            try:
                for k, v in values.items():
                    if v is not None:
                        self.writer.add_scalar(f"yolofeed/{k}", v, self.step)
            except Exception as e:  # its disk filled or went read-only: TensorBoard stops, the rest goes on
                writer, self.writer = self.writer, None
                self._say(tensorboard_failure(Path(writer.log_dir), e, "TensorBoard scalars stopped"),
                          logging.WARNING, bar)
                _close_writer(writer, said=True)
        if now - self._last_summary >= self.cfg.summary_seconds:
            self._last_summary = now
            self._summaries += 1
            self._say(self.line(values), logging.INFO, bar)
        return values

    @staticmethod
    def _say(text: str, level: int, bar: bool) -> None:
        """Log ``text`` on a line of its own.

        Ultralytics' bar redraws its line with a carriage return and no newline, so a message logged
        during a step would be glued onto the end of the bar. A newline first ends the bar's line; the
        bar draws itself again below the message at its next update.
        """
        if bar and LOGGER.isEnabledFor(level) and progress_bar_drawn():
            sys.stdout.write("\n")  # the bar's stream (its TQDM writes to sys.stdout)
            sys.stdout.flush()
        LOGGER.log(level, text)

    @staticmethod
    def line(v: dict) -> str:
        total = sum(v[f"ms_{p}"] for p in PHASES) or 1.0
        parts = " ".join(f"{p.split('_')[0]} {100 * v[f'ms_{p}'] / total:.0f}%" for p in PHASES)
        if v["cpu_cores_busy"] is None:  # no sample in the window (the probe not started yet, or lost)
            machine = "GPU and CPU not sampled"
        else:
            gpu = f"GPU {v['gpu_util']:.0f}%" if v["gpu_util"] is not None else "no GPU"
            machine = f"{gpu} | CPU {v['cpu_cores_busy']:.1f} cores"
        return f"yolofeed: {v['images_per_s']:,.0f} img/s | {parts} | {machine}"

    def close(self) -> None:
        """End the run's outputs: the phase marks, the probe, the endpoint, the writer; each is closed even where
        one before it fails (the first failure is raised after). Closing a closed monitor does nothing."""
        unmark, endpoint, writer = self._unmark, self.endpoint, self.writer
        self._unmark = self.endpoint = self.writer = None
        parts = [unmark, self.sampler.stop, endpoint.close if endpoint is not None else None,
                 (lambda: _close_writer(writer)) if writer else None]
        failed: Exception | None = None
        for close in parts:
            if close is None:
                continue
            try:
                close()
            except Exception as e:  # the others still close: a port or a file left open outlives the run
                failed = failed or e
        if failed is not None:
            raise failed

    def callbacks(self) -> dict[str, Callable]:
        """Ultralytics event -> callback, each guarded: an error inside the monitor switches it off, not the run."""
        own = {"on_train_start": self.on_train_start, "on_train_epoch_start": self.on_train_epoch_start,
               "on_train_batch_start": self.on_train_batch_start, "on_train_batch_end": self.on_train_batch_end,
               "on_train_epoch_end": self.on_train_epoch_end, "on_train_end": self.on_train_end}
        return {event: self._guarded(event, fn) for event, fn in own.items()}

    def _guarded(self, event: str, fn: Callable[[Any], None]) -> Callable[[Any], None]:
        def callback(trainer: Any) -> None:
            if self.failed:
                return
            try:
                fn(trainer)
            except Exception as e:  # monitoring must never stop training: report it, switch the monitor off
                self.failed = True
                LOGGER.warning(f"yolofeed monitor: switched off after {type(e).__name__} in {event}: {e}. "
                               "Training goes on; please report this with the traceback below.", exc_info=True)
                try:
                    self.close()
                except Exception as e2:  # the monitor's state may be half built; what is left is freed at exit
                    LOGGER.warning(f"yolofeed monitor: closing it failed too: {type(e2).__name__}: {e2}")

        callback.__wrapped__ = fn
        return callback


def _close_writer(writer: Any, said: bool = False) -> None:
    """Close a TensorBoard writer; its last events' write failing (a full disk) is one line, or none where ``said``."""
    try:
        writer.close()
    except Exception as e:  # OSError, or TensorFlow's gfile errors
        if not said:
            tensorboard_failed(Path(writer.log_dir), e, "TensorBoard's last scalars not written")


def monitors(callbacks: dict[str, list[Callable]]) -> list[TrainingMonitor]:
    """The ``TrainingMonitor``s whose callbacks are among Ultralytics' ``{event: [fn, ...]}`` (``attach`` to the model
    copies them into the trainer, and into each DDP rank's), each once."""
    found = {}
    for fns in callbacks.values():
        for fn in fns:
            owner = _owner(fn)
            if owner is not None:
                found[id(owner)] = owner
    return list(found.values())


def _owner(fn: Callable) -> TrainingMonitor | None:
    """The monitor whose guarded callback ``fn`` is (``TrainingMonitor._guarded`` keeps its method as ``__wrapped__``),
    else None."""
    owner = getattr(getattr(fn, "__wrapped__", None), "__self__", None)
    return owner if isinstance(owner, TrainingMonitor) else None


def attached(callbacks: dict[str, list[Callable]]) -> bool:
    """Whether a ``TrainingMonitor``'s callbacks are among Ultralytics' already."""
    return bool(monitors(callbacks))


def close_attached(callbacks: dict[str, list[Callable]]) -> None:
    """Close the monitors among ``callbacks``: a run that raised has no ``on_train_end``, and would leave the probe
    sampling, the Prometheus port bound and the TensorBoard file open in an interpreter that goes on (a notebook).
    Closing a closed monitor does nothing; a failure to close is logged, never raised."""
    for monitor in monitors(callbacks):
        try:
            monitor.close()
        except Exception as e:  # the monitor's state may be half built; what is left is freed at exit
            LOGGER.warning(f"yolofeed monitor: closing it failed: {type(e).__name__}: {e}")


def attach(target: Any, **config: Any) -> TrainingMonitor:
    """Monitor a run: ``target`` is a ``YOLO(...)`` model (before ``.train()``) or a trainer.

    Example:
        >>> from ultralytics import YOLO
        >>> from yolofeed.monitor import attach
        >>> model = YOLO("yolo11n.yaml")
        >>> attach(model, prometheus_port=9400)  # prometheus_addr="0.0.0.0" for a Prometheus on another host
        >>> model.train(data="coco8.yaml")
    """
    known = [f.name for f in dataclasses.fields(MonitorConfig)]
    if unknown := [k for k in config if k not in known]:
        what = "is not an option" if len(unknown) == 1 else "are not options"
        raise ConfigError(f"attach: {', '.join(map(repr, unknown))} {what} of the monitor; its options are "
                          f"{', '.join(known)}")
    callbacks = getattr(target, "callbacks", None)
    if isinstance(callbacks, dict) and (earlier := monitors(callbacks)):  # one monitor a run: the newest
        close_attached(callbacks)
        for fns in callbacks.values():
            fns[:] = [fn for fn in fns if _owner(fn) not in earlier]
        LOGGER.info("yolofeed monitor: attached again: it replaces the monitor attached before (its port and "
                    "TensorBoard file closed)")
    monitor = TrainingMonitor(MonitorConfig(**config))
    for event, fn in monitor.callbacks().items():
        target.add_callback(event, fn)
    _close_when_it_raises(target)
    return monitor


def _close_when_it_raises(target: Any) -> None:
    """Make ``target.train`` (a model's or a trainer's) close the monitors attached to it where the run raises: it
    then has no ``on_train_end``, and a stock trainer closes nothing (yolofeed's does, as it stops), which left the
    probe sampling and the port bound in an interpreter that goes on (a notebook). Once per target; what the run
    raised is raised as it was."""
    train = getattr(target, "train", None)
    if train is None or getattr(train, "yolofeed_closes_monitors", False):
        return

    @functools.wraps(train)
    def closing(*args: Any, **kwargs: Any) -> Any:
        try:
            return train(*args, **kwargs)
        except BaseException:
            close_attached(getattr(target, "callbacks", None) or {})
            raise

    closing.yolofeed_closes_monitors = True  # type: ignore[attr-defined]
    target.train = closing
