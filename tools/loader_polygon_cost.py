"""What a batch's polygons cost the training loader's thread, beside its labels and pixels.

A detection pack of polygon rows (and a segment pack) hands each batch its polygons padded to the set's longest
(``loader.batch.gather``). This times ``gather`` on the same batches of a ``synth task=segment`` set's detection
pack: labels only, labels and polygons, and both with the pixels, after one untimed pass so the file is in the page
cache.

Usage: python -m tools.loader_polygon_cost [WORKDIR] [--images 512] [--batch 128] [--imgsz 640]
(WORKDIR default /tmp/yolofeed-polygons: a synthetic segment set is written there unless it holds a data.yaml).
Prints one line per figure. Runs on any machine (CPU only).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("YOLO_OFFLINE", "1")

from yolofeed import synth  # noqa: E402
from yolofeed.config import SynthConfig  # noqa: E402
from yolofeed.limits import usable_cores  # noqa: E402
from yolofeed.loader.batch import HostBuffers, gather  # noqa: E402
from yolofeed.loader.labels import LabelView  # noqa: E402
from yolofeed.pack import open_or_build  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", nargs="?", type=Path, default=Path("/tmp/yolofeed-polygons"))
    ap.add_argument("--images", type=int, default=512, help="training images to synthesise (no data.yaml there yet)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--repeats", type=int, default=10, help="timed batches a figure; the median is reported")
    a = ap.parse_args(argv)
    if not (a.workdir / "data.yaml").exists():
        synth.run(SynthConfig(out=str(a.workdir), n_train=a.images, n_val=1, imgsz=a.imgsz, seed=0, task="segment"))
    pack = open_or_build(a.workdir / "data.yaml", "train", a.imgsz, rebuild="auto", progress=False, task="detect")
    labels = LabelView.of(pack)
    if labels.polygons is None or len(pack) < a.batch:
        raise SystemExit(f"loader_polygon_cost: {a.workdir} needs {a.batch} or more training images of polygon rows")
    rng = np.random.default_rng(0)
    batches = [rng.choice(len(pack), a.batch, replace=False) for _ in range(a.repeats)]
    print(f"machine: {usable_cores()} usable cores; {len(pack)} images, {labels.width} labels an image at most, "
          f"polygons of {labels.polygons[2].mean():.0f} points mean and {labels.polygon_width} at most")
    for images in (False, True):
        for points in (0, labels.polygon_width):
            buf = HostBuffers.allocate(a.batch, a.imgsz, labels.width, pin=False, polygons=points)
            gather(pack, batches[0], buf, images=images, labels=labels)  # page cache warm
            times = []
            for b in batches:
                t0 = time.perf_counter()
                gather(pack, b, buf, images=images, labels=labels)
                times.append(time.perf_counter() - t0)
            print(f"gather of {a.batch}: labels{' and polygons' if points else ''}{' and pixels' if images else ''}: "
                  f"{1e3 * float(np.median(times)):.1f} ms")


if __name__ == "__main__":
    main()
