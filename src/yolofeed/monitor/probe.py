"""The sampling loop of ``SystemSampler``, run as its own process: ``python probe.py PID INTERVAL GPU_INDEX``.

Why a process: reading psutil's process tree and NVML ten times a second is Python work. In a
thread it takes the GIL from the training loop, which in a launch-bound trainer (yolo11n at the
ceiling keeps one core busy) costs step time one for one — 4 % measured on the H200 in-thread.
Here it costs the trainer one short line to parse per sample.

Writes one JSON line per sample to stdout: t (perf_counter s), cpu (machine cores busy), own
(cores busy in process PID and its descendants, this probe excluded), iow (iowait share), disk
(MB/s read) and, with an NVIDIA GPU, gpu (%), mem (GB), clock (SM MHz), power (W).
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil


class _Tree:
    """CPU seconds of a process and its descendants; the descendants are listed once a second, not per sample."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.members: list[psutil.Process] = []
        self.listed = 0.0
        self.gone = 0.0  # CPU seconds of members that exited, last seen values (keeps the sum monotone)
        self.last: dict[int, float] = {}

    def cpu(self, now: float) -> float:
        if now - self.listed >= 1.0:  # listing children walks all of /proc: the expensive part
            me = os.getpid()
            kids = [p for p in self.root.children(recursive=True) if p.pid != me]
            self.members, self.listed = [self.root, *kids], now
        total = 0.0
        for p in self.members:
            try:
                t = p.cpu_times()
                self.last[p.pid] = t.user + t.system
            except psutil.Error:  # exited: count what it had used
                pass
            total += self.last.get(p.pid, 0.0)
        return total


def _gpu(index: int):
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # no NVIDIA driver or GPU: host figures only
        return None

    def read() -> dict:
        return {"gpu": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                "mem": pynvml.nvmlDeviceGetMemoryInfo(handle).used / 1e9,
                "clock": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "power": pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3}

    return read


def main(pid: int, interval: float, gpu_index: int) -> None:
    tree, gpu = _Tree(pid), _gpu(gpu_index)
    out = sys.stdout
    t0 = time.perf_counter()
    cpu0, disk0, own0 = psutil.cpu_times(), psutil.disk_io_counters(), tree.cpu(t0)
    out.write(json.dumps({"ready": True, "gpu": gpu is not None}) + "\n")
    out.flush()
    while psutil.pid_exists(pid):
        time.sleep(max(0.0, interval - (time.perf_counter() - t0)))
        t1 = time.perf_counter()
        cpu1, disk1, own1 = psutil.cpu_times(), psutil.disk_io_counters(), tree.cpu(t1)
        dt = t1 - t0
        idle0, idle1 = cpu0.idle + getattr(cpu0, "iowait", 0.0), cpu1.idle + getattr(cpu1, "iowait", 0.0)
        s = {"t": t1, "cpu": ((sum(cpu1) - idle1) - (sum(cpu0) - idle0)) / dt,
             "own": max(0.0, own1 - own0) / dt,
             "iow": (getattr(cpu1, "iowait", 0.0) - getattr(cpu0, "iowait", 0.0)) / max(sum(cpu1) - sum(cpu0), 1e-9)}
        if disk0 is not None and disk1 is not None:
            s["disk"] = (disk1.read_bytes - disk0.read_bytes) / dt / 1e6
        if gpu is not None:
            s.update(gpu())
        try:
            out.write(json.dumps(s) + "\n")
            out.flush()
        except (BrokenPipeError, OSError):  # the sampler stopped reading
            return
        t0, cpu0, disk0, own0 = t1, cpu1, disk1, own1


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
