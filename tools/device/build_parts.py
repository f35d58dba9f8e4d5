"""Where a raw pack build's time goes beyond decoding: the same build with one part taken out at a time.

Builds the training split of a data yaml (``open_or_build(..., rebuild="always")``, N workers) in turn: as it is;
without the payload's CRC32 (the workers'; the read-back check off too, which needs them); without writing the
payloads (nor the read-back); without the read-back check alone. Workers fork from this process, so the parts
are swapped out here before each build. The rate of each against the decode ceiling (``decode_ceiling.py``: verify,
decode and resize in N processes, nothing written) says what keeps the build below it. Writes
``$OUT/build_parts.json``. The packs it makes are throwaways in a temporary folder. ``--settle`` syncs before each
build, so that none starts while the last one's pages are still being written to disk.

Usage: python -m tools.device.build_parts DATA_YAML [--workers 16] [--imgsz 640] [--repeats 2] [--settle]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

from tools.device import decode_ceiling
from yolofeed.pack import build


class _NoCrc:
    """Stands in for ``zlib`` in the build module: CRC32 returns 0 without reading its input."""

    @staticmethod
    def crc32(data, value=0):  # noqa: ARG004 - zlib's signature
        return 0


VARIANTS = {
    "as built": {},
    "no payload CRC32 (nor read-back)": {"zlib": _NoCrc, "_check_written": lambda *a, **k: None},
    "payloads not written (nor read-back)": {"_pwrite_all": lambda *a, **k: None, "_reserve": lambda *a, **k: False,
                                             "_check_written": lambda *a, **k: None},
    "no read-back check": {"_check_written": lambda *a, **k: None},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--settle", action="store_true", help="sync before each build: none starts with earlier "
                    "builds' pages still waiting to be written to disk (the kernel throttles writers then)")
    a = ap.parse_args()
    images, _ = decode_ceiling.rate(a.data, a.workers, imgsz=a.imgsz)
    report = {"data": a.data, "workers": a.workers, "imgsz": a.imgsz, "settle": a.settle,
              "decode_ceiling_img_s": round(images),
              "variants": {}}
    print(f"decode ceiling, {a.workers} processes: {images:,.0f} img/s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for name, patches in VARIANTS.items():
                if a.settle:
                    t_sync = time.perf_counter()
                    os.sync()
                    print(f"  sync before it: {time.perf_counter() - t_sync:.1f} s", flush=True)
                with ExitStack() as stack:
                    for attr, value in patches.items():
                        stack.enter_context(mock.patch.object(build, attr, value))
                    t0 = time.perf_counter()
                    pack = build.open_or_build(a.data, "train", a.imgsz, "raw", out=str(Path(tmp) / "p"),
                                               rebuild="always", workers=a.workers, progress=False)
                    seconds = time.perf_counter() - t0
                rate = len(pack) / seconds
                report["variants"].setdefault(name, []).append(round(rate))
                print(f"{name}, rep {rep + 1}: {rate:,.0f} img/s ({rate / images:.0%} of the ceiling)", flush=True)
                del pack
    (Path(os.environ.get("OUT", ".")) / "build_parts.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
