"""Every place yolofeed reaches into Ultralytics, in one package, checked against the releases it was written for.

yolofeed trains with Ultralytics' own ``DetectionTrainer``; it overrides a few of its methods, reads and sets some
of its state, and carries modified copies of a few of its methods (the sync-free loss). All of that holds for the
Ultralytics releases whose copied and relied-on methods read as those of the release they were copied from
(``TESTED``), or as a source reviewed for them: ``SUPPORTED``, the releases checked one by one against the recorded
sources. This package:

* checks the installed version when it is imported (in ``SUPPORTED``; ``version.py``). No other module of
  ``src/yolofeed`` imports Ultralytics (``tests/test_seam.py`` checks it), so importing any stage that uses
  Ultralytics (``yolofeed.train``, ``yolofeed.pack``...) with another version raises ``UltralyticsVersionError``: an
  ``ImportError`` (the module cannot be used) and a ``YolofeedError``, which the CLI prints as one line before any
  work starts. ``import yolofeed`` itself stays free of Ultralytics, so ``yolofeed help`` works with any version.
  ``YOLOFEED_UNTESTED_ULTRALYTICS=1`` turns the version check into a warning (to try a new release: the drift test
  then says what moved);
* checks, at import too, that every Ultralytics method yolofeed overrides, wraps or relies on is still there
  (``REQUIRED``, ``required.py``): a renamed ``_close_dataloader_mosaic`` would otherwise leave mosaic on for a whole
  run, silently;
* checks, at import too, that the trainer's attributes yolofeed reads (``TRAINER_STATE``: ``last``, ``start_epoch``,
  ``amp``...) are still assigned in the installed source, and reads each through a function of ``state.py``
  (``checkpoint``, ``start_epoch``, ``step_autocast``...);
* re-exports every Ultralytics name yolofeed uses (imported in ``names.py``), and wraps each reach into an object's
  state (the callbacks' order, ``tloss``, the criterion, the detection head, ``epochs``...) in a small function that
  names what it touches and why: a run's arguments (``arguments.py``), the model (``model.py``), the data
  (``data.py``), the training loop (``loop.py``), an epoch validated beside the next (``beside.py``); an attribute
  missing at run time raises ``UltralyticsError`` in one line;
* lists, in ``copied.py`` and ``relied_on.py``, what yolofeed copied (``COPIED``: Ultralytics' method, our copy, the
  hash of the source it was copied from), the methods those copies and our overrides assume unchanged (``RELIED_ON``;
  with ``ours``, a rule yolofeed re-implements in its own shape: the partner pool's size, the label filters), the
  classes swapped in place (``SWAPPED``) and what Ultralytics reads from our loaders (``TRAIN_LOADER_ATTRIBUTES``,
  ``VAL_...``); a pinned method whose source differs in older releases of the range lists each such source
  (``Reviewed``: the releases, the hash, why yolofeed serves them), and the label rules of each release are
  ``LABEL_RULE_SETS``.
  ``tests/test_seam.py`` compares the hashed methods with the installed source (read by ``source.py``) and fails
  with a diff on drift. Only this package imports Ultralytics;
* chooses, where releases of the range differ in what yolofeed does, the installed release's way, in one function
  each (``since``: ``LABEL_RULES``, ``pair_overlaps``, ``copy_serves``, ``check_ddp``; ``releases.py``).

The stages import every name from here; a test that patches one for the seam's own functions patches the module that
defines it (``version.RELEASE``).
"""

from __future__ import annotations

