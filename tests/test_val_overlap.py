"""An epoch's validation beside the next epoch's training (``val_overlap``, train/overlap.py): the same rows,
checkpoints, callbacks and early stopping as validations waited for, only later; the epochs it must not overlap are
validated in place; a run stopped meanwhile says what was not written and resumes."""

from __future__ import annotations

import csv
import logging
import math
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from yolofeed import ultralytics_seam as seam
from yolofeed.train import options, overlap
from yolofeed.ultralytics_seam import beside as seam_beside

TINY = dict(imgsz=64, batch=8, workers=0, plots=False, verbose=False, exist_ok=True, seed=0)


# -- the rules, on stand-ins -----------------------------------------------------------------------------------------
def _trainer(epoch=1, epochs=5, possible_stop=False, stop=False, best_epoch=0, patience=100, time=None, loss=1.0,
             ema_value=0.5, val_overlap=None, callbacks=None, nan_fitness_epoch=None):
    ema = SimpleNamespace(ema=torch.nn.Linear(2, 2), updates=7)
    with torch.no_grad():
        ema.ema.weight.fill_(ema_value)
    return SimpleNamespace(epoch=epoch, epochs=epochs, stop=stop, args=SimpleNamespace(time=time),
                           val_overlap=val_overlap, _nan_fitness_epoch=nan_fitness_epoch,
                           callbacks={"on_fit_epoch_end": list(callbacks or [])},
                           stopper=SimpleNamespace(possible_stop=possible_stop, best_epoch=best_epoch,
                                                   patience=patience),
                           device=torch.device("cpu"), ema=ema, loss=torch.tensor([loss]), tloss=torch.tensor([1.0]),
                           loss_items={"box": torch.ones(1)}, lr={"lr/pg0": 0.01})


def _logger(trainer):
    pass


@pytest.mark.parametrize("case, expected", [
    ({}, None),
    ({"epoch": 4}, "the last epoch"),
    ({"possible_stop": True}, "early stopping may stop the run after it"),
    ({"stop": True}, "early stopping may stop the run after it"),
    # val_period: the epochs since the best reach patience between two validations (possible_stop cannot see it)
    ({"epoch": 3, "best_epoch": 1, "patience": 3}, "early stopping may stop the run after it"),
    ({"epoch": 2, "best_epoch": 1, "patience": 3}, None),
    ({"time": 0.5}, "time= counts the epochs from their times"),
    ({"loss": float("nan")}, "the loss or the EMA is not finite"),
    ({"ema_value": float("inf")}, "the loss or the EMA is not finite"),
    ({"nan_fitness_epoch": 1, "val_overlap": True},
     "epoch 1's fitness was not a number: Ultralytics' NaN recovery runs in place"),
    # by default, none whose end a callback reads as it ends (a logger's, a user's); with val_overlap=True, late
    ({"callbacks": [_logger]}, "test_val_overlap._logger reads each epoch as it ends; val_overlap=True runs such "
                               "callbacks an epoch late"),
    ({"callbacks": [_logger], "val_overlap": True}, None),
    ({"callbacks": [overlap.reason_not]}, None),  # yolofeed's own
])
def test_an_epoch_is_overlapped_only_where_that_changes_nothing_but_when(case, expected):
    assert overlap.reason_not(_trainer(**case), largest_batch=16, per_image=0.0) == expected


