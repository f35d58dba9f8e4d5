"""Each checkpoint serialised in a process of its own (train/saver.py): stock's checkpoint, written whole, and the
training process takes over wherever the child cannot.

RELIABILITY.md lists these tests.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from yolofeed.train import saver as saver_mod
from yolofeed.train.checkpoints import AtomicPath
from yolofeed.train.saver import Job, Saver, rebuild
from yolofeed.train.writes import WRITES
from yolofeed.ultralytics_seam import DetectionTrainer, checkpoint_inputs


def _trainer(folder: Path, device: str = "cpu", channels_last: bool = False) -> SimpleNamespace:
    """A trainer as Ultralytics' save_model reads it: yolo11n's EMA, an AdamW with state after one step (channels-last
    state where the model is), the scaler, the arguments, the metrics; its checkpoints in ``folder``."""
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import ModelEMA

    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", nc=3, verbose=False).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.args = get_cfg()
    ema = ModelEMA(model)
    args = get_cfg(overrides={"optimizer": "AdamW"})
    stand_in = SimpleNamespace(model=model, ema=ema, args=args)
    optimizer = DetectionTrainer.build_optimizer(stand_in, model, name="AdamW", lr=0.001, momentum=0.9, decay=5e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    ema.update(model)
    with torch.no_grad():
        ema.ema.eval()(torch.zeros(1, 3, 64, 64, device=device))  # Detect's anchors and strides cached, as validation
    scaler = torch.amp.GradScaler(device, enabled=device == "cuda")
    return SimpleNamespace(
        ema=ema, model=model, optimizer=optimizer, scaler=scaler, args=args, epoch=3, best_fitness=0.5, fitness=0.5,
        metrics={"metrics/mAP50-95(B)": 0.5}, stopper=SimpleNamespace(best_fitness=0.5, best_epoch=3),
        read_results_csv=lambda: {"epoch": [1, 2, 3, 4]}, wdir=folder, last=AtomicPath(folder / "last.pt"),
        best=AtomicPath(folder / "best.pt"), save_period=-1)


def _same(a, b, where: str = "") -> None:
    """``a`` and ``b`` hold the same: types, keys, tensors (values, dtype, shape, strides), modules' attributes."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), where
        assert a.requires_grad == b.requires_grad, where
        assert torch.equal(a, b) or (a.isnan() == b.isnan()).all(), where
    elif isinstance(a, torch.nn.Module):
        _same(vars(a), vars(b), where)
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        _same(vars(a), vars(b), where)
    else:
        assert a == b or (a != a and b != b), where


def _load(path: Path) -> dict:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    ckpt.pop("date")
    return ckpt


@pytest.fixture
def child():
    s = Saver.start()
    assert s is not None
    yield s
    s.close()


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_childs_checkpoint_is_stocks_save_model_on_the_same_trainer(tmp_path, child, channels_last):
    """The child's last.pt and best.pt hold what Ultralytics' own save_model writes for the same trainer: every key,
    the EMA model (each attribute, Detect's cached anchors among them), each tensor's values, dtype, shape and strides
    (the optimiser's channels-last state kept so), the optimiser's, the scaler's and the arguments'."""
    stock, ours = tmp_path / "stock", tmp_path / "ours"
    trainer = _trainer(stock, channels_last=channels_last)
    assert DetectionTrainer.save_model(trainer)
    trainer.wdir, trainer.last, trainer.best = ours, AtomicPath(ours / "last.pt"), AtomicPath(ours / "best.pt")
    assert child.save(trainer)
    WRITES.wait(ours)
    assert child.gone is None
    for name in ("last.pt", "best.pt"):
        _same(_load(stock / name), _load(ours / name), name)
    if channels_last:
        state = _load(ours / "last.pt")["optimizer"]["state"]
        assert any(v["exp_avg"].is_contiguous(memory_format=torch.channels_last) and v["exp_avg"].dim() == 4
                   and not v["exp_avg"].is_contiguous() for v in state.values())


