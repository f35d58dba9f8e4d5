"""Ultralytics' labels plot and results.png drawn beside other work (train/plots.py): the same files as stock's, the
run waiting for them where stock draws them, a failure raised or redrawn as stock would, and a training run that
makes both."""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from yolofeed.train.plots import InThread, ResultsPlot

TINY = dict(epochs=1, imgsz=64, batch=8, device="cpu", workers=0, verbose=False, exist_ok=True)


def test_a_thread_runs_beside_and_its_join_waits_and_raises_what_it_raised():
    started, release = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(5)

    job = InThread(slow, "test-plots")
    assert started.wait(5)  # running before anyone joins
    release.set()
    assert job.join() >= 0.0 and job.seconds is not None

    def fails():
        raise ValueError("no labels")

    with pytest.raises(ValueError, match="no labels"):
        InThread(fails, "test-plots").join()


def _results_csv(folder: Path, rows: int = 3) -> Path:
    """A results.csv with Ultralytics' detection columns."""
    head = ("epoch,time,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision(B),metrics/recall(B),"
            "metrics/mAP50(B),metrics/mAP50-95(B),val/box_loss,val/cls_loss,val/dfl_loss,lr/pg0,lr/pg1,lr/pg2")
    lines = [head] + [",".join([str(e + 1), str(10.0 * (e + 1))] + [f"{0.5 / (e + 1):.4f}"] * 13) for e in range(rows)]
    csv = folder / "results.csv"
    csv.write_text("\n".join(lines) + "\n")
    return csv


@pytest.mark.slow
def test_results_png_is_drawn_in_a_child_as_ultralytics_draws_it(tmp_path):
    from ultralytics.utils.plotting import plot_results

    ours, stock = tmp_path / "ours", tmp_path / "stock"
    ours.mkdir(), stock.mkdir()
    plot_results(file=_results_csv(stock))
    plot = ResultsPlot(_results_csv(ours))
    seen = []
    drawn, waited = plot.finish(seen.append)
    assert drawn and waited >= 0.0 and plot.seconds >= waited
    assert seen == [ours / "results.png"]  # handed on as plot_results hands it to on_plot
    png = (ours / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) == pytest.approx(len((stock / "results.png").read_bytes()),
                                                                           rel=0.02)


@pytest.mark.slow
def test_a_child_that_fails_or_complains_leaves_the_drawing_to_the_caller(tmp_path):
    seen = []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert ResultsPlot(empty / "results.csv").finish(seen.append)[0] is False  # no csv: plot_results asserts
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.csv").write_text("epoch,metrics/x\n1,not a number\n")  # logged as a plotting error
    assert ResultsPlot(bad / "results.csv").finish(seen.append)[0] is False
    assert seen == []


def test_a_child_past_its_time_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr("yolofeed.train.plots.RESULTS_PLOT", "import time; time.sleep(30)")
    plot = ResultsPlot(_results_csv(tmp_path))
    start = time.perf_counter()
    assert plot.finish(timeout=0.5)[0] is False
    assert time.perf_counter() - start < 10


def test_a_child_the_run_no_longer_waits_for_is_ended_and_reaped(tmp_path, monkeypatch):
    monkeypatch.setattr("yolofeed.train.plots.RESULTS_PLOT", "import time; time.sleep(30)")
    plot = ResultsPlot(_results_csv(tmp_path))
    child = plot._child
    plot.abandon()
    assert child.poll() is not None and plot.finish()[0] is False  # killed and reaped: no zombie kept


@pytest.mark.slow
def test_the_child_imports_from_the_parents_path_not_the_working_folder(tmp_path, monkeypatch):
    """``python -c`` puts the working folder first on the child's path, where the parent has none: a module there
    named as one plot_results imports must not shadow it, nor one the child's own first lines import (signal, ctypes:
    the parent-death signal's, imported once before the path was mended)."""
    for name in ("polars", "signal", "ctypes"):  # each leaves a mark where it runs
        (tmp_path / f"{name}.py").write_text(f"open({str(tmp_path / ('ran-' + name))!r}, 'w').close()\n"
                                              f"raise ImportError('the working folder shadowed {name}')\n")
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    assert ResultsPlot(_results_csv(run)).finish()[0] is True
    assert not list(tmp_path.glob("ran-*"))


