"""Host -> device without stalling training: a thread fills pinned slots, a side stream copies them.

One background thread walks the epoch's batches: it waits until a ring slot is free (its last
device copy consumed), gathers the batch from the pack's memory map into the slot's pinned buffers
(memcpy at page-cache speed, GIL released by numpy), and starts an asynchronous copy to the slot's
device buffers on its own CUDA stream, recording an event. The training thread makes its stream
wait on that event, never on the disk, and records a "consumed" event once it has moved on, which
frees the slot. ffcv's epoch iterator and timm's PrefetchLoader are the models.

The pack's codec (``yolofeed.pack.codecs``) makes the pixels, in one of two places. On the host
(``Codec.gather``: a raw pack's memcpy, or a jpeg pack's ``decode="cv2"`` on two threads) into the pinned
buffer, which is copied to the device. Or on the device (``Codec.decode``, when ``decodes_on_device``:
a jpeg pack's ``decode="torchvision"``, nvJPEG on CUDA): only labels go through the pinned buffers, the
codec stages the batch's payloads in one more pinned buffer (``Codec.staging_bytes``) and writes the images
straight into the slot's device buffer, on the same side stream. ``auto`` lets the codec choose (jpeg:
torchvision on CUDA, cv2 elsewhere).

The thread outlives an epoch when told what comes next (``iterate(batches, then=next_batches)``, the train
loader's next epoch; ``start(batches)`` before the first): as the last batches of an epoch free their slots it
loads the next epoch's first ones, during Ultralytics' epoch end (validation, checkpoint) or the warm-up before the
first epoch, so an epoch's first step does not wait for the thread's start, its first gather or decode, or (first
epoch) nvJPEG's set-up and the place kernel's compile. ``iterate`` picks them up if its batches are the ones
loaded (a resume, a NaN-recovery redo or an out-of-memory retry asks for others: those are dropped and loading
starts again).

On a machine without CUDA the same code runs with plain memory and no streams; ``sync=True``
gathers in the caller's thread instead (the tests compare the two).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from yolofeed import processes
from yolofeed.errors import ConfigError, PackError
from yolofeed.loader.batch import HostBuffers, gather, label_width
from yolofeed.loader.labels import LabelView
from yolofeed.pack import Pack
from yolofeed.schema import SourceBatch

LOGGER = logging.getLogger(__name__)
STOP_WAIT_S = 30.0  # how long a stop waits for the loader thread: one batch's gather or decode, at most

_STOP = object()
DECODERS = ("auto", "torchvision", "cv2")


class LoaderError(RuntimeError):
    """The background thread failed; the message names the batch, the pack and the cause (chained)."""


def decodes_on_device(pack: Pack, device: torch.device, decode: str) -> bool:
    """Whether the pack's codec makes the images on ``device`` (``Codec.decode``), else on the host (``gather``).

    Raises:
        ConfigError: ``decode`` is not one of ``DECODERS``.
    """
    if decode not in DECODERS:
        raise ConfigError(f"decode={decode!r}: expected one of {', '.join(DECODERS)} (auto: torchvision on CUDA, "
                          "cv2 elsewhere)")
    return pack.codec.decodes_on_device(device, decode)


@dataclass
class LoadedBatch:
    """A batch on the device, ready for augmentation.

    ``source`` views the slot's device buffers: valid until the next batch is requested.
    """

    source: SourceBatch
    indices: np.ndarray
    im_file: list[str]


class _Slot:
    def __init__(self, pack: Pack, batch: int, device: torch.device, on_device: bool, labels: LabelView):
        pin = device.type == "cuda"
        width = label_width(pack, labels)
        k = 0 if labels.keypoints is None else labels.keypoints.shape[1]  # pose: K keypoints a label, one more copy
        rows = {"keypoints": k, "corners": labels.corners is not None,  # OBB: 4 corners a label
                "polygons": labels.polygon_width}  # segment: the longest polygon's points a label
        self.host = HostBuffers.allocate(batch, pack.imgsz, width, pin, images=not on_device, **rows)
        if device.type == "cpu":
            self.dev = HostBuffers.allocate(batch, pack.imgsz, width, False, **rows)
        else:
            s = pack.imgsz
            self.dev = self.host.like(torch.empty((batch, s, s, 3), dtype=torch.uint8, device=device), device)
        self.copied = torch.cuda.Event() if pin else None
        self.consumed = torch.cuda.Event() if pin else None
        self.n = 0


def _source(buf: HostBuffers, n: int) -> SourceBatch:
    lab = buf.labels[:n]
    width = lab.shape[1]
    valid = torch.arange(width, device=lab.device)[None, :] < buf.counts[:n, None]
    def rows(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[:n]
    return SourceBatch(buf.images[:n], buf.hw[:n], lab[..., 0], lab[..., 1:], valid, rows(buf.keypoints),
                       rows(buf.corners), rows(buf.polygons), rows(buf.polygon_lengths))


class Prefetcher:
    """Iterate over device batches for a list of index arrays, ``slots`` batches ahead.

    Args:
        pack: where the samples come from.
        device: where batches are delivered.
        max_batch: largest batch the sampler produces.
        slots: ring size; 3 lets one batch be gathered while one copies and one trains.
        sync: gather in the calling thread (tests, debugging).
        decode: for codecs that decode (jpeg): "torchvision" decodes on ``device`` (nvJPEG on CUDA,
            libjpeg-turbo on the CPU), "cv2" on two host threads, "auto" lets the codec choose (jpeg:
            torchvision on CUDA, cv2 elsewhere).
        labels: the labels to deliver (``classes``/``single_cls`` applied, ``LabelView``); None: the pack's.

    Raises:
        ConfigError: an unknown ``decode``.
    """

    def __init__(self, pack: Pack, device: torch.device | str, max_batch: int, slots: int = 3, sync: bool = False,
                 decode: str = "auto", labels: LabelView | None = None):
        self.pack, self.device, self.sync = pack, torch.device(device), sync
        self.labels = LabelView.of(pack) if labels is None else labels
        self.on_device = decodes_on_device(pack, self.device, decode)
        self.slots = [_Slot(pack, max_batch, self.device, self.on_device, self.labels)
                      for _ in range(1 if sync else slots)]
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # One staging buffer serves every slot: batches are decoded one at a time, and ``decode`` waits for the
        # side stream's reads of the last batch before refilling it.
        staged = pack.codec.staging_bytes(pack, max_batch) if self.on_device else 0
        self.staging = (torch.empty(staged, dtype=torch.uint8, pin_memory=self.device.type == "cuda")
                        if staged else None)
        # the loader thread while there is one: a list, so that the finalizer below shares it without holding self
        self._running: list[_Thread] = []
        self._queued: deque[list[np.ndarray]] = deque()  # the epochs handed to the thread and not yet iterated
        # a loader thread waiting for a next epoch that never comes must not keep the slots' buffers (pinned host
        # and device memory) alive: it holds no reference to its Prefetcher, which stops it when dropped
        weakref.finalize(self, _stop_all, self._running)

    # -- producer -------------------------------------------------------------------------
    def _fill(self, slot: _Slot, indices: np.ndarray) -> None:
        n = slot.n = gather(self.pack, indices, slot.host, images=not self.on_device, labels=self.labels)
        skip = 1 if self.on_device else 0  # images come from the codec's decode, not from the host buffer
        pairs = list(zip(slot.host.tensors(), slot.dev.tensors()))[skip:]
        if self.stream is not None:
            with torch.cuda.stream(self.stream):  # host -> device on the side stream, from pinned memory
                for h, d in pairs:
                    d[:n].copy_(h[:n], non_blocking=True)
                if self.on_device:
                    self._decode(slot, indices)
                slot.copied.record(self.stream)
        else:
            for h, d in pairs:
                d[:n].copy_(h[:n])
            if self.on_device:
                self._decode(slot, indices)

    def _decode(self, slot: _Slot, indices: np.ndarray) -> None:
        """The batch's payloads, decoded by the pack's codec into the slot's device images (current stream)."""
        self.pack.codec.decode(self.pack, np.asarray(indices, np.int64), slot.dev.images[:slot.n], self.staging)

    def _error(self, e: Exception, k: int, n: int) -> Exception:
        """What the training thread raises for a failure while loading batch ``k`` of ``n``.

        A damaged pack (``PackError``: bytes that no longer decode; or any failure once another program wrote into
        the file while it was read, ``Pack.changed``: offsets that no longer fit, say) is the user's to fix, in one
        line with the command that rebuilds this very pack; anything else is a ``LoaderError`` with its cause chained.
        """
        what = "epoch" if self.pack.split == "train" else "validation"  # a val or test split's pack: a validation's
        where = f"the loader thread stopped at batch {k + 1} of {n} of the {what}, reading {self.pack.path}"
        fix = "" if self.pack.fix in str(e) else f"; {self.pack.fix}"  # said once
        if isinstance(e, PackError):
            err: Exception = PackError(f"{where}: {e}{fix}")
        elif self.pack.changed():
            err = PackError(f"{where}: the file changed since it was opened (another program wrote into it), and "
                            f"the batch could not be read from it ({type(e).__name__}: {e}){fix}")
        else:
            err = LoaderError(f"{where}: {type(e).__name__}: {e}")
        err.__cause__ = e  # the traceback shows where in the thread it failed
        return err

    # -- consumer -------------------------------------------------------------------------
    def _deliver(self, k: int, indices: np.ndarray) -> LoadedBatch:
        slot = self.slots[k]
        if slot.copied is not None:
            torch.cuda.current_stream(self.device).wait_event(slot.copied)  # a GPU-side wait: no host sync
        files = self.pack.im_files
        return LoadedBatch(_source(slot.dev, slot.n), np.asarray(indices), [files[i] for i in indices])

    def _release(self, k: int, free: queue.Queue) -> None:
        if not self.slots:  # the loader let go of its slots (release) while a pass it abandoned was suspended
            return
        slot = self.slots[k]
        if slot.consumed is not None:
            slot.consumed.record(torch.cuda.current_stream(self.device))
        free.put(k)

    @property
    def _thread(self) -> threading.Thread | None:
        return self._running[0].worker.thread if self._running else None

    def _queue(self, batches: list[np.ndarray]) -> None:
        for k, indices in enumerate(batches):
            self._running[0].todo.put((indices, k, len(batches)))
        self._queued.append(batches)

    def start(self, batches: list[np.ndarray]) -> None:
        """Start loading ``batches`` now; ``iterate`` with the same batches yields them (nothing in sync mode)."""
        self._check_held()
        if self.sync or (self._queued and _same(self._queued[0], batches)):
            return
        self.close()
        self._running.append(_Thread(self, len(self.slots)))  # every slot free, nothing to load yet
        self._queue(batches)

    def iterate(self, batches: list[np.ndarray], then: list[np.ndarray] | None = None) -> Iterator[LoadedBatch]:
        """Yield the batches in order; each is valid until the next one is requested.

        Args:
            then: the batches the next ``iterate`` will most likely ask for (the next epoch's): the thread goes on
                into them as slots free up. None: the thread ends with these batches.
        """
        self._check_held()
        if self.sync:
            yield from self._iterate_here(batches)
            return
        self.start(batches)  # what is loaded already if these are the batches queued first, else a fresh thread
        t = self._running[0]  # this pass's thread: a later pass or close() may replace it
        if then is not None:
            self._queue(then)
        else:
            t.todo.put(_STOP)
        ready, free, out = t.ready, t.free, None
        try:
            for _ in range(len(batches)):
                item = processes.get(ready)  # timed: Ctrl-C cuts a wait for a read that hangs short
                if item is _STOP:  # close(), or a later pass, stopped this pass's thread
                    raise LoaderError("the loader was closed while this pass was iterating it; iterate it again")
                if isinstance(item, BaseException):
                    raise item
                out, indices = item
                yield self._deliver(out, indices)
                self._release(out, free)
                out = None
        except BaseException:  # abandoned (GeneratorExit) or failed mid-epoch: what was loaded ahead is out of order
            if out is not None:  # work already enqueued may still read the slot handed out: its next fill waits
                self._release(out, free)
            if next(iter(self._running), None) is t and not t.stopping.is_set():  # read once: another thread may
                # empty the list meanwhile
                self.close()
            else:  # a later pass's thread (its start waited for this one), or one another thread stops and waits
                t.ask_to_stop()  # for (close() in the trainer's teardown): not this pass's to wait for or forget
            raise
        if next(iter(self._running), None) is t and self._queued:
            self._queued.popleft()

    def _iterate_here(self, batches: list[np.ndarray]) -> Iterator[LoadedBatch]:
        """Sync mode: each batch gathered in the caller's thread into the one slot."""
        slot = self.slots[0]
        for k, indices in enumerate(batches):
            if slot.consumed is not None:  # one slot: the GPU must be done with the last batch (a host wait;
                slot.consumed.synchronize()  # sync mode is for tests and debugging)
            try:
                self._fill(slot, indices)
            except PackError as e:
                raise self._error(e, k, len(batches)) from e
            yield self._deliver(0, indices)
            if slot.consumed is not None:
                slot.consumed.record(torch.cuda.current_stream(self.device))

    def stop_soon(self) -> None:
        """Tell the background thread to stop, and a pass iterating to raise, without waiting (``close`` waits)."""
        for t in list(self._running):
            t.ask_to_stop()

    def close(self) -> None:
        """Stop the background thread (mid-epoch too), wait for it, and drop what it loaded ahead."""
        self._queued.clear()  # first: a stop cut short (Ctrl-C) leaves nothing that looks loaded to the next start
        _stop_all(self._running)

    def release(self) -> None:
        """``close``, then let go of the pack and the slots' buffers (pinned host and device memory: about 0.5 GB for
        batch 128 at 640), for good: the run is over, and its trainer, which a notebook's YOLO object keeps, holds
        this loader. Iterating it afterwards raises ``LoaderError``."""
        self.close()
        self.slots, self.staging, self.pack, self.labels = [], None, None, None

    def _check_held(self) -> None:
        if self.pack is None:
            raise LoaderError("this loader let go of its pack when its run ended (release); make a new one")


