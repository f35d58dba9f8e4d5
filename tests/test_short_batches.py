"""The epoch's short batches forwarded in a thread of their own (train/short_batches.py): the same values, gradients
and autograd graph as in the training thread, under its autocast and grad mode; routed by the graphed model's
predict; let go with the graph."""

from __future__ import annotations

import copy
import pickle
import threading
from concurrent.futures import CancelledError
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from yolofeed import processes
from yolofeed.augment import AugmentHyp, GpuAugment
from yolofeed.loader.sampler import EpochSampler
from yolofeed.train import graphed, short_batches
from yolofeed.train import trainer as trainer_module
from yolofeed.train.short_batches import ShortBatches
from yolofeed.train.warmup import warm_up

CPU = torch.device("cpu")


@pytest.fixture
def model():
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    return DetectionModel("yolo11n.yaml", nc=4, verbose=False).train()


def _grads(m: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in m.parameters() if p.grad is not None]


def _loss(preds: dict) -> torch.Tensor:
    return sum((t.float() ** 2).mean() for t in (preds["boxes"], preds["scores"]))


def test_a_short_batch_forwarded_in_the_worker_is_the_training_threads_forward_bit_for_bit(model):
    """The outputs, then the gradients the training thread's backward makes through the worker's graph, equal the
    forward and backward made in the training thread; the worker's set-up left the model as it was."""
    x = torch.rand(3, 3, 64, 64)
    twin = copy.deepcopy(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    short = ShortBatches(model, [3], 64, CPU, amp=False, parts=(parts := {}))
    try:
        assert short.takes(x) and not short.takes(torch.rand(4, 3, 64, 64))
        where = []

        def predict(m, img):
            where.append(threading.current_thread().name)
            return m.predict(img)

        got = short(predict, model, x)
        want = twin.predict(x)
        assert where == ["yolofeed-short-batches"]
        for k in ("boxes", "scores"):
            assert torch.equal(got[k], want[k]), k
        _loss(got).backward()  # here, in the training thread, through the autograd graph the worker made
        _loss(want).backward()
        for a, b in zip(_grads(model), _grads(twin), strict=True):
            assert torch.equal(a, b)
        assert parts["beside_s"] >= 0  # the set-up ran first, on a copy
        for k, v in twin.state_dict().items():  # the batch-norm statistics moved once, by the one forward each
            assert torch.equal(model.state_dict()[k], v), k
        assert any(not torch.equal(state[k], v) for k, v in model.state_dict().items())
    finally:
        short.close()
    assert not short.takes(x)  # closed: a later short batch runs in the training thread


def test_the_worker_runs_under_the_callers_autocast_and_grad_mode_and_raises_what_it_raised(model):
    short = ShortBatches(model, [2], 32, CPU, amp=False)
    try:
        def state():
            return (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.is_grad_enabled())

        assert short(state) == (False, torch.get_autocast_dtype("cpu"), True)
        with torch.autocast("cpu", dtype=torch.float16):  # not a new thread's default (bfloat16 on the CPU)
            assert short(state) == (True, torch.float16, True)
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            assert short(lambda: (torch.get_autocast_dtype("cpu"), torch.is_autocast_cache_enabled())) == (
                torch.bfloat16, False)
        with torch.no_grad():
            assert short(state)[2] is False
            assert not short.takes(torch.rand(2, 3, 32, 32))  # an inference call is not a training batch
        with pytest.raises(torch.cuda.OutOfMemoryError, match="as raised"):
            short(lambda: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("as raised")))  # Ultralytics copes
        assert short(lambda: 7) == 7  # and it serves on
    finally:
        short.close()


def test_a_set_up_that_fails_is_skipped_with_one_line_and_the_batches_still_run(model, monkeypatch, caplog):
    monkeypatch.setattr(short_batches, "passes", lambda *a: (_ for _ in ()).throw(RuntimeError("cuDNN says no")))
    short = ShortBatches(model, [2], 32, CPU, amp=False)
    try:
        assert short(lambda: "served") == "served"
    finally:
        short.close()
    assert "skipped the set-up of batch sizes 2 beside an epoch (RuntimeError: cuDNN says no)" in caplog.text


def test_the_graphed_models_predict_sends_its_short_batches_to_the_worker_and_lets_go_of_it(model):
    graphed.swap(model)
    model.__dict__["_graph"] = SimpleNamespace(takes=lambda x: False)  # a graph that takes no batch here
    short = ShortBatches(model, [2], 32, CPU, amp=False)
    calls = []
    model.__dict__["_short"] = _Recording(short, calls)
    try:
        model.predict(torch.rand(2, 3, 32, 32))
        model.predict(torch.rand(3, 3, 32, 32))  # not a short size: Ultralytics' predict here
        model.eval()
        model.predict(torch.rand(2, 3, 32, 32))  # not training: here
        model.train()
        assert calls == [2]
        assert "_short" not in copy.deepcopy(model).__dict__  # a copy (the EMA's) and a pickle hold no thread
        assert "_short" not in pickle.loads(pickle.dumps(model)).__dict__
        graphed.uninstall(model)  # the run's end (_let_go): the worker is closed and dropped
        assert "_short" not in model.__dict__ and not short.takes(torch.rand(2, 3, 32, 32))
    finally:
        short.close()