def test_the_host_copy_rebuilds_every_tensor_as_it_was_and_shares_what_was_shared():
    """A pickled object's tensors, rebuilt from the host copies: each dtype (bfloat16 and bool among them), 0-d and
    empty tensors, a transposed one, parameters with and without gradients; one tensor referred to twice is one tensor
    again."""
    shared = torch.arange(6.0).reshape(2, 3)
    obj = {"f16": torch.randn(3, 4).half(), "bf16": torch.randn(5).bfloat16(), "b": torch.tensor([True, False]),
           "i64": torch.tensor(7), "empty": torch.empty(0, 3), "t": torch.randn(4, 3).t(),
           "p": torch.nn.Parameter(torch.randn(2)),
           "frozen": torch.nn.Parameter(torch.randn(2), requires_grad=False), "a": shared, "again": [shared]}
    job = Job.of(obj, [])
    back = rebuild(job.payload, job.tensors, job.groups)
    for k, v in obj.items():
        if k == "again":
            continue
        assert type(back[k]) is type(v) and back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert back[k].requires_grad == v.requires_grad and torch.equal(back[k], v), k
    assert back["t"].stride() == obj["t"].stride()  # a permuted layout kept
    assert back["again"][0] is back["a"]
    for k in ("p", "a", "f16"):  # storages of their own, not views of the host copy
        assert back[k].untyped_storage().nbytes() == back[k].numel() * back[k].element_size()


@pytest.mark.parametrize("case", ["expanded", "view", "shared", "overlapping"])
def test_a_tensor_torch_save_would_write_with_more_of_its_storage_is_left_to_ultralytics(tmp_path, child, case):
    """A tensor whose storage holds other than its own elements, once each (an expanded one, a view with an offset,
    one whose strides overlap) or is shared with another: torch.save writes that whole storage, which the host copy
    would not; ``save`` declines (the caller runs Ultralytics' save_model) and writes nothing (found by a reviewer: the
    layout then differed from stock's)."""
    trainer = _trainer(tmp_path)
    base = torch.arange(8)
    trainer.ema.ema.extra = {"expanded": [torch.ones(2, 1).expand(2, 3)], "view": [base[2:5]],
                             "shared": [base, base.view(2, 4)],
                             "overlapping": [torch.arange(4.0).as_strided((2, 2), (1, 1))]}[case]
    assert not child.save(trainer)
    WRITES.wait(tmp_path)
    assert not (tmp_path / "last.pt").exists()


def test_objects_save_model_strips_do_not_travel():
    """The EMA's criterion, which save_model sets to None in its copy, travels as None (``checkpoint_inputs``)."""
    trainer = _trainer(Path("/nonexistent"))
    trainer.ema.ema.criterion = SimpleNamespace(big=torch.zeros(1000))
    inputs, as_none = checkpoint_inputs(trainer)
    job = Job.of(inputs, as_none)
    assert rebuild(job.payload, job.tensors, job.groups)["ema"].criterion is None
    assert len(Job.of(inputs, []).tensors) == len(job.tensors) + 1  # its tensor not copied


def test_an_ema_that_is_not_finite_is_left_to_ultralytics_save_model(tmp_path, child):
    """An EMA holding a NaN: ``save`` declines (the caller runs Ultralytics' save_model, which repairs the EMA from
    the model), and writes nothing."""
    trainer = _trainer(tmp_path)
    with torch.no_grad():
        next(trainer.ema.ema.parameters()).view(-1)[0] = float("nan")
    assert not child.save(trainer)
    WRITES.wait(tmp_path)
    assert not (tmp_path / "last.pt").exists()


def test_a_child_killed_before_a_checkpoint_leaves_it_to_the_training_process(tmp_path, child, caplog):
    """The child killed (the OOM killer): the checkpoint handed to it is made in the writer's thread from the same
    copies, with one line; the next is left to Ultralytics' save_model in the training thread."""
    os.kill(child._child.pid, signal.SIGKILL)
    child._child.wait()
    trainer = _trainer(tmp_path)
    caplog.set_level(logging.WARNING)
    assert child.save(trainer)
    WRITES.wait(tmp_path)
    assert _load(tmp_path / "last.pt")["epoch"] == 3
    assert "the checkpoint process ended (exit code -9); checkpoints are now serialised in the training process" \
        in caplog.text
    assert not child.save(trainer)


def test_a_stopped_child_is_ended_and_its_checkpoint_made_here(tmp_path, child, caplog, monkeypatch):
    """The child stopped (SIGSTOP, a debugger): the wait for it sees so within its poll and ends it; the checkpoint
    is made here."""
    monkeypatch.setattr(saver_mod, "POLL_S", 0.1)
    time.sleep(0.5)
    os.kill(child._child.pid, signal.SIGSTOP)
    caplog.set_level(logging.WARNING)
    trainer = _trainer(tmp_path)
    start = time.perf_counter()
    assert child.save(trainer)
    WRITES.wait(tmp_path)
    assert time.perf_counter() - start < 30
    assert _load(tmp_path / "last.pt")["epoch"] == 3
    assert "was stopped (SIGSTOP or a debugger) and was ended" in caplog.text


