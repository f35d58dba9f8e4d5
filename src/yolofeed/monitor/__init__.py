"""Observing a run: step-time accounting and a system sampler, independent of any trainer.

``steps`` keeps per-step times (data wait vs the rest) and reduces them to steady-state rates;
``phases`` splits a step into data wait, copy, forward, loss, backward and optimiser; ``system``
samples the GPU (NVML) and the host (psutil) from a separate process. ``live`` (Ultralytics
callbacks, with ``exporter``'s Prometheus endpoint), ``yolofeed bench`` and ``yolofeed doctor``
are thin adapters over these.
"""

from yolofeed.monitor.live import LowUtilAlert, MonitorConfig, TrainingMonitor, attach
from yolofeed.monitor.phases import PhaseTimer
from yolofeed.monitor.steps import StepTimer
from yolofeed.monitor.system import SystemSampler

__all__ = ["LowUtilAlert", "MonitorConfig", "PhaseTimer", "StepTimer", "SystemSampler", "TrainingMonitor", "attach"]
