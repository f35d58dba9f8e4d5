"""yolofeed: keep the GPU busy while training YOLO detectors with Ultralytics.

Stages follow the data's path: ``pack`` (files -> one store) -> ``loader`` -> ``augment`` -> ``train``;
``monitor`` and ``doctor`` observe, ``bench`` compares, ``cli`` parses and dispatches.
"""

from __future__ import annotations

import logging
import sys

__version__ = "0.1.0"

from yolofeed.errors import ConfigError, DatasetError, PackError, StalePackError, YolofeedError


class _UntilConfigured(logging.Handler):
    """yolofeed's own lines (a pack's summary and where it went, the format chosen and why) on stderr for a Python
    user who configured no logging, as Ultralytics prints its lines; Python would show only warnings. Silent once
    the root logger has a handler (the CLI's, an application's, pytest's): the record reaches that one, once.
    ``logging.getLogger("yolofeed").setLevel(logging.WARNING)`` keeps only the warnings."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        try:
            sys.stderr.write(self.format(record) + "\n")  # sys.stderr as it is now (a test or notebook may swap it)
        except Exception:
            self.handleError(record)


_LOGGER = logging.getLogger("yolofeed")
if _LOGGER.level == logging.NOTSET:  # a level the user set before importing yolofeed stays
    _LOGGER.setLevel(logging.INFO)
_LOGGER.addHandler(_UntilConfigured())

__all__ = ["__version__", "ConfigError", "DatasetError", "FastDetectionTrainer", "FastOBBTrainer", "FastPoseTrainer",
           "FastSegmentationTrainer", "PackError", "StalePackError", "YolofeedError"]


def __getattr__(name: str):
    """``yolofeed.FastDetectionTrainer`` without importing torch and Ultralytics for ``yolofeed help``."""
    if name in ("FastDetectionTrainer", "FastOBBTrainer", "FastPoseTrainer", "FastSegmentationTrainer"):
        from yolofeed import train

        return getattr(train, name)
    raise AttributeError(f"module 'yolofeed' has no attribute {name!r}")
