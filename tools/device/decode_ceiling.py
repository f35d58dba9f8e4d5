"""The CPU ceiling of ``yolofeed pack``: verify, decode and resize every image in N processes, writing nothing.

A pack build can be no faster than this; the gap between the two is the cost of writing.

Usage: python -m tools.device.decode_ceiling DATA_YAML WORKERS [--imgsz 640]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import cv2

from yolofeed.pack import codecs
from yolofeed.pack.source import split_source
from yolofeed.pack.verify import SampleError, load_sample


def one(files: tuple[str, str], nc: int, imgsz: int) -> int:
    """Verify and load one (image, label) pair as a raw pack stores it; returns the pixel bytes (0: skipped)."""
    cv2.setNumThreads(1)
    try:
        return load_sample(*files, nc, imgsz, codecs.get("raw").encode).payload.nbytes
    except SampleError:  # a pack skips it too
        return 0


def rate(data: str, workers: int, imgsz: int = 640) -> tuple[float, float]:
    """Images a second and pixel bytes a second over the training split, after a warm-up of the processes."""
    src = split_source(data, "train")
    tasks = list(zip(src.im_files, src.label_files))
    fn = partial(one, nc=src.nc, imgsz=imgsz)
    # forked, as the build's workers are: children of this process (build_parts reads their CPU time)
    ctx = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None
    with ProcessPoolExecutor(workers, mp_context=ctx) as ex:
        list(ex.map(fn, tasks[:workers * 4]))  # warm up the processes
        t0 = time.perf_counter()
        nbytes = sum(ex.map(fn, tasks, chunksize=64))
        dt = time.perf_counter() - t0
    return len(tasks) / dt, nbytes / dt


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("workers", type=int)
    ap.add_argument("--imgsz", type=int, default=640)
    a = ap.parse_args(argv)
    images, nbytes = rate(a.data, a.workers, a.imgsz)
    print(f"decode ceiling, {a.workers} processes: {images:,.0f} img/s ({nbytes / 1e9:.2f} GB/s of pixels)")


if __name__ == "__main__":
    main()