def _finite_cases(device: str):
    g = torch.Generator().manual_seed(0)
    for case in range(60):
        tensors = [torch.randn(int(n), generator=g).to(device, dtype) for n, dtype in zip(
            torch.randint(0, 50, (5,), generator=g),
            (torch.float32, torch.float16, torch.bfloat16, torch.float32, torch.float32))]
        tensors.append(torch.tensor(float(case), device=device))  # a 0-d loss
        # finite values whose L2 norm overflows their dtype (found by a reviewer: they read as not finite)
        tensors += [torch.full((4,), 60000.0, device=device, dtype=torch.float16),
                    torch.full((2,), 1e30, device=device, dtype=torch.bfloat16),
                    torch.full((2,), 1e200, device=device, dtype=torch.float64)]
        if case % 3:  # one value of one tensor made NaN or infinite
            t = tensors[case % len(tensors)]
            if t.numel():
                t.view(-1)[case % t.numel()] = (float("nan"), float("inf"), -float("inf"))[case % 3 - 1 + (case % 2)]
        yield tensors


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_finite_check_in_one_pass_agrees_with_each_tensors_own(device):
    """``all_finite`` (one multi-tensor norm pass, one sync) against the check a tensor it replaces, on float32,
    float16 and bfloat16 tensors, empty ones and a 0-d loss, with a NaN or an infinity planted in two cases of three."""
    outcomes = []
    for tensors in _finite_cases(device):
        expected = all(bool(t.isfinite().all()) for t in tensors)
        assert overlap.all_finite(tensors) is expected
        outcomes.append(expected)
    assert True in outcomes and False in outcomes


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_batched_copy_is_a_deepcopy_of_the_ema_and_the_optimisers_state(device):
    """``copied`` (the snapshot's EMA and the optimiser's kept state, a multi-tensor copy a dtype) holds what
    ``copy.deepcopy`` holds: every tensor's values, dtype, shape and strides (channels-last kept), parameters as
    parameters with their ``requires_grad``, the same sharing; storages of its own; a view that does not fill its
    storage copied by deepcopy, with its storage."""
    import copy

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).to(device)
    model = model.to(memory_format=torch.channels_last)
    model[0].bias.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 3, 8, 8, device=device)).sum().backward()
    optimizer.step()
    base = torch.arange(12.0, device=device)
    shared = {"view": base[2:5], "again": base[2:5], "whole": base}
    for obj in (model, optimizer.state_dict(), shared):
        expected, got = copy.deepcopy(obj), overlap.copied(obj)
        a = expected.state_dict(keep_vars=True) if isinstance(obj, torch.nn.Module) else expected
        b = got.state_dict(keep_vars=True) if isinstance(obj, torch.nn.Module) else got
        flat_a, flat_b = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
        assert len(flat_a) == len(flat_b)
        for x, y in zip(flat_a, flat_b):
            assert type(x) is type(y)
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y) and x.stride() == y.stride() and x.requires_grad == y.requires_grad
                assert y.storage_offset() == x.storage_offset()
            else:
                assert x == y
    copies = overlap.copied(model)
    w, w2 = model[0].weight, copies[0].weight
    assert w2.is_contiguous(memory_format=torch.channels_last) and w2.data_ptr() != w.data_ptr()
    again = overlap.copied(shared)
    assert again["view"].untyped_storage().data_ptr() == again["whole"].untyped_storage().data_ptr()
    # a buffer and a view of it held as a plain attribute; a tensor with a gradient (found by a reviewer: both lost)
    model.register_buffer("idx", torch.arange(4, device=device))
    model.head = model.idx[:2]
    leaf = torch.ones(2, device=device, requires_grad=True)
    leaf.grad = torch.full((2,), 7.0, device=device)
    twin, leaf2 = overlap.copied(model), overlap.copied([leaf])[0]
    assert twin.head.untyped_storage().data_ptr() == twin.idx.untyped_storage().data_ptr()
    assert leaf2.grad is not None and torch.equal(leaf2.grad, leaf.grad)


def test_an_epoch_is_not_overlapped_where_free_gpu_memory_would_not_hold_its_passes_and_copies(monkeypatch):
    trainer = _trainer()
    trainer.device = torch.device("cuda", 0)
    trainer.optimizer = SimpleNamespace(state={0: {"exp_avg": torch.zeros(100), "step": torch.tensor(3.0)}})
    kept = 2 * 2 * 4 + 2 * 4 + 100 * 4 + 4  # the EMA's weight and bias, the optimiser's state, in float32
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (16 * 1000 + kept - 1, 10**12))
    assert overlap.reason_not(trainer, largest_batch=16, per_image=1000) == \
        "too little free GPU memory beside the training"


def test_the_validator_sees_the_snapshot_and_the_rest_of_the_trainer():
    trainer = SimpleNamespace(**vars(_trainer(epoch=2)), data={"nc": 3}, amp=False)
    snapshot = overlap.Snapshot.of(trainer)
    trainer.epoch, trainer.tloss[0], trainer.loss_items["box"][0] = 3, 9.0, 9.0  # the next epoch trains on
    with torch.no_grad():
        trainer.ema.ema.weight.fill_(2.0)
    view = seam.validator_view(trainer, snapshot)
    assert view.epoch == 2 and view.stopper.possible_stop is False and view.data == {"nc": 3}
    assert view.ema.ema is snapshot.model and float(view.ema.ema.weight[0, 0].detach()) == 0.5 and view.ema.updates == 7
    assert float(view.loss_items["box"]) == 1.0 and float(view.tloss[0]) == 1.0


