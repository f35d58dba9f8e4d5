"""Build pack files in parallel, atomically, and open them only when they match their source.

One pass over the split: worker processes verify, decode and resize a sample each (the CPU cost:
JPEG decode dominates, ~2 ms per 640x480 image per core) and ``pwrite`` its pixels at an offset
they reserve from a shared counter, so payloads never travel back through a pipe; the parent only
collects metadata and labels. The file is written under a temporary name and renamed after its
trailer is written and synced: a build killed at any moment leaves no incomplete file that a reader
accepts (a temp file opens only once its trailer is written, i.e. whole; the pack's own name
appears only by the rename), and the next run removes the leftovers and builds again. A lock file serialises builders, so DDP ranks
that ask for the same pack wait for one build instead of racing.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import multiprocessing as mp
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from yolofeed import __version__
from yolofeed.config import PackConfig, usable_cores
from yolofeed.errors import DatasetError, PackError
from yolofeed.pack.source import SplitSource, load_data_yaml, split_source
from yolofeed.pack.store import INDEX_DTYPE, SUFFIX, Pack, _pwrite_all, align, write_tail
from yolofeed.pack.verify import SampleError, load_sample

LOGGER = logging.getLogger(__name__)
STORAGES = ("raw", "jpeg")
TMP_MARK = ".tmp-"  # temporary pack files are ".<split>.yfpack.tmp-<pid>-<token>"


def store_dir(yaml_file: str | os.PathLike, imgsz: int, storage: str, out: str | os.PathLike | None = None) -> Path:
    """Where the packs of a data yaml live: ``out``, or beside the yaml."""
    if out:
        return Path(out).expanduser().resolve()
    y = Path(yaml_file).resolve()
    return y.parent / "yolofeed-packs" / f"{y.stem}-{storage}-{imgsz}"


def rebuild_command(yaml_file: str, imgsz: int, storage: str, out: str | os.PathLike | None = None) -> str:
    """The exact command that rebuilds this pack, for error messages."""
    cmd = f"yolofeed pack data={yaml_file} imgsz={imgsz} format={storage}"
    return cmd + (f" out={out}" if out else "") + " rebuild=always"


@dataclass
class BuildResult:
    """What one split's build did, for the summary and the report file."""

    pack: Pack
    built: bool  # False: an up-to-date pack was reused
    seconds: float = 0.0


# -- worker side: runs in each build process ---------------------------------------------------
_W: dict[str, Any] = {}


def _init_worker(tmp_path: str, counter: Any, nc: int, imgsz: int, storage: str, capacity: int) -> None:
    fd = os.open(tmp_path, os.O_RDWR)
    # Raw packs are written through a shared mapping of the (sparse, pre-sized) file: 16 processes
    # copy into the page cache at ~12 GB/s, where pwrite serialises on the file's inode lock at
    # ~4.5 GB/s (measured on the H200 machine, BENCHMARKS.md).
    mm = mmap.mmap(fd, capacity) if capacity else None
    _W.update(fd=fd, mm=mm, counter=counter, nc=nc, imgsz=imgsz, storage=storage, capacity=capacity)
    import cv2

    cv2.setNumThreads(1)  # one image per process; OpenCV's own threads would only contend


def _close_worker() -> None:
    if _W.get("mm") is not None:
        _W.pop("mm").close()
    os.close(_W.pop("fd"))


def _process(task: tuple[int, str, str]) -> tuple:
    """Verify, decode and store one sample; returns its metadata (never its pixels)."""
    i, im_file, lb_file = task
    try:
        s = load_sample(im_file, lb_file, _W["nc"], _W["imgsz"], _W["storage"])
    except SampleError as e:
        return i, str(e), None
    except Exception as e:  # anything else Ultralytics would also count as corrupt: report, don't die
        return i, f"{type(e).__name__}: {e}", None
    payload = memoryview(np.ascontiguousarray(s.payload)).cast("B")
    with _W["counter"].get_lock():  # reserve [offset, offset + nbytes) in the shared file
        offset = _W["counter"].value
        _W["counter"].value = align(offset + payload.nbytes)
    if _W["mm"] is not None and offset + payload.nbytes <= _W["capacity"]:
        _W["mm"][offset:offset + payload.nbytes] = payload
    else:
        _pwrite_all(_W["fd"], payload, offset)
    return i, None, (offset, payload.nbytes, *s.ori_hw, *s.hw, s.labels, s.notes)