class _Thread:
    """A loader thread and its queues. It reaches its Prefetcher through a weak reference, and holds it only while
    it fills a slot: a Prefetcher dropped while its thread waits is collected, and its finalizer stops the thread."""

    def __init__(self, owner: Prefetcher, slots: int):
        self.todo: queue.Queue = queue.Queue()  # (indices, k, n): batch k of an epoch of n, in load order
        self.free: queue.Queue = queue.Queue()  # slot numbers the thread may fill
        self.ready: queue.Queue = queue.Queue()  # (slot, indices) filled, or the thread's exception
        for k in range(slots):
            self.free.put(k)
        self.stopping = threading.Event()
        self.worker = processes.Daemon(_produce, weakref.ref(owner), self, name="yolofeed-loader")

    def stop(self) -> bool:
        """Stop the thread (mid-epoch too) and wait for it up to ``STOP_WAIT_S``, unless this is that thread (a
        finalizer run there). Returns whether it ended."""
        self.ask_to_stop()
        return self.worker.is_current() or self.worker.ended.wait(STOP_WAIT_S)

    def ask_to_stop(self) -> None:
        """Tell the thread to stop after what it does now, and a pass waiting on it to raise; wait for nothing."""
        self.stopping.set()
        self.free.put(_STOP)
        self.todo.put(_STOP)
        self.ready.put(_STOP)  # a pass still waiting on this thread raises instead of waiting for good


