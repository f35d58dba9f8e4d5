"""Validation in a thread of its own (train/validation.py): the worker runs what it is given in order and hands back
results and exceptions; the set-up passes run each model at each shape and give up with one line; and a training run
validates there, every epoch and at the end, with Ultralytics' files."""

from __future__ import annotations

import csv
import functools
import logging
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from helpers import WhenWaiting
from yolofeed.train.validation import ValidationThread, loader_shapes, warm

TINY = dict(epochs=2, imgsz=64, batch=8, workers=0, plots=False, verbose=False, exist_ok=True)


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_teardown_waits_for_the_validation_is_acted_on_once_it_ended(monkeypatch, signum):
    """A run's teardown waits for its validation thread to stop at its next batch; a Ctrl-C (or a SIGTERM, ending the
    process as Ctrl-C under ``sigterm_exits``: the bench's modes) meanwhile used to end the wait, and the interpreter
    exited with the worker inside torch: the process aborted (exit 134). Now it is raised once the worker ended."""
    import os
    import signal
    import time

    from yolofeed import FastDetectionTrainer
    from yolofeed.processes import sigterm_exits
    from yolofeed.train.trainer import FastTrainer

    mro = FastDetectionTrainer.__mro__
    loop = next(c for c in mro[mro.index(FastTrainer) + 1:] if "_do_train" in vars(c))
    monkeypatch.setattr(loop, "_do_train", lambda self: "the loop ended")  # the teardown follows
    t = FastDetectionTrainer.__new__(FastDetectionTrainer)
    t._validations, t._overlapped, t._holding, t._final_warm, t._results_plot = (
        ValidationThread(torch.device("cpu")), None, False, None, None)
    worker, batch, finished = t._validations, threading.Event(), []
    worker.submit(lambda: (batch.wait(10), time.sleep(0.2), finished.append(True)))  # a batch ending after the signal
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises KeyboardInterrupt
    sig = getattr(signal, signum)
    watcher = WhenWaiting("_stop_validations", lambda: (os.kill(os.getpid(), sig), batch.set()))
    try:
        with sigterm_exits(), pytest.raises((KeyboardInterrupt, SystemExit)) as raised:
            t._do_train()
    finally:
        signal.signal(signal.SIGINT, previous)
        batch.set()
        watcher.join()
    assert not watcher.missed and finished == [True] and worker._worker.ended.is_set() and t._validations is None
    assert issubclass(raised.type, KeyboardInterrupt if signum == "SIGINT" else SystemExit)
    assert signum == "SIGINT" or raised.value.code == 143
    done = ValidationThread(torch.device("cpu"))
    assert done.close(wait=10) is True


def test_the_thread_runs_jobs_in_order_and_hands_back_results_and_exceptions():
    worker = ValidationThread(torch.device("cpu"))
    order, gate = [], threading.Event()
    first = worker.submit(lambda: (gate.wait(5), order.append("first")))
    assert not first.done()  # submit does not wait
    gate.set()
    assert worker.run(lambda: order.append("second") or threading.current_thread().name) == "yolofeed-validation"
    assert order == ["first", "second"] and first.done()  # run waits behind what was queued
    with pytest.raises(ZeroDivisionError):
        worker.run(lambda: 1 / 0)
    assert worker.alive  # an exception ends the job, not the worker
    worker.close()
    worker._worker.thread.join(5)
    assert not worker.alive
    with pytest.raises(RuntimeError, match="validation thread has stopped"):
        worker.submit(print)


class _Shapes(nn.Module):
    """Records the shape and dtype of each input; fails from the ``fail_at``-th call."""

    def __init__(self, fail_at: int | None = None):
        super().__init__()
        self.seen, self.fail_at = [], fail_at

    def forward(self, x):
        if self.fail_at is not None and len(self.seen) >= self.fail_at:
            raise RuntimeError("CUDA error: an illegal memory access\nmore")
        self.seen.append((tuple(x.shape), x.dtype, torch.is_grad_enabled()))
        return x


