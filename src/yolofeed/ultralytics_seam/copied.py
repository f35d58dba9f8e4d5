"""What yolofeed copied from Ultralytics and changed: each method's source hash, the copy (``ours``) and what it
changes (``why``); the copies are kept beside the classes they belong to (train/loss/ says why each differs).
``tests/test_seam.py`` compares the hashes with the installed source."""

from __future__ import annotations

from yolofeed.ultralytics_seam.pins import NMS_SINCE, POSE_SINCE, SEGMENT_LOSS_SINCE, Pinned, _r

COPIED: tuple[Pinned, ...] = (
    Pinned("ultralytics.utils.loss.v8DetectionLoss.get_assigned_targets_and_loss", "a4753d10641f935a",
           "yolofeed.train.loss.detect.SyncFreeDetectionLoss.get_assigned_targets_and_loss",
           "the anchors and image size cached per feature-map shape; the most boxes per image and the candidates' "
           "count from the batch; the classification term's BCE and sum one fused pass each way on CUDA "
           "(kernels/bce_sum.py: the same gradient, the sum in another order); mask_gt bool, not float (the same "
           "values; the assigner's candidates a bool product), and the anchors' levels handed to the assigner",
           others=(
               _r("8.4.138", "8.4.153", "418f07badd332a6b",
                  "target_scores_sum by max() and the box loss skipped without foreground, two syncs: the same values;"
                  " a batch without boxes takes Ultralytics' path (8.4.138-143's assigner gives it a float foreground "
                  "mask)"),
               _r("8.4.154", "8.4.179", "739c9164c07d9a54",
                  "no **assign_kwargs (the pose loss's keypoints), which the copy never passes: the same code"),
           )),
    Pinned("ultralytics.utils.loss.v8PoseLoss.loss", "f44d09b6cf28a065",
           "yolofeed.train.loss.pose.SyncFreePoseLoss.loss",
           "imgsz from the cached constants; the keypoint part without the fg_mask.sum() guard (_keypoints_loss is 0 "
           "without a foreground)", since=POSE_SINCE),
    Pinned("ultralytics.utils.loss.v8SegmentationLoss.loss", "0f6af14ba4d25d8a",
           "yolofeed.train.loss.segment.SyncFreeSegmentLoss.loss",
           "imgsz from the cached constants; each image's target "
           "rows from one read of the counts (no boolean index per image)", since=SEGMENT_LOSS_SINCE),
    Pinned("ultralytics.utils.loss.v8SegmentationLoss.calculate_segmentation_loss", "287eb18ef2e9947b",
           "yolofeed.train.loss.segment.SyncFreeSegmentLoss._segmentation_loss",
           "each image's foreground anchors from one "
           "nonzero and one read of the counts, where Ultralytics gathers them by boolean indexing (a sync each); "
           "a group of images at a time, not image by image (single_mask_loss's pin); the scales made on the device",
           since=SEGMENT_LOSS_SINCE),
    Pinned("ultralytics.utils.loss.v8SegmentationLoss.single_mask_loss", "105c2c0ef785a48e",
           "yolofeed.train.loss.segment.SyncFreeSegmentLoss._segmentation_loss",
           "a group of images' rows at once: their "
           "masks from one padded batched product, then the same cross-entropy, crop, mean and area per row, summed "
           "once", since=SEGMENT_LOSS_SINCE),
    Pinned("ultralytics.utils.loss.v8PoseLoss._batch_keypoints", "3c246c7f85087ad1",
           "yolofeed.train.loss.pose.SyncFreePoseLoss._padded_keypoints",
           "the most boxes per image given, not learnt (a "
           "sync)", since=POSE_SINCE),
    Pinned("ultralytics.utils.loss.v8PoseLoss.calculate_keypoints_loss", "9548edeff5d502e6",
           "yolofeed.train.loss.pose.SyncFreePoseLoss._keypoints_loss",
           "over every anchor, the foreground's terms kept by "
           "a mask, where Ultralytics gathers the foreground (masks.any(), nonzero, boolean indexing)",
           since=POSE_SINCE),
    Pinned("ultralytics.utils.loss.v8DetectionLoss.preprocess", "87a9252ed8b00264",
           "yolofeed.train.loss.detect.SyncFreeDetectionLoss._pad",
           "the most boxes per image given, not learnt (a sync)",
           others=(
               _r("8.4.138", "8.4.182", "0348e52095097cf4",
                  "no MPS branch (the padding rounded up to a power of two there): the copy never runs on MPS"),
           )),
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner.select_candidates_in_gts", "6610e5e5c1bf9e8a",
           "yolofeed.train.loss.detect.SyncFreeAssigner.select_candidates_in_gts",
           "stride_val as a Python scalar; with the anchors' levels given, the four comparisons along each level's x "
           "and y, then one AND (the same mask); SyncFreeDetectionLoss.early_candidates repeats its steps to count "
           "ahead"),
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner._forward", "c8a7c4dcef96e167",
           "yolofeed.train.loss.detect.SyncFreeAssigner._forward",
           "the alignment metric's normalisation made on each foreground anchor's own box (a gather and a scatter "
           "amax), not over every (box, anchor) pair: the same values (select_highest_overlaps leaves an anchor "
           "positive for one box at most)",
           others=(
               _r("8.4.138", "8.4.179", "66f0a5b9b533437c",
                  "no **extra for get_pos_mask: the copy hands it on only where given, and forward gives none under "
                  "these releases"),
           )),
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner.get_targets", "d09f2ebb32f6fad0",
           "yolofeed.train.loss.detect.SyncFreeAssigner._targets",
           "the target scores made at once from the normalised metric (one float write of (B, anchors, classes)), "
           "where Ultralytics makes an int8 one-hot, masks it, and _forward multiplies it by the metric: the same "
           "values"),
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner.get_box_metrics", "3cfbd24887dca7b6",
           "yolofeed.train.loss.detect.SyncFreeAssigner.get_box_metrics", "nonzero_static with the count known ahead",
           others=(
               _r("8.4.138", "8.4.179", "fdc62ca61a541e12",
                  "the pairs' overlaps inline, iou_calculation of the gathered boxes, which 8.4.180 moved into "
                  "pair_overlaps: the copy calls seam.pair_overlaps, which computes them so before 8.4.180"),
           )),
    Pinned("ultralytics.utils.loss.BboxLoss.forward", "0b88a1783bddaad0",
           "yolofeed.train.loss.detect.SyncFreeBboxLoss.forward",
           "the foreground gathered with nonzero_static to a bound known on the host, padded rows weighted 0 "
           "(foreground_box_losses, shared with the rotated loss)",
           others=(
               _r("8.4.138", "8.4.153", "b1faf3641ed25502",
                  "indexes with the boolean foreground mask, not its nonzero() indices: the same rows, in the same "
                  "order"),
           )),
    # OBB (train/loss/obb.py::SyncFreeOBBLoss): the loss, its padding, its angle loss, the rotated box loss and
    # candidates
    Pinned("ultralytics.utils.loss.v8OBBLoss.loss", "98579daf4366c3bc", "yolofeed.train.loss.obb.SyncFreeOBBLoss.loss",
           "the anchors and image size cached per feature-map shape; the tiny-box filter a mask; the most boxes per "
           "image and the candidates' count from the batch; max(sum, 1) by clamp; the box and angle losses without "
           "the fg_mask.sum() guard (0 without a foreground); the classification term's BCE and sum one fused pass "
           "each way on CUDA (kernels/bce_sum.py)",
           others=(
               _r("8.4.138", "8.4.161", "cf0c94e010cf15ef",
                  "the error for a detection dataset (4 box columns) names data=dota8.yaml, where 8.4.162 names "
                  "coco8.yaml: the copy hands such a batch to Ultralytics' own loss, which raises its own message"),
           )),
    Pinned("ultralytics.utils.loss.v8OBBLoss.preprocess", "5fb71e472f623812",
           "yolofeed.train.loss.obb.SyncFreeOBBLoss._pad_rboxes",
           "after the tiny-box filter as a mask, with the most boxes per image given (a sync): the rows the filter "
           "keeps, then zeros",
           others=(
               _r("8.4.138", "8.4.182", "09f8c7b0cd5c390b",
                  "no MPS branch (the padding rounded up to a power of two there): the copy never runs on MPS"),
           )),
    Pinned("ultralytics.utils.loss.v8OBBLoss.calculate_angle_loss", "98d6862f269e265d",
           "yolofeed.train.loss.obb.SyncFreeOBBLoss._angle_loss",
           "over every anchor, the foreground's terms kept by a mask, where Ultralytics gathers them (boolean "
           "indexing)"),
    Pinned("ultralytics.utils.loss.RotatedBboxLoss.forward", "f14d9a4658460b88",
           "yolofeed.train.loss.obb.SyncFreeRotatedBboxLoss.forward",
           "the foreground gathered with nonzero_static to a bound known on the host, padded rows weighted 0 on a unit "
           "box (foreground_box_losses, shared with the detection loss)"),
    Pinned("ultralytics.utils.tal.RotatedTaskAlignedAssigner.select_candidates_in_gts", "18252a314c4e7fcf",
           "yolofeed.train.loss.obb.SyncFreeRotatedAssigner.select_candidates_in_gts",
           "stride_val as a Python scalar; SyncFreeOBBLoss.early_candidates repeats its steps (_rbox_edges, then its "
           "dot products' arithmetic) to count ahead",
           others=(
               _r("8.4.138", "8.4.156", "7db79aca2edb78da",
                  "ap.ab as (ap * ab).sum(-1) of an (ap, ab) pair tensor, not apx * abx + apy * aby: the same products "
                  "added, the same values (the count ahead holds for both)"),
           )),
    Pinned("ultralytics.data.utils.verify_image_label", "250f780f0303c564", "yolofeed.pack.verify.read_labels",
           "the label half only (its image checks are pack.verify's own): Ultralytics' columns, bounds, class range, "
           "segments as boxes, and duplicates by row, or by class and polygon for segments; refusals as one line. "
           "task=obb (pack.verify.read_obb_labels) is this segment path (keypoint=False), each row's 4 corners kept "
           "beside its box: a change here reaches both",
           others=(
               _r("8.4.138", "8.4.163", "f20276a261423482",
                  "label rules 8.4.138 (LABEL_RULE_SETS): a whitespace line refuses the file, fractional class ids "
                  "kept, duplicates by row only, any value down to -0.01, no BOM"),
               _r("8.4.164", "8.4.164", "8f1f3eed99f3e42c",
                  "label rules 8.4.164: fractional class ids refused; otherwise 8.4.138's"),
               _r("8.4.165", "8.4.181", "b5365a77e6d285d5",
                  "label rules 8.4.165: whitespace lines skipped, polygon duplicates by polygon; any value down to "
                  "-0.01, no BOM"),
               _r("8.4.182", "8.4.182", "62ac0b3bb1fe515a",
                  "label rules 8.4.182: negative values for x and y only; no BOM (it makes the first class id "
                  "non-numeric)"),
           )),
    Pinned("ultralytics.data.utils.check_image", "6f4910f41f1cbe8e", "yolofeed.pack.verify.check_image",
           "Pillow's verify, the EXIF-corrected size of at least 10 px a side, the formats Ultralytics reads, a JPEG "
           "without its end marker restored (in memory: the user's file is not rewritten)",
           others=(
               _r("8.4.138", "8.4.163", "e1a13190859980bc",
                  "refuses Pillow's JPEG2000 format (LabelRules.jpeg2000); otherwise 8.4.164's"),
               _r("8.4.164", "8.4.166", "5605e1bc6a633916",
                  "writes the restored JPEG over the file in place (8.4.167: through a temporary file): the same "
                  "bytes, which pack.verify builds in memory"),
           )),
    Pinned("ultralytics.optim.muon.muon_update", "6909629a03ae1c80", "yolofeed.train.musgd.muon_update",
           "beta and 1 - beta as device scalars (a multiply, then an add, where stock fuses them)",
           others=(
               _r("8.4.138", "8.4.138", "15fed64f6586fe44",
                  "buckets by rows with tall matrices transposed and pads columns (8.4.139: by columns, rows padded): "
                  "other arithmetic, so yolofeed steps this release's own MuSGD (FastMuSGD is not adopted)",
                  stock=True),
           )),
    Pinned("ultralytics.optim.muon.MuSGD.step", "e5bd4a18e6039cf8", "yolofeed.train.musgd.FastMuSGD._update",
           "the buffers of a plan made once, the scalars read from the device, a found_inf step skipped there"),
    Pinned("ultralytics.models.yolo.detect.train.DetectionTrainer.final_eval", "b13bdb214501858e",
           "yolofeed.train.trainer.FastDetectionTrainer.final_eval",
           "strip_optimizer writes last.pt and best.pt to a temporary file renamed over them "
           "(train/checkpoints.py::strip_atomically), not over them in place"),
    Pinned("ultralytics.utils.nms.non_max_suppression", "f8e2402d735b3ebe", "yolofeed.train.val_nms.batched_nms",
           "for the validator's call (multi_label, boxes, no classes filter, no indices): each image's candidate rows "
           "from one where and one concatenation a group of images, the same rows in the same order; then each "
           "image's max_nms cut, class offset, NMS, max_det cut and time limit as there; any other call goes to it",
           since=NMS_SINCE),
    Pinned("ultralytics.models.yolo.detect.val.DetectionValidator.postprocess", "ded28f787d9a469c",
           "yolofeed.train.val_metrics.BatchedDetectionValidator.postprocess",
           "the same call of the NMS, to yolofeed's batched_nms"),
)
