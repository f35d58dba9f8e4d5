"""What yolofeed copied from Ultralytics and what it relies on, each with the hash of the source it was written against:
``COPIED`` (Ultralytics' method, our copy), ``RELIED_ON`` (methods our copies and overrides assume unchanged; with
``ours``, a rule yolofeed re-implements in its own shape), ``SWAPPED`` (classes swapped in place) and what
Ultralytics reads from our loaders. ``tests/test_seam.py`` compares the hashes with the installed source."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pinned:
    """An Ultralytics function yolofeed copied, or relies on being unchanged, with the hash of its source.

    Attributes:
        ultralytics: its qualified name (module path, then class and method).
        sha256: the first 16 hex digits of the SHA-256 of ``normalised_source`` at ``TESTED``.
        ours: the qualified name of yolofeed's modified copy ("" for a method relied on, not copied).
        why: what the copy changes, or what yolofeed assumes of the method.
    """

    ultralytics: str
    sha256: str
    ours: str = ""
    why: str = ""


# Modified copies, kept beside the classes they belong to for readability (train/loss.py says why each differs).
COPIED: tuple[Pinned, ...] = (
    Pinned("ultralytics.utils.loss.v8DetectionLoss.get_assigned_targets_and_loss", "a4753d10641f935a",
           "yolofeed.train.loss.SyncFreeDetectionLoss.get_assigned_targets_and_loss",
           "the anchors and image size cached per feature-map shape; the most boxes per image and the candidates' "
           "count from the batch"),
    Pinned("ultralytics.utils.loss.v8DetectionLoss.preprocess", "87a9252ed8b00264",
           "yolofeed.train.loss.SyncFreeDetectionLoss._pad", "the most boxes per image given, not learnt (a sync)"),
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner.select_candidates_in_gts", "6610e5e5c1bf9e8a",
           "yolofeed.train.loss.SyncFreeAssigner.select_candidates_in_gts",
           "stride_val as a Python scalar; SyncFreeDetectionLoss.early_candidates repeats its steps to count ahead"),
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner.get_box_metrics", "3cfbd24887dca7b6",
           "yolofeed.train.loss.SyncFreeAssigner.get_box_metrics", "nonzero_static with the count known ahead"),
    Pinned("ultralytics.utils.loss.BboxLoss.forward", "0b88a1783bddaad0",
           "yolofeed.train.loss.SyncFreeBboxLoss.forward",
           "the foreground gathered with nonzero_static to a bound known on the host, padded rows weighted 0"),
    Pinned("ultralytics.data.utils.verify_image_label", "250f780f0303c564", "yolofeed.pack.verify.read_labels",
           "the label half only (its image checks are pack.verify's own): Ultralytics' columns, bounds, class range, "
           "segments as boxes, and duplicates by row, or by class and polygon for segments; refusals as one line"),
    Pinned("ultralytics.data.utils.check_image", "6f4910f41f1cbe8e", "yolofeed.pack.verify.check_image",
           "Pillow's verify, the EXIF-corrected size of at least 10 px a side, the formats Ultralytics reads, a JPEG "
           "without its end marker restored (in memory: the user's file is not rewritten)"),
    Pinned("ultralytics.optim.muon.muon_update", "6909629a03ae1c80", "yolofeed.train.musgd.muon_update",
           "beta and 1 - beta as device scalars (a multiply, then an add, where stock fuses them)"),
    Pinned("ultralytics.optim.muon.MuSGD.step", "e5bd4a18e6039cf8", "yolofeed.train.musgd.FastMuSGD._update",
           "the buffers of a plan made once, the scalars read from the device, a found_inf step skipped there"),
    Pinned("ultralytics.models.yolo.detect.train.DetectionTrainer.final_eval", "b13bdb214501858e",
           "yolofeed.train.trainer.FastDetectionTrainer.final_eval",
           "strip_optimizer writes last.pt and best.pt to a temporary file renamed over them "
           "(train/checkpoints.py::strip_atomically), not over them in place"),
)

# What the copies and the overrides assume: a change here can break them without touching a copied line.
RELIED_ON: tuple[Pinned, ...] = (
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner.forward", "20d350afbb2b781e",
           why="sets bs and n_max_boxes, falls back to one image at a time on OOM (the copies check bs)"),
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner.get_pos_mask", "68acdb6a15a4181d",
           why="get_box_metrics' candidates are select_candidates_in_gts' mask times mask_gt (early_candidates)"),
    Pinned("ultralytics.utils.tal.make_anchors", "1ca25b452a34c3bd",
           why="the sync-free loss caches its anchors per feature-map shape"),
    Pinned("ultralytics.utils.loss.v8DetectionLoss.loss", "0707424632ac0a83",
           why="calls get_assigned_targets_and_loss with the batch, where the counts ride"),
    Pinned("ultralytics.utils.loss.E2ELoss.__call__", "32fa04b768edcc2c",
           why="YOLO26: the two plain detection losses (one2many, one2one) get the same batch"),
    Pinned("ultralytics.engine.trainer.BaseTrainer._do_train", "400861d91b504ebd",
           why="the loop the sync-free step, the callbacks and the pack loaders are fitted to: tloss and loss_items, "
               "callback order, close_mosaic then train_loader.reset(), criterion.update() before on_train_epoch_end"),
    Pinned("ultralytics.engine.trainer.BaseTrainer._close_dataloader_mosaic", "44a21ac6bb616b47",
           why="FastDetectionTrainer's override must do what it does (mosaic, mixup, cutmix off)"),
    Pinned("ultralytics.optim.muon.zeropower_via_newtonschulz5", "3b85ee3595e6dbfb",
           why="FastMuSGD's update calls it as stock's does: no host sync in it, so it can be captured"),
    Pinned("ultralytics.engine.trainer.BaseTrainer.build_optimizer", "668843690c3d2151",
           why="builds MuSGD(groups, muon=, sgd=) where yolofeed's trainer adopts it; the groups' keys (use_muon, "
               "nesterov, lr, momentum, weight_decay) are the ones FastMuSGD reads"),
    Pinned("ultralytics.engine.trainer.BaseTrainer.optimizer_step", "f01be97330da83e1",
           why="the monitor's optimiser phase starts where it is entered"),
    Pinned("ultralytics.utils.dist.generate_ddp_file", "78b554dd99221047",
           why="DDP ranks rebuild the trainer as trainer_class(cfg, overrides, _callbacks) from a cloudpickle of the "
               "class (FastDetectionTrainer.with_options' options ride on it) and of the callbacks "
               "(monitor/throughput.py's report to the launcher rides on those)"),
    Pinned("ultralytics.engine.trainer.BaseTrainer.train", "6df46979cf5bb5e5",
           why="self.ddp: the launching process runs the ranks with subprocess.run(check=True) and trains nothing "
               "itself (measure/ranks.py: its ranks report to it and leave with status 0)"),
    Pinned("ultralytics.engine.trainer.BaseTrainer.save_model", "292ea8c55f928750",
           why="serialises the checkpoint once and writes it only with write_bytes on self.last, self.best and "
               "self.wdir / f'epoch{N}.pt' (write_checkpoints_as makes those writes atomic)"),
    Pinned("ultralytics.models.yolo.detect.train.DetectionTrainer.preprocess_batch", "c12bd29a341f40d1",
           why="FastDetectionTrainer hands it Ultralytics' batch after augmenting (img.float() / 255, multi_scale)"),
    # Rules yolofeed re-implements in its own shape (``ours``), not as a copy of the method
    Pinned("ultralytics.data.base.BaseDataset.__init__", "8a5554f533938b34",
           "yolofeed.augment.pool.ultralytics_capacity",
           why="the partner pool's default size is its max_buffer_length: min(n, 8 x batch, 1000) when augmenting"),
    Pinned("ultralytics.data.base.BaseDataset.load_image", "7cba5ab6064ad87d", "yolofeed.augment.pool.PartnerPool",
           why="the pool keeps the images loaded lately as its buffer does (the oldest dropped once it holds "
               "max_buffer_length); pack.verify.resized_hw resizes as it does (long side, ceil, INTER_LINEAR)"),
    Pinned("ultralytics.data.base.BaseDataset.update_labels", "b9ff4ae08d5bf474", "yolofeed.loader.labels.LabelView.of",
           why="classes= keeps the rows of those classes (ids not renumbered), then single_cls makes every id 0"),
    # pose (task=pose packs): the label half of verify_image_label with keypoints, the yaml's kpt_shape, the cache key
    Pinned("ultralytics.data.utils.verify_image_label", "250f780f0303c564", "yolofeed.pack.verify.read_pose_labels",
           why="with keypoint=True: 5 + K x D columns a row, keypoint x and y at most 1.01 (the box not checked "
               "from above), the signs and classes as for boxes, duplicates by whole row, D = 2 gets visibility 0 "
               "where x or y < 0; with a kpt_shape and a box task, rows of exactly 5 + K x D columns keep their box "
               "only (read_labels)"),
    Pinned("ultralytics.data.dataset.YOLODataset.__init__", "d99a787c3fd10c06", "yolofeed.pack.source.kpt_shape_of",
           why="task=pose needs kpt_shape [K, D] with K > 0 and D 2 or 3, refused in its words otherwise"),
    Pinned("ultralytics.data.dataset.YOLODataset.get_cache_hash", "4586c8269202c69e",
           "yolofeed.pack.source.SplitSource.fingerprint",
           why="the label cache is remade when kpt_shape changes (in the pack's fingerprint) or use_keypoints does "
               "(the pack header's task, which Pack.open compares)"),
)

# Objects whose class yolofeed swaps in place (the instance keeps Ultralytics' state; the subclass adds methods
# only): (Ultralytics class, yolofeed's subclass, where). train/loss.py::install does it through ``swap_class``.
SWAPPED: tuple[tuple[str, str, str], ...] = (
    ("ultralytics.utils.loss.v8DetectionLoss", "yolofeed.train.loss.SyncFreeDetectionLoss", "train/loss.py::install"),
    ("ultralytics.utils.tal.TaskAlignedAssigner", "yolofeed.train.loss.SyncFreeAssigner", "train/loss.py::install"),
    ("ultralytics.utils.loss.BboxLoss", "yolofeed.train.loss.SyncFreeBboxLoss", "train/loss.py::install"),
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
