"""Every place yolofeed reaches into Ultralytics, in one package, checked against the releases it was written for.

yolofeed trains with Ultralytics' own ``DetectionTrainer``; it overrides a few of its methods, reads and sets some
of its state, and carries modified copies of a few of its methods (the sync-free loss). All of that holds for the
Ultralytics releases whose copied and relied-on methods read as those of the release they were copied from
(``TESTED``), or as a source reviewed for them: ``SUPPORTED``, the releases checked one by one against the recorded
sources. This module:

* checks the installed version when it is imported (in ``SUPPORTED``). No other module of ``src/yolofeed`` imports
  Ultralytics (``tests/test_seam.py`` checks it), so importing any stage that uses Ultralytics (``yolofeed.train``,
  ``yolofeed.pack``...) with another version raises ``UltralyticsVersionError``: an ``ImportError`` (the module
  cannot be used) and a ``YolofeedError``, which the CLI prints as one line before any work starts. ``import
  yolofeed`` itself stays free of Ultralytics, so ``yolofeed help`` works with any version.
  ``YOLOFEED_UNTESTED_ULTRALYTICS=1`` turns the version check into a warning (to try a new release: the drift test
  then says what moved);
* checks, at import too, that every Ultralytics method yolofeed overrides, wraps or relies on is still there
  (``REQUIRED``): a renamed ``_close_dataloader_mosaic`` would otherwise leave mosaic on for a whole run, silently;
* checks, at import too, that the trainer's attributes yolofeed reads (``TRAINER_STATE``: ``last``, ``start_epoch``,
  ``amp``...) are still assigned in the installed source, and reads each through a function here (``checkpoint``,
  ``start_epoch``, ``step_autocast``...);
* re-exports every Ultralytics name yolofeed uses, and wraps each reach into an object's state (the callbacks'
  order, ``tloss``, the criterion, the detection head, ``epochs``...) in a small function that names what it
  touches and why; an attribute missing at run time raises ``UltralyticsError`` in one line;
* lists, in ``copied.py`` and ``relied_on.py``, what yolofeed copied (``COPIED``: Ultralytics' method, our copy, the
  hash of the source it was copied from), the methods those copies and our overrides assume unchanged (``RELIED_ON``;
  with ``ours``, a rule yolofeed re-implements in its own shape: the partner pool's size, the label filters), the
  classes swapped in place (``SWAPPED``) and what Ultralytics reads from our loaders (``TRAIN_LOADER_ATTRIBUTES``,
  ``VAL_...``); a pinned method whose source differs in older releases of the range lists each such source
  (``Reviewed``: the releases, the hash, why yolofeed serves them), and the label rules of each release are
  ``LABEL_RULE_SETS``.
  ``tests/test_seam.py`` compares the hashed methods with the installed source (read by ``source.py``) and fails
  with a diff on drift. Only this file imports Ultralytics;
* chooses, where releases of the range differ in what yolofeed does, the installed release's way, in one function
  each (``since``: ``LABEL_RULES``, ``pair_overlaps``, ``copy_serves``, ``check_ddp``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import ultralytics

from yolofeed.errors import UltralyticsError, UltralyticsVersionError
from yolofeed.ultralytics_seam import source
from yolofeed.ultralytics_seam.copied import COPIED
from yolofeed.ultralytics_seam.pins import (
    GRAPH_LAYOUT_SINCE,
    LABEL_RULE_SETS,
    POSE_SINCE,
    SEGMENT_LOSS_SINCE,
    SWAPPED,
    TRAIN_LOADER_ATTRIBUTES,
    UNRECORDED_LABEL_RULES,
    VAL_LOADER_ATTRIBUTES,
    VAL_METRICS_SINCE,
    VAL_OVERLAP_SINCE,
    LabelRules,
    Pinned,
    Release,
    Reviewed,
    label_rules,
    label_rules_named,
)
from yolofeed.ultralytics_seam.pins import release as parse_version
from yolofeed.ultralytics_seam.relied_on import RELIED_ON
from yolofeed.ultralytics_seam.source import normalised_source, resolve, source_hash

TESTED = "8.4.190"  # the Ultralytics the copies below were taken from, and the one `make test` runs
# [lowest, first unsupported): every 8.4 release of the three months to TESTED. Each method in
# COPIED and RELIED_ON reads in each of these releases as in TESTED or as one of its `others`, reviewed one by one:
# most differ where yolofeed does not look; where yolofeed's behaviour must differ, the seam chooses by release
# (`since`): the label rules (LABEL_RULES), the assigner's overlaps (pair_overlaps, 8.4.180), Ultralytics' own MuSGD
# under 8.4.138 (copy_serves), no multi-GPU under 8.4.138-139 (check_ddp). Each holds every attribute of REQUIRED and
# TRAINER_STATE. Below 8.4.138 nothing was reviewed, and a release after TESTED is refused until its sources are
# checked. `make test-releases` runs the seam tests and a training under the oldest, a middle and the newest of them.
SUPPORTED = ((8, 4, 138), (8, 4, 191))
RANGE = f"{'.'.join(map(str, SUPPORTED[0]))} to {TESTED}"  # for messages: "8.4.138 to 8.4.190"
REQUIREMENT = f"ultralytics>={'.'.join(map(str, SUPPORTED[0]))},<{'.'.join(map(str, SUPPORTED[1]))}"  # pyproject's
FIX = f"pip install ultralytics=={TESTED}"
UNTESTED_ENV = "YOLOFEED_UNTESTED_ULTRALYTICS"  # "1": another version only warns (for trying a new release)


def check_version(installed: str, allow_untested: bool = False) -> None:
    """Raise unless ``installed`` lies in ``SUPPORTED`` (only warn with ``allow_untested``).

    Raises:
        UltralyticsVersionError: one line: the installed version, the range that works, the fix.
    """
    low, high = SUPPORTED
    if low <= parse_version(installed) < high:
        return
    message = (f"Ultralytics {installed} is installed, but yolofeed works with Ultralytics {RANGE} only (it "
               f"overrides and copies parts of their trainer and loss): {FIX}")
    if not allow_untested:
        raise UltralyticsVersionError(message)
    warnings.warn(f"{message}. {UNTESTED_ENV}=1 is set: going on with an untested Ultralytics", stacklevel=2)


check_version(ultralytics.__version__, allow_untested=os.environ.get(UNTESTED_ENV) == "1")

try:  # every Ultralytics name yolofeed uses, and who uses it; a release that moved one says which, in one line
    import ultralytics.engine.validator as _validator_module  # validation_beside: the bar and timers of __call__
    import ultralytics.utils.tqdm as _tqdm  # progress_bar_drawn (read at call time: tests patch it)
    from ultralytics import YOLO  # train.run, bench.parity: the model a run trains
    from ultralytics.cfg import (  # cli, train.keys, augment.hyp: Ultralytics' keys, defaults and key=value reading
        DEFAULT_CFG_DICT,
        check_cfg,
        get_cfg,
        get_save_dir,  # train.trainer: the run folder, checked before Ultralytics makes it
        parse_key_value_pair,
        smart_value,
    )
    from ultralytics.data import utils as _data_utils  # pack.verify: the module its label rules are copied from
    from ultralytics.data.dataset import YOLODataset  # bench.parity: builds Ultralytics' label caches up front
    from ultralytics.data.utils import (  # pack: which files a split holds and how a sample is checked
        DATASET_KEY_TYPES,  # pack.source: the data yaml's keys' types, as check_det_dataset checks them
        IMG_FORMATS,
        check_det_dataset,
        exif_size,
        get_split_fraction,
        img2label_paths,
    )
    from ultralytics.models.yolo.detect import (
        DetectionTrainer,  # train.trainer, bench.ceiling subclass it
        DetectionValidator,  # train.val_metrics: whose statistics it batches
    )
    from ultralytics.models.yolo.obb import OBBTrainer  # train.tasks: FastOBBTrainer subclasses it
    from ultralytics.models.yolo.pose import PoseTrainer  # train.tasks: FastPoseTrainer subclasses it
    from ultralytics.models.yolo.segment import SegmentationTrainer  # train.tasks: FastSegmentationTrainer
    from ultralytics.nn.autobackend import (
        AutoBackend,  # train.validation: the final validation's model, warmed
        check_class_names,  # pack.source: the data yaml's names, as Ultralytics reads
    )
    from ultralytics.nn.modules.block import (  # train.graphed: layers whose input reaches one convolution
        C2f,
        C3k2,  # a C2f with C2f's forward (HalvesC3k2 subclasses it)
    )
    from ultralytics.nn.modules.conv import Concat, Conv  # train.graphed: FusedConv subclasses Conv
    from ultralytics.nn.modules.head import Detect  # train.graphed: TokenMajorDetect subclasses it
    from ultralytics.nn.tasks import (  # train.keys: a model's task
        DetectionModel,
        guess_model_task,
        torch_safe_load,  # train.run: a .pt read as YOLO() reads it, to check it first
        yaml_model_load,
    )
    from ultralytics.optim import muon as _muon  # train.musgd: the module its copy of muon_update comes from
    from ultralytics.optim.muon import MuSGD, zeropower_via_newtonschulz5  # train.musgd subclasses and calls them
    from ultralytics.utils import (  # paths, config
        DATASETS_DIR,
        DEFAULT_CFG,
        LOCAL_RANK,
        LOGGER,
        RANK,
        SETTINGS,
        VERBOSE,
        YAML,
    )
    from ultralytics.utils.checks import (  # train.run: cfg=; pack.source: data=coco8.yaml; as yolo train finds them
        check_file,
        check_imgsz,  # train_side: the side Ultralytics trains at, and the values it refuses
        check_yaml,
    )
    from ultralytics.utils.downloads import GITHUB_ASSETS_NAMES  # downloads_weights: what Ultralytics fetches by name
    from ultralytics.utils.files import get_latest_run  # train.run: a bare 'resume' takes the newest last.pt here
    from ultralytics.utils.loss import (  # train.loss subclasses them
        BboxLoss,
        E2EDetectLoss,
        E2ELoss,
        KeypointLoss,
        RotatedBboxLoss,
        v8DetectionLoss,
        v8OBBLoss,
        v8PoseLoss,
        v8SegmentationLoss,
    )
    from ultralytics.utils.metrics import bbox_iou, probiou  # train.loss: the box losses' CIoU and ProbIoU
    from ultralytics.utils.ops import (  # pack.verify, train.loss: box formats; loader.val: OBB's as Format makes them
        crop_mask,  # train.loss: the segment loss's crop, on the batched rows
        segments2boxes,
        xywh2xyxy,
        xywhr2xyxyxyxy,
        xyxy2xywh,
        xyxyxyxy2xywhr,
    )

    # pack.verify: Pillow's opener, without the pi-heif auto-install Ultralytics' patched Image.open does (nothing
    # may install or download at run time)
    from ultralytics.utils.patches import _image_open as pil_open
    from ultralytics.utils.patches import imread  # pack.verify: the decoder Ultralytics' datasets use
    from ultralytics.utils.tal import (  # train.loss
        RotatedTaskAlignedAssigner,
        TaskAlignedAssigner,
        bbox2dist,
        make_anchors,
        rbox2dist,
    )
    from ultralytics.utils.torch_utils import (  # train: devices, DDP rank 0 first, the model inside DDP/compile
        EarlyStopping,  # train.trainer: whether early stopping may stop the run (may_stop)
        get_flops,  # measure.profile: a model's forward GFLOPs, as Ultralytics' model summary counts them
        parse_device,
        strip_optimizer,  # train.checkpoints: the final checkpoints, written to a temporary file
        torch_distributed_zero_first,
        unwrap_model,
    )
except ImportError as e:
    raise UltralyticsVersionError(f"Ultralytics {ultralytics.__version__}: {e}; yolofeed works with Ultralytics "
                                  f"{RANGE}: {FIX}") from None

VERSION: str = ultralytics.__version__
RELEASE: Release = parse_version(VERSION)


def since(first: str) -> bool:
    """Whether the installed Ultralytics is ``first`` or later (the seam's only test of a release: each use names
    what changed there)."""
    return RELEASE >= parse_version(first)


# The label rules pack.verify applies: the installed release's (pins.LABEL_RULE_SETS), recorded in every pack it builds
LABEL_RULES: LabelRules = label_rules(RELEASE)

__all__ = [  # the names other modules import from here (the re-exports above and the functions below)
    "checkpoint_states", "could_stop", "end_epoch_late", "epoch_readers", "epoch_end_state", "stop_asked",
    "trainer_ema",
    "check_task", "POSE_SINCE", "VAL_METRICS_SINCE", "VAL_OVERLAP_SINCE", "forget_loss", "overlap_serves",
    "validating_beside", "validator_view", "validation_beside",
    "SEGMENT_LOSS_SINCE", "GRAPH_LAYOUT_SINCE", "C2f", "C3k2",
    "Concat", "Conv", "Detect", "layer_inputs", "v8PoseLoss", "v8SegmentationLoss",
    "probiou", "rbox2dist", "RotatedBboxLoss", "RotatedTaskAlignedAssigner", "v8OBBLoss", "xywhr2xyxyxyxy",
    "xyxyxyxy2xywhr",
    "batched_metrics_serve", "DetectionValidator", "record_image_stats",
    "accumulate_for", "loader_stride", "split_fraction",
    "batches_per_step", "bbox2dist", "bbox_iou", "BboxLoss", "check_cfg", "check_det_dataset", "check_yaml",
    "check_class_names", "checkpoint", "criterion", "crop_mask", "DATASET_KEY_TYPES",
    "data_complete", "data_split", "data_yaml", "DATASETS_DIR", "DEFAULT_CFG", "DEFAULT_CFG_DICT",
    "detection_losses_in", "DetectionModel", "DetectionTrainer", "E2EDetectLoss", "E2ELoss", "exif_size",
    "find_dataset_yaml", "forward_gflops", "get_cfg", "get_latest_run", "get_save_dir",
    "restores_in_place",
    "guess_model_task",
    "downloads_weights", "image_feeds_a_convolution", "img2label_paths", "IMG_FORMATS", "imread", "launches_ranks",
    "LOCAL_RANK", "LOGGER",
    "make_anchors", "make_criterion", "mark_phases", "may_stop", "MuSGD", "OPTIMIZERS", "packaged", "parse_device",
    "parse_key_value_pair", "pil_open", "OBBTrainer", "PoseTrainer", "SegmentationTrainer", "progress_bar_drawn",
    "RANK", "results_csv", "resuming", "run_first",
    "scaled_input", "segments2boxes", "set_criterion", "set_epoch_loss", "smart_value", "start_epoch",
    "step_autocast", "StopTraining", "strip_optimizer", "swap_class",
    "TaskAlignedAssigner", "torch_distributed_zero_first", "torch_safe_load", "train_side", "train_until_stopped",
    "unbounded_epochs", "unwrap_model", "v8DetectionLoss", "validation_loader", "validation_models", "VERSION",
    "weights_dir",
    "world_size",
    "write_checkpoints_as", "xywh2xyxy", "xyxy2xywh", "YAML", "yaml_model_load", "YOLO", "YOLODataset",
    "zeropower_via_newtonschulz5",
    # what yolofeed copied and relies on (copied.py, relied_on.py), and reading the installed source (source.py)
    "COPIED", "normalised_source", "Pinned", "RELIED_ON", "resolve", "Reviewed", "source_hash", "SWAPPED",
    "TRAIN_LOADER_ATTRIBUTES", "VAL_LOADER_ATTRIBUTES",
    # where the releases of the range differ
    "check_ddp", "copy_serves", "LABEL_RULE_SETS", "LABEL_RULES", "label_rules", "label_rules_named", "LabelRules",
    "pair_overlaps", "parse_version", "RELEASE", "Release", "since", "UNRECORDED_LABEL_RULES",
]


# -- what must be there ------------------------------------------------------------------------------------------
# (owner, attribute, what yolofeed does with it). Checked at import: a release that renamed one fails here, in one
# line, instead of training with the override silently ignored.
REQUIRED: tuple[tuple[type, str, str], ...] = (
    (DetectionTrainer, "_close_dataloader_mosaic", "yolofeed overrides it to close mosaic in its GPU augmentation "
                                                   "(without it mosaic would stay on for the whole run)"),
    (DetectionTrainer, "_do_train", "yolofeed wraps Ultralytics' training loop to name the checkpoint that resumes "
                                    "a failed run"),
    (DetectionTrainer, "check_resume", "yolofeed checks the final training arguments there, before anything is "
                                       "built"),
    (DetectionTrainer, "get_dataloader", "yolofeed returns its pack loaders from it"),
    (DetectionTrainer, "preprocess_batch", "yolofeed augments there when it does not augment ahead, "
                                         "and hands it an image already scaled with half_input"),
    (DetectionTrainer, "optimizer_step", "the monitor marks the optimiser phase where it is entered"),
    (DetectionTrainer, "plot_training_labels", "yolofeed draws the labels plot in a thread beside its warm-up "
                                               "(train/plots.py), joined at on_pretrain_routine_end"),
    (DetectionTrainer, "plot_metrics", "yolofeed waits there for results.png, drawn beside the final validation by "
                                       "plot_results (train/plots.py), or draws it as stock"),
    (DetectionTrainer, "plot_training_samples", "half_input hands it stock's float32 image of the batch"),
    (DetectionModel, "init_criterion", "the sync-free step wraps the criterion it makes"),
    (DetectionModel, "predict", "the graphed step overrides it (train/graphed.py) and calls it"),
    (Conv, "forward", "FusedConv overrides it (train/graphed.py) and calls it"),
    (Detect, "forward_head", "TokenMajorDetect overrides it (train/graphed.py) and calls it"),
    (v8DetectionLoss, "get_assigned_targets_and_loss", "the sync-free loss overrides it (COPIED)"),
    (v8DetectionLoss, "preprocess", "the sync-free loss copies it (COPIED)"),
    (v8DetectionLoss, "bbox_decode", "the sync-free loss calls it"),
    (v8PoseLoss, "loss", "the sync-free pose loss overrides it (COPIED)"),
    (v8PoseLoss, "calculate_keypoints_loss", "the sync-free pose loss copies it (COPIED)"),
    (v8PoseLoss, "kpts_decode", "the sync-free pose loss overrides it (COPIED)"),
    (KeypointLoss, "forward", "the sync-free pose loss copies it (COPIED)"),
    (TaskAlignedAssigner, "select_candidates_in_gts", "the sync-free assigner overrides it (COPIED)"),
    (TaskAlignedAssigner, "get_box_metrics", "the sync-free assigner overrides it (COPIED)"),
    (TaskAlignedAssigner, "_forward", "the sync-free assigner overrides it (COPIED)"),
    (TaskAlignedAssigner, "get_targets", "the sync-free assigner copies it (COPIED)"),
    # 8.4.180 moved get_box_metrics' overlaps into pair_overlaps; before, it called iou_calculation itself
    (TaskAlignedAssigner, "pair_overlaps" if since("8.4.180") else "iou_calculation",
     "the sync-free assigner calls it (seam.pair_overlaps)"),
    (BboxLoss, "forward", "the sync-free box loss overrides it (COPIED)"),
    (v8OBBLoss, "loss", "the sync-free OBB loss overrides it (COPIED)"),
    (v8OBBLoss, "preprocess", "the sync-free OBB loss copies it (COPIED)"),
    (v8OBBLoss, "calculate_angle_loss", "the sync-free OBB loss copies it (COPIED)"),
    (v8OBBLoss, "bbox_decode", "the sync-free OBB loss calls it"),
    (RotatedBboxLoss, "forward", "the sync-free rotated box loss overrides it (COPIED)"),
    (RotatedTaskAlignedAssigner, "select_candidates_in_gts", "the sync-free rotated assigner overrides it (COPIED)"),
    (RotatedTaskAlignedAssigner, "get_box_metrics", "the sync-free rotated assigner overrides it (as the assigner's)"),
    (RotatedTaskAlignedAssigner, "_forward", "the sync-free rotated assigner overrides it (as the assigner's)"),
    (RotatedTaskAlignedAssigner, "iou_calculation", "the sync-free rotated assigner's overlaps call it"),
    (MuSGD, "step", "FastMuSGD copies it (COPIED) and steps instead of it"),
    (_muon, "muon_update", "train/musgd.py copies it (COPIED)"),
    (_data_utils, "verify_image_label", "pack/verify.py copies its label rules (COPIED)"),
    (_data_utils, "check_image", "pack/verify.py copies its image rules (COPIED)"),
    (DetectionTrainer, "build_optimizer", "yolofeed's trainer makes the MuSGD it builds a FastMuSGD"),
    (DetectionTrainer, "validate", "yolofeed's trainer skips it between val_period epochs (without it: every epoch)"),
    (DetectionTrainer, "save_model", "yolofeed's trainer makes its checkpoint writes atomic around it"),
    (DetectionTrainer, "final_eval", "yolofeed's trainer copies it (COPIED) to strip the final checkpoints atomically"),
    (DetectionTrainer, "get_validator", "yolofeed's trainer batches its validator's statistics (train/val_metrics.py)"),
    (DetectionValidator, "update_metrics", "the batched validator overrides it and falls back to it"),
    (DetectionTrainer, "resume_training", "yolofeed's trainer drops the results.csv rows of epochs the resumed run "
                                          "trains again (train/checkpoints.py::trim_results)"),
    (DetectionTrainer, "save_metrics", "val_overlap holds an overlapped epoch's results.csv row until its validation "
                                       "ends (train/overlap.py)"),
    (DetectionTrainer, "run_callbacks", "val_overlap holds an overlapped epoch's on_model_save and on_fit_epoch_end "
                                        "until its validation ends"),
    (_validator_module, "TQDM", "val_overlap hides the bar of a validation run beside the training (its __call__ "
                                "draws it with this name)"),
    (_validator_module, "Profile", "val_overlap narrows the device syncs of a validation run beside the training to "
                                   "its stream (its __call__ times each phase with this name)"),
)
if since(SEGMENT_LOSS_SINCE):  # the sync-free segment loss serves from there (train/loss/install.py::install)
    REQUIRED += ((v8SegmentationLoss, "loss", "the sync-free segment loss overrides it (COPIED)"),
                 (v8SegmentationLoss, "calculate_segmentation_loss", "the sync-free segment loss copies it (COPIED)"),
                 (v8SegmentationLoss, "single_mask_loss", "the sync-free segment loss calls it per image"))
if since(POSE_SINCE):  # pose is served from 8.4.183 (check_task); older releases have no _batch_keypoints
    REQUIRED += ((v8PoseLoss, "_batch_keypoints", "the sync-free pose loss copies it (COPIED)"),)


def _missing(what: str, why: str) -> UltralyticsError:
    return UltralyticsError(f"Ultralytics {VERSION} has no {what}, which {why}; yolofeed works with Ultralytics "
                            f"{RANGE}: {FIX}")


def check_required(required: tuple[tuple[Any, str, str], ...] = REQUIRED) -> None:
    """Raise on the first attribute of ``required`` that the installed Ultralytics lacks.

    Raises:
        UltralyticsVersionError: one line naming the attribute, what yolofeed does with it, and the version that works.
    """
    for owner, name, why in required:
        if not hasattr(owner, name):
            raise UltralyticsVersionError(str(_missing(f"{owner.__name__.rsplit('.', 1)[-1]}.{name}", why)))


check_required()


# -- the trainer's state -------------------------------------------------------------------------------------------
# Attributes of a trainer that Ultralytics sets in its methods (not on the class, so REQUIRED cannot see them) and
# yolofeed reads: (the class that sets them, what yolofeed does with it). Checked at import in the installed source:
# an attribute no method of that class (or an Ultralytics base of it) assigns any more fails in one line. yolofeed
# reads each through the function below that names it.
TRAINER_STATE: dict[str, tuple[type, str]] = {
    "last": (DetectionTrainer, "yolofeed names it as the checkpoint a stopped run resumes from and strips it "
                               "atomically at the end"),
    "best": (DetectionTrainer, "yolofeed strips it atomically at the end and validates it"),
    "wdir": (DetectionTrainer, "yolofeed removes the temporary files of a killed checkpoint writer there"),
    "start_epoch": (DetectionTrainer, "yolofeed's warm-up loads the first batches of the epoch training starts at "
                                      "(not 0 after a resume)"),
    "amp": (DetectionTrainer, "yolofeed's warm-up runs under the step's autocast"),
    "ema": (DetectionTrainer, "yolofeed's validation thread warms copies of the models validated from it"),
    "accumulate": (DetectionTrainer, "yolofeed's validation thread starts its set-up once the optimiser has stepped "
                                     "twice (FastMuSGD's capture)"),
    "test_loader": (DetectionTrainer, "yolofeed's validation thread sets up cuDNN for its batches' shapes"),
    "world_size": (DetectionTrainer, "yolofeed's train loader shards the pack by it under DDP"),
    "stopper": (DetectionTrainer, "yolofeed validates wherever early stopping may stop the run"),
    "stop": (DetectionTrainer, "yolofeed validates wherever the run is about to stop"),
    "possible_stop": (EarlyStopping, "yolofeed validates wherever early stopping may stop the run"),
    "best_epoch": (EarlyStopping, "val_overlap validates in the training thread wherever early stopping could stop "
                                  "the run"),
    "patience": (EarlyStopping, "val_overlap validates in the training thread wherever early stopping could stop "
                                "the run"),
    "tloss": (DetectionTrainer, "val_overlap writes an epoch's row late, with that epoch's mean losses"),
    "loss": (DetectionTrainer, "val_overlap's fitness without a validator's is the epoch's last loss, as stock's"),
    "loss_items": (DetectionTrainer, "val_overlap validates an epoch beside the next with that epoch's loss items"),
    "lr": (DetectionTrainer, "val_overlap writes an epoch's row late, with that epoch's learning rates"),
    "epoch_time": (DetectionTrainer, "val_overlap runs an epoch's on_fit_epoch_end late, with that epoch's time"),
    "train_time_start": (DetectionTrainer, "val_overlap writes an epoch's row late, its time column when its "
                                           "validation ended"),
    "scaler": (DetectionTrainer, "val_overlap writes an epoch's checkpoints late, with that epoch's scaler state"),
    "resume": (DetectionTrainer, "yolofeed restores a resumed run's options and drops the results.csv rows of epochs "
                                 "it trains again"),
    "csv": (DetectionTrainer, "yolofeed draws results.png from it beside the final validation, and drops from it the "
                              "rows of epochs a resumed run trains again"),
}


def check_trainer_state(state: dict[str, tuple[type, str]] = TRAINER_STATE) -> None:
    """Raise on the first attribute of ``state`` that no method of its class assigns in the installed source.

    Raises:
        UltralyticsVersionError: one line naming the attribute, what yolofeed does with it, and the range that works.
    """
    assigned: dict[type, set[str]] = {}
    for cls, _ in state.values():
        if cls not in assigned:
            try:
                assigned[cls] = source.assigned_attributes(cls)
            except (OSError, TypeError):  # no source to read (compiled): the readers below still fail in one line
                assigned[cls] = set(state)
    source.clear_cache()
    for name, (cls, why) in state.items():
        if name not in assigned[cls]:
            raise UltralyticsVersionError(str(_missing(f"{cls.__name__}.{name}", why)))


check_trainer_state()


def _state(obj: Any, name: str, where: str = "trainer") -> Any:
    """``obj.<name>`` (an attribute of ``TRAINER_STATE``), or one line saying which is missing and why it matters.

    Raises:
        UltralyticsError: the object has no such attribute (yet: Ultralytics sets some during set-up).
    """
    try:
        return getattr(obj, name)
    except AttributeError:
        raise _missing(f"{where}.{name}", TRAINER_STATE[name][1]) from None


def checkpoint(trainer: Any, which: str) -> Any:
    """The path of the trainer's ``"last"`` or ``"best"`` checkpoint (``BaseTrainer.__init__``: ``wdir / last.pt``,
    ``wdir / best.pt``; a ``Path`` until ``write_checkpoints_as`` swaps its class)."""
    if which not in ("last", "best"):
        raise ValueError(f"which={which!r}: expected 'last' or 'best'")
    return _state(trainer, which)


def resuming(trainer: Any) -> bool:
    """Whether the trainer resumes a run (``BaseTrainer.check_resume`` sets ``resume``)."""
    return bool(_state(trainer, "resume"))


def results_csv(trainer: Any) -> Path:
    """The run's results.csv (``BaseTrainer.csv``), one row an epoch, appended by ``save_metrics``."""
    return Path(_state(trainer, "csv"))


