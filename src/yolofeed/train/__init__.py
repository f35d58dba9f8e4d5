"""Stage 4: the Ultralytics seam (``FastDetectionTrainer``) and the ``yolofeed train`` command."""

from yolofeed.train.trainer import FastDetectionTrainer, FastPoseTrainer

__all__ = ["FastDetectionTrainer", "FastPoseTrainer"]