def test_warm_runs_each_model_at_each_shape_and_the_batch_1_warm_up_first():
    epoch, final = _Shapes(), _Shapes()
    models = [(epoch, None, torch.float32, False), (final, None, torch.float16, True)]
    lines = []
    shapes = [(16, 64, 96), (7, 96, 64)]
    assert warm(models, shapes, 96, torch.device("cpu"), 1e9, log=lines.append) == 5
    assert epoch.seen == [((16, 3, 64, 96), torch.float32, False), ((7, 3, 96, 64), torch.float32, False)]
    assert [s for s, _, _ in final.seen] == [(1, 3, 96, 96), (16, 3, 64, 96), (7, 3, 96, 64)]
    assert {d for _, d, _ in final.seen} == {torch.float16}
    assert models == []  # the copies are let go at once
    assert len(lines) == 1 and "5 batch shapes" in lines[0]


def test_warm_gives_up_at_a_failure_with_one_line():
    model = _Shapes(fail_at=1)
    models = [(model, None, torch.float32, False)]
    lines = []
    assert warm(models, [(4, 32, 32), (2, 32, 32)], 32, torch.device("cpu"), 1e9, log=lines.append) == 1
    assert len(lines) == 1 and "RuntimeError: CUDA error: an illegal memory access" in lines[0]
    assert "more" not in lines[0] and "after 1 batch shapes" in lines[0] and models == []


def _flops_inputs(monkeypatch, module):
    """What ``module``'s ``get_flops`` is handed, each call: the model's first parameter's dtype, whether every
    convolution's weight is in NCHW order, whether it is fused, its modules' types, imgsz, and what it counted."""
    seen, count = [], module.get_flops

    def recording(model, imgsz=640):
        convs = [m.weight for m in model.modules() if isinstance(m, nn.Conv2d)]
        n = count(model, imgsz)
        seen.append((next(model.parameters()).dtype, all(w.is_contiguous() for w in convs), model.is_fused(),
                     [type(m).__name__ for m in model.modules()], imgsz, n))
        return n

    monkeypatch.setattr(module, "get_flops", recording)
    return seen


def test_best_pts_flops_count_ahead_is_the_one_its_load_makes(tmp_path, monkeypatch):
    """``count_flops_as_loaded`` hands Ultralytics' ``get_flops`` the model its final validation's load of best.pt
    hands it (``AutoBackend``: the checkpoint loaded in float32, fused, counted at imgsz 640): the same dtype, layout,
    modules and count, from the half, channels-last final model yolofeed's set-up holds, which is left as it was."""
    import copy

    import ultralytics.utils.torch_utils as torch_utils
    from ultralytics.nn.autobackend import AutoBackend
    from ultralytics.nn.tasks import DetectionModel

    import yolofeed.ultralytics_seam.state as state

    model = DetectionModel("yolo11n.yaml", nc=3, verbose=False)
    torch.save({"model": None, "ema": copy.deepcopy(model).half(), "train_args": {}}, tmp_path / "best.pt")
    loads = _flops_inputs(monkeypatch, torch_utils)
    AutoBackend(model=str(tmp_path / "best.pt"), device=torch.device("cpu"), fp16=False, fuse=True)
    ours = _flops_inputs(monkeypatch, state)
    final = AutoBackend(model=copy.deepcopy(model), device=torch.device("cpu"), fp16=True, fuse=True,
                        channels_last=True, verbose=False)
    final.model.half()  # as AutoBackend leaves it on CUDA with amp (on the CPU it keeps float32)
    before = {k: (v.dtype, v.stride()) for k, v in final.model.state_dict().items()}
    assert state.count_flops_as_loaded(final, torch.device("cpu"))
    assert len(loads) == 1 and ours == loads and loads[0][0] == torch.float32 and loads[0][1] and loads[0][4] == 640
    assert loads[0][5] > 0
    assert {k: (v.dtype, v.stride()) for k, v in final.model.state_dict().items()} == before
    monkeypatch.setattr(state, "get_flops", lambda model, imgsz=640: 0.0)  # its failure (or no thop): not counted
    assert not state.count_flops_as_loaded(final, torch.device("cpu"))