def weights_dir(trainer: Any) -> Any:
    """The folder the trainer writes its checkpoints in (``BaseTrainer.wdir``, ``<save_dir>/weights``)."""
    return _state(trainer, "wdir")


def start_epoch(trainer: Any) -> int:
    """The epoch training starts at: 0, or the one after a resumed checkpoint's (``resume_training``)."""
    return int(_state(trainer, "start_epoch"))


def step_autocast(trainer: Any) -> Any:
    """What the training step autocasts to, as ``BaseTrainer._do_train`` (RELIED_ON) passes it to ``autocast``:
    ``torch.bfloat16`` under ``amp=bf16``, else ``trainer.amp`` (a bool, set by ``_setup_train``)."""
    return torch.bfloat16 if trainer.args.amp == "bf16" else _state(trainer, "amp")


# BaseTrainer.build_optimizer's names (matched without case); any other raises NotImplementedError after the model is
# built. tests/test_seam.py reads them from the installed source.
OPTIMIZERS = ("Adam", "Adamax", "AdamW", "NAdam", "RAdam", "RMSprop", "SGD", "MuSGD", "auto")


class _QuietHere(logging.Filter):
    """Drops the records of the thread that made it (``check_imgsz``'s warnings, which the run makes again itself)."""

    def __init__(self):
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


