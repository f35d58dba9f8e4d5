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
* On one CUDA GPU (``validate_beside``, on by default), validations run in a thread of their own, whose cuDNN set-up
  for every validation's batch shapes is paid while the first epoch trains (train/validation.py); the training thread
  waits for each, as for its own. With ``val_overlap`` (on by default where no logger or callback of the user's reads
  each epoch as it ends) an epoch's validation runs there while the next epoch trains, and its row, checkpoints and
  ``on_fit_epoch_end`` come at that epoch's end (train/overlap.py): the overrides of ``save_metrics`` and
  ``run_callbacks`` hold them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import time
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolofeed import processes
from yolofeed.augment import AugmentHyp, GpuAugment
from yolofeed.augment.geometry.polygons import POINTS as POLYGON_POINTS
from yolofeed.augment.pool import PartnerPool, ultralytics_capacity
from yolofeed.errors import ConfigError, DatasetError, PackError
from yolofeed.loader import TrainLoader, ValLoader
from yolofeed.loader.train import subset
from yolofeed.pack import codecs, open_or_build
from yolofeed.pack.rebuild import check_splits, no_labels
from yolofeed.pack.report import report_path
from yolofeed.pack.source import check_data_path, check_downloaded, load_data_yaml, missing_split
from yolofeed.pack.verify import not_stock_skips
from yolofeed.train import graphed, keys, options, overlap, val_metrics
from yolofeed.train.ahead import AugmentAhead
from yolofeed.train.bounds import LabelBound, label_stats, sources
from yolofeed.train.checkpoints import AtomicPath, finished_run, strip_atomically, sweep, trim_results
from yolofeed.train.plots import InThread, ResultsPlot
from yolofeed.train.step import SyncFreeStep, early_candidates_augmented
from yolofeed.train.validation import ValidationThread, loader_shapes, warm
from yolofeed.train.warmup import batch_sizes, warm_up
from yolofeed.ultralytics_seam import (
    DEFAULT_CFG,
    LOCAL_RANK,
    LOGGER,
    RANK,
    DetectionTrainer,
    batches_per_step,
    check_det_dataset,
    checkpoint,
    data_complete,
    data_split,
    data_yaml,
    end_epoch_late,
    forget_loss,
    get_save_dir,
    get_split_fraction,
    may_stop,
    results_csv,
    resuming,
    run_first,
    start_epoch,
    step_autocast,
    stop_asked,
    torch_distributed_zero_first,
    train_side,
    unwrap_model,
    validation_loader,
    validation_models,
    weights_dir,
    world_size,
    write_checkpoints_as,
)

CLOSE_WAIT_S = 30.0  # how long a stopped run waits for its validation thread to end (a validation batch, at most)


def _nothing() -> None:
    """A job for the validation thread: done once what was queued before it is."""


