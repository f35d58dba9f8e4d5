"""What the copies and the overrides assume of Ultralytics: a change in one of these methods can break them without
touching a copied line. With ``ours``, a rule yolofeed re-implements in its own shape (the augmentation's, the
loaders', the label checks'). ``tests/test_seam.py`` compares the hashes with the installed source."""

from __future__ import annotations

from yolofeed.ultralytics_seam.pins import (
    GRAPH_LAYOUT_SINCE,
    POSE_SINCE,
    VAL_METRICS_SINCE,
    VAL_OVERLAP_SINCE,
    Pinned,
    _r,
)

RELIED_ON: tuple[Pinned, ...] = (
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner.forward", "20d350afbb2b781e",
           why="sets bs and n_max_boxes, falls back to one image at a time on OOM (the copies check bs)",
           others=(
               _r("8.4.138", "8.4.143", "c0231a66822a8bb1",
                  "a float foreground mask for a batch without boxes (8.4.144: bool): the sync-free loss leaves such a"
                  " batch to Ultralytics' path, whose guard (8.4.138-153) keeps it from the box loss"),
               _r("8.4.144", "8.4.179", "e3ff61ff0459ab05",
                  "no **extra for _forward (the pose assigner's keypoints); bs, n_max_boxes and the OOM fallback as in"
                  " TESTED"),
           )),
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner.get_pos_mask", "68acdb6a15a4181d",
           why="get_box_metrics' candidates are select_candidates_in_gts' mask times mask_gt (early_candidates: the "
               "rotated assigner's too); mask_gt is read only through that product and .bool(), so a bool one gives "
               "the same values",
           others=(
               _r("8.4.138", "8.4.179", "a2b0c26006af5a2a",
                  "no **extra for get_box_metrics; the candidates are select_candidates_in_gts' mask times mask_gt as "
                  "in TESTED"),
           )),
    Pinned("ultralytics.utils.tal.make_anchors", "1ca25b452a34c3bd",
           why="the sync-free loss caches its anchors per feature-map shape",
           others=(
               _r("8.4.138", "8.4.153", "e452e954714f4b55",
                  "each arange made on the feature map's device (8.4.154: on the CPU, then moved): the same anchors, "
                  "made per call in both"),
           )),
    Pinned("ultralytics.utils.loss.v8DetectionLoss.loss", "0707424632ac0a83",
           why="calls get_assigned_targets_and_loss with the batch, where the counts ride"),
    Pinned("ultralytics.utils.loss.E2ELoss.__call__", "32fa04b768edcc2c",
           why="YOLO26: the two plain detection losses (one2many, one2one) get the same batch"),
    Pinned("ultralytics.engine.trainer.BaseTrainer._do_train", "400861d91b504ebd",
           why="the loop the sync-free step, the callbacks and the pack loaders are fitted to: tloss and loss_items, "
               "callback order, close_mosaic then train_loader.reset(), criterion.update() before on_train_epoch_end; "
               "after validate, NaN recovery (a fitness of None is not NaN), save_metrics, the stopper, save_model and "
               "on_model_save, epoch_time, on_fit_epoch_end (seam.end_epoch_late ends an overlapped epoch so, as in "
               "every release of the range)",
           others=(
               _r("8.4.138", "8.4.156", "69b14bba96c36f0e",
                  "closes mosaic at epoch == epochs - close_mosaic only: a resume past it keeps mosaic on, in "
                  "yolofeed's augmentation too (the loop calls the override); the order of the rest as in TESTED"),
               _r("8.4.157", "8.4.157", "041f110d8aebfcdf",
                  "an OOM retry does not close mosaic again: its rebuilt dataset has mosaic on, yolofeed's "
                  "augmentation keeps its closed settings (as from 8.4.158)"),
               _r("8.4.158", "8.4.161", "572d20bfd0807ad0",
                  "an OOM retry neither closes the train loader (the dropped loader's finalizer stops its thread: "
                  "loader/prefetch.py) nor gives the validator the new val loader (it keeps the first, still open)"),
               _r("8.4.162", "8.4.163", "64715499e6ab2374",
                  "runs on_batch_end each step (gone in 8.4.164): yolofeed registers none; the monitor times it"),
               _r("8.4.164", "8.4.171", "e0ff91178f975d52",
                  "NaN recovery keeps last_opt_step and the gradients (8.4.172 resets them): Ultralytics' own"),
               _r("8.4.172", "8.4.182", "d2ad805e752cb30f",
                  "warm-up raises accumulate towards nbs / batch, up to nw excluded (8.4.183: towards the accumulate "
                  "set up): Ultralytics' own schedule, which yolofeed's step runs inside"),
           )),
    Pinned("ultralytics.utils.tal.TaskAlignedAssigner.select_highest_overlaps", "34d352b758bea330",
           why="no host sync; the max over boxes keeps the first of equal overlaps, so rows of zeros after an image's "
               "boxes change no assignment (SyncFreeOBBLoss pads to the most boxes before the tiny-box filter, "
               "Ultralytics to the most after it); an anchor is left positive for one box at most, which "
               "target_gt_idx names (the copied _forward's normalisation)",
           others=(
               _r("8.4.138", "8.4.153", "6197bbb330735b7d",
                  "resolves anchors on several boxes only `if fg_mask.max() > 1`: one host sync a call, the sync-free "
                  "detection and OBB losses' alike (the one left under these releases); argmax keeps the first of "
                  "equal overlaps, as in TESTED"),
               _r("8.4.154", "8.4.156", "a977ac627a606470",
                  "argmax where TESTED takes max().indices (the first of equal values both), fg_mask as the sum of "
                  "mask_pos: the same assignment, no sync"),
               _r("8.4.157", "8.4.177", "2b255dbc155b28bf", "no NPU branch: the same on the CPU and CUDA"),
           )),
    Pinned("ultralytics.utils.loss.v8OBBLoss.__init__", "96efa731d7399507",
           why="the assigner a RotatedTaskAlignedAssigner (its stride a list, so stride_val a Python number) and the "
               "box loss a RotatedBboxLoss: install swaps exactly these",
           others=(
               _r("8.4.138", "8.4.163", "67e5c8df297f0ad0", "tal_topk without its type annotation: the same losses"),
           )),
    Pinned("ultralytics.utils.loss.v8OBBLoss.bbox_decode", "4a8d051edb75018d",
           why="SyncFreeOBBLoss.loss calls it: xywhr from the distances and angles, elementwise, no sync"),
    Pinned("ultralytics.utils.tal.RotatedTaskAlignedAssigner.iou_calculation", "3ff47a8fcd40fb09",
           why="the rotated candidates' overlaps (ProbIoU), through seam.pair_overlaps as the stock assigner's"),
    Pinned("ultralytics.nn.tasks.OBBModel.init_criterion", "9679d8c99aa81b8f",
           why="an OBB model's criterion is a v8OBBLoss, or E2ELoss's two (YOLO26): install swaps each",
           others=(
               _r("8.4.138", "8.4.141", "b150e378e35bb6c7",
                  "E2ELoss when the model is end2end, not when its head has one2one_cv2: the same losses for the "
                  "yolo11 and yolo26 OBB models"),
           )),
    Pinned("ultralytics.engine.trainer.BaseTrainer._close_dataloader_mosaic", "44a21ac6bb616b47",
           why="FastDetectionTrainer's override must do what it does (mosaic, mixup, cutmix off)"),
    Pinned("ultralytics.optim.muon.zeropower_via_newtonschulz5", "3b85ee3595e6dbfb",
           why="FastMuSGD's update calls it as stock's does: no host sync in it, so it can be captured"),
    Pinned("ultralytics.engine.trainer.BaseTrainer.build_optimizer", "668843690c3d2151",
           why="builds MuSGD(groups, muon=, sgd=) where yolofeed's trainer adopts it; the groups' keys (use_muon, "
               "nesterov, lr, momentum, weight_decay) are the ones FastMuSGD reads",
           others=(
               _r("8.4.138", "8.4.153", "e3a00f5eb1245ca9",
                  "no fused= for Adam and AdamW on CUDA: yolofeed adopts a MuSGD only, built as in TESTED"),
               _r("8.4.154", "8.4.167", "306f9373d73d6116", "another log line for optimizer=auto"),
               _r("8.4.168", "8.4.171", "0674c7808391a5d1",
                  "optimizer=auto does not write the optimiser and lr0 it chose back into args (yolofeed reads "
                  "neither)"),
           )),
    Pinned("ultralytics.engine.trainer.BaseTrainer.optimizer_step", "f01be97330da83e1",
           why="the monitor's optimiser phase starts where it is entered"),
    Pinned("ultralytics.utils.dist.generate_ddp_file", "78b554dd99221047",
           why="DDP ranks rebuild the trainer as trainer_class(cfg, overrides, _callbacks) from a cloudpickle of the "
               "class (FastDetectionTrainer.with_options' options ride on it) and of the callbacks "
               "(monitor/throughput.py's report to the launcher rides on those)",
           others=(
               _r("8.4.138", "8.4.139", "6ad256394b720820",
                  "ranks import the trainer class by module and name, without its callbacks: yolofeed's options and "
                  "callbacks would not reach them, so a multi-GPU run is refused (seam.check_ddp)"),
               _r("8.4.140", "8.4.171", "6e0aa0b84c583ccd",
                  "no check_requirements('cloudpickle>=3.1.1') (yolofeed requires it); the trainer pickled as in "
                  "TESTED"),
           )),
    Pinned("ultralytics.engine.trainer.BaseTrainer.train", "6df46979cf5bb5e5",
           why="self.ddp: the launching process runs the ranks with subprocess.run(check=True) and trains nothing "
               "itself (measure/ranks.py: its ranks report to it and leave with status 0)",
           others=(
               _r("8.4.138", "8.4.176", "ffd2cf96212ac5e6",
                  "teardown callbacks after the try, so not after StopTraining (yolofeed registers none); self.ddp and"
                  " subprocess.run(check=True) as in TESTED"),
           )),
    Pinned("ultralytics.engine.trainer.BaseTrainer.resume_training", "0933221b65c88f67",
           "yolofeed.train.checkpoints.nothing_to_resume",
           why="asserts 0 < checkpoint epoch + 1 < self.epochs (a finished run's, epoch -1, and one holding every "
               "epoch, are 'finished, nothing to resume'): nothing_to_resume refuses both first, in one line",
           others=(
               _r("8.4.138", "8.4.141", "530b2fb872d473be",
                  "the end2end criterion resumed by its own flag, the mosaic closed here past close_mosaic; the "
                  "assertion as in TESTED"),
               _r("8.4.142", "8.4.156", "3c89ba62f47aab35",
                  "the mosaic closed here past close_mosaic; the assertion as in TESTED"),
           )),
    Pinned("ultralytics.engine.trainer.BaseTrainer.save_model", "292ea8c55f928750",
           why="serialises the checkpoint once and writes it only with write_bytes on self.last, self.best and "
               "self.wdir / f'epoch{N}.pt' (write_checkpoints_as makes those writes atomic); of the trainer's state it "
               "reads the epoch, best fitness, stopper, EMA and its updates, the optimiser's and the scaler's "
               "state_dict(), the metrics and fitness (beside._epoch_state puts an overlapped epoch's back for it)",
           others=(
               _r("8.4.138", "8.4.138", "c616f854b3d94053",
                  "unwrap_model(self.ema.ema), not the EMA model as is: the same single serialisation and writes"),
               _r("8.4.139", "8.4.142", "e1c94960ce26e71c", "no QAT state in the checkpoint: the same writes"),
               _r("8.4.143", "8.4.171", "9dda48b2cf590642",
                  "no early-stopping state in the checkpoint: the same writes"),
           )),
    Pinned("ultralytics.models.yolo.detect.train.DetectionTrainer.preprocess_batch", "c12bd29a341f40d1",
           why="FastDetectionTrainer hands it Ultralytics' batch after augmenting (img.float() / 255, multi_scale)"),
    Pinned("ultralytics.engine.trainer.BaseTrainer.save_metrics", "3a2aa5c9aec375cc",
           why="appends one results.csv row: epoch + 1, time.time() - train_time_start, then the values given "
               "(seam.end_epoch_late writes an overlapped epoch's row late, its time when its validation ended)"),
    Pinned("ultralytics.engine.trainer.BaseTrainer.run_callbacks", "771c58d5775ae40d",
           why="runs each callback of the event with the trainer (yolofeed's trainer holds an overlapped epoch's "
               "on_model_save and on_fit_epoch_end, and runs them when the epoch ends late)"),
    Pinned("ultralytics.utils.ops.Profile.__init__", "48dd0555ffbbae69",
           why="keeps device, and accelerator (the device's torch module) for a CUDA device"),
    Pinned("ultralytics.utils.ops.Profile.time", "b7f127984685b4ba",
           why="syncs the whole device before reading the clock (seam.validation_beside narrows it to the thread's "
               "stream for a validation run beside the training, whose queued steps it would otherwise wait for)"),
    Pinned("ultralytics.engine.trainer.BaseTrainer._handle_nan_recovery", "b1fc4a544aebf926",
           why="recovers only for a non-finite loss or fitness: a fitness of None (an epoch validated beside the "
               "next) is not one, and a loss of None (a discarded epoch: seam.forget_loss) is not either"),
    Pinned("ultralytics.engine.validator.BaseValidator.get_model", "1cb22c544009a351",
           why="a training validation validates trainer.ema.ema (seam.validator_view hands it the snapshot's)",
           since=VAL_OVERLAP_SINCE),
    Pinned("ultralytics.utils.torch_utils.EarlyStopping.__call__", "5a9934342f783436",
           why="does nothing for a fitness of None; stops once epoch - best_epoch reaches patience (seam.could_stop: "
               "an epoch whose validation may stop the run is not overlapped)"),
    # Rules yolofeed re-implements in its own shape (``ours``), not as a copy of the method
    Pinned("ultralytics.engine.trainer.BaseTrainer.validate", "3c8bcb6d45b1c4b7",
           "yolofeed.ultralytics_seam.end_epoch_late",
           why="the fitness is metrics.pop('fitness', -loss), the best fitness the larger: end_epoch_late applies "
               "it to an overlapped validation's metrics"),
    Pinned("ultralytics.data.base.BaseDataset.__init__", "8a5554f533938b34",
           "yolofeed.augment.pool.ultralytics_capacity",
           why="the partner pool's default size is its max_buffer_length: min(n, 8 x batch, 1000) when augmenting",
           others=(
               _r("8.4.138", "8.4.157", "8c87e5164d0c499e", "the transforms built from hyp itself, not a copy of it"),
               _r("8.4.158", "8.4.163", "9f5204f6c0831c08", "type annotations only"),
               _r("8.4.164", "8.4.168", "c4ef61743a41254b", "as 8.4.170-174 (8.4.169 only renames the .npy cache)"),
               _r("8.4.169", "8.4.169", "b263df3c7a07bd52",
                  "names the .npy image cache image.jpg.npy, not image.npy: a cache yolofeed never reads"),
               _r("8.4.170", "8.4.174", "c4ef61743a41254b",
                  "cv2_flag for 1 or 3 channels only (yolofeed packs 3); max_buffer_length as in TESTED"),
               _r("8.4.175", "8.4.177", "8356e02df2d1b6ef", "type annotations only"),
           )),
    Pinned("ultralytics.data.base.BaseDataset.load_image", "7cba5ab6064ad87d", "yolofeed.augment.pool.PartnerPool",
           why="the pool keeps the images loaded lately as its buffer does (the oldest dropped once it holds "
               "max_buffer_length); pack.verify.resized_hw resizes as it does (long side, ceil, INTER_LINEAR)",
           others=(
               _r("8.4.138", "8.4.165", "b794d34536b6e3cd",
                  "reads a .npy image cache whenever there is one (a cache yolofeed never reads); the resize for an "
                  "int imgsz and the buffer as in TESTED"),
               _r("8.4.166", "8.4.170", "3b4343954ef216a9",
                  "reads the .npy cache with cache=disk only (undone in 8.4.171)"),
               _r("8.4.171", "8.4.174", "b794d34536b6e3cd", "as 8.4.138-165"),
               _r("8.4.175", "8.4.177", "475c83b47ae14d7f",
                  "an int imgsz only (8.4.178 takes (h, w) too): the same long-side resize for the int yolofeed gives"),
               _r("8.4.178", "8.4.178", "97a1b380945e9129", "the (h, w) imgsz read in other lines: the same sizes"),
           )),
    Pinned("ultralytics.data.base.BaseDataset.update_labels", "b9ff4ae08d5bf474", "yolofeed.loader.labels.LabelView.of",
           why="classes= keeps the rows of those classes (ids not renumbered), then single_cls makes every id 0"),
    Pinned("ultralytics.data.dataset.YOLODataset.get_labels", "060779786cbf9fa9",
           "yolofeed.pack.layout.detect_keeps_polygons",
           why="a detection split keeps its polygons where its box and segment counts are equal (every row a "
               "polygon), else drops them all; on the files fraction= keeps (get_img_files cuts them first: "
               "checks.warn_polygons_in_share), before classes= (update_labels)"),
    # pose (task=pose packs, from POSE_SINCE): the label half of verify_image_label with keypoints, the yaml's
    # kpt_shape, the cache key; older releases read each otherwise (8.4.138-182), and pose is refused there
    Pinned("ultralytics.data.utils.verify_image_label", "250f780f0303c564", "yolofeed.pack.verify.read_pose_labels",
           why="with keypoint=True: 5 + K x D columns a row, keypoint x and y at most 1.01 (the box not checked "
               "from above), the signs and classes as for boxes, duplicates by whole row, D = 2 gets visibility 0 "
               "where x or y < 0; with a kpt_shape and a box task, rows of exactly 5 + K x D columns keep their box "
               "only (read_labels)", since=POSE_SINCE),
    Pinned("ultralytics.data.dataset.YOLODataset.__init__", "d99a787c3fd10c06", "yolofeed.pack.source.kpt_shape_of",
           why="task=pose needs kpt_shape [K, D] with K > 0 and D 2 or 3, refused in its words otherwise",
           since=POSE_SINCE),
    Pinned("ultralytics.data.dataset.YOLODataset.get_cache_hash", "4586c8269202c69e",
           "yolofeed.pack.source.SplitSource.fingerprint",
           why="the label cache is remade when kpt_shape changes (in the pack's fingerprint) or use_keypoints does "
               "(the pack header's task, which Pack.open compares)", since=POSE_SINCE),
    Pinned("ultralytics.utils.loss.KeypointLoss.forward", "f3cbcb5a041c7d15",
           "yolofeed.train.loss.pose.SyncFreePoseLoss._keypoints_loss",
           why="its mean as a masked sum over every anchor, "
           "divided by the foreground anchors x keypoints", since=POSE_SINCE),
    Pinned("ultralytics.utils.loss.v8PoseLoss.kpts_decode", "a2b39c0643892390",
           "yolofeed.train.loss.pose.SyncFreePoseLoss.kpts_decode",
           why="the keypoints x 2 plus the anchor less 0.5, the anchors' columns sliced where Ultralytics indexes them "
               "with a list (a host-to-device copy, which syncs)", since=POSE_SINCE),
    # oriented boxes (task=obb): the rules the GPU augmentation and the validation batches re-implement
    Pinned("ultralytics.data.dataset.YOLODataset.update_labels_info", "63a36af060b99cc0",
           "yolofeed.augment.geometry.obb.resample_corners",
           why="an OBB's 4 corners resampled to 100 points (resample_segments) before any op",
           others=(_r("8.4.138", "8.4.160", "6ad4edaac581cff9",
                      "resamples every segment list, where 8.4.161 skips it for a semantic-mask format: the same for "
                      "OBB"),)),
    Pinned("ultralytics.utils.ops.resample_segments", "4575a32eb1ebeda2",
           "yolofeed.augment.geometry.obb.resample_corners",
           why="a closed polygon's n points by np.interp: linspace(0, len, n - len) with each vertex inserted"),
    Pinned("ultralytics.utils.instance.Instances.clip", "958ab3fb19b478a7", "yolofeed.augment.geometry.obb.clip_obb",
           why="preserve_obb: a segment not wholly inside becomes the rectangle of its visible part "
               "(intersectConvexConvex with the canvas) in its own minimum-area frame, resampled; none visible: zeros"),
    Pinned("ultralytics.data.augment.Mosaic._cat_labels", "aaae112c70310982",
           "yolofeed.augment.geometry.mosaic.Mosaic.apply_corners",
           why="the tiles' instances clipped to the canvas with preserve_obb, then remove_zero_area_boxes"),
    Pinned("ultralytics.data.augment.RandomPerspective.apply_instances", "017c3934f4e7bc1d",
           "yolofeed.augment.geometry.perspective.RandomPerspective.apply_corners",
           why="with segments the boxes come from the moved points (apply_segments), the clip keeps the OBB "
               "(preserve_obb) and box_candidates takes area_thr 0.01"),
    Pinned("ultralytics.data.augment.RandomPerspective.apply_segments", "4b62a9f81c5f49c5",
           "yolofeed.augment.geometry.perspective.RandomPerspective.apply_corners",
           why="the points through M with the perspective divide, each box segment2box of its points; with "
               "preserve_obb no clip of the points to their box"),
    Pinned("ultralytics.utils.ops.segment2box", "d58b7c477e7d8b11",
           why="a segment wholly inside the image gives its points' bounds (the only case the OBB path meets before "
               "the clip decides)",
           others=(_r("8.4.138", "8.4.163", "ab3559b15a0127b7",
                      "without the early return for a segment wholly outside: the polygon clip then finds no point "
                      "and returns zeros too"),)),
    Pinned("ultralytics.data.augment.CutMix.apply_instances", "232dac6a65e0a9c2",
           "yolofeed.augment.mix.cutmix.CutMix.apply_corners",
           why="an OBB sample with boxes takes a partner box from 1 % of it inside the area; the partner's clipped "
               "with preserve_obb, zero-area ones dropped"),
    # copy-paste, flip mode (augment/geometry/copy_paste.py)
    Pinned("ultralytics.data.augment.v8_transforms", "85f74623be8be404",
           "yolofeed.augment.geometry.copy_paste.CopyPaste",
           why="copy_paste_mode flip inserts CopyPaste between Mosaic and RandomPerspective, in the pre_transform "
               "MixUp's and CutMix's partners go through too (augment.pipeline.OPS)",
           others=(_r("8.4.138", "8.4.163", "72e26e86999a44fe",
                      "without the return annotation: the same transforms"),)),
    Pinned("ultralytics.data.augment.CopyPaste.__call__", "3bd15803be974b6f",
           "yolofeed.augment.geometry.copy_paste.CopyPaste.apply_boxes",
           why="nothing without segments or at p = 0; flip mode draws nothing"),
    Pinned("ultralytics.data.augment.CopyPaste.get_params", "7d7b432b1d8633c3",
           "yolofeed.augment.geometry.copy_paste.pick",
           why="copies mirrored about the canvas width, eligible below 0.30 bbox_ioa of every original, sorted by "
               "their largest (argsort: ties in slot order here), round(p x eligible) of them"),
    Pinned("ultralytics.data.augment.CopyPaste.apply_image", "0f219e8b70d7a74b",
           "yolofeed.augment.geometry.copy_paste.CopyPaste.paste_step",
           why="the chosen copies' int32 polygons drawContours-filled into one mask, the canvas' cv2.flip copied "
               "where it is set",
           others=(_r("8.4.138", "8.4.161", "960980977367e3c0",
                      "copies by a boolean index (im[i] = result[i]) where 8.4.162 calls cv2.copyTo: the same "
                      "pixels"),)),
    Pinned("ultralytics.data.augment.CopyPaste.apply_instances", "b5644dcdb63fe582",
           "yolofeed.augment.geometry.copy_paste.CopyPaste.apply_polygons",
           why="the chosen copies' classes and instances appended after the originals, in the sorted order"),
    Pinned("ultralytics.utils.metrics.bbox_ioa", "7dd058d60b8edbdc", "yolofeed.augment.geometry.copy_paste.covers",
           why="intersection over box2's area + 1e-7, float32"),
    Pinned("ultralytics.utils.instance.Instances.fliplr", "0f6620e22424b228",
           "yolofeed.augment.geometry.copy_paste.mirror_boxes", why="xyxy boxes: x -> w - x, the edges swapped",
           others=(_r("8.4.138", "8.4.164", "33e65c991ba226f3",
                      "without the ltwh branch of 8.4.165: the same for the xyxy boxes copy-paste mirrors"),)),
    Pinned("ultralytics.utils.ops.xyxyxyxy2xywhr", "b1abfdfbf65fc502",
           "yolofeed.augment.geometry.rboxes.xyxyxyxy2xywhr",
           why="cv2.minAreaRect of each point set, w the longer side, theta in [-pi/4, 3pi/4)",
           others=(_r("8.4.138", "8.4.182", "90ff39d7b3311182",
                      "the points not cast to float32 first: the same rectangles for float32 points, which "
                      "Format hands it"),)),
    Pinned("ultralytics.data.augment.Format.apply_instances", "5c35b5be4b5e53a9",
           "yolofeed.schema.AugmentedBatch.to_ultralytics",
           why="return_obb: bboxes are xyxyxyxy2xywhr of the segments, x, w / image width and y, h / its height",
           others=(_r("8.4.138", "8.4.161", "bb987a8caf10588a",
                      "semantic masks' overlap resolved otherwise: the OBB branch is the same"),)),
    Pinned("ultralytics.nn.modules.conv.Conv.forward", "5eed1f9d8f3e5a46",
           "yolofeed.train.graphed.FusedConv.forward",
           why="act(bn(conv(x))): FusedConv runs bn and act (a BatchNorm2d and a SiLU) as one op while a graph is "
               "captured, and calls this forward otherwise"),
    Pinned("ultralytics.nn.modules.head.Detect.forward_head", "b8e528413b06331b",
           "yolofeed.train.graphed.TokenMajorDetect.forward_head",
           why="boxes and scores: each level's head output viewed (batch, channels, cells) and concatenated along the "
               "cells; TokenMajorDetect makes the same values laid out cells-major while a graph is captured, and "
               "calls this forward_head otherwise", since=GRAPH_LAYOUT_SINCE),
    Pinned("ultralytics.nn.tasks.BaseModel._predict_once", "7e8218e0db624225", "yolofeed.ultralytics_seam.layer_inputs",
           why="a layer takes y[f] (f an int), or the list of them (-1: the layer before's output), the layers "
               "running in order", since=GRAPH_LAYOUT_SINCE),
    Pinned("ultralytics.nn.modules.conv.Concat.forward", "1f3475ff80047233",
           why="torch.cat of its inputs (type promotion: a float32 input makes the result float32); HalfUpsample "
               "relies on it", since=GRAPH_LAYOUT_SINCE),
    Pinned("ultralytics.nn.modules.block.C2f.forward", "aa9826ad5c808a0c", "yolofeed.train.graphed._Halves.forward",
           why="its input reaches cv1 once (a Conv: a convolution, cast by autocast) and nothing else, which "
               "HalfUpsample relies on; cv1's output chunked in two, the second half into m, all of them into cv2's "
               "cat: _Halves makes the same with the halves dense while a graph is captured, and calls this forward "
               "otherwise", since=GRAPH_LAYOUT_SINCE),
    Pinned("ultralytics.nn.tasks.BaseModel.predict", "50f29e9d8fd224ba",
           "yolofeed.train.graphed.GraphedPredict.predict",
           why="the training forward: x alone (profile, augment and embed off) runs _predict_once, which the graph "
               "captures; GraphedPredict calls this predict for every other call"),
    Pinned("ultralytics.nn.backends.pytorch.PyTorchBackend.load_model", "4d9edc61d2699e93",
           "yolofeed.ultralytics_seam.count_flops_as_loaded",
           why="the final validation's load of best.pt: load_checkpoint (float32, on the device), then fuse there, "
               "whose FLOPs count (BaseModel.fuse) runs on the device in float32: the count yolofeed makes ahead",
           others=(
               _r("8.4.138", "8.4.141", "322e87a43ef786ad",
                  "load_checkpoint fuses best.pt before moving it to the device, so its FLOPs count runs on the CPU: "
                  "nothing to make ahead (releases.flops_counted_on_device)"),
               _r("8.4.142", "8.4.163", "583fd94dc557fe71",
                  "a path given as str only (annotations): the load as in TESTED"),
           )),
    Pinned("ultralytics.nn.tasks.BaseModel.fuse", "0eb71d68ecb5bc96",
           "yolofeed.ultralytics_seam.count_flops_as_loaded",
           why="fusing an unfused model ends with info(verbose, imgsz=640), model_info's get_flops: the FLOPs count "
               "yolofeed makes ahead on a fused float32 copy",
           others=(
               _r("8.4.138", "8.4.141", "08fb1534437537da",
                  "no QAT skip, Detect fused for end2end only: info at the end as in TESTED"),
               _r("8.4.142", "8.4.142", "1a81d770445500f3",
                  "Detect fused for end2end only: info at the end as in TESTED"),
               _r("8.4.143", "8.4.155", "e9c1c7ac889bbf4c",
                  "a QAT model is not fused (yolofeed trains none): info at the end as in TESTED"),
           )),
    Pinned("ultralytics.utils.torch_utils.model_info", "c87d671feff43e43",
           "yolofeed.ultralytics_seam.count_flops_as_loaded",
           why="verbose: get_flops(model, imgsz), the count fuse's info makes (not verbose: nothing)"),
    Pinned("ultralytics.engine.validator.BaseValidator.__call__", "a0264553ccbc64a5",
           "yolofeed.ultralytics_seam.validation_models",
           why="an epoch's validation runs the EMA in float32 under float16 autocast (amp) on half inputs at the val "
               "loader's shapes; the final one wraps best.pt in AutoBackend (fp16 with amp, fused, channels_last as "
               "args.channels_last) and warms it at batch 1 first: the shapes yolofeed's validation thread sets up; "
               "of the trainer it reads the device, data, amp, args, loss_items, stopper.possible_stop, epoch, epochs, "
               "world_size, label_loss_items and (get_model; inline before 8.4.140) ema.ema, which "
               "seam.validator_view gives a validation beside the training (val_overlap) from an epoch's snapshot; "
               "after the batches get_stats, finalize_metrics and print_results, then on_val_end: the final "
               "validation's figures (seam.final_figures) are waited for first at on_val_end",
           others=(
               _r("8.4.138", "8.4.138", "5cae88af24b6e547",
                  "validates ema.ema or the model (a compiled one's _orig_mod), as float32 under the same autocast; "
                  "the final validation as in TESTED"),
               _r("8.4.139", "8.4.139", "8b077fd1485d62b0",
                  "the EMA as float32 under the same autocast; end2end set otherwise (not a convolution's shape)"),
               _r("8.4.140", "8.4.141", "6211a8aeeb8aeacb",
                  "the model from get_model (the EMA), float32 under the same autocast; end2end set otherwise"),
               _r("8.4.142", "8.4.152", "e4ecb4a08c2ca160",
                  "the validator's names are not set from the model (not a convolution's shape)"),
               _r("8.4.153", "8.4.163", "dda838de7e7a5008",
                  "converts an ndjson dataset without its split (not a convolution's shape)"),
               _r("8.4.164", "8.4.174", "3b1e6ce6a0803d35",
                  "an exported model's imgsz read otherwise; a .pt model's validation as in TESTED"),
               _r("8.4.175", "8.4.177", "ed9a3741c16af313",
                  "imgsz checked as one side: the final warm-up at (1, 3, imgsz, imgsz), as TESTED's for a square "
                  "imgsz"),
               _r("8.4.178", "8.4.178", "b7ef10ccc25ce47e",
                  "a non-.pt model warms at args.batch (a .pt at batch 1, as in TESTED)"),
               _r("8.4.179", "8.4.182", "af37c1154d53932d",
                  "converts an ndjson dataset on training validations too (not a convolution's shape)"),
           )),
    Pinned("ultralytics.utils.metrics.ap_per_class", "092f4a10160427cb", "yolofeed.ultralytics_seam.final_figures",
           why="draws its four curves by the module's names plot_pr_curve and plot_mc_curve, each with its file and "
               "on_plot as keywords, nothing read back from the files: final_figures' stand-ins hand them to children",
           others=(
               _r("8.4.138", "8.4.183", "eb4a25566df18040",
                  "draws the curves also where no class has a label (8.4.184: not then); the same calls otherwise"),
           )),
    Pinned("ultralytics.models.yolo.detect.val.DetectionValidator.finalize_metrics", "234f9c369fbe99f9",
           "yolofeed.ultralytics_seam.final_figures",
           why="draws the confusion matrix twice with its class's plot method, save_dir, normalize and on_plot as "
               "keywords, and reads nothing back from the files"),
    Pinned("ultralytics.models.yolo.detect.val.DetectionValidator.plot_val_samples", "b3554e593c351be2",
           "yolofeed.ultralytics_seam.final_figures",
           why="calls its module's plot_images with the batch (its images in 'img') as the keyword labels: the grid's "
               "stand-in slices labels['img'] (segment and pose validators draw with this method)"),
    Pinned("ultralytics.models.yolo.detect.val.DetectionValidator.plot_predictions", "da2c25fc6a58bcbf",
           "yolofeed.ultralytics_seam.final_figures",
           why="calls its module's plot_images with the batch's images as the keyword images and predictions without "
               "'img' as labels: the grid's stand-in slices images"),
    Pinned("ultralytics.models.yolo.obb.val.OBBValidator.plot_predictions", "7d8ef33f6f3a65ab",
           "yolofeed.ultralytics_seam.final_figures",
           why="as DetectionValidator.plot_predictions, with its own module's plot_images",
           others=(
               _r("8.4.138", "8.4.163", "56c1da9a178c0d93",
                  "every prediction plotted (8.4.164: at most max_det an image); plot_images called the same way"),
           )),
    Pinned("ultralytics.models.yolo.detect.train.DetectionTrainer.plot_training_samples", "aa42707334a79e92",
           "yolofeed.ultralytics_seam.train_grid_shown",
           why="calls its module's plot_images with the batch (its images in 'img') as the keyword labels and its "
               "im_file as paths, at the default max_subplots: handed the first max_subplots images, it draws the "
               "same grid (segment, pose and OBB trainers draw with this method; classification's own builds "
               "batch_idx from the images it gets, which yolofeed does not train)"),
    Pinned("ultralytics.utils.plotting.plot_images", "497899e80d595f51", "yolofeed.ultralytics_seam.final_figures",
           why="draws only the first min(batch, max_subplots) images, labels['img'] taking the place of images, "
               "scaled by 255 where the first image's maximum is at most 1, boxes, keypoints and masks picked by "
               "image index (or per instance): the same grid from the first max_subplots images alone",
           others=(
               _r("8.4.138", "8.4.163", "d5899e6eaa706a29", "fname's annotation only; the drawing as in TESTED"),
               _r("8.4.164", "8.4.182", "1ea9520c5912c83d",
                  "semantic masks drawn on RGB without the BGR round trip (8.4.183); which images are drawn, and how "
                  "they are scaled, as in TESTED"),
           )),
    Pinned("ultralytics.models.yolo.detect.val.DetectionValidator.update_metrics", "e78f427b6c3bf65a",
           "yolofeed.train.val_metrics.update_metrics",
           why="per image: _prepare_batch's targets, _prepare_pred, _process_batch's tp, and the stats it hands "
               "metrics.update_stats (target_cls, np.unique of it, conf and pred_cls or float64 np.zeros(0), the "
               "file's name); under plots the confusion matrix's process_batch of the same predn and pbatch at "
               "conf=args.conf (its iou_thres left at its default); the rest (visualize's matches, json, txt) only "
               "under visualize/save_json/save_txt, where yolofeed calls this method instead "
               "(seam.batched_metrics_serve)", since=VAL_METRICS_SINCE),
    Pinned("ultralytics.utils.metrics.ConfusionMatrix.process_batch", "9fa1ee372b319671",
           "yolofeed.train.val_metrics.confuse_batch",
           why="detection: the detections above conf; class-agnostic box_iou with the targets; candidates (IoU above "
               "iou_thres with some target) by descending confidence, a stable sort; each claims the target of "
               "highest IoU (np.argmax) if above iou_thres, whose row is then zeroed; a claimed target counts at "
               "[detection's class, its class], an unclaimed one at [nc, its class], an unclaiming kept detection at "
               "[its class, nc]; matches kept only with save_matches (visualize)", since=VAL_METRICS_SINCE),
    Pinned("ultralytics.models.yolo.detect.val.DetectionValidator._process_batch", "efa94cd20261fedc",
           "yolofeed.train.val_metrics.update_metrics",
           why="tp: zeros where the image has no targets or no detections, else match_predictions of box_iou "
               "(greedy, not scipy)", since=VAL_METRICS_SINCE),
    Pinned("ultralytics.models.yolo.detect.val.DetectionValidator._prepare_batch", "3f2ab157f5a51754",
           "yolofeed.train.val_metrics.update_metrics",
           why="an image's targets: batch_idx == si in the batch's order, xywh2xyxy times the batch's (w, h, w, h)",
           since=VAL_METRICS_SINCE),
    Pinned("ultralytics.engine.validator.BaseValidator.match_predictions", "ea12b2486db93eca",
           "yolofeed.train.val_metrics.match_batch",
           why="greedy: class-masked IoU, detections in order that reach the lowest threshold with some target, "
               "each claiming per threshold the unclaimed target of highest IoU (np.argmax: the first on a tie)",
           since=VAL_METRICS_SINCE),
    Pinned("ultralytics.utils.metrics.box_iou", "d8fb56828b474543", "yolofeed.train.val_metrics.padded_iou",
           why="the IoU's float ops, element for element (slice products, + eps last)", since=VAL_METRICS_SINCE),
    # The augmentation's and the loaders' rules, re-implemented batched on the device (augment/, loader/): equal to
    # Ultralytics' given the same draws at the releases make test-releases runs (test_augment_ops.py); their
    # sources pinned here for every release of the range.
    Pinned("ultralytics.data.augment.Mosaic.__init__", "91ad1dc7db8955a3",
           "yolofeed.augment.geometry.mosaic.sample_mosaic",
           why="n = 4 (v8_transforms' default) and border (-imgsz // 2, -imgsz // 2): a canvas of 2 x imgsz, its "
               "centre drawn in [imgsz / 2, 3 imgsz / 2)"),
    Pinned("ultralytics.data.augment.Mosaic.get_params", "d6bac6d32d15f95f",
           "yolofeed.augment.geometry.mosaic.mosaic_layout",
           why="n = 4: the centre (xc, yc) = int(uniform(imgsz / 2, 3 imgsz / 2)) each (y first), each tile's place "
               "on the canvas and crop of its image (top-left, top-right, bottom-left, bottom-right) clipped to 2 x "
               "imgsz, padw and padh"),
    Pinned("ultralytics.data.augment.Mosaic.apply_image", "40980d2ab9f45773",
           "yolofeed.augment.geometry.mosaic.Mosaic.warp_step",
           why="the canvas filled with 114 (BORDER), each tile's crop copied into its place"),
    Pinned("ultralytics.data.augment.MixUp.get_params", "65b12fa1fbf05486",
           "yolofeed.augment.mix.mixup.sample_mixup",
           why="r ~ Beta(32, 32) (MIXUP_BETA)"),
    Pinned("ultralytics.data.augment.MixUp.apply_image", "15444a6f6ef767ad",
           "yolofeed.augment.mix.mixup.MixUp.compose_term",
           why="img x r + partner x (1 - r), truncated to uint8"),
    Pinned("ultralytics.data.augment.CutMix.__init__", "30f6d7682c53001c",
           "yolofeed.augment.mix.cutmix.sample_cutmix",
           why="beta 1.0 and num_areas 3 (CUTMIX_AREAS), the defaults v8_transforms builds it with"),
    Pinned("ultralytics.data.augment.CutMix._rand_bbox", "b05faf9bec9583e4",
           "yolofeed.augment.mix.cutmix.sample_cutmix",
           why="lam ~ Beta(beta, beta), the cut's sides int(side x sqrt(1 - lam)), its centre randint over the "
               "image, the corners centre -/+ side // 2 clipped to it"),
    Pinned("ultralytics.data.augment.CutMix.get_params", "29e3a9f00bddd90c",
           "yolofeed.augment.mix.cutmix.plan_cutmix",
           why="num_areas regions; one overlapping none of the sample's boxes drawn among them (none: skipped); the "
               "partner's boxes with at least 10 % of their area inside it, 1 % where the sample has segments "
               "(CUTMIX_IOA, CUTMIX_IOA_SEGMENTS); none: skipped",
           others=(
               _r("8.4.138", "8.4.167", "0c98f1a26ce71b9d",
                  "skips where no partner box is inside whether or not the sample has a semantic mask (8.4.168: not "
                  "where it has one): the same for detection, pose, OBB and segment samples, which have none"),
           )),
    Pinned("ultralytics.data.augment.CutMix.apply_image", "cbe48b1351e227c2",
           "yolofeed.augment.mix.cutmix.CutMix.compose_term",
           why="the partner's pixels copied into the region (its corners as int32)"),
    Pinned("ultralytics.data.augment.RandomPerspective._compute_affine_matrix", "cd76f79231b4da22",
           "yolofeed.augment.geometry.perspective.perspective_matrix",
           why="M = T @ S @ R @ P @ C in float32, drawn in this order: perspective x and y, degrees, scale (1 -/+ "
               "scale), shear x and y (degrees, tan), translate x and y (0.5 -/+ translate, times the output size)"),
    Pinned("ultralytics.data.augment.RandomPerspective.get_params", "7d79a6c28bf648a4",
           "yolofeed.augment.geometry.perspective.sample_perspective",
           why="size: self.size, (imgsz, imgsz) as v8_transforms builds it; M and the scale from "
               "_compute_affine_matrix"),
    Pinned("ultralytics.data.augment.RandomPerspective.apply_image", "8b1904a0398d39f9",
           "yolofeed.augment.geometry.perspective.RandomPerspective.warp_step",
           why="cv2.warpPerspective with perspective, else cv2.warpAffine of M's first two rows, border 114, at the "
               "output size"),
    Pinned("ultralytics.data.augment.RandomPerspective.apply_bboxes", "e30f2b9c46575fa7",
           "yolofeed.augment.geometry.perspective.transform_boxes",
           why="each box's four corners through M (divided by the third coordinate with perspective), their bounds"),
    Pinned("ultralytics.data.augment.RandomPerspective.box_candidates", "4a1ab16b5edb5d09",
           "yolofeed.augment.geometry.perspective.box_candidates",
           why="kept where width and height exceed 2 px, the area over the scaled original's exceeds area_thr (0.1) "
               "and the aspect ratio is below 100 (BOX_WH_MIN, BOX_AREA_RATIO, BOX_AR_MAX), eps 1e-16"),
    Pinned("ultralytics.data.augment.RandomHSV.apply_image", "b6d4363d6129627f",
           "yolofeed.augment.color.hsv.hsv_luts",
           why="r = uniform(-1, 1, 3) x the gains; lookup tables in HSV: hue (x + 180 r0) % 180, saturation and "
               "value clip(x (r + 1), 0, 255), saturation's 0 kept 0; nothing where every gain is 0",
           others=(
               _r("8.4.138", "8.4.184", "310c29fcd4786121",
                  "the three tables applied a channel at a time (split, cv2.LUT each, merge) where 8.4.185 applies "
                  "one 3-channel cv2.LUT: the same pixels"),
           )),
    Pinned("ultralytics.data.augment.RandomFlip.get_params", "d8c111418d182f67",
           "yolofeed.augment.geometry.flip.RandomFlip.sample",
           why="flip where random() < p"),
    Pinned("ultralytics.data.augment.RandomFlip.apply_image", "a53233845660156a",
           "yolofeed.augment.geometry.flip.RandomFlip.warp_step",
           why="np.flipud (vertical) or np.fliplr (horizontal)"),
    Pinned("ultralytics.data.augment.RandomFlip.apply_instances", "665e01b6506b7814",
           "yolofeed.augment.geometry.flip.flip_boxes",
           why="the boxes flipped in xywh about the normalised width or height (flip_boxes); keypoints reordered by "
               "flip_idx (flip_keypoints)"),
    Pinned("ultralytics.data.augment.LetterBox.get_params", "6c69df8a54be59c1",
           "yolofeed.augment.letterbox.letterbox_offsets",
           why="r = min(new / old) per side, no scale-up in validation (build_transforms), new_unpad = round(side x "
               "r) (at least 1 px a side), the padding halved (center), top and left round(d - 0.1), bottom and "
               "right round(d + 0.1). r is 1 for a pack's images (stored at imgsz; a rect batch's shape is never "
               "smaller), so yolofeed only pads (letterbox_offsets)",
           others=(
               _r("8.4.138", "8.4.182", "ad480e7f956a0467",
                  "new_unpad not raised to 1 px: the same wherever a side rounds to 1 px or more (an image within "
                  "1,280:1 at 640)"),
           )),
    Pinned("ultralytics.data.augment.LetterBox.apply_image", "6b0e08c0cf2ea35c",
           "yolofeed.augment.letterbox.letterbox",
           why="cv2.resize to new_unpad where the size differs (never, r being 1: get_params), then a constant "
               "border of padding_value (114)",
           others=(
               _r("8.4.138", "8.4.183", "c1e92aa26a91d08f",
                  "a 2-D image made 3-D only where it was resized (8.4.184: always): a pack holds 3-channel images"),
           )),
    Pinned("ultralytics.data.augment.LetterBox.__init__", "507f319a04c0c25e",
           "yolofeed.augment.letterbox.letterbox_offsets",
           why="the defaults validation's LetterBox keeps: auto False, scale_fill False, center True, padding_value "
               "114, INTER_LINEAR",
           others=(
               _r("8.4.138", "8.4.163", "14e56741eb61753b",
                  "new_shape's annotation alone differs"),
           )),
    Pinned("ultralytics.data.dataset.YOLODataset.build_transforms", "e7da6e088c375fce",
           "yolofeed.augment.letterbox.letterbox_offsets",
           why="validation: LetterBox(new_shape=imgsz, scaleup=False) alone, then Format (xywh, normalised, the "
               "masks at mask_ratio and overlap_mask); training: v8_transforms, mosaic, mixup and cutmix off under "
               "rect",
           others=(
               _r("8.4.138", "8.4.160", "1953c6a7c67f5220",
                  "new_shape given as (imgsz, imgsz), which get_params makes of imgsz; no semantic branch"),
               _r("8.4.161", "8.4.163", "fd9ac0a692342565",
                  "hyp's annotation alone differs, and new_shape as 8.4.138's"),
               _r("8.4.164", "8.4.177", "f4c623d6e47b0400",
                  "new_shape given as (imgsz, imgsz), which get_params makes of imgsz"),
           )),
    Pinned("ultralytics.data.utils.polygon2mask", "3998a6b3747cedac",
           "yolofeed.augment.masks.polygons_to_masks",
           why="cv2.fillPoly of the points truncated to int32 at the full size, then cv2.resize by the mask ratio"),
    Pinned("ultralytics.data.utils.polygons2masks", "d327c10865cb2f3f",
           "yolofeed.augment.masks.polygons_to_masks",
           why="one polygon2mask a polygon, in order (overlap_mask=False)"),
    Pinned("ultralytics.data.utils.polygons2masks_overlap", "27a738c3ed03f471",
           "yolofeed.augment.masks.polygons_to_masks",
           why="each polygon's mask; by area, largest first, painted as its index + 1 where larger (np.maximum): the "
               "smaller on top, and the order returned; int32 above 255 polygons"),
    Pinned("ultralytics.data.base.BaseDataset.set_rectangle", "fa214547076e8158",
           "yolofeed.loader.val.rect_batches",
           why="the images sorted by aspect (h / w); each batch's shape [max, 1] if all are wide, [1, 1 / min] if "
               "all are tall, else [1, 1]; ceil(shape x imgsz / stride + pad) x stride"),
    Pinned("ultralytics.data.build.build_yolo_dataset", "f5dafb1b886c90cf",
           "yolofeed.ultralytics_seam.split_fraction",
           why="validation datasets rectangular with pad 0.5 (RECT_PAD), training pad 0; the fraction 1 for a "
               "complete dataset, else get_split_fraction for 'train' or args.split",
           others=(
               _r("8.4.138", "8.4.138", "92c2143ad6112f58",
                  "a semantic dataset chosen otherwise; the fraction of a split not trained taken for its mode "
                  "('val'): seam.split_fraction chooses by release"),
               _r("8.4.139", "8.4.152", "aa3078cc8dc7ebee",
                  "a semantic dataset's background added otherwise; the fraction taken for the mode, as 8.4.138"),
               _r("8.4.153", "8.4.157", "9abc9946ff151af5",
                  "the same, the hyperparameters copied"),
               _r("8.4.158", "8.4.158", "d479f44e9f5e0086",
                  "the fraction taken for the mode, as 8.4.138"),
               _r("8.4.159", "8.4.163", "0c78dd4455b6efbe",
                  "img_path's annotation alone differs"),
           )),
    Pinned("ultralytics.models.yolo.detect.train.DetectionTrainer.build_dataset", "6dc21e33f78ef07a",
           "yolofeed.ultralytics_seam.loader_stride",
           why="the loaders' stride: the model's largest, at least 32; validation rectangular"),
    Pinned("ultralytics.models.yolo.detect.train.DetectionTrainer.get_dataloader", "49eee85bbb30312d",
           "yolofeed.train.trainer.FastTrainer.get_dataloader",
           why="drop_last = args.compile for training (TrainLoader's drop_last); shuffled training, ordered "
               "validation"),
    Pinned("ultralytics.engine.trainer.BaseTrainer._build_train_pipeline", "6abf2b5a1af7175d",
           "yolofeed.ultralytics_seam.accumulate_for",
           why="accumulate = max(round(nbs / batch), 1), at most the run's batches unless time= is set "
               "(accumulate_for); the train loader built before it, the validation loader from data[args.split] at "
               "twice the batch (OBB: the batch)",
           others=(
               _r("8.4.138", "8.4.158", "17874e8e8e74cbce",
                  "the validation loader from data['val'] or data['test']; no cap on accumulate (accumulate_for "
                  "chooses by release); the optimizer built unconditionally"),
               _r("8.4.159", "8.4.159", "dbc325dac490b215",
                  "no cap on accumulate (accumulate_for chooses by release); the optimizer built unconditionally"),
               _r("8.4.160", "8.4.165", "f66522a8c44f4be3",
                  "no cap on accumulate (accumulate_for chooses by release)"),
               _r("8.4.166", "8.4.176", "1b7e180b9aafe598",
                  "no cap on accumulate (accumulate_for chooses by release); the batch-of-1 check at min_imgsz as in "
                  "TESTED"),
           )),
    Pinned("ultralytics.utils.torch_utils.strip_optimizer", "3e75f075250e2962",
           "yolofeed.train.checkpoints.finished_run",
           why="a finished run's checkpoint: optimizer None and epoch -1 (finished_run and resumable_epoch read them "
               "so), the EMA as the model, half, its criterion None; written with torch.save to s "
               "(strip_atomically's temporary file)",
           others=(
               _r("8.4.138", "8.4.171", "5234c3643e7c13a7",
                  "leaves 'stopper' as it was (8.4.172: None); optimizer and epoch as in TESTED"),
           )),
    # What the early cuDNN plans (train/plans.py) take from the trainer before it exists: the model's layers
    # (model_ahead), its memory format (trains_channels_last) and cuDNN's and cuBLAS's flags (deterministic_ahead).
    Pinned("ultralytics.utils.torch_utils.init_seeds", "7e76d3f21ffc4eb9",
           "yolofeed.ultralytics_seam.arguments.deterministic_ahead",
           why="under deterministic (torch >= 2.0, which yolofeed requires): cudnn.deterministic True and "
               "CUBLAS_WORKSPACE_CONFIG ':4096:8' and PYTHONHASHSEED the seed, besides use_deterministic_algorithms "
               "and the seeds; otherwise unset_deterministic: deterministic_ahead sets those three alike (the seed "
               "the trainer's __init__ passes, seed + 1 + RANK, RANK -1) before that __init__ calls this",
           others=(
               _r("8.4.138", "8.4.138", "5969ee1fa0a29ba1",
                  "also seeds CUDA itself (torch.manual_seed does already), no fill_uninitialized_memory; cuDNN and "
                  "cuBLAS set as in TESTED"),
               _r("8.4.139", "8.4.153", "85dd2a176e981252",
                  "no fill_uninitialized_memory = False under deterministic (no plan depends on it); cuDNN and cuBLAS "
                  "set as in TESTED"),
           )),
    Pinned("ultralytics.utils.torch_utils.unset_deterministic", "1f1cb30311ea849e",
           "yolofeed.ultralytics_seam.arguments.deterministic_ahead",
           why="use_deterministic_algorithms off, cudnn.deterministic False, CUBLAS_WORKSPACE_CONFIG popped (and "
               "PYTHONHASHSEED): deterministic_ahead(False) sets cuDNN's, cuBLAS's and PYTHONHASHSEED alike",
           others=(
               _r("8.4.138", "8.4.153", "9b54b02daaff9091",
                  "no fill_uninitialized_memory = True (torch's default, no plan depends on it); cuDNN and cuBLAS as "
                  "in TESTED"),
           )),
    Pinned("ultralytics.models.yolo.detect.train.DetectionTrainer.get_model", "643d571ebe741267",
           "yolofeed.ultralytics_seam.model.model_ahead",
           why="DetectionModel(cfg, nc=data['nc'], ch=data['channels']), the weights loaded into it after: "
               "model_ahead builds the same layers, with weights of its own",
           others=(
               _r("8.4.138", "8.4.163", "ebd696427ea1e850", "cfg's and weights' annotations alone differ"),
           )),
    Pinned("ultralytics.engine.trainer.BaseTrainer.setup_model", "e219740f5fb18e24",
           "yolofeed.ultralytics_seam.model.model_ahead",
           why="a model named *.pt (in any case) is loaded with load_checkpoint and built from the loaded model's "
               "yaml, any other name is the cfg itself; pretrained= changes the weights only; get_model builds it",
           others=(
               _r("8.4.138", "8.4.183", "46a314ca66482c05",
                  "a name is a checkpoint only where it ends in '.pt' as typed (8.4.184: in any case): a '.PT' name "
                  "goes to get_model as a model yaml, which refuses its suffix, where model_ahead builds it as a "
                  "checkpoint's (an early pass made for a run that then fails in Ultralytics); a .pt name as in "
                  "TESTED"),
           )),
    Pinned("ultralytics.nn.tasks.load_checkpoint", "ab8e9f2333abd4a5", "yolofeed.ultralytics_seam.model.model_ahead",
           why="the model is the checkpoint's 'ema', else its 'model' (torch_safe_load), its yaml kept: the entry "
               "model_ahead reads the architecture from; and it is made float32 (as saved: NCHW) and moved to the "
               "device, where PyTorchBackend.load_model fuses it (count_flops_as_loaded's copy is so)",
           others=(
               _r("8.4.138", "8.4.142", "16756cabde430005",
                  "no QAT state restored (modelopt): the same entry, the same yaml"),
           )),
    Pinned("ultralytics.engine.trainer.BaseTrainer.get_dataset", "82a658a63d6bbf5b",
           "yolofeed.ultralytics_seam.model.model_ahead",
           why="a detection run's data goes through check_det_dataset; single_cls then sets names {0: 'item'} and nc "
               "1: model_ahead's one class",
           others=(
               _r("8.4.138", "8.4.158", "5a3f76f8fd0db6fe",
                  "the ndjson conversion and the dataset checks without split=; single_cls as in TESTED"),
           )),
    Pinned("ultralytics.data.utils.check_det_dataset", "3830f9c27a1110b2",
           "yolofeed.ultralytics_seam.model.model_ahead",
           why="of the yaml as loaded: nc is len(names) where names is set, else nc (an integer, or integer-like, "
               "for which model_ahead builds nothing), names and nc must agree; channels 3 where not set: "
               "model_ahead's nc and ch",
           others=(
               _r("8.4.138", "8.4.138", "816edcb7679de6b2",
                  "no masks_dir found beside the images; the rest as 8.4.139-161's"),
               _r("8.4.139", "8.4.161", "a6bdea303c843d63",
                  "a data= archive's yaml looked for under DATASETS_DIR (8.4.162: where it was extracted, or the file "
                  "itself); downloads of .zip URLs only; nc, names and channels as in TESTED"),
               _r("8.4.162", "8.4.163", "29fd4234f7b8c729",
                  "downloads of .zip URLs only; dataset's annotation; nc, names and channels as in TESTED"),
               _r("8.4.164", "8.4.182", "b95763317f0ea516",
                  "a download URL's scheme and suffix matched as typed (8.4.183: in lower case); nc, names and "
                  "channels as in TESTED"),
               _r("8.4.183", "8.4.183", "6f301d453bf3d195",
                  "a download URL's suffix matched with its query string on (8.4.184: clean_url); nc, names and "
                  "channels as in TESTED"),
           )),
    Pinned("ultralytics.engine.trainer.BaseTrainer._setup_train", "d701411791c68cc5",
           "yolofeed.ultralytics_seam.model.trains_channels_last",
           why="setup_model's model moved to the device, then to channels_last on CUDA where channels_last is True, or "
               "None off Windows (TORCH_1_11: always, torch >= 2.4 here); compile, quantize and distill_model, "
               "which change the model after, get no early plans (plans.start)",
           others=(
               _r("8.4.138", "8.4.138", "d45371abaeb6ce3a",
                  "channels_last None means channels-last on Windows too (8.4.146: not there), as "
                  "trains_channels_last says under these releases (since 8.4.146); the EMA made before "
                  "set_class_weights; imgsz checked after the scaler, no QAT"),
               _r("8.4.139", "8.4.142", "faa2b7300dd9b2fc",
                  "channels-last on Windows too, as 8.4.138 (and trains_channels_last); imgsz checked after the "
                  "scaler, no QAT"),
               _r("8.4.143", "8.4.145", "3638d5ce7b00a2d8",
                  "channels-last on Windows too, as 8.4.138 (and trains_channels_last)"),
               _r("8.4.146", "8.4.154", "443d3ff316836aa7",
                  "DDP given broadcast_buffers=False on every torch (8.4.155: forward_sync_buffers from torch 2.13); "
                  "channels_last as in TESTED"),
           )),
)