def train_side(imgsz: Any, stride: int = 32) -> int:
    """The square side Ultralytics trains at: ``_setup_train``'s ``check_imgsz(imgsz, stride, floor=stride,
    max_dim=1)`` (the largest of a list, rounded up to a multiple of the model's stride, at least one stride), its
    warnings left out in this thread. Every detection model's stride is 32, a P6 model's 64.

    Raises:
        ValueError: a value ``check_imgsz`` refuses (Ultralytics raises it after the model and data are built), in
            its words.
    """
    quiet = _QuietHere()
    LOGGER.addFilter(quiet)
    try:
        side = check_imgsz(imgsz, stride, floor=stride, max_dim=1)
    except (TypeError, ValueError, ArithmeticError) as e:
        raise ValueError(" ".join(str(e).split())) from None
    finally:
        LOGGER.removeFilter(quiet)
    if not isinstance(side, int):  # an empty list
        raise ValueError(f"imgsz={imgsz} is not a valid image size")
    return side


def downloads_weights(name: str) -> bool:
    """Whether Ultralytics' ``attempt_download_asset`` may find or fetch ``name`` where no file is: a URL, an asset
    name of its releases (a path ending in yolo11n.pt is downloaded there; a yolov5 or yolov3 name is first renamed
    to its u version), or a name in its weights folder. Any other missing .pt it looks up on GitHub (two requests,
    YOLO_OFFLINE set too) before it fails."""
    text = str(name).strip()
    return (text.lower().startswith(("http:/", "https:/")) or Path(text).name in GITHUB_ASSETS_NAMES
            or "yolov5" in text or "yolov3" in text or (Path(SETTINGS["weights_dir"]) / text).exists())


