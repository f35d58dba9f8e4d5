"""``yolofeed bench``: each mode trains for warm-up + N steps under the same settings; we time the steps.

For each mode: steady-state images/s (median of windows after warm-up), the first epoch's images/s (the whole
epoch, set-up costs that fall in it included; ``first_epoch=True``), the time from building the trainer to its
first step, NVML GPU utilisation,
the share of step time spent waiting for the next batch, host CPU cores busy and peak GPU
memory. Modes run one after another, on the same data, model, batch and imgsz:
``stock`` (Ultralytics' DetectionTrainer), ``yolofeed`` (FastDetectionTrainer, raw pack), ``ceiling``
(the same trainer as yolofeed replaying batches already on the GPU), and on request ``yolofeed_jpeg``
(FastDetectionTrainer with a jpeg pack decoded on the GPU: raw vs jpeg side by side with
``modes=stock,yolofeed,yolofeed_jpeg,ceiling``) and ``yolofeed_inline`` (augmenting in
``preprocess_batch``, a host sync per step, instead of one batch ahead) and ``ceiling_stock`` (the
ceiling with Ultralytics' own step and loss, without yolofeed's sync-free ones: train/step.py,
train/loss/). Mosaic stays on (close_mosaic=0), validation and checkpoints are off: only training
steps are measured.

Each mode trains in a process of its own (``isolate=True``, the default; POSIX only), as a user's run does: it
pays its own one-off costs (CUDA's context, cuDNN's plans for each batch size, Triton's compiles), which shape its
first step and its first epoch. With ``isolate=False`` (and on Windows) they train in turn in this process, where a
later mode finds an earlier one's paid: at COCO's size stock's first step came at 14 s after yolofeed's in one
process, and at 28 s in a process of its own (BENCHMARKS.md), and the bench says so under its table.

With several GPUs (``device=0,1``) each mode goes through Ultralytics' own DDP launch, whose ranks are processes
of their own: every rank profiles its own steps and GPU, and the row is their total (images/s summed, the slowest
rank's steps), each GPU's share on the line below it (``measure/ranks.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import traceback
from dataclasses import asdict, replace
from multiprocessing.connection import Connection
from pathlib import Path

from yolofeed.bench import whole
from yolofeed.bench.modes import MODES, STEP_SWITCHES, WHOLE_RUN_ONLY, trainer_class
from yolofeed.config import BenchConfig
from yolofeed.errors import ConfigError, PackSpaceError, YolofeedError
from yolofeed.measure.profile import profile
from yolofeed.measure.progress import Progress
from yolofeed.processes import die_with_parent, process_start, sigterm_exits

WHOLE_RUN_DEFAULT = (BenchConfig.modes, "stock,yolofeed")  # the modes of a whole run where modes= is not given
COLOURS = {"stock": "#999999", "yolofeed": "#2a7ab0", "yolofeed_jpeg": "#8172b2", "yolofeed_inline": "#64b5cd",
           "yolofeed_nopool": "#4c72b0", "yolofeed_val_inline": "#3d9fd8", "yolofeed_val_overlap": "#2a6f97",
           "yolofeed_val_waited": "#6baed6",
           "ceiling": "#55a868", "ceiling_stock": "#8fc79a"}


def _switches(cfg: BenchConfig) -> dict[str, bool]:
    """The step's switches set otherwise than the trainer's defaults (``SyncFreeStep``'s class attributes)."""
    from yolofeed.train.step import SyncFreeStep

    return {k: getattr(cfg, k) for k in STEP_SWITCHES if getattr(cfg, k) != getattr(SyncFreeStep, k)}


def run_mode(mode: str, cfg: BenchConfig, project: Path, progress=None) -> dict:
    """Train ``mode`` for ``warmup + steps`` steps, or ``whole_run`` whole epochs, and return its figures
    (``progress``: the bench's step bar)."""
    args = {"model": cfg.model, "data": cfg.data, "imgsz": cfg.imgsz, "batch": cfg.batch, "project": str(project),
            **cfg.extra}
    from yolofeed.train.keys import model_task

    trainer = trainer_class(mode, _switches(cfg), model_task(cfg.model, None))
    if cfg.whole_run:
        return whole.whole_run(mode, trainer, args, cfg.whole_run, progress=progress)
    p = profile(mode, trainer, args, cfg.steps, cfg.warmup, cfg.window, progress=progress,
                first_epoch=cfg.first_epoch)
    keys = ("mode", "images_per_s", "step_ms", "mean_step_ms", "data_wait_fraction", "steps", "warmup", "windows",
            "gpu_util", "cpu_cores_busy", "own_cores_busy", "disk_read_mb_s", "gpu_mem_peak_gb", "device", "phases_ms",
            "first_step_s", "first_epoch_s", "first_epoch_images_per_s", "first_epoch_step_ms", "ranks", "optimizer",
            "forward_gflops", "peak_tflops", "train_tflops", "mfu", "batch", "machine_samples", "probe_lost")
    return {k: getattr(p, k) for k in keys} | {"images": p.n_train}


_SAID = (YolofeedError, KeyboardInterrupt, SystemExit)  # raised as they are: the CLI says them in a line, or exits


class _BenchGone(BaseException):
    """The bench's end of the pipe is closed: it stopped first (what it says is said). A BaseException, so that no
    ``except Exception`` on the way out of the training keeps the mode running."""


def _send(conn: Connection, message: tuple) -> None:
    try:
        conn.send(message)
    except OSError as e:  # EPIPE, ECONNRESET: the bench is gone
        raise _BenchGone from e


class _ForwardedProgress:
    """The bench's bar as a mode's own process sees it: each call goes over ``conn`` to the bar in the bench's
    process (a message a step: microseconds beside a training step)."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def start(self, mode: str, what: str = "") -> None:
        _send(self.conn, ("start", mode, what))

    def grow(self, steps: int) -> None:
        _send(self.conn, ("grow", steps))

    def step(self, n: int = 1) -> None:
        _send(self.conn, ("step", n))

    def write(self, text: str) -> None:
        _send(self.conn, ("write", text))


# The mode's process: the parent-death signal first (stdlib only, before torch's seconds of imports), then the mode;
# a Ctrl-C that arrives while it imports ends it as one would end a run.
_MODE_MAIN = ("import sys\nfrom yolofeed.processes import kill_with_parent, own_process\nkill_with_parent()\ntry:\n"
              "    from yolofeed.bench.run import mode_main\n    own_process(mode_main, 'yolofeed bench')\n"
              "except KeyboardInterrupt:\n    sys.exit(130)\n")


def mode_main(argv: list[str] | None = None) -> None:
    """A mode's own process (``run_isolated`` starts it): argv is its end of the bench's socket pair (a file
    descriptor), and the bench's PID and start time. Receives (mode, cfg, project), sends back progress and then
    the result of ``run_mode`` or its error.

    A bench killed alone leaves no training behind on the GPU: on Linux the parent-death signal (set by
    ``_MODE_MAIN``: no thread of ours in a process that forks DataLoader workers), elsewhere a thread that watches
    the bench; and a mode whose next message finds the bench gone stops there.
    """
    fd, pid, started = sys.argv[1:] if argv is None else argv
    if not sys.platform.startswith("linux"):
        die_with_parent(int(pid), float(started))
    elif os.getppid() != int(pid):  # the bench died before the signal was set
        os._exit(1)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # as the CLI: the pack build's lines, say
    conn = Connection(int(fd))
    try:
        try:
            mode, cfg, project = conn.recv()
        except (EOFError, OSError):  # the bench went before it said what to run
            raise _BenchGone from None
        _send(conn, ("result", run_mode(mode, cfg, project, _ForwardedProgress(conn))))
    except _BenchGone:
        sys.exit(1)
    except BaseException as e:  # Ctrl-C and SIGTERM too: the bench's process decides what to say
        if not isinstance(e, _SAID):  # an unexpected error: its trace, as in-process
            traceback.print_exc()
        try:
            pickle.loads(pickle.dumps(e))  # an exception whose constructor takes other arguments pickles, not back
        except Exception:
            e = RuntimeError(f"{type(e).__name__}: {e}")
        try:
            _send(conn, ("error", e))
        except _BenchGone:
            sys.exit(1)


def run_isolated(mode: str, cfg: BenchConfig, project: Path, progress: Progress) -> dict:
    """``run_mode`` in a fresh Python process of its own, started as a user's ``yolo train`` is (nothing of this
    process's CUDA, cuDNN or compiled kernels), its steps counted on ``progress``; its error raised here. POSIX.

    Raises:
        YolofeedError: the process ended without a result (killed, out of memory), or failed with an error that is
            not one of yolofeed's (its traceback, printed by that process, is above).
    """
    ours, theirs = multiprocessing.Pipe()  # a socket pair: its child end is passed as a file descriptor
    me = os.getpid()
    proc = subprocess.Popen([sys.executable, "-c", _MODE_MAIN, str(theirs.fileno()), str(me),
                             repr(process_start(me) or 0.0)], pass_fds=(theirs.fileno(),))
    theirs.close()  # the child's copy only: its exit then ends our reads
    done = False
    try:
        try:
            ours.send((mode, cfg, project))
            while True:
                kind, *rest = ours.recv()
                if kind == "result":
                    done = True
                    return rest[0]
                if kind == "error":
                    done = True
                    error = rest[0]
                    if isinstance(error, _SAID):
                        raise error
                    raise YolofeedError(f"mode {mode} stopped with {type(error).__name__}: {error} (its traceback "
                                        "is above)") from error
                getattr(progress, kind)(*rest)
        except (EOFError, OSError):  # the process ended (or reset the pipe) before it sent what it owed
            proc.wait()
            code = proc.returncode
            how = f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
                else f"exit code {code}"
            raise YolofeedError(f"mode {mode}'s process ended without a result ({how}); its output above says why, "
                                f"or run it alone with modes={mode} isolate=False") from None
    finally:
        ours.close()
        _stop(proc, gently=not done)


class _Unseen:
    """A progress bar that shows nothing: the kernels' run is not one of the bench's modes."""

    def start(self, *a) -> None: ...
    def grow(self, *a) -> None: ...
    def step(self, *a) -> None: ...
    def write(self, *a) -> None: ...


def kernel_mode(modes: list[str], own: bool, device: str) -> str | None:
    """The mode whose short run compiles yolofeed's kernels before the timed modes (``compile_kernels``): the first of
    yolofeed's own (its pack, so a jpeg-only bench builds no raw pack for it), where they train in processes of their
    own on a CUDA GPU; None elsewhere (the CPU path compiles nothing; modes in one process share their compiles)."""
    import torch

    ours = [m for m in modes if m.startswith(("yolofeed", "ceiling"))]
    return ours[0] if ours and own and device != "cpu" and torch.cuda.is_available() else None


def compile_kernels(mode: str, cfg: BenchConfig, project: Path) -> None:
    """Before the timed modes, a short untimed run of ``mode`` (one window of steps, in a process of its own): the
    Triton kernels of yolofeed's augmentation and graphed step compile into the machine's cache, as a user's second
    run finds them, as it finds the pack and the label cache. Without it the first of yolofeed's modes paid their
    compile (about 11 s of yolo11n's first step on an H200, cold) and a mode after it did not, so the order of the
    modes decided their set-up and first epoch. Costs a process start and a few steps (10-25 s)."""
    short = replace(cfg, steps=cfg.window, warmup=1, first_epoch=False, whole_run=0)
    run_isolated(mode, short, project, _Unseen())


def _stop(proc: subprocess.Popen, gently: bool, waits: tuple[float, float, float] = (2.0, 10.0, 5.0)) -> None:
    """Wait for a mode's process to end. ``gently`` (the bench stops early: Ctrl-C, SIGTERM, an error): give it
    ``waits[0]`` s to end by itself (a Ctrl-C reaches it too), then ask with SIGINT, so that a pack it builds is
    cleaned up, for ``waits[1]`` s; then SIGTERM for ``waits[2]`` s; then SIGKILL. Otherwise wait ``waits[1]`` s."""
    steps = [(None, waits[0]), (signal.SIGINT, waits[1]), (signal.SIGTERM, waits[2])] if gently else [(None, waits[1])]
    for sig, wait in steps:
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait()


def table(results: list[dict]) -> str:
    """One line a mode: the steady rate (median window) and, where measured, the first epoch's and the time to the
    first step."""
    ceiling = next((r["images_per_s"] for r in results if r["mode"] == "ceiling"), None)
    lines = [f"{'mode':<16}{'img/s':>9}{'÷ ceiling':>11}{'mean step':>11}{'GPU util':>10}{'TFLOP/s (MFU)':>15}"
             f"{'data wait':>11}{'CPU cores':>11}{'GPU mem':>9}{'1st epoch':>11}{'÷ steady':>10}{'1st step':>10}"]
    for r in results:
        ratio = f"{r['images_per_s'] / ceiling:.2f}" if ceiling else "-"
        util = f"{r['gpu_util']:.0f} %" if r["gpu_util"] is not None else "-"
        mem = f"{r['gpu_mem_peak_gb']:.1f} GB" if r["gpu_mem_peak_gb"] is not None else "-"
        step = f"{r['mean_step_ms']:,.0f} ms" if r.get("mean_step_ms") else "-"
        first = r.get("first_epoch_images_per_s")
        first_col = f"{first:>11,.0f}{first / r['images_per_s']:>10.2f}" if first and r["images_per_s"] else \
            f"{'-':>11}{'-':>10}"
        to_step = f"{r['first_step_s']:.1f} s" if r.get("first_step_s") is not None else "-"
        cores = f"{r['own_cores_busy']:.1f}"
        if r.get("machine_samples") == 0:  # the system probe was lost: its zeros are not measurements
            util = cores = "not sampled"
        lines.append(f"{r['mode']:<16}{r['images_per_s']:>9,.0f}{ratio:>11}{step:>11}{util:>10}{efficiency(r):>15}"
                     f"{100 * r['data_wait_fraction']:>10.0f}%{cores:>11}{mem:>9}{first_col}"
                     f"{to_step:>10}")
    for r in results:  # DDP: the row above is the total; each GPU's share
        if r.get("ranks"):
            per = " / ".join(f"{x['images_per_s']:,.0f}" for x in r["ranks"])
            util = " / ".join("-" if x["gpu_util"] is None else f"{x['gpu_util']:.0f}" for x in r["ranks"])
            lines.append(f"  {r['mode']} on {len(r['ranks'])} GPUs: img/s per GPU {per}; GPU util {util} %; "
                         f"host cores {r['cpu_cores_busy']:.1f} busy in all ({r['own_cores_busy']:.1f} training)")
    return "\n".join(lines)


def efficiency(r: dict) -> str:
    """A mode's training TFLOP/s and, on a GPU of known peak, its MFU: "33.2 (3.4 %)"."""
    if r.get("train_tflops") is None:
        return "-"
    return f"{r['train_tflops']:.1f}" + (f" ({100 * r['mfu']:.1f} %)" if r.get("mfu") is not None else "")


def slower_than_stock(results: list[dict]) -> list[str]:
    """A plain sentence for each yolofeed mode that ran slower than stock (CPU-only runs, typically)."""
    by_mode = {r["mode"]: r for r in results}
    stock = by_mode.get("stock")
    if not stock:
        return []
    return [f"{r['mode']} was slower than stock Ultralytics here: {r['images_per_s']:,.0f} vs "
            f"{stock['images_per_s']:,.0f} img/s" + ("" if r["gpu_util"] is not None else
                                                     " (no GPU: on the CPU, train with stock Ultralytics)")
            for r in results if r["mode"].startswith("yolofeed") and r["images_per_s"] < stock["images_per_s"]]


def warm_modes(results: list[dict], isolated: bool) -> list[str]:
    """A sentence when modes after the first trained in the process of an earlier one: their first step and first
    epoch came after its one-off costs."""
    if isolated or len(results) < 2:
        return []
    later = ", ".join(r["mode"] for r in results[1:])
    return [f"{later} trained in this process after {results[0]['mode']}, whose one-off costs (CUDA's context, "
            "cuDNN's plans, compiles) they did not pay again: their first step and first epoch look faster than a "
            "run of their own; " + ("one bench per mode (modes=stock, then modes=yolofeed) gives each a process of "
                                    "its own" if os.name == "nt" else "isolate=True trains each mode in a process of "
                                    "its own")]


def stopped_short(results: list[dict], epochs: int) -> list[str]:
    """A sentence for the modes of a whole run that trained fewer than its ``epochs`` (Ultralytics' early stopping,
    ``patience=``): their wall times are of shorter runs than the title says."""
    return [f"{r['mode']} trained {len(r['epochs'])} of the {epochs} epochs asked (early stopping: patience=): its "
            "wall time is of a shorter run and compares with no other mode's"
            for r in results if len(r.get("epochs") or ()) < epochs]


def heavy_optimizer(results: list[dict], asked: str = "auto", share: float = 0.25) -> list[str]:
    """A sentence for each mode whose optimiser step took ``share`` of its step or more: at a long run's length
    ``optimizer=auto`` picks MuSGD, whose step can outweigh the data pipeline both loaders are compared on.

    Args:
        asked: the run's ``optimizer=`` ("auto" unless given).
    """
    notes = []
    for r in results:
        ms, step = (r.get("phases_ms") or {}).get("optimizer", 0.0), r.get("mean_step_ms") or 0.0
        name = r.get("optimizer") or "unknown"
        if not step or ms < share * step:
            continue
        why = (" (optimizer=auto picks MuSGD for runs of more than 10,000 iterations at this run's epochs)"
               if name == "MuSGD" and str(asked).lower() == "auto" else "")
        lighter = "" if name in ("AdamW", "SGD") else "; optimizer=AdamW compares the loaders at a lighter step"
        notes.append(f"{r['mode']}: the optimiser step ({name}) took {ms:.0f} ms of its {step:.0f} ms step"
                     f"{why}{lighter}")
    return notes


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    from yolofeed.doctor.report import save_figure

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=120)
    names = [r["mode"] for r in results]
    rates = [r["images_per_s"] for r in results]
    bars = ax.bar(names, rates, color=[COLOURS.get(m, "#c44e52") for m in names])
    for b, r in zip(bars, results):
        util = f"\n{r['gpu_util']:.0f}% GPU" if r["gpu_util"] is not None else ""
        ax.annotate(f"{r['images_per_s']:,.0f} img/s{util}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("training images / s")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, max(rates) * 1.3 if rates and max(rates) > 0 else 1)
    fig.tight_layout()
    save_figure(fig, path)


def bench_title(cfg: BenchConfig, results: list[dict], gpus: list[str] | None = None) -> str:
    """What was measured: model, batch, imgsz, steps or epochs, the step's switches, the Ultralytics keys given
    (``fraction=0.5``, ``val=False``; all but ``device=``), and where (the device each mode trained on: a CUDA one by
    its GPU's name, from ``gpus``, NVML's names by index). ``batch=`` below 1 (AutoBatch: a share of the GPU's memory,
    or 16 on the CPU) is shown with the batch each mode trained at, and a batch larger than the training set with the
    set's size, which Ultralytics' loader trains at instead."""
    batch = f"batch {cfg.batch}"
    if not (isinstance(cfg.batch, int) and cfg.batch >= 1):
        used = list(dict.fromkeys(str(r.get("batch")) for r in results if r.get("batch") is not None))
        batch = f"batch={cfg.batch} (AutoBatch: {'/'.join(used) or '?'})"
    images = min((r["images"] for r in results if r.get("images")), default=None)
    if isinstance(cfg.batch, int) and images is not None and images < cfg.batch:  # Ultralytics' batch: at most the set
        batch += f" (the set's {images} images a step)"
    title = f"{cfg.model}, {batch}, imgsz {cfg.imgsz}, " + (
        f"whole runs of {cfg.whole_run} epochs" if cfg.whole_run else f"{cfg.steps} steps after {cfg.warmup}+ warm-up")
    title += "".join(f", {k}={v}" for k, v in _switches(cfg).items())  # yolofeed's step, not its default
    title += "".join(f", {k}={v}" for k, v in cfg.extra.items() if k != "device")
    devices = list(dict.fromkeys(_device_name(str(r["device"]), gpus or []) for r in results if r.get("device")))
    return title + (f", on {' / '.join(devices)}" if devices else "")


def _device_name(device: str, gpus: list[str]) -> str:
    """``cuda:i`` as NVML names GPU i where it can (the index is torch's, which NVML's order matches unless
    CUDA_VISIBLE_DEVICES reorders them: then the device as torch names it); else the device as torch names it."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or os.environ.get("CUDA_VISIBLE_DEVICES"):
        return device
    i = int(index) if index.isdigit() else 0
    return gpus[i] if i < len(gpus) else device


def run(cfg: BenchConfig) -> dict:
    """Run the modes, print the table, write ``bench.json`` and ``bench.png`` under ``cfg.out``.

    Each mode's Ultralytics run folder stays under ``<out>/runs/<mode>`` (args.yaml, and TensorBoard
    events when Ultralytics' TensorBoard setting is on); no weights are saved.
    """
    from yolofeed.atomic import write_atomically
    from yolofeed.doctor.report import command_line, not_written, unwritten, writable_folder
    from yolofeed.monitor.system import environment
    from yolofeed.train.keys import refuse_run_folder_keys

    refuse_run_folder_keys(cfg.extra, "yolofeed bench")
    modes = list(dict.fromkeys(m.strip() for m in cfg.modes.split(",") if m.strip()))  # a mode twice: once
    if not modes:
        raise ConfigError(f"modes={cfg.modes}: names no mode; choose from {', '.join(MODES)}")
    if cfg.whole_run and cfg.modes == WHOLE_RUN_DEFAULT[0]:  # the default's ceiling makes no model: leave it out
        modes = WHOLE_RUN_DEFAULT[1].split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ConfigError(f"modes={cfg.modes}: unknown {bad}; choose from {', '.join(MODES)}")
    if cfg.window < 1:
        raise ConfigError(f"window={cfg.window}: expected a whole number of steps, 1 or more (the default is 10)")
    if cfg.steps < cfg.window and not cfg.whole_run:
        raise ConfigError(f"steps={cfg.steps} is shorter than one window ({cfg.window}); measure more steps")
    replayed = [m for m in modes if m.startswith("ceiling")]
    if cfg.whole_run and replayed:
        raise ConfigError(f"whole_run={cfg.whole_run} with modes {', '.join(replayed)}: a ceiling replays four "
                          "batches, it makes no model worth validating; time whole runs of stock and yolofeed modes, "
                          "e.g. modes=stock,yolofeed")
    if cfg.whole_run and "epochs" in cfg.extra:
        raise ConfigError(f"epochs={cfg.extra['epochs']} with whole_run={cfg.whole_run}: whole_run= is the run's "
                          "epochs; give one of them")
    if cfg.whole_run and cfg.extra.get("time"):  # as Ultralytics reads it: 0 and None are off
        raise ConfigError(f"time={cfg.extra['time']} with whole_run={cfg.whole_run}: time= ends each run after that "
                          "many hours, so modes of different speeds would train different numbers of epochs; "
                          "whole_run= is the run's length: give one of them")
    validated = [m for m in modes if m in WHOLE_RUN_ONLY]
    if validated and (not cfg.whole_run or cfg.extra.get("val") is False):
        why = ("val=False validates the last epoch alone, in place" if cfg.whole_run
               else "steps without whole_run= never validate")
        rest = ",".join(m for m in modes if m not in WHOLE_RUN_ONLY) or "yolofeed"
        raise ConfigError(f"{'modes' if len(validated) > 1 else 'mode'} {', '.join(validated)} "
                          f"{'differ' if len(validated) > 1 else 'differs'} from yolofeed only in how epochs are "
                          f"validated, and {why}: time {'them' if len(validated) > 1 else 'it'} in whole runs that "
                          f"validate (whole_run=10, without val=False), or bench modes={rest}")
    from yolofeed.train import keys
    from yolofeed.train.keys import check_device
    from yolofeed.train.run import check_model_and_data

    # as yolofeed train checks it: one line, before any mode runs (stock alone may profile Apple's devices)
    device = check_device(cfg.extra.get("device"), ours=any(m != "stock" for m in modes))
    check_model_and_data(cfg.model, cfg.data, cfg.extra.get("split") or "val")  # and these: not in a mode's traceback
    if any(m != "stock" for m in modes):  # what yolofeed's modes refuse (rect=True...): not after stock's run
        keys.check({**cfg.extra, "model": cfg.model, "data": cfg.data})
    # before any training: a bad out= fails in a second, not after the modes
    out = writable_folder(cfg.out, reports=("bench.json", "bench.png"))
    # each mode's own warm-up is in bench.json: stock's is raised to its loader's queue (measure/profile.py)
    about = {"command": command_line("bench", cfg), **environment()}
    results: list[dict] = []
    failed: OSError | None = None  # the last write of bench.json, or bench.png: a full disk is said after the table
    written = 0  # the modes the last bench.json written holds
    ranks = "," in device  # several GPUs: each mode's ranks are processes of their own already
    # the mode's process gets its pipe as a file descriptor (POSIX); on Windows the modes train in this process,
    # and the note under the table says to run one bench per mode
    own = cfg.isolate and not ranks and os.name != "nt"
    progress = Progress(modes, 0, 0) if cfg.whole_run else Progress(modes, cfg.steps, cfg.warmup)
    # a SIGTERM to the bench alone (timeout, docker stop) stops its mode's process first, cleanly, instead of
    # killing the bench at once and so the mode with it, mid pack-build
    stack = contextlib.ExitStack()
    if own:
        stack.enter_context(sigterm_exits())
    try:
        seed = kernel_mode(modes, own, device)
        if seed is not None:
            progress.write("yolofeed bench: compiling yolofeed's kernels (a few untimed steps), as a second run "
                           "finds them")
            compile_kernels(seed, cfg, out / "runs" / "kernels")
        for m in modes:
            try:
                results.append((run_isolated if own else run_mode)(m, cfg, out / "runs", progress))
            except PackSpaceError as e:
                # every yolofeed mode but yolofeed_jpeg trains from the raw pack, whatever format=auto would pick
                raw = [x for x in modes if x.startswith("yolofeed") and x != "yolofeed_jpeg"]
                if m not in raw:
                    raise
                instead = ",".join(dict.fromkeys("yolofeed_jpeg" if x in raw else x for x in modes))
                raise PackSpaceError(f"{e}; or bench the jpeg pack, 5-10x smaller for photos of about imgsz, in place "
                                     f"of the raw pack's {', '.join(raw)}: modes={instead}") from e
            notes = warm_modes(results, own or ranks) + stopped_short(results, cfg.whole_run) if cfg.whole_run else (
                slower_than_stock(results) + heavy_optimizer(results, cfg.extra.get("optimizer", "auto"))
                + warm_modes(results, own or ranks))
            title = bench_title(cfg, results, about.get("gpus"))
            report = {"config": asdict(cfg), "environment": about, "results": results, "title": title, "notes": notes}
            try:  # after each mode: an interrupted bench keeps what it measured
                write_atomically(out / "bench.json", json.dumps(report, indent=1).encode())
                failed, written = None, len(results)
            except OSError as e:  # a full disk: the modes after are measured all the same, and the table printed
                failed = e
    finally:
        stack.close()
        progress.close()
    if failed is None:
        try:
            (whole.plot if cfg.whole_run else plot)(results, out / "bench.png", title)
        except OSError as e:
            failed = e
    notes = "".join(f"\nNOTE: {n}" for n in report["notes"])
    text = (whole.table if cfg.whole_run else table)(results)
    files = (f"-> {out / 'bench.json'}, {out / 'bench.png'}, runs in {out / 'runs'}" if failed is None
             else f"report: not written ({unwritten(failed)})")
    print(title + "\n" + text + notes + "\n" + files, flush=True)
    if failed is not None:
        kept = (f"; {out / 'bench.json'} holds the first {written} of {len(modes)} modes"
                if 0 < written < len(modes) else "")
        raise not_written("out", cfg.out, out, failed, "the table", kept)
    return report
