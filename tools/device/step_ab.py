"""Training variants side by side in one process: bench modes, and yolofeed's step options switched off.

Usage: python -m tools.device.step_ab DATA_YAML MODEL VARIANT[,VARIANT...] [--batch 128] [--imgsz 640] [--steps 100]
        [--warmup 30] [--optimizer auto]

VARIANT: a ``yolofeed bench`` mode (``ceiling``, ``yolofeed``, ``yolofeed_jpeg``, ...), alone or with a suffix that
sets one of the step's options (the keys ``yolofeed train`` and ``yolofeed bench`` take): ``_stock_step``
(``sync_free_step=False``), ``_stock_loss`` (``sync_free_loss=False``), ``_sync_free_loss`` (``sync_free_loss=True``)
or ``_stock_musgd`` (``fast_musgd=False``: Ultralytics' MuSGD as it is, with ``--optimizer MuSGD``).
Each line also names the threads that used the most CPU during the variant's run, and the caching allocator's
cudaMalloc/cudaFree calls.
Each variant runs in turn, ``--steps`` measured steps after a 30-step warm-up (the bench's settings): one line
each, and ``$OUT/step_ab_<model>.json``. Run the variants in both orders to see the drift between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time

import torch

from yolofeed.bench.modes import trainer_class as mode_class
from yolofeed.measure.profile import profile

SUFFIXES = {"_stock_step": {"sync_free_step": False}, "_stock_loss": {"sync_free_loss": False},
            "_sync_free_loss": {"sync_free_loss": True}, "_stock_musgd": {"fast_musgd": False}}


def trainer_class(variant: str) -> type:
    """The trainer class of ``variant``: a bench mode, with the options its suffix names as class attributes.

    Raises:
        ValueError: an unknown mode.
    """
    for suffix, options in SUFFIXES.items():
        if variant.endswith(suffix):
            cls = mode_class(variant.removesuffix(suffix))
            return type(cls.__name__, (cls,), options)
    return mode_class(variant)


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds each thread of this process has used so far, by thread id: (name, seconds). Linux only."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        out[int(tid)] = (names.get(int(tid), comm), (int(fields[11]) + int(fields[12])) / tick)
    return out


class ThreadCpu:
    """Every thread's CPU seconds, read every ``every`` s while in use: a thread that ends (a loader's, at the end
    of training) keeps its last reading. ``before`` and ``after`` are ``thread_cpu``-like dicts."""

    def __init__(self, every: float = 0.5):
        self.every, self.before, self.after = every, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-cpu", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._read()

    def _read(self) -> None:
        """One reading. A thread keeps the Python name it had: one that is starting or ending is already or
        still in /proc but not among Python's threads, which would name it by its process's name."""
        python = {t.native_id for t in threading.enumerate()}
        for tid, (name, cpu) in thread_cpu().items():
            self.after[tid] = (name if tid in python else self.after.get(tid, (name,))[0], cpu)

    def __enter__(self) -> ThreadCpu:
        self.before = thread_cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read()


def busiest(before: dict, after: dict, seconds: float, n: int = 6) -> str:
    """The ``n`` threads that used the most CPU between two ``thread_cpu`` readings, in cores over ``seconds``."""
    used = sorted(((cpu - before.get(tid, ("", 0.0))[1], name) for tid, (name, cpu) in after.items()), reverse=True)
    return ", ".join(f"{name} {cpu / max(seconds, 1e-9):.2f}" for cpu, name in used[:n] if cpu > 0)


def allocator_calls() -> dict[str, int]:
    """The caching allocator's cumulative cudaMalloc and cudaFree calls and retries (a cudaFree waits for the whole
    device); empty without CUDA."""
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("model", help="e.g. yolo11n.yaml")
    ap.add_argument("variants", help="comma-separated, e.g. yolofeed_stock_step,yolofeed")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--optimizer", default="auto", help="Ultralytics' optimizer= (auto: AdamW for these short runs)")
    a = ap.parse_args(argv)
    variants = a.variants.split(",")
    for v in variants:
        trainer_class(v)  # an unknown variant stops here, before any training
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in variants:
            args = {"model": a.model, "data": a.data, "imgsz": a.imgsz, "batch": a.batch, "workers": 16,
                    "project": tmp, "optimizer": a.optimizer}
            t0, mem0 = time.perf_counter(), allocator_calls()
            with ThreadCpu() as cpu:
                p = profile(v, trainer_class(v), args, steps=a.steps, warmup=a.warmup)
            threads = busiest(cpu.before, cpu.after, time.perf_counter() - t0)
            mem = {k: n - mem0.get(k, 0) for k, n in allocator_calls().items()}
            rows.append({"variant": v, "images_per_s": p.images_per_s, "gpu_util": p.gpu_util,
                         "step_ms": p.step_ms, "optimizer": p.optimizer, "phases_ms": p.phases_ms,
                         "own_cores_busy": p.own_cores_busy, "thread_cores": threads, "allocator_calls": mem})
            print(f"STEP_AB {a.model} {v:<22} {p.images_per_s:8.0f} img/s  GPU {p.gpu_util or 0:5.1f} %  "
                  f"step {p.step_ms:6.1f} ms  {p.optimizer}  {p.phases_ms}\n  host cores {p.own_cores_busy}; busiest "
                  f"threads (cores, the whole run): {threads}\n  allocator calls (the whole run): {mem}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"step_ab_{a.model.removesuffix('.yaml')}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