class FastTrainer(SyncFreeStep):
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
    mask_room: int = 1  # segment: the mask rasteriser's slots, in multiples of its own; doubled after an overflow
    monitor: dict | None = None  # the live monitor's keys (yolofeed.monitor.MonitorConfig), attached by the trainer
    # sync_free_step, sync_free_loss, fast_musgd, graphed_step, half_input: the step's options (SyncFreeStep,
    # train/step.py)
    _given: frozenset = frozenset()  # the options with_options set: on resume they win over the recorded ones
    _validations: ValidationThread | None = None  # where validations run (None: the training thread)
    _warm_validations_after: int | None = None  # training batches left before their set-up starts beside them
    _final_warm: list | None = None  # best.pt's set-up left (``warm``'s arguments a shape), one behind each validation
    _label_plots: InThread | None = None  # the training labels' plot, beside the warm-up (train/plots.py)
    _results_plot: ResultsPlot | None = None  # results.png, beside the final validation
    plots_beside: dict | None = None  # each plot made beside: (seconds it took, seconds the run waited for it)
    _overlapped: overlap.Overlapped | None = None  # the epoch validated beside this one (val_overlap)
    _holding = False  # from that epoch's validate to its on_fit_epoch_end: its row, checkpoints and callbacks wait
    _overlap_stream: torch.cuda.Stream | None = None  # the CUDA stream validations beside the training run on
    _overlap_off: str | None = None  # the last reason an epoch was not overlapped (said once each)
    trained = False  # every epoch trained: the run is in its final validation or done (``final_eval``)
    validated = False  # and best.pt's final validation ended
    _nan_fitness_epoch: int | None = None  # an epoch validated beside the next whose fitness was not a number
    val_overlapped: dict | None = None  # per epoch overlapped: its validation's seconds and the seconds waited for it

    @classmethod
    def with_options(cls, **given: Any) -> type[FastTrainer]:
        """A subclass with options set, e.g. ``with_options(pack_rebuild="never", pack_dir="/fast/ssd")``.

        The run records every option in ``<run>/yolofeed.yaml`` and a resume restores them (train/options.py); one
        given here to the resuming trainer wins over the recorded one.
        """
        options.check(given, cls.__name__)
        return type(cls.__name__, (cls,), {**given, "_given": cls._given | frozenset(given)})

    def __init__(self, cfg=None, overrides: dict[str, Any] | None = None, _callbacks: dict | None = None):
        self._started = time.time()  # a last.pt older than this is not this run's (resumable_checkpoint)
        if RANK != -1:  # a DDP rank: Ultralytics' generated script is its main, which own_process does not wrap
            processes.end_rank_if_left_running()
        # before Ultralytics' get_cfg: a typo is one line, not its help text; a yolofeed key says where it goes
        keys.check_overrides(overrides or {}, own=options.OPTIONS, routes=python_route)
        super().__init__(cfg or DEFAULT_CFG, overrides, _callbacks)
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
        # first at on_pretrain_routine_end, in this order: the labels plot is joined before any other callback runs
        # (Ultralytics' loggers, a user's), which stock hands a finished labels.jpg and no plotting thread beside
        for fn in (type(self)._join_label_plots, type(self)._start_validation_thread, type(self)._warm_up):
            run_first(self, "on_pretrain_routine_end", fn)  # _warm_up: a subclass's own, if it has one
        self.add_callback("on_train_batch_end", type(self)._count_to_validation_warm_up)
        self.add_callback("on_train_start", type(self)._capture_ahead)  # after SyncFreeStep's graphed.install
        self.add_callback("on_train_epoch_end", type(self)._check_polygons)

    def run_options(self) -> dict[str, Any]:
        """yolofeed's options of this run (``with_options``' keys), as it uses them."""
        return {name: getattr(self, name) for name in options.OPTIONS}

    def check_resume(self, overrides: dict[str, Any]) -> None:
        """Ultralytics' resume check, then the final arguments (a checkpoint's included) against ``keys.RULES``.

        Runs inside Ultralytics' ``__init__`` before the device is selected and the run folder is made, so a
        refused key or a missing GPU stops the run in one line with nothing built.
        """
        super().check_resume(overrides)
        if resuming(self):
            self._restore_options()
        keys.check(self.args, carried=(self.carried_task,))
        self.args.device = keys.check_device(self.args.device)
        if RANK in (-1, 0):  # DDP ranks above 0: their launcher checked the same arguments
            self._check_data()
            check_run_folder(get_save_dir(self.args))

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
        LOGGER.info(f"yolofeed: resuming with this run's options from {path}"
                    + (f": {', '.join(restored)}" if restored else "" if kept else " (yolofeed's defaults)")
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
            data = check_data_yaml(self.args.data, self.args.split)
        except DatasetError as e:
            if resuming(self) and not Path(str(self.args.data)).expanduser().is_file():  # a dataset moved since
                raise DatasetError(f"{e}. This is the data yaml {Path(str(self.args.model)).name} recorded; where the "
                                   "dataset moved, give its yaml again: "
                                   f"{shlex.join(['yolofeed', 'train', f'resume={self.args.model}', 'data=NEW.yaml'])}"
                                   " (in Python: train(resume=True, data=...))") from None
            raise
        if self.args.task in ("segment", "obb"):  # box rows for such a model: a look at the first label files
            check_task_data(self.args.model, self.args.task, self.args.data)
        if self.args.task == "detect" and (self.args.copy_paste or 0) > 0:  # refused early where a look finds polygons
            keys.check_detect_copy_paste(float(self.args.copy_paste), first_polygon_labels(self.args.data))
        # with 'never' the pack must be the one training opens: its size is train_side at the model's stride, not
        # known before the model is built; where a stride of 64 (P6 models) gives another side, either pack will do
        sides = dict.fromkeys([train_side(self.args.imgsz)] + ([train_side(self.args.imgsz, 64)]
                                                               if self.pack_rebuild == "never" else []))
        first: PackError | None = None
        for side in sides:
            try:  # every pack the run will build, its space counted together: counted one at a time, the val pack
                # could find no room once the train pack was written
                check_splits(data["yaml_file"], ("train", self.args.split), side, self.pack_format, self.pack_dir,
                             self.pack_rebuild, self.args.task)
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
            _warn_single_cls_gap(pack)
        # Ultralytics' build_yolo_dataset: the split's fraction (1 for a dataset cut at download), classes, single_cls
        fraction = 1.0 if data_complete(self) else get_split_fraction(
            self.args.fraction, "train" if mode == "train" else self.args.split)
        labels = {"classes": self.args.classes, "single_cls": bool(self.args.single_cls)}
        if rank in (-1, 0):
            _warn_mixed_rows(pack, fraction)
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
                _warn_long_polygons(pack, table)
                _warn_polygons_in_share(pack, fraction)
            self._pool = self._partner_pool(len(loader.dataset), batch_size, pack.imgsz, table.width,
                                            table.polygon_width)
            if isinstance(self.model, torch.nn.Module) and self.device.type == "cuda":  # an out-of-memory retry
                graphed.drop_stale(self, batch_size)
            self._warm = loader, loader.prefetcher.labels.width
            self._augment = None  # a new loader (an out-of-memory retry halves the batch): graphs for the new pool
            if not self.augment_ahead:
                return loader
            counts = partial(early_candidates_augmented, self) if self.sync_free_loss else None
            return AugmentAhead(loader, self._augment_source, counts, convert=self.step_image)
        stride = max(int(unwrap_model(self.model).stride.max()), 32) if self.model is not None else 32
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
                if RANK in (-1, 0) and hasattr(self, "epoch"):  # else it failed setting up: the error says it all
                    saved = self.resumable_checkpoint()
                    LOGGER.error(f"yolofeed: training stopped {self._where_stopped()} by {type(e).__name__}: {e}. "
                                 + (f"The last finished epoch is in {saved}; once the cause is fixed, continue "
                                    f"with: {shlex.join(['yolofeed', 'train', f'resume={saved}'])}"
                                    if saved else self.nothing_to_resume(error=True)))
            raise
        finally:  # Ultralytics closes its loaders only when training ends normally; the train loader's thread may be
            # loading the next epoch (an error or Ctrl-C in validation, a checkpoint or a callback), and the YOLO
            # object keeps this trainer: stop it and free its slots now. A Ctrl-C or SIGTERM meanwhile is acted on
            # once all is closed (every wait here is bounded): cut short, a wait for a thread inside torch can let
            # the interpreter exit under it, which aborts the process
            with processes.signals_deferred():
                self._close_run(finished)

    def _close_run(self, finished: bool) -> None:
        """The validation thread, the loaders' threads, a results plot's child and (a stopped run) the monitor,
        closed. A stopped run first tells the loaders' threads to stop: a validation waiting for a read (one that
        hangs, say) then ends at once, and only the loader's thread is waited for. The validation thread is closed
        before the loaders, since it may iterate the validation loader."""
        loaders = [x for x in (getattr(self, "train_loader", None), getattr(self, "test_loader", None))
                   if hasattr(x, "close")]
        if not finished:
            for loader in loaders:
                if hasattr(loader, "stop_soon"):
                    loader.stop_soon()
        self._stop_validations(finished)
        for loader in loaders:
            loader.close()
        if self._results_plot is not None:  # the run stopped in final_eval: no zombie kept with the trainer
            self._results_plot.abandon()
            self._results_plot = None
        if not finished:  # no on_train_end: the monitor's probe, port and writer closed here
            from yolofeed.monitor.live import close_attached

            close_attached(self.callbacks)

    def _stop_validations(self, finished: bool) -> None:
        """The validation thread closed and waited for (``CLOSE_WAIT_S`` at most), once the loop ended (``finished``)
        or stopped; an epoch validated beside the next that did not end is said so, after what its validation
        printed. Nothing the second time."""
        job, self._overlapped, self._holding = self._overlapped, None, False
        if self._validations is not None:
            if not finished:  # an error or Ctrl-C: what runs there stops at its next batch or shape
                self._validations.cancel()
            if not self._validations.close(wait=CLOSE_WAIT_S):
                LOGGER.warning(f"yolofeed: the validation thread did not stop within {CLOSE_WAIT_S:g} s; going on "
                               "without it")
                processes.left_running("the validation thread")
            self._validations = None
            self._final_warm = None  # best.pt's copy, if no validation came
        if job is not None:
            if job.future is not None and job.future.done() and job.held:
                job.print_held()  # what it said before it stopped (a failure's warning, say)
            done = job.future
            ended = done is not None and done.done() and not done.cancelled() and done.exception() is None
            n = job.snapshot.epoch + 1
            LOGGER.warning(f"yolofeed: epoch {n}'s validation, run beside the training, "
                           + (f"ended, but the run stopped before epoch {n + 1}'s end, where it is written: "
                              if ended else "did not end: ") + "its results.csv row and checkpoints are not written")

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
        when its validation ends: here only its optimiser's and scaler's states are kept, and nothing is written."""
        if self._holding:
            if self._overlapped is not None:  # else the epoch is discarded (_discard_epoch)
                self._overlapped.snapshot.keep_checkpoint_state(self)
            return False  # the loop runs no on_model_save: seam.end_epoch_late runs it
        write_checkpoints_as(self, AtomicPath)
        sweep(weights_dir(self))
        return super().save_model()

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
        """Ultralytics' ``final_eval`` (COPIED: ultralytics_seam/pins.py), its in-place rewrites of last.pt and best.pt
        (``strip_optimizer``) made atomic: a kill there would truncate the run's best.pt. The validation runs in
        the validation thread, where there is one; results.png is drawn beside it (``plot_metrics``)."""
        last, best = checkpoint(self, "last"), checkpoint(self, "best")
        model = best if best.exists() else None
        with torch_distributed_zero_first(LOCAL_RANK):  # strip only on GPU 0; other GPUs should wait
            if RANK in {-1, 0}:
                self.trained = True  # last.pt is a finished run's from here: nothing to resume
                ckpt = strip_atomically(last) if last.exists() else {}
                if model:
                    # update best.pt train_metrics from last.pt
                    strip_atomically(best, updates={"train_results": ckpt.get("train_results")})
        if RANK in {-1, 0} and self.args.plots and results_csv(self).is_file():  # complete: the last epoch was saved
            self._results_plot = ResultsPlot(results_csv(self))
        if model:
            LOGGER.info(f"\nValidating {model}...")
            self.validator.args.plots = self.args.plots
            self.validator.args.compile = False  # disable final val compile as too slow
            self.metrics = self._in_validation_thread(self.validator, model=model, final=True)
            self.validated = True
            self.metrics.pop("fitness", None)
            self.epoch += 1  # log best metrics at step epochs+1, not overwriting last epoch
            self.run_callbacks("on_fit_epoch_end")
            self.epoch -= 1  # restore epoch

    # -- plots beside ---------------------------------------------------------------------------
    def plot_training_labels(self):
        """Ultralytics' labels plot (``labels.jpg``), drawn in a thread beside the warm-up (train/plots.py); the first
        epoch starts once it is drawn (``_join_label_plots``), and what it raises is raised there."""
        self._label_plots = InThread(super().plot_training_labels, "yolofeed-label-plots")

    def _join_label_plots(self) -> None:
        """Last at ``on_pretrain_routine_end``, after the warm-up: wait for the labels plot."""
        plots, self._label_plots = self._label_plots, None
        if plots is not None:
            waited = plots.join()
            self.plots_beside = {**(self.plots_beside or {}), "labels": (plots.seconds, waited)}

    def plot_metrics(self):
        """Ultralytics' results.png, drawn beside the final validation (``final_eval``): waited for here, where stock
        draws it; drawn here as stock draws it where that did not serve (no child process, a failure, a message)."""
        plot, self._results_plot = self._results_plot, None
        if plot is not None:
            drawn, waited = plot.finish(self.on_plot)
            if drawn:
                self.plots_beside = {**(self.plots_beside or {}), "results": (plot.seconds, waited)}
                return
        super().plot_metrics()

    def get_validator(self):
        """Ultralytics' validator; with ``batched_val_metrics`` a detection validator gathers each batch's statistics
        at once (``train/val_metrics.py``: the same statistics, one IoU and one copy to the host a batch)."""
        validator = super().get_validator()
        if self.batched_val_metrics:
            val_metrics.install(validator)
        return validator

    def validate(self):
        """Ultralytics' validation every ``val_period``-th epoch, at the last, and wherever its early stopping may stop
        the run (``possible_stop``, ``stop``); the epochs between are not validated.

        An epoch not validated writes ``nan`` for every validation metric in results.csv (and hands it to the loggers)
        and has no fitness: best.pt stays the best validated epoch's (before the first validation it follows last.pt,
        as with ``val=False``), and ``patience`` counts epochs since the best validated one, checked at validations.

        With ``val_overlap`` an epoch's validation may run while the next epoch trains (``_validate_beside_next``); its
        row, checkpoints and callbacks then come at the next epoch's end, here, before anything of that epoch.
        """
        stopping = stop_asked(self)
        self._end_overlapped_epoch()
        if stop_asked(self) and not stopping:  # the epoch ended late asked to stop (a callback): stock stopped there
            return self._discard_epoch()
        epoch = self.epoch + 1
        if self.val_period <= 1 or epoch % self.val_period == 0 or epoch >= self.epochs or may_stop(self):
            if self._validate_beside_next():
                return self.metrics, None  # held: save_metrics, save_model and run_callbacks wait for it
            return self._in_validation_thread(super().validate)
        return {k: float("nan") for k in self.metrics}, None

    def save_metrics(self, metrics):
        """Ultralytics' results.csv row; an epoch validated beside the next writes its own when it ends."""
        if not self._holding:
            super().save_metrics(metrics)

    def run_callbacks(self, event: str):
        """Ultralytics' callbacks; an epoch validated beside the next runs its ``on_model_save`` and
        ``on_fit_epoch_end`` when it ends (``seam.end_epoch_late``)."""
        if self._holding and event in ("on_model_save", "on_fit_epoch_end"):
            if event == "on_fit_epoch_end":  # the loop's last word on this epoch: it has set epoch_time
                if self._overlapped is not None:
                    self._overlapped.snapshot.epoch_time = getattr(self, "epoch_time", None)
                self._holding = False
            return
        super().run_callbacks(event)

    # -- an epoch's validation beside the next epoch (val_overlap, train/overlap.py) ---------------------------------
    def _validate_beside_next(self) -> bool:
        """Start this epoch's validation in the validation thread, on a snapshot of the EMA, and return at once (True);
        False where it cannot (``overlap.reason_not``: said once a reason) or without ``val_overlap``."""
        if self.val_overlap is False or self._validations is None or not self._validations.alive:
            return False
        loader = validation_loader(self)
        largest = max((n for n, _, _ in loader_shapes(loader)), default=int(getattr(loader, "batch_size", 0) or 1))
        cuda = self.device.type == "cuda"
        per_image = torch.cuda.max_memory_allocated(self.device) / max(int(self.args.batch), 1) if cuda else 0.0
        why = overlap.reason_not(self, largest, per_image)
        if why is not None:
            if why != self._overlap_off and self.epoch + 1 < self.epochs:
                LOGGER.info(f"yolofeed: epoch {self.epoch + 1} is validated before the next starts ({why})")
            self._overlap_off = why
            return False
        snapshot = overlap.Snapshot.of(self)
        ready = stream = None
        if cuda:
            ready = torch.cuda.Event()
            ready.record()  # on the training thread's stream, after the snapshot's copies
            self._overlap_stream = stream = self._overlap_stream or torch.cuda.Stream(self.device)
        job = overlap.Overlapped(snapshot, header=getattr(self.validator, "get_desc", str)())
        job.future = self._submit_validation(overlap.run_beside, job, self.validator, self, ready, stream)
        self._overlapped, self._holding = job, True
        return True

    def _discard_epoch(self):
        """The run stops after the epoch that just ended late (a callback at its end set ``stop``), where stock's run
        stopped: nothing of this epoch, trained while that one's validation ran, is validated or written (no row,
        checkpoint or callback at its end: held as an overlapped epoch's are, never ended), and the trainer's epoch is
        that one's again (``final_eval`` and its callbacks read it)."""
        LOGGER.info(f"yolofeed: the run stops after epoch {self.epoch}, as asked at its end (which val_overlap runs "
                    f"during the next epoch): epoch {self.epoch + 1}'s training is not kept")
        self.epoch -= 1
        forget_loss(self)  # nor is its loss: Ultralytics' NaN recovery, after this, reads it
        self._holding = True  # with no epoch overlapped: the loop's row, checkpoints and callbacks of this one, none
        return self.metrics, None

    def _settle_overlapped(self) -> None:
        """Before a CUDA graph capture in the training thread: wait for the epoch validated beside this one, if any,
        and for best.pt's set-up pass queued behind it (``Overlapped.settle``); it is still ended at this epoch's
        end."""
        job = self._overlapped
        if job is None or job.future is None:
            return
        threads = self._validations
        job.settle(threads.submit(_nothing) if threads is not None and threads.alive else None)

    def _end_overlapped_epoch(self) -> None:
        """Wait for the epoch validated beside this one (usually ended by now), print its lines and end it as the
        loop would have (``seam.end_epoch_late``): its row, early stopping's check, its checkpoints, its callbacks."""
        job = self._overlapped
        if job is None:
            return
        try:
            metrics, waited = job.result()
        except BaseException:  # Ctrl-C here, or the validation failed: _do_train says what was not written
            self._validations.cancel()
            raise
        self._overlapped = None
        job.print_held()
        end_epoch_late(self, job.snapshot, metrics, job.ended)
        if self._nan_fitness_epoch is None and not np.isfinite(float(self.fitness)):
            self._nan_fitness_epoch = epoch = job.snapshot.epoch + 1
            LOGGER.warning(f"yolofeed: epoch {epoch}'s fitness is {self.fitness} with its loss and EMA finite; it was "
                           "validated beside the next epoch, so Ultralytics' NaN recovery (reload last.pt and train "
                           "the epoch again) did not run for it. Every later epoch is validated before the next "
                           "starts, where it does, and a resume too (val_overlap=False does so from the start)")
            if RANK in (-1, 0):  # the run's options as it now uses them: a resume validates in place too
                options.record(self.save_dir, {**self.run_options(), "val_overlap": False})
        self.val_overlapped = {**(self.val_overlapped or {}), job.snapshot.epoch + 1: {
            "val_s": job.seconds, "waited_s": waited, "settled_s": job.settled}}

    # -- validation beside the training ---------------------------------------------------------
    def _validates_beside(self) -> bool:
        """Whether validations run in a thread of their own: with ``validate_beside`` on one CUDA GPU (under DDP a
        validation gathers across ranks in the ranks' own threads; the CPU has no cuDNN set-up to pay ahead)."""
        return bool(self.validate_beside) and RANK == -1 and self.device.type == "cuda"

    def _start_validation_thread(self) -> None:
        """Before the first epoch (``on_pretrain_routine_end``, or earlier in the warm-up: ``_set_up_beside``): the
        thread validations will run in. Their set-up starts in the warm-up where the step's graph was captured ahead
        of the first epoch; else beside the training once its CUDA graphs are captured: the graphed step at the first
        batch, FastMuSGD at its second optimiser step (every ``accumulate`` batches). A capture in the default global
        mode (``make_graphed_callables``') fails where another thread allocates meanwhile; FastMuSGD's and the
        augmentation's capture in the thread-local mode."""
        if self.val_overlap and not self._validates_beside() and RANK in (-1, 0):
            LOGGER.info("yolofeed: val_overlap needs validations in a thread of their own (validate_beside, on one "
                        "CUDA GPU): each epoch is validated before the next starts")
        if not self._validates_beside() or self._validations is not None:  # started in the warm-up already
            return
        self._validations = ValidationThread(self.device)
        self._warm_validations_after = 2 * batches_per_step(self) + 1

    def _count_to_validation_warm_up(self) -> None:
        """After each training batch (``on_train_batch_end``): start the validations' set-up once the captures are
        made."""
        if self._warm_validations_after is None:
            return
        self._warm_validations_after -= 1
        if self._warm_validations_after <= 0:
            self._warm_validations()

    def _warm_validations(self) -> None:
        """Queue one blank pass at each shape every epoch's validation will meet, on a copy of the model it runs (made
        here, in the training thread, between two steps); the validation thread runs it while training goes on.
        best.pt's passes, for the final validation, wait for the first validation (``_in_validation_thread``): queued
        now, they would hold that validation back at the first epoch's end (4 s of yolo11n's on the 10k set). They go
        in one shape at a time, one behind each validation: all at once they outlast the next epoch's training, and
        its validation would wait for them (1.2 s on the 10k set)."""
        self._warm_validations_after = None
        if self._validations is None:
            return
        every_epoch, final = validation_models(self)
        # a training pass's peak per image bounds an inference pass's: the set-up never takes what training needs
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else 0
        per_image = peak / max(int(self.args.batch), 1)
        shapes = loader_shapes(validation_loader(self))
        args = (shapes, train_side(self.args.imgsz), self.device, per_image)
        self._validations.submit(warm, [every_epoch], *args, cancelled=self._validations.cancelled)
        model, autocast, dtype, first_one = final
        parts = [[]] if first_one else []  # its batch-1 warm-up first, as AutoBackend's
        parts += [[shape] for shape in shapes]
        self._final_warm = [([(model, autocast, dtype, first_one and k == 0)], part, *args[1:], LOGGER.debug)
                            for k, part in enumerate(parts)]

    def _in_validation_thread(self, fn, *args, final: bool = False, **kwargs):
        """``fn(*args, **kwargs)`` in the validation thread, waited for (its exception raised here), where there is
        one and it runs; else here."""
        if self._validations is None or not self._validations.alive:
            return fn(*args, **kwargs)
        done = self._submit_validation(fn, *args, final=final, **kwargs)
        try:
            return processes.result(done)
        except BaseException:  # Ctrl-C here, or the validation failed: nothing more runs beside a stopped run
            self._validations.cancel()
            raise

    def _submit_validation(self, fn, *args, final: bool = False, **kwargs) -> Future:
        """Queue ``fn(*args, **kwargs)`` in the validation thread (there is one, alive); its future. A validation before
        the set-up was queued (an epoch of few batches) queues it first. best.pt's set-up goes in a shape at a time,
        each behind a validation, beside the next epoch; what is left of it before the ``final`` one."""
        if self._warm_validations_after is not None:
            self._warm_validations()
        pending = self._final_warm or []
        if final:
            for part in pending:
                self._validations.submit(warm, *part, cancelled=self._validations.cancelled)
            pending = []
        validator = getattr(self, "validator", None)
        if validator is not None and self._validations.check_cancelled not in validator.callbacks["on_val_batch_start"]:
            validator.add_callback("on_val_batch_start", self._validations.check_cancelled)
        done = self._validations.submit(fn, *args, **kwargs)
        if pending:
            self._validations.submit(warm, *pending.pop(0), cancelled=self._validations.cancelled)
        self._final_warm = pending or None
        return done

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
            return  # on the CPU there is no such set-up to pay
        amp = step_autocast(self)
        try:
            parts: dict[str, float] = {}
            seconds = warm_up(unwrap_model(self.model), sampler, self._new_augment(), width, self.device, amp,
                              corners=getattr(self, "carried_task", "detect") == "obb", after_full=self._set_up_beside,
                              parts=parts)
            self.warm_up_s, self.warm_up_parts = seconds, parts  # the whole-run bench's breakdown reads them
        except (torch.cuda.OutOfMemoryError, RuntimeError, ValueError) as e:  # the step meets it where Ultralytics
            # copes (out of memory: it halves the batch) or fails as stock does (batch norm over one value: ValueError)
            torch.cuda.empty_cache()
            first_line = (str(e).splitlines() or [""])[0][:200]
            LOGGER.warning(f"yolofeed: skipped the warm-up before the first epoch ({type(e).__name__}: {first_line}); "
                           "training goes on, its first epoch pays cuDNN's set-up")
            return
        if RANK in (-1, 0):
            sizes = ", ".join(str(n) for n in batch_sizes(sampler))
            LOGGER.info(f"yolofeed: cuDNN set up for batch sizes {sizes} in {seconds:.1f} s before the first epoch "
                        "(stock pays it inside its first epoch)")

    def _set_up_beside(self) -> None:
        """In the warm-up, once the full batch's cuDNN plans are made (``warm_up``'s ``after_full``): the graphed step
        installed and captured ahead, then, where no capture in the default global mode is left to make in the first
        epoch, the validations' thread started and their set-up queued, so that it runs beside the rest of the warm-up
        (the last batch's plans, the augmentation's kernels) rather than beside the first epoch's training."""
        if self.graphed_step and graphed.why_not(self) is None:
            graphed.install(self)  # the on_train_start install finds it made
        self._capture_ahead()
        graph = unwrap_model(self.model).__dict__.get("_graph")
        if graph is not None and graph.flat is None and not graph.failed:
            return  # the graph is captured in the first epoch: the set-up waits for it (_count_to_validation_warm_up)
        self._start_validation_thread()
        if self._validations is not None:
            self._warm_validations()

    def _capture_ahead(self) -> None:
        """At ``on_train_start``, where the warm-up ran: the graphed step's capture (train/graphed.py) on a blank
        full batch, before the first epoch instead of in its first step, where the epoch has a full batch."""
        if self._warm is None or not self.warm_up or self.device.type != "cuda":
            return
        sampler = self._warm[0].sampler
        sizes = batch_sizes(sampler)
        if sizes and sizes[0] == sampler.batch_size:
            graphed.capture_ahead(self.model, sizes[0], self.hyp.imgsz, self.device,
                                  self.step_input_dtype() or torch.float32)

    # -- augmentation -------------------------------------------------------------------------
    def _partner_pool(self, n_images: int, batch_size: int, imgsz: int, labels: int = 0,
                      polygon_points: int = 0) -> PartnerPool | None:
        """The pool of recent images partners are drawn from, sized by ``partner_pool``; None: the batch itself.
        ``labels`` and ``polygon_points``: the most labels an image has and points a polygon has, for the memory
        line (``PartnerPool.nbytes``)."""
        size = options.partner_pool_size(self.partner_pool)
        given = size != "auto"
        if not given:
            size = ultralytics_capacity(n_images, batch_size)
        if size == 0:
            LOGGER.info("yolofeed: partner_pool=0, mosaic/MixUp/CutMix partners come from the batch itself")
            return None
        pool = PartnerPool(size, batch_size + 1)  # the sampler's last batch may hold one image more
        if RANK in (-1, 0):
            gb = pool.nbytes(imgsz, labels, polygon_points) / 1e9
            how = f"partner_pool={size}" if given else "as Ultralytics' buffer"
            LOGGER.info(f"yolofeed: mosaic/MixUp/CutMix partners from the last {pool.keep} images loaded, {how} "
                        f"({gb:.2f} GB of GPU memory; partner_pool=N for fewer)")
        return pool

    def _new_augment(self) -> GpuAugment:
        """The augmentation of this task's batches (``FastSegmentationTrainer``: with Format's masks)."""
        return GpuAugment(self.hyp, polygon_capacity=self._polygon_capacity())

    def _polygon_capacity(self) -> int | None:
        """The most polygons the perspective moves a batch: the labels' bound on the instances of its source images
        (``LabelBound``; copy-paste's copies count as many again). None (every slot) without polygons, before the
        loader, for a batch of few source images, or once a bound fell short."""
        if not self._polygons_kept or self._warm is None:
            return None
        return self._polygon_bound.capacity(self._warm[0].batch_size, sources(self.hyp, self.hyp.copy_paste > 0),
                                            self._label_stats)

    def _check_polygons(self) -> None:
        """At each epoch's end, while the polygons are bounded: whether the bound left instances unmoved this epoch.
        If so, one warning, and from the next epoch every slot is moved (the augmentation's graphs made again; a
        resumed run tries the bound again). Under DDP every rank takes the same decision."""
        bound = self._polygon_bound
        if not self._polygons_kept or not bound.on:  # the same on every rank
            return
        n = bound.epoch_past(self.device, world_size(self))
        if not n:
            return
        bound.on, self._augment = False, None
        last = self.epoch + 1 >= self.epochs
        LOGGER.warning(f"yolofeed: epoch {self.epoch + 1}: {n} instances were not moved by the perspective, beyond "
                       "the polygons a batch was bounded to from the training set's labels; those of them its crop "
                       "would have kept were left out of their batches"
                       + ("" if last else "; from the next epoch every polygon slot is moved (exact, and slower)"))

    def _augmenter(self):
        """The augmentation, made again after close_mosaic, a new loader or more mask room; its draws continue one
        generator's sequence (a new augmenter seeded again would repeat the first epoch's draws)."""
        if self._augment is None:
            aug = self._new_augment()
            if self._generator is None:
                cuda = self.device.type == "cuda"
                self._generator = torch.Generator(device=self.device if cuda else "cpu")
                # ranks draw differently; a resumed run from where it starts, not epoch 1's draws again (the state is
                # not in the checkpoint)
                self._generator.manual_seed(self.args.seed + 1000 * max(RANK, 0) + 1_000_003 * start_epoch(self))
            if self.device.type == "cuda":
                from yolofeed.augment.graphs import GraphedAugment

                self._augment = GraphedAugment(aug, generator=self._generator, device=self.device, pool=self._pool,
                                               before_capture=self._settle_overlapped)
            else:
                gen, pool = self._generator, self._pool
                self._augment = lambda b: aug(b, gen, pool)
        return self._augment

    def _augment_source(self, source):
        """The current augmenter (looked up per batch: close_mosaic replaces it) applied to a loader batch."""
        # the trainer may call this under autocast: the augmentation's arithmetic must stay float32/64
        with torch.autocast(self.device.type, enabled=False):
            out = self._augmenter()(source)
        self._polygon_bound.count(out.polygons_past)  # read once an epoch (_check_polygons)
        if out.segments is not None and out.masks is None and self.carried_task == "detect":
            out = dataclasses.replace(out, segments=None)  # the polygons made its boxes; a detection batch has none
        return out

    def preprocess_batch(self, batch: dict) -> dict:
        """Ultralytics' preprocessing; a raw loader batch (``augment_ahead=False``) is augmented first.

        ``AugmentAhead`` batches and the validator's are already Ultralytics' batches: stock path.
        """
        if "source" not in batch:
            self.batch_images = len(batch["img"])
            return super().preprocess_batch(batch)
        # boolean indexing learns N: a host sync, which AugmentAhead avoids
        out = self._augment_source(batch["source"]).to_ultralytics()
        out["im_file"] = batch["im_file"]
        self.batch_images = len(out["img"])
        return super().preprocess_batch(out)  # img.float() / 255 and multi_scale, as Ultralytics does

    def _close_dataloader_mosaic(self):
        """Ultralytics' close_mosaic: mosaic, mixup, cutmix and copy_paste off for the last epochs."""
        LOGGER.info("yolofeed: closing mosaic (GPU augmentation)")
        self.hyp = self.hyp.closed()
        self._augment = None