def _stop_all(running: list[_Thread]) -> None:
    """Stop the loader threads. One is forgotten only once its stop returned: a stop cut short by Ctrl-C leaves it
    here, and the next (the trainer's teardown, with signals deferred) waits for it again. Two threads may stop the
    same ones at once (the teardown's close, and the pass a validation iterates, ended by it)."""
    while running:
        try:
            t = running[-1]
        except IndexError:  # emptied by the other meanwhile
            return
        if not t.stop():
            LOGGER.warning(f"yolofeed: the loader thread did not stop within {STOP_WAIT_S:g} s (a read of the pack "
                           "that does not return?); going on without it")
            processes.left_running("the loader thread")
        with contextlib.suppress(ValueError):  # forgotten by the other meanwhile
            running.remove(t)


def _produce(owner: weakref.ref[Prefetcher], t: _Thread) -> None:
    k = n = 0
    try:
        while True:
            item = t.todo.get()
            if item is _STOP or t.stopping.is_set():
                return
            indices, k, n = item
            slot_k = t.free.get()
            if slot_k is _STOP or t.stopping.is_set():
                return
            p = owner()
            if p is None:
                return
            slot = p.slots[slot_k]
            if slot.consumed is not None:
                slot.consumed.synchronize()  # the GPU has finished with this slot's device buffers
            p._fill(slot, indices)
            del p, slot  # no reference while waiting: see _Thread
            t.ready.put((slot_k, indices))
    except Exception as e:  # handed to the consumer, which raises it in the training thread
        if t.stopping.is_set():  # stopped meanwhile (close, release: the pack let go): nobody waits for this batch
            return
        p = owner()
        t.ready.put(p._error(e, k, n) if p is not None else e)
    except BaseException as e:
        t.ready.put(e)


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Whether two epochs' batch lists are the same batches in the same order (~80 array compares at 10k images)."""
    return len(a) == len(b) and all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, b))


def to_device_source(source: SourceBatch, device: torch.device | str) -> SourceBatch:
    """A copy of a SourceBatch on another device (tests, tools), its optional label kinds too (polygons with their
    lengths, and as a partner pool's ring keeps them, resampled)."""
    extra = (*source.kinds(), *(k for k in ("polygon_lengths", "resampled_polygons", "resampled_points")
                                if getattr(source, k) is not None))
    return SourceBatch(*(t.to(device) for t in (source.images, source.hw, source.cls, source.boxes, source.valid)),
                       **{k: getattr(source, k).to(device) for k in extra})


__all__ = ["LoadedBatch", "LoaderError", "Prefetcher", "to_device_source"]