def test_the_flops_count_ahead_lets_its_model_go_and_gives_up_with_one_line(monkeypatch):
    """``count_flops_ahead`` runs the count once, not once the run stopped; a failure is one line, not the run's
    end; its model is let go in every case."""
    import yolofeed.train.validation as validation

    counted = []
    monkeypatch.setattr(validation, "count_flops_as_loaded", lambda model, device: counted.append(model) or True)
    final, lines = ["best.pt's"], []
    assert validation.count_flops_ahead(final, torch.device("cpu"), log=lines.append)
    assert counted == ["best.pt's"] and final == [] and "FLOPs count made ahead" in lines[0]
    stopped = threading.Event()
    stopped.set()
    final = ["best.pt's"]
    assert not validation.count_flops_ahead(final, torch.device("cpu"), cancelled=stopped) and final == []
    assert counted == ["best.pt's"]

    def fails(model, device):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")

    monkeypatch.setattr(validation, "count_flops_as_loaded", fails)
    final, lines = ["best.pt's"], []
    assert not validation.count_flops_ahead(final, torch.device("cpu"), log=lines.append) and final == []
    assert len(lines) == 1 and "CUDA out of memory" in lines[0] and "the final validation makes it" in lines[0]


def test_loader_shapes_are_the_distinct_batch_shapes_in_order():
    loader = SimpleNamespace(batches=[[0, 1, 2], [3, 4, 5], [6, 7], [8]],
                             shapes=torch.tensor([[64, 96], [64, 96], [96, 64], [96, 64]]))
    assert loader_shapes(loader) == [(3, 64, 96), (2, 96, 64), (1, 96, 64)]
    assert loader_shapes(SimpleNamespace()) == []  # a loader that does not say


def test_validate_beside_is_an_option_on_by_default_and_only_on_one_cuda_gpu():
    from yolofeed import FastDetectionTrainer
    from yolofeed.errors import ConfigError
    from yolofeed.train import options

    assert "validate_beside" in options.OPTIONS and FastDetectionTrainer.validate_beside is True
    on = FastDetectionTrainer
    trainer = on.__new__(on)
    trainer.device = torch.device("cpu")
    assert not trainer._validates_beside()  # the CPU has no cuDNN set-up to pay ahead
    trainer.device = torch.device("cuda", 0)
    assert trainer._validates_beside()
    off = FastDetectionTrainer.with_options(validate_beside=False)
    trainer = off.__new__(off)
    trainer.device = torch.device("cuda", 0)
    assert not trainer._validates_beside()
    with pytest.raises(ConfigError, match="validate_beside='yes'"):
        FastDetectionTrainer.with_options(validate_beside="yes")


