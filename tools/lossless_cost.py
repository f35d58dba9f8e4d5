"""Whether a lossless pack format would pay: its size against raw and jpeg, and the host cores its decode needs.

A third storage format (``yolofeed.pack.codecs``) would sit between raw (decoded pixels, exact) and jpeg (the
encoded files, 5-10x smaller, decoded on the GPU): exact pixels, fewer bytes. With the dependencies yolofeed
has, its decode runs on the host. This takes real photos (Ultralytics' bundled ``bus.jpg`` and ``zidane.jpg``,
resized as ``load_image`` resizes them), stores each as zlib at levels 1 and 6 and as PNG (OpenCV), times one
core's decode of each, and says how many cores would feed the training rate ``--rate`` (img/s). JPEG quality 95
gives the jpeg pack's size for the same pixels.

Usage: python -m tools.lossless_cost [--imgsz 640] [--rate 1795] [--repeats 20]
Runs on any machine (CPU only).
"""

from __future__ import annotations

import argparse
import time
import zlib
from pathlib import Path

import cv2
import numpy as np


def photos(imgsz: int) -> dict[str, np.ndarray]:
    """Ultralytics' bundled photos, resized so the long side is ``imgsz`` (INTER_LINEAR, as ``load_image``)."""
    import ultralytics

    out = {}
    for f in sorted((Path(ultralytics.__file__).parent / "assets").glob("*.jpg")):
        im = cv2.imread(str(f))
        h, w = im.shape[:2]
        r = imgsz / max(h, w)
        out[f.name] = cv2.resize(im, (max(1, round(w * r)), max(1, round(h * r))), interpolation=cv2.INTER_LINEAR)
    return out


def one_core_rate(decode, repeats: int) -> float:
    """Images a second one core decodes (median of ``repeats`` timed calls)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        decode()
        times.append(time.perf_counter() - t0)
    return 1.0 / float(np.median(times))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--rate", type=float, default=1795.0, help="img/s to feed (yolo11n's raw-pack rate on the H200)")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    cv2.setNumThreads(1)
    for name, im in photos(a.imgsz).items():
        raw = im.tobytes()
        ok, jpg = cv2.imencode(".jpg", im, [cv2.IMWRITE_JPEG_QUALITY, 95])
        print(f"{name} {im.shape[1]}x{im.shape[0]}: raw {len(raw) / 1e3:,.0f} KB; jpeg q95 {len(raw) / len(jpg):.1f}x "
              "smaller (decoded on the GPU)")
        ways = {f"zlib level {lvl}": (zlib.compress(raw, lvl), zlib.decompress) for lvl in (1, 6)}
        ok, png = cv2.imencode(".png", im)
        ways["png"] = (png, lambda b: cv2.imdecode(b, cv2.IMREAD_COLOR))
        for what, (stored, decode) in ways.items():
            per_core = one_core_rate(lambda: decode(stored), a.repeats)  # noqa: B023 - called before the next loop
            print(f"  {what}: {len(raw) / len(stored):.2f}x smaller, one core decodes {per_core:,.0f} img/s: "
                  f"{a.rate / per_core:.1f} cores for {a.rate:,.0f} img/s")


if __name__ == "__main__":
    main()
