"""Observing a run: one record of a step's time, a system sampler, and thin Ultralytics adapters over them.

Accounting, independent of any trainer: ``steps`` (``StepClock`` keeps a ``StepRecord`` per training step: data
wait, preprocess, forward, loss, backward, optimiser; ``step_stats`` and ``phase_summary`` reduce them), ``system``
(samples the GPU with NVML and the host with psutil from a separate process) and ``callbacks`` (host time in a
trainer's other callbacks). Ultralytics callbacks over them: ``live`` (live monitoring: the alert, ``exporter``'s
Prometheus endpoint, TensorBoard), ``profile`` (the profiling engine of ``yolofeed bench`` and ``yolofeed doctor``)
and ``throughput`` (``yolofeed train``'s closing line, gathered over the DDP ranks).
"""

from __future__ import annotations

from typing import Any

from yolofeed.monitor.steps import StepClock, StepRecord
from yolofeed.monitor.system import SystemSampler

__all__ = ["LowUtilAlert", "MonitorConfig", "StepClock", "StepRecord", "SystemSampler", "TrainingMonitor", "attach"]


def __getattr__(name: str) -> Any:
    """The live monitor's names, imported on first use: it imports Ultralytics, the accounting does not."""
    if name in ("LowUtilAlert", "MonitorConfig", "TrainingMonitor", "attach"):
        from yolofeed.monitor import live

        return getattr(live, name)
    raise AttributeError(f"module 'yolofeed.monitor' has no attribute {name!r}")