@pytest.mark.slow
def test_a_run_draws_both_beside_and_the_files_are_stocks(synth_root, tmp_path, monkeypatch):
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer
    from yolofeed.train.plots import FigureDrawers

    monkeypatch.setattr(FigureDrawers, "count", staticmethod(lambda: 2))  # children on CI's two cores too
    started = []  # results.png's child: started with the last epoch (its imports beside it), told to draw later
    real_init, real_go = ResultsPlot.__init__, ResultsPlot.go
    monkeypatch.setattr(ResultsPlot, "__init__", lambda self, csv, go=True: (started.append(("start", go)),
                                                                             real_init(self, csv, go))[1])
    monkeypatch.setattr(ResultsPlot, "go", lambda self: (started.append(("go", Path(self.csv).is_file())),
                                                         real_go(self))[1])
    model = YOLO("yolo11n.yaml")
    model.add_callback("on_train_epoch_end", lambda t: started.append(("epoch end", None)))
    at_val_end = []  # what on_val_end's callbacks find: the figures drawn, handed to the validator's on_plot
    model.add_callback("on_val_end", lambda v: at_val_end.append(
        sorted(p.name for p in v.plots if p.name.endswith("_curve.png") or "confusion" in p.name)))
    seen = []  # what another callback at on_pretrain_routine_end finds, as stock hands it: labels.jpg drawn
    model.add_callback("on_pretrain_routine_end", lambda t: seen.append(
        ((Path(t.save_dir) / "labels.jpg").is_file(), Path(t.save_dir) / "labels.jpg" in t.plots)))
    model.train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"), project=str(tmp_path), name="ours",
                plots=True, **TINY)
    run = tmp_path / "ours"
    assert (run / "labels.jpg").is_file() and (run / "results.png").is_file()
    beside = model.trainer.plots_beside
    assert set(beside) == {"labels", "results", "figures"}
    assert all(took is not None and took >= 0 and waited >= 0 for took, waited in beside.values())
    assert run / "results.png" in model.trainer.plots and run / "labels.jpg" in model.trainer.plots
    assert seen == [(True, True)]
    assert started == [("start", False), ("epoch end", None), ("go", True)], started
    figures = ["BoxF1_curve.png", "BoxPR_curve.png", "BoxP_curve.png", "BoxR_curve.png", "confusion_matrix.png",
               "confusion_matrix_normalized.png"]
    assert at_val_end[-1] == figures and all((run / name).is_file() for name in figures)


def _figure_inputs(nc: int = 5):
    """What a validation hands Ultralytics' figure functions: ap_per_class's statistics, a confusion matrix."""
    import numpy as np
    from ultralytics.utils.metrics import ConfusionMatrix

    rng = np.random.default_rng(0)
    n = 400
    tp = rng.random((n, 10)) < 0.5
    conf, pred_cls = rng.random(n), rng.integers(0, nc, n)
    target_cls = rng.integers(0, nc, 300)
    names = {i: f"class{i}" for i in range(nc)}
    cm = ConfusionMatrix(names=names)
    cm.matrix = rng.integers(0, 20, (nc + 1, nc + 1)).astype(float)
    return (tp, conf, pred_cls, target_cls, names), cm


def _draw_figures(folder: Path, inputs, cm, seen: list) -> None:
    """The figures a detection validation draws with plots on: ap_per_class's four curves and the two confusion
    matrices, each handing its file and data to ``seen``."""
    from ultralytics.utils import metrics

    tp, conf, pred_cls, target_cls, names = inputs
    metrics.ap_per_class(tp, conf, pred_cls, target_cls, plot=True, save_dir=folder, names=names,
                         on_plot=lambda *a: seen.append(a), prefix="Box")
    for normalize in True, False:
        cm.plot(save_dir=folder, normalize=normalize, on_plot=lambda *a: seen.append(a))


