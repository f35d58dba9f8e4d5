"""Stage 2: pack -> pinned host buffers -> device, ahead of the training step.

``sampler`` decides batches (epochs, DDP shards, fraction), ``batch`` gathers one into host buffers,
``prefetch`` moves it to the device on a side stream from a background thread, ``train`` and ``val``
are the loaders Ultralytics' trainer and validator iterate.
"""

from yolofeed.loader.sampler import EpochSampler
from yolofeed.loader.train import TrainLoader
from yolofeed.loader.val import ValLoader

__all__ = ["EpochSampler", "TrainLoader", "ValLoader"]
