"""The training loader's host memory and disk reads, epoch by epoch, with or without the pack in the page cache.

Iterates ``TrainLoader`` over a pack (the batches go to ``--device``; nothing trains, so the rate is the
loader's own ceiling there) and samples, every 0.1 s: the process's anonymous and file-backed resident memory
(``/proc/self/status``: RssAnon, RssFile), and, when the process sits in a memory cgroup, the group's usage and
its page cache. Per epoch: images, img/s, bytes read from storage (``/proc/self/io``: what missed the page
cache) and host CPU (cores busy). Run it under ``tools/device/in_memory_limit.sh`` to give it less memory than
the pack. Writes ``$OUT/loader_memory.json``.

Usage: python -m tools.device.loader_memory PACK [--device cpu] [--batch 128] [--epochs 2] [--decode auto]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import torch

from yolofeed.loader import TrainLoader
from yolofeed.pack import Pack


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def cgroup_memory() -> dict[str, int]:
    """This process's memory cgroup: usage, limit and page cache in bytes (v2 or v1); {} outside one."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            d = Path("/sys/fs/cgroup") / path.lstrip("/")
            if (d / "memory.current").is_file() and path != "/":
                stat = dict(ln.split() for ln in (d / "memory.stat").read_text().splitlines())
                limit = (d / "memory.max").read_text().strip()
                return {"usage": int((d / "memory.current").read_text()), "limit": -1 if limit == "max" else int(limit),
                        "file": int(stat["file"]), "anon": int(stat["anon"])}
        elif "memory" in controllers.split(","):  # v1
            d = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (d / "memory.usage_in_bytes").is_file() and path != "/":
                stat = dict(ln.split() for ln in (d / "memory.stat").read_text().splitlines())
                return {"usage": int((d / "memory.usage_in_bytes").read_text()),
                        "limit": int((d / "memory.limit_in_bytes").read_text()),
                        "file": int(stat["cache"]), "anon": int(stat["rss"])}
    return {}


class Sampler(threading.Thread):
    """Peaks of RssAnon, RssFile and the cgroup's figures since the last ``take()``."""

    def __init__(self, every: float = 0.1):
        super().__init__(daemon=True)
        self.every, self.peaks, self.lock, self.stop = every, {}, threading.Lock(), threading.Event()

    def sample(self) -> None:
        now = {"rss_anon": _status_kb("RssAnon") * 1024, "rss_file": _status_kb("RssFile") * 1024}
        now.update({f"cgroup_{k}": v for k, v in cgroup_memory().items() if k != "limit"})
        with self.lock:
            for k, v in now.items():
                self.peaks[k] = max(self.peaks.get(k, 0), v)

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.sample()

    def take(self) -> dict[str, int]:
        self.sample()
        with self.lock:
            out, self.peaks = self.peaks, {}
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pack")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--decode", default="auto")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    dev = torch.device(a.device)
    pack = Pack.open(a.pack)
    report = {"pack": a.pack, "storage": pack.format, "images": len(pack), "pack_bytes": Path(a.pack).stat().st_size,
              "device": str(dev), "batch": a.batch, "label": a.label, "cgroup": cgroup_memory(), "epochs": []}
    loader = TrainLoader(pack, a.batch, dev, seed=0, decode=a.decode)
    sampler = Sampler()
    sampler.start()
    for epoch in range(a.epochs):
        sampler.take()
        r0, c0, t0 = _read_bytes(), time.process_time(), time.perf_counter()
        n = 0
        for batch in loader:
            n += len(batch["im_file"])
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        wall = time.perf_counter() - t0
        peaks = sampler.take()
        report["epochs"].append({"epoch": epoch, "images": n, "seconds": round(wall, 2), "img_s": round(n / wall),
                                 "read_from_storage_bytes": _read_bytes() - r0,
                                 "host_cores": round((time.process_time() - c0) / wall, 2), **peaks})
        print(json.dumps(report["epochs"][-1]), flush=True)
    loader.close()
    sampler.stop.set()
    out = Path(os.environ.get("OUT", "/tmp")) / f"loader_memory{'-' + a.label if a.label else ''}.json"
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