def test_the_final_validations_figures_drawn_by_children_are_stocks_byte_for_byte(tmp_path):
    from yolofeed.train.plots import FigureDrawers
    from yolofeed.ultralytics_seam import final_figures

    inputs, cm = _figure_inputs()
    stock, ours = tmp_path / "stock", tmp_path / "ours"
    stock.mkdir(), ours.mkdir()
    stock_seen, ours_seen = [], []
    _draw_figures(stock, inputs, cm, stock_seen)
    drawers = FigureDrawers(2)
    children = list(drawers._children)
    with final_figures(drawers.draw):
        _draw_figures(ours, inputs, cm, ours_seen)
        assert ours_seen == [] and not any(ours.iterdir())  # taken: nothing drawn in this thread
    assert drawers.finish() >= 0.0 and drawers.seconds is not None
    assert all(child.poll() is not None for child in children)  # ended and reaped
    names = sorted(p.name for p in stock.iterdir())
    assert len(names) == 6 and names == sorted(p.name for p in ours.iterdir())
    for name in names:
        assert (ours / name).read_bytes() == (stock / name).read_bytes(), name
    # on_plot gets each file and its data as stock's does, in the same order
    assert [(Path(p).name, data) for p, data in ours_seen] == [(Path(p).name, data) for p, data in stock_seen]


def test_figures_a_child_could_not_draw_are_drawn_here_and_other_threads_are_not_routed(tmp_path):
    from yolofeed.train.plots import FigureDrawers
    from yolofeed.ultralytics_seam import final_figures

    inputs, cm = _figure_inputs()
    drawers = FigureDrawers(2)
    for child in drawers._children:  # children gone before any figure: killed, crashed
        child.kill()
    seen, beside = [], []
    with final_figures(drawers.draw):
        (tmp_path / "other").mkdir()
        other = threading.Thread(target=lambda: cm.plot(save_dir=tmp_path / "other",
                                                        on_plot=lambda *a: beside.append(a)))
        other.start(), other.join()
        _draw_figures(tmp_path, inputs, cm, seen)
    assert len(beside) == 1 and (tmp_path / "other" / "confusion_matrix_normalized.png").is_file()  # stock's, at once
    drawers.finish(timeout=30)
    assert len(seen) == 6 and all(Path(p).is_file() for p, _ in seen)


def test_figures_not_back_in_time_are_drawn_here_once_the_children_are_ended(tmp_path, monkeypatch):
    from yolofeed.train.plots import FigureDrawers
    from yolofeed.ultralytics_seam import final_figures

    monkeypatch.setattr("yolofeed.train.plots.FIGURE_CHILD", "import time; time.sleep(60)")  # reads no job
    inputs, cm = _figure_inputs(nc=80)  # its curves' jobs outgrow a pipe's buffer: a thread blocks writing them
    drawers = FigureDrawers(2)
    children = list(drawers._children)
    seen = []
    with final_figures(drawers.draw):
        _draw_figures(tmp_path, inputs, cm, seen)
    start = time.perf_counter()
    drawers.finish(timeout=0.5)
    assert time.perf_counter() - start < 15 and all(child.poll() is not None for child in children)
    assert [Path(p).name for p, _ in seen] == ["BoxPR_curve.png", "BoxF1_curve.png", "BoxP_curve.png",
                                              "BoxR_curve.png", "confusion_matrix_normalized.png",
                                              "confusion_matrix.png"]
    assert all(Path(p).is_file() for p, _ in seen)


def test_a_stopped_figure_child_is_not_waited_for_and_a_line_says_so(tmp_path, caplog):
    """A child stopped (SIGSTOP, a debugger) draws nothing until resumed: the wait ends within a poll, not at its
    limit, the figures are drawn here, one line says why, and the children are ended (a stopped child is killed)."""
    import signal

    from yolofeed.train.plots import FigureDrawers
    from yolofeed.ultralytics_seam import final_figures

    inputs, cm = _figure_inputs()
    drawers = FigureDrawers(2)
    children = list(drawers._children)
    for child in children:
        os.kill(child.pid, signal.SIGSTOP)
    seen = []
    with final_figures(drawers.draw):
        _draw_figures(tmp_path, inputs, cm, seen)
    start = time.perf_counter()
    with caplog.at_level("WARNING"):
        drawers.finish(timeout=120)
    assert time.perf_counter() - start < 20 and all(child.poll() is not None for child in children)
    assert len(seen) == 6 and all(Path(p).is_file() for p, _ in seen)
    assert "figures drawn here after" in caplog.text and "a child was stopped" in caplog.text