def test_best_pts_set_up_goes_a_shape_behind_each_validation_and_what_is_left_before_the_final(monkeypatch):
    """Queued with every epoch's model's, best.pt's passes would hold the first validation back, and all at once behind
    it they outlast the next epoch: one part behind each validation (its batch-1 warm-up, then each shape); what is
    left goes just before the final validation, which, where it is the first (val=False), finds them all done."""
    from types import SimpleNamespace

    import yolofeed.train.validating as tr
    from yolofeed import FastDetectionTrainer

    order = []
    a, b = (2, 32, 32), (1, 32, 32)
    monkeypatch.setattr(tr, "validation_models", lambda t: (("every epoch's", None, torch.float32, False),
                                                            ("best.pt's", None, torch.float16, True)))
    monkeypatch.setattr(tr, "validation_loader", lambda t: None)
    monkeypatch.setattr(tr, "loader_shapes", lambda loader: [a, b])
    monkeypatch.setattr(tr, "warm", lambda models, shapes, *rest, **kw: order.append((models[0][0], tuple(shapes),
                                                                                       models[0][3])))
    monkeypatch.setattr(tr, "count_flops_ahead", lambda final, device, **kw: order.append((final[0], "FLOPs")))

    def trainer():
        t = FastDetectionTrainer.__new__(FastDetectionTrainer)
        t.device, t.args = torch.device("cpu"), SimpleNamespace(batch=2, imgsz=32)
        t._validations, t._warm_validations_after = tr.ValidationThread(t.device), 1
        t.model = torch.nn.Module()
        t._count_to_validation_warm_up()  # the captures made: the set-up is queued
        return t

    every, one, first, second = ("every epoch's", (a, b), False), ("best.pt's", (), True), ("best.pt's", (a,), False), \
        ("best.pt's", (b,), False)
    flops = ("best.pt's", "FLOPs")  # its load's count, as the final validation meets it: before its passes
    t = trainer()
    for name in ("epoch 1", "epoch 2", "epoch 3", "epoch 4", "epoch 5", "final"):
        t._in_validation_thread(order.append, name, final=name == "final")
    assert order == [every, "epoch 1", flops, "epoch 2", one, "epoch 3", first, "epoch 4", second, "epoch 5", "final"]
    order.clear()
    t = trainer()
    for name in ("epoch 1", "final"):
        t._in_validation_thread(order.append, name, final=name == "final")
    assert order == [every, "epoch 1", flops, one, first, second, "final"]
    order.clear()
    trainer()._in_validation_thread(order.append, "final", final=True)
    assert order == [every, flops, one, first, second, "final"]
    order.clear()  # a release whose load counts best.pt's FLOPs on the CPU (8.4.138-141): no count ahead
    monkeypatch.setattr(tr, "flops_counted_on_device", lambda: False)
    trainer()._in_validation_thread(order.append, "final", final=True)
    assert order == [every, one, first, second, "final"]


