"""The bar a profile's steps are counted on, every mode together, and Ultralytics' own output held back meanwhile."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TextIO

from yolofeed.ultralytics_seam import LOGGER


class Progress:
    """One bar over the profile's own steps, every mode together, with an overall ETA.

    A profile sets the trainer's epochs to 10**6 (see ``profile``), so Ultralytics' own epoch bar would
    read "6/1000000" after "Starting training for 1000000 epochs". While a mode trains under a Progress,
    Ultralytics' INFO output (that bar, the model summary, the TensorBoard hint) is held back; its
    warnings still show. The ETA is the steps left at the mean rate so far, set-up time included, which
    the modes still to come pay too.

    Args:
        modes: the modes to run, in order.
        steps, warmup: measured and warm-up steps of each mode, as given to ``profile``; a longer warm-up
            found later (``queued_batches``) is added with ``grow``.
        file: where the bar goes (stderr by default).
    """

    def __init__(self, modes: list[str], steps: int, warmup: int, file: TextIO | None = None):
        from tqdm import tqdm

        self.modes = modes
        per_mode = warmup + steps + 1  # the first step only opens the step clock
        self.bar = tqdm(total=len(modes) * per_mode, unit="step", smoothing=0, dynamic_ncols=True, file=file,
                        desc="profiling")

    def start(self, mode: str, what: str = "") -> None:
        k = self.modes.index(mode) + 1 if mode in self.modes else 0
        self.bar.set_description(f"{mode} ({k}/{len(self.modes)}){what}")

    def grow(self, steps: int) -> None:
        self.bar.total += steps
        self.bar.refresh()

    def step(self, n: int = 1) -> None:
        self.bar.update(n)

    def write(self, text: str) -> None:
        """Print a line above the bar (the bar is redrawn below it)."""
        self.bar.write(text)

    def close(self) -> None:
        self.bar.close()


@contextlib.contextmanager
def ultralytics_quiet(quiet: bool) -> Iterator[None]:
    """Hold back Ultralytics' INFO logging and progress bars (its TQDM is off above INFO); warnings still show."""
    level = LOGGER.level
    if quiet:
        LOGGER.setLevel(logging.WARNING)
    try:
        yield
    finally:
        LOGGER.setLevel(level)