def test_a_stopped_or_late_results_child_is_killed_and_a_line_says_so(tmp_path, monkeypatch, caplog):
    import signal

    monkeypatch.setattr("yolofeed.train.plots.RESULTS_PLOT", "import time; time.sleep(60)")
    plot = ResultsPlot(_results_csv(tmp_path))
    os.kill(plot._child.pid, signal.SIGSTOP)
    start = time.perf_counter()
    with caplog.at_level("WARNING"):
        assert plot.finish(timeout=120)[0] is False
    assert time.perf_counter() - start < 10 and "results.png drawn here" in caplog.text and "stopped" in caplog.text
    (tmp_path / "late").mkdir()
    late = ResultsPlot(_results_csv(tmp_path / "late"))
    with caplog.at_level("WARNING"):
        assert late.finish(timeout=0.5)[0] is False
    assert "not done in time" in caplog.text


@pytest.mark.parametrize("verbose", ["True", "False"])
def test_a_figure_that_fails_in_a_child_is_drawn_here_and_says_so_as_stocks_does(tmp_path, caplog, monkeypatch,
                                                                                 verbose):
    """Ultralytics' TryExcept only warns: the child must say it even where the run is not verbose (YOLO_VERBOSE, read
    by the child's Ultralytics at import)."""
    from yolofeed.train.plots import FigureDrawers
    from yolofeed.ultralytics_seam import final_figures

    monkeypatch.setenv("YOLO_VERBOSE", verbose)
    _, cm = _figure_inputs()
    drawers = FigureDrawers(2)
    with final_figures(drawers.draw):
        cm.plot(save_dir=tmp_path / "missing", on_plot=None)  # no such folder: Ultralytics' TryExcept warns
    drawers.finish(timeout=60)
    assert "ConfusionMatrix plot failure" in caplog.text  # the child said it, and this process drew it as stock


def test_the_children_draw_with_the_parents_matplotlib_settings(tmp_path):
    import matplotlib

    from yolofeed.train.plots import FigureDrawers
    from yolofeed.ultralytics_seam import final_figures

    _, cm = _figure_inputs()
    (tmp_path / "stock").mkdir(), (tmp_path / "ours").mkdir()
    drawers = FigureDrawers(1)  # one child: the second figure after the first, the settings of each its own
    with matplotlib.rc_context({"axes.facecolor": "#ffeedd", "font.family": "monospace"}):
        cm.plot(save_dir=tmp_path / "stock")
        with final_figures(drawers.draw):
            cm.plot(save_dir=tmp_path / "ours")
    cm.plot(save_dir=tmp_path / "stock", normalize=False)  # the defaults again
    with final_figures(drawers.draw):
        cm.plot(save_dir=tmp_path / "ours", normalize=False)
    drawers.finish(timeout=60)
    for name in ("confusion_matrix_normalized.png", "confusion_matrix.png"):
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "stock" / name).read_bytes(), name


def test_a_frozen_executable_draws_every_figure_itself(tmp_path, monkeypatch):
    from yolofeed.train.plots import FigureDrawers
    from yolofeed.ultralytics_seam import final_figures

    monkeypatch.setattr("sys.frozen", True, raising=False)
    assert FigureDrawers.count() == 0
    drawers = FigureDrawers(2)  # as a caller that did not ask count() would make it: no child, all drawn here
    _, cm = _figure_inputs()
    with final_figures(drawers.draw):
        cm.plot(save_dir=tmp_path)
    assert (tmp_path / "confusion_matrix_normalized.png").is_file() and drawers.finish() >= 0.0
    drawers.close()


def test_a_stop_while_the_final_validation_waits_in_its_queue_ends_the_figure_children(tmp_path):
    """A Ctrl-C while the final validation is queued behind another in the validation thread: its job never runs,
    so the trainer's own call ends the children it handed over."""
    from yolofeed.train.plots import FigureDrawers, PlotsBeside

    figures = FigureDrawers(2)
    children = list(figures._children)

    def queued(*args, **kwargs):
        raise KeyboardInterrupt

    trainer = SimpleNamespace(validator=SimpleNamespace(), _figures=figures, _in_validation_thread=queued,
                              _figures_drawn=None)
    with pytest.raises(KeyboardInterrupt):
        PlotsBeside._validate_best(trainer, tmp_path / "best.pt")
    assert trainer._figures is None and all(child.poll() is not None for child in children)


