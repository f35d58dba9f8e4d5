"""Stage 4: the Ultralytics seam (``FastDetectionTrainer``) and the ``yolofeed train`` command."""

from yolofeed.train.trainer import (
    FastDetectionTrainer,
    FastOBBTrainer,
    FastPoseTrainer,
    FastSegmentationTrainer,
)

__all__ = ["FastDetectionTrainer", "FastOBBTrainer", "FastPoseTrainer", "FastSegmentationTrainer"]
