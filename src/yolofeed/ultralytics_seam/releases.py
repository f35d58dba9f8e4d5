"""Where releases of the range differ in what yolofeed does: the installed release's way, in one function each (the
label rules, the loaders' fraction and accumulation, the assigner's overlaps, yolofeed's copies, pose, DDP)."""

from __future__ import annotations

from typing import Any

import torch

from yolofeed.errors import UltralyticsError
from yolofeed.ultralytics_seam import version  # version.RELEASE is read at call time: tests set it
from yolofeed.ultralytics_seam.copied import COPIED
from yolofeed.ultralytics_seam.names import get_split_fraction
from yolofeed.ultralytics_seam.pins import POSE_SINCE, LabelRules, label_rules
from yolofeed.ultralytics_seam.version import FIX, VERSION, parse_version, since

# The label rules pack.verify applies: the installed release's (pins.LABEL_RULE_SETS), recorded in every pack it builds
LABEL_RULES: LabelRules = label_rules(version.RELEASE)


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
    reviewed = pinned.reviewed(version.RELEASE)
    return reviewed is None or not reviewed.stock


def flops_counted_on_device() -> bool:
    """Whether the final validation's load of best.pt counts its FLOPs on the device, where yolofeed makes that count
    ahead (``count_flops_as_loaded``): from 8.4.142, ``PyTorchBackend.load_model`` moves the model to the device, then
    fuses it; before, ``load_checkpoint`` fused it on the CPU, where the count sets nothing up."""
    return since("8.4.142")


def check_task(task: str) -> None:
    """Raise where the installed release is older than the rules yolofeed follows for ``task`` (pose: ``POSE_SINCE``).

    Raises:
        UltralyticsError: one line: the release installed, the one needed, the fix.
    """
    if task == "pose" and version.RELEASE < parse_version(POSE_SINCE):
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
