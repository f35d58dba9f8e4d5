"""How fast can N processes put decoded pixels into one file on this machine, and what does fsync cost?

Compares ``pwrite`` (buffered; writers serialise on the file's inode lock) with writes through a shared mmap of
a file preallocated with ``posix_fallocate``, and times ``fsync``: the measurements behind the pack writer's
design (mmap of a reserved file; fsync only with ``sync=True``). The default writes 10,000 images of
640 x 480 x 3 bytes (9.2 GB) five times: run it where the disk has that much room.

Usage: python -m tools.device.io_probe [PATH] [--images 10000] [--bytes 921600] [--workers 16]
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial


def by_pwrite(span: tuple[int, int], path: str, size: int) -> None:
    """Write images ``span`` with one ``os.pwrite`` each."""
    blob = os.urandom(size)
    fd = os.open(path, os.O_WRONLY)
    for i in range(*span):
        os.pwrite(fd, blob, i * size)
    os.close(fd)


def by_mmap(span: tuple[int, int], path: str, size: int, total: int) -> None:
    """Write images ``span`` through a shared mapping of the whole file."""
    blob = os.urandom(size)
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, total)
    for i in range(*span):
        mm[i * size:(i + 1) * size] = blob
    mm.close()
    os.close(fd)


def run(method: str, path: str, images: int, size: int, workers: int, prealloc: bool) -> str:
    """One measurement: write rate, fsync time, and the rate with fsync, as a line of text."""
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    if prealloc:
        os.posix_fallocate(fd, 0, images * size)
    fn = partial(by_pwrite, path=path, size=size) if method == "pwrite" else \
        partial(by_mmap, path=path, size=size, total=images * size)
    step = -(-images // workers)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers) as ex:
        list(ex.map(fn, [(k * step, min(images, (k + 1) * step)) for k in range(workers)]))
    t1 = time.perf_counter()
    os.fsync(fd)
    t2 = time.perf_counter()
    os.close(fd)
    gb = images * size / 1e9
    return (f"{method:7s} workers={workers:2d} prealloc={prealloc!s:5s}: write {gb / (t1 - t0):5.2f} GB/s "
            f"({images / (t1 - t0):6.0f} img/s), fsync {t2 - t1:5.2f} s, incl. fsync {images / (t2 - t0):6.0f} img/s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", nargs="?", default="/tmp/io_probe.bin", help="the file to write (removed after)")
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--bytes", type=int, default=640 * 480 * 3, help="bytes an image")
    ap.add_argument("--workers", type=int, default=16)
    a = ap.parse_args(argv)
    folder = os.path.dirname(os.path.abspath(a.path))
    free = shutil.disk_usage(folder).free
    if free < a.images * a.bytes:
        raise SystemExit(f"io_probe: {a.images * a.bytes / 1e9:.1f} GB to write, {free / 1e9:.1f} GB free in {folder}")
    w = a.workers
    for method, workers, prealloc in (("pwrite", 1, False), ("pwrite", w, False), ("pwrite", w, True),
                                      ("mmap", w, True), ("mmap", max(1, w // 4), True)):
        print(run(method, a.path, a.images, a.bytes, workers, prealloc), flush=True)
    os.unlink(a.path)


if __name__ == "__main__":
    main()
