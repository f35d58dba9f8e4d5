"""Augment one batch ahead, so the host never waits for the GPU to learn a batch's box count.

Ultralytics' batch has one row per box, so building it needs N, the number of valid boxes after
augmentation; read straight away, N costs a host sync on every step (the host waits ~2.5 ms of
augmentation kernels before it may launch the forward pass). ``AugmentAhead`` wraps the train
loader: when the trainer asks for batch k, it fetches loader batch k+1, finishes batch k, then
launches batch k+1's augmentation together with an asynchronous copy of its N to pinned host
memory and an event after that copy. Batch k+1 is finished on the next request: its event was
recorded a whole step earlier, before step k's forward pass, so ``event.synchronize()`` returns at
once in steady state and N is read from host memory. No stream-wide sync.

Why batch k is finished *before* k+1 is launched: ``GraphedAugment`` returns the graph's static
memory, which the next replay overwrites. Finishing k means enqueuing its flattening (new tensors)
and its ``img.float()`` (a new tensor) ahead of k+1's replay, so stream order keeps k intact. The
float conversion is the one Ultralytics' ``preprocess_batch`` would do anyway (its ``.float()`` is
then a no-op and ``/ 255`` gives the same values), so this costs no extra kernel or copy, and the
peak stays at two float images (batch k-1's, still held by the trainer, and batch k's, where the
plain path holds the ``.float()`` temporary and its ``/ 255``). A second graph would hold another
157 MB output at batch 128 x 640 px, a clone the same plus a copy per step. Draws stay in batch
order: one augmentation call per batch, in loader order, from the same generator.

Why the loader's slot is not recycled too early: the augmentation is the only reader of a loader
batch, and it is enqueued on the current stream as soon as the batch arrives, before the next
request makes the ``Prefetcher`` record that slot's ``consumed`` event on the same stream
(``_release``); the slot is refilled only once the GPU has passed that event. So no change there.

Lookahead never crosses an epoch: each ``iter()`` starts a fresh pass (the first request launches
and finishes two batches), so a ``close_mosaic`` switch between epochs applies from the first
batch of the next. An abandoned pass (break, exception, resume) closes the loader's iterator and
drops the pending batch; its kernels simply run to completion. On the CPU the same code runs
eagerly: no event, and N is read from the augmented batch directly.

Accounting: the launch now happens inside ``next(loader)``, so the monitor's ``data_wait`` holds the
augmentation's host launch time (a fraction of a millisecond) and ``preprocess`` holds less.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from yolofeed.schema import AugmentedBatch, SourceBatch
from yolofeed.train.loss import CANDIDATES, MAX_BOXES


@dataclass
class _Pending:
    """An augmentation in flight: its output, its box count (host memory on CUDA) and the event after the copy."""

    out: AugmentedBatch
    count: Tensor  # (1 to 3,) int64: boxes; the most in one image and the candidates, for train/loss/;
    # pinned host memory on CUDA, written by an async copy
    ready: torch.cuda.Event | None  # recorded after that copy; None on the CPU (nothing in flight)
    im_file: list[str]


class AugmentAhead:
    """A train loader that yields Ultralytics' batches, each augmented one request before it is handed out.

    Yields dicts with ``img`` (B, 3, S, S) float32 in [0, 255] (Ultralytics' ``preprocess_batch``
    divides by 255), or what ``convert`` makes of the uint8 image, ``cls`` (N, 1), ``bboxes`` (N, 4)
    normalised xywh, ``batch_idx`` (N,), ``im_file``, and with ``candidates`` the loss's counts
    (train/loss/): ``max_boxes`` (an int) and, once ``candidates`` can say, ``tal_candidates``. Every
    other attribute (``dataset``, ``sampler``, ``batch_size``, ``reset``, ``close``...) is the wrapped
    loader's.

    Args:
        loader: yields dicts with ``source`` (a ``SourceBatch`` valid until the next request) and ``im_file``.
        augment: ``SourceBatch -> AugmentedBatch``, called once per batch in loader order; look the
            augmenter up inside it (``close_mosaic`` replaces it between epochs). Its output may be
            overwritten by its next call (``GraphedAugment``).
        candidates: ``AugmentedBatch -> 0-d int64 tensor | None``, the loss's candidate count for the
            batch, computed on the device without a sync (None while the loss cannot say yet). None: no
            counts for the loss at all (Ultralytics' loss measures its own).
        convert: the augmenter's uint8 image to the batch's, a new tensor (the next replay overwrites the
            augmenter's): ``Tensor.float``, or the step's scaled input (``SyncFreeStep.step_image``).
    """

    def __init__(self, loader: Any, augment: Callable[[SourceBatch], AugmentedBatch],
                 candidates: Callable[[AugmentedBatch], Tensor | None] | None = None,
                 convert: Callable[[Tensor], Tensor] = Tensor.float):
        self.loader, self.augment, self.candidates, self.convert = loader, augment, candidates, convert

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "augment", "candidates", "convert"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict]:
        """One epoch. A generator: nothing is fetched or launched until the first request."""
        batches = iter(self.loader)
        host = event = None
        pending: _Pending | None = None
        try:
            for batch in batches:
                done = self._finish(pending) if pending is not None else None
                source = batch["source"]
                if source.valid.is_cuda and host is None:
                    host = torch.empty(3, dtype=torch.int64, pin_memory=True)
                    event = torch.cuda.Event()
                pending = self._launch(source, batch["im_file"], host, event)
                if done is not None:
                    yield done
            if pending is not None:
                done, pending = self._finish(pending), None
                yield done
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # stops the prefetcher's thread when the pass is abandoned

    def _launch(self, source: SourceBatch, im_file: list[str], host: Tensor | None,
                event: torch.cuda.Event | None) -> _Pending:
        """Enqueue the augmentation and the copy of its counts; nothing waits."""
        out = self.augment(source)
        counts = [out.valid.sum()]
        if self.candidates is not None:  # the most boxes in one image (the loss's padding), its candidates
            counts.append(out.valid.sum(1).max())
            extra = self.candidates(out)
            counts += [] if extra is None else [extra]
        count = torch.stack(counts).to(torch.int64)
        if host is None:  # CPU: already computed
            return _Pending(out, count, None, im_file)
        # one pinned buffer and event per pass suffice: the previous counts were read before this copy is enqueued
        host = host[:len(count)]
        host.copy_(count, non_blocking=True)
        event.record(torch.cuda.current_stream(count.device))
        return _Pending(out, host, event, im_file)

    def _finish(self, p: _Pending) -> dict:
        """Ultralytics' batch from a launched augmentation, copied out of the augmenter's memory."""
        if p.ready is not None:
            p.ready.synchronize()  # recorded a step ago, before that step's forward: complete in steady state
        counts = p.count.tolist()  # host memory: no sync
        d = p.out.to_ultralytics(total=counts[0])
        for key, n in zip((MAX_BOXES, CANDIDATES), counts[1:]):
            d[key] = n
        d["img"] = self.convert(d["img"])  # Ultralytics' own conversion, done before the next replay overwrites img
        d["im_file"] = p.im_file
        return d


__all__ = ["AugmentAhead"]