def test_the_final_validations_image_grids_get_the_images_they_show_and_are_stocks(tmp_path):
    """Within final_figures a validator's plot_images gets the first max_subplots images of its batch (not all 20
    here): the same grid, byte for byte; the caller's batch is left as it was; outside it, the whole batch."""
    import torch
    from ultralytics.models.yolo.detect import val as detect_val

    from yolofeed.ultralytics_seam import final_figures

    gen = torch.Generator().manual_seed(0)
    n, boxes = 20, 60
    batch = {"img": torch.rand(n, 3, 64, 64, generator=gen), "batch_idx": torch.randint(0, n, (boxes,), generator=gen),
             "cls": torch.randint(0, 3, (boxes, 1), generator=gen).float(),
             "bboxes": torch.rand(boxes, 4, generator=gen) * 0.5 + 0.25, "im_file": [f"im{i}.jpg" for i in range(n)]}
    names = {0: "a", 1: "b", 2: "c"}
    shown = []

    def grid(fname, **kw):
        labels = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        detect_val.plot_images(labels=labels, paths=batch["im_file"], fname=tmp_path / fname, names=names,
                               on_plot=lambda *a: shown.append(a), **kw).join()
        return labels

    stock = grid("stock.jpg")
    with final_figures(None):
        ours = grid("ours.jpg")
        assert getattr(detect_val.plot_images, "_yolofeed_routed", False)  # the stand-in, by the validator's name
        grid("ours_9.jpg", max_subplots=9)
    grid("stock_9.jpg", max_subplots=9)
    assert (tmp_path / "ours.jpg").read_bytes() == (tmp_path / "stock.jpg").read_bytes()
    assert (tmp_path / "ours_9.jpg").read_bytes() == (tmp_path / "stock_9.jpg").read_bytes()
    assert ours["img"].shape[0] == n == stock["img"].shape[0]  # the caller's batch keeps its images
    assert len(shown) == 4


def _train_batch(kind: str, n: int = 20, size: int = 64) -> dict:
    """A batch of ``n`` images as the trainers plot it: boxes, with each image's masks overlapped in one (a
    segmentation's ``overlap_mask``) or keypoints (a pose's)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 4, (n,), generator=gen)
    batch_idx = torch.repeat_interleave(torch.arange(n), counts).float()
    m = batch_idx.numel()
    batch = {"img": torch.randint(0, 256, (n, 3, size, size), generator=gen, dtype=torch.uint8).float() / 255,
             "batch_idx": batch_idx, "cls": torch.randint(0, 3, (m, 1), generator=gen).float(),
             "bboxes": torch.rand(m, 4, generator=gen) * 0.4 + 0.3, "im_file": [f"im{i}.jpg" for i in range(n)]}
    if kind == "masks":  # one mask image a batch image, its instances numbered 1..k
        masks = torch.zeros(n, size // 4, size // 4)
        for i, k in enumerate(counts.tolist()):
            for j in range(k):
                y, x = torch.randint(0, size // 4 - 6, (2,), generator=gen).tolist()
                masks[i, y:y + 6, x:x + 6] = j + 1
        batch["masks"] = masks
    if kind == "keypoints":
        keypoints = torch.rand(m, 17, 3, generator=gen)
        keypoints[..., 2] = (keypoints[..., 2] > 0.3).float()
        batch["keypoints"] = keypoints
    return batch


@pytest.mark.parametrize("kind", ["boxes", "masks", "keypoints"])
def test_the_train_batch_grid_is_drawn_from_the_images_it_shows_and_is_stocks(kind, tmp_path, monkeypatch):
    """The trainer hands Ultralytics' plot_training_samples the first images its grid shows (16 of 20 here): the same
    train_batch jpg, byte for byte, for a float32 image and a float16 one (stock's float32 image again), its boxes,
    masks and keypoints picked by image index; the trainer's batch keeps its 20 images."""
    import torch
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.models.yolo.detect import train as detect_train

    from yolofeed.train.step import SyncFreeStep
    from yolofeed.ultralytics_seam import scaled_input, train_grid_shown
    from yolofeed.ultralytics_seam.source import threaded_function

    class Trainer(SyncFreeStep, DetectionTrainer):
        pass

    batch, drawn = _train_batch(kind), []
    n = batch["img"].shape[0]
    grid = threaded_function(detect_train.plot_images)

    @functools.wraps(grid)  # its signature, max_subplots' default among it
    def at_once(**kw):  # not in a thread: the files can be compared once it returns
        drawn.append(kw["labels"]["img"].shape[0])
        return grid(**kw)

    monkeypatch.setattr(detect_train, "plot_images", at_once)

    def plot(trainer_class, folder, img):
        t = object.__new__(trainer_class)
        t.save_dir, t.on_plot = tmp_path / folder, None
        t.save_dir.mkdir()
        mine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in {**batch, "img": img}.items()}
        trainer_class.plot_training_samples(t, mine, 0)
        assert mine["img"].shape[0] == n  # the caller's batch keeps its images
        return (t.save_dir / "train_batch0.jpg").read_bytes()

    stock = plot(DetectionTrainer, "stock", batch["img"])
    assert plot(Trainer, "ours", batch["img"]) == stock
    half = scaled_input((batch["img"] * 255).round().to(torch.uint8), torch.float16)
    assert plot(Trainer, "ours_half", half) == stock
    assert train_grid_shown() == 16 and drawn == [n, 16, 16]


