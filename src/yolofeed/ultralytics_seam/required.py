"""What must be there: every Ultralytics method yolofeed overrides, wraps or relies on (``REQUIRED``), checked when the
seam is imported, and the one line that says what is missing and which Ultralytics works (``_missing``)."""

from __future__ import annotations

from typing import Any

from yolofeed.errors import UltralyticsError, UltralyticsVersionError
from yolofeed.ultralytics_seam.names import (
    BboxLoss,
    Conv,
    Detect,
    DetectionModel,
    DetectionTrainer,
    DetectionValidator,
    KeypointLoss,
    MuSGD,
    RotatedBboxLoss,
    RotatedTaskAlignedAssigner,
    TaskAlignedAssigner,
    _data_utils,
    _detect_val_module,
    _metrics_module,
    _muon,
    _nms_module,
    _obb_val_module,
    _validator_module,
    v8DetectionLoss,
    v8OBBLoss,
    v8PoseLoss,
    v8SegmentationLoss,
)
from yolofeed.ultralytics_seam.pins import POSE_SINCE, SEGMENT_LOSS_SINCE
from yolofeed.ultralytics_seam.version import FIX, RANGE, VERSION, since

# -- what must be there ------------------------------------------------------------------------------------------
# (owner, attribute, what yolofeed does with it). Checked at import: a release that renamed one fails here, in one
# line, instead of training with the override silently ignored.
REQUIRED: tuple[tuple[type, str, str], ...] = (
    (DetectionTrainer, "_close_dataloader_mosaic", "yolofeed overrides it to close mosaic in its GPU augmentation "
                                                   "(without it mosaic would stay on for the whole run)"),
    (DetectionTrainer, "_do_train", "yolofeed wraps Ultralytics' training loop to name the checkpoint that resumes "
                                    "a failed run"),
    (DetectionTrainer, "train", "yolofeed wraps Ultralytics' training to hold the run folder while it trains (two "
                                "trainings in one folder mix their rows and weights)"),
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
    (DetectionTrainer, "plot_training_samples", "yolofeed hands it the first train_grid_shown() images of the batch "
                                                "(half_input's as stock's float32 image)"),
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
    (DetectionValidator, "postprocess", "the batched validator copies it (COPIED) to call its NMS"),
    (_nms_module, "non_max_suppression", "train/val_nms.py copies it (COPIED) and calls it where the copy does not "
                                         "serve"),
    (DetectionTrainer, "resume_training", "yolofeed's trainer drops the results.csv rows of epochs the resumed run "
                                          "trains again (train/checkpoints.py::trim_results)"),
    (DetectionTrainer, "save_metrics", "val_overlap holds an overlapped epoch's results.csv row until its validation "
                                       "ends (train/overlap.py)"),
    (DetectionTrainer, "run_callbacks", "val_overlap holds an overlapped epoch's on_model_save and on_fit_epoch_end "
                                        "until its validation ends"),
    (_metrics_module, "plot_pr_curve", "the final validation's children draw its precision-recall curve (figures.py)"),
    (_metrics_module, "plot_mc_curve", "the final validation's children draw its F1, P and R curves (figures.py)"),
    (_metrics_module.ConfusionMatrix, "plot", "the final validation's children draw its confusion matrix "
                                              "(figures.py)"),
    (_detect_val_module, "plot_images", "the final validation's image grids get the images they show (figures.py: "
                                        "the detect, segment and pose validators draw them by this name)"),
    (_obb_val_module, "plot_images", "the final validation's image grids get the images they show (figures.py)"),
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