def scaled_input(img: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Ultralytics' training input, ``img.float() / 255`` (``DetectionTrainer.preprocess_batch``, RELIED_ON), made
    straight in ``dtype``, as the step's first convolution receives it when it autocasts to ``dtype``: one kernel
    from ``img`` (uint8, or float in [0, 255]), where stock writes a float32 copy, divides it into another and casts
    that (at batch 128 and 640 px, 2.5 GB more read and written a step). The division is float32's, rounded once to
    ``dtype`` on the store, as the autocast's cast rounds it: the same values (tests/test_step_input.py)."""
    return torch.div(img, 255, out=torch.empty(img.shape, dtype=dtype, device=img.device))


def image_feeds_a_convolution(model: Any) -> bool:
    """Whether the model's first layer is Ultralytics' ``Conv`` and takes the image alone (``m.f == -1``; the image is
    not kept for a later layer: ``DetectionModel._predict_once``), so that the first thing done to the image under
    autocast is the convolution's cast of it."""
    layers = getattr(unwrap_model(model), "model", None)
    first = layers[0] if isinstance(layers, torch.nn.Sequential) and len(layers) else None
    return isinstance(first, Conv) and getattr(first, "f", None) == -1


def layer_inputs(model: Any) -> dict[int, list[torch.nn.Module]]:
    """For each layer of the model's ``model`` (its ``Sequential``), by index, the layers that take its output, as
    ``BaseModel._predict_once`` (RELIED_ON) routes them: ``f`` names the layers a layer takes, -1 (or any negative
    index) counting back from the layer itself (the first layer's -1 is the image). The last layer's output is the
    model's: nothing takes it here."""
    layers = list(unwrap_model(model).model)
    takers: dict[int, list[torch.nn.Module]] = {i: [] for i in range(len(layers))}
    for j, m in enumerate(layers):
        for f in ([m.f] if isinstance(m.f, int) else m.f):
            if j + f >= 0 or f >= 0:
                takers[j + f if f < 0 else f].append(m)
    return takers


def validation_models(trainer: Any) -> list[tuple[Any, torch.dtype | None, torch.dtype, bool]]:
    """Copies of the models Ultralytics' validations run, set up as ``BaseValidator.__call__`` (RELIED_ON) sets them
    up, for a blank forward pass at each shape they will meet: each (model, autocast dtype or None, input dtype,
    whether it first runs at batch 1), every epoch's first, the final validation's second. Made from the EMA, so call
    it once the EMA exists (``on_pretrain_routine_end``).

    * every epoch's validation: the EMA, float32 in eval mode and in the training model's layout, under float16
      autocast with ``amp`` (every release of the range), on half inputs;
    * the final validation's: best.pt (the EMA's weights) through ``AutoBackend``: fused, in half precision with
      ``amp``, in the layout ``channels_last`` asks for (contiguous on CUDA by default), warmed at batch 1 first.

    Only cuDNN's per-shape set-up is wanted from them: what the passes compute is thrown away.
    """
    import copy

    amp = trainer.device.type != "cpu" and bool(_state(trainer, "amp"))
    ema = _state(trainer, "ema").ema
    half = torch.float16 if amp else torch.float32
    epoch = copy.deepcopy(ema).float().eval()
    final = AutoBackend(model=copy.deepcopy(ema), device=trainer.device, fp16=amp, fuse=True,
                        channels_last=trainer.args.channels_last, verbose=False)
    return [(epoch, torch.float16 if amp else None, half, False), (final, None, half, True)]


def loader_stride(model: Any) -> int:
    """The stride ``DetectionTrainer.build_dataset`` gives the loaders: the model's largest, at least 32 (32 before a
    model is built)."""
    return max(int(unwrap_model(model).stride.max()), 32) if model is not None else 32


def batches_per_step(trainer: Any) -> int:
    """The batches whose gradients the optimiser steps on at most (``BaseTrainer.accumulate``, ``nbs / batch``; fewer
    in the warm-up epochs)."""
    return max(int(_state(trainer, "accumulate")), 1)


def validation_loader(trainer: Any) -> Any:
    """The loader every validation of the run reads (``BaseTrainer.test_loader``)."""
    return _state(trainer, "test_loader")


def world_size(trainer: Any) -> int:
    """The number of DDP ranks (``BaseTrainer.world_size``: 0 on the CPU, 1 on one GPU)."""
    return int(_state(trainer, "world_size"))


def may_stop(trainer: Any) -> bool:
    """Whether this epoch may end the run early: Ultralytics' early stopping may stop it after this epoch's validation
    (``EarlyStopping.possible_stop``) or the run is stopping (``BaseTrainer.stop``: a ``time=`` limit, early stopping
    on another rank)."""
    return bool(_state(_state(trainer, "stopper"), "possible_stop", "trainer.stopper") or _state(trainer, "stop"))


def could_stop(trainer: Any) -> bool:
    """Whether this epoch's validation may end the run: ``may_stop``, or early stopping would stop after this epoch
    if its fitness does not improve (``EarlyStopping.__call__``, RELIED_ON: it stops once the epochs since the best
    reach ``patience``; with ``val_period`` the epochs between two validations count too, which ``possible_stop``, set
    at the last validation for the next epoch, does not see)."""
    stopper = _state(trainer, "stopper")
    since_best = trainer.epoch + 1 - _state(stopper, "best_epoch", "trainer.stopper")
    return may_stop(trainer) or since_best >= _state(stopper, "patience", "trainer.stopper")


def trainer_ema(trainer: Any) -> Any:
    """The trainer's ``ModelEMA`` (``BaseTrainer.ema``: its ``ema`` model and its ``updates``)."""
    return _state(trainer, "ema")


def stop_asked(trainer: Any) -> bool:
    """Whether the run stops after this epoch (``BaseTrainer.stop``: early stopping, ``time=``, a callback)."""
    return bool(_state(trainer, "stop"))


def epoch_end_state(trainer: Any) -> dict[str, Any]:
    """What ``BaseTrainer._do_train``'s epoch end reads of the trainer besides the EMA, as it is now: the epoch and the
    epochs, the epoch's mean losses (``tloss``), the last step's loss and loss items, the learning rates (``lr``)."""
    ema = _state(trainer, "ema")
    return {"epoch": trainer.epoch, "epochs": trainer.epochs, "tloss": _state(trainer, "tloss"),
            "loss": _state(trainer, "loss"), "loss_items": _state(trainer, "loss_items"), "lr": _state(trainer, "lr"),
            "updates": ema.updates}


def forget_loss(trainer: Any) -> None:
    """The trainer's last loss set to None, for an epoch whose training is not kept: Ultralytics' NaN recovery, which
    reads it after the validation (``_handle_nan_recovery``, RELIED_ON), then has nothing of it to recover from."""
    _state(trainer, "loss")
    trainer.loss = None


def overlap_serves() -> bool:
    """Whether an epoch's validation can run beside the next one under the installed release (``VAL_OVERLAP_SINCE``)."""
    return since(VAL_OVERLAP_SINCE)


def checkpoint_states(trainer: Any) -> tuple[dict, dict]:
    """The optimiser's and the scaler's state dicts, as ``BaseTrainer.save_model`` serialises them."""
    return trainer.optimizer.state_dict(), _state(trainer, "scaler").state_dict()


# -- an epoch validated beside the next, and ended late (train/overlap.py) -------------------------------------------
_beside = threading.local()  # validation_beside's flag, one a thread
# Ultralytics' own, which _validator_bar and _validator_profile wrap. validation_beside leaves the wrappers in the
# validator module, so a second import of this module (a test's fresh import) takes the originals from them.
_STOCK_BAR = getattr(_validator_module.TQDM, "yolofeed_stock", _validator_module.TQDM)
_STOCK_PROFILE = getattr(_validator_module.Profile, "yolofeed_stock", _validator_module.Profile)


def _validator_bar(*args: Any, **kwargs: Any) -> Any:
    """Ultralytics' TQDM, as ``BaseValidator.__call__`` makes its bar; not drawn in a thread validating beside."""
    if getattr(_beside, "on", False):
        kwargs["disable"] = True
    return _STOCK_BAR(*args, **kwargs)


class _StreamProfile(_STOCK_PROFILE):
    """Ultralytics' ``Profile``, its sync before each clock read narrowed from the device to this thread's CUDA
    stream: the phases of a validation beside the training are timed on its own work (``Profile.time`` syncs every
    stream of the device: 8 times a batch, each waiting for the training's queued steps)."""

    def time(self) -> float:
        if getattr(self, "accelerator", None) is torch.cuda:
            torch.cuda.current_stream(self.device).synchronize()
            return time.perf_counter()
        return super().time()


def _validator_profile(*args: Any, **kwargs: Any) -> Any:
    """Ultralytics' Profile, as ``BaseValidator.__call__`` makes its timers; ``_StreamProfile`` in a thread validating
    beside."""
    return (_StreamProfile if getattr(_beside, "on", False) else _STOCK_PROFILE)(*args, **kwargs)


_validator_bar.yolofeed_stock, _validator_profile.yolofeed_stock = _STOCK_BAR, _STOCK_PROFILE


@contextlib.contextmanager
def validation_beside():
    """In this thread, meanwhile: a validator's progress bar is not drawn, and its timers sync this thread's CUDA
    stream, not the device (``BaseValidator.__call__`` makes both with its module's ``TQDM`` and ``Profile``, which
    this wraps; other threads' validations are as before)."""
    _validator_module.TQDM, _validator_module.Profile = _validator_bar, _validator_profile
    _beside.on = True
    try:
        yield
    finally:
        _beside.on = False


class _ValidatorView:
    """The trainer as a training validation reads it (``BaseValidator.__call__`` and ``get_model``, RELIED_ON: the EMA,
    the epoch and epochs, the loss items, early stopping's ``possible_stop``), with an epoch's snapshot's values;
    anything else is the trainer's (its device, data, amp, arguments, world size, ``label_loss_items``), which the
    training does not change."""

    def __init__(self, trainer: Any, snapshot: Any):
        self._trainer = trainer
        self.ema = _SnapshotEma(snapshot.model, snapshot.updates)
        self.epoch, self.epochs = snapshot.epoch, snapshot.epochs
        self.loss_items, self.loss, self.tloss = snapshot.loss_items, snapshot.loss, snapshot.tloss
        self.stopper = _NoStop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)