def test_a_thread_validating_beside_holds_what_it_logs_hides_its_bar_and_times_on_its_stream():
    from ultralytics.engine import validator as module

    held, seen = {}, {}

    def beside():
        with seam.validation_beside():
            seen["hidden"] = module.TQDM(range(3), total=3).disable
            seen["profile"] = type(module.Profile(device=torch.device("cpu")))
            f = overlap._Held()
            seam.LOGGER.addFilter(f)
            seam.LOGGER.warning("from the validation thread")
            seam.LOGGER.removeFilter(f)
            held["records"] = f.records

    t = threading.Thread(target=beside)
    t.start()
    t.join(10)
    assert seen["hidden"] is True and [r.getMessage() for r in held["records"]] == ["from the validation thread"]
    assert seen["profile"] is seam_beside._StreamProfile
    bar = module.TQDM(range(3), total=3, disable=False)  # this thread's bars and timers: as before
    assert bar.disable is False and type(module.Profile(device=None)) is seam_beside._STOCK_PROFILE
    bar.close()


def test_before_a_capture_the_training_waits_for_the_validation_beside_it_and_counts_the_wait():
    """A CUDA graph captured in the training thread beside a validation's CUDA calls is invalidated: the trainer's
    augmenter waits for the validation first (``settle``). Its metrics, or its exception, are still taken at the
    epoch's end, and the wait counts as waited for it."""
    from concurrent.futures import Future

    from yolofeed.train.validating import Validating
    from yolofeed.train.validation import ValidationThread

    threads = ValidationThread(torch.device("cpu"))
    ran = []
    job = overlap.Overlapped(snapshot=None, header="")
    job.future = threads.submit(lambda: (time.sleep(0.1), {"fitness": 1.0})[1])
    threads.submit(lambda: (time.sleep(0.1), ran.append("best.pt's set-up pass")))  # queued behind the validation
    Validating._settle_overlapped(SimpleNamespace(_overlapped=job, _validations=threads))
    assert job.future.done() and ran == ["best.pt's set-up pass"] and job.settled > 0
    metrics, waited = job.result()  # the settled seconds are the epoch's training time, not waited again
    assert metrics == {"fitness": 1.0} and waited < job.settled
    threads.close()
    failed = overlap.Overlapped(snapshot=None, header="")
    failed.future = Future()
    failed.future.set_exception(RuntimeError("validation failed"))
    failed.settle()  # the error is the epoch end's to raise, with what was not written (no validation thread here)
    with pytest.raises(RuntimeError, match="validation failed"):
        failed.result()
    Validating._settle_overlapped(SimpleNamespace(_overlapped=None))  # no validation beside: nothing to wait for


def test_the_seam_imported_again_after_a_validation_beside_wraps_ultralytics_own_bar_and_timer():
    """validation_beside leaves its wrappers in the validator module: a fresh import of the seam (a test that imports
    yolofeed afresh in a forked child) takes Ultralytics' originals from them, not the wrappers."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from ultralytics.engine import validator as module\n"
            "from ultralytics.utils import ops\n"
            "from yolofeed import ultralytics_seam as seam\n"
            "from yolofeed.ultralytics_seam import beside\n"
            "bar = module.TQDM\n"
            "with seam.validation_beside():\n"
            "    pass\n"
            "assert module.Profile is beside._validator_profile\n"
            "for m in [m for m in sys.modules if m.startswith('yolofeed')]:\n"
            "    del sys.modules[m]\n"
            "from yolofeed import ultralytics_seam as seam_again\n"
            "from yolofeed.ultralytics_seam import beside as again\n"
            "assert seam_again is not seam and again is not beside\n"
            "assert again._STOCK_PROFILE is ops.Profile and again._STOCK_BAR is bar\n"
            "assert issubclass(again._StreamProfile, ops.Profile)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_timer_of_a_validation_beside_syncs_its_stream_not_the_device(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: SimpleNamespace(
        synchronize=lambda: synced.append(("stream", device))))
    timer = seam_beside._StreamProfile(device=torch.device("cuda", 0))
    monkeypatch.setattr(timer, "accelerator", torch.cuda)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(("device", device)))
    with timer:
        pass
    assert synced == [("stream", torch.device("cuda", 0))] * 2 and timer.t >= 0


class _Stateful:
    """An optimiser or a scaler: ``state_dict`` a method of its class."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state


