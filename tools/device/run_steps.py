"""Train a few steps and stop: shared by the tools that look inside training steps (gpu_gaps, syncs, kernel_top)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from yolofeed.ultralytics_seam import StopTraining as Enough  # raised from on_batch_end: the steps wanted are seen
from yolofeed.ultralytics_seam import train_until_stopped, unbounded_epochs


def profile_steps(warmup: int, steps: int, **profile_kwargs: Any) -> tuple[Callable[[Any], None], dict]:
    """An ``on_batch_end`` that records steps ``warmup`` to ``warmup + steps`` under ``torch.profiler.profile``
    (CPU and, where there is one, CUDA activity; ``profile_kwargs`` added), then raises ``Enough``; and the dict
    whose ``"prof"`` holds the profiler once it ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    state: dict = {"n": 0, "prof": None}

    def on_batch_end(trainer):
        state["n"] += 1
        if state["n"] in (warmup, warmup + steps) and cuda:
            torch.cuda.synchronize()  # the window holds these steps' GPU work, no more, no less
        if state["n"] == warmup:
            state["prof"] = profile(activities=activities, **profile_kwargs)
            state["prof"].__enter__()
        elif state["n"] == warmup + steps:
            state["prof"].__exit__(None, None, None)
            raise Enough

    return on_batch_end, state


def run_steps(cls: type, args: dict[str, Any], on_batch_end: Callable[[Any], None]) -> Any:
    """Train ``cls`` on ``args`` (validation, plots and checkpoints off, mosaic on, epochs unbounded) until
    ``on_batch_end`` raises ``Enough``; the loaders are closed after. Returns the trainer."""
    full = {"val": False, "plots": False, "save": False, "close_mosaic": 0, "verbose": False, "exist_ok": True,
            "workers": 16, **args}  # workers: the bench's; a yolofeed trainer ignores it
    trainer = cls(overrides=full)
    trainer.add_callback("on_train_start", unbounded_epochs)  # the step count ends the run, never the epoch count
    trainer.add_callback("on_train_batch_end", on_batch_end)
    train_until_stopped(trainer)
    for name in ("train_loader", "test_loader"):
        if hasattr(getattr(trainer, name, None), "close"):
            getattr(trainer, name).close()
    return trainer
