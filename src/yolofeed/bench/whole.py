"""The whole run, as a user makes it: ``yolofeed bench whole_run=E`` trains each mode for E epochs and times it.

``yolofeed bench`` otherwise measures training steps only, with validation and checkpoints off. A user lives with the
whole run: the set-up, the first epoch, validation after every epoch, a checkpoint and results.csv row after each,
the last validation of best.pt, the plots; and the optimiser ``optimizer=auto`` picks for the run's length. Here
every setting is Ultralytics' default but those the caller gives, and ``epochs`` is E.

What is timed, on the host clock of the mode's own process (``isolate=True``):

* ``wall_s``: from building the trainer to ``train()`` returning (set-up, every epoch, the final validation, plots);
* per epoch (``epochs``): ``train_s`` (its training steps; the GPU synced at their end), ``val_s`` (the validation
  waited for in it: its own, ``on_val_start`` to ``on_val_end``; with ``val_overlap``, the wait for the previous
  epoch's, run beside this one, whose own time is that epoch's ``val_beside_s``), and ``epoch_s`` (from its start to
  ``on_fit_epoch_end``, or to the next epoch's start where its end comes an epoch late: validation, the results.csv
  row and the checkpoint included);
* ``setup_s`` (building the trainer to the first epoch's start) and ``final_s`` (the last epoch's end to the end:
  best.pt validated again, the plots);
* ``save_s`` in an epoch's record: the time ``save_model`` took in it, in the training thread (serialising the
  checkpoint and queueing its files' writes, which run beside the training; waiting for them too where a callback may
  read them; with ``val_overlap`` the previous epoch's, saved at this one's end);
* where they go (``parts``): ``build_s`` (the trainer's constructor: the data yaml's check, the model's build),
  ``setup_train_s`` (``train()`` to the end of Ultralytics' ``_setup_train``: the model on the device, the AMP check,
  the loaders, the optimiser; yolofeed's warm-up included), ``warm_up_s`` (yolofeed's warm-up alone, as its trainer
  times it), ``first_batch_s`` (the first epoch's start to its first batch's end: the first step's one-off costs,
  yolofeed's graph capture among them) and ``final_val_s`` (the final validation of best.pt, its plots included;
  the rest of ``final_s`` is best.pt's load, the run's own plots and the checkpoints' stripping), of it
  ``final_val_batches_s`` (to its last batch's end: the inference, NMS and the statistics; the rest is the metrics,
  their curves and confusion matrix drawn, and the printout).
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import torch

from yolofeed.errors import caller_says_stops
from yolofeed.measure.progress import Progress, ultralytics_quiet
from yolofeed.ultralytics_seam import LOGGER, validating_beside

FIGURES = ("mode", "wall_s", "setup_s", "final_s", "parts", "epochs", "images", "optimizer", "device")


def whole_run(mode: str, trainer_class: type, args: dict[str, Any], epochs: int,
              progress: Progress | None = None) -> dict:
    """Train ``trainer_class`` with Ultralytics ``args`` for ``epochs`` epochs, every other setting its default, and
    return the timings this module's docstring lists (``FIGURES``), each epoch's in ``epochs``.

    Args:
        progress: the bench's bar: counts batches (its total grown by this run's), holds back Ultralytics' output.
    """
    state: dict[str, Any] = {"epochs": [], "t_val": None, "marks": {}}

    def now() -> float:
        return time.perf_counter()

    def mark(name: str) -> None:
        state["marks"].setdefault(name, now())  # the first time only

    def on_train_start(trainer) -> None:
        state["optimizer"] = type(trainer.optimizer).__name__
        state["images"] = len(trainer.train_loader.dataset)
        if progress is not None:
            progress.grow(epochs * len(trainer.train_loader) - 1)

    def record(trainer) -> dict | None:
        return next((r for r in state["epochs"] if r["epoch"] == trainer.epoch + 1), None)

    def on_epoch_start(trainer) -> None:
        if state["epochs"] and "epoch_s" not in state["epochs"][-1]:  # its end comes late (val_overlap)
            state["epochs"][-1]["epoch_s"] = now() - state["epochs"][-1]["t0"]
        state["epochs"].append({"epoch": trainer.epoch + 1, "t0": now()})
        mark("first_epoch")

    def on_epoch_end(trainer) -> None:
        if trainer.device.type == "cuda":  # the steps end when their work does (the training's stream: a validation
            torch.cuda.current_stream(trainer.device).synchronize()  # beside the training, val_overlap, is not theirs)
        state["epochs"][-1]["train_s"] = now() - state["epochs"][-1]["t0"]

    def on_val_start(validator) -> None:
        state["t_val"] = now()

    def on_val_batch_end(validator) -> None:
        state["t_val_batch"] = now()

    def on_val_end(validator) -> None:
        if validating_beside():  # an epoch validated beside the next: the trainer times it (val_overlapped)
            return
        if state["t_val"] is not None and state["epochs"] and "epoch_s" not in state["epochs"][-1]:
            record = state["epochs"][-1]
            record["val_s"] = record.get("val_s", 0.0) + now() - state["t_val"]
        elif state["t_val"] is not None and "t_last" in state:  # the final validation of best.pt
            state["final_val_s"] = state.get("final_val_s", 0.0) + now() - state["t_val"]
            if state.get("t_val_batch", 0.0) > state["t_val"]:
                state["final_val_batches_s"] = state["t_val_batch"] - state["t_val"]
        state["t_val"] = None

    def on_fit_epoch_end(trainer) -> None:  # also after the final validation of best.pt: that one is not an epoch's
        r = record(trainer)
        if r is not None and "epoch_s" not in r:
            r["epoch_s"] = now() - r["t0"]
            state["t_last"] = now()

    def on_batch_end(trainer) -> None:
        mark("first_batch")
        if progress is not None:
            progress.step()

    full = {"exist_ok": True, "name": mode, **args, "epochs": epochs}
    if progress is not None:
        progress.start(mode, f": {epochs} epochs")
    with ultralytics_quiet(progress is not None):
        t_build = now()
        trainer = trainer_class(overrides=full)
        mark("built")
        save_model = trainer.save_model

        def timed_save(*a, **k):  # on the instance: the loop and seam.end_epoch_late call self.save_model()
            t0 = now()
            try:
                return save_model(*a, **k)
            finally:
                if state["epochs"]:
                    r = state["epochs"][-1]
                    r["save_s"] = r.get("save_s", 0.0) + now() - t0

        trainer.save_model = timed_save
        for event, fn in (("on_pretrain_routine_end", lambda t: mark("set_up")),  # after yolofeed's warm-up
                          ("on_train_start", on_train_start), ("on_train_epoch_start", on_epoch_start),
                          ("on_train_epoch_end", on_epoch_end), ("on_val_start", on_val_start),
                          ("on_val_batch_end", on_val_batch_end), ("on_val_end", on_val_end),
                          ("on_fit_epoch_end", on_fit_epoch_end),
                          ("on_train_batch_end", on_batch_end)):
            trainer.add_callback(event, fn)  # the validator shares the trainer's callbacks
        try:
            with caller_says_stops():  # a mode stopped by yolofeed's error: the bench's error line says the cause,
                trainer.train()  # not the training's stop line, whose resume (yolofeed train resume=) is no bench's
        finally:
            for name in ("train_loader", "test_loader"):
                loader = getattr(trainer, name, None)
                if hasattr(loader, "close"):
                    loader.close()
        t_end = now()
    beside(state["epochs"], getattr(trainer, "val_overlapped", None))
    records = [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items() if k != "t0"}
               for r in state["epochs"]]
    result = {"mode": mode, "wall_s": round(t_end - t_build, 2),
              "setup_s": round(state["epochs"][0]["t0"] - t_build, 2) if state["epochs"] else None,
              "final_s": round(t_end - state["t_last"], 2) if "t_last" in state else None,
              "parts": run_parts(state["marks"], t_build, getattr(trainer, "warm_up_s", None),
                                 state.get("final_val_s"), getattr(trainer, "plots_beside", None),
                                 getattr(trainer, "warm_up_parts", None), state.get("final_val_batches_s")),
              "epochs": records, "images": state.get("images"), "optimizer": state.get("optimizer", ""),
              "device": str(trainer.device), "batch": trainer.batch_size}  # AutoBatch's, where batch= asked for it
    if len(records) < epochs:
        LOGGER.warning(f"yolofeed bench: {mode} trained {len(records)} of {epochs} epochs (early stopping: patience=)")
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def beside(records: list[dict], overlapped: dict | None) -> None:
    """Put the validations run beside the next epoch (``FastTrainer.val_overlapped``: epoch -> its own seconds and
    those waited for it) into the epochs' records: its own time as the epoch's ``val_beside_s``, the wait in the
    next epoch's ``val_s`` (the next epoch waited for it)."""
    by_epoch = {r["epoch"]: r for r in records}
    for epoch, times in (overlapped or {}).items():
        if epoch in by_epoch:
            by_epoch[epoch]["val_beside_s"] = times["val_s"]
        if epoch + 1 in by_epoch:
            by_epoch[epoch + 1]["val_s"] = by_epoch[epoch + 1].get("val_s", 0.0) + times["waited_s"]


