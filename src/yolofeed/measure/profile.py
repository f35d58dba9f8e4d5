"""Train a setup for a few steps and record everything a verdict or a comparison needs.

``yolofeed doctor`` and ``yolofeed bench`` both run ``profile``: the same warm-up, the same accounting (one
``StepClock`` for the rates and the phase breakdown, ``SystemSampler`` for GPU/CPU/disk, ``CallbackClock`` for the
trainer's other callbacks), and a clean stop after the requested steps (no validation, no checkpoint). The caller
chooses the trainer class; the profile knows nothing of the modes that name them (``bench.modes``).

``Profiler`` is the trainer's callbacks and what they record; ``profile`` builds the trainer, attaches them, trains
and cleans up. Under Ultralytics' DDP launch the ranks get cloudpickled copies of the callbacks (the profiler with
them): each rank profiles itself and hands its profile back (``measure.ranks``).
"""

from __future__ import annotations

import gc
import logging
import subprocess
import time
import uuid
from typing import Any

import torch

from yolofeed.errors import UltralyticsError, caller_says_stops
from yolofeed.measure.progress import Progress, ultralytics_quiet
from yolofeed.measure.ranks import combine_ranks, read_rank_reports, report_and_exit
from yolofeed.measure.result import Profile
from yolofeed.monitor import efficiency
from yolofeed.monitor.callbacks import CallbackClock
from yolofeed.monitor.steps import (
    PhaseSummary,
    StepClock,
    images_in_step,
    phase_summary,
    step_stats,
    window_median,
)
from yolofeed.monitor.system import SystemSampler
from yolofeed.monitor.throughput import distributed
from yolofeed.ultralytics_seam import (
    FIX,
    LOGGER,
    RANGE,
    StopTraining,
    forward_gflops,
    launches_ranks,
    mark_phases,
    train_until_stopped,
    unbounded_epochs,
)


def queued_batches(loader: Any) -> int:
    """Batches a torch ``DataLoader``'s workers may hold ready before the first step asks for one.

    Ultralytics' train loader starts its workers when it is built, so while the trainer sets up (model,
    optimiser, AMP check) they fill ``workers x prefetch_factor`` batches (64 at 16 workers). Steps served
    from that queue run at GPU speed whatever the loader's own speed: a window inside it measures the
    queue, not the loader (a disk capped at 10 MB/s read as 1,330 img/s with 1 % data wait that way).
    """
    if isinstance(loader, torch.utils.data.DataLoader) and loader.num_workers > 0:
        return loader.num_workers * (loader.prefetch_factor or 2)
    return 0