def test_an_epoch_ended_late_is_ended_as_the_loop_ends_it_with_its_own_state():
    """seam.end_epoch_late: fitness, row, stopper, checkpoint, callbacks in the loop's order, each seeing the epoch's
    state, which is put back after; the metrics, fitness and best fitness stay."""
    calls = []
    trainer = _trainer(epoch=5)
    trainer.best_fitness, trainer.metrics, trainer.fitness = 0.2, {}, None
    trainer.tloss, trainer.loss_items, trainer.lr, trainer.epoch_time = "tloss 5", "items 5", {"lr": 5}, 5.0
    trainer.train_time_start = 1000.0
    trainer.args.save = True
    trainer.optimizer, trainer.scaler = _Stateful("optimizer now"), _Stateful("scaler now")
    trainer.label_loss_items = lambda tloss: {"train": tloss}

    def record(what):
        return lambda *a: calls.append((what, trainer.epoch, *a)) or True

    trainer.save_metrics = lambda metrics: calls.append(("row", trainer.epoch, metrics,
                                                         round(100.0 - (trainer.train_time_start - 1000.0))))
    trainer.stopper = lambda epoch, fitness: calls.append(("stopper", epoch, fitness)) or False
    trainer.save_model = lambda: calls.append(("save", trainer.epoch, trainer.ema.ema, trainer.ema.updates,
                                               trainer.optimizer.state_dict(), trainer.scaler.state_dict())) or True
    trainer.run_callbacks = lambda event: calls.append((event, trainer.epoch, trainer.epoch_time, trainer.metrics))
    model = torch.nn.Linear(1, 1)
    snapshot = overlap.Snapshot(epoch=3, model=model, updates=3, tloss="tloss 3", loss=torch.tensor([0.0]),
                                loss_items="items 3", lr={"lr": 3}, epochs=5, epoch_time=3.0,
                                optimizer="optimizer 3", scaler="scaler 3")
    import time

    seam.end_epoch_late(trainer, snapshot, {"mAP": 0.5, "fitness": 0.4}, ended=time.time() - 100.0)
    assert calls == [
        ("row", 3, {"train": "tloss 3", "mAP": 0.5, "lr": 3}, 0),  # the time column: when the validation ended
        ("stopper", 4, 0.4),
        ("save", 3, model, 3, "optimizer 3", "scaler 3"),
        ("on_model_save", 3, 3.0, {"mAP": 0.5}),
        ("on_fit_epoch_end", 3, 3.0, {"mAP": 0.5}),
    ]
    assert trainer.epoch == 5 and trainer.tloss == "tloss 5" and trainer.epoch_time == 5.0
    assert trainer.train_time_start == 1000.0 and trainer.ema.updates == 7 and trainer.ema.ema is not model
    assert trainer.optimizer.state_dict() == "optimizer now" and trainer.scaler.state_dict() == "scaler now"
    assert trainer.fitness == 0.4 and trainer.best_fitness == 0.4 and trainer.metrics == {"mAP": 0.5}


def test_val_overlap_is_an_option_decided_by_the_run_by_default_recorded_for_a_resume(tmp_path):
    from yolofeed import FastDetectionTrainer
    from yolofeed.cli import build_config
    from yolofeed.errors import ConfigError
    from yolofeed.train import options

    assert "val_overlap" in options.OPTIONS and FastDetectionTrainer.val_overlap is None
    for value in (None, True, False):
        assert FastDetectionTrainer.with_options(val_overlap=value).val_overlap is value
        options.record(tmp_path, {"val_overlap": value})
        recorded = options.read(tmp_path / options.FILE)
        options.check(recorded, "yolofeed.yaml")
        assert recorded["val_overlap"] is value
    with pytest.raises(ConfigError, match=r"val_overlap='yes'.*or None"):
        FastDetectionTrainer.with_options(val_overlap="yes")
    with pytest.raises(ConfigError, match="warm_up=None: expected True or False$"):
        FastDetectionTrainer.with_options(warm_up=None)  # the other switches take no None
    assert build_config("train", ["val_overlap"]).val_overlap is True  # a bare word, as a bool key's
    assert build_config("train", ["val_overlap=None"]).val_overlap is None
    assert build_config("train", ["val_overlap=False"]).val_overlap is False
    with pytest.raises(ConfigError, match=r"val_overlap=auto: expected True, False or None \(the default\)"):
        build_config("train", ["val_overlap=auto"])