def run_parts(marks: dict[str, float], t_build: float, warm_up_s: float | None, final_val_s: float | None,
              plots_beside: dict | None = None, warm_up_parts: dict | None = None,
              final_val_batches_s: float | None = None) -> dict[str, float | None]:
    """The set-up's, the first batch's and the end's parts (the module's doc), seconds rounded; None where a mark
    never came (a resumed run past its set-up, an epoch without batches). yolofeed's plots drawn beside other work
    (``FastTrainer.plots_beside``) add ``<plot>_plot_s`` and ``<plot>_plot_waited_s``: what it took, what the run
    waited for it; its warm-up's parts (``warmup.warm_up``'s) add ``warm_up_<part>_s``."""
    def span(a: str | float, b: str) -> float | None:
        start = marks.get(a) if isinstance(a, str) else a
        return round(marks[b] - start, 2) if start is not None and b in marks else None

    return {"build_s": span(t_build, "built"), "setup_train_s": span("built", "set_up"),
            "warm_up_s": None if warm_up_s is None else round(warm_up_s, 2),
            "first_batch_s": span("first_epoch", "first_batch"),
            "final_val_s": None if final_val_s is None else round(final_val_s, 2),
            "final_val_batches_s": None if final_val_batches_s is None else round(final_val_batches_s, 2),
            **{f"{name}_plot{key}": None if t is None else round(t, 2)
               for name, times in (plots_beside or {}).items() for key, t in zip(("_s", "_waited_s"), times)},
            **{f"warm_up_{part}": round(t, 2) for part, t in (warm_up_parts or {}).items()}}