def test_a_write_the_child_cannot_make_is_the_folders_failure(tmp_path, child):
    """A checkpoint the child cannot write (here its weights folder is a file) is the folder's failure, raised by
    the wait as save_model's own error, and the child goes on taking checkpoints."""
    folder = tmp_path / "weights"
    folder.write_text("not a folder")
    trainer = _trainer(folder)
    assert child.save(trainer)
    with pytest.raises(FileExistsError):
        WRITES.wait(folder)
    assert child.gone is None
    good = tmp_path / "good"
    trainer.wdir, trainer.last, trainer.best = good, AtomicPath(good / "last.pt"), AtomicPath(good / "best.pt")
    assert child.save(trainer)
    WRITES.wait(good)
    assert _load(good / "last.pt")["epoch"] == 3


def test_the_child_ends_with_its_parents_run_and_when_its_parent_dies(tmp_path):
    """``close`` ends the child; a child whose parent was killed ends too (the parent-death signal)."""
    import subprocess
    import sys

    s = Saver.start()
    child = s._child
    s.close()
    assert s._child is None and child.wait(10) == 0
    code = ("import sys, time; from yolofeed.train.saver import Saver; s = Saver.start(); "
            "print(s._child.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the child outlived its killed parent")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_childs_checkpoint_from_cuda_is_stocks(tmp_path, child):
    """On CUDA, channels-last: the child's checkpoint holds stock's values, dtypes, shapes and strides (its tensors
    load to the host where stock's record the GPU)."""
    stock, ours = tmp_path / "stock", tmp_path / "ours"
    trainer = _trainer(stock, device="cuda", channels_last=True)
    assert DetectionTrainer.save_model(trainer)
    trainer.wdir, trainer.last, trainer.best = ours, AtomicPath(ours / "last.pt"), AtomicPath(ours / "best.pt")
    assert child.save(trainer)
    WRITES.wait(ours)
    assert child.gone is None
    _same(_load(stock / "last.pt"), _load(ours / "last.pt"), "last.pt")


def _train(synth_root, tmp_path, name: str, epochs: int, **options):
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    model = YOLO("yolo11n.yaml")
    trainers = []
    model.add_callback("on_train_end", trainers.append)
    model.train(trainer=FastDetectionTrainer.with_options(**options), data=str(synth_root / "data.yaml"), imgsz=64,
                batch=8, workers=0, plots=False, verbose=False, device="cpu", seed=0, epochs=epochs,
                project=str(tmp_path), name=name, exist_ok=True)
    return trainers[0]


def test_a_run_saving_in_the_child_writes_checkpoints_that_resume_and_validate(synth_root, tmp_path, caplog):
    """A run of 2 epochs with ``save_process=True`` (a CPU run: on CUDA it is the default): the first epoch's
    checkpoint made by the child (no fallback said), the last one's in the training thread (the final validation waits
    for it at once: the child's hand-over only lengthened the run's end, by 0.6-0.9 s on an H100 machine); the run's
    best.pt stripped and validated as stock's; the child ended with the run."""
    caplog.set_level(logging.WARNING)
    seen = []
    import yolofeed.train.saver as saver

    save = saver.Saver.save

    def counted(self, trainer):
        seen.append(trainer.epoch)
        return save(self, trainer)

    try:
        saver.Saver.save = counted
        trainer = _train(synth_root, tmp_path, "child", 2, save_process=True)
    finally:
        saver.Saver.save = save
    assert seen == [0] and "checkpoint process" not in caplog.text
    assert trainer._saver is not None and trainer._saver.gone is None and trainer._saver._child is None  # closed
    best = torch.load(tmp_path / "child" / "weights" / "best.pt", map_location="cpu", weights_only=False)
    assert best["optimizer"] is None and best["ema"] is None and best["model"] is not None  # stripped, as stock
    assert trainer.validated


def test_a_cpu_run_saves_in_the_training_thread_by_default(synth_root, tmp_path):
    """``save_process`` unset: a CPU run (its training already the CPU's work) starts no child."""
    trainer = _train(synth_root, tmp_path, "cpu", 1)
    assert trainer._saver is None