class FastDetectionTrainer(FastTrainer, DetectionTrainer):
    """``DetectionTrainer`` with a GPU-resident data pipeline.

    Use it as ``YOLO("yolo11n.yaml").train(trainer=FastDetectionTrainer, data=..., ...)`` or through
    ``yolofeed train``; ``FastDetectionTrainer.with_options(pack_dir="/fast/ssd")`` sets yolofeed's options.
    """


def python_route(name: str, value: Any) -> str | None:
    """Where a key of ``yolofeed train`` that Ultralytics does not know goes when passed to ``YOLO(...).train()``
    (the trainer's options, the live monitor's keys); None for any other key."""
    from yolofeed.monitor.live import TRAIN_KEYS

    if name == "monitor":
        call = "monitor={}" if value else "monitor=None"  # {}: on, with the monitor's defaults
    elif name in TRAIN_KEYS:
        call = f"monitor={{{name!r}: {value!r}}}"
    elif name in options.OPTIONS:
        call = f"{name}={value!r}"
    else:
        return None
    trainer = "FastSegmentationTrainer" if name == "mask_room" else "FastDetectionTrainer"  # or the task's own
    return (f"'{name}' is a key of 'yolofeed train', not of Ultralytics' train(): from Python it goes through the "
            f"trainer, YOLO(...).train(trainer={trainer}.with_options({call}), ...)")