class _Recording:
    """A ShortBatches that records the batch size of each call it forwards."""

    def __init__(self, short: ShortBatches, calls: list):
        self.short, self.calls = short, calls

    def takes(self, x):
        return self.short.takes(x)

    def __call__(self, fn, m, x):
        self.calls.append(x.shape[0])
        return self.short(fn, m, x)

    def close(self):
        self.short.close()


def test_the_warm_up_hands_the_other_sizes_to_beside_where_it_takes_them(model, monkeypatch):
    import yolofeed.train.warmup as warmup

    order = []
    monkeypatch.setattr(warmup, "warm_model", lambda m, sizes, *a: order.append(list(sizes)))
    monkeypatch.setattr(warmup, "warm_augmentation", lambda *a, **k: order.append("augmentation"))
    augment = GpuAugment(AugmentHyp.from_args(imgsz=64))
    for takes, want in ((True, [[4], "beside [2]", "augmentation"]), (False, [[4], "beside [2]", [2], "augmentation"])):
        order.clear()
        warm_up(model, EpochSampler(np.arange(10), 4), augment, 3, CPU, amp=False,
                beside=lambda sizes, takes=takes: order.append(f"beside {sizes}") or takes)
        assert order == want


def test_the_trainer_hands_them_beside_only_where_the_graph_was_captured_ahead(model, monkeypatch):
    made = []
    monkeypatch.setattr(short_batches, "ShortBatches", lambda m, sizes, *a, worker: made.append(sizes) or "worker")
    monkeypatch.setattr(trainer_module, "unwrap_model", lambda m: m)
    t = SimpleNamespace(model=model, hyp=SimpleNamespace(imgsz=64), device=CPU, _plans=None)
    beside = trainer_module.FastDetectionTrainer._short_batches_beside
    for unplanned in (True, False):  # the default: in the training thread as GEMMs; else in the worker
        monkeypatch.setattr(short_batches, "UNPLANNED", unplanned)
        model.__dict__.pop("_graph", None)
        for graph, takes in ((None, False), (SimpleNamespace(flat=None), False),
                             (SimpleNamespace(flat=object()), True)):
            model.__dict__.pop("_short", None)
            if graph is not None:
                model.__dict__["_graph"] = graph
            assert beside(t, False, {}, [16]) is takes
            short = model.__dict__.get("_short")
            if not takes:
                assert short is None
            elif unplanned:
                assert isinstance(short, short_batches.InPlace) and short.sizes == {16} and short.set_up.done()
            else:
                assert short == "worker"
    assert made == [[16]]
    monkeypatch.setattr(short_batches, "BESIDE", False)  # the A/B switch: the warm-up passes them in its thread
    model.__dict__.pop("_short", None)
    assert beside(t, False, {}, [16]) is False and "_short" not in model.__dict__
    model.__dict__.pop("_graph", None)


@pytest.mark.gpu
def test_cuda_a_short_batch_in_the_worker_is_bit_for_bit_the_training_threads_under_autocast():
    """On CUDA under float16 autocast, with Ultralytics' deterministic cuDNN: the worker forwards on the training
    thread's stream, and the outputs and the gradients equal the training thread's own."""
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import init_seeds

    init_seeds(0, deterministic=True)
    dev = torch.device("cuda")
    model = DetectionModel("yolo11n.yaml", nc=4, verbose=False).to(dev).train()
    twin = copy.deepcopy(model)
    x = torch.rand(5, 3, 128, 128, device=dev)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))  # the model, its copy and x, made on the default stream
    short = ShortBatches(model, [5], 128, dev, amp=True)
    try:
        with torch.cuda.stream(stream), torch.autocast("cuda", dtype=torch.float16):
            assert short(lambda: torch.cuda.current_stream(dev)) == stream  # the caller's stream, in the worker
            got = short(lambda m, img: m.predict(img), model, x)
            want = twin.predict(x)
        with torch.cuda.stream(stream):
            _loss(got).backward()
            _loss(want).backward()
        torch.cuda.synchronize()
        for k in ("boxes", "scores"):
            assert torch.equal(got[k], want[k]), k
        for a, b in zip(_grads(model), _grads(twin), strict=True):
            assert torch.equal(a, b)
    finally:
        short.close()


def test_a_worker_that_does_not_stop_is_said_and_noted_and_the_run_goes_on(model, monkeypatch, caplog):
    from yolofeed import processes

    monkeypatch.setattr(short_batches, "CLOSE_WAIT_S", 0.2)
    monkeypatch.setattr(processes, "LEFT_RUNNING", [])
    started, release = threading.Event(), threading.Event()
    short = ShortBatches(model, [2], 32, CPU, amp=False)
    done = short._worker.submit(lambda: started.set() or release.wait(10))  # a forward that outlasts the wait
    assert started.wait(30)
    short.close()
    assert "the short batches' thread did not stop within 0.2 s" in caplog.text
    assert processes.LEFT_RUNNING == ["the short batches' thread"]
    release.set()
    assert processes.result(done) is True