def test_a_child_started_past_descriptor_1024_still_takes_checkpoints(tmp_path):
    """A process holding more than a thousand open files when the child starts (its pipes numbered past 1024, where
    ``select`` cannot look): the checkpoint is the child's, whole (found by a reviewer: the write failed with
    "filedescriptor out of range in select()" and stopped the run)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if min(soft, hard) < 1200:
        pytest.skip("the open-file limit is below 1,200")
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        s = Saver.start()
        assert s._child.stdin.fileno() > 1024
        trainer = _trainer(tmp_path)
        assert s.save(trainer)
        WRITES.wait(tmp_path)
        assert s.gone is None and _load(tmp_path / "last.pt")["epoch"] == 3
        s.close()
    finally:
        for fd in held:
            os.close(fd)


def test_close_ends_the_child_at_once_though_a_forked_process_holds_its_input():
    """A process forked after the child started (a loader's worker) holds the write end of the child's input, so
    the child would never see its end: ``close`` tells it to end, and it does at once (found by a reviewer: 10 s, then
    killed)."""
    s = Saver.start()
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    try:
        child = s._child
        start = time.perf_counter()
        s.close()
        assert child.wait(5) == 0 and time.perf_counter() - start < 5
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


class _Unpicklable:
    """An attribute whose rebuild fails in the child alone (no GPU there), with an OSError that is no write's."""

    def __setstate__(self, state):
        if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
            raise FileNotFoundError(2, "No such file or directory", "/dev/nvidia0")
        self.__dict__.update(state)


def test_an_error_in_the_child_other_than_a_write_leaves_the_checkpoint_to_this_process(tmp_path, child, caplog):
    """An OSError in the child that is no write's (here an attribute's rebuild): the checkpoint is made here, one line
    says so (found by a reviewer: it was taken for a failed write, and stopped the run with no checkpoint)."""
    trainer = _trainer(tmp_path)
    trainer.ema.ema.odd = _Unpicklable()
    trainer.ema.ema.odd.state = 1  # unpickling calls __setstate__ only for an object with state
    caplog.set_level(logging.WARNING)
    assert child.save(trainer)
    WRITES.wait(tmp_path)
    assert _load(tmp_path / "last.pt")["epoch"] == 3
    assert "the checkpoint process failed (FileNotFoundError" in caplog.text


def test_a_child_stopped_for_a_moment_is_not_ended(tmp_path, child, monkeypatch):
    """The child stopped for less than two looks (a profiler's sample stops it briefly): it is waited for, and its
    checkpoint is its own."""
    monkeypatch.setattr(saver_mod, "POLL_S", 0.3)
    time.sleep(0.5)
    pid = child._child.pid
    os.kill(pid, signal.SIGSTOP)
    threading_timer = __import__("threading").Timer(0.4, os.kill, (pid, signal.SIGCONT))
    threading_timer.start()
    trainer = _trainer(tmp_path)
    assert child.save(trainer)
    WRITES.wait(tmp_path)
    threading_timer.join()
    assert child.gone is None and _load(tmp_path / "last.pt")["epoch"] == 3


def test_a_look_at_a_live_child_does_not_wait_on_it(monkeypatch):
    """Between two polls of its pipe, a live child is looked at, not waited for: a wait there held back the reading of
    a reply that came meanwhile (found reading the change: 0.2 s each look)."""
    import subprocess
    import sys

    monkeypatch.setattr(saver_mod, "POLL_S", 0.01)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        waits = []
        real_wait = proc.wait
        monkeypatch.setattr(proc, "wait", lambda timeout=None: waits.append(timeout) or real_wait(timeout))
        watch = saver_mod._Watch(proc)
        assert watch.ready(proc.stdout.fileno(), select.POLLIN) is False  # nothing to read, alive, running
        assert waits == []
        proc.kill()
        real_wait()
        with pytest.raises(saver_mod._Gone, match="ended"):
            for _ in range(100):  # the pipe's end is ready to read (EOF): read() says how the child ended
                watch.read(1)
    finally:
        proc.kill()
        proc.wait()


def test_a_child_under_pythonsafepath_keeps_the_parents_import_path(monkeypatch):
    """``PYTHONSAFEPATH`` puts no working folder first on a ``-c`` child's path: the first entry, the parent's own,
    stays (found by a reviewer: it was dropped, and the child imported another yolofeed)."""
    import subprocess
    import sys

    from yolofeed.processes import DIE_WITH_PARENT

    path = os.pathsep.join(p for p in sys.path if p)
    first = next(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", DIE_WITH_PARENT + "import sys; print(sys.path[0])", str(os.getpid())],
                         env={**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1"}, capture_output=True, text=True)
    assert out.stdout.strip() == first
