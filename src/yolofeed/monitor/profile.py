"""The profiling engine: train a setup for a few steps and record everything a verdict or a comparison needs.

``yolofeed doctor`` and ``yolofeed bench`` both run ``profile``: the same warm-up, the same accounting (one
``StepClock`` for the rates and the phase breakdown, ``SystemSampler`` for GPU/CPU/disk, ``CallbackClock`` for the
trainer's other callbacks), and a clean stop after the requested steps (no validation, no checkpoint). The caller
chooses the trainer class; the profile knows nothing of the modes that name them (``bench.modes``).

With several GPUs Ultralytics' DDP launch trains in rank processes, which get cloudpickled copies of the profile's
callbacks: each rank profiles itself, rank 0 gathers the ranks' profiles into the run folder
(``report_and_exit``), and the launching process combines them (``combine_ranks``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from yolofeed.errors import UltralyticsError
from yolofeed.monitor import efficiency
from yolofeed.monitor.callbacks import CallbackClock
from yolofeed.monitor.steps import PhaseSummary, StepClock, phase_summary, step_stats, window_median
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


@dataclass
class Profile:
    """What one mode did: rates, the per-phase breakdown, machine load, and a timeline."""

    mode: str
    device: str
    images_per_s: float
    step_ms: float  # the median step
    data_wait_fraction: float
    windows: list[float]
    steps: int
    warmup: int  # the steps ignored before them: at least the loader's queue (queued_batches)
    phases_ms: dict[str, float]
    gpu_util: float | None
    gpu_clock_mhz: float | None
    gpu_power_w: float | None
    cpu_cores_busy: float
    own_cores_busy: float
    iowait: float
    disk_read_mb_s: float
    cores: int
    gpu_mem_peak_gb: float | None
    batch: int
    workers: int
    n_train: int
    n_val: int
    val_images_per_s: float | None = None
    busiest_core: float = 0.0  # busy share of the busiest core the run may use
    ram_used_gb: float | None = None  # the machine's, as psutil sees it (cache=ram runs, other jobs)
    swap_used_gb: float | None = None
    timeline: dict[str, list] = field(default_factory=dict)
    callbacks_ms: dict[str, float] = field(default_factory=dict)  # host ms per step in each trainer callback
    optimizer: str = ""  # the optimiser's class (optimizer=auto chooses by the run's length)
    mean_step_ms: float = 0.0  # wall time of the measured steps / steps: agrees with images_per_s when steps burst
    first_step_s: float | None = None  # from building the trainer to the end of its first step (set-up included)
    first_epoch_images_per_s: float | None = None  # the whole first epoch: its images / its wall time
    first_epoch_s: float | None = None  # from the first epoch's start to its end (None: the profile ended inside it)
    first_epoch_step_ms: list[float] = field(default_factory=list)  # host wall time of each of its steps but the first
    ranks: list[dict] = field(default_factory=list)  # DDP: each GPU's figures (the fields above are their total)
    forward_gflops: float | None = None  # one image's forward pass at the training size (monitor/efficiency.py)
    peak_tflops: float | None = None  # the GPU's dense bf16/fp16 peak, per GPU (None: not in the table, or no GPU)
    train_tflops: float | None = None  # achieved: images/s x 3 x forward GFLOPs
    mfu: float | None = None  # train_tflops over the peak of the GPUs trained on

    def to_dict(self) -> dict:
        return asdict(self)


class Progress:
    """One bar over the profile's own steps, every mode together, with an overall ETA.

    A profile sets the trainer's epochs to 10**6 (see ``profile``), so Ultralytics' own epoch bar would
    read "6/1000000" after "Starting training for 1000000 epochs". While a mode trains under a Progress,
    Ultralytics' INFO output (that bar, the model summary, the TensorBoard hint) is held back; its
    warnings still show. The ETA is the steps left at the mean rate so far, set-up time included, which
    the modes still to come pay too.

    Args:
        modes: the modes to run, in order.
        steps, warmup: measured and warm-up steps of each mode, as given to ``profile``; a longer warm-up
            found later (``queued_batches``) is added with ``grow``.
        file: where the bar goes (stderr by default).
    """

    def __init__(self, modes: list[str], steps: int, warmup: int, file: TextIO | None = None):
        from tqdm import tqdm

        self.modes = modes
        per_mode = warmup + steps + 1  # the first step only opens the step clock
        self.bar = tqdm(total=len(modes) * per_mode, unit="step", smoothing=0, dynamic_ncols=True, file=file,
                        desc="profiling")

    def start(self, mode: str, what: str = "") -> None:
        k = self.modes.index(mode) + 1 if mode in self.modes else 0
        self.bar.set_description(f"{mode} ({k}/{len(self.modes)}){what}")

    def grow(self, steps: int) -> None:
        self.bar.total += steps
        self.bar.refresh()

    def step(self, n: int = 1) -> None:
        self.bar.update(n)

    def write(self, text: str) -> None:
        """Print a line above the bar (the bar is redrawn below it)."""
        self.bar.write(text)

    def close(self) -> None:
        self.bar.close()


@contextlib.contextmanager
def ultralytics_quiet(quiet: bool) -> Iterator[None]:
    """Hold back Ultralytics' INFO logging and progress bars (its TQDM is off above INFO); warnings still show."""
    level = LOGGER.level
    if quiet:
        LOGGER.setLevel(logging.WARNING)
    try:
        yield
    finally:
        LOGGER.setLevel(level)


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


