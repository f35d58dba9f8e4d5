"""Live monitoring of any Ultralytics training run: step breakdown, GPU/CPU load, alert, Prometheus, TensorBoard.

``attach(model_or_trainer)`` adds callbacks to a stock ``YOLO(...)`` (before ``.train()``) or to a
trainer; ``yolofeed train monitor=True`` does it for you. All of it is a thin adapter: the numbers
come from ``PhaseTimer`` and ``SystemSampler``, the decision from ``LowUtilAlert``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ultralytics.utils import LOGGER  # our lines go where Ultralytics' progress goes

from yolofeed.monitor.phases import PHASES, PhaseTimer
from yolofeed.monitor.system import SystemSampler


@dataclass(frozen=True)
class MonitorConfig:
    """What the live monitor publishes and when it alerts.

    Attributes:
        prometheus_port: serve metrics on 127.0.0.1:<port> (None: off).
        tensorboard: write scalars under ``<run>/yolofeed_tb``.
        alert_util: GPU utilisation (%) under which, together with ``alert_wait``, the GPU counts as starved.
        alert_wait: share of step time waiting for data above which steps count as slow because of data.
        alert_seconds: how long both must hold before one alert is logged (once per episode).
        summary_seconds: how often the one-line summary is logged.
        publish_seconds: how often Prometheus gauges and TensorBoard scalars are updated (~1 ms each time).
    """

    prometheus_port: int | None = None
    tensorboard: bool = True
    alert_util: float = 60.0
    alert_wait: float = 0.15
    alert_seconds: float = 30.0
    summary_seconds: float = 30.0
    publish_seconds: float = 1.0


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


class _Prometheus:
    def __init__(self, port: int):
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()  # private: several monitors (tests) never clash
        self.phase = Gauge("yolofeed_step_phase_seconds", "mean seconds per training step, by phase", ["phase"],
                           registry=self.registry)
        self.rate = Gauge("yolofeed_images_per_second", "training images per second", registry=self.registry)
        self.wait = Gauge("yolofeed_data_wait_fraction", "share of step time waiting for data", registry=self.registry)
        self.util = Gauge("yolofeed_gpu_utilization_percent", "NVML GPU utilisation", registry=self.registry)
        self.cpu = Gauge("yolofeed_cpu_cores_busy", "host CPU cores busy", registry=self.registry)
        self.alert = Gauge("yolofeed_low_utilization_alert", "1 while the GPU is starved for data",
                           registry=self.registry)
        self.server, self.thread = start_http_server(port, addr="127.0.0.1", registry=self.registry)

    def close(self) -> None:
        self.server.shutdown()


def install_phase_marks(trainer: Any, timer: PhaseTimer) -> list:
    """Mark forward / loss / backward / optimizer boundaries of ``trainer``'s steps on ``timer``.

    Forward starts at the model's forward pre-hook, the loss at the detection head's output, the
    backward pass when the model (which computes the loss) returns, the optimiser step where
    ``trainer.optimizer_step`` is entered. Returns hook handles (``.remove()`` them when done).
    """
    from ultralytics.utils.torch_utils import unwrap_model

    model = unwrap_model(trainer.model)
    hooks = [model.register_forward_pre_hook(lambda m, a: timer.mark("forward")),
             model.model[-1].register_forward_hook(lambda m, a, o: timer.mark("loss")),
             model.register_forward_hook(lambda m, a, o: timer.mark("backward"))]
    step = trainer.optimizer_step

    def optimizer_step() -> None:
        timer.mark("optimizer")
        step()

    trainer.optimizer_step = optimizer_step  # Ultralytics has no callback before the optimiser step
    return hooks


class TrainingMonitor:
    """Callbacks that time each training step's phases and publish them while the run goes on."""

    def __init__(self, cfg: MonitorConfig | None = None, clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg or MonitorConfig()
        self.clock = clock
        self.timer: PhaseTimer | None = None
        self.sampler = SystemSampler()
        self.alert = LowUtilAlert(self.cfg.alert_util, self.cfg.alert_wait, self.cfg.alert_seconds, clock)
        self.prometheus: _Prometheus | None = None
        self.writer = None
        self.step = 0
        self._last_publish = 0.0
        self._last_summary = 0.0
        self._hooks: list = []

    # -- Ultralytics callbacks -----------------------------------------------------------------
    def on_train_start(self, trainer: Any) -> None:
        self.timer = PhaseTimer(cuda=trainer.device.type == "cuda")
        self._hooks = install_phase_marks(trainer, self.timer)
        self.sampler.start(trainer.device)
        if self.cfg.prometheus_port:
            self.prometheus = _Prometheus(self.cfg.prometheus_port)
            LOGGER.info(f"yolofeed monitor: Prometheus metrics on http://127.0.0.1:{self.cfg.prometheus_port}/metrics")
        if self.cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(trainer.save_dir) / "yolofeed_tb"))
        self._last_publish = self._last_summary = self.clock()

    def on_train_batch_start(self, trainer: Any) -> None:
        self.timer.batch_ready()

    def on_train_batch_end(self, trainer: Any) -> None:
        self.timer.step_done(trainer.batch_size)
        self.step += 1
        now = self.clock()
        if now - self._last_publish >= self.cfg.publish_seconds:  # ~1 ms a time: once a second, not once a step
            self._last_publish = now
            self.publish(now)

    def on_train_end(self, trainer: Any) -> None:
        self.close()

    # -- publishing ----------------------------------------------------------------------------
    def publish(self, now: float | None = None) -> dict:
        now = self.clock() if now is None else now
        s = self.timer.summary(last=50)
        load = self.sampler.recent(5.0)
        wait = s.fraction.get("data_wait", 0.0)
        if self.alert.update(load.gpu_util, wait):
            LOGGER.warning(f"yolofeed monitor: GPU starved: {load.gpu_util:.0f} % busy while {100 * wait:.0f} % of "
                           f"each step waits for data (for {self.cfg.alert_seconds:.0f} s). Run 'yolofeed doctor' "
                           "with this setup, or train with 'yolofeed train' to feed the GPU from a pack.")
        values = {"images_per_s": s.images_per_s, "data_wait_fraction": wait, "gpu_util": load.gpu_util,
                  "cpu_cores_busy": load.cpu_cores_busy, **{f"ms_{p}": s.ms.get(p, 0.0) for p in PHASES}}
        if self.prometheus:
            for p in PHASES:
                self.prometheus.phase.labels(p).set(s.ms.get(p, 0.0) / 1e3)
            self.prometheus.rate.set(s.images_per_s)
            self.prometheus.wait.set(wait)
            self.prometheus.cpu.set(load.cpu_cores_busy)
            self.prometheus.alert.set(1.0 if self.alert.active else 0.0)
            if load.gpu_util is not None:
                self.prometheus.util.set(load.gpu_util)
        if self.writer:
            for k, v in values.items():
                if v is not None:
                    self.writer.add_scalar(f"yolofeed/{k}", v, self.step)
        if now - self._last_summary >= self.cfg.summary_seconds:
            self._last_summary = now
            LOGGER.info(self.line(values))
        return values

    @staticmethod
    def line(v: dict) -> str:
        total = sum(v[f"ms_{p}"] for p in PHASES) or 1.0
        parts = " ".join(f"{p.split('_')[0]} {100 * v[f'ms_{p}'] / total:.0f}%" for p in PHASES)
        gpu = f"GPU {v['gpu_util']:.0f}%" if v["gpu_util"] is not None else "no GPU"
        return f"yolofeed: {v['images_per_s']:,.0f} img/s | {parts} | {gpu} | CPU {v['cpu_cores_busy']:.1f} cores"

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.sampler.stop()
        if self.prometheus:
            self.prometheus.close()
            self.prometheus = None
        if self.writer:
            self.writer.close()
            self.writer = None

    def callbacks(self) -> dict[str, Callable]:
        return {"on_train_start": self.on_train_start, "on_train_batch_start": self.on_train_batch_start,
                "on_train_batch_end": self.on_train_batch_end, "on_train_end": self.on_train_end}


def attach(target: Any, **config: Any) -> TrainingMonitor:
    """Monitor a run: ``target`` is a ``YOLO(...)`` model (before ``.train()``) or a trainer.

    Example:
        >>> from ultralytics import YOLO
        >>> from yolofeed.monitor import attach
        >>> model = YOLO("yolo11n.yaml")
        >>> attach(model, prometheus_port=9400)
        >>> model.train(data="coco8.yaml")
    """
    monitor = TrainingMonitor(MonitorConfig(**config))
    for event, fn in monitor.callbacks().items():
        target.add_callback(event, fn)
    return monitor
