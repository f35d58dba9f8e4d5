"""Where a raw pack build's time goes beyond decoding: the same build with one part taken out at a time.

Builds the training split of a data yaml (``open_or_build(..., rebuild="always")``, N workers) in turn: as it is;
without the payload's CRC32 (the workers'; the read-back check off too, which needs them); without writing the
payloads (nor the read-back); without the read-back check alone; with the file's bound reserved up front on a tmpfs
too, as on a disk; with each payload's pages faulted in one by one by its copy (no ``MADV_POPULATE_WRITE``; the
bound reserved up front). Workers fork from this process, so the parts
are swapped out here before each build. The rate of each against the decode ceiling (``decode_ceiling.py``: verify,
decode and resize in N processes, nothing written) says what keeps the build below it. Writes
``$OUT/build_parts.json``. The packs it makes are throwaways in a temporary folder (``--dir``: under that folder;
``/dev/shm`` takes the disk out). ``--settle`` syncs before each build, so that none starts while the last one's
pages are still being written to disk. Each line also gives the CPU time an image of the workers (user and
kernel) and of the building process (its threads: the read-back check's CRC32s, the writeback), against the
decode ceiling's workers, and the build's phases in seconds from the pack's header (``plan``: fingerprint, space
check and the file's up-front reservation; ``start``: the workers' start and the first chunk of up to 64 images, to
the first result; ``payloads``: the rest; ``check``: the read-back) against the whole call (listing the source,
writing the tail and opening the pack besides).

Usage: python -m tools.device.build_parts DATA_YAML [--workers 16] [--imgsz 640] [--repeats 2] [--settle] [--dir D]
    [--variants 'as built,pages']
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

from tools.device import decode_ceiling
from yolofeed.pack import build, disk, encode, rebuild
from yolofeed.pack.source import split_source


class _NoCrc:
    """Stands in for ``zlib`` in the workers' module: CRC32 returns 0 without reading its input."""

    @staticmethod
    def crc32(data, value=0):  # noqa: ARG004 - zlib's signature
        return 0


class _OnDisk(disk.Disk):
    """Every folder a disk, a tmpfs too: the bound is reserved up front by posix_fallocate before the workers start."""

    def in_memory(self, folder):
        return False


class _NoPayloads(_OnDisk):
    """Payloads not written, nothing reserved: the workers' pwrite is skipped (the preamble and tail are written)."""

    def write_payload(self, fd, data, offset):
        pass

    def allocate(self, fd, nbytes):
        return False


class _NoAdvice(_OnDisk):
    advice = None


_NO_CHECK = (build, "_check_written", lambda *a, **k: None)
# name -> (the Disk the build uses, module attributes swapped out)
VARIANTS = {
    "as built": (disk.Disk(), []),
    "no payload CRC32 (nor read-back)": (disk.Disk(), [(encode, "zlib", _NoCrc), _NO_CHECK]),
    "payloads not written (nor read-back)": (_NoPayloads(), [_NO_CHECK]),
    "no read-back check": (disk.Disk(), [_NO_CHECK]),
    # on a tmpfs, as on a disk: every byte of the bound allocated by posix_fallocate before the workers start
    "reserved up front": (_OnDisk(), []),
    # reserved up front too: on a tmpfs that is not, the advice is what lets the workers write through the map
    "pages faulted in one by one (no MADV_POPULATE_WRITE)": (_NoAdvice(), []),
}


def cpu() -> tuple[float, float, float]:
    """CPU seconds so far: this process's (all its threads), and its ended children's, user and kernel."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime, kids.ru_stime


def per_image_ms(before: tuple[float, float, float], after: tuple[float, float, float], n: int) -> dict[str, float]:
    """CPU ms an image between two ``cpu()`` readings: the building process, the workers' user and kernel time."""
    d = [(b - a) * 1e3 / max(n, 1) for a, b in zip(before, after)]
    return {"parent": round(d[0], 2), "workers_user": round(d[1], 2), "workers_kernel": round(d[2], 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--settle", action="store_true", help="sync before each build: none starts with earlier "
                    "builds' pages still waiting to be written to disk (the kernel throttles writers then)")
    ap.add_argument("--dir", help="where the throwaway packs go (default: the system's temporary folder)")
    ap.add_argument("--variants", help="comma-separated start of the variants' names to run (default: all), "
                    "e.g. 'as built,pages'")
    a = ap.parse_args(argv)
    chosen = {k: v for k, v in VARIANTS.items()
              if not a.variants or any(k.startswith(w.strip()) for w in a.variants.split(","))}
    if not chosen:
        ap.error(f"--variants {a.variants!r} names none of: {'; '.join(VARIANTS)}")
    n = len(split_source(a.data, "train").im_files)
    c0 = cpu()
    images, _ = decode_ceiling.rate(a.data, a.workers, imgsz=a.imgsz)
    ceiling_cpu = per_image_ms(c0, cpu(), n + min(n, 4 * a.workers))  # its warm-up decodes up to 4 a process more
    report = {"data": a.data, "workers": a.workers, "imgsz": a.imgsz, "settle": a.settle, "dir": a.dir,
              "decode_ceiling_img_s": round(images), "decode_ceiling_cpu_ms": ceiling_cpu,
              "variants": {}, "cpu_ms": {}}
    print(f"decode ceiling, {a.workers} processes: {images:,.0f} img/s; CPU ms an image {ceiling_cpu}", flush=True)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        for rep in range(a.repeats):
            for name, (files, patches) in chosen.items():
                if a.settle:
                    t_sync = time.perf_counter()
                    os.sync()
                    print(f"  sync before it: {time.perf_counter() - t_sync:.1f} s", flush=True)
                with ExitStack() as stack:
                    stack.enter_context(disk.using(files))
                    for module, attr, value in patches:
                        stack.enter_context(mock.patch.object(module, attr, value))
                    c0, t0 = cpu(), time.perf_counter()
                    pack = rebuild.open_or_build(a.data, "train", a.imgsz, "raw", out=str(Path(tmp) / "p"),
                                                 rebuild="always", workers=a.workers, progress=False)
                    seconds, used = time.perf_counter() - t0, per_image_ms(c0, cpu(), n)
                rate = len(pack) / seconds
                phases = pack.header["build"]["phases_s"]
                report["variants"].setdefault(name, []).append(round(rate))
                report["cpu_ms"].setdefault(name, []).append(used)
                report.setdefault("phases_s", {}).setdefault(name, []).append({**phases, "all": round(seconds, 3)})
                print(f"{name}, rep {rep + 1}: {rate:,.0f} img/s ({rate / images:.0%} of the ceiling); CPU ms an "
                      f"image {used}; seconds {phases} of {seconds:.2f}", flush=True)
                del pack
    (Path(os.environ.get("OUT", "/tmp")) / "build_parts.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
