"""The memory traffic of the sync-free detection loss, op by op, on the CPU: what its passes move, with and without the
assigner's two levers (train/loss/detect.py: ``GRID_CANDIDATES``, ``FOREGROUND_NORM``).

``python -m tools.loss_traffic [--model yolo26n.yaml] [--batch 16] [--boxes 50] [--imgsz 640] [--top 30]``

The loss's forward and backward (YOLO26: both of its losses) run once on random predictions of the model's shapes,
leaves of their own (the gradient stops at them), for ``--batch`` images of 20 to ``--boxes`` boxes each, with the
counts read ahead as the trainer reads them. Every aten op is counted by the bytes of its tensor inputs and outputs;
views move nothing and are left out, and a gather or scatter is counted by what it reads and writes (its index, its
values, the rows it writes), not by the whole tensor it writes into. Scaled to batch 128 in the totals. On a GPU the
predictions are float16 and the classification term fused (kernels/bce_sum.py), so the assigner's float32 passes are a
larger part of the loss there than here; a GPU's time is for ``tools/device/swap_ab.py`` to measure.
"""

from __future__ import annotations

import argparse
import collections
import time
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

VIEWS = {"detach", "permute", "expand", "slice", "view", "as_strided", "unsqueeze", "squeeze", "select", "t",
         "transpose", "split", "split_with_sizes", "chunk", "unflatten", "_unsafe_view", "alias", "unbind",
         "new_empty_strided", "empty", "empty_like", "new_empty", "lift_fresh"}
SCATTERS = {"scatter_", "scatter_add_", "scatter_reduce_", "index_put_", "scatter", "scatter_add", "scatter_reduce",
            "index_put"}
GATHERS = {"index", "gather", "index_select", "take_along_dim"}


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tensors(x) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _where() -> str:
    """The innermost frame of Ultralytics or yolofeed that dispatched the op ("backward": autograd's engine)."""
    for frame in reversed(traceback.extract_stack(limit=40)):
        if ("ultralytics" in frame.filename or "yolofeed" in frame.filename) and "loss_traffic" not in frame.filename:
            return f"{frame.filename.split('/')[-1]}:{frame.lineno} {frame.name}"
    return "backward"


class Traffic(TorchDispatchMode):
    """Counts each op's bytes moved, by (op, where)."""

    def __init__(self):
        super().__init__()
        self.by = collections.defaultdict(lambda: [0, 0])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in VIEWS:
            return out
        if name in SCATTERS:  # the destination's written rows, and what they come from
            moved = 2 * sum(map(_bytes, _tensors((args[1:], kwargs))))
            moved += 0 if name.endswith("_") else 2 * _bytes(args[0])  # out of place: a copy of it too
        elif name in GATHERS:
            moved = 2 * sum(map(_bytes, _tensors(out))) + sum(map(_bytes, _tensors((args[1:], kwargs))))
        else:
            moved = sum(map(_bytes, _tensors((args, kwargs)) + _tensors(out)))
        entry = self.by[(name, _where())]
        entry[0] += 1
        entry[1] += moved
        return out


def loss_traffic(model: str, batch: int, boxes: int, imgsz: int, grid: bool, norm: bool,
                 seed: int = 0) -> tuple[Traffic, int]:
    """The loss's traffic for one call and its backward, with the levers as given (then as they were); and the boxes
    an image padded."""
    from yolofeed.train.loss import detect

    kept = detect.GRID_CANDIDATES, detect.FOREGROUND_NORM
    detect.GRID_CANDIDATES, detect.FOREGROUND_NORM = grid, norm
    try:
        return _count(model, batch, boxes, imgsz, seed)
    finally:
        detect.GRID_CANDIDATES, detect.FOREGROUND_NORM = kept


def _count(model: str, batch: int, boxes: int, imgsz: int, seed: int) -> tuple[Traffic, int]:
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    from yolofeed.schema import AugmentedBatch
    from yolofeed.train import loss as sfl

    torch.manual_seed(seed)
    m = DetectionModel(model, nc=80, verbose=False)
    m.args = get_cfg()
    m.train()
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(min(20, boxes), boxes + 1, (batch,), generator=g).tolist()
    counts[0] = boxes
    valid = torch.arange(boxes)[None] < torch.tensor(counts)[:, None]
    xy = imgsz * (0.05 + 0.9 * torch.rand(batch, boxes, 2, generator=g))
    wh = imgsz * torch.exp(torch.rand(batch, boxes, 2, generator=g) * 4 - 5.5)  # 0.4 % to 22 % of the side
    aug = AugmentedBatch(img=torch.zeros(batch, 3, 8, 8, dtype=torch.uint8), valid=valid,
                         cls=torch.randint(0, 80, (batch, boxes), generator=g).float(),
                         boxes=torch.cat([xy - wh / 2, xy + wh / 2], -1).clamp(0, imgsz))
    b = aug.to_ultralytics()
    with torch.no_grad():
        preds = m(torch.zeros(batch, 3, imgsz, imgsz))

    def leaf(x):
        if isinstance(x, torch.Tensor):
            return x.detach().requires_grad_(x.is_floating_point())
        if isinstance(x, dict):
            return {k: leaf(v) for k, v in x.items()}
        return type(x)(leaf(v) for v in x) if isinstance(x, (list, tuple)) else x

    preds = leaf(preds)
    (first, *_) = sfl.install(m)
    m.loss({**b, sfl.MAX_BOXES: boxes}, preds)  # the first call makes the anchors the counts need
    counted = {**b, sfl.MAX_BOXES: boxes, sfl.CANDIDATES: int(sfl.early_candidates_for(first, aug))}
    traffic = Traffic()
    with traffic:
        loss, _ = m.loss(counted, preds)
        loss.sum().backward()
    return traffic, boxes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="yolo26n.yaml")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--boxes", type=int, default=50, help="the most boxes in an image (the padding's width)")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--top", type=int, default=0, help="list the N ops that move most, with both levers on")
    args = parser.parse_args(argv)
    scale = 128 / args.batch
    for grid, norm in ((False, False), (True, False), (True, True)):
        t0 = time.perf_counter()
        traffic, _ = loss_traffic(args.model, args.batch, args.boxes, args.imgsz, grid, norm)
        total = sum(v[1] for v in traffic.by.values())
        ops = sum(v[0] for v in traffic.by.values())
        print(f"{args.model} GRID_CANDIDATES={grid!s:5} FOREGROUND_NORM={norm!s:5}: {total / 1e9:6.2f} GB in {ops} ops "
              f"for {args.batch} images; {total * scale / 1e9:6.2f} GB at batch 128 ({time.perf_counter() - t0:.0f} s)")
    for (op, where), (n, moved) in sorted(traffic.by.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"  {moved * scale / 1e6:9.0f} MB {n:4d}x {op:26s} {where}")


if __name__ == "__main__":
    main()