def later(result: dict, key: str) -> float | None:
    """The median of ``key`` over the epochs after the first (the steady state a long run lives on), or the first's
    where there is one epoch only."""
    values = [r[key] for r in result["epochs"][1:] if r.get(key) is not None] or \
        [r[key] for r in result["epochs"][:1] if r.get(key) is not None]
    return statistics.median(values) if values else None


def table(results: list[dict]) -> str:
    """One line a mode: the wall time and its speed-up on stock (stock's time over the mode's), the set-up, the first
    and later epochs (validation in them) and their speed-up, the later epochs' validation, checkpoint (``save_s``) and
    training rate, and the end."""
    stock = next((r for r in results if r["mode"] == "stock"), None)
    width = max([16, *(len(r["mode"]) + 2 for r in results)])
    lines = [f"{'mode':<{width}}{'wall':>9}{'speed-up':>10}{'set-up':>8}{'1st epoch':>11}{'later':>8}{'speed-up':>10}"
             f"{'val':>7}{'save':>7}{'train img/s':>13}{'end':>7}  optimizer"]
    for r in results:
        first = r["epochs"][0]["epoch_s"] if r["epochs"] and "epoch_s" in r["epochs"][0] else None
        epoch, val, save, train = later(r, "epoch_s"), later(r, "val_s"), later(r, "save_s"), later(r, "train_s")
        rate = r["images"] / train if r.get("images") and train else None
        wall_ratio = f"{stock['wall_s'] / r['wall_s']:.2f}" if stock and r is not stock and r["wall_s"] else "-"
        s_epoch = later(stock, "epoch_s") if stock else None
        epoch_ratio = f"{s_epoch / epoch:.2f}" if s_epoch and epoch and r is not stock else "-"

        def s(x: float | None, fmt: str = "") -> str:
            return "-" if x is None else (fmt or ("{:.2f} s" if x < 1 else "{:.1f} s")).format(x)

        lines.append(f"{r['mode']:<{width}}{s(r['wall_s']):>9}{wall_ratio:>10}{s(r['setup_s']):>8}{s(first):>11}"
                     f"{s(epoch):>8}{epoch_ratio:>10}{s(val):>7}{s(save):>7}{s(rate, '{:,.0f}'):>13}"
                     f"{s(r['final_s']):>7}  "
                     f"{r.get('optimizer') or '-'}")
    for r in results:
        lines.append(f"  {r['mode']}: " + breakdown(r))
    return "\n".join(lines)


