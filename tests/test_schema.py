"""The batches between stages: a detection batch carries classes and boxes only, and an op that reads only those
refuses a batch that carries more, rather than dropping it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import random_augmented
from yolofeed.augment import AugmentHyp, GpuAugment
from yolofeed.augment.graphs import GraphedAugment
from yolofeed.augment.masks import with_masks
from yolofeed.errors import ConfigError
from yolofeed.schema import AUGMENTED_KINDS, LABEL_KINDS, AugmentedBatch, SourceBatch


def _source(n: int = 2, width: int = 3, side: int = 32) -> SourceBatch:
    return SourceBatch(torch.zeros((n, side, side, 3), dtype=torch.uint8), torch.full((n, 2), side),
                       torch.zeros(n, width), torch.full((n, width, 4), 0.5), torch.ones(n, width, dtype=torch.bool))


def test_both_batches_have_room_for_every_label_kind_and_a_detection_batch_fills_none():
    assert SourceBatch.KINDS == LABEL_KINDS and tuple(AUGMENTED_KINDS) == LABEL_KINDS
    # OBB's corners leave as oriented boxes, segmentation's polygons as segments until their masks are made
    assert AugmentedBatch.KINDS == ("keypoints", "rboxes", "masks", "segments")
    for kind in (SourceBatch, AugmentedBatch):
        assert set(kind.KINDS) <= {f.name for f in dataclasses.fields(kind)}
    assert _source().kinds() == ()
    assert random_augmented(2, 4, 0.5, seed=0).kinds() == ()


def test_the_augmentation_refuses_labels_it_would_drop():
    """Keypoints, corners and polygons go through every op (test_augment_keypoints.py, test_augment_obb.py,
    test_augment_segments.py); polygons without their lengths are refused; the augmented polygons reach Ultralytics'
    batch only as masks (``with_masks``; test_train_segment.py compares them with Format's)."""
    assert dataclasses.replace(_source(), keypoints=torch.zeros(2, 3, 17, 3)).kinds() == ("keypoints",)
    src = dataclasses.replace(_source(), polygons=torch.zeros(2, 3, 5, 2))
    assert src.kinds() == ("polygons",)
    with pytest.raises(ConfigError, match="no polygon_lengths"):
        GpuAugment(AugmentHyp(imgsz=32))(src)
    with pytest.raises(ConfigError, match="GraphedAugment"):
        GraphedAugment(GpuAugment(AugmentHyp(imgsz=32)), device="cpu")(src)  # before any CUDA work
    with pytest.raises(ConfigError, match=r"corners of shape \(2, 3, 8\), expected"):
        GpuAugment(AugmentHyp(imgsz=32))(dataclasses.replace(_source(), corners=torch.zeros(2, 3, 8)))
    square = torch.tensor([[4.0, 4.0], [20.0, 4.0], [20.0, 20.0], [4.0, 20.0]])
    out = dataclasses.replace(random_augmented(2, 4, 0.5, seed=0), segments=square.repeat(2, 4, 1, 1))
    with pytest.raises(ConfigError, match="segmentation polygons and no masks"):
        out.to_ultralytics()
    assert set(with_masks(out).to_ultralytics()) == {"img", "cls", "bboxes", "batch_idx", "masks", "sem_masks"}


def test_a_detection_batch_augments_as_before():
    out = GpuAugment(AugmentHyp(imgsz=32))(_source(), torch.Generator().manual_seed(0))
    assert isinstance(out, AugmentedBatch) and out.kinds() == ()
    assert set(out.to_ultralytics()) == {"img", "cls", "bboxes", "batch_idx"}