def _warn_single_cls_gap(pack: Any) -> None:
    """Say which images ``yolo train single_cls=True`` would use and the pack left out.

    Under ``single_cls`` Ultralytics' label check skips the class range (``verify_image_label``: ``max_cls = 0``),
    so it keeps images whose class ids exceed ``nc``; a pack is built once for every run and skips them. Such
    labels are a mistake in the dataset either way: say so, with the fix, rather than train on fewer images silently.
    """
    out_of_range = [f for f, reason in pack.header.get("skipped", []) if "but the data yaml has nc=" in reason]
    if out_of_range:
        LOGGER.warning(f"yolofeed: single_cls=True: {len(out_of_range)} {pack.split} images use class ids beyond the "
                       f"data yaml's nc; yolo train would train on them under single_cls, the pack left them out "
                       f"(first: {out_of_range[0]}; all: {pack.path.with_name(pack.split + '.report.txt')})"
                       + ("; one with box rows would also make yolo train drop every polygon of these labels, whose "
                          "boxes it would then move as boxes" if pack.polygon_lengths is not None else "")
                       + ". Fix their labels or the yaml's names, then the pack rebuilds")


def _warn_mixed_rows(pack: Any, fraction: float | int) -> None:
    """Ultralytics' warning, in its words, where the detection images a run uses hold polygon and box rows mixed: its
    dataset then drops every polygon (``YOLODataset.get_labels``, after ``fraction=`` cut the files) and says so each
    run; the pack dropped them when it was built. With the whole split, its counts (``polygon_rows``, recorded since
    packs carry it); with a share, which rows it holds is not recorded: said without them."""
    box_images = pack.header.get("box_row_images")
    if not box_images:
        return
    tail = ("To resolve this only boxes will be used and all segments will be removed. To avoid this please supply "
            "either a detect or segment dataset, not a detect-segment mixed dataset.")
    polygons = pack.header.get("polygon_rows")
    if fraction == 1.0:
        counts = ("" if polygons is None else
                  f", but got len(segments) = {polygons}, len(boxes) = {pack.header['counts']['boxes']}")
        LOGGER.warning(f"yolofeed: {pack.split}: Box and segment counts should be equal{counts}. {tail}")
        return
    used = subset(pack, fraction)
    boxes_only = np.isin(used, box_images)
    if boxes_only.any() and (pack.index["label_count"][used][~boxes_only] > 0).any():
        LOGGER.warning(f"yolofeed: {pack.split}, fraction={fraction}: Box and segment counts should be equal in the "
                       f"images this run uses. {tail}")


