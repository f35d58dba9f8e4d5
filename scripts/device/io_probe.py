"""How fast can 16 processes put 9 GB of decoded pixels into one file on this machine?

Compares pwrite (buffered, one inode lock) with writes through a shared mmap of a preallocated
file, and times fsync. Used to choose the pack writer; results go in BENCHMARKS.md.
"""

import mmap
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

N, SIZE = 10000, 640 * 480 * 3
PATH = sys.argv[1] if len(sys.argv) > 1 else "/tmp/io_probe.bin"
BLOB = os.urandom(SIZE)


def by_pwrite(rng):
    fd = os.open(PATH, os.O_WRONLY)
    for i in range(*rng):
        os.pwrite(fd, BLOB, i * SIZE)
    os.close(fd)


def by_mmap(rng):
    fd = os.open(PATH, os.O_RDWR)
    mm = mmap.mmap(fd, N * SIZE)
    for i in range(*rng):
        mm[i * SIZE:(i + 1) * SIZE] = BLOB
    mm.close()
    os.close(fd)


def run(fn, workers, prealloc):
    if os.path.exists(PATH):
        os.unlink(PATH)
    fd = os.open(PATH, os.O_RDWR | os.O_CREAT)
    if prealloc:
        os.posix_fallocate(fd, 0, N * SIZE)
    t0 = time.perf_counter()
    step = N // workers
    with ProcessPoolExecutor(workers) as ex:
        list(ex.map(fn, [(k * step, (k + 1) * step) for k in range(workers)]))
    t1 = time.perf_counter()
    os.fsync(fd)
    t2 = time.perf_counter()
    os.close(fd)
    gb = N * SIZE / 1e9
    print(f"{fn.__name__:10s} workers={workers:2d} prealloc={prealloc!s:5s}: write {gb / (t1 - t0):5.2f} GB/s "
          f"({N / (t1 - t0):6.0f} img/s), fsync {t2 - t1:5.2f} s, incl. fsync {N / (t2 - t0):6.0f} img/s", flush=True)


if __name__ == "__main__":
    os.system(f"df -hT {os.path.dirname(PATH)}; cat /proc/sys/vm/dirty_ratio /proc/sys/vm/dirty_background_ratio")
    for fn, w, pre in ((by_pwrite, 1, False), (by_pwrite, 16, False), (by_pwrite, 16, True),
                       (by_mmap, 16, True), (by_mmap, 4, True)):
        run(fn, w, pre)
    os.unlink(PATH)