WARM_UP_PARTS = (("full_batch_s", "full batch"), ("after_full_s", "graph and validation set-up"),
                 ("other_sizes_s", "other batch sizes"), ("augmentation_s", "augmentation"))


def breakdown(result: dict) -> str:
    """Where a run's set-up, first batch and end went, in words (``run_parts``' figures)."""
    p = result.get("parts") or {}

    def s(key: str) -> str:
        return "-" if p.get(key) is None else f"{p[key]:.1f} s"

    split = ", ".join(f"{what} {s(f'warm_up_{part}')}" for part, what in WARM_UP_PARTS if f"warm_up_{part}" in p)
    warm = f" (warm-up {s('warm_up_s')}{': ' + split if split else ''})" if p.get("warm_up_s") is not None else ""
    beside = "".join(f"; {name} plot {s(f'{name}_plot_s')} beside, {s(f'{name}_plot_waited_s')} waited"
                     for name in ("labels", "results") if f"{name}_plot_s" in p)
    if "warm_up_beside_s" in p:  # train/short_batches.py: the other batch sizes' set-up, beside an epoch
        beside = f"; other batch sizes' set-up {s('warm_up_beside_s')} beside an epoch" + beside
    if "warm_up_early_s" in p:  # train/plans.py: the full batch's early pass, beside the trainer's build
        warm += f"; the full batch's early pass {s('warm_up_early_s')} beside the trainer's build"
    return (f"set-up: trainer {s('build_s')}, _setup_train {s('setup_train_s')}{warm}; "
            f"first batch {s('first_batch_s')}; end: final validation {s('final_val_s')}"
            f"{f' (its batches {s(batches)})' if p.get(batches := 'final_val_batches_s') is not None else ''}{beside}")


PARTS = (("set-up", "#bbbbbb"), ("training steps", "#2a7ab0"), ("validation", "#dd8452"),
         ("rows, checkpoints", "#8172b2"), ("final validation, plots", "#937860"))


def parts(result: dict) -> list[float]:
    """Where a run's wall time went, in ``PARTS``' order (seconds); what no part names goes to the first or last."""
    epochs = result["epochs"]
    train = sum(r.get("train_s", 0.0) for r in epochs)
    val = sum(r.get("val_s", 0.0) for r in epochs)
    rest = sum(max(r.get("epoch_s", 0.0) - r.get("train_s", 0.0) - r.get("val_s", 0.0), 0.0) for r in epochs)
    return [result.get("setup_s") or 0.0, train, val, rest, result.get("final_s") or 0.0]


def plot(results: list[dict], path: Any, title: str) -> None:
    """One horizontal bar a mode, its wall time split into ``PARTS``."""
    import matplotlib

    from yolofeed.doctor.report import save_figure

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.7 + 0.55 * len(results)), dpi=120)
    for y, r in enumerate(results):
        left = 0.0
        for (name, colour), width in zip(PARTS, parts(r)):
            ax.barh(y, width, left=left, color=colour, label=name if y == 0 else None)
            left += width
        ax.annotate(f"{r['wall_s']:,.0f} s", (left, y), xytext=(3, 0), textcoords="offset points", va="center",
                    fontsize=8)
    ax.set_yticks(range(len(results)), [r["mode"] for r in results])
    ax.invert_yaxis()
    ax.set_xlabel("seconds to the end of the run")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path)