def test_the_image_grids_stand_in_slices_only_in_the_routed_thread():
    import torch

    from yolofeed.ultralytics_seam import figures, final_figures

    seen = []

    def without_subplots(images=None):
        seen.append(images.shape[0])

    assert figures._grid_stand_in(without_subplots) is without_subplots  # drawn as that release draws it

    def with_subplots(images=None, max_subplots: int = 16):
        seen.append(images.shape[0])

    routed, images = figures._grid_stand_in(with_subplots), torch.zeros(40, 3, 8, 8)
    routed(images=images)
    with final_figures(None):
        routed(images=images)
        routed(images=images, max_subplots=4)
        other = threading.Thread(target=lambda: routed(images=images))
        other.start(), other.join()
    assert seen == [40, 16, 4, 40]


@pytest.mark.slow
def test_a_run_that_stops_in_its_last_epoch_leaves_no_figure_child(synth_root, tmp_path, monkeypatch):
    import psutil
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer
    from yolofeed.train.plots import FigureDrawers

    monkeypatch.setattr(FigureDrawers, "count", staticmethod(lambda: 2))
    started = []

    def stop(trainer):
        started.append([c.pid for c in trainer._figures._children])  # started as the last epoch started
        raise RuntimeError("stopped in the last epoch")

    model = YOLO("yolo11n.yaml")
    model.add_callback("on_train_epoch_end", stop)
    with pytest.raises(RuntimeError, match="stopped in the last epoch"):
        model.train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"), project=str(tmp_path),
                    name="stopped", plots=True, **TINY)
    assert len(started) == 1 and len(started[0]) == 2
    assert not [pid for pid in started[0] if psutil.pid_exists(pid)]  # ended and reaped


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="Linux's parent-death signal")
def test_a_stopped_child_dies_with_a_parent_killed_alone(tmp_path):
    """A figure child or results.png's, stopped (SIGSTOP), reads no end of its stdin: with the parent killed alone
    (SIGKILL) it stayed, stopped, reparented, holding its memory. Each now dies with its parent."""
    import signal
    import subprocess
    import sys

    (tmp_path / "results.csv").write_text("epoch,time\n1,1\n")
    script = (f"import sys, time; sys.path.insert(0, {str(Path(__file__).parents[1] / 'src')!r})\n"
              "from yolofeed.train.plots import FigureDrawers, ResultsPlot\n"
              "d = FigureDrawers(2)\n"
              f"r = ResultsPlot({str(tmp_path / 'results.csv')!r})\n"
              "print(*[c.pid for c in d._children], r._child.pid, flush=True)\n"
              "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    children = [int(p) for p in parent.stdout.readline().split()]
    assert len(children) == 3
    def ready(pid: int) -> bool:  # past its first lines (ctypes loaded, the signal asked for), or gone already
        try:
            return "_ctypes" in Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return True

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(ready(pid) for pid in children):
        time.sleep(0.05)
    time.sleep(0.2)

    def gone(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except OSError:
            return True

    try:
        for pid in children:
            os.kill(pid, signal.SIGSTOP)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 20
        while not all(gone(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(gone(pid) for pid in children), [Path(f"/proc/{p}/stat").read_text() for p in children
                                                   if not gone(p)]
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