def _train_beside(synth_root, runs, name, device, **kw):
    """A tiny run whose validations go through the validation thread (on the CPU too, where the option alone would
    keep them in the training thread), recording the thread each validation ran in."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    class Beside(FastDetectionTrainer.with_options(validate_beside=True)):
        def _validates_beside(self):
            return True

    threads = []
    model = YOLO("yolo11n.yaml")
    model.add_callback("on_val_start", lambda v: threads.append(threading.current_thread().name))
    model.train(trainer=Beside, data=str(synth_root / "data.yaml"), project=str(runs), name=name, device=device,
                **{**TINY, **kw})
    return model, threads


@pytest.mark.slow
def test_a_run_validates_in_the_thread_every_epoch_and_at_the_end(synth_root, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    model, threads = _train_beside(synth_root, tmp_path, "beside", "cpu")
    assert threads == ["yolofeed-validation"] * 3  # two epochs, then best.pt at the end
    assert "cuDNN set up for the validations'" in caplog.text  # the set-up passes ran, before the first validation
    with open(tmp_path / "beside" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    key = next(k for k in rows[0] if "mAP50-95" in k)
    assert len(rows) == 2 and all(0.0 <= float(r[key]) <= 1.0 for r in rows)
    assert model.trainer._validations is None  # closed with the run


@pytest.mark.slow
def test_a_validation_that_fails_in_the_thread_fails_the_run_there(synth_root, tmp_path, monkeypatch):
    from yolofeed.ultralytics_seam import DetectionTrainer

    def broken(self):
        raise OSError(f"disk gone (in {threading.current_thread().name})")

    monkeypatch.setattr(DetectionTrainer, "validate", broken)
    with pytest.raises(OSError, match=r"disk gone \(in yolofeed-validation\)"):
        _train_beside(synth_root, tmp_path, "fails", "cpu", epochs=1)


@pytest.mark.gpu
def test_on_a_gpu_the_set_up_runs_beside_the_first_epoch_and_the_step_still_graphs(synth_root, tmp_path, caplog):
    """The set-up passes start after the step's captures (a capture in global mode fails where another thread
    allocates): the graphed step and FastMuSGD still replay graphs, and every validation ran in the thread."""
    caplog.set_level(logging.INFO)
    model, threads = _train_beside(synth_root, tmp_path, "gpu", 0, optimizer="MuSGD", nbs=8)  # no accumulation
    assert threads == ["yolofeed-validation"] * 3
    assert "replay as CUDA graphs" in caplog.text and "could not be" not in caplog.text
    assert "cuDNN set up for the validations'" in caplog.text


def test_a_validation_the_training_stopped_waiting_for_stops_at_its_next_batch_and_nothing_queued_runs(monkeypatch):
    """Ctrl-C in the training thread while it waits for a validation: the validation stops at its next batch (the
    validator's ``on_val_batch_start``), best.pt's set-up queued behind it is skipped, and a later waiter is told
    (``CancelledError``), not left waiting."""
    import time
    from collections import defaultdict
    from concurrent.futures import CancelledError
    from types import SimpleNamespace

    import yolofeed.train.validating as tr
    from yolofeed import FastDetectionTrainer

    ran, second = [], threading.Event()
    monkeypatch.setattr(tr, "warm", lambda *a, **k: ran.append("best.pt's set-up"))
    t = FastDetectionTrainer.__new__(FastDetectionTrainer)
    callbacks = defaultdict(list)
    t.validator = SimpleNamespace(callbacks=callbacks, add_callback=lambda e, f: callbacks[e].append(f))
    t._validations, t._warm_validations_after = ValidationThread(torch.device("cpu")), None
    t._final_warm = [functools.partial(tr.warm, [("best.pt", None, torch.float16, True)], [], 32, torch.device("cpu"),
                                       1.0)]
    submit = t._validations.submit

    class Interrupted:  # the training thread's wait, ended by Ctrl-C once the validation is in its second batch
        def __init__(self, future):
            self.future = future

        def result(self, timeout=None):
            assert second.wait(5)
            raise KeyboardInterrupt

    monkeypatch.setattr(t._validations, "submit", lambda fn, *a, **k: Interrupted(submit(fn, *a, **k))
                        if fn is validation else submit(fn, *a, **k))

    def validation():
        for batch in range(50):
            for f in callbacks["on_val_batch_start"]:
                f(t.validator)
            ran.append(batch)
            if batch == 1:
                second.set()
            time.sleep(0.02)

    with pytest.raises(KeyboardInterrupt):
        t._in_validation_thread(validation)
    with pytest.raises(CancelledError):
        submit(ran.append, "after").result(5)
    assert 2 <= len(ran) < 10 and "best.pt's set-up" not in ran and "after" not in ran, ran
    t._validations.check_cancelled()  # in another thread than the worker's: nothing raised


def test_the_set_up_passes_stop_once_the_run_stopped():
    """A run stopped by an error or Ctrl-C cancels what its validation thread runs: the set-up passes stop between
    shapes, so the run's exit does not wait for them."""
    model = _Shapes()
    cancelled = threading.Event()
    cancelled.set()
    lines = []
    assert warm([(model, None, torch.float32, False)], [(4, 32, 32)], 32, torch.device("cpu"), 1e9, log=lines.append,
                cancelled=cancelled) == 0
    assert model.seen == [] and lines == []


def test_the_set_up_passes_wait_for_the_short_batches_set_up_however_it_ends():
    """cuDNN builds one plan at a time, whichever thread asks, and the first epoch's last batch waits for the short
    batches' set-up: the validations' passes start once that job ends (done, failed or skipped), and a run stopped
    meanwhile runs none."""
    from concurrent.futures import Future

    def warm_after(model, after, ran, **kw):
        return threading.Thread(target=lambda: ran.append(warm([(model, None, torch.float32, False)], [(4, 32, 32)],
                                                               32, torch.device("cpu"), 1e9, log=lambda s: None,
                                                               after=after, **kw)))

    for end in (lambda f: f.set_result(None), lambda f: f.set_exception(RuntimeError("cuDNN")), Future.cancel):
        model, after = _Shapes(), Future()
        ran = []
        passes = warm_after(model, after, ran)
        passes.start()
        time.sleep(0.3)
        assert model.seen == [] and ran == []  # waiting
        end(after)
        passes.join(10)
        assert ran == [1] and model.seen
    model, after, cancelled = _Shapes(), Future(), threading.Event()
    passes = warm_after(model, after, ran, cancelled=cancelled)
    passes.start()
    cancelled.set()
    passes.join(10)
    assert not passes.is_alive() and ran[-1] == 0 and model.seen == []


def test_the_trainer_queues_the_validations_set_up_behind_the_short_batches(monkeypatch):
    """``_warm_validations`` hands ``warm`` the short batches' set-up to wait for, where the model has that thread."""
    from concurrent.futures import Future

    import yolofeed.train.validating as tr
    from yolofeed import FastDetectionTrainer

    afters = []
    monkeypatch.setattr(tr, "validation_models", lambda t: (("every", None, torch.float32, False),
                                                            ("best", None, torch.float16, True)))
    monkeypatch.setattr(tr, "validation_loader", lambda t: None)
    monkeypatch.setattr(tr, "loader_shapes", lambda loader: [(2, 32, 32)])
    monkeypatch.setattr(tr, "warm", lambda *a, after=None, **kw: afters.append(after))
    set_up = Future()
    for short, want in ((SimpleNamespace(set_up=set_up), set_up), (None, None)):
        t = FastDetectionTrainer.__new__(FastDetectionTrainer)
        t.device, t.args, t.model = torch.device("cpu"), SimpleNamespace(batch=2, imgsz=32), torch.nn.Module()
        if short is not None:
            t.model.__dict__["_short"] = short
        t._validations = tr.ValidationThread(t.device)
        t._warm_validations()
        t._validations.close(5)
        assert afters.pop() is want


def test_a_stopped_run_says_which_validation_did_not_end(caplog):
    """``_stop_validations`` cancels the thread, waits for it and names the epoch whose validation beside the training
    did not end; nothing the second time."""
    from concurrent.futures import Future

    from yolofeed.train import overlap
    from yolofeed.train.trainer import FastTrainer
    from yolofeed.train.validating import CLOSE_WAIT_S

    calls = []
    threads = SimpleNamespace(cancel=lambda: calls.append("cancel"), close=lambda wait: calls.append(("close", wait)))
    job = overlap.Overlapped(snapshot=SimpleNamespace(epoch=2), header="", future=Future())
    trainer = SimpleNamespace(_overlapped=job, _holding=True, _validations=threads, _final_warm=None)
    with caplog.at_level(logging.WARNING):
        FastTrainer._stop_validations(trainer, finished=False)
    assert calls == ["cancel", ("close", CLOSE_WAIT_S)] and trainer._validations is None and trainer._overlapped is None
    assert "epoch 3's validation, run beside the training, did not end" in caplog.text
    caplog.clear()
    FastTrainer._stop_validations(trainer, finished=False)
    assert calls == ["cancel", ("close", CLOSE_WAIT_S)] and caplog.text == ""  # nothing the second time
    ended = Future()  # it ended, and the run stopped before the next epoch's end, where its row is written
    ended.set_result({})
    trainer._overlapped = overlap.Overlapped(snapshot=SimpleNamespace(epoch=2), header="", future=ended)
    with caplog.at_level(logging.WARNING):
        FastTrainer._stop_validations(trainer, finished=False)
    assert ("epoch 3's validation, run beside the training, ended, but the run stopped before epoch 4's end, where "
            "it is written: its results.csv row and checkpoints are not written") in caplog.text
