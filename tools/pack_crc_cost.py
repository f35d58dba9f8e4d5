"""What checking a raw pack's payload CRC32s on every read would cost the loader.

The training loader's one thread copies each batch out of the pack's memory map (``Pack.gather``:
one memcpy per image, page-cache speed). Checking payloads as they are read would add a
``zlib.crc32`` pass over the same bytes in that thread. This measures both, on the same batches of
a raw 640-px pack, after one untimed pass so the file is in the page cache; plus the parallel
CRC32 pass ``Pack.verify`` and the end of each build run.

Usage: python -m tools.pack_crc_cost [WORKDIR] [--images 512] [--batch 64] [--imgsz 640]
(WORKDIR default /tmp/yolofeed-crc: a synthetic dataset is written there unless it holds a data.yaml).
Prints one line per figure. Runs on any machine (CPU only).
"""

from __future__ import annotations

import argparse
import os
import time
import zlib
from pathlib import Path

import numpy as np

os.environ.setdefault("YOLO_OFFLINE", "1")

from yolofeed import synth  # noqa: E402
from yolofeed.config import SynthConfig  # noqa: E402
from yolofeed.limits import usable_cores  # noqa: E402
from yolofeed.pack import open_or_build  # noqa: E402


def median_rate(fn, nbytes: int, repeats: int = 7) -> float:
    """Median bytes per second of ``fn()`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / float(np.median(times))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", nargs="?", type=Path, default=Path("/tmp/yolofeed-crc"))
    ap.add_argument("--images", type=int, default=512, help="training images to synthesise (no data.yaml there yet)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--repeats", type=int, default=7, help="timed passes a figure; the median is reported")
    a = ap.parse_args(argv)
    work, batch, s = a.workdir, a.batch, a.imgsz
    if not (work / "data.yaml").exists():
        synth.run(SynthConfig(out=str(work), n_train=a.images, n_val=1, imgsz=s, seed=0))
    pack = open_or_build(work / "data.yaml", "train", s, rebuild="auto", progress=False)
    if len(pack) < batch:
        raise SystemExit(f"pack_crc_cost: {len(pack)} training images, fewer than --batch {batch}")
    rng = np.random.default_rng(0)
    batches = [rng.choice(len(pack), batch, replace=False) for _ in range(len(pack) // batch)]
    buf = np.zeros((batch, s, s, 3), np.uint8)
    nbytes = int(sum(pack.index["nbytes"][b].sum() for b in batches))
    mm = pack.buffer

    def gather():
        for b in batches:
            pack.codec.gather(pack, b, buf)

    def crc():
        for b in batches:
            for r in pack.index[b]:
                zlib.crc32(mm[int(r["offset"]):int(r["offset"]) + int(r["nbytes"])])

    gather()  # page cache warm
    g = median_rate(gather, nbytes, a.repeats)
    c = median_rate(crc, nbytes, a.repeats)
    v = median_rate(lambda: pack.damaged(), int(pack.index["nbytes"].sum()), a.repeats)
    per_image = nbytes / sum(len(b) for b in batches)
    print(f"machine: {usable_cores()} usable cores, zlib {zlib.ZLIB_RUNTIME_VERSION}, {len(pack)} images of "
          f"{per_image / 1e6:.2f} MB mean (raw, {s})")
    print(f"gather (the loader's copy, one thread): {g / 1e9:.2f} GB/s = {g / per_image:,.0f} img/s")
    print(f"crc32 of the same payloads (one thread): {c / 1e9:.2f} GB/s = {c / per_image:,.0f} img/s")
    both = 1 / (1 / g + 1 / c)
    print(f"gather + crc32 in the loader's thread: {both / per_image:,.0f} img/s "
          f"({g / both:.1f}x the time of the copy alone)")
    print(f"Pack.damaged() (verify=True, {usable_cores()} threads): {v / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