class _InProcess:
    """The pool interface for workers=1: no fork, easy to debug and profile."""

    def __init__(self, initializer: Any, initargs: tuple):
        initializer(*initargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        _close_worker()

    def map(self, fn: Any, it: Any, chunksize: int = 1) -> Iterator:
        return map(fn, it)


class _Writeback(threading.Thread):
    """Flush the file to disk every ``interval`` seconds while workers fill it.

    The kernel would start writing only at its dirty threshold (10 % of RAM), leaving the whole
    file to the final fsync (9 GB: ~4 s at the H200 machine's ~2.4 GB/s); flushing as we go
    overlaps that with decoding.
    """

    def __init__(self, fd: int, interval: float = 1.0):
        super().__init__(daemon=True)
        self.fd, self.interval, self.stop = fd, interval, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            os.fdatasync(self.fd)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.join()


# -- parent side ------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on a pack folder; removes temporary files of dead builders once held."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            LOGGER.info(f"pack: waiting for another process building in {folder} ...")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            for stale in folder.glob(f".*{SUFFIX}{TMP_MARK}*"):  # we hold the lock: no one else is writing
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_split(src: SplitSource, dest: Path, imgsz: int, storage: str = "raw", workers: int = 0,
                progress: bool = True, sync: bool = False) -> Pack:
    """Verify, decode and write every sample of ``src`` into the pack file ``dest``.

    Bad samples are skipped and listed in the header and in ``<split>.report.txt``. Call under
    ``_locked(dest.parent)``.

    Args:
        sync: fsync the file before publishing it, so it survives a power loss too. Without it the
            build is still atomic against a killed process (the page cache outlives the process)
            and the kernel writes the file back within about 30 s; a crash inside that window
            leaves a file that is short of its trailer, which ``Pack.open`` refuses. The cost is the
            disk's write time: about 4 s for the 9.3 GB synthetic 640-px pack on the H200 machine.

    Raises:
        DatasetError: no sample of the split is usable (the message lists the commonest reasons).
    """
    if storage not in STORAGES:
        raise PackError(f"format={storage}: expected one of {', '.join(STORAGES)}")
    t0 = time.perf_counter()
    n = len(src.im_files)
    workers = max(1, min(workers or usable_cores(), n))
    tmp = dest.with_name(f".{dest.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fingerprint = src.fingerprint()
    try:
        ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
        counter = ctx.Value("Q", 0)
        # Raw payloads are at most imgsz x imgsz x 3. Reserve that much up front (write_tail gives
        # back what was not used): on a sparse file every first write to a page allocates a block
        # under the filesystem journal, which held 16 writers to ~1,000 img/s on the H200 machine.
        capacity = n * align(imgsz * imgsz * 3) if storage == "raw" else 0
        _reserve(fd, capacity)
        initargs = (str(tmp), counter, src.nc, imgsz, storage, capacity)
        pool = (ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=initargs)
                if workers > 1 else _InProcess(_init_worker, initargs))
        index = np.zeros(n, INDEX_DTYPE)
        labels: list[np.ndarray | None] = [None] * n
        skipped: list[tuple[str, str]] = []
        notes: list[tuple[str, str]] = []
        tasks = zip(range(n), src.im_files, src.label_files)
        chunk = max(1, min(64, n // (workers * 8)))
        with pool, (_Writeback(fd) if sync else contextlib.nullcontext()):
            bar = tqdm(pool.map(_process, tasks, chunksize=chunk), total=n, unit="img", disable=not progress,
                       desc=f"pack {src.split}")
            for i, reason, meta in bar:
                if reason is not None:
                    skipped.append((src.im_files[i], reason))
                    bar.set_postfix(skipped=len(skipped), refresh=False)
                    continue
                off, nbytes, h0, w0, h, w, lb, sample_notes = meta
                index[i] = (off, nbytes, h0, w0, h, w, 0, len(lb), 0)
                labels[i] = lb
                notes += [(src.im_files[i], note) for note in sample_notes]
        keep = np.array([lb is not None for lb in labels], bool)
        if not keep.any():
            top = Counter(r for _, r in skipped).most_common(3)
            raise DatasetError(f"no usable image in split '{src.split}' of {src.yaml_file} ({n} tried). "
                               "Commonest reasons:\n  " + "\n  ".join(f"{c}x {r}" for r, c in top))
        index = index[keep]
        kept_labels = [lb for lb in labels if lb is not None]
        counts = np.array([len(lb) for lb in kept_labels], np.int64)
        index["label_start"] = np.concatenate([[0], np.cumsum(counts)[:-1]])
        table = np.concatenate(kept_labels) if counts.sum() else np.zeros((0, 5), np.float32)
        files = [f for f, k in zip(src.im_files, keep) if k]
        seconds = time.perf_counter() - t0
        header = {
            "yolofeed_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "split": src.split, "imgsz": imgsz, "storage": storage, "channels": 3, "color": "RGB",
            "resize": "long side to imgsz, cv2.INTER_LINEAR, as Ultralytics BaseDataset.load_image",
            "source": {"data": src.yaml_file, "paths": list(src.paths), "nc": src.nc, "names": list(src.names),
                       "fingerprint": fingerprint},
            "counts": {"images": int(keep.sum()), "boxes": int(counts.sum()), "skipped": len(skipped),
                       "tried": n, "data_bytes": int(index["nbytes"].sum())},
            "skipped": skipped, "notes": notes,
            "build": {"workers": workers, "seconds": round(seconds, 3), "sync": sync},
        }
        write_tail(fd, counter.value, index, table, files, header)
        t_sync = time.perf_counter()
        if sync:
            os.fsync(fd)  # the rename below must not publish a file whose bytes are not on disk
        os.close(fd)
        fd = -1
        os.replace(tmp, dest)
        if sync:
            _fsync_dir(dest.parent)
        LOGGER.debug(f"pack {src.split}: filled in {seconds:.2f} s, synced in {time.perf_counter() - t_sync:.2f} s")
    except BaseException:  # KeyboardInterrupt included: leave nothing half-written behind
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    _write_report(dest, skipped, notes)
    return Pack.open(dest)


def _reserve(fd: int, nbytes: int) -> None:
    """Allocate ``nbytes`` of disk for the file; a sparse file where the disk or filesystem can't."""
    if not nbytes:
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:  # ENOSPC for the upper bound, EOPNOTSUPP on some filesystems: slower, still correct
        LOGGER.info(f"pack: could not reserve {nbytes / 1e9:.1f} GB up front ({e.strerror}); writing a sparse file")
        os.ftruncate(fd, nbytes)


def _fsync_dir(folder: Path) -> None:
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _write_report(dest: Path, skipped: list[tuple[str, str]], notes: list[tuple[str, str]]) -> Path:
    """``<split>.report.txt``: one line per skipped sample and per note, tab-separated."""
    report = dest.with_name(dest.name.removesuffix(SUFFIX) + ".report.txt")
    lines = [f"# {dest.name}: {len(skipped)} skipped, {len(notes)} notes. file<TAB>status<TAB>reason"]
    lines += [f"{f}\tskipped\t{r}" for f, r in skipped] + [f"{f}\tnote\t{r}" for f, r in notes]
    tmp = report.with_name(f".{report.name}{TMP_MARK}{os.getpid()}")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, report)
    return report


def ensure_split(data: str | os.PathLike | dict, split: str = "train", imgsz: int = 640, storage: str = "raw",
                 out: str | os.PathLike | None = None, rebuild: str = "never", workers: int = 0,
                 progress: bool = True, sync: bool = False) -> BuildResult:
    """Open the pack of one split, building it if asked to.

    Args:
        data: data yaml path, or a dict from ``load_data_yaml``.
        rebuild: "never" refuses a missing or stale pack with the command that fixes it; "auto"
            builds it; "always" builds even an up-to-date one.
        sync: see ``build_split``.

    Raises:
        PackError / StalePackError: with rebuild="never", the pack is missing, unreadable or stale.
        DatasetError: the data yaml or the split is unusable.
    """
    if rebuild not in ("never", "auto", "always"):
        raise PackError(f"rebuild={rebuild}: expected never, auto or always")
    d = data if isinstance(data, dict) else load_data_yaml(data)
    src = split_source(d, split)
    dest = store_dir(d["yaml_file"], imgsz, storage, out) / f"{split}{SUFFIX}"
    fix = f"rebuild it with: {rebuild_command(d['yaml_file'], imgsz, storage, out)}"
    expect = {"data": src.yaml_file, "imgsz": imgsz, "storage": storage, "fingerprint": src.fingerprint()}
    if rebuild != "always" or dest.exists():
        try:
            if rebuild != "always":
                return BuildResult(Pack.open(dest, expect, fix), built=False)
        except PackError as e:
            if rebuild == "never":
                raise
            if dest.exists():
                LOGGER.info(f"pack: {e}. Rebuilding.")
    with _locked(dest.parent):
        if rebuild == "auto":  # another process may have built it while we waited for the lock
            with contextlib.suppress(PackError):
                return BuildResult(Pack.open(dest, expect, fix), built=False)
        t0 = time.perf_counter()
        pack = build_split(src, dest, imgsz, storage, workers, progress, sync)
        return BuildResult(pack, built=True, seconds=time.perf_counter() - t0)


def open_or_build(data: str | os.PathLike | dict, split: str = "train", imgsz: int = 640, storage: str = "raw",
                  out: str | os.PathLike | None = None, rebuild: str = "never", workers: int = 0,
                  progress: bool = True, sync: bool = False) -> Pack:
    """The pack of one split, valid for ``imgsz``/``storage`` and the current source files.

    See ``ensure_split`` for the arguments and errors.
    """
    return ensure_split(data, split, imgsz, storage, out, rebuild, workers, progress, sync).pack


def summary(result: BuildResult, max_listed: int = 10) -> str:
    """A few lines for the terminal: images, boxes, skipped with reasons, bytes, build rate."""
    p, h = result.pack, result.pack.header
    c = h["counts"]
    size = p.path.stat().st_size
    lines = [f"pack {p.split}: {c['images']:,} images, {c['boxes']:,} boxes, {c['skipped']} skipped, "
             f"{size / 1e9:.2f} GB ({p.storage}, imgsz {p.imgsz})"]
    if result.built:
        rate = c["tried"] / max(result.seconds, 1e-9)
        synced = ", synced to disk" if h["build"].get("sync") else ""
        lines[0] += f", built in {result.seconds:.1f} s ({rate:,.0f} img/s, {h['build']['workers']} workers{synced})"
    else:
        lines[0] += f", up to date (built {h['created']})"
    for f, r in h["skipped"][:max_listed]:
        lines.append(f"  skipped {f}: {r}")
    if len(h["skipped"]) > max_listed:
        lines.append(f"  ... {len(h['skipped']) - max_listed} more skipped")
    for note, count in Counter(n.split(":")[0] for _, n in h["notes"]).most_common(5):
        lines.append(f"  note: {count}x {note}")
    if h["skipped"] or h["notes"]:
        lines.append(f"  full list: {p.path.with_name(p.split + '.report.txt')}")
    lines.append(f"  -> {p.path}")
    return "\n".join(lines)


def run(cfg: PackConfig) -> list[BuildResult]:
    """``yolofeed pack``: build or check the packs of every requested split and print a summary."""
    d = load_data_yaml(cfg.data)
    splits = [s.strip() for s in cfg.splits.split(",") if s.strip()]
    results = []
    for split in splits:
        r = ensure_split(d, split, cfg.imgsz, cfg.format, cfg.out, cfg.rebuild, cfg.workers, sync=cfg.sync)
        print(summary(r), flush=True)
        results.append(r)
    return results


def read_report(dest: Path) -> list[list[str]]:
    """Rows of a pack's report file (for tests and the doctor)."""
    report = dest.with_name(dest.name.removesuffix(SUFFIX) + ".report.txt")
    return [line.split("\t") for line in report.read_text(encoding="utf-8").splitlines()[1:]]


__all__ = ["BuildResult", "build_split", "ensure_split", "open_or_build", "rebuild_command", "run", "store_dir",
           "summary"]