RANKS_REPORT = "yolofeed_profile_ranks.json"  # in the run folder: how DDP rank 0 hands the ranks' profiles over


def report_and_exit(own: Profile, trainer: Any, token: str) -> None:
    """In a DDP rank at the profile's last step: gather every rank's profile to rank 0, which writes them to
    ``RANKS_REPORT`` in the run folder with the launcher's ``token``; then every rank leaves with status 0.

    Every rank calls this at the same step (DDP keeps them in step). Leaving by ``os._exit`` skips Ultralytics'
    end of training (validation, saving, plots), which a profile does not want, and which an exception would
    turn into a failed launch.
    """
    dist = torch.distributed
    gathered: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, own.to_dict())
    if dist.get_rank() == 0:
        path = Path(trainer.save_dir) / RANKS_REPORT
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"token": token, "ranks": gathered}))
        os.replace(tmp, path)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def read_rank_reports(save_dir: Any, token: str, mode: str) -> list[Profile]:
    """The ranks' profiles that rank 0 wrote for this launch (``token``), one per GPU.

    Raises:
        UltralyticsError: no report for this launch (the ranks' loop ended before the profile's steps).
    """
    path = Path(save_dir) / RANKS_REPORT
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        report = {}
    if report.get("token") != token or not report.get("ranks"):
        raise UltralyticsError(f"{mode}: the DDP ranks ended their training loop before the profile's steps, so no "
                               f"profile is in {path} (a time= limit, or an Ultralytics outside {RANGE}: {FIX})")
    return [Profile(**r) for r in report["ranks"]]


