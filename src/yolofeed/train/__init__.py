"""Stage 4: the Ultralytics seam (``FastDetectionTrainer``, and a trainer per task) and the ``yolofeed train``
command."""

from yolofeed.train.tasks import FastOBBTrainer, FastPoseTrainer, FastSegmentationTrainer
from yolofeed.train.trainer import FastDetectionTrainer

__all__ = ["FastDetectionTrainer", "FastOBBTrainer", "FastPoseTrainer", "FastSegmentationTrainer"]