class _SnapshotEma:
    def __init__(self, ema: Any, updates: int):
        self.ema, self.updates = ema, updates


class _NoStop:
    possible_stop = False  # an epoch validated beside the next is one early stopping cannot end the run after


def validating_beside() -> bool:
    """Whether this thread is in ``validation_beside``."""
    return getattr(_beside, "on", False)


def validator_view(trainer: Any, snapshot: Any) -> Any:
    """What a validation of ``snapshot``'s epoch (``train.overlap.Snapshot``) run beside the training takes for the
    trainer (``_ValidatorView``)."""
    return _ValidatorView(trainer, snapshot)


@contextlib.contextmanager
def _epoch_state(trainer: Any, snapshot: Any, ended: float):
    """Epoch ``snapshot.epoch``'s end state on the trainer meanwhile (``train.overlap.Snapshot``): its epoch, losses,
    learning rates, epoch time and EMA, the optimiser's and the scaler's state dicts as ``save_model`` reads them, and a
    start time that makes ``save_metrics``' time column ``ended`` (when the validation ended). All put back after."""
    ema = _state(trainer, "ema")
    names = ("epoch", "tloss", "loss", "loss_items", "lr", "epoch_time", "train_time_start")
    saved = {name: getattr(trainer, name, None) for name in names}
    saved_ema = ema.ema, ema.updates
    trainer.epoch, trainer.tloss, trainer.loss = snapshot.epoch, snapshot.tloss, snapshot.loss
    trainer.loss_items, trainer.lr, trainer.epoch_time = snapshot.loss_items, snapshot.lr, snapshot.epoch_time
    trainer.train_time_start = saved["train_time_start"] + (time.time() - ended)
    ema.ema, ema.updates = snapshot.model, snapshot.updates
    states = [(owner, state) for owner, state in ((trainer.optimizer, snapshot.optimizer),
                                                  (_state(trainer, "scaler"), snapshot.scaler)) if state is not None]
    for owner, state in states:  # an instance attribute over the method, until the finally
        owner.state_dict = lambda state=state: state
    try:
        yield
    finally:
        for owner, _ in states:
            del owner.state_dict
        ema.ema, ema.updates = saved_ema
        for name, value in saved.items():
            setattr(trainer, name, value)