def combine_ranks(ranks: list[Profile]) -> Profile:
    """One profile for a DDP run: images/s summed over the GPUs, the slowest rank's steps and first epoch.

    The machine's figures (cores busy, iowait, disk, RAM) are rank 0's sampler's, which sees the whole machine; the
    cores of the training processes are summed over the ranks; GPU figures are the ranks' mean, each rank's kept in
    ``ranks``.
    """
    r0 = ranks[0]

    def mean(key: str) -> float | None:
        vals = [getattr(r, key) for r in ranks if getattr(r, key) is not None]
        return round(sum(vals) / len(vals), 2) if vals else None

    firsts = [r.first_epoch_s for r in ranks]
    out = Profile(**r0.to_dict())
    out.images_per_s = round(sum(r.images_per_s for r in ranks), 1)  # each rank steps through its own images
    out.step_ms = max(r.step_ms for r in ranks)
    out.mean_step_ms = max(r.mean_step_ms for r in ranks)
    out.data_wait_fraction = round(sum(r.data_wait_fraction for r in ranks) / len(ranks), 4)
    out.windows = [round(sum(w), 1) for w in zip(*(r.windows for r in ranks))]
    out.gpu_util, out.gpu_clock_mhz, out.gpu_power_w = mean("gpu_util"), mean("gpu_clock_mhz"), mean("gpu_power_w")
    out.gpu_mem_peak_gb = max((r.gpu_mem_peak_gb for r in ranks if r.gpu_mem_peak_gb is not None), default=None)
    out.own_cores_busy = round(sum(r.own_cores_busy for r in ranks), 2)
    out.batch = sum(r.batch for r in ranks)
    out.device = ",".join(r.device for r in ranks)
    out.first_step_s = max((r.first_step_s for r in ranks if r.first_step_s is not None), default=None)
    out.first_epoch_s = None if None in firsts else max(firsts)
    out.first_epoch_images_per_s = None if out.first_epoch_s is None else round(r0.n_train / out.first_epoch_s, 1)
    out.train_tflops, out.mfu = efficiency.achieved(out.images_per_s, r0.forward_gflops, r0.peak_tflops, len(ranks))
    out.ranks = [{"device": r.device, "images_per_s": r.images_per_s, "step_ms": r.step_ms,
                  "data_wait_fraction": r.data_wait_fraction, "gpu_util": r.gpu_util,
                  "own_cores_busy": r.own_cores_busy, "first_epoch_s": r.first_epoch_s} for r in ranks]
    return out


