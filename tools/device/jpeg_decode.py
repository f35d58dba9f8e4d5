"""What a jpeg pack's device decode costs per batch, part by part, on an otherwise idle GPU.

For batches of a jpeg pack in epoch order: the host's copy of the encoded files into tensors, torchvision's
``decode_jpeg`` call (nvJPEG), and the grouped resize and write into the batch buffer, each timed to the GPU's
end (synchronised), then the whole ``decode_into`` as the loader calls it, on a side stream. Prints and writes
``$OUT/jpeg_decode.json``: ms per batch (median) and img/s of each part, and the GPU time a batch of the
decode's kernels (torch.profiler over 5 batches), kernel by kernel.

Usage: python -m tools.device.jpeg_decode PACK [--batch 128] [--batches 40] [--device cuda]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from torch.autograd import DeviceType

from yolofeed.pack import Pack
from yolofeed.pack.codecs import jpeg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pack")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    pack = Pack.open(a.pack)
    s = pack.imgsz
    out = torch.empty((a.batch, s, s, 3), dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    parts: dict[str, list[float]] = {"host_copy": [], "decode_jpeg": [], "decode_into": []}
    order = np.random.default_rng(0).permutation(len(pack))
    for b in range(a.batches):
        idx = order[(b * a.batch) % len(pack):][:a.batch]
        encoded = [pack.encoded(int(i)) for i in idx]
        t0 = time.perf_counter()
        data = [torch.from_numpy(np.array(e, dtype=np.uint8)) for e in encoded]
        t1 = time.perf_counter()
        jpeg._decode_jpeg(data, dev)
        sync()
        t2 = time.perf_counter()
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            jpeg.decode_into(encoded, pack.shapes[idx], out, names=[pack.im_files[i] for i in idx])
        sync()
        t3 = time.perf_counter()
        if b >= 5:  # the first batches hold nvJPEG's and the allocator's one-off set-up
            parts["host_copy"].append(t1 - t0)
            parts["decode_jpeg"].append(t2 - t1)
            parts["decode_into"].append(t3 - t2)
    # the decode's GPU work, kernel by kernel: what of it competes with training for the GPU
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for b in range(5):
            idx = order[b * a.batch:][:a.batch]
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                jpeg.decode_into([pack.encoded(int(i)) for i in idx], pack.shapes[idx], out,
                                 names=[pack.im_files[i] for i in idx])
            sync()
    events = prof.key_averages()
    key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    # the GPU's own events (kernels, copies): an op's self device time would count its kernels a second time
    kernels = sorted(((getattr(e, key) / 5e3, e.key[:90]) for e in events
                      if e.device_type == DeviceType.CUDA and getattr(e, key) > 0), reverse=True)
    n = a.batch
    report = {"pack": a.pack, "device": str(dev), "batch": n, "batches": a.batches - 5,
              "torch": torch.__version__, **{k: {"ms": round(1e3 * statistics.median(v), 2),
                                                 "img_s": round(n / statistics.median(v))} for k, v in parts.items()},
              "gpu_ms_per_batch": round(sum(ms for ms, _ in kernels), 2),
              "kernels_ms_per_batch": [[round(ms, 3), name] for ms, name in kernels[:25]]}
    print(json.dumps(report))
    (Path(os.environ.get("OUT", "/tmp")) / "jpeg_decode.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