def end_epoch_late(trainer: Any, snapshot: Any, metrics: dict, ended: float) -> None:
    """End epoch ``snapshot.epoch`` as ``BaseTrainer._do_train`` (RELIED_ON) ends an epoch after its validation, with
    that epoch's state put back (``_epoch_state``), once its validation, run beside the next epoch, returned
    ``metrics``: the fitness and the best fitness (``BaseTrainer.validate``'s rule, RELIED_ON), the results.csv row
    (``save_metrics``), early stopping's check, the checkpoints and ``on_model_save`` (with ``save``), then
    ``on_fit_epoch_end``. Never the last epoch (``final_epoch`` is False); NaN recovery is not run (the loss and the
    EMA were finite: ``train.overlap.reason_not``). The trainer keeps the metrics, the fitness and early stopping's
    state this sets: they are the newest validation's."""
    with _epoch_state(trainer, snapshot, ended):
        fitness = metrics.pop("fitness", -trainer.loss.detach().cpu().numpy())
        if trainer.best_fitness is None or trainer.best_fitness < fitness:
            trainer.best_fitness = fitness
        trainer.metrics, trainer.fitness = metrics, fitness
        trainer.save_metrics(metrics={**trainer.label_loss_items(trainer.tloss), **trainer.metrics, **trainer.lr})
        trainer.stop |= trainer.stopper(trainer.epoch + 1, trainer.fitness)
        if trainer.args.save and trainer.save_model():
            trainer.run_callbacks("on_model_save")
        trainer.run_callbacks("on_fit_epoch_end")


# -- where releases of the range differ -----------------------------------------------------------------------------
# Each function here is the one place a difference between releases reaches yolofeed's code (the ``Reviewed`` entry
# of the method in relied_on.py says why); the label rules are LABEL_RULES, above.
def accumulate_for(trainer: Any, batch: int, batches: int) -> int:
    """The ``accumulate`` ``BaseTrainer._build_train_pipeline`` sets for a batch size once its train loader of
    ``batches`` batches is built: ``round(nbs / batch)``, at least 1; from 8.4.177, at most the run's batches
    (``batches x epochs``) unless ``time=`` is set."""
    n = max(round(trainer.args.nbs / batch), 1)
    if since("8.4.177") and not trainer.args.time:
        n = min(n, batches * trainer.epochs)
    return n


def split_fraction(args: Any, mode: str) -> float | int:
    """The ``fraction`` ``build_yolo_dataset`` gives a split's dataset: ``fraction=`` for the training split; for the
    validation loader, its entry for ``args.split`` (from 8.4.159; before, for ``mode``, "val")."""
    return get_split_fraction(args.fraction, "train" if mode == "train" else args.split if since("8.4.159") else mode)


def pair_overlaps(assigner: Any, indices: tuple, gt_bboxes: torch.Tensor, pd_bboxes: torch.Tensor) -> torch.Tensor:
    """``TaskAlignedAssigner.get_box_metrics``' overlaps of the candidate (image, box, anchor) pairs ``indices``: its
    ``pair_overlaps`` (8.4.180 on), or what it computed inline before (``iou_calculation`` of the gathered boxes).

    Shape:
        indices: three (N,) index tensors; gt_bboxes: (B, K, 4); pd_bboxes: (B, A, 4); returns (N,).
    """
    if since("8.4.180"):
        return assigner.pair_overlaps(indices, gt_bboxes, pd_bboxes)
    return assigner.iou_calculation(gt_bboxes[indices[:2]], pd_bboxes[indices[0], indices[2]])


def copy_serves(ultralytics_name: str) -> bool:
    """Whether yolofeed's copy of a COPIED method is the installed release's code; False where the release's code
    differs in what the copy does (a ``Reviewed`` with ``stock``): yolofeed takes Ultralytics' own path there."""
    pinned = next(p for p in COPIED if p.ultralytics == ultralytics_name)
    reviewed = pinned.reviewed(RELEASE)
    return reviewed is None or not reviewed.stock


def check_task(task: str) -> None:
    """Raise where the installed release is older than the rules yolofeed follows for ``task`` (pose: ``POSE_SINCE``).

    Raises:
        UltralyticsError: one line: the release installed, the one needed, the fix.
    """
    if task == "pose" and RELEASE < parse_version(POSE_SINCE):
        raise UltralyticsError(f"task=pose: yolofeed follows the pose label rules of Ultralytics {POSE_SINCE} on, and "
                               f"{VERSION} is installed (it reads pose labels and its label cache otherwise); {FIX} "
                               "(detection trains under every release of the range)")