def _warn_polygons_in_share(pack: Any, fraction: float | int) -> None:
    """Say where a ``fraction=`` share of a detection split holds only polygon rows and the pack no polygons.

    Ultralytics cuts the split's files before its label rule, so on a split of polygon and box rows mixed its share
    can be all polygons, whose boxes it then makes of the moved polygons; the pack, built once for every share, kept
    none (some of its images hold box rows: ``box_row_images``), and here the boxes are moved as boxes."""
    box_images = pack.header.get("box_row_images")
    if fraction == 1.0 or pack.polygon_lengths is not None or not box_images:
        return
    used = subset(pack, fraction)
    if len(used) and not np.isin(used, box_images).any() and pack.index["label_count"][used].any():
        LOGGER.warning(f"yolofeed: fraction={fraction}: the {pack.split} images this run uses have polygon rows only, "
                       f"so yolo train would make their augmented boxes of the moved polygons; the pack of the whole "
                       f"split keeps no polygons ({len(box_images)} of its images have box rows), so here the boxes "
                       "move as boxes. Train on a split of polygon rows only for stock's boxes")


def _warn_long_polygons(pack: Any, labels: Any) -> None:
    """Say which polygon makes every training batch wider than Ultralytics' 1,000 points, and what it costs.

    Ultralytics resamples an image's polygons to 1,000 points, or one more than its longest where that is longer, for
    that image alone. The training batches here have one static shape (CUDA graphs replay it): every polygon slot of
    every batch is padded to the pack's longest polygon, so resampling, warping, the boxes and the masks (work and
    memory per slot and point) cost that many times more on every step, not only where that image is drawn (one
    5,000-point polygon in 25 images: 4.6x the step time on the CPU). Said once, with the file and the fix, rather
    than slow silently.
    """
    width = labels.polygon_width
    if width <= POLYGON_POINTS:
        return
    row = int(np.argmax(labels.polygons[2]))
    image = int(np.searchsorted(np.cumsum(labels.count), row, side="right"))  # the image owning label row ``row``
    LOGGER.warning(f"yolofeed: {pack.im_files[image]} has a polygon of {width:,} points: every training batch pads "
                   f"its polygons to {width + 1:,} points (Ultralytics' 1,000 for the other images), so the polygon "
                   f"work and memory of each step (its masks' too, where made) are about "
                   f"{(width + 1) / POLYGON_POINTS:.1f}x; simplify that outline to 1,000 points or fewer (e.g. "
                   "cv2.approxPolyDP) for the usual speed and memory")


