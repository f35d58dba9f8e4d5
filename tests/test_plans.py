"""The early plans' thread (train/plans.py): when it starts, the model it builds, what it leaves of the run."""

from __future__ import annotations

import gc
import logging
import os
import random
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from yolofeed import processes
from yolofeed.train import plans
from yolofeed.ultralytics_seam import DEFAULT_CFG, LOGGER, deterministic_ahead, get_cfg, model_ahead

TINY = "yolo11n.yaml"


@pytest.fixture
def data_yaml(tmp_path):
    path = tmp_path / "data.yaml"
    path.write_text("path: .\ntrain: images\nval: images\nnames:\n  0: a\n  1: b\n  2: c\n")
    return path


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_the_model_ahead_has_the_layers_the_trainer_builds(data_yaml, tmp_path, caplog):
    """Its layers are those of ``DetectionTrainer.get_model`` for the run: the data's class count (one with
    single_cls), from a model yaml or from a .pt's; None where the data or model cannot be read as they are."""
    from ultralytics.nn.tasks import DetectionModel

    stock = DetectionModel(TINY, nc=3, verbose=False)
    caplog.clear()  # stock's own build said it
    with caplog.at_level(logging.INFO):
        ahead = model_ahead(get_cfg(overrides={"model": TINY, "data": str(data_yaml)}))
    assert _shapes(ahead) == _shapes(stock)
    assert "Overriding" not in caplog.text  # the trainer's own build says it, once
    single = model_ahead(get_cfg(overrides={"model": TINY, "data": str(data_yaml), "single_cls": True}))
    assert _shapes(single) == _shapes(DetectionModel(TINY, nc=1, verbose=False)) != _shapes(stock)
    weights = tmp_path / "w.pt"
    torch.save({"model": DetectionModel(TINY, nc=5, verbose=False)}, weights)
    assert _shapes(model_ahead(get_cfg(overrides={"model": str(weights), "data": str(data_yaml)}))) == _shapes(stock)
    for overrides in ({"model": TINY, "data": str(tmp_path / "missing.yaml")},  # a dataset Ultralytics would fetch
                      {"model": str(tmp_path / "missing.pt"), "data": str(data_yaml)},
                      {"model": "yolo11n", "data": str(data_yaml)}):  # a name Ultralytics resolves itself
        assert model_ahead(get_cfg(overrides=overrides)) is None, overrides


def test_deterministic_ahead_sets_what_init_seeds_sets_for_cudnn_cublas_and_the_environment(monkeypatch):
    from ultralytics.utils.torch_utils import init_seeds

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", torch.backends.cudnn.deterministic)
    fill = torch.utils.deterministic.fill_uninitialized_memory
    rng = torch.get_rng_state(), np.random.get_state(), random.getstate()

    def env():
        return os.environ.get("CUBLAS_WORKSPACE_CONFIG"), os.environ.get("PYTHONHASHSEED")

    try:
        for deterministic in (True, False):
            for key in ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED"):
                monkeypatch.setenv(key, "7")  # a user's own, which init_seeds replaces or drops
            deterministic_ahead(deterministic, 3)
            ahead = env(), torch.backends.cudnn.deterministic
            for key in ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED"):
                monkeypatch.setenv(key, "7")
            init_seeds(3 + 1 - 1, deterministic=deterministic)  # the trainer's seed + 1 + RANK, RANK -1
            assert ahead == (env(), torch.backends.cudnn.deterministic)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.set_rng_state(rng[0]), np.random.set_state(rng[1]), random.setstate(rng[2])


