"""Where cuDNN's plans live: a convolution's first pass at a new batch size, in the training thread or beside it.

    python -m tools.device.plan_threads [model=yolo11n.yaml] [imgsz=640]

For each case a fresh batch size (a shape no thread has met), under float16 autocast with Ultralytics' deterministic
cuDNN: the seconds of the main ("training") thread's forward and backward pass on the model, cold; and the same after
a side thread made a forward and backward pass at that size first, on a copy, and ended (if the backward's plans are
the autograd engine's device thread's and the forward's the calling thread's, only the backward comes warm). Each case
runs once; nothing overlaps. ``first_pass.py``'s ``thread`` case times the side thread's pass whole, with the
validation's and final validation's passes; this one splits the forward from the backward.
"""

from __future__ import annotations

import copy
import sys
import threading
import time

import torch


def timed(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import init_seeds
    init_seeds(0, deterministic=True)
    imgsz = int(args.get("imgsz", 640))
    model = DetectionModel(args.get("model", "yolo11n.yaml"), nc=80, verbose=False).cuda().train()
    outs: dict[str, torch.Tensor] = {}

    def forward(m: torch.nn.Module, n: int, key: str) -> None:
        x = torch.zeros(n, 3, imgsz, imgsz, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            out = m(x)
        values = out.values() if isinstance(out, dict) else out
        outs[key] = sum(t.float().sum() for t in values if isinstance(t, torch.Tensor))

    def both(m: torch.nn.Module, n: int, key: str) -> tuple[float, float]:
        f = timed(lambda: forward(m, n, key))
        b = timed(lambda: outs.pop(key).backward())
        m.zero_grad(set_to_none=True)
        return f, b

    def side(m: torch.nn.Module, n: int, got: dict) -> None:
        got["f"], got["b"] = both(m, n, "side")

    f, b = both(model, 128, "main")
    print(f"batch 128, cold, training thread: forward {f:.2f} s, backward {b:.2f} s", flush=True)
    for n in (16, 24):
        f, b = both(model, n, "main")
        print(f"batch {n}, cold, training thread: forward {f:.2f} s, backward {b:.2f} s", flush=True)
    for n in (40, 48):
        got: dict[str, float] = {}
        th = threading.Thread(target=side, args=(copy.deepcopy(model), n, got))
        th.start()
        th.join()
        print(f"batch {n}, a side thread first: forward {got['f']:.2f} s, backward {got['b']:.2f} s", flush=True)
        f, b = both(model, n, "main")
        print(f"batch {n}, then the training thread: forward {f:.2f} s, backward {b:.2f} s", flush=True)
    f, b = both(model, 16, "main")
    print(f"batch 16 again, training thread: forward {f:.2f} s, backward {b:.2f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