def check_data_yaml(data: Any, split: str) -> dict[str, Any]:
    """Ultralytics' ``check_det_dataset``, its complaint as one ``DatasetError`` line that keeps its reason.

    Raises:
        DatasetError: the yaml is missing, broken, lacks train/val/names, or the split's images are missing.
    """
    check_data_path(data)  # a dict fails deep inside Ultralytics' trainer
    check_downloaded(data)  # where check_det_dataset would download the set: what is missing, in one line
    try:
        return check_det_dataset(data, autodownload=False, split=split)  # nothing may download at run time
    except Exception as e:  # get_dataset turns any of them into "Dataset '...' error": user input, not a bug
        reason = " ".join(str(e).replace(" ❌", "").replace("❌", "").split())
        if f"'{split}:'" in reason:  # Ultralytics says "images not found" where the yaml has no such entry
            with contextlib.suppress(Exception):
                d = load_data_yaml(data)
                if not d.get(split):
                    reason = missing_split(d, split)
        raise DatasetError(f"data={data}: {reason}") from None


SAMPLED_LABELS = 200  # label files check_task_data reads at most, looking for the first with rows


def check_task_data(model: str, task: str, data: str) -> None:
    """Refuse in one line a dataset the model's task cannot train on, where Ultralytics' own trainer (the stock side
    of doctor, bench and parity) would stop in a traceback: a pose model needs the yaml's ``kpt_shape``; an
    oriented-box or segmentation model, rows of points, not of boxes (Ultralytics requires as many segments as boxes).
    The first label file with rows among the train split's first ``SAMPLED_LABELS`` decides; none: no verdict.

    Raises:
        DatasetError: naming the model, the file and what its task needs.
    """
    from yolofeed.pack.source import split_source

    src = split_source(data, "train", task)  # pose: the yaml's kpt_shape, as yolofeed train checks it
    if task not in ("obb", "segment"):
        return
    for label_file, rows in _first_label_rows(src.label_files):
        if all(len(r) == 5 for r in rows):
            needs = ("the 4 corners of each rotated box (class x1 y1 ... x4 y4)" if task == "obb"
                     else "a polygon for each object (class x1 y1 x2 y2 x3 y3 ...)")
            raise DatasetError(f"model={model} is {keys.a_kind(task)} model and {label_file} holds box rows "
                               f"(class x y w h): Ultralytics trains it on {needs}; give such a dataset, or a "
                               "detection model")
        return


