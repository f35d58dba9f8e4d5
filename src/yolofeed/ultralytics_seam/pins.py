"""How yolofeed pins what it copied from Ultralytics and what it relies on (``Pinned``: a method and the hash of the
source it was written against; the pins themselves are ``COPIED`` in copied.py and ``RELIED_ON`` in relied_on.py),
``SWAPPED`` (classes swapped in place), what Ultralytics reads from our loaders, and the label rules of each release
(``LABEL_RULE_SETS``). A pinned method whose source differs in older releases of the range lists each such source
(``Reviewed``: the releases, the hash, why yolofeed serves them). ``tests/test_seam.py`` compares the hashes with the
installed source."""

from __future__ import annotations

import re
from dataclasses import dataclass

Release = tuple[int, ...]


def release(text: str) -> Release:
    """The leading numbers of a version string: ``"8.4.190"`` -> (8, 4, 190); ``"8.4.190.dev0"`` -> (8, 4, 190)."""
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


@dataclass(frozen=True)
class Reviewed:
    """Another source of a pinned method, in older releases of the range, read against ``TESTED``'s and judged.

    Attributes:
        releases: the first and the last release (both included) whose source hashes to ``sha256``; that source is
            recorded in ``tests/data/ultralytics-<first>/``.
        sha256: as ``Pinned.sha256``.
        why: what differs from the next source, and why yolofeed serves these releases anyway (it does not touch what
            yolofeed relies on), or what yolofeed does differently under them (a variant the seam chooses).
        stock: yolofeed's copy is not these releases' code: yolofeed takes Ultralytics' own path under them.
    """

    releases: tuple[str, str]
    sha256: str
    why: str
    stock: bool = False

    def covers(self, version: Release) -> bool:
        return release(self.releases[0]) <= version <= release(self.releases[1])


@dataclass(frozen=True)
class Pinned:
    """An Ultralytics function yolofeed copied, or relies on being unchanged, with the hash of its source.

    Attributes:
        ultralytics: its qualified name (module path, then class and method).
        sha256: the first 16 hex digits of the SHA-256 of ``normalised_source`` at ``TESTED``, and in every release
            of the range that ``others`` does not cover.
        ours: the qualified name of yolofeed's modified copy ("" for a method relied on, not copied).
        why: what the copy changes, or what yolofeed assumes of the method.
        others: the other sources of older releases of the range, oldest first, each reviewed.
        since: where set, the first release whose source yolofeed's use of it was written against; under older
            releases of the range the feature that relies on it is refused (``check_task``), so the source is not
            compared there.
    """

    ultralytics: str
    sha256: str
    ours: str = ""
    why: str = ""
    others: tuple[Reviewed, ...] = ()
    since: str = ""

    def reviewed(self, version: Release) -> Reviewed | None:
        """The reviewed source of an older release, or None where the release reads as ``TESTED``."""
        return next((r for r in self.others if r.covers(version)), None)

    def sha256_for(self, version: Release) -> str:
        """The hash the source of this method has in that release of the range."""
        r = self.reviewed(version)
        return self.sha256 if r is None else r.sha256


def _r(first: str, last: str, sha256: str, why: str, stock: bool = False) -> Reviewed:
    return Reviewed((first, last), sha256, why, stock)


# The first release whose pose rules (verify_image_label with keypoints, YOLODataset's kpt_shape check and cache key)
# yolofeed follows: pose packs and pose training are refused under older releases of the range.
POSE_SINCE = "8.4.183"
# The first release whose validator statistics train.val_metrics batches (its sources were reviewed for that release
# alone): under older releases of the range Ultralytics' own update_metrics runs (batched_metrics_serve says None).
VAL_METRICS_SINCE = "8.4.190"
# The first release whose segment loss train.loss.SyncFreeSegmentLoss copies (its sources were reviewed for that
# release alone): under older releases of the range Ultralytics' v8SegmentationLoss runs as it is.
SEGMENT_LOSS_SINCE = "8.4.190"
# The first release whose Detect head and layer routing train.graphed's layout swaps (TokenMajorDetect, HalfUpsample)
# were written against: under older releases of the range the graph captures Ultralytics' head and upsampling as they
# are.
GRAPH_LAYOUT_SINCE = "8.4.190"
# The first release whose validator takes the model to validate from get_model (trainer.ema.ema), which an epoch's
# validation beside the next (val_overlap, seam.validator_view) was written against: under older releases of the range
# every epoch is validated in place.
VAL_OVERLAP_SINCE = "8.4.140"
# the validation's NMS with each image's candidates found a batch at once (train/val_nms.py): non_max_suppression's
# source as 8.4.164's and 8.4.190's (8.4.138's converts the boxes in place before its loop and takes labels)
NMS_SINCE = "8.4.164"