class Profiler:
    """The trainer's callbacks that count, time and end a profile, and what they recorded.

    The first step only starts the step clock (its data wait cannot be known); the ``warmup`` steps after it are
    measured and left out; the ``steps`` after those are the profile. ``finish`` ends training there (or at the
    first epoch's end with ``first_epoch``): ``StopTraining`` here, a report to the launcher in a DDP rank.

    Args: as ``profile``'s.
    """

    def __init__(self, mode: str, steps: int, warmup: int, window: int = 10, accounting: bool = True,
                 progress: Progress | None = None, first_epoch: bool = False):
        self.mode, self.steps, self.window = mode, steps, window
        self.accounting, self.first_epoch = accounting, first_epoch
        self.warmup = warmup  # raised to the loader's queue at the start (queued_batches)
        self.progress = progress  # None in DDP ranks: a bar is the launcher's, and not picklable
        self.clock = StepClock(phases=accounting, keep=None)  # every step kept (the default is the last 200)
        self.callbacks = CallbackClock()
        # made where training runs: it holds a lock and a probe process, and a DDP launch pickles the profiler
        self._sampler: SystemSampler | None = None
        self.system: Any = None  # the sampler's summary of the measured steps, once they are over
        self.token = uuid.uuid4().hex  # names this launch's rank reports
        self.rank_of_launch = False  # True in (the pickled copies sent to) DDP ranks
        self.quiet = progress is not None
        self.epoch_steps = self.epoch0_steps = self.step_in_epoch = 0
        self.optimizer = ""
        self.unmark: Any = None
        self.t_build = self.t_measure = 0.0
        self.t_epoch: float | None = None
        self.first_step_s: float | None = None
        self.first_epoch_s: float | None = None
        self.first_epoch_images = 0
        self.first_epoch_step_ms: list[float] = []
        self.first_epoch_cut = False  # the first epoch was cut short (a time= limit): no first-epoch figures
        self.val_rate: float | None = None

    EVENTS = (("on_train_start", "on_train_start"), ("on_train_epoch_start", "on_epoch_start"),
              ("on_train_epoch_end", "on_epoch_end"), ("on_train_batch_start", "on_batch_start"),
              ("on_train_batch_end", "on_batch_end"))

    def attach(self, trainer: Any) -> None:
        """Add the callbacks to ``trainer``; with accounting, time every other callback (the doctor's logging rule)."""
        ours = tuple(getattr(self, name) for _, name in self.EVENTS)
        for (event, _), fn in zip(self.EVENTS, ours):
            trainer.add_callback(event, fn)
        if self.accounting:
            self.callbacks.wrap(trainer.callbacks, skip=ours)

    def sampler(self) -> SystemSampler:
        if self._sampler is None:
            self._sampler = SystemSampler()
        return self._sampler

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress.write(text)
        elif not (self.rank_of_launch and distributed() and torch.distributed.get_rank() > 0):  # once, not per GPU
            print(text, flush=True)

    # -- Ultralytics callbacks ------------------------------------------------------------------------------------
    def on_train_start(self, trainer: Any) -> None:
        # The step count ends the run, so the epoch count must never do it. Raised only now: the
        # optimiser is built from the run's own epochs (optimizer=auto picks MuSGD over AdamW past
        # 10,000 iterations, and MuSGD's Newton-Schulz steps cost ~40 ms of launches per yolo11n step).
        unbounded_epochs(trainer)
        if self.rank_of_launch and self.quiet:  # a DDP rank: the launcher's bar stands for it
            LOGGER.setLevel(logging.WARNING)
        self.optimizer = type(trainer.optimizer).__name__
        queued = queued_batches(trainer.train_loader)
        if queued > self.warmup:
            self.say(f"yolofeed: warm-up of {queued} steps, not {self.warmup}: the loader's "
                     f"{trainer.train_loader.num_workers} workers hold up to {queued} batches ready, which a shorter "
                     "warm-up would measure instead of the loader")
            if self.progress is not None:
                self.progress.grow(queued - self.warmup)
            self.warmup = queued
        self.clock.cuda = trainer.device.type == "cuda"
        self.epoch_steps = len(trainer.train_loader)
        more = self.epoch_steps - (self.warmup + self.steps + 1)  # the epoch's steps past the bar's total
        if self.first_epoch and more > 0 and self.progress is not None:
            self.progress.grow(more)
        if self.accounting:
            self.unmark = mark_phases(trainer, self.clock.mark)
            self.sampler().start(trainer.device)  # now, not after warm-up: its start (~0.3 s) must not land in a step

    def on_epoch_start(self, trainer: Any) -> None:
        self.step_in_epoch = 0
        if self.t_epoch is None:
            self.t_epoch = time.perf_counter()

    def on_epoch_end(self, trainer: Any) -> None:
        if self.first_epoch_s is not None or self.first_epoch_cut:
            return
        if self.epoch0_steps < len(trainer.train_loader):  # cut short (a time= limit): no first-epoch figures
            self.first_epoch_cut = True
            if self.system is not None:  # the steps were measured before the cut: report them
                self.finish(trainer)
            return
        if self.clock.cuda:
            torch.cuda.synchronize(trainer.device)  # the epoch ends when its last step's work does
        self.first_epoch_s = time.perf_counter() - self.t_epoch
        self.first_epoch_images = len(trainer.train_loader.dataset)
        # where the epoch's time went: one-off costs show as long steps (a capture, a compile, a new shape); after
        # the sync every step is resolved, the epoch's last (smaller) batch included
        self.first_epoch_step_ms = [round(1000 * (r.t_end - r.t_start), 1) for r in self.clock.resolved()]
        if self.first_epoch and self.system is not None:  # the steps were measured already: done at the epoch's end
            self.finish(trainer)

    def on_batch_start(self, trainer: Any) -> None:
        self.clock.batch_ready()

    def on_batch_end(self, trainer: Any) -> None:
        self.clock.step_done(images_in_step(trainer, self.step_in_epoch))
        self.step_in_epoch += 1
        if self.t_epoch is not None and self.first_epoch_s is None:
            self.epoch0_steps += 1
        if self.progress is not None:
            self.progress.step()
        if self.first_step_s is None:
            if self.clock.cuda:
                torch.cuda.synchronize(trainer.device)  # once: the first step's work done, not only queued
            self.first_step_s = time.perf_counter() - self.t_build
        n = len(self.clock)
        if n == self.warmup and self.accounting:
            self.sampler().restart_window()
            self.callbacks.start()
            self.t_measure = time.perf_counter()
            if torch.cuda.is_available() and trainer.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
        if n >= self.warmup + self.steps and self.system is None:  # len(clock) counts from the second step
            self.system = self.sampler().stop()
            self.callbacks.stop()
        if self.system is not None and (not self.first_epoch or self.first_epoch_s is not None):
            self.finish(trainer)

    # -- the end --------------------------------------------------------------------------------------------------
    def finish(self, trainer: Any) -> None:
        """End the profile: a DDP rank reports to its launcher and leaves (a raise would fail the launch)."""
        if self.rank_of_launch:
            report_and_exit(self.result(trainer), trainer, self.token)
        raise StopTraining

    def release(self) -> None:
        """What a run leaves must not outlive it, failed or not: the phase marks, the probe process."""
        if self.unmark is not None:
            self.unmark()
            self.unmark = None
        if self._sampler is not None:
            self._sampler.stop()

    def result(self, trainer: Any) -> Profile:
        """This process's profile of the steps it trained (each DDP rank makes its own)."""
        clock, steps, window = self.clock, self.steps, self.window
        if clock.cuda:
            torch.cuda.synchronize()  # after the measured steps: lets the last steps' events resolve
        warmup, system, val_rate = self.warmup, self.system, self.val_rate
        measured = clock.resolved(skip=warmup)[:steps]  # first_epoch: the steps trained on to its end are not windows
        stats = step_stats(measured, window)
        ph = phase_summary(measured) if self.accounting else PhaseSummary(0)
        measured = measured if self.accounting else []  # no phases, no sampler: no timeline
        cuda = trainer.device.type == "cuda"
        t0 = self.t_measure
        timeline = self.sampler().timeline()
        timeline["step_t"] = [r.t_end - t0 for r in measured]  # from the end of the last warm-up step
        timeline["step_wait_fraction"] = [r.ms["data_wait"] / max(r.total_ms, 1e-9) for r in measured]
        gpu_util = system.gpu_util
        # over the img/s windows, as a median: a one-off stall (the epoch's last, smaller batch) skews a mean
        if gpu_util is not None and timeline["step_t"] and len(timeline["gpu_util"]) == len(timeline["t"]):
            shift = timeline["t0"] - t0  # the probe's perf_counter clock, from the first sample after warm-up
            edges = [0.0] + timeline["step_t"][window - 1::window]
            median = window_median([x + shift for x in timeline["t"]], timeline["gpu_util"], edges)
            gpu_util = gpu_util if median is None else median
        first_epoch_s = self.first_epoch_s
        prof = Profile(
            mode=self.mode, device=str(trainer.device), images_per_s=round(stats.images_per_s, 1),
            step_ms=round(stats.step_ms, 2), mean_step_ms=round(stats.mean_step_ms, 2),
            data_wait_fraction=round(stats.data_wait_fraction, 4),
            windows=[round(w, 1) for w in stats.windows], steps=stats.steps, warmup=warmup,
            phases_ms={k: round(v, 2) for k, v in ph.ms.items()}, gpu_util=gpu_util,
            gpu_clock_mhz=system.gpu_clock_mhz, gpu_power_w=system.gpu_power_w,
            cpu_cores_busy=round(system.cpu_cores_busy, 2), own_cores_busy=round(system.own_cores_busy, 2),
            iowait=round(system.iowait, 4), disk_read_mb_s=round(system.disk_read_mb_s, 1), cores=system.cores,
            gpu_mem_peak_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2) if cuda else None,
            batch=trainer.batch_size, workers=int(trainer.args.workers), n_train=len(trainer.train_loader.dataset),
            n_val=len(getattr(getattr(trainer, "test_loader", None), "dataset", ())),  # DDP: rank 0's only
            val_images_per_s=round(val_rate, 1) if val_rate else None,
            busiest_core=round(system.busiest_core, 3),
            ram_used_gb=round(system.ram_used_gb, 2) if system.ram_used_gb is not None else None,
            swap_used_gb=round(system.swap_used_gb, 2) if system.swap_used_gb is not None else None,
            timeline=timeline, callbacks_ms={k: round(v, 3) for k, v in self.callbacks.ms_per_step(steps).items()},
            optimizer=self.optimizer,
            first_step_s=round(self.first_step_s, 2) if self.first_step_s is not None else None,
            first_epoch_s=round(first_epoch_s, 2) if first_epoch_s is not None else None,
            first_epoch_images_per_s=round(self.first_epoch_images / first_epoch_s, 1)
            if first_epoch_s is not None else None, first_epoch_step_ms=self.first_epoch_step_ms)
        prof.machine_samples, prof.probe_lost = system.samples, self.sampler().lost
        prof.forward_gflops = forward_gflops(trainer)
        prof.peak_tflops = efficiency.peak_tflops(torch.cuda.get_device_name(trainer.device)) if cuda else None
        prof.train_tflops, prof.mfu = efficiency.achieved(prof.images_per_s, prof.forward_gflops, prof.peak_tflops)
        return prof