def check_ddp() -> None:
    """Raise where the installed release cannot start DDP ranks of yolofeed's trainer (called for several devices).

    Before 8.4.140 ``generate_ddp_file`` has the ranks import the trainer class by module and name and build it
    without the launcher's callbacks: ``with_options``' options (pack_dir, ...) and the monitor's report would not
    reach them (RELIED_ON says what yolofeed relies on there).

    Raises:
        UltralyticsError: one line: why, and the two ways out.
    """
    if not since("8.4.140"):
        raise UltralyticsError(f"Ultralytics {VERSION} starts multi-GPU (DDP) ranks from the trainer's class name "
                               "alone, without yolofeed's options and callbacks (8.4.140 pickles them along): train "
                               f"on one GPU (device=0), or {FIX}")


# -- the data yaml ---------------------------------------------------------------------------------------------------
def find_dataset_yaml(data: str | os.PathLike) -> str | None:
    """The data yaml ``check_det_dataset`` reads for ``data=``: the file itself, else one of the dataset yamls
    Ultralytics ships (``cfg/datasets``), by name (``coco8.yaml``, or a bare ``coco8``), as ``yolo train`` finds them;
    None when there is none. Never downloads: a URL is None (``check_file`` would fetch it)."""
    name = str(data).strip()
    if not name or "://" in name:
        return None
    if os.path.exists(name):
        return name
    suffix = os.path.splitext(name)[1].lower()
    for candidate in [name] if suffix in (".yaml", ".yml") else [f"{name}.yaml", f"{name}.yml"]:
        found = check_file(candidate, download=False, hard=False)  # a search of Ultralytics' package folder
        if found:
            return str(found)
    return None


def restores_in_place(path: str | os.PathLike) -> bool:
    """Whether Ultralytics' label check can rewrite this JPEG with trailing bytes where it lies (it restores one so):
    from 8.4.167 it writes a temporary file beside it and renames it over (``_replace_image``: the folder must take
    writes), before it opened the file itself for writing. Where it cannot, it skips the image as corrupt."""
    if since("8.4.167"):
        return os.access(os.path.dirname(os.path.abspath(path)), os.W_OK | os.X_OK)
    return os.access(path, os.W_OK)


