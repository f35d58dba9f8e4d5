"""The checkpoints of each epoch written in a thread beside the training, in the order queued.

Ultralytics' ``save_model`` serialises the checkpoint, then writes last.pt and best.pt (``write_bytes``): two 26 MB
files for yolo11n with AdamW's state, each written atomically and fsynced (``checkpoints.write_run_file``), about
0.08 s an epoch of the training thread on an H100 machine while the GPU waits for it. Here ``QueuedPath.write_bytes``
queues the write in ``WRITES``' thread and returns; the serialisation stays in the training thread (in a thread
beside it, its pickling slowed the training by as much as it saved).

Wherever the files may be read, the write is waited for first:

* any read through the path itself (``open``, ``os.stat``, ``torch.load``: each goes through ``__fspath__``), as
  Ultralytics' NaN recovery reads last.pt;
* the trainer waits for a folder's writes at each epoch's end, in ``save_model`` where a callback at one of the
  training loop's events may read the files by name, before the final validation, and as the run stops;
* the interpreter's exit waits for the thread (not a daemon).

A failed write (a full disk) is kept for its folder, recorded before its future completes, and handed over once:
raised by ``raise_failure`` (at each batch's end: a dictionary's look-up) or by ``wait``. The file it was to replace
is whole (the write is atomic).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from yolofeed import processes
from yolofeed.train.checkpoints import AtomicPath, write_run_file

THREAD = "yolofeed-checkpoints"  # the writer thread's name prefix
SLOW_S = 1.0  # a wait for writes this long is said (a slow or hung disk): a stopped run otherwise waits in silence


class Writes:
    """Files written in one thread of their own, in the order queued, each by ``write`` (path, data).

    Each queued write is kept by its file until it ends; a failed one's error by its folder until handed over.
    """

    def __init__(self, write: Callable[[Path, Any], int] = write_run_file):
        self._write = write
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[str, list[Future]] = {}  # file -> its writes, the ended ones pruned at each queueing
        self._failed: dict[str, BaseException] = {}  # folder -> its first failed write not handed over yet

    def write(self, path: str | os.PathLike, data: Any) -> int:
        """Queue ``data`` (held, not copied: ``save_model``'s serialised ``bytes``) for ``path``; its size, as
        ``Path.write_bytes`` returns. Where no thread takes it (the interpreter is exiting), written here once the
        queued writes of that file ended."""
        target = Path(str(path))  # a plain path: the thread's own opens never wait for themselves
        if self._submit([target], lambda: self._write(target, data)) is None:
            self.wait_file(target)
            return self._write(target, data)
        return memoryview(data).nbytes

    def run(self, paths: list[str | os.PathLike], fn: Callable[[], Any]) -> None:
        """Queue ``fn()``, which writes ``paths`` (files of one folder), behind the queued writes: each path's readers
        and its folder's ``wait`` wait for it as for a write, and its failure is the folder's. Where no thread takes it
        (the interpreter is exiting), run here once the queued writes of those files ended."""
        targets = [Path(str(p)) for p in paths]
        if self._submit(targets, fn) is None:
            for target in targets:
                self.wait_file(target)
            fn()

    def _submit(self, targets: list[Path], fn: Callable[[], Any]) -> Future | None:
        """``fn()`` queued in the thread for ``targets`` (files of one folder); None where no thread takes it."""
        with self._lock:
            self._pending = {k: left for k, fs in self._pending.items() if (left := [f for f in fs if not f.done()])}
            try:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix=THREAD)
                future = self._pool.submit(self._ran, targets[0].parent, fn)
            except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
                return None
            for target in targets:
                self._pending.setdefault(str(target), []).append(future)
        return future

    def _ran(self, folder: Path, fn: Callable[[], Any]) -> Any:
        """In the thread: ``fn()``; its failure kept for ``folder`` before the future completes, so that a wait that
        returns has it."""
        try:
            return fn()
        except BaseException as e:
            with self._lock:
                self._failed.setdefault(str(folder), e)
            raise

    def wait_file(self, path: str | os.PathLike) -> None:
        """Wait for the queued writes of ``path`` (a str or plain path: a ``QueuedPath``'s ``__fspath__`` waits
        itself); their failures stay for ``raise_failure`` and ``wait``."""
        with self._lock:
            futures = list(self._pending.get(str(path), ()))
        if futures:
            processes.wait_all(futures)

    def wait(self, folder: str | os.PathLike, raise_failure: bool = True,
             slow: Callable[[int], None] | None = None) -> BaseException | None:
        """Wait for every queued write into ``folder``; then its first failure, raised (``raise_failure``) or
        returned, and forgotten. ``slow`` is told how many writes are left where they have not ended within
        ``SLOW_S``. Ctrl-C cuts the wait short (``processes.wait_all``)."""
        key = str(folder)
        with self._lock:
            futures = [f for file, fs in self._pending.items() if str(Path(file).parent) == key for f in fs]
        if futures:
            if slow is not None and (left := concurrent.futures.wait(futures, SLOW_S).not_done):
                slow(len(left))
            processes.wait_all(futures)
        return self.raise_failure(folder) if raise_failure else self._take_failure(folder)

    def raise_failure(self, folder: str | os.PathLike) -> None:
        """Raise the first failed write into ``folder`` not handed over yet, without waiting; nothing where none
        failed."""
        error = self._take_failure(folder)
        if error is not None:
            raise error

    def _take_failure(self, folder: str | os.PathLike) -> BaseException | None:
        with self._lock:
            return self._failed.pop(str(folder), None)


WRITES = Writes()  # the process's: a path's class cannot hold a trainer's own


class QueuedPath(AtomicPath):
    """A path whose ``write_bytes`` queues the write in ``WRITES``' thread (atomic there), and whose readers, through
    ``os.fspath`` (``open``, ``os.stat``, ``torch.load``), wait for it first; everything else is Path's."""

    def write_bytes(self, data: Any) -> int:
        return WRITES.write(self, data)

    def __fspath__(self) -> str:
        WRITES.wait_file(str(self))
        return str(self)