def test_a_worker_that_cannot_start_serves_no_batch_and_says_so_once(model, monkeypatch, caplog):
    """Its first job failing (setting its CUDA device, say), the worker hands the error to every job, and the
    short batches run in the training thread."""
    def no_device(device):
        return lambda: (_ for _ in ()).throw(ValueError("no such device"))

    monkeypatch.setattr(short_batches, "on_device", no_device)
    short = ShortBatches(model, [2], 32, CPU, amp=False)
    try:
        with pytest.raises(ValueError, match="no such device"):
            short(lambda: None)
        x = torch.rand(2, 3, 32, 32)
        assert not short.takes(x) and not short.takes(x)
        assert caplog.text.count("the short batches' thread failed (ValueError: no such device)") == 1
    finally:
        short.close()


@pytest.mark.parametrize("index", [None, 0])
def test_a_worker_on_cuda_takes_the_callers_device_with_or_without_an_index(monkeypatch, index):
    from yolofeed.train.validation import on_device

    chosen = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    on_device(torch.device("cuda", index) if index is not None else torch.device("cuda"))()
    assert chosen == [3 if index is None else index]
    assert on_device(CPU) is None


def test_the_worker_keeps_neither_the_copy_nor_a_batch_once_done(model, monkeypatch):
    """The set-up's copy goes once its passes are made, and a forwarded batch's input and outputs once the caller
    drops them: the worker holds no job while it waits for the next (GPU memory, for an epoch)."""
    import gc
    import weakref

    copies = []
    monkeypatch.setattr(short_batches, "training_copy", lambda m: copies.append(copy.deepcopy(m)) or copies[-1])
    short = ShortBatches(model, [2], 32, CPU, amp=False)
    try:
        processes.result(short._set_up_done)
        twin = weakref.ref(copies.pop())
        x = torch.rand(2, 3, 32, 32)
        out = short(lambda m, img: m.predict(img), model, x)
        seen = weakref.ref(x), weakref.ref(out["scores"])
        del x, out
        gc.collect()
        assert twin() is None and seen[0]() is None and seen[1]() is None
    finally:
        short.close()


def test_a_copy_that_fails_leaves_no_thread(model, monkeypatch):
    monkeypatch.setattr(short_batches, "training_copy",
                        lambda m: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("no room for a copy")))
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(torch.cuda.OutOfMemoryError):  # the trainer's warm-up skips with one line (test_warmup)
        ShortBatches(model, [2], 32, CPU, amp=False)
    assert "yolofeed-short-batches" not in {t.name for t in threading.enumerate()} - before


@pytest.mark.parametrize("mode", ["saved_tensors_hooks", "torch_function_mode", "profiler"])
def test_a_batch_under_a_state_the_worker_would_not_share_runs_in_the_training_thread(model, mode):
    """Saved-tensor hooks (activations offloaded), a torch function mode (``with torch.device``), the profiler: each
    thread's own, so such a batch is not handed to the worker."""
    short = ShortBatches(model, [2], 32, CPU, amp=False)
    x = torch.rand(2, 3, 32, 32)
    contexts = {"saved_tensors_hooks": lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
                "torch_function_mode": lambda: torch.device("cpu"), "profiler": lambda: torch.profiler.profile()}
    try:
        assert short.takes(x)
        with contexts[mode]():
            assert not short.takes(x)
        assert short.takes(x)
    finally:
        short.close()


def test_a_closed_worker_takes_no_job_and_skips_what_was_queued(model):
    started, release = threading.Event(), threading.Event()
    worker = processes.Worker("test-worker")
    running = worker.submit(lambda: started.set() or release.wait(10))
    queued = worker.submit(lambda: "ran")
    assert started.wait(30)
    worker.cancel()
    assert worker.close(0.0) is False and not worker.alive  # closing: takes nothing more
    with pytest.raises(RuntimeError, match="test-worker thread has stopped"):
        worker.submit(lambda: None)  # it would queue behind the end, and never run
    release.set()
    assert processes.result(running) is True
    with pytest.raises(CancelledError):  # skipped: the caller stopped waiting
        processes.result(queued)


def test_a_worker_whose_first_job_failed_is_not_alive_and_hands_queued_jobs_the_error():
    """The validation thread that cannot set its device: not alive, so validations run in the training thread
    (``_in_validation_thread``), and what was queued gets the error."""
    from yolofeed.train.validation import ValidationThread

    gate = threading.Event()
    worker = processes.Worker("test-worker", first=lambda: gate.wait(10) and (_ for _ in ()).throw(
        RuntimeError("CUDA error: invalid device ordinal")))
    queued = worker.submit(lambda: "ran")
    gate.set()
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        processes.result(queued)
    assert not worker.alive and isinstance(worker.failed, RuntimeError)
    worker.close(5)
    assert ValidationThread.__mro__[1] is processes.Worker
