"""Ultralytics' trainer fed from packs and augmented on the GPU: ``FastTrainer``, and ``FastDetectionTrainer`` (the
other tasks' trainers are in train/tasks.py).

Everything else is Ultralytics' own trainer: model, loss (YOLOv8/11/26), AMP, EMA, optimiser,
schedulers, validation, checkpoints, results.csv, resume and DDP. Only these things change:

* ``check_resume`` (inside Ultralytics' ``__init__``, before the device or the run folder) checks the final
  arguments against ``train/keys.py``: a key yolofeed cannot honour stops the run there, in one line. A resumed run
  gets back yolofeed's own options, which the run folder keeps in ``yolofeed.yaml`` (train/options.py).
* ``get_dataloader`` returns a ``TrainLoader`` (raw pack samples on the device, prefetched) and a
  ``ValLoader`` (Ultralytics' rect + letterbox batches), each with the split's ``fraction``, ``classes``
  and ``single_cls`` applied as Ultralytics' datasets apply them; packs are built on first use.
* The augmentation runs on the device (``GraphedAugment`` on CUDA: one graph replay per batch), with
  mosaic, MixUp and CutMix partners drawn from the images loaded lately (``PartnerPool``: Ultralytics'
  ``dataset.buffer``, same size by default), one batch ahead (``AugmentAhead`` wraps the train loader: the
  host never waits for it), and the trainer gets Ultralytics' batch. With ``augment_ahead=False`` the loader
  yields raw batches and ``preprocess_batch`` augments them (a host sync per step to learn the box count).
* ``_close_dataloader_mosaic`` switches the augmentation to its ``closed()`` settings.
* The step loses its host sync after the backward pass (``SyncFreeStep``, train/step.py): the progress
  bar's loss items reach the host one step late (the epoch's mean loss stays exact), and the detection
  loss takes the counts it would sync for from the batch (train/loss/; ``sync_free_loss=False``:
  Ultralytics' loss as it is); ``AugmentAhead`` computes them a step early.
* Checkpoints (``save_model``, ``final_eval``) keep Ultralytics' serialization, but each file is written to a temporary
  file and renamed over the old one (train/checkpoints.py): a kill mid-write leaves the previous checkpoint whole.
  ``save_model``'s files are written in a thread beside the training (``QueuedPath``, train/writes.py), waited for
  at each epoch's end and wherever the files may be read.
* On one CUDA GPU (``validate_beside``, on by default), validations run in a thread of their own, whose cuDNN set-up
  for every validation's batch shapes is paid while the first epoch trains (train/validation.py); the training thread
  waits for each, as for its own. With ``val_overlap`` (on by default where no logger or callback of the user's reads
  each epoch as it ends) an epoch's validation runs there while the next epoch trains, and its row, checkpoints and
  ``on_fit_epoch_end`` come at that epoch's end (train/overlap.py): the overrides of ``save_metrics`` and
  ``run_callbacks`` hold them. When and where a run validates is ``Validating``'s (train/validating.py).
* Before anything is built, the data yaml, the labels' kind and the run folder are checked (train/checks.py).
* The augmentation of the batches (the partner pool, the augmenter, ``preprocess_batch``, close_mosaic) is
  ``Augmenting``'s (train/augmenting.py).
* Ultralytics' plots (the labels', results.png, the final validation's figures and image grids) are made beside other
  work or beside each other, the same files: ``PlotsBeside``'s (train/plots.py).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shlex
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from yolofeed import processes
from yolofeed.augment import AugmentHyp
from yolofeed.augment.pool import PartnerPool
from yolofeed.errors import ConfigError, DatasetError, PackError, first_line, say_stopped
from yolofeed.loader import TrainLoader, ValLoader
from yolofeed.pack import codecs, open_or_build
from yolofeed.pack.lock import FolderLock
from yolofeed.pack.rebuild import check_splits, no_labels
from yolofeed.pack.report import report_path
from yolofeed.pack.verify import not_stock_skips
from yolofeed.train import checks, graphed, keys, options, plans, short_batches
from yolofeed.train.ahead import AugmentAhead
from yolofeed.train.augmenting import Augmenting
from yolofeed.train.bounds import LabelBound, label_stats
from yolofeed.train.checkpoints import (
    check_intact,
    finished_run,
    refuse_nothing_to_resume,
    resume_named,
    strip_atomically,
    sweep,
    trim_results,
)
from yolofeed.train.plans import PlansAhead
from yolofeed.train.plots import PlotsBeside
from yolofeed.train.saver import Saver
from yolofeed.train.step import SyncFreeStep, early_candidates_augmented
from yolofeed.train.validating import Validating
from yolofeed.train.warmup import batch_sizes, warm_up
from yolofeed.train.writes import WRITES, QueuedPath
from yolofeed.ultralytics_seam import (
    DEFAULT_CFG,
    LOCAL_RANK,
    LOGGER,
    RANK,
    TRAINING_EVENTS,
    DetectionTrainer,
    checkpoint,
    data_complete,
    data_split,
    data_yaml,
    epoch_readers,
    get_save_dir,
    loader_stride,
    results_csv,
    resuming,
    run_first,
    set_criterion,
    split_fraction,
    start_epoch,
    step_autocast,
    stop_asked,
    torch_distributed_zero_first,
    train_side,
    unwrap_model,
    weights_dir,
    world_size,
    write_checkpoints_as,
)


class FastTrainer(Augmenting, Validating, PlotsBeside, PlansAhead, SyncFreeStep):
    """The GPU-resident data pipeline, before an Ultralytics trainer in the bases (``FastDetectionTrainer``).

    A task's trainer is this mixin and Ultralytics' trainer of that task: the pack, the loaders, the augmentation,
    the step, checkpoints and validation are the same for every task; what differs is what the batches carry.
    Pack options are class attributes (Ultralytics rejects unknown training keys); ``with_options(pack_dir=...)``
    makes a configured subclass, which Ultralytics' DDP launch pickles by value, so every rank sees the same options.
    """

    carried_task: str = "detect"  # the task of Ultralytics' trainer this mixin sits before (keys.TRAINED)
    pack_format: str = codecs.AUTO  # how the pack stores images: a yolofeed.pack.codecs name; auto: chosen by size
    pack_rebuild: str = "auto"  # build missing or stale packs; "check": also label contents; "never" refuses them
    pack_dir: str | None = None  # default: beside the data yaml
    augment_ahead: bool = True  # augment one batch ahead (no host sync per step); False: in preprocess_batch
    partner_pool: int | str = "auto"  # images partners are drawn from: "auto" as Ultralytics' buffer,
    # min(n, 8 x batch, 1000) per GPU (1.39 GB at 640 px, batch 128); fewer for small GPUs; 0: the batch itself
    warm_up: bool = True  # on CUDA, pay cuDNN's per-batch-size set-up before the first epoch (train/warmup.py)
    warm_up_s: float | None = None  # the warm-up's seconds, once it ran
    warm_up_parts: dict[str, float] | None = None  # and its parts (warmup.warm_up's ``parts``)
    validate_beside: bool = True  # on one CUDA GPU, validate in a thread set up during the first epoch (validation.py)
    val_period: int = 1  # validate every N epochs and at the last (see validate); 1: every epoch, as Ultralytics
    # with validate_beside: an epoch's validation runs while the next trains (overlap.py); None: where no callback but
    # Ultralytics' idle ones and yolofeed's reads each epoch as it ends (seam.epoch_readers)
    val_overlap: bool | None = None
    batched_val_metrics: bool = True  # a detection validator's statistics a batch at once (get_validator)
    # each checkpoint serialised in a process of its own, from host copies (train/saver.py); None: where the trainer
    # trains on CUDA (whose GPU otherwise waits for save_model)
    save_process: bool | None = None
    _saver: Saver | None = None  # the checkpoints' child, once started (_start_saver)
    mask_room: int = 1  # segment: the mask rasteriser's slots, in multiples of its own; doubled after an overflow
    monitor: dict | None = None  # the live monitor's keys (yolofeed.monitor.MonitorConfig), attached by the trainer
    # sync_free_step, sync_free_loss, fast_musgd, graphed_step, half_input: the step's options (SyncFreeStep,
    # train/step.py)
    _given: frozenset = frozenset()  # the options with_options set: on resume they win over the recorded ones
    trained = False  # every epoch trained: the run is in its final validation or done (``final_eval``)
    validated = False  # and best.pt's final validation ended

    @classmethod
    def with_options(cls, **given: Any) -> type[FastTrainer]:
        """A subclass with options set, e.g. ``with_options(pack_rebuild="never", pack_dir="/fast/ssd")``.

        The run records every option in ``<run>/yolofeed.yaml`` and a resume restores them (train/options.py); one
        given here to the resuming trainer wins over the recorded one.
        """
        given = options.plain(given)
        options.check(given, cls.__name__)
        return type(cls.__name__, (cls,), {**given, "_given": cls._given | frozenset(given)})

    def __init__(self, cfg=None, overrides: dict[str, Any] | None = None, _callbacks: dict | None = None):
        self._started = time.time()  # a last.pt older than this is not this run's (resumable_checkpoint)
        if RANK != -1:  # a DDP rank: Ultralytics' generated script is its main, which own_process does not wrap
            processes.end_rank_if_left_running()
        # before Ultralytics' get_cfg: a typo is one line, not its help text; a yolofeed key says where it goes
        keys.check_overrides(overrides or {}, own=options.OPTIONS, routes=options.python_route)
        # the full batch's cuDNN plans, made in a thread of their own while Ultralytics builds the trainer
        self._plans: plans.Plans | None = plans.start(self, cfg or DEFAULT_CFG, overrides)
        early = self._plans
        try:
            self._build(cfg, overrides, _callbacks)
        except BaseException:  # any failure past here: no thread left inside torch as the process exits, and the
            # flags set ahead for it set back (a notebook's next run or other work finds them as it left them)
            self._close_plans()
            if early is not None:
                early.undo_ahead()
            raise

    def _build(self, cfg: Any, overrides: dict[str, Any] | None, _callbacks: dict | None) -> None:
        """The constructor's work once the early plans' thread started: Ultralytics' and yolofeed's."""
        super().__init__(cfg or DEFAULT_CFG, overrides, _callbacks)
        if self._plans is not None and not self._plans.serves(self.device):
            self._close_plans()  # another GPU than the one the trainer chose: its plans would not serve
        for line in keys.start_notes(self.args, self.device.type):
            LOGGER.info(line)
        if RANK in (-1, 0):  # Ultralytics made the run folder and wrote args.yaml there
            options.record(self.save_dir, self.run_options())
        if self.monitor is not None:
            from yolofeed.monitor.live import attach, attached

            if not attached(self.callbacks):  # yolofeed train attaches it to the model, which hands it over
                attach(self, **self.monitor)
        # the side Ultralytics will train at, for the default stride; get_dataloader refits it to the model's
        self.hyp = AugmentHyp.from_args(self.args, data=self.data, imgsz=train_side(self.args.imgsz))
        self._augment = None
        self._generator: torch.Generator | None = None  # the augmentation's draws: one sequence, across rebuilds
        self._pool: PartnerPool | None = None
        self.batch_images = 0  # images in the last batch handed to the step (the throughput counts real images)
        # a fixed shuffle per epoch number, whether or not DDP calls set_epoch, and after a resume too
        self.add_callback("on_train_epoch_start", lambda t: t.train_loader.sampler.set_epoch(t.epoch))
        self._warm: tuple[TrainLoader, int] | None = None  # the train loader and its label width, for the warm-up
        self._label_stats: tuple[float, float, float] | None = None  # the training split's labels an image
        self._polygons_kept = False  # the training pack keeps polygons: the perspective moves them, under a bound
        self._polygon_bound = LabelBound()
        # first at on_pretrain_routine_end, ahead of Ultralytics' loggers and a user's callbacks; each goes ahead of the
        # one before, so they run last to first: the warm-up (the labels plot drawn beside it), ..., and the labels plot
        # joined last, before any other callback runs, which stock hands a finished labels.jpg and no thread beside
        for fn in (type(self)._join_label_plots, type(self)._say_validation_plan, type(self)._start_validation_thread,
                   type(self)._warm_up):
            run_first(self, "on_pretrain_routine_end", fn)  # _warm_up: a subclass's own, if it has one
        self.add_callback("on_train_batch_end", type(self)._count_to_validation_warm_up)
        self.add_callback("on_train_batch_end", type(self)._raise_failed_write)
        self.add_callback("on_train_epoch_end", type(self)._wait_for_writes)
        self.add_callback("on_train_start", type(self)._capture_ahead)  # after SyncFreeStep's graphed.install
        self.add_callback("on_train_start", type(self)._start_saver)
        self.add_callback("on_train_epoch_end", type(self)._check_polygons)
        self.add_callback("on_train_epoch_start", type(self)._start_figure_drawers)
        self.add_callback("on_train_epoch_start", type(self)._short_batches_epoch)

    def train(self):
        """Ultralytics' training, with the run folder held (``hold_run_folder``) until it ends."""
        try:
            lock = self.hold_run_folder()
        except BaseException:
            self._close_plans()
            raise
        try:
            return super().train()
        finally:
            self._close_plans()  # a failure before the loop, where _close_run closes it
            if lock is not None:
                lock.release()

    def hold_run_folder(self) -> FolderLock | None:
        """This process's hold on the run folder while it trains (None in a DDP rank: its launcher holds it). Two
        trainings writing one folder (a resume of a run still training, ``exist_ok=True``) interleave their
        results.csv rows and overwrite each other's weights.

        Raises:
            ConfigError: another live process trains into the folder, naming it, the holder and the fix.
        """
        if RANK != -1:
            return None
        lock = FolderLock(self.save_dir, purpose="the lock of a run folder a training writes",
                          elsewhere="train into another folder (name=, project=)")
        if not lock.try_acquire(take_over=True):  # a killed training's file lock (Windows, NFS) does not block
            holder = lock.holder()
            raise ConfigError(f"another training writes into the run folder {self.save_dir}"
                              + (f" ({holder.describe()})" if holder else "")
                              + "; wait for it to end, or train into another folder (name=, project=)")
        return lock

    def run_options(self) -> dict[str, Any]:
        """yolofeed's options of this run (``with_options``' keys), as it uses them."""
        return {name: getattr(self, name) for name in options.OPTIONS}

    def check_resume(self, overrides: dict[str, Any]) -> None:
        """Ultralytics' resume check, then the final arguments (a checkpoint's included) against ``keys.RULES``.

        Runs inside Ultralytics' ``__init__`` before the device is selected and the run folder is made, so a
        refused key or a missing GPU stops the run in one line with nothing built.
        """
        if RANK in (-1, 0) and (named := resume_named(self.args.resume)) is not None:  # before Ultralytics reads it
            check_intact(named, once=True)  # (a truncated one: its refusal looks it up on GitHub first)
        super().check_resume(overrides)
        if resuming(self):
            self._refuse_nothing_to_resume()
            self._say_where_it_resumes()
            self._restore_options()
        keys.check(self.args, carried=(self.carried_task,))
        self.args.device = keys.check_device(self.args.device)
        if RANK in (-1, 0):  # DDP ranks above 0: their launcher checked the same arguments
            self._check_data()
            checks.check_run_folder(get_save_dir(self.args))

    def _refuse_nothing_to_resume(self) -> None:
        """A checkpoint Ultralytics' ``resume_training`` would refuse with an assertion and its traceback, after the
        model, the loaders and the optimizer are built (a DDP launch: in each rank), refused here, before any of it.

        Raises:
            ConfigError: a finished run's checkpoint, or one holding every epoch of its run.
        """
        if RANK in (-1, 0):
            refuse_nothing_to_resume(self.args.resume, epochs=self.args.epochs)

    def _say_where_it_resumes(self) -> None:
        """One line where the checkpoint lies in another run's folder than the one it recorded (a run folder copied,
        or moved): Ultralytics resumes a run in the folder recorded, and writes its weights and results.csv there."""
        beside = Path(self.args.resume).expanduser().resolve().parent
        recorded = getattr(self.args, "save_dir", None)
        recorded = recorded and Path(recorded).resolve()  # a relative one: from this working folder, as it is written
        if RANK in (-1, 0) and beside.name == "weights" and recorded and beside.parent != recorded:
            LOGGER.warning(f"yolofeed: {self.args.resume} lies in {beside.parent}, but its run was recorded in "
                           f"{recorded}: Ultralytics resumes it there, as stock does, writing its weights and "
                           f"results.csv in {recorded}, not beside the checkpoint")

    def _restore_options(self) -> None:
        """The options recorded with the run being resumed (``<run>/yolofeed.yaml``); those given again win.

        Raises:
            ConfigError: the run's yolofeed.yaml is damaged or holds what this yolofeed does not know.
        """
        path = options.file_for(self.args.resume, getattr(self.args, "save_dir", None))
        recorded = options.read(path)
        if recorded is None:
            LOGGER.info(f"yolofeed: resuming without {path} (a run of stock Ultralytics or of an older yolofeed): "
                        "yolofeed's options are their defaults and those given")
            return
        restored, kept = [], []
        for name, value in recorded.items():
            ours = options.normal(name, getattr(self, name))
            if name in type(self)._given:
                if ours != value:
                    kept.append(f"{name}={getattr(self, name)!r} (recorded {value!r})")
            else:
                if ours != value:
                    restored.append(f"{name}={value!r}")
                setattr(self, name, value)
        # what the record holds beyond yolofeed's defaults, where this trainer has the same already (given again, or a
        # monitor yolofeed train hands over)
        same = [f"{n}={v!r}" for n, v in recorded.items() if v != options.normal(n, getattr(FastTrainer, n, v))]
        LOGGER.info(f"yolofeed: resuming with this run's options from {path}"
                    + (f": {', '.join(restored)}" if restored else "" if kept else
                       f" (as recorded: {', '.join(same)})" if same else " (yolofeed's defaults)")
                    + (f"; given again, and so used instead: {', '.join(kept)}" if kept else ""))

    def _check_data(self) -> None:
        """The data yaml as Ultralytics' ``get_dataset`` reads it, and the packs this run will use.

        Ultralytics checks the yaml after making the run folder and reports a mistake in it as a ``RuntimeError``
        under two tracebacks; here it is one ``DatasetError`` line with Ultralytics' reason, and a missing or stale
        pack under ``pack_rebuild=never``, or a ``pack_dir`` no pack can be written to, is refused too. Costs a
        yaml read and, with ``never``, a pack open (a stat of every source file), both done again later.

        Raises:
            DatasetError: the data yaml or a split is unusable.
            PackError: see ``check_splits``.
        """
        try:
            data = checks.check_data_yaml(self.args.data, self.args.split)
        except DatasetError as e:
            if resuming(self) and not Path(str(self.args.data)).expanduser().is_file():  # a dataset moved since
                raise DatasetError(f"{e}. This is the data yaml {Path(str(self.args.model)).name} recorded; where the "
                                   "dataset moved, give its yaml again: "
                                   f"{shlex.join(['yolofeed', 'train', f'resume={self.args.model}', 'data=NEW.yaml'])}"
                                   " (in Python: train(resume=True, data=...))") from None
            raise
        if resuming(self):  # single_cls: the model predicts one class, whatever the yaml's count
            checks.check_resumed_classes(str(self.args.model), {**data, "nc": 1} if self.args.single_cls else data)
        if self.args.task in ("segment", "obb"):  # box rows for such a model: a look at the first label files
            checks.check_task_data(self.args.model, self.args.task, self.args.data)
        if self.args.task == "detect" and (self.args.copy_paste or 0) > 0:  # refused early where a look finds polygons
            keys.check_detect_copy_paste(float(self.args.copy_paste), checks.first_polygon_labels(self.args.data))
        # with 'never' the pack must be the one training opens: its size is train_side at the model's stride, not
        # known before the model is built; where a stride of 64 (P6 models) gives another side, either pack will do
        sides = dict.fromkeys([train_side(self.args.imgsz)] + ([train_side(self.args.imgsz, 64)]
                                                               if self.pack_rebuild == "never" else []))
        first: PackError | None = None
        for side in sides:
            try:  # every pack the run will build, its space counted together: counted one at a time, the val pack
                # could find no room once the train pack was written
                check_splits(data["yaml_file"], ("train", self.args.split), side, self.pack_format, self.pack_dir,
                             self.pack_rebuild, self.args.task, trains="train")
                return
            except PackError as e:
                first = first or e
        raise first

    # -- data -------------------------------------------------------------------------------
    def _split_of(self, dataset_path: Any) -> str:
        split = data_split(self, dataset_path)
        if split is None:
            raise ConfigError(f"yolofeed cannot tell which split of {data_yaml(self)} {dataset_path} is")
        return split

    def _pack(self, split: str, rank: int):
        imgsz = self.args.imgsz if isinstance(self.args.imgsz, int) else max(self.args.imgsz)
        with torch_distributed_zero_first(rank):  # rank 0 builds a missing pack, the others wait and open it
            return open_or_build(data_yaml(self), split, int(imgsz), format=self.pack_format,
                                 out=self.pack_dir, rebuild=self.pack_rebuild, progress=rank in (-1, 0),
                                 task=self.args.task)

    def get_dataloader(self, dataset_path: Any, batch_size: int = 16, rank: int = 0, mode: str = "train"):
        pack = self._pack(self._split_of(dataset_path), rank)
        if mode == "train" and pack.header["counts"]["label_files"] == 0:  # Ultralytics raises here too
            raise DatasetError(no_labels(pack, training=True))
        if unlike := not_stock_skips(pack.header["skipped"]):  # stock refuses the run on them, or trains them
            raise DatasetError(f"{len(unlike)} image(s) of split '{pack.split}' were skipped where Ultralytics would "
                               f"not skip them (each listed in {report_path(pack.path)}); the first: {unlike[0][1]}")
        if self.args.single_cls and rank in (-1, 0):
            checks.warn_single_cls_gap(pack)
        # Ultralytics' build_yolo_dataset: the split's fraction (1 for a dataset cut at download), classes, single_cls
        fraction = 1.0 if data_complete(self) else split_fraction(self.args, mode)
        labels = {"classes": self.args.classes, "single_cls": bool(self.args.single_cls)}
        if rank in (-1, 0):
            checks.warn_mixed_rows(pack, fraction)
        if mode == "train":
            if self.hyp.imgsz != pack.imgsz:  # the model's stride is known now (imgsz=100 trains at 128)
                self.hyp, self._augment = dataclasses.replace(self.hyp, imgsz=pack.imgsz), None
            world = max(world_size(self), 1)
            loader = TrainLoader(pack, batch_size, self.device, seed=self.args.seed, rank=max(rank, 0),
                                 world_size=world, fraction=fraction, drop_last=bool(self.args.compile), **labels)
            if self.carried_task == "detect" and self.hyp.copy_paste > 0:  # the labels decide, all of them
                keys.check_detect_copy_paste(self.hyp.copy_paste, None if pack.polygon_lengths is None else
                                             pack.header["source"]["label_dir"])
            table = loader.prefetcher.labels
            self._label_stats = label_stats(table.count[loader.dataset.indices])
            self._polygons_kept = pack.polygon_lengths is not None
            if rank in (-1, 0):
                checks.warn_long_polygons(pack, table)
                checks.warn_polygons_in_share(pack, fraction)
            self._pool = self._partner_pool(len(loader.dataset), batch_size, pack.imgsz, table.width,
                                            table.polygon_width)
            if isinstance(self.model, torch.nn.Module) and self.device.type == "cuda":  # an out-of-memory retry
                graphed.drop_stale(self, batch_size, len(loader))
            self._warm = loader, loader.prefetcher.labels.width
            self._augment = None  # a new loader (an out-of-memory retry halves the batch): graphs for the new pool
            if not self.augment_ahead:
                return loader
            counts = partial(early_candidates_augmented, self) if self.sync_free_loss else None
            return AugmentAhead(loader, self._augment_source, counts, convert=self.step_image)
        stride = loader_stride(self.model)
        masks = (int(self.args.mask_ratio), bool(self.args.overlap_mask)) if self.carried_task == "segment" else None
        return ValLoader(pack, batch_size, self.device, stride=stride, fraction=fraction, masks=masks, **labels)

    def _do_train(self):
        """Ultralytics' loop; when it fails, say which checkpoint resumes the run (Ultralytics saves none then)."""
        finished = False
        try:
            result = super()._do_train()
            finished = True
            return result
        except Exception as e:
            # what a validation beside had said comes before this error's line; a Ctrl-C meanwhile comes after it
            with processes.signals_deferred():
                self._stop_validations(finished)
                self._settle_writes()  # the checkpoint the line names on the disk
                if RANK in (-1, 0) and hasattr(self, "epoch"):  # else it failed setting up: the error says it all
                    saved = self.resumable_checkpoint()
                    say_stopped(e, f"training stopped {self._where_stopped()} by {type(e).__name__}: {e}. "
                                + (f"The last epoch saved is in {saved}; once the cause is fixed, continue "
                                   f"with: {shlex.join(['yolofeed', 'train', f'resume={saved}'])}"
                                   if saved else self.nothing_to_resume(error=True)),
                                log=lambda line: LOGGER.error(f"yolofeed: {line}"))
            raise
        finally:  # Ultralytics closes its loaders only when training ends normally; the train loader's thread may be
            # loading the next epoch (an error or Ctrl-C in validation, a checkpoint or a callback), and the YOLO
            # object keeps this trainer: stop it and free its slots now. A Ctrl-C or SIGTERM meanwhile is acted on
            # once all is closed (every wait here is bounded, but the checkpoint writes', as stock's own write is):
            # cut short, a wait for a thread inside torch can let the interpreter exit under it, which aborts the
            # process
            with processes.signals_deferred():
                self._close_run(finished)

    def _close_run(self, finished: bool) -> None:
        """The validation thread, the loaders' threads, a results plot's child and (a stopped run) the monitor,
        closed, and what the run held let go (``_let_go``). A stopped run first tells the loaders' threads to stop: a
        validation waiting for a read (one that hangs, say) then ends at once, and only the loader's thread is waited
        for. The validation thread is closed before the loaders, since it may iterate the validation loader."""
        loaders = [x for x in (getattr(self, "train_loader", None), getattr(self, "test_loader", None))
                   if hasattr(x, "close")]
        if not finished:
            for loader in loaders:
                if hasattr(loader, "stop_soon"):
                    loader.stop_soon()
        self._stop_validations(finished)
        self._settle_writes()
        if self._saver is not None:
            self._saver.close()
        for loader in loaders:
            (loader.release if hasattr(loader, "release") else loader.close)()
        self._let_go()
        self._stop_plots()
        if not finished:  # no on_train_end: the monitor's probe, port and writer closed here
            from yolofeed.monitor.live import close_attached

            close_attached(self.callbacks)

    def _let_go(self) -> None:
        """What a run holds beyond stock's trainer, let go once it ended or stopped: a notebook's YOLO object keeps the
        trainer (and, made from a .pt, shares its model) for as long as it lives. The loaders let go of their packs
        (a deleted or replaced pack's disk space stays taken while it is mapped) and buffers above; here the partner
        pool (1.4 GB of device memory at batch 128 and 640), the augmentation and its graphs, the step's graph (its
        memory pool) and swapped classes, and the loss: the model's criterion is left unset, as before its first loss
        (Ultralytics makes it again when needed), so a model saved after a stopped run pickles no yolofeed class."""
        self._pool = self._augment = self._warm = None
        self._close_plans()
        model = getattr(self, "model", None)
        if isinstance(model, torch.nn.Module):
            graphed.uninstall(model)
            set_criterion(model, None)
        # given back to the device, as Ultralytics' _clear_memory does (which a stopped run never reaches): other
        # processes, and nvidia-smi, see it free
        if getattr(getattr(self, "device", None), "type", None) == "cuda":
            gc.collect()
            torch.cuda.empty_cache()

    # -- checkpoints ----------------------------------------------------------------------------
    def resumable_checkpoint(self) -> Path | None:
        """The checkpoint a stopped run continues from: the last.pt this run saved, else the one it resumed from;
        None before either (a reused run folder's older last.pt is another run's), and once every epoch trained
        (``trained``: ``final_eval`` strips last.pt of what a resume needs)."""
        if self.trained:
            return None
        last = checkpoint(self, "last")
        if last.is_file() and last.stat().st_mtime >= self._started - 1:
            if finished_run(last):  # stripped by final_eval in another process (DDP's rank 0)
                self.trained = True
                return None
            return Path(last)
        resumed = getattr(self.args, "resume", None) if getattr(self, "resume", False) else None
        return Path(resumed) if resumed and Path(resumed).is_file() else None

    def _where_stopped(self) -> str:
        return "in the final validation" if self.trained else f"in epoch {self.epoch + 1}"

    def nothing_to_resume(self, error: bool = False) -> str:
        """What a stopped run without a checkpoint to resume from has instead, in one sentence (``error``: it failed,
        rather than being stopped)."""
        if not self.trained:
            return "No epoch was saved yet" + (": start again once the cause is fixed" if error else "")
        best = checkpoint(self, "best")
        weights = best if best.exists() else checkpoint(self, "last")
        if self.validated:
            return f"Every epoch was trained and saved, in {weights}, and validated"
        data = [f"data={self.args.data}"] if isinstance(self.args.data, (str, os.PathLike)) else []
        return (f"Every epoch was trained and saved, in {weights}; its final validation did not end: run it with: "
                f"{shlex.join(['yolo', 'val', f'model={weights}', *data])}")

    def save_model(self):
        """Ultralytics' checkpoints, its own serialization, each file (last.pt, best.pt, epochN.pt) written atomically:
        a kill mid-write leaves the previous checkpoint whole (train/checkpoints.py). Temporary files of a writer
        killed earlier in this folder are removed first. An epoch validated beside the next (``val_overlap``) is saved
        when its validation ends: here only its optimiser's and scaler's states are kept, and nothing is written.

        The files are written in a thread beside the training (``QueuedPath``); where a callback may read them (a
        logger's upload, a user's: ``seam.epoch_readers`` at the training loop's events), they are waited for
        here."""
        if self._holding:
            if self._overlapped is not None:  # else the epoch is discarded (_discard_epoch)
                self._overlapped.snapshot.keep_checkpoint_state(self)
            return False  # the loop runs no on_model_save: seam.end_epoch_late runs it
        write_checkpoints_as(self, QueuedPath)
        sweep(weights_dir(self))
        readers = epoch_readers(self, TRAINING_EVENTS)  # a callback of the next epoch's start, too
        # the checkpoints' child where nothing waits for its files at once: the run's last save is waited for by the
        # final validation, and a reader's by the wait below, which the child's hand-over would only lengthen. The
        # last is known where the loop knows it before saving (its final epoch, early stopping, time=, a callback's
        # stop); a stop asked after the save leaves that save to the child: correct, 0.6-0.9 s later at the run's end
        last = self.epoch + 1 >= self.epochs or stop_asked(self)
        saved = self._saver is not None and not (readers or last) and self._saver.save(self)
        if not saved:
            saved = super().save_model()
        if readers:
            WRITES.wait(weights_dir(self))
        return saved

    def _start_saver(self) -> None:
        """At the training's start, on the rank that saves: the checkpoints' child (train/saver.py), its imports beside
        the set-up, where ``save_process`` asks for it."""
        wanted = self.save_process if self.save_process is not None else self.device.type == "cuda"
        if wanted and self.args.save and RANK in (-1, 0) and self._saver is None:
            self._saver = Saver.start()

    def _raise_failed_write(self) -> None:
        """At each batch's end: a checkpoint write that failed beside the training (a full disk) raised here, with
        its one line; the file it was to replace is whole. Only a dictionary's look-up when none did."""
        if RANK in (-1, 0):
            WRITES.raise_failure(weights_dir(self))

    def _wait_for_writes(self) -> None:
        """At each epoch's end, before its validation (after which Ultralytics' NaN recovery reads last.pt, on every
        rank under DDP: the others read it once rank 0 is past this wait): the checkpoints queued before are on the
        disk, or their failure raised. They were written during this epoch's training: no wait."""
        if RANK in (-1, 0):
            WRITES.wait(weights_dir(self))

    def _settle_writes(self) -> None:
        """As the run stops or ends: every checkpoint write queued has ended; a failure not raised yet is said.
        Unbounded, as stock's own write in the training thread: a disk that hangs holds both."""
        if RANK in (-1, 0) and getattr(self, "wdir", None) is not None:
            folder = weights_dir(self)
            failure = WRITES.wait(folder, raise_failure=False, slow=lambda n: LOGGER.info(
                f"yolofeed: waiting for {n} checkpoint write{'s' * (n > 1)} in {folder} to end (a slow disk); each "
                "file is written whole or not at all"))
            if failure is not None:
                LOGGER.warning(f"yolofeed: {failure}")

    def resume_training(self, ckpt):
        """Ultralytics' resume; then the results.csv rows of epochs after the checkpoint's are dropped, as the run
        trains them again (a run killed between an epoch's row and its last.pt, or resumed from an older checkpoint:
        stock appends those rows a second time)."""
        super().resume_training(ckpt)
        if ckpt is None or not resuming(self) or RANK not in {-1, 0}:
            return
        try:
            dropped = trim_results(results_csv(self), start_epoch(self))
        except OSError as e:  # a folder this user cannot write, a full disk: stock only appends, and resumes
            LOGGER.warning(f"yolofeed: could not drop the rows of epochs after {start_epoch(self)} from "
                           f"{results_csv(self)} ({e.strerror or e}); the run resumes, and those epochs' rows will "
                           "be there twice")
            return
        if dropped:
            LOGGER.info(f"yolofeed: dropped epoch{'s' * (len(dropped) > 1)} {', '.join(map(str, dropped))} from "
                        f"{results_csv(self)}: the checkpoint resumed from was saved before "
                        f"{'they' if len(dropped) > 1 else 'it'} ended, and this run trains "
                        f"{'them' if len(dropped) > 1 else 'it'} again")

    def final_eval(self):
        """Ultralytics' ``final_eval`` (COPIED: ultralytics_seam/copied.py), its in-place rewrites of last.pt and
        best.pt (``strip_optimizer``) made atomic: a kill there would truncate the run's best.pt. The validation runs
        in the validation thread, where there is one; results.png is drawn beside it (``plot_metrics``), its figures
        by children started as the last epoch started, or here (train/plots.py)."""
        WRITES.wait(weights_dir(self))  # the last epoch's checkpoints on the disk, or their failure raised
        last, best = checkpoint(self, "last"), checkpoint(self, "best")
        model = best if best.exists() else None
        if model and self.args.plots:  # (without best.pt, children started at the last epoch end with the run)
            self._start_figure_drawers(last_epoch=False)  # a run stopped early: their imports beside the batches
        with torch_distributed_zero_first(LOCAL_RANK):  # strip only on GPU 0; other GPUs should wait
            if RANK in {-1, 0}:
                self.trained = True  # last.pt is a finished run's from here: nothing to resume
                ckpt = strip_atomically(last) if last.exists() else {}
                if model:
                    # update best.pt train_metrics from last.pt
                    strip_atomically(best, updates={"train_results": ckpt.get("train_results")})
        if RANK in {-1, 0} and self.args.plots and results_csv(self).is_file():  # complete: the last epoch was saved
            self._plot_results()
        if model:
            LOGGER.info(f"\nValidating {model}...")
            self.validator.args.plots = self.args.plots
            self.validator.args.compile = False  # disable final val compile as too slow
            self.metrics = self._validate_best(model)
            self.validated = True
            self.metrics.pop("fitness", None)
            self.epoch += 1  # log best metrics at step epochs+1, not overwriting last epoch
            self.run_callbacks("on_fit_epoch_end")
            self.epoch -= 1  # restore epoch

    def _warm_up(self) -> None:
        """Before the first epoch (Ultralytics' ``on_pretrain_routine_end``): its first batches start loading, and
        cuDNN is set up for each batch size meanwhile."""
        if self._warm is None:
            return
        loader, width = self._warm
        sampler = loader.sampler
        sampler.set_epoch(start_epoch(self))  # as on_train_epoch_start will: the batches loaded are the epoch's
        loader.prime()  # the loader thread's start, first gather and decode (nvJPEG's set-up) overlap the warm-up
        if not self.warm_up or self.device.type != "cuda":
            self._close_plans()
            return  # on the CPU there is no such set-up to pay
        amp = step_autocast(self)
        self._plans_serve()
        early = self._plans
        try:
            parts: dict[str, float] = {}
            seconds = warm_up(unwrap_model(self.model), sampler, self._new_augment(), width, self.device, amp,
                              corners=getattr(self, "carried_task", "detect") == "obb", after_full=self._set_up_beside,
                              beside=partial(self._short_batches_beside, amp, parts), parts=parts,
                              run=self._in_plans_thread)
            if early is not None and early.early_s is not None:
                parts["early_s"] = early.early_s  # the early pass's own seconds, in the trainer's build
            self.warm_up_s, self.warm_up_parts = seconds, parts  # the whole-run bench's breakdown reads them
            if self._validations_due:
                self._validations_due = False
                self._warm_validations()
        except (torch.cuda.OutOfMemoryError, RuntimeError, ValueError) as e:  # the step meets it where Ultralytics
            # copes (out of memory: it halves the batch) or fails as stock does (batch norm over one value: ValueError)
            torch.cuda.empty_cache()
            LOGGER.warning(f"yolofeed: skipped the warm-up before the first epoch ({first_line(e)}); training goes "
                           "on, its first epoch pays cuDNN's set-up")
            return
        finally:
            self._close_plans()  # where the short batches did not take it
        if RANK in (-1, 0):
            sizes = batch_sizes(sampler)
            short = unwrap_model(self.model).__dict__.get("_short")
            beside = sizes[1:] if short is not None else []
            before = ", ".join(str(n) for n in sizes if n not in beside)
            ahead = f" (after {parts['early_s']:.1f} s beside the trainer's build)" if "early_s" in parts else ""
            others = ", ".join(map(str, beside))
            how = (f", batch size{'s' * (len(beside) > 1)} {others} as GEMMs, which need none"
                   if isinstance(short, short_batches.InPlace) else f", for {others} beside it")
            LOGGER.info(f"yolofeed: cuDNN set up for batch size{'s' * (len(sizes) - len(beside) > 1)} {before} in "
                        f"{seconds:.1f} s before the first epoch{ahead}" + (how if beside else "")
                        + " (stock pays it inside its first epoch)")

    def _set_up_beside(self) -> None:
        """In the warm-up, once the full batch's cuDNN plans are made (``warm_up``'s ``after_full``): the graphed step
        installed and captured ahead, then, where no capture in the default global mode is left to make in the first
        epoch, the validations' thread started; their set-up is queued at the warm-up's end, to run behind the short
        batches' (``_warm_validations``)."""
        if self.graphed_step and graphed.why_not(self) is None:
            graphed.install(self)  # the on_train_start install finds it made
        self._capture_ahead()
        graph = unwrap_model(self.model).__dict__.get("_graph")
        if graph is not None and graph.flat is None and not graph.failed:
            return  # the graph is captured in the first epoch: the set-up waits for it (_count_to_validation_warm_up)
        self._start_validation_thread()
        # queued at the warm-up's end, behind the short batches' set-up (_warm_validations); where the warm-up fails
        # before, at the first epoch's third batch
        self._validations_due = self._validations is not None

    def _short_batches_beside(self, amp: bool | torch.dtype, parts: dict[str, float], sizes: list[int]) -> bool:
        """The warm-up's ``beside``: the epoch's other batch sizes (its last, short batch) forwarded in a thread of
        their own whose set-up runs beside the first epoch (train/short_batches.py), where the step's graph was
        captured ahead of it; returns whether they were taken."""
        model = unwrap_model(self.model)
        graph = model.__dict__.get("_graph")
        if not short_batches.BESIDE or graph is None or graph.flat is None:
            return False
        if short_batches.UNPLANNED:  # no plans to make now: the early plans' thread ends with the warm-up
            model.__dict__["_short"] = short_batches.InPlace(sizes, partial(
                short_batches.ShortBatches, model, sizes, self.hyp.imgsz, self.device, amp, parts))
            return True
        early = self._plans
        worker = early.worker if early is not None and early.alive else None
        model.__dict__["_short"] = short_batches.ShortBatches(model, sizes, self.hyp.imgsz, self.device, amp, parts,
                                                              worker=worker)
        if worker is not None:
            early.hand_over()  # the short batches' to close now (made: a copy that failed leaves it to _close_plans)
        return True

    def _short_batches_epoch(self) -> None:
        """At each epoch's start: the short batches run as GEMMs weigh the epochs left against their plans' cost
        (``short_batches.InPlace``)."""
        short = unwrap_model(self.model).__dict__.get("_short")
        if isinstance(short, short_batches.InPlace):
            short.epoch_starts(self.epochs - self.epoch)

    def _capture_ahead(self) -> None:
        """At ``on_train_start``, where the warm-up ran: the graphed step's capture (train/graphed.py) on a blank
        full batch, before the first epoch instead of in its first step, where the epoch has a full batch."""
        if self._warm is None or not self.warm_up or self.device.type != "cuda":
            return
        sampler = self._warm[0].sampler
        sizes = batch_sizes(sampler)
        if sizes and sizes[0] == sampler.batch_size:  # where the early plans' thread made the full batch's forward
            self._in_plans_thread(graphed.capture_ahead, self.model, sizes[0], self.hyp.imgsz, self.device,
                                  self.step_input_dtype() or torch.float32)


class FastDetectionTrainer(FastTrainer, DetectionTrainer):
    """``DetectionTrainer`` with a GPU-resident data pipeline.

    Use it as ``YOLO("yolo11n.yaml").train(trainer=FastDetectionTrainer, data=..., ...)`` or through
    ``yolofeed train``; ``FastDetectionTrainer.with_options(pack_dir="/fast/ssd")`` sets yolofeed's options.
    """