def profile(mode: str, trainer_class: type, args: dict[str, Any], steps: int, warmup: int, window: int = 10,
            time_validation: bool = False, accounting: bool = True, progress: Progress | None = None,
            first_epoch: bool = False) -> Profile:
    """Train ``trainer_class`` with Ultralytics ``args`` for ``warmup + steps`` steps and measure it.

    Args:
        mode: the name the profile and its run folder go by (``stock``, ``yolofeed``...).
        trainer_class: an Ultralytics ``DetectionTrainer`` (sub)class.
        args: training overrides (model, data, imgsz, batch, workers, device, ...); validation,
            plots and checkpoints are switched off and mosaic kept on unless the caller says otherwise.
        warmup: steps ignored at the start; raised to the loader's queue (``queued_batches``) if that is
            longer, so the measured steps see the loader's steady state.
        time_validation: also run one validation pass and time it (for the doctor's validation rule).
        accounting: phase marks and the system sampler on (False measures their overhead by difference).
        progress: count the steps on this bar, and hold back Ultralytics' own output meanwhile.
        first_epoch: train on to the end of the first epoch if the steps end inside it, and report that epoch's
            rate (every one-off cost of a run falls inside it). The time to the first step is always reported.
    """
    p = Profiler(mode, steps, warmup, window, accounting, progress, first_epoch)
    full = {"val": False, "plots": False, "save": False, "close_mosaic": 0, "verbose": False, "exist_ok": True,
            "name": mode, **args}
    if progress is not None:
        progress.start(mode)
    with ultralytics_quiet(progress is not None):
        p.t_build = time.perf_counter()
        trainer = trainer_class(overrides=full)
        if launches_ranks(trainer):  # the ranks get pickled copies of these callbacks (the profiler), without the bar
            p.progress, p.rank_of_launch = None, True
        p.attach(trainer)
        try:
            try:
                with caller_says_stops():  # stopped by yolofeed's error: the caller says the cause, without the
                    stopped = train_until_stopped(trainer)  # training's stop line, whose resume is yolofeed train's
            except subprocess.CalledProcessError as e:  # Ultralytics' DDP launch: a rank failed
                raise UltralyticsError(f"{mode}: a DDP rank failed (exit status {e.returncode}); its output is "
                                       "above") from None
            if p.rank_of_launch:  # the ranks trained, and reported
                combined = combine_ranks(read_rank_reports(trainer.save_dir, p.token, mode))
                if progress is not None:
                    progress.step(warmup + steps + 1)  # the ranks' steps, on the launcher's bar at once
                return combined
            p.system = p.system or p.sampler().stop()
            if stopped and time_validation and getattr(trainer, "validator", None) is not None:
                if progress is not None:
                    progress.start(mode, ": one validation pass")
                t0 = time.perf_counter()
                trainer.validate()
                p.val_rate = len(trainer.test_loader.dataset) / (time.perf_counter() - t0)
        finally:  # a run that failed leaves no probe process, loader thread or wrapped method behind either
            p.release()
            for name in ("train_loader", "test_loader"):
                loader = getattr(trainer, name, None)
                if hasattr(loader, "close"):
                    loader.close()
    if not stopped:  # the loop ended before the steps: fewer steps must not be reported as if they were all
        raise UltralyticsError(f"{mode}: the training loop ended after {len(p.clock)} of {p.warmup + steps} "
                               f"steps although the profile lifts its epoch limit (a time= limit, or an "
                               f"Ultralytics outside {RANGE}: {FIX})")
    res = p.result(trainer)
    del trainer
    gc.collect()
    if p.clock.cuda:
        torch.cuda.empty_cache()
    return res
