"""CPU ceiling for `yolofeed pack`: verify + decode + resize every image in N processes, writing nothing.

The pack build can be no faster than this; the gap between the two is the cost of writing.
Usage: python3 scripts/device/decode_ceiling.py DATA_YAML WORKERS
"""

import sys
import time
from concurrent.futures import ProcessPoolExecutor

import cv2

from yolofeed.pack.source import split_source
from yolofeed.pack.verify import load_sample


def one(args):
    cv2.setNumThreads(1)
    return load_sample(*args, 80, 640, "raw").payload.nbytes


if __name__ == "__main__":
    src = split_source(sys.argv[1], "train")
    workers = int(sys.argv[2])
    tasks = list(zip(src.im_files, src.label_files))
    with ProcessPoolExecutor(workers) as ex:
        list(ex.map(one, tasks[:workers * 4]))  # warm up the processes
        t0 = time.perf_counter()
        nbytes = sum(ex.map(one, tasks, chunksize=64))
        dt = time.perf_counter() - t0
    print(f"decode ceiling, {workers} processes: {len(tasks) / dt:,.0f} img/s ({nbytes / dt / 1e9:.2f} GB/s of pixels)")