@pytest.mark.parametrize("case, why", [
    ({"device": "cpu"}, "the CPU"), ({"device": "0,1"}, "DDP"), ({"device": "-1"}, "an idle GPU Ultralytics picks"),
    ({"batch": -1}, "AutoBatch"), ({"batch": 0.7}, "AutoBatch's fraction"), ({"resume": True}, "a resume"),
    ({"task": "pose", "model": "yolo11n-pose.yaml"}, "another task"), ({"compile": True}, "a compiled model"),
    ({"multi_scale": 0.5}, "multi-scale"), ({"quantize": 8}, "QAT"), ({"warm_up": False}, "no warm-up"),
    ({"graphed_step": False}, "no graph"),
])
def test_it_starts_for_one_cuda_gpu_with_the_warm_up_and_the_graph_only(data_yaml, monkeypatch, case, why):
    made = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(plans, "Plans", lambda *a: made.append(a[:-1]) or "started")
    monkeypatch.setattr(plans, "deterministic_ahead", lambda d, seed: made.append("flags"))
    overrides = {"model": TINY, "data": str(data_yaml), "batch": 8, "imgsz": 100, "device": "1"}
    trainer = SimpleNamespace(warm_up=True, graphed_step=True)
    assert plans.start(trainer, DEFAULT_CFG, overrides) == "started"
    model, batch, imgsz, device, amp = made.pop()
    assert made.pop() == "flags"
    assert batch == 8 and imgsz == 128 and device == torch.device("cuda", 1) and amp is True
    # the layout _setup_train gives the model on CUDA (channels_last unset: channels-last, off Windows)
    assert model.model[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert plans.start(trainer, DEFAULT_CFG, {**overrides, "channels_last": False}) == "started"
    assert not made.pop()[0].model[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # a notebook's torch.cuda.set_device(1)
    assert plans.start(trainer, DEFAULT_CFG, {**overrides, "device": ""}) == "started"
    assert made.pop()[3] == torch.device("cuda", 1)  # select_device's default: the current device
    made.clear()
    assert plans.start(trainer, DEFAULT_CFG, {**overrides, "amp": "bf16"}) == "started"
    assert made.pop()[-1] is torch.bfloat16
    made.clear()
    for key in ("warm_up", "graphed_step"):
        setattr(trainer, key, case.pop(key, True))
    assert plans.start(trainer, DEFAULT_CFG, {**overrides, **case}) is None, why
    assert made == []


def test_what_is_set_ahead_is_set_back_as_it_was(monkeypatch):
    """``deterministic_ahead``'s undo: the environment and cuDNN's flag as they were, a variable unset stays unset."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    for deterministic in (True, False):
        undo = deterministic_ahead(deterministic, 5)
        assert torch.backends.cudnn.deterministic is deterministic
        undo()
        assert torch.backends.cudnn.deterministic is False
        assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == ":16:8" and "PYTHONHASHSEED" not in os.environ


def test_the_trainers_random_streams_are_as_without_it(synth_root, tmp_path, monkeypatch):
    """The model ahead draws its weights before Ultralytics' init_seeds seeds the streams: a trainer built with it
    starts from the same random state as one built without."""
    from yolofeed import FastDetectionTrainer

    def state():
        return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()

    overrides = {"model": TINY, "data": str(synth_root / "data.yaml"), "imgsz": 64, "batch": 2, "device": "cpu",
                 "project": str(tmp_path), "exist_ok": True, "plots": False}
    FastDetectionTrainer(overrides=overrides)
    without = state()
    made = []
    monkeypatch.setattr(plans, "start", lambda *a: made.append(model_ahead(get_cfg(*a[1:]))) and None)
    torch.manual_seed(123)  # a state the early model's draws would show
    FastDetectionTrainer(overrides=overrides)
    assert made and made[0] is not None
    with_it = state()
    assert torch.equal(without[0], with_it[0]) and np.array_equal(without[1], with_it[1]) and without[2] == with_it[2]


def test_the_thread_runs_jobs_under_the_callers_state_and_is_handed_over_or_closed():
    """On the CPU too: its early pass, then each ``run`` in it under the caller's grad mode, its error raised here;
    handed over, it is the new owner's to close; closed, ``run`` runs here."""
    from ultralytics.nn.tasks import DetectionModel

    p = plans.Plans(DetectionModel(TINY, nc=2, verbose=False), 2, 64, torch.device("cpu"), False)
    where = p.run(lambda: (threading.current_thread().name, torch.is_grad_enabled()))
    assert where == ("yolofeed-plans", True) and p.early.done() and p.early_s is not None
    with torch.no_grad():
        assert p.run(torch.is_grad_enabled) is False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert p.run(lambda: (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))) == \
            (True, torch.bfloat16)
    assert p.run(lambda: torch.is_autocast_enabled("cpu")) is False
    with pytest.raises(ZeroDivisionError):
        p.run(lambda: 1 / 0)
    worker = p.hand_over()
    assert isinstance(worker, processes.Worker) and p.hand_over() is None and not p.alive
    assert p.run(lambda: threading.current_thread().name) == threading.current_thread().name
    p.close()  # nothing held: nothing closed
    assert worker.alive
    worker.close(5)
    q = plans.Plans(DetectionModel(TINY, nc=2, verbose=False), 2, 64, torch.device("cpu"), False)
    q.close()
    assert not q.alive and q.run(lambda: threading.current_thread().name) == threading.current_thread().name


def test_an_early_pass_that_fails_costs_nothing_else(caplog):
    """Out of memory, cuDNN, a layer it lacks: said at debug level; the thread serves on."""
    class Broken(torch.nn.Module):
        def forward(self, x):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")

    with caplog.at_level(logging.DEBUG, logger=LOGGER.name):
        p = plans.Plans(Broken(), 2, 64, torch.device("cpu"), False)
        assert p.run(lambda: "served") == "served" and p.early.exception() is None
    assert "no early cuDNN set-up (OutOfMemoryError: CUDA out of memory.)" in caplog.text
    p.close()


@pytest.mark.parametrize("release, system, given, want", [
    ((8, 4, 190), "Linux", None, True), ((8, 4, 190), "Windows", None, False), ((8, 4, 145), "Windows", None, True),
    ((8, 4, 190), "Windows", True, True), ((8, 4, 190), "Linux", False, False),
])
def test_the_layout_ahead_is_the_one_setup_train_gives_under_each_release(monkeypatch, release, system, given, want):
    """channels_last unset: channels-last off Windows, and on Windows too before 8.4.146 (``_setup_train``)."""
    import platform

    from yolofeed.ultralytics_seam import trains_channels_last, version

    monkeypatch.setattr(version, "RELEASE", release)
    monkeypatch.setattr(platform, "system", lambda: system)
    assert trains_channels_last(SimpleNamespace(channels_last=given)) is want


def test_a_ctrl_c_while_the_thread_runs_a_job_leaves_no_thread_behind():
    """Ctrl-C while the training thread waits for the thread's job (a capture, say): the trainer closes it, waiting
    for the job to end, so no thread is left inside torch as the interpreter exits."""
    import signal
    import time

    from ultralytics.nn.tasks import DetectionModel

    from yolofeed.train.trainer import FastTrainer

    p = plans.Plans(DetectionModel(TINY, nc=2, verbose=False), 2, 64, torch.device("cpu"), False)
    p.run(lambda: None)  # the early pass made
    ended = []

    def capture():
        time.sleep(1.0)
        ended.append(time.perf_counter())

    trainer = SimpleNamespace(_plans=p)
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        p.run(capture)
    assert not ended  # interrupted while the job runs
    FastTrainer._close_plans(trainer)
    assert ended and trainer._plans is None
    assert not any(t.name == "yolofeed-plans" and t.is_alive() for t in threading.enumerate())


def _alive() -> bool:
    return any(t.name == "yolofeed-plans" and t.is_alive() for t in threading.enumerate())


def _cpu_plans(**kwargs) -> plans.Plans:
    from ultralytics.nn.tasks import DetectionModel

    return plans.Plans(DetectionModel(TINY, nc=2, verbose=False), 2, 64, torch.device("cpu"), False, **kwargs)


def test_a_fork_waits_for_the_early_pass():
    """The pack build's workers fork from the trainer while the early pass may be inside torch: the fork waits for
    it (a child must not inherit the locks that thread holds), then goes on; a pass that ends the thread's jobs
    does not hold a later fork."""
    import multiprocessing as mp
    import time

    release = threading.Event()

    class Slow(torch.nn.Module):
        def forward(self, x):
            release.wait(10)
            return x.sum()

    p = plans.Plans(Slow(), 1, 32, torch.device("cpu"), False)
    threading.Timer(0.3, release.set).start()
    child = mp.get_context("fork").Process(target=int)
    child.start()
    assert p.early.done()  # os.fork returned only once the pass had ended
    child.join(10)
    assert child.exitcode == 0
    t = time.perf_counter()
    again = mp.get_context("fork").Process(target=int)
    again.start()
    again.join(10)
    assert again.exitcode == 0 and time.perf_counter() - t < 5
    p.close()


def test_no_thread_is_left_by_a_failure_after_ultralytics_constructor_or_before_the_loop(synth_root, tmp_path,
                                                                                         monkeypatch):
    """The trainer's own set-up failing after Ultralytics' (the run's options not recorded, say), and ``train()``
    failing before the loop (the run folder held by another run): the thread is closed, not left inside torch."""
    from yolofeed import FastDetectionTrainer
    from yolofeed.errors import ConfigError
    from yolofeed.train import options

    overrides = {"model": TINY, "data": str(synth_root / "data.yaml"), "imgsz": 64, "batch": 2, "device": "cpu",
                 "project": str(tmp_path), "exist_ok": True, "plots": False}
    monkeypatch.setattr(plans, "start", lambda *a: _cpu_plans())

    def refused(*a, **k):
        raise ConfigError("no room for yolofeed.yaml")

    undone = []
    with monkeypatch.context() as m:
        m.setattr(options, "record", refused)
        m.setattr(plans, "start", lambda *a: _cpu_plans(undo_ahead=lambda: undone.append(_alive())))
        with pytest.raises(ConfigError):
            FastDetectionTrainer(overrides=overrides)
    assert not _alive()
    assert undone == [False]  # what was set ahead set back, once the thread that made plans for it had ended
    trainer = FastDetectionTrainer(overrides=overrides)
    trainer._plans = _cpu_plans()  # the CPU trainer closed its own: one as on CUDA
    monkeypatch.setattr(FastDetectionTrainer, "hold_run_folder", refused)
    with pytest.raises(ConfigError):
        trainer.train()
    assert trainer._plans is None and not _alive()


def test_a_short_batches_copy_that_fails_leaves_the_thread_to_be_closed(model_for_short, monkeypatch):
    """The worker is handed over once the short batches are made: their copy running out of memory leaves it with the
    trainer, which closes it."""
    from yolofeed.train import short_batches
    from yolofeed.train import trainer as trainer_module

    def out_of_memory(m):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory.")

    monkeypatch.setattr(short_batches, "training_copy", out_of_memory)
    monkeypatch.setattr(short_batches, "UNPLANNED", False)  # the worker's path (InPlace takes no thread)
    monkeypatch.setattr(trainer_module, "unwrap_model", lambda m: m)
    t = SimpleNamespace(model=model_for_short, hyp=SimpleNamespace(imgsz=64), device=torch.device("cpu"),
                        _plans=_cpu_plans())
    model_for_short.__dict__["_graph"] = SimpleNamespace(flat=object())
    with pytest.raises(torch.cuda.OutOfMemoryError):
        trainer_module.FastDetectionTrainer._short_batches_beside(t, False, {}, [1])
    assert t._plans.worker is not None and "_short" not in model_for_short.__dict__
    trainer_module.FastDetectionTrainer._close_plans(t)
    assert not _alive()


@pytest.fixture
def model_for_short():
    from ultralytics.nn.tasks import DetectionModel

    return DetectionModel(TINY, nc=2, verbose=False)


def test_a_thread_no_one_closed_ends_when_its_plans_go():
    """A trainer built and never trained: once nothing holds its plans, the thread ends."""
    p = _cpu_plans()
    p.run(lambda: None)
    assert _alive()
    del p
    gc.collect()
    assert not _alive()


def test_the_arguments_read_ahead_say_no_warning_the_trainer_says_again(data_yaml, caplog):
    """A deprecated key: Ultralytics' warning once, from the trainer's own get_cfg, not from the read ahead."""
    from yolofeed.ultralytics_seam import args_ahead

    with caplog.at_level(logging.WARNING):
        args = args_ahead(DEFAULT_CFG, {"model": TINY, "data": str(data_yaml), "hide_labels": True})
    assert args.model == TINY and caplog.text == ""
    with caplog.at_level(logging.WARNING):
        get_cfg(DEFAULT_CFG, {"model": TINY, "data": str(data_yaml), "hide_labels": True})
    assert "hide_labels" in caplog.text  # the warning the trainer says