# Objects whose class yolofeed swaps in place (the instance keeps Ultralytics' state; the subclass adds methods
# only): (Ultralytics class, yolofeed's subclass, where). train/loss/install.py::install does it through ``swap_class``.
SWAPPED: tuple[tuple[str, str, str], ...] = (
    ("ultralytics.utils.loss.v8DetectionLoss", "yolofeed.train.loss.detect.SyncFreeDetectionLoss",
     "train/loss/install.py::install"),
    ("ultralytics.utils.tal.TaskAlignedAssigner", "yolofeed.train.loss.detect.SyncFreeAssigner",
     "train/loss/install.py::install"),
    ("ultralytics.utils.loss.BboxLoss", "yolofeed.train.loss.detect.SyncFreeBboxLoss",
     "train/loss/install.py::install"),
    ("ultralytics.utils.loss.v8PoseLoss", "yolofeed.train.loss.pose.SyncFreePoseLoss",
     "train/loss/install.py::install"),
    ("ultralytics.utils.loss.v8OBBLoss", "yolofeed.train.loss.obb.SyncFreeOBBLoss", "train/loss/install.py::install"),
    ("ultralytics.utils.loss.v8SegmentationLoss", "yolofeed.train.loss.segment.SyncFreeSegmentLoss",
     "train/loss/install.py::install"),
    ("ultralytics.utils.tal.RotatedTaskAlignedAssigner", "yolofeed.train.loss.obb.SyncFreeRotatedAssigner",
     "train/loss/install.py::install"),
    ("ultralytics.utils.loss.RotatedBboxLoss", "yolofeed.train.loss.obb.SyncFreeRotatedBboxLoss",
     "train/loss/install.py::install"),
    ("ultralytics.nn.modules.conv.Conv", "yolofeed.train.graphed.FusedConv", "train/graphed.py::install"),
    ("ultralytics.nn.modules.head.Detect", "yolofeed.train.graphed.TokenMajorDetect", "train/graphed.py::install"),
    ("torch.nn.modules.upsampling.Upsample", "yolofeed.train.graphed.HalfUpsample", "train/graphed.py::install"),
    ("torch.nn.modules.conv.Conv2d", "yolofeed.train.graphed.CastConv2d", "train/graphed.py::install"),
    ("ultralytics.nn.modules.block.C2f", "yolofeed.train.graphed.HalvesC2f", "train/graphed.py::install"),
    ("ultralytics.nn.modules.block.C3k2", "yolofeed.train.graphed.HalvesC3k2", "train/graphed.py::install"),
    ("ultralytics.models.yolo.detect.val.DetectionValidator", "yolofeed.train.val_metrics.BatchedDetectionValidator",
     "train/val_metrics.py::install"),
)