# -- whole runs, on the CPU through the validation thread --------------------------------------------------------------
class _Scripted:
    """A validator whose fitness is scripted by epoch (Ultralytics' own otherwise): early stopping gets something to
    stop on in runs too short to learn."""

    def __init__(self, validator, fitness, again=None):
        self._validator, self._fitness, self._again = validator, fitness, again

    def __getattr__(self, name):
        return getattr(self._validator, name)

    def __call__(self, trainer=None, **kwargs):
        metrics = self._validator(trainer, **kwargs)
        if self._again is not None and seam.validating_beside():  # once more, with the whole device idle first
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self._again.append((dict(metrics), self._validator(trainer, **kwargs)))
        if trainer is not None and self._fitness:
            metrics["fitness"] = self._fitness[trainer.epoch]
        return metrics


def _run(root, runs, name, overlapped, fitness=(), fail_at=None, options=None, callbacks=None, again=None,
         task="detect", **kw):
    """A tiny run validating in the validation thread (on the CPU too); what each checkpoint held as it was saved,
    each on_fit_epoch_end's epoch and metrics, and the rows. ``again``: each validation beside, run a second time
    once the device is idle, appends both metrics."""
    from ultralytics import YOLO

    from yolofeed.train.tasks import TRAINERS

    # "Trainer" in its name: Ultralytics adds its integration callbacks (Platform's, idle here) to a trainer class only
    class BesideTrainer(TRAINERS[task].with_options(validate_beside=True, val_overlap=overlapped, **(options or {}))):
        def _validates_beside(self):  # on the CPU too, where the option alone keeps validations in place
            return self.device.type == "cpu" or super()._validates_beside()

        def get_validator(self):
            return _Scripted(super().get_validator(), list(fitness), again)

    saved, ends = [], []

    def on_model_save(trainer):
        files = [trainer.last, trainer.best, trainer.wdir / f"epoch{trainer.epoch}.pt"]
        saved.append({"rows": _rows(trainer.csv), **{f.name: _held(f) for f in files if f.exists()}})

    def on_val_batch_start(validator):
        if fail_at is not None and validator.training and len(ends) + 1 == fail_at:
            raise KeyboardInterrupt

    model = YOLO({"detect": "yolo11n.yaml", "segment": "yolo11n-seg.yaml", "pose": "yolo11n-pose.yaml",
                  "obb": "yolo11n-obb.yaml"}[task])
    model.add_callback("on_model_save", on_model_save)
    model.add_callback("on_fit_epoch_end", lambda t: ends.append((t.epoch, dict(t.metrics))))
    model.add_callback("on_val_batch_start", on_val_batch_start)
    for event, fn in (callbacks or {}).items():
        model.add_callback(event, fn)
    model.train(trainer=BesideTrainer, data=str(root / "data.yaml"), project=str(runs), name=name,
                **{**TINY, "device": "cpu", **kw})
    return model, saved, ends, _rows(runs / name / "results.csv")


def _held(path):
    """What a checkpoint holds that a run writes (its date and arguments left out)."""
    ckpt = torch.load(path, weights_only=False)  # 8.4.138 saves no "stopper"
    return {"epoch": ckpt["epoch"], "best_fitness": ckpt["best_fitness"], "stopper": ckpt.get("stopper"),
            "updates": ckpt["updates"], "ema": ckpt["ema"].state_dict(), "optimizer": ckpt["optimizer"],
            "train_metrics": ckpt["train_metrics"], "scaler": ckpt["scaler"], "train_results": {
                k: v for k, v in ckpt["train_results"].items() if k != "time"}}


def _rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "time"} for r in csv.DictReader(f)]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.slow
def test_an_overlapped_run_writes_what_a_waited_one_writes(synth_root, tmp_path, caplog):
    """Every checkpoint as it was saved (EMA, optimiser, scaler, fitness, early stopping, the rows so far), every
    on_fit_epoch_end's epoch and metrics, and results.csv (but its time column) are the same; the overlapped epochs'
    lines are printed under one naming them."""
    caplog.set_level(logging.INFO)
    kw = dict(epochs=4, save_period=1, close_mosaic=2)  # epochN.pt every epoch; mosaic closes in epoch 3
    waited = _run(synth_root, tmp_path, "waited", False, **kw)
    model, saved, ends, rows = _run(synth_root, tmp_path, "overlapped", True, **kw)
    assert len(rows) == 4 and _same(rows, waited[3])
    assert [s["last.pt"]["epoch"] for s in saved] == [0, 1, 2, 3] and _same(saved, waited[1])
    assert all({"last.pt", "best.pt", f"epoch{k}.pt"} <= set(s) for k, s in enumerate(saved))
    assert [e for e, _ in ends] == [0, 1, 2, 3, 4] and _same(ends, waited[2])  # 4: best.pt's final validation
    assert sorted(model.trainer.val_overlapped) == [1, 2, 3]  # the last epoch is validated in place
    for epoch in (1, 2, 3):
        assert f"epoch {epoch}'s validation, run while epoch {epoch + 1} trained:" in caplog.text