def packaged(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies inside the installed Ultralytics package (a dataset yaml found by name there)."""
    root = os.path.dirname(os.path.realpath(ultralytics.__file__))
    return os.path.realpath(path).startswith(root + os.sep)


# -- the trainer's data ----------------------------------------------------------------------------------------------
def data_yaml(trainer: Any) -> str:
    """The data yaml's path: ``check_det_dataset`` keeps it under ``trainer.data["yaml_file"]``.

    Raises:
        UltralyticsError: the key is gone (packs are built beside the data yaml and keyed by it).
    """
    try:
        return trainer.data["yaml_file"]
    except (KeyError, TypeError, AttributeError):
        raise _missing('trainer.data["yaml_file"]', "yolofeed builds and finds its packs by") from None


def data_split(trainer: Any, dataset_path: Any) -> str | None:
    """Which split of ``trainer.data`` (``check_det_dataset``'s dict) ``get_dataloader`` was given, or None."""
    return next((k for k in ("train", "val", "test", "minival") if trainer.data.get(k) == dataset_path), None)


def data_complete(trainer: Any) -> bool:
    """``trainer.data["complete"]``: a dataset already cut to ``fraction`` when downloaded (``build_yolo_dataset``
    then uses all of it)."""
    return bool(trainer.data.get("complete"))


# -- the training loop ---------------------------------------------------------------------------------------------
def run_first(trainer: Any, event: str, fn: Callable[[Any], None]) -> None:
    """Run ``fn`` before the callbacks already registered for ``event``, Ultralytics' loggers included.

    ``BaseTrainer.callbacks`` is ``{event: [fn, ...]}``, run in order; ``add_callback`` appends.
    """
    callbacks = getattr(trainer, "callbacks", None)
    if not isinstance(callbacks, dict):
        raise _missing("trainer.callbacks (a dict of lists)", "yolofeed orders its callbacks in")
    callbacks.setdefault(event, []).insert(0, fn)


# the events an epoch validated beside the next runs an epoch late (``end_epoch_late``), and the one at which the next
# epoch's losses reach the callbacks meanwhile
LATE_EVENTS = ("on_train_epoch_end", "on_fit_epoch_end", "on_model_save")


def _idle(module: str, trainer: Any) -> bool:
    """Whether an Ultralytics callback of ``module`` does nothing in this run, as each release of the range reads
    (tests/test_seam.py calls them under each): base's are empty; Platform's return at once while ``trainer.platform``
    is unset, which it is without an API key; Ray Tune's (where ray is installed) report only inside a Tune trial."""
    name = module.removeprefix("ultralytics.utils.callbacks.")
    if name == "base":
        return True
    if name == "platform":
        return not getattr(trainer, "platform", None)
    if name == "raytune":
        tune = getattr(sys.modules.get(module), "tune", None)
        try:
            return tune is None or not tune.get_context().get_trial_id()
        except Exception:  # noqa: BLE001 - a Ray that answers otherwise: counted as a reader, the safe side
            return False
    return False


def epoch_readers(trainer: Any) -> list[str]:
    """The callbacks at an epoch's end (``LATE_EVENTS``) that act as it ends, each as ``module.function``: every
    one but Ultralytics' idle ones (``_idle``) and yolofeed's own. Ultralytics' loggers (Weights & Biases, MLflow,
    DVC, ...) are among them where installed and enabled in its settings, and any a user added."""
    callbacks = getattr(trainer, "callbacks", None)
    if not isinstance(callbacks, dict):
        raise _missing("trainer.callbacks (a dict of lists)", "yolofeed's val_overlap looks for loggers in it")
    readers = []
    for event in LATE_EVENTS:
        for fn in callbacks.get(event, ()):
            fn = getattr(fn, "func", fn)  # a functools.partial: the function it calls
            module = getattr(fn, "__module__", None) or ""
            if module.split(".")[0] == "yolofeed":
                continue
            if module.startswith("ultralytics.utils.callbacks.") and _idle(module, trainer):
                continue
            name = f"{module.rsplit('.', 1)[-1]}.{getattr(fn, '__name__', type(fn).__name__)}"
            if name not in readers:
                readers.append(name)
    return readers


def set_epoch_loss(trainer: Any, items: dict) -> None:
    """Put the epoch's mean loss items where the loop keeps them: ``trainer.tloss`` (its running mean, read by
    ``save_metrics`` and the loggers at the epoch's end) and ``trainer.loss_items`` (the last step's, which the
    validator's loss sums are made like). Nothing when no step ran this epoch (``tloss`` is None)."""
    if not hasattr(trainer, "tloss"):
        raise _missing("trainer.tloss", "the sync-free step puts the epoch's exact mean loss in")
    if trainer.tloss is not None:
        trainer.tloss = items
        trainer.loss_items = items


def criterion(model: Any) -> Any:
    """The model's loss (``BaseModel.criterion``; None until the first loss call or ``make_criterion``)."""
    return getattr(unwrap_model(model), "criterion", None)


def set_criterion(model: Any, value: Any) -> None:
    """Replace the model's loss: ``BaseModel.loss`` calls ``self.criterion(preds, batch)``."""
    unwrap_model(model).criterion = value


def make_criterion(model: Any) -> Any:
    """A new loss for the model, as ``BaseModel.loss`` makes it on its first call (``init_criterion``)."""
    return unwrap_model(model).init_criterion()


def detection_losses_in(crit: Any) -> list:
    """The plain detection losses in a criterion: itself, or the two of YOLO26's end-to-end loss
    (``E2ELoss.one2many`` and ``one2one``)."""
    if isinstance(crit, (E2ELoss, E2EDetectLoss)):
        return [crit.one2many, crit.one2one]
    return [crit]


def swap_class(obj: Any, ultralytics_class: type, ours: type) -> bool:
    """Make ``obj`` an instance of ``ours`` in place if it is exactly an ``ultralytics_class`` (listed in ``SWAPPED``).

    The object keeps its state, so ``ours`` must subclass ``ultralytics_class`` and add methods only.
    Returns whether it was swapped.
    """
    if not issubclass(ours, ultralytics_class):
        raise TypeError(f"{ours.__name__} must subclass {ultralytics_class.__name__} to replace it in place")
    if type(obj) is not ultralytics_class:
        return False
    obj.__class__ = ours
    return True


def forward_gflops(trainer: Any) -> float | None:
    """The trainer's model's forward GFLOPs for one image at its training size (``get_flops``: THOP, a multiply-add
    as 2 FLOPs), or None where Ultralytics cannot count them (it returns 0.0: no THOP, a model THOP cannot trace)."""
    gflops = get_flops(unwrap_model(trainer.model), trainer.args.imgsz)
    return float(gflops) if gflops else None


def compiled(trainer: Any) -> bool:
    """Whether the trainer's model runs under ``torch.compile`` (``compile=True``: ``attempt_compile`` wrapped it,
    and ``unwrap_model`` finds the model under its ``_orig_mod``)."""
    return unwrap_model(trainer.model) is not _unparallel(trainer.model)


def _unparallel(m: Any) -> Any:
    """The module under DataParallel / DistributedDataParallel wrappers (their ``module``), compile left on."""
    while type(m).__name__ in ("DataParallel", "DistributedDataParallel"):
        m = m.module
    return m


def mark_phases(trainer: Any, mark: Callable[[str], None]) -> Callable[[], None]:
    """Call ``mark(phase)`` where each phase of a training step starts; returns a function that undoes it.

    "forward" at the model's forward pre-hook, "loss" at the detection head's output (``model.model[-1]``, the
    ``Detect`` layer of a ``DetectionModel``), "backward" when the model (which computes the loss) returns,
    "optimizer" where ``trainer.optimizer_step`` is entered: Ultralytics has no callback before the optimiser step,
    so the method is wrapped on the instance. Under the graphed step (train/graphed.py) the head's hook does not run
    (the forward is a graph replay): "forward" then spans the forward and the loss.

    A compiled model (``compile=True``) takes no hook inside it: a hook that records a CUDA event breaks the
    compiled graph in two. Ultralytics' step then calls the model for the predictions and its ``loss`` apart
    (``_do_train``), so "forward" and "loss" mark the outer module's call and return, and "backward" is where
    ``trainer.scaler.scale`` is entered (the loss is scaled for the backward pass).
    """
    model = unwrap_model(trainer.model)
    layers = getattr(model, "model", None)
    if layers is None or not len(layers):
        raise _missing("model.model[-1] (the detection head)", "the monitor marks the loss phase at")
    if compiled(trainer):
        hooks = [trainer.model.register_forward_pre_hook(lambda m, a: mark("forward")),
                 trainer.model.register_forward_hook(lambda m, a, o: mark("loss"))]
        scaler, scale = trainer.scaler, trainer.scaler.scale

        def scale_marked(*args: Any, **kwargs: Any) -> Any:
            mark("backward")
            return scale(*args, **kwargs)

        scaler.scale = scale_marked
    else:
        cuda = any(p.is_cuda for p in model.parameters())

        def marking(phase: str) -> Callable[..., None]:  # not inside a CUDA graph's capture (train/graphed.py):
            if not cuda:  # replays skip hooks
                return lambda *_: mark(phase)
            return lambda *_: None if torch.cuda.is_current_stream_capturing() else mark(phase)
        hooks = [model.register_forward_pre_hook(marking("forward")),
                 layers[-1].register_forward_hook(marking("loss")),
                 model.register_forward_hook(marking("backward"))]
        scaler = scale_marked = None
    step = trainer.optimizer_step

    def optimizer_step() -> None:
        mark("optimizer")
        step()

    trainer.optimizer_step = optimizer_step

    def undo() -> None:
        for h in hooks:
            h.remove()
        if trainer.__dict__.get("optimizer_step") is optimizer_step:
            del trainer.__dict__["optimizer_step"]
        if scaler is not None and scaler.__dict__.get("scale") is scale_marked:
            del scaler.__dict__["scale"]

    return undo


def unbounded_epochs(trainer: Any) -> None:
    """Let the loop run past the run's epochs (``trainer.epochs``, which the loop compares with): the caller ends
    training with ``StopTraining``. Call it in ``on_train_start``: the optimiser is built before, from the run's own
    epochs (``optimizer=auto`` chooses by the number of iterations)."""
    trainer.epochs = 10**6


class StopTraining(BaseException):
    """Raised from a callback to end Ultralytics' training loop at once (the loop has no other way out mid-epoch:
    ``trainer.stop`` still validates and saves).

    A ``BaseException``, like ``KeyboardInterrupt``: an ``except Exception`` on its way (``FastDetectionTrainer``
    logs a failed run there) does not take it for a failure. Ultralytics' ``train`` lets it through after its
    ``finally`` (deterministic mode off, teardown callbacks).
    """


def launches_ranks(trainer: Any) -> bool:
    """Whether ``trainer.train()`` launches DDP ranks as subprocesses (several devices, and this process is not a
    rank) instead of training here: Ultralytics' ``trainer.ddp``."""
    return bool(getattr(trainer, "ddp", False))


def train_until_stopped(trainer: Any) -> bool:
    """``trainer.train()``; True when a callback ended it with ``StopTraining``, False when the loop ended itself."""
    try:
        trainer.train()
    except StopTraining:
        return True
    return False


# -- checkpoints -----------------------------------------------------------------------------------------------------
def write_checkpoints_as(trainer: Any, path_class: type) -> None:
    """Make the trainer's checkpoint paths instances of ``path_class`` (a ``Path`` subclass), so that
    ``BaseTrainer.save_model`` writes every checkpoint through its ``write_bytes``.

    ``save_model`` serialises once, then writes the bytes with ``write_bytes`` on ``trainer.last``, ``trainer.best``
    and ``trainer.wdir / f"epoch{N}.pt"`` (RELIED_ON; pathlib keeps the class across ``/``). Idempotent.
    """
    for name in ("wdir", "last", "best"):
        path = getattr(trainer, name, None)
        if path is None:
            raise _missing(f"trainer.{name}", "yolofeed writes the run's checkpoints atomically at")
        if type(path) is not path_class:
            setattr(trainer, name, path_class(path))


# -- validation ----------------------------------------------------------------------------------------------------
def batched_metrics_serve(validator: Any) -> tuple[Any, Callable[[dict], dict]] | None:
    """What ``train.val_metrics.update_metrics`` needs of a validator whose ``update_metrics`` only gathers statistics
    (RELIED_ON: ``DetectionValidator.update_metrics``, ``_process_batch``, ``_prepare_batch``, ``match_predictions``):
    its IoU thresholds (``iouv``, as numpy) and its ``_prepare_pred``; None where it does more or other work: a
    subclass (segment, pose, OBB match otherwise), plots (the confusion matrix), ``save_json``, ``save_txt``, and a
    release before ``VAL_METRICS_SINCE`` (whose sources were not reviewed for it)."""
    plain = type(validator) is DetectionValidator or getattr(type(validator), "_stock", None) is DetectionValidator
    if not plain or not since(VAL_METRICS_SINCE):
        return None
    args = validator.args
    if args.plots or args.save_json or args.save_txt:
        return None
    return validator.iouv.cpu().numpy(), validator._prepare_pred


def record_image_stats(validator: Any, stat: dict) -> None:
    """One image's statistics, as ``DetectionValidator.update_metrics`` records them: ``seen`` counts the image, and
    ``metrics.update_stats`` takes its arrays and its file's name (the per-image metrics' key)."""
    validator.seen += 1
    stat = dict(stat)
    stat["im_name"] = Path(stat.pop("im_file")).name
    validator.metrics.update_stats(stat)


# -- output --------------------------------------------------------------------------------------------------------
def progress_bar_drawn() -> bool:
    """Whether Ultralytics' epoch progress bar is on screen, its line left open (a carriage return, no newline).

    Its TQDM draws when Ultralytics is verbose at INFO, on rank 0, in an interactive console.
    """
    return (VERBOSE and RANK in {-1, 0} and LOGGER.getEffectiveLevel() <= logging.INFO
            and not _tqdm.is_noninteractive_console())