# What Ultralytics' trainer reads from a training loader (ours: loader.TrainLoader, train.ahead.AugmentAhead,
# bench.ceiling.ReplayLoader) and its validator from a validation loader (loader.ValLoader). tests/test_seam.py checks
# that ours have them.
TRAIN_LOADER_ATTRIBUTES: dict[str, str] = {
    "__len__": "batches per epoch: the progress bar, warm-up iterations, accumulate",
    "__iter__": "the batches",
    "dataset": "len(dataset) (start line, optimizer=auto), dataset.labels (class weights, label plots)",
    "sampler": "sampler.set_epoch(epoch) under DDP; len(sampler) for the last batch's size",
    "batch_size": "the last batch's size",
    "drop_last": "whether a last batch of one image can happen",
    "num_workers": "the start line's 'Using N dataloader workers'",
    "reset": "called after close_mosaic",
    "close": "called on an out-of-memory retry and at the end of training",
}
VAL_LOADER_ATTRIBUTES: dict[str, str] = {
    "__len__": "the progress bar; the mean validation loss",
    "__iter__": "the batches",
    "dataset": "len(dataset) (images seen, speed), dataset.im_files (save_txt), dataset.labels (the max_det check)",
    "sampler": "list(sampler) under save_json on a custom dataset: the images' ids in batch order",
    "batch_size": "the warm-up's batch shape",
    "close": "called at the end of training",
}


@dataclass(frozen=True)
class LabelRules:
    """The rules of ``verify_image_label`` and ``check_image`` (COPIED) that changed within the range, as one release
    applies them to a detection label file; ``pack.verify`` applies those of the installed release, and a pack records
    which (``since``: a pack built under other rules is stale). ``tests/test_seam.py`` finds each in the installed
    source.

    Attributes:
        since: the first release of these rules.
        encoding: how a label file is read: "utf-8-sig" (8.4.183) reads past a UTF-8 BOM; with "utf-8" the BOM stays
            on the first class id, which is then not a number, and the file is refused.
        blank_lines: a line of whitespace alone is skipped (8.4.165); before, it is a row of no values, which refuses
            the file.
        polygon_duplicates: segment rows are duplicates when class and polygon are equal (8.4.165); before, when
            class and box are.
        integer_classes: a fractional class id refuses the file (8.4.164); before, it is kept as it is.
        negative_sizes: below 0 only x and y may go, down to -``negative`` (8.4.182); before, every value may.
        jpeg2000: Pillow's "JPEG2000" format is an image format (8.4.164); before, such a file is refused.
        pose_box_rows: a box task on a yaml with ``kpt_shape`` keeps the box of each pose row (8.4.164); before, a
            pose row is a row of more than 6 values, read as a polygon.
        coord_max: the largest normalised coordinate (points.max() <= 1.01).
        negative: how far below 0 a value may go (lb.min() >= -0.01).
        min_side: the smallest image side in pixels (shape > 9).
    """

    since: str
    encoding: str = "utf-8-sig"
    blank_lines: bool = True
    polygon_duplicates: bool = True
    integer_classes: bool = True
    negative_sizes: bool = True
    jpeg2000: bool = True
    pose_box_rows: bool = True
    coord_max: float = 1.01
    negative: float = 0.01
    min_side: int = 10


# Each release's rules: the last whose ``since`` is not above it (oldest first; TESTED's last).
LABEL_RULE_SETS: tuple[LabelRules, ...] = (
    LabelRules("8.4.138", encoding="utf-8", blank_lines=False, polygon_duplicates=False, integer_classes=False,
               negative_sizes=False, jpeg2000=False, pose_box_rows=False),
    LabelRules("8.4.164", encoding="utf-8", blank_lines=False, polygon_duplicates=False, negative_sizes=False),
    LabelRules("8.4.165", encoding="utf-8", negative_sizes=False),
    LabelRules("8.4.182", encoding="utf-8"),
    LabelRules("8.4.183"),
)


# The rules of a pack whose header names none: a yolofeed that supported Ultralytics 8.4.183-190 only built it
UNRECORDED_LABEL_RULES = "8.4.183"


def label_rules(version: Release) -> LabelRules:
    """The label rules of a release of the range (an older one gets the oldest known, a newer one TESTED's)."""
    return next((r for r in reversed(LABEL_RULE_SETS) if release(r.since) <= version), LABEL_RULE_SETS[0])


def label_rules_named(since: str) -> LabelRules | None:
    """The label rules whose first release is ``since`` (as a pack records them), or None for a name not known."""
    return next((r for r in LABEL_RULE_SETS if r.since == since), None)