@pytest.mark.slow
def test_by_default_a_run_whose_callbacks_read_each_epoch_as_it_ends_validates_in_place_and_says_why(
        synth_root, tmp_path, caplog):
    """val_overlap's default (None): this run's own on_model_save and on_fit_epoch_end read each epoch as it ends, so
    no epoch is overlapped, and one line names them and the key that would run them late."""
    caplog.set_level(logging.INFO)
    model, saved, ends, rows = _run(synth_root, tmp_path, "default", None, epochs=3)
    assert model.trainer.val_overlapped is None and len(rows) == 3 and [e for e, _ in ends] == [0, 1, 2, 3]
    said = [r.getMessage() for r in caplog.records if "read each epoch as it ends" in r.getMessage()]
    assert said == ["yolofeed: epoch 1 is validated before the next starts (test_val_overlap.<lambda>, "
                    "test_val_overlap.on_model_save read each epoch as it ends; val_overlap=True runs such callbacks "
                    "an epoch late)"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_every_tasks_overlapped_run_writes_what_a_waited_one_writes(task, tmp_path):
    from yolofeed import synth
    from yolofeed.config import SynthConfig

    root = tmp_path / "ds"
    synth.run(SynthConfig(out=str(root), n_train=24, n_val=8, imgsz=160, seed=3, workers=2, task=task))
    waited = _run(root, tmp_path, "waited", False, task=task, epochs=3, save_period=1)
    model, saved, ends, rows = _run(root, tmp_path, "overlapped", True, task=task, epochs=3, save_period=1)
    assert sorted(model.trainer.val_overlapped) == [1, 2] and len(rows) == 3
    assert _same(rows, waited[3]) and _same(saved, waited[1]) and _same(ends, waited[2])


@pytest.mark.slow
def test_early_stopping_and_val_period_stop_and_skip_where_a_waited_run_does(synth_root, tmp_path):
    """The best fitness at epoch 2. Patience 3 stops after epoch 5, where possible_stop (set by epoch 4's validation)
    asks for it; with val_period=2 and patience 2 it stops after epoch 4, which no possible_stop announced (epoch 3 is
    not validated): an overlapped epoch 4 would have stopped the run an epoch late."""
    fitness = [0.5, 0.6, 0.4, 0.3, 0.3, 0.2, 0.1, 0.1]
    for period, patience, rows in ((1, 3, 5), (2, 3, 5), (2, 2, 4)):
        kw = dict(epochs=8, patience=patience, fitness=fitness, options={"val_period": period})
        waited = _run(synth_root, tmp_path, f"waited{period}{patience}", False, **kw)
        overlapped = _run(synth_root, tmp_path, f"overlapped{period}{patience}", True, **kw)
        assert len(waited[3]) == rows, (period, patience)
        assert _same(overlapped[3], waited[3]) and _same(overlapped[1], waited[1]) and _same(overlapped[2], waited[2])


@pytest.mark.slow
def test_after_a_fitness_that_is_not_a_number_every_epoch_is_validated_in_place(synth_root, tmp_path, caplog):
    """Epoch 2's fitness, validated beside epoch 3, is not a number (the loss and the EMA finite): its row is written as
    it is, one warning says Ultralytics' NaN recovery did not run for it, and every later epoch is validated in place,
    where the recovery runs."""
    caplog.set_level(logging.INFO)
    fitness = [0.5, float("nan"), 0.6, 0.7, 0.8]
    model, _, ends, rows = _run(synth_root, tmp_path, "nan", True, epochs=5, fitness=fitness)
    assert sorted(model.trainer.val_overlapped) == [1, 2] and len(rows) == 5
    assert "epoch 2's fitness is nan with its loss and EMA finite" in caplog.text
    assert "epoch 3 is validated before the next starts (epoch 2's fitness was not a number" in caplog.text
    assert [e for e, _ in ends] == [0, 1, 2, 3, 4, 5]  # 5: best.pt's final validation
    recorded = options.read(model.trainer.save_dir / options.FILE)  # a resume validates in place too
    assert recorded["val_overlap"] is False and recorded["validate_beside"] is True


@pytest.mark.slow
def test_a_run_stopped_during_an_overlapped_validation_says_what_is_lost_and_resumes(synth_root, tmp_path, caplog):
    """Ctrl-C in epoch 2's validation, beside epoch 3: the run stops at epoch 3's end, says epoch 2's row and
    checkpoints were not written; last.pt is epoch 1's, and the run resumes from it with val_overlap restored."""
    from ultralytics import YOLO

    if not seam.since(seam.VAL_OVERLAP_SINCE):
        pytest.skip(f"Ultralytics {seam.VERSION}: every epoch is validated in place (VAL_OVERLAP_SINCE)")

    from yolofeed import FastDetectionTrainer

    caplog.set_level(logging.INFO)
    with pytest.raises(KeyboardInterrupt):
        _run(synth_root, tmp_path, "stopped", True, epochs=4, fail_at=2)
    assert "epoch 2's validation, run beside the training, did not end" in caplog.text
    last = tmp_path / "stopped" / "weights" / "last.pt"
    assert torch.load(last, weights_only=False)["epoch"] == 0 and len(_rows(tmp_path / "stopped" / "results.csv")) == 1
    caplog.clear()
    model = YOLO(str(last))
    model.train(resume=True, trainer=FastDetectionTrainer)
    assert "val_overlap=True" in caplog.text and len(_rows(tmp_path / "stopped" / "results.csv")) == 4


def test_the_bench_puts_a_validation_beside_in_its_epoch_and_the_wait_in_the_next():
    from yolofeed.bench.whole import beside

    records = [{"epoch": 1}, {"epoch": 2}, {"epoch": 3, "val_s": 0.5}]
    beside(records, {1: {"val_s": 0.9, "waited_s": 0.01}, 2: {"val_s": 0.8, "waited_s": 0.2}})
    assert records == [{"epoch": 1, "val_beside_s": 0.9}, {"epoch": 2, "val_beside_s": 0.8, "val_s": 0.01},
                       {"epoch": 3, "val_s": 0.7}]


@pytest.mark.slow
def test_a_whole_run_with_val_overlap_accounts_for_every_epoch(synth_root, tmp_path, monkeypatch):
    """The bench's whole run of an overlapped trainer: every epoch timed to the next one's start (its end comes an
    epoch late), each validation beside its epoch, the waits in the next, and nothing counted twice."""
    from yolofeed.bench import whole
    from yolofeed.bench.modes import trainer_class

    cls = trainer_class("yolofeed_val_overlap")
    monkeypatch.setattr(cls, "_validates_beside", lambda self: True)
    monkeypatch.chdir(tmp_path)
    args = dict(model="yolo11n.yaml", data=str(synth_root / "data.yaml"), imgsz=64, batch=8, device="cpu", workers=0,
                project=str(tmp_path / "runs"))
    r = whole.whole_run("yolofeed_val_overlap", cls, args, 3)
    epochs = r["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and all(e["epoch_s"] >= e["train_s"] > 0 for e in epochs)
    assert [("val_beside_s" in e) for e in epochs] == [True, True, False]  # the last epoch is validated in place
    assert "val_s" not in epochs[0] and epochs[1]["val_s"] >= 0 and epochs[2]["val_s"] > 0
    assert r["setup_s"] + sum(e["epoch_s"] for e in epochs) + r["final_s"] <= r["wall_s"] + 0.05


@pytest.mark.gpu
def test_on_a_gpu_an_overlapped_run_validates_on_its_own_stream_beside_the_graphed_step(synth_root, tmp_path, caplog):
    """On CUDA (the validation thread on by default there): each epoch but the last validated beside the next on the
    overlap's stream, the graphed step still captured (and the augmentation's graph again when mosaic closes, beside
    epoch 1's validation), the rows and checkpoints of every epoch written in order; each validation beside gives the
    metrics it gives again with the device idle (a snapshot read before its copy was made would not)."""
    caplog.set_level(logging.INFO)
    again = []
    model, saved, ends, rows = _run(synth_root, tmp_path, "gpu", True, epochs=3, device=0, close_mosaic=2, nbs=8,
                                    again=again)  # nbs=8: no gradient accumulation, so the step is graphed
    assert len(again) == 2 and all(first.keys() == second.keys() for first, second in again), again
    assert all(math.isclose(first[k], second[k], rel_tol=1e-3, abs_tol=1e-6) for first, second in again
               for k in first), again  # a race would read weights half copied: far off, not a rounding apart
    assert sorted(model.trainer.val_overlapped) == [1, 2] and model.trainer._overlap_stream is not None
    assert "replay as CUDA graphs" in caplog.text and "could not be" not in caplog.text
    assert "beside the trainer's build" in caplog.text  # the capture made in the early plans' thread (train/plans.py)
    assert [s["last.pt"]["epoch"] for s in saved] == [0, 1, 2] and [e for e, _ in ends] == [0, 1, 2, 3]
    assert len(rows) == 3
    assert all(math.isfinite(float(v)) for r in rows for k, v in r.items() if k != "epoch")


@pytest.mark.slow
def test_a_stop_a_callback_asks_for_at_an_epochs_end_stops_where_a_waited_run_stops(synth_root, tmp_path, caplog):
    """A callback at on_fit_epoch_end sets trainer.stop after epoch 2 (a tuner, a custom early stopping): with
    val_overlap that callback runs during epoch 3, whose training is then not kept: the same rows, checkpoints and
    callbacks as a waited run, which stopped after epoch 2."""
    caplog.set_level(logging.INFO)

    def stop_after_second(trainer):
        if trainer.epoch == 1:
            trainer.stop = True

    kw = dict(epochs=4, callbacks={"on_fit_epoch_end": stop_after_second})
    waited = _run(synth_root, tmp_path, "waited", False, **kw)
    overlapped = _run(synth_root, tmp_path, "overlapped", True, **kw)
    assert len(waited[3]) == 2 and [e for e, _ in waited[2]] == [0, 1, 2]  # 2: best.pt's final validation
    assert _same(overlapped[3], waited[3]) and _same(overlapped[1], waited[1]) and _same(overlapped[2], waited[2])
    assert "the run stops after epoch 2" in caplog.text and "epoch 3's training is not kept" in caplog.text


@pytest.mark.slow
def test_what_a_failed_validation_beside_said_is_printed_with_what_was_not_written(synth_root, tmp_path, caplog,
                                                                                     monkeypatch):
    from yolofeed.ultralytics_seam import DetectionValidator

    stock = DetectionValidator.__call__

    def failing(self, trainer=None, **kwargs):
        if trainer is not None and trainer.epoch == 1:
            seam.LOGGER.warning("the val pack's labels are unreadable")
            raise OSError("disk gone")
        return stock(self, trainer, **kwargs)

    monkeypatch.setattr(DetectionValidator, "__call__", failing)
    caplog.set_level(logging.INFO)
    with pytest.raises(OSError, match="disk gone"):
        _run(synth_root, tmp_path, "failed", True, epochs=4)
    said = caplog.text
    assert said.index("epoch 2's validation, run while epoch 3 trained:") < said.index("unreadable") < \
        said.index("epoch 2's validation, run beside the training, did not end") < said.index("training stopped in")


_STOPPED_BESIDE = """
import sys
from ultralytics import YOLO
from yolofeed import FastDetectionTrainer

class Beside(FastDetectionTrainer.with_options(validate_beside=True, val_overlap=True)):
    def _validates_beside(self):
        return True

def fail(trainer):
    if trainer.epoch == 2:  # epoch 3, while epoch 2's validation of the long val split runs beside
        raise RuntimeError("a bad batch")

model = YOLO("yolo11n.yaml")
model.add_callback("on_train_batch_end", fail)
model.train(trainer=Beside, data=sys.argv[1], project=sys.argv[2], name="run", epochs=4, imgsz=64, batch=8,
            workers=0, plots=False, device="cpu", seed=0)
"""


@pytest.mark.slow
def test_a_run_that_fails_while_a_validation_runs_beside_exits_with_its_error_not_an_abort(tmp_path):
    """The validation thread is stopped and waited for before the interpreter exits: exiting while it is inside torch
    aborts the process (status 134, "terminate called without an active exception") instead of the error's 1."""
    import subprocess
    import sys

    from yolofeed import synth
    from yolofeed.config import SynthConfig

    synth.run(SynthConfig(out=str(tmp_path / "ds"), n_train=24, n_val=400, imgsz=160, seed=3, workers=2))
    (tmp_path / "run.py").write_text(_STOPPED_BESIDE)
    done = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "ds" / "data.yaml"),
                           str(tmp_path / "runs")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "a bad batch" in done.stderr and "terminate called" not in done.stderr
    assert "epoch 2's validation, run beside the training, did not end" in done.stdout + done.stderr
