"""yolofeed: keep the GPU busy while training YOLO detectors with Ultralytics.

Stages follow the data's path: ``pack`` (files -> one store) -> ``loader`` -> ``augment`` -> ``train``;
``monitor`` and ``doctor`` observe, ``bench`` compares, ``cli`` parses and dispatches.
"""

from __future__ import annotations

__version__ = "0.1.0"

from yolofeed.errors import ConfigError, DatasetError, PackError, StalePackError, YolofeedError

__all__ = ["__version__", "ConfigError", "DatasetError", "FastDetectionTrainer", "PackError", "StalePackError",
           "YolofeedError"]


def __getattr__(name: str):
    """``yolofeed.FastDetectionTrainer`` without importing torch and Ultralytics for ``yolofeed help``."""
    if name == "FastDetectionTrainer":
        from yolofeed.train import FastDetectionTrainer

        return FastDetectionTrainer
    raise AttributeError(f"module 'yolofeed' has no attribute {name!r}")