def profile(mode: str, trainer_class: type, args: dict[str, Any], steps: int, warmup: int, window: int = 10,
            time_validation: bool = False, accounting: bool = True, progress: Progress | None = None,
            first_epoch: bool = False) -> Profile:
    """Train ``trainer_class`` with Ultralytics ``args`` for ``warmup + steps`` steps and measure it.

    The first step only starts the step clock (its data wait cannot be known); the ``warmup`` steps after it are
    measured and left out; the ``steps`` after those are the profile.

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
    clock = StepClock(phases=accounting, keep=None)  # every step kept (the default is the last 200); cuda set below
    callbacks = CallbackClock()
    # the sampler is made where training runs: it holds a lock and a probe process, and a DDP launch pickles these
    # callbacks (closures, their state included) into every rank first
    state: dict[str, Any] = {"system": None, "warmup": warmup, "epoch_steps": 0, "epoch0_steps": 0,
                             "token": uuid.uuid4().hex, "rank_of_launch": False,
                             "progress": progress}  # None in DDP ranks: a bar is the launcher's, and not picklable

    def sampler() -> SystemSampler:
        if "sampler" not in state:
            state["sampler"] = SystemSampler()
        return state["sampler"]

    def say(text: str) -> None:
        if state["progress"] is not None:
            state["progress"].write(text)
        elif not (state["rank_of_launch"] and distributed() and torch.distributed.get_rank() > 0):  # once, not per GPU
            print(text, flush=True)

    def on_train_start(trainer) -> None:
        # The step count ends the run, so the epoch count must never do it. Raised only now: the
        # optimiser is built from the run's own epochs (optimizer=auto picks MuSGD over AdamW past
        # 10,000 iterations, and MuSGD's Newton-Schulz steps cost ~40 ms of launches per yolo11n step).
        unbounded_epochs(trainer)
        if state["rank_of_launch"] and state["quiet"]:  # a DDP rank: the launcher's bar stands for it
            LOGGER.setLevel(logging.WARNING)
        state["optimizer"] = type(trainer.optimizer).__name__
        queued = queued_batches(trainer.train_loader)
        if queued > warmup:
            say(f"yolofeed: warm-up of {queued} steps, not {warmup}: the loader's {trainer.train_loader.num_workers} "
                f"workers hold up to {queued} batches ready, which a shorter warm-up would measure instead of the "
                "loader")
            state["warmup"] = queued
            if state["progress"] is not None:
                state["progress"].grow(queued - warmup)
        clock.cuda = trainer.device.type == "cuda"
        state["epoch_steps"] = len(trainer.train_loader)
        more = state["epoch_steps"] - (state["warmup"] + steps + 1)  # the epoch's steps past the bar's total
        if first_epoch and more > 0 and state["progress"] is not None:
            state["progress"].grow(more)
        if accounting:
            state["unmark"] = mark_phases(trainer, clock.mark)
            sampler().start(trainer.device)  # now, not after warm-up: its start (~0.3 s) must not land in a step

    def on_epoch_start(trainer) -> None:
        if "t_epoch" not in state:
            state["t_epoch"] = time.perf_counter()

    def on_epoch_end(trainer) -> None:
        if "first_epoch_s" in state or state.get("first_epoch_cut"):
            return
        if state["epoch0_steps"] < len(trainer.train_loader):  # cut short (a time= limit): no first-epoch figures
            state["first_epoch_cut"] = True
            if state["system"] is not None:  # the steps were measured before the cut: report them
                finish(trainer)
            return
        if clock.cuda:
            torch.cuda.synchronize(trainer.device)  # the epoch ends when its last step's work does
        state["first_epoch_s"] = time.perf_counter() - state["t_epoch"]
        state["first_epoch_images"] = len(trainer.train_loader.dataset)
        # where the epoch's time went: one-off costs show as long steps (a capture, a compile, a new shape); after
        # the sync every step is resolved, the epoch's last (smaller) batch included
        state["first_epoch_step_ms"] = [round(1000 * (r.t_end - r.t_start), 1) for r in clock.resolved()]
        if first_epoch and state["system"] is not None:  # the steps were measured already: done at the epoch's end
            finish(trainer)

    def on_start(trainer) -> None:
        clock.batch_ready()

    def on_end(trainer) -> None:
        clock.step_done(trainer.batch_size)
        if "t_epoch" in state and "first_epoch_s" not in state:
            state["epoch0_steps"] += 1
        if state["progress"] is not None:
            state["progress"].step()
        if "first_step_s" not in state:
            if clock.cuda:
                torch.cuda.synchronize(trainer.device)  # once: the first step's work done, not only queued
            state["first_step_s"] = time.perf_counter() - state["t_build"]
        n = len(clock)
        if n == state["warmup"] and accounting:
            sampler().restart_window()
            callbacks.start()
            state["t_measure"] = time.perf_counter()
            if torch.cuda.is_available() and trainer.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
        if n >= state["warmup"] + steps and state["system"] is None:  # len(clock) counts from the second step
            state["system"] = sampler().stop()
            callbacks.stop()
        if state["system"] is not None and (not first_epoch or "first_epoch_s" in state):
            finish(trainer)

    def finish(trainer) -> None:
        """End the profile: a DDP rank reports to its launcher and leaves (a raise would fail the launch)."""
        if state["rank_of_launch"]:
            report_and_exit(result(trainer), trainer, state["token"])
        raise StopTraining

    def result(trainer) -> Profile:
        """This process's profile of the steps it trained (each DDP rank makes its own)."""
        if clock.cuda:
            torch.cuda.synchronize()  # after the measured steps: lets the last steps' events resolve
        warmup, system, val_rate = state["warmup"], state["system"], state.get("val_rate")
        measured = clock.resolved(skip=warmup)[:steps]  # first_epoch: the steps trained on to its end are not windows
        stats = step_stats(measured, window)
        ph = phase_summary(measured) if accounting else PhaseSummary(0)
        measured = measured if accounting else []  # no phases, no sampler: no timeline
        cuda = trainer.device.type == "cuda"
        t0 = state.get("t_measure", 0.0)
        timeline = sampler().timeline()
        timeline["step_t"] = [r.t_end - t0 for r in measured]  # from the end of the last warm-up step
        timeline["step_wait_fraction"] = [r.ms["data_wait"] / max(r.total_ms, 1e-9) for r in measured]
        gpu_util = system.gpu_util
        # over the img/s windows, as a median: a one-off stall (the epoch's last, smaller batch) skews a mean
        if gpu_util is not None and timeline["step_t"] and len(timeline["gpu_util"]) == len(timeline["t"]):
            shift = timeline["t0"] - t0  # the probe's perf_counter clock, from the first sample after warm-up
            edges = [0.0] + timeline["step_t"][window - 1::window]
            median = window_median([x + shift for x in timeline["t"]], timeline["gpu_util"], edges)
            gpu_util = gpu_util if median is None else median
        prof = Profile(
            mode=mode, device=str(trainer.device), images_per_s=round(stats.images_per_s, 1),
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
            timeline=timeline, callbacks_ms={k: round(v, 3) for k, v in callbacks.ms_per_step(steps).items()},
            optimizer=state.get("optimizer", ""),
            first_step_s=round(state["first_step_s"], 2) if "first_step_s" in state else None,
            first_epoch_s=round(state["first_epoch_s"], 2) if "first_epoch_s" in state else None,
            first_epoch_images_per_s=round(state["first_epoch_images"] / state["first_epoch_s"], 1)
            if "first_epoch_s" in state else None, first_epoch_step_ms=state.get("first_epoch_step_ms", []))
        prof.forward_gflops = forward_gflops(trainer)
        prof.peak_tflops = efficiency.peak_tflops(torch.cuda.get_device_name(trainer.device)) if cuda else None
        prof.train_tflops, prof.mfu = efficiency.achieved(prof.images_per_s, prof.forward_gflops, prof.peak_tflops)
        return prof

    full = {"val": False, "plots": False, "save": False, "close_mosaic": 0, "verbose": False, "exist_ok": True,
            "name": mode, **args}
    if progress is not None:
        progress.start(mode)
    with ultralytics_quiet(progress is not None):
        state["t_build"] = time.perf_counter()
        trainer = trainer_class(overrides=full)
        state["quiet"] = progress is not None
        if launches_ranks(trainer):  # the ranks get pickled copies of these callbacks (this state), without the bar
            state["progress"], state["rank_of_launch"] = None, True
        ours = (("on_train_start", on_train_start), ("on_train_epoch_start", on_epoch_start),
                ("on_train_epoch_end", on_epoch_end), ("on_train_batch_start", on_start),
                ("on_train_batch_end", on_end))
        for event, fn in ours:
            trainer.add_callback(event, fn)
        if accounting:  # every other callback (loggers, integrations) is timed: the doctor's logging rule
            callbacks.wrap(trainer.callbacks, skip=tuple(fn for _, fn in ours))
        try:
            try:
                stopped = train_until_stopped(trainer)
            except subprocess.CalledProcessError as e:  # Ultralytics' DDP launch: a rank failed
                raise UltralyticsError(f"{mode}: a DDP rank failed (exit status {e.returncode}); its output is "
                                       "above") from None
            if state["rank_of_launch"]:  # the ranks trained, and reported
                combined = combine_ranks(read_rank_reports(trainer.save_dir, state["token"], mode))
                if progress is not None:
                    progress.step(warmup + steps + 1)  # the ranks' steps, on the launcher's bar at once
                return combined
            state["system"] = state["system"] or sampler().stop()
            if stopped and time_validation and getattr(trainer, "validator", None) is not None:
                if progress is not None:
                    progress.start(mode, ": one validation pass")
                t0 = time.perf_counter()
                trainer.validate()
                state["val_rate"] = len(trainer.test_loader.dataset) / (time.perf_counter() - t0)
        finally:  # a run that failed leaves no probe process, loader thread or wrapped method behind either
            if "unmark" in state:
                state["unmark"]()
            if "sampler" in state:
                state["sampler"].stop()
            for name in ("train_loader", "test_loader"):
                loader = getattr(trainer, name, None)
                if hasattr(loader, "close"):
                    loader.close()
    if not stopped:  # the loop ended before the steps: fewer steps must not be reported as if they were all
        raise UltralyticsError(f"{mode}: the training loop ended after {len(clock)} of {state['warmup'] + steps} "
                               f"steps although the profile lifts its epoch limit (a time= limit, or an "
                               f"Ultralytics outside {RANGE}: {FIX})")
    res = result(trainer)
    del trainer
    gc.collect()
    if clock.cuda:
        torch.cuda.empty_cache()
    return res