from yolofeed.ultralytics_seam.arguments import (
    OPTIMIZERS,
    args_ahead,
    deterministic_ahead,
    downloads_weights,
    fetch_weights,
    one_gpu_asked,
    remote_model,
    train_side,
    weights_name,
)
from yolofeed.ultralytics_seam.beside import (
    end_epoch_late,
    overlap_serves,
    validating_beside,
    validation_beside,
    validator_view,
)
from yolofeed.ultralytics_seam.copied import COPIED
from yolofeed.ultralytics_seam.data import (
    data_complete,
    data_split,
    data_yaml,
    find_dataset_yaml,
    packaged,
    restores_in_place,
)
from yolofeed.ultralytics_seam.figures import MODULE as FIGURES_MODULE
from yolofeed.ultralytics_seam.figures import figure_function, final_figures, train_grid_shown
from yolofeed.ultralytics_seam.loop import (
    LATE_EVENTS,
    TRAINING_EVENTS,
    StopTraining,
    batched_metrics_serve,
    epoch_readers,
    first_meanwhile,
    launches_ranks,
    mark_phases,
    progress_bar_drawn,
    record_image_stats,
    run_first,
    set_epoch_loss,
    train_until_stopped,
    unbounded_epochs,
    write_checkpoints_as,
)
from yolofeed.ultralytics_seam.model import (
    Family,
    compiled,
    criterion,
    detection_losses_in,
    family_by_name,
    forward_gflops,
    image_feeds_a_convolution,
    layer_inputs,
    loader_stride,
    make_criterion,
    model_ahead,
    other_family,
    scaled_input,
    set_criterion,
    swap_class,
    trains_channels_last,
)
from yolofeed.ultralytics_seam.names import (
    DATASET_KEY_TYPES,
    DATASETS_DIR,
    DEFAULT_CFG,
    DEFAULT_CFG_DICT,
    GITHUB_ASSETS_NAMES,
    IMG_FORMATS,
    LOCAL_RANK,
    LOGGER,
    RANK,
    SETTINGS,
    VERBOSE,
    YAML,
    YOLO,
    AutoBackend,
    BboxLoss,
    C2f,
    C3k2,
    Concat,
    Conv,
    Detect,
    DetectionModel,
    DetectionTrainer,
    DetectionValidator,
    E2EDetectLoss,
    E2ELoss,
    EarlyStopping,
    KeypointLoss,
    MuSGD,
    OBBTrainer,
    PoseTrainer,
    RotatedBboxLoss,
    RotatedTaskAlignedAssigner,
    SegmentationTrainer,
    TaskAlignedAssigner,
    TorchNMS,
    YOLODataset,
    bbox2dist,
    bbox_iou,
    check_cfg,
    check_class_names,
    check_det_dataset,
    check_file,
    check_imgsz,
    check_yaml,
    crop_mask,
    exif_size,
    get_cfg,
    get_flops,
    get_latest_run,
    get_save_dir,
    get_split_fraction,
    guess_model_task,
    img2label_paths,
    imread,
    make_anchors,
    merge_equals_args,
    non_max_suppression,
    parse_device,
    parse_key_value_pair,
    pil_open,
    probiou,
    rbox2dist,
    segments2boxes,
    smart_value,
    strip_optimizer,
    torch_distributed_zero_first,
    torch_safe_load,
    unwrap_model,
    v8DetectionLoss,
    v8OBBLoss,
    v8PoseLoss,
    v8SegmentationLoss,
    xywh2xyxy,
    xywhr2xyxyxyxy,
    xyxy2xywh,
    xyxyxyxy2xywhr,
    yaml_model_load,
    zeropower_via_newtonschulz5,
)
from yolofeed.ultralytics_seam.pins import (
    GRAPH_LAYOUT_SINCE,
    LABEL_RULE_SETS,
    NMS_SINCE,
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
from yolofeed.ultralytics_seam.releases import (
    LABEL_RULES,
    accumulate_for,
    check_ddp,
    check_task,
    copy_serves,
    flops_counted_on_device,
    pair_overlaps,
    split_fraction,
)
from yolofeed.ultralytics_seam.relied_on import RELIED_ON
from yolofeed.ultralytics_seam.required import REQUIRED, check_required
from yolofeed.ultralytics_seam.source import normalised_source, resolve, source_hash
from yolofeed.ultralytics_seam.state import (
    RUN_FILES,
    TRAINER_STATE,
    CheckpointStandIn,
    autocast_asked,
    batches_per_step,
    check_trainer_state,
    checkpoint,
    checkpoint_files,
    checkpoint_inputs,
    checkpoint_states,
    could_stop,
    count_flops_as_loaded,
    epoch_end_state,
    forget_loss,
    may_stop,
    results_csv,
    resuming,
    start_epoch,
    step_autocast,
    stop_asked,
    trainer_ema,
    validation_loader,
    validation_models,
    weights_dir,
    world_size,
)
from yolofeed.ultralytics_seam.version import (
    FIX,
    RANGE,
    RELEASE,
    REQUIREMENT,
    SUPPORTED,
    TESTED,
    UNTESTED_ENV,
    VERSION,
    check_version,
    since,
)

__all__ = [  # the names other modules import from here (each defined in the module above that holds its job)
    "FIGURES_MODULE", "figure_function", "final_figures", "first_meanwhile", "train_grid_shown",
    "CheckpointStandIn", "checkpoint_files", "checkpoint_inputs", "checkpoint_states",
    "could_stop", "count_flops_as_loaded", "end_epoch_late", "epoch_readers", "epoch_end_state", "stop_asked",
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
    "args_ahead", "deterministic_ahead", "find_dataset_yaml", "forward_gflops", "get_cfg", "get_latest_run",
    "get_save_dir",
    "restores_in_place",
    "guess_model_task",
    "downloads_weights", "fetch_weights", "weights_name", "remote_model", "image_feeds_a_convolution",
    "img2label_paths",
    "IMG_FORMATS", "imread", "launches_ranks",
    "LOCAL_RANK", "LOGGER",
    "Family", "family_by_name", "make_anchors", "make_criterion", "merge_equals_args", "model_ahead", "one_gpu_asked",
    "mark_phases", "may_stop", "MuSGD", "other_family",
    "OPTIMIZERS", "packaged", "parse_device",
    "parse_key_value_pair", "pil_open", "OBBTrainer", "PoseTrainer", "SegmentationTrainer", "progress_bar_drawn",
    "RANK", "results_csv", "resuming", "run_first",
    "scaled_input", "segments2boxes", "set_criterion", "set_epoch_loss", "smart_value", "start_epoch",
    "step_autocast", "autocast_asked", "StopTraining", "strip_optimizer", "swap_class", "trains_channels_last",
    "TaskAlignedAssigner", "torch_distributed_zero_first", "torch_safe_load", "train_side", "train_until_stopped",
    "unbounded_epochs", "unwrap_model", "v8DetectionLoss", "validation_loader", "validation_models", "VERSION",
    "weights_dir",
    "world_size",
    "write_checkpoints_as", "TorchNMS", "non_max_suppression", "NMS_SINCE",
    "xywh2xyxy", "xyxy2xywh", "YAML", "yaml_model_load", "YOLO", "YOLODataset",
    "zeropower_via_newtonschulz5",
    # what yolofeed copied and relies on (copied.py, relied_on.py), and reading the installed source (source.py)
    "COPIED", "normalised_source", "Pinned", "RELIED_ON", "resolve", "Reviewed", "source_hash", "SWAPPED",
    "TRAIN_LOADER_ATTRIBUTES", "VAL_LOADER_ATTRIBUTES",
    # where the releases of the range differ
    "check_ddp", "copy_serves", "flops_counted_on_device", "LABEL_RULE_SETS", "LABEL_RULES", "label_rules",
    "label_rules_named", "LabelRules",
    "pair_overlaps", "parse_version", "RELEASE", "Release", "since", "UNRECORDED_LABEL_RULES",
    # the version, what must be there and the trainer's state, and the rest the seam's tests and the stages read
    "check_version", "FIX", "RANGE", "REQUIREMENT", "SUPPORTED", "TESTED", "UNTESTED_ENV",
    "check_required", "REQUIRED", "check_trainer_state", "TRAINER_STATE", "RUN_FILES",
    "AutoBackend", "check_file", "check_imgsz", "compiled", "EarlyStopping", "get_flops", "get_split_fraction",
    "GITHUB_ASSETS_NAMES", "KeypointLoss", "LATE_EVENTS", "TRAINING_EVENTS", "SETTINGS", "VERBOSE",
]