def check_run_folder(save_dir: Path) -> None:
    """Refuse, before Ultralytics makes it, a run folder that cannot be made: its nearest existing folder is a file,
    or not writable by this user (a read-only mount, no permission).

    Raises:
        ConfigError: naming the folder, why, and the fix.
    """
    folder = Path(save_dir)
    while not os.path.lexists(folder) and folder.parent != folder:
        folder = folder.parent
    if folder.is_dir():
        if os.access(folder, os.W_OK | os.X_OK):
            return
        why = f"{folder} cannot be written by this user (a read-only disk or no permission)"
    else:
        why = f"{folder} is not a folder"
    raise ConfigError(f"the run folder {save_dir} cannot be made: {why}; pass project= (and name=) a folder "
                      "you can write")


def first_polygon_labels(data: str) -> str | None:
    """The first label file of polygon rows among the train split's first ``SAMPLED_LABELS``; None where none is."""
    from yolofeed.pack.source import split_source

    for label_file, rows in _first_label_rows(split_source(data, "train", "detect").label_files):
        if any(len(r) > 6 for r in rows):  # verify_image_label's test for segment rows
            return label_file
    return None


def _first_label_rows(label_files: list[str]):
    """Each readable label file with rows among the first ``SAMPLED_LABELS``, and its rows split (a look before the
    pack is built: the pack's check reports unreadable files, file by file)."""
    for label_file in label_files[:SAMPLED_LABELS]:
        try:
            rows = [r.split() for r in Path(label_file).read_text(encoding="utf-8-sig").splitlines() if r.strip()]
        except (OSError, UnicodeDecodeError):
            continue
        if rows:
            yield label_file, rows
