"""A background sampler of GPU and host load: NVML utilisation and memory, CPU cores busy, disk reads.

NVML's "utilisation" is the share of time some kernel ran, not how much of the chip worked: a GPU
at 90 % can still use a few per cent of its matrix rate. It is what ``nvidia-smi`` shows users.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

import psutil


@dataclass
class SystemStats:
    """Means over a sampling period (None where the machine has no NVIDIA GPU).

    ``cpu_cores_busy`` counts the whole machine; ``own_cores_busy`` this process and its children
    (DataLoader workers); ``iowait`` is the share of CPU time waiting on disk.
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
    """Samples every ``interval`` seconds in a daemon thread between ``start()`` and ``stop()``."""

    def __init__(self, interval: float = 0.1, gpu_index: int = 0):
        self.interval, self.gpu_index = interval, gpu_index
        self._reset()
        self.cores = psutil.cpu_count() or 1
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self._handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
            self._nvml = pynvml
        except Exception:  # no NVIDIA driver or GPU: host figures only
            self._handle = None

    @staticmethod
    def _own_cpu() -> float:
        """CPU seconds used by this process and its live children (DataLoader workers)."""
        me = psutil.Process()
        total = sum(me.cpu_times()[:2])
        for child in me.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.Error:  # exited between listing and reading
                pass
        return total

    def _run(self) -> None:
        cpu0, disk0, t0, own0 = psutil.cpu_times(), psutil.disk_io_counters(), time.perf_counter(), self._own_cpu()
        while not self._halt.wait(self.interval):
            cpu1, disk1, t1, own1 = psutil.cpu_times(), psutil.disk_io_counters(), time.perf_counter(), self._own_cpu()
            busy = (sum(cpu1) - cpu1.idle - getattr(cpu1, "iowait", 0.0)) - (sum(cpu0) - cpu0.idle - getattr(cpu0, "iowait", 0.0))
            self._cpu.append(busy / (t1 - t0))  # cores busy: CPU-seconds per second
            self._own.append(max(0.0, own1 - own0) / (t1 - t0))  # a worker that exited drops its time: clamp
            self._iow.append((getattr(cpu1, "iowait", 0.0) - getattr(cpu0, "iowait", 0.0)) / max(sum(cpu1) - sum(cpu0), 1e-9))
            own0 = own1
            if disk0 is not None and disk1 is not None:
                self._disk.append((disk1.read_bytes - disk0.read_bytes) / (t1 - t0) / 1e6)
            if self._handle is not None:
                nv, h = self._nvml, self._handle
                self._gpu.append(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                self._mem.append(nv.nvmlDeviceGetMemoryInfo(h).used / 1e9)
                self._clock.append(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
                self._power.append(nv.nvmlDeviceGetPowerUsage(h) / 1e3)
            self._t.append(t1)
            cpu0, disk0, t0 = cpu1, disk1, t1

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

    @property
    def has_gpu(self) -> bool:
        return self._handle is not None

    def _reset(self) -> None:
        self._gpu, self._mem, self._cpu, self._disk, self._t, self._own, self._iow = [], [], [], [], [], [], []
        self._clock, self._power = [], []

    def start(self) -> SystemSampler:
        self._reset()
        self._halt.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="yolofeed-sampler")
        self._thread.start()
        return self

    def stop(self) -> SystemStats:
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
        mean = lambda v: statistics.fmean(v) if v else None  # noqa: E731
        return SystemStats(len(self._cpu), mean(self._gpu), mean(self._mem), mean(self._cpu) or 0.0,
                           mean(self._disk) or 0.0, mean(self._own) or 0.0, mean(self._iow) or 0.0, self.cores,
                           mean(self._clock), mean(self._power))
