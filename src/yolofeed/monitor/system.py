"""A background sampler of GPU and host load: NVML utilisation and memory, CPU cores busy, disk reads.

NVML's "utilisation" is the share of time some kernel ran, not how much of the chip worked: a GPU
at 90 % can still use a few per cent of its matrix rate. It is what ``nvidia-smi`` shows users.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from typing import Any

import psutil


def nvml_spec(device: Any) -> str:
    """How the probe finds the training's GPU in NVML: its UUID for a CUDA device, ``-`` for a CPU run.

    Not the CUDA index: with CUDA_VISIBLE_DEVICES=3 (Ultralytics sets it for ``device=3``) the
    run's ``cuda:0`` is NVML's GPU 3, and reading NVML's GPU 0 would report another job's GPU.
    """
    if device is None:
        return "0"
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return "-"
    return f"GPU-{torch.cuda.get_device_properties(device.index or 0).uuid}"


@dataclass
class SystemStats:
    """Means over a sampling period (None where the machine has no NVIDIA GPU).

    ``cpu_cores_busy`` counts the cores this process may run on (its CPU affinity: the whole
    machine unless a cpuset or taskset narrows it), ``cores`` how many those are; ``own_cores_busy``
    this process and its children (DataLoader workers); ``iowait`` is the share of those cores'
    time waiting on disk.
    """

    samples: int
    gpu_util: float | None
    gpu_mem_gb: float | None
    cpu_cores_busy: float
    disk_read_mb_s: float
    own_cores_busy: float = 0.0
    iowait: float = 0.0
    cores: int = 0
    gpu_clock_mhz: float | None = None  # SM clock: a starved GPU drops to idle clocks between steps
    gpu_power_w: float | None = None


class SystemSampler:
    """Samples every ``interval`` seconds between ``start()`` and ``stop()``.

    The sampling runs in a separate process (``yolofeed.monitor.probe``), so it never holds this
    process's GIL; a daemon thread here only parses its one-line samples.
    """

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self._reset()
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else psutil.cpu_count() or 1
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            s = json.loads(line)
            if "ready" in s:
                self.cores = s["cores"]
                self._ready.set()
                continue
            with self._lock:  # one sample lands in one window, whole (see restart_window)
                self._cpu.append(s["cpu"])
                self._own.append(s["own"])
                self._iow.append(s["iow"])
                if "disk" in s:
                    self._disk.append(s["disk"])
                if "gpu" in s:
                    self._gpu.append(s["gpu"])
                    self._mem.append(s["mem"])
                    self._clock.append(s["clock"])
                    self._power.append(s["power"])
                self._t.append(s["t"])  # last: readers index the other lists by len(self._t)

    def restart_window(self) -> None:
        """Forget the samples so far: the means from now on cover what follows (the probe keeps running)."""
        with self._lock:
            self._reset()

    def recent(self, seconds: float) -> SystemStats:
        """Means over the samples of the last ``seconds`` (for live alerts and gauges)."""
        if not self._t:
            return SystemStats(0, None, None, 0.0, 0.0)
        cut = self._t[-1] - seconds
        k = next((i for i in range(len(self._t) - 1, -1, -1) if self._t[i] < cut), -1) + 1
        mean = lambda v: statistics.fmean(v[k:]) if len(v) > k else None  # noqa: E731
        return SystemStats(len(self._t) - k, mean(self._gpu), mean(self._mem), mean(self._cpu) or 0.0,
                           mean(self._disk) or 0.0, mean(self._own) or 0.0, mean(self._iow) or 0.0, self.cores,
                           mean(self._clock), mean(self._power))

    def timeline(self) -> dict[str, list]:
        """Every sample: time (s, from the first), GPU %, machine and own cores busy, disk MB/s."""
        t0 = self._t[0] if self._t else 0.0
        return {"t": [t - t0 for t in self._t], "gpu_util": list(self._gpu), "gpu_clock_mhz": list(self._clock),
                "cpu_cores_busy": list(self._cpu),
                "own_cores_busy": list(self._own), "disk_read_mb_s": list(self._disk), "t0": t0}

    def _reset(self) -> None:
        self._gpu, self._mem, self._cpu, self._disk, self._t, self._own, self._iow = [], [], [], [], [], [], []
        self._clock, self._power = [], []

    def start(self, device: Any = None, timeout: float = 10.0) -> SystemSampler:
        """Start the probe process and wait (up to ``timeout`` s) until it samples: the window starts now.

        Args:
            device: the training's torch device; NVML then reads that GPU. None: the first GPU NVML lists.
        """
        self.stop()
        self._reset()
        self._ready = threading.Event()
        # by path, not ``-m yolofeed.monitor.probe``: the package would import torch and Ultralytics (seconds)
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("probe.py")), str(os.getpid()), str(self.interval),
             nvml_spec(device)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, args=(self._proc,), daemon=True, name="yolofeed-sampler")
        self._thread.start()
        self._ready.wait(timeout)
        return self

    def stop(self) -> SystemStats:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
            self._thread.join()  # the pipe is closed: the reader has seen every sample
            self._proc.stdout.close()
            self._proc = None
        mean = lambda v: statistics.fmean(v) if v else None  # noqa: E731
        return SystemStats(len(self._cpu), mean(self._gpu), mean(self._mem), mean(self._cpu) or 0.0,
                           mean(self._disk) or 0.0, mean(self._own) or 0.0, mean(self._iow) or 0.0, self.cores,
                           mean(self._clock), mean(self._power))
