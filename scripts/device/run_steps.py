"""Shared by the device scripts that look inside training steps (gpu_gaps.py, syncs.py)."""

from __future__ import annotations

from typing import Any, Callable


class Enough(Exception):
    """Raised from ``on_batch_end`` once the script has seen the steps it wanted."""


def run_steps(cls: type, args: dict[str, Any], on_batch_end: Callable[[Any], None]) -> Any:
    """Train ``cls`` on ``args`` (validation, plots and checkpoints off, mosaic on, epochs unbounded) until
    ``on_batch_end`` raises ``Enough``; the loaders are closed after. Returns the trainer."""
    full = {"val": False, "plots": False, "save": False, "close_mosaic": 0, "verbose": False, "exist_ok": True,
            "workers": 16, **args}
    trainer = cls(overrides=full)
    # as doctor/profile.py: the step count ends the run, never the epoch count
    trainer.add_callback("on_train_start", lambda t: setattr(t, "epochs", 10**6))
    trainer.add_callback("on_train_batch_end", on_batch_end)
    try:
        trainer.train()
    except Enough:
        pass
    for name in ("train_loader", "test_loader"):
        if hasattr(getattr(trainer, name, None), "close"):
            getattr(trainer, name).close()
    return trainer
