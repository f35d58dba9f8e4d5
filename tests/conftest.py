"""Shared fixtures. Everything runs on the CPU; tests marked ``gpu`` skip without CUDA."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("YOLO_OFFLINE", "1")  # Ultralytics: no network checks, no downloads
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    # one thread a worker (and a process it starts): make test runs a worker a core, and two workers of two threads
    # each on two cores spend their time in OpenMP's spin-waits (the augmentation tests ran 1.5x slower)
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # imported before this file (a plugin): it read the variable already
        sys.modules["torch"].set_num_threads(1)


def _keep_freed_memory() -> None:
    """Let glibc's malloc reuse freed memory instead of giving every large block back to the kernel.

    The CPU references (the warp, the HSV, the losses) allocate and free tensors of tens of MB a batch. glibc
    serves each with its own mmap and unmaps it on free, so the next batch faults every page in again, zeroed by
    the kernel: test_augment_stats spent 35 s of its 64 s in the kernel. Served from the heap, and the heap not
    trimmed, the pages are reused: the same arithmetic, the same results, a fraction of the system time. Set in
    the environment for the processes the tests start (xdist's workers among them: this file is read before they
    start) and with mallopt for this one (the variables are read at a process's start only).
    """
    sizes = {"MALLOC_MMAP_THRESHOLD_": 256 << 20, "MALLOC_TRIM_THRESHOLD_": 2 << 30}
    for name, size in sizes.items():
        os.environ.setdefault(name, str(size))
    if sys.platform != "linux":
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # musl and others: their allocator, their defaults
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, int(os.environ["MALLOC_MMAP_THRESHOLD_"]))
    libc.mallopt(M_TRIM_THRESHOLD, int(os.environ["MALLOC_TRIM_THRESHOLD_"]))


_keep_freed_memory()

import yolofeed.synth as synth  # noqa: E402
from helpers import copy_dataset  # noqa: E402
from yolofeed.config import SynthConfig  # noqa: E402
from yolofeed.pack import Pack, open_or_build  # noqa: E402


def _own_tqdm_lock() -> None:
    """Give a forked test process tqdm locks of its own.

    tqdm guards every bar, even a disabled one, with a multiprocessing RLock that every process forked
    after its creation shares. These tests kill forked builds with SIGKILL; one killed while holding that
    lock would block every later bar of the whole test session, in every process (a build that never
    exits, reported as a hang far from its cause).
    """
    std = sys.modules.get("tqdm.std")
    if std is None:
        return
    std.TqdmDefaultWriteLock.th_lock = threading.RLock()  # another thread may have held it at the fork
    if "mp_lock" in vars(std.TqdmDefaultWriteLock):
        del std.TqdmDefaultWriteLock.mp_lock  # made again on first use, in this process
    classes = [std.tqdm]
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        if "_lock" in vars(cls):
            del cls._lock


os.register_at_fork(after_in_child=_own_tqdm_lock)

# The signal tests play a user's Ctrl-C. A shell that starts pytest in the background (`make test &`, nohup)
# hands it SIGINT ignored, and Python then installs no KeyboardInterrupt handler: put Python's own back, so the
# tests see what a user's terminal gives.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs CUDA: run on the device machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    """A run that collected no test is a failure, not a pass (pytest's exit 5 never reaches CI)."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _packs_built_on_a_disk():
    """Builds see a disk wherever pytest's temporary folder lies (a tmpfs on some systems), so that every test takes
    the same write path; only the tmpfs a test mounts (``helpers.tmpfs``) is one."""
    from helpers import OnDisk
    from yolofeed.pack import disk

    with disk.using(OnDisk()):
        yield


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory) -> Path:
    """A small synthetic dataset, made once per session. Copy it before changing it."""
    root = tmp_path_factory.mktemp("synth")
    synth.run(SynthConfig(out=str(root), n_train=24, n_val=8, imgsz=160, seed=3, workers=2))
    return root


@pytest.fixture()
def dataset(synth_root, tmp_path) -> Path:
    """A private copy of the synthetic dataset (with its data.yaml rewritten to point at the copy)."""
    root = tmp_path / "ds"
    shutil.copytree(synth_root, root, ignore=shutil.ignore_patterns("yolofeed-packs"))
    text = (root / "data.yaml").read_text().replace(str(synth_root), str(root))
    (root / "data.yaml").write_text(text)
    return root


@pytest.fixture(scope="session")
def pack(synth_root, tmp_path_factory) -> Callable[..., Pack]:
    """``pack(imgsz, storage="raw", split="train")``: a pack of the session's synthetic dataset.

    Each (split, imgsz, storage) is built once per session, into a temporary folder of its own (never beside
    the dataset), and every call opens it afresh: a test may close or drop its Pack.
    """
    root = tmp_path_factory.mktemp("packs")
    built: dict[tuple[str, int, str], Path] = {}

    def make(imgsz: int, storage: str = "raw", split: str = "train") -> Pack:
        key = (split, imgsz, storage)
        if key not in built:
            built[key] = open_or_build(synth_root / "data.yaml", split, imgsz, storage, out=root / f"{storage}-{imgsz}",
                                       rebuild="auto", progress=False, workers=2).path
        return Pack.open(built[key])

    return make


@pytest.fixture(scope="session")
def pose_root(tmp_path_factory) -> Path:
    """A small synthetic pose dataset (``task=pose``: 5 keypoints a figure), made once per session. Copy it before
    changing it."""
    root = tmp_path_factory.mktemp("synth-pose")
    synth.run(SynthConfig(out=str(root), n_train=16, n_val=6, imgsz=160, seed=5, classes=8, boxes=6, min_box=16,
                          task="pose", workers=2))
    return root


@pytest.fixture(scope="session")
def obb_root(tmp_path_factory) -> Path:
    """A small synthetic OBB dataset (``task=obb``: rows of 4 corners), made once per session. Copy it before
    changing it."""
    root = tmp_path_factory.mktemp("synth-obb")
    synth.run(SynthConfig(out=str(root), n_train=12, n_val=4, imgsz=128, seed=5, classes=8, boxes=6, min_box=12,
                          task="obb", workers=2))
    return root


@pytest.fixture(scope="session")
def segment_root(tmp_path_factory) -> Path:
    """A small synthetic segmentation dataset (``task=segment``: each figure's outline), made once per session. Copy
    it before changing it."""
    root = tmp_path_factory.mktemp("synth-segment")
    synth.run(SynthConfig(out=str(root), n_train=12, n_val=4, imgsz=128, seed=5, classes=8, boxes=6, min_box=12,
                          task="segment", workers=2))
    return root


@pytest.fixture()
def segment_dataset(segment_root, tmp_path) -> Path:
    """A private copy of the synthetic segmentation dataset (its data.yaml pointing at the copy)."""
    return copy_dataset(segment_root, tmp_path / "segment")


@pytest.fixture()
def obb_dataset(obb_root, tmp_path) -> Path:
    """A private copy of the synthetic OBB dataset (its data.yaml pointing at the copy)."""
    return copy_dataset(obb_root, tmp_path / "obb")


@pytest.fixture()
def pose_dataset(pose_root, tmp_path) -> Path:
    """A private copy of the synthetic pose dataset (its data.yaml pointing at the copy)."""
    return copy_dataset(pose_root, tmp_path / "pose")


@pytest.fixture
def stable_argsort(monkeypatch):
    """Ultralytics' ``np.argsort`` with ties in index order (``kind="stable"``), as yolofeed orders them: NumPy's SIMD
    sort orders ties by the machine (augment/geometry/copy_paste.py says why)."""
    import numpy as np

    argsort = np.argsort
    monkeypatch.setattr(np, "argsort", lambda a, *args, **kw: argsort(a, kind="stable"))
