"""Ultralytics' detection loss without host syncs, given two counts the loader learned a step early.

In Ultralytics 8.4.190 one yolo11n loss makes 16 synchronising CUDA calls (``torch.cuda.set_sync_debug_mode``
counts them; YOLO26's end-to-end loss runs it twice). The first drains the forward pass; after it the GPU idles while
the host launches the target assignment's small kernels between syncs: 15 ms of a 78 ms yolo11n step at
batch 128 on the H200, with no data work at all. Without syncs the host launches the loss while the GPU
still runs the forward pass. Where they come from, and what replaces them (same values, same order):

* ``make_anchors`` (9: CPU ``arange`` and a 0-d stride copied per level), ``torch.tensor(imgsz)`` and its
  index (2): constants per feature-map shape, cached on the device.
* The target padding learns the most boxes in one image (``unique``, ``zeros(n)``: 2): ``max_boxes``.
* ``select_candidates_in_gts`` builds a 0-d tensor from ``stride_val`` (1): a Python scalar.
* ``get_box_metrics`` gathers the candidate (image, box, anchor) pairs with ``nonzero`` (1):
  ``nonzero_static`` with their count, ``tal_candidates``, which depends on the boxes and anchors alone.
* ``BboxLoss`` gathers the foreground anchors with ``nonzero`` (1): ``nonzero_static`` padded to a
  bound known on the host (at most ``topk`` anchors per box, at most the candidates); padded rows read
  distinct anchors (``foreground_rows``) and get weight 0. The gradients are the same; the loss's sum may
  differ in the last bit (more terms, in a different reduction tree).

``AugmentAhead`` computes both counts with the augmentation, one step ahead, and reads them from pinned
memory (``early_candidates``: on the anchor grid, (B, K, levels) work; a (B, K, anchors) mask would cost
more GPU time than the syncs it saves); the ceiling counts its replayed batches once. A
batch without them takes Ultralytics' own path. The first steps do too: the anchors come from the first
loss call. A wrong count (a bug) is caught on the device and read once an epoch (``check_counts``).
On by default in both trainers (``sync_free_loss=False`` turns it off). The pose and OBB losses are built the same
way (``SyncFreePoseLoss``, ``SyncFreeOBBLoss``: their docstrings say which syncs they remove and how).

The assigner's passes over every (box, anchor) pair cost GPU time where fewer do (YOLO26 runs it twice a step), with
counts or without: its candidate mask is made along each feature level's x and y and joined once (``_grid_inside``,
with the levels the loss hands it), where Ultralytics writes and reads back four float32 differences a pair, and
``mask_gt`` is bool, so the candidates (that mask times ``mask_gt``) are a bool product, not float32
(``GRID_CANDIDATES``); its metric's normalisation is made on each foreground anchor's own box (``_foreground_norm``),
where Ultralytics makes eight float32 passes over the pairs (``FOREGROUND_NORM``). Both give the same values bit for
bit; False keeps Ultralytics' computation.

The copied methods (and the Ultralytics methods they assume unchanged) are registered in
``yolofeed.ultralytics_seam.COPIED`` and ``RELIED_ON`` with the hash of their 8.4.190 source and of each older source
reviewed; ``tests/test_seam.py`` fails with a diff when the installed Ultralytics moves away from them. Before 8.4.180
``get_box_metrics`` computes its overlaps inline: ``seam.pair_overlaps`` does as the installed release does.

One module a task: ``detect`` (the assigner, the box loss, the detection loss and the counts' padding), ``pose``,
``segment``, ``obb``; ``install`` swaps a model's losses to these classes.
"""

from yolofeed.train.loss.detect import (
    CANDIDATES,
    MAX_BOXES,
    SyncFreeAssigner,
    SyncFreeBboxLoss,
    SyncFreeDetectionLoss,
    SyncFreeLoss,
    foreground_rows,
    padded_gt_from_augmented,
    padded_gt_from_ultralytics,
)
from yolofeed.train.loss.install import check_counts, detection_losses, early_candidates_for, install
from yolofeed.train.loss.obb import (
    SyncFreeOBBLoss,
    SyncFreeRotatedAssigner,
    SyncFreeRotatedBboxLoss,
    early_rbox_candidates_for,
    padded_rboxes_from_augmented,
)
from yolofeed.train.loss.pose import SyncFreePoseLoss
from yolofeed.train.loss.segment import MASK_CHUNK, SyncFreeSegmentLoss

__all__ = ["CANDIDATES", "MASK_CHUNK", "MAX_BOXES", "SyncFreeAssigner", "SyncFreeBboxLoss", "SyncFreeDetectionLoss",
           "SyncFreeLoss", "SyncFreeOBBLoss", "SyncFreePoseLoss", "SyncFreeRotatedAssigner", "SyncFreeRotatedBboxLoss",
           "SyncFreeSegmentLoss", "check_counts", "detection_losses", "early_candidates_for",
           "early_rbox_candidates_for", "foreground_rows", "install", "padded_gt_from_augmented",
           "padded_gt_from_ultralytics", "padded_rboxes_from_augmented"]
