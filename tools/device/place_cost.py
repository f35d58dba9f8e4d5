"""The GPU time of a jpeg batch's decode and of its resize and write (``jpeg.place``), alone on the GPU.

Decodes batches of a jpeg pack with nvJPEG, then places them with the torch ops (a copy per image, a resize per
group of sizes) and with ``place_triton``'s one kernel, timed with CUDA events, each ``--repeats`` times after a
warm-up. Prints milliseconds a batch (median) and writes ``$OUT/place_cost.json``.

Usage: python -m tools.device.place_cost JPEG_PACK [--batch 128] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import torch

from yolofeed.kernels import place_triton
from yolofeed.pack import Pack
from yolofeed.pack.codecs import jpeg


def _time(fn, repeats: int) -> float:
    """Median CUDA-event milliseconds of ``fn()``, after two calls for warm-up."""
    times = []
    for k in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if k >= 2:
            times.append(start.elapsed_time(end))
    return float(np.median(times))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pack")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    pack = Pack.open(args.pack)
    dev = torch.device("cuda")
    idx = np.random.default_rng(0).permutation(len(pack))[:args.batch]
    files = [torch.from_numpy(np.array(pack.encoded(i))) for i in idx.tolist()]
    hw = [tuple(x) for x in pack.shapes[idx].tolist()]
    out = torch.zeros((args.batch, pack.imgsz, pack.imgsz, 3), dtype=torch.uint8, device=dev)
    decoded = jpeg._decode_jpeg(files, dev)
    images = dict(enumerate(decoded))
    real = jpeg.triton_kernels
    jpeg.triton_kernels = lambda: None
    try:
        torch_ms = _time(lambda: jpeg.place(images, hw, out), args.repeats)
    finally:
        jpeg.triton_kernels = real
    result = {
        "batch": args.batch, "resized": int(sum(tuple(d.shape[1:]) != t for d, t in zip(decoded, hw))),
        "decode_ms": _time(lambda: jpeg._decode_jpeg(files, dev), args.repeats),
        "place_torch_ms": torch_ms,
        "place_triton_ms": _time(lambda: place_triton.place(images, hw, out), args.repeats),
    }
    print("PLACE_COST " + json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))
    with open(os.path.join(os.environ.get("OUT", tempfile.gettempdir()), "place_cost.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
