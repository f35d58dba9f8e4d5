"""Replay the whole augmentation as one CUDA graph: launch cost once per batch, not per op.

``GpuAugment`` issues a few hundred small kernels for parameters and boxes besides the two big
ones (warp, compose); launched one by one from Python they cost more than the pixels do
(BENCHMARKS.md). The pipeline is sync-free with static shapes, so it is captured once per input
shape and replayed: the draws come from a generator registered with the graph, so every replay
draws new parameters, reproducibly from the seed.

With a ``PartnerPool`` the batch is copied into the pool's ring outside the graph (the host knows
where), and the graph reads the ring and one device scalar, the batch's load position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from yolofeed.augment.pipeline import GpuAugment
from yolofeed.augment.pool import LABEL_BUCKET, PartnerPool, slot_dtype, slot_shapes
from yolofeed.schema import AugmentedBatch, SourceBatch


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: SourceBatch | None  # the batch's copy; None with a pool (the ring is the input)
    first: torch.Tensor | None  # with a pool: the batch's load position, 0-d int64 on the device
    output: AugmentedBatch


class GraphedAugment:
    """``GpuAugment`` captured into CUDA graphs, one per (batch, image buffer, label width) shape.

    The returned batch lives in the graph's static memory: it is overwritten by the next call, which
    is how a training loop uses it (augment, step, augment...). Clone it to keep it.

    Args:
        aug: the pipeline to capture.
        seed: seeds the graph's own generator; the same seed replays the same draws.
        generator: the draws' generator instead (on ``device``; ``seed`` is then not used): one made for an earlier
            augmenter continues its sequence.
        pool: where partners come from (each batch is pushed there); None, or an ``aug`` that takes no
            partners: the batch itself.
        before_capture: called before each capture (a new shape: the first batches, a wider label row, a shorter
            last batch): the trainer waits there for a validation running beside the training, where a device-wide
            sync (a validator callback's) would invalidate the capture.
    """

    def __init__(self, aug: GpuAugment, seed: int = 0, device: torch.device | str = "cuda",
                 pool: PartnerPool | None = None, generator: torch.Generator | None = None,
                 before_capture: Callable[[], None] | None = None):
        self.aug, self.device, self.before_capture = aug, torch.device(device), before_capture
        self.pool = pool if aug.needs_partners else None
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed)
        self.generator = generator
        self._graphs: dict[tuple, _Captured] = {}

    def _padded(self, batch: SourceBatch) -> tuple[tuple, int]:
        n, width = batch.valid.shape
        width = -(-max(width, 1) // LABEL_BUCKET) * LABEL_BUCKET
        per_slot = tuple(slot_shapes(batch).items())  # keypoints (P, 3), corners (4, 2), polygons (P, 2) and lengths
        return (n, *batch.images.shape[1:], width, per_slot), width

    def _capture(self, key: tuple, width: int) -> _Captured:
        n, hm, wm, _, _, per_slot = key
        dev = self.device
        static = first = None
        if self.pool is None:
            static = SourceBatch(torch.zeros((n, hm, wm, 3), dtype=torch.uint8, device=dev),
                                 torch.ones((n, 2), dtype=torch.long, device=dev) * min(hm, wm),
                                 torch.zeros((n, width), device=dev), torch.zeros((n, width, 4), device=dev),
                                 torch.zeros((n, width), dtype=torch.bool, device=dev),
                                 **{k: torch.zeros((n, width, *shape), dtype=slot_dtype(k), device=dev)
                                    for k, shape in per_slot})
        else:
            first = torch.zeros((), dtype=torch.long, device=dev)

        def run() -> AugmentedBatch:
            if static is not None:
                return self.aug(static, self.generator)
            partners = self.pool.partners(first, n)  # reads the ring only: warm-up runs leave it as it is
            return self.aug.apply(self.pool.sources, self.aug.sample(n, self.generator, dev, partners))

        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up off the capture: Triton compiles, allocator settles
            for _ in range(2):
                run()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.generator)
        # thread_local: the loader thread keeps working during the capture (side-stream copies, nvJPEG's
        # stream synchronize and allocations); in the default global mode any of those invalidates it.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            output = run()
        return _Captured(graph, static, first, output)

    def __call__(self, batch: SourceBatch) -> AugmentedBatch:
        """Copy ``batch`` into the graph's inputs or the pool's ring (device copies) and replay."""
        self.aug.check(batch, "GraphedAugment")
        first = self.pool.push(batch) if self.pool is not None else None  # before a capture: the ring exists
        key, width = self._padded(batch)
        cap = self._graphs.get(key)
        if cap is None:
            if self.before_capture is not None:
                self.before_capture()
            cap = self._graphs[key] = self._capture(key, width)
        if cap.first is not None:
            cap.first.fill_(first)  # a fill kernel with the host's value: no copy from host memory, no sync
        else:
            s, n = cap.inputs, batch.valid.shape[1]
            s.images.copy_(batch.images, non_blocking=True)
            s.hw.copy_(batch.hw, non_blocking=True)
            s.cls.zero_()
            s.boxes.zero_()
            s.valid.zero_()
            s.cls[:, :n].copy_(batch.cls, non_blocking=True)
            s.boxes[:, :n].copy_(batch.boxes, non_blocking=True)
            s.valid[:, :n].copy_(batch.valid, non_blocking=True)
            for k in slot_shapes(batch):  # keypoints, corners, polygons and their lengths
                getattr(s, k).zero_()
                getattr(s, k)[:, :n].copy_(getattr(batch, k), non_blocking=True)
        cap.graph.replay()
        return cap.output

    @property
    def captured(self) -> int:
        """How many graphs exist (one per input shape seen)."""
        return len(self._graphs)
