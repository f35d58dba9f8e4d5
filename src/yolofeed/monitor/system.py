"""A background sampler of GPU and host load: NVML utilisation and memory, CPU cores busy, disk reads.

NVML's "utilisation" is the share of time some kernel ran, not how much of the chip worked: a GPU
at 90 % can still use a few per cent of its matrix rate. It is what ``nvidia-smi`` shows users.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from yolofeed.limits import usable_cores


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
    time waiting on disk; ``busiest_core`` the busy share of the busiest of them (a training loop
    that has one core to itself and still starves the GPU shows 1.0 there).
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
    busiest_core: float = 0.0
    ram_used_gb: float | None = None
    swap_used_gb: float | None = None


# the probe's sample keys -> SystemStats fields, and what a field is without samples
LOGGER = logging.getLogger(__name__)
PROBE_STOP_S = 5.0  # how long a stop waits for the probe to end on SIGTERM before it kills it
GROUP_SIGNALS = (-15, 143)  # how a probe ends on a SIGTERM sent to the training's whole process group
FIELDS = {"gpu": ("gpu_util", None), "mem": ("gpu_mem_gb", None), "cpu": ("cpu_cores_busy", 0.0),
          "disk": ("disk_read_mb_s", 0.0), "own": ("own_cores_busy", 0.0), "iow": ("iowait", 0.0),
          "clock": ("gpu_clock_mhz", None), "power": ("gpu_power_w", None), "busiest": ("busiest_core", 0.0),
          "ram": ("ram_used_gb", None), "swap": ("swap_used_gb", None)}


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
        self._stop_asked = threading.Event()
        self.lost: str | None = None  # why the probe ended on its own, once it has

    def _read(self, proc: subprocess.Popen) -> None:
        why = None
        for line in proc.stdout:
            try:
                s = json.loads(line)
            except ValueError:  # not the probe's (a library's print): not a sample
                continue
            if not isinstance(s, dict):
                continue
            if "error" in s:
                why = s["error"]
                continue
            if "ready" in s:
                self.cores = s["cores"]
                self._ready.set()
                continue
            with self._lock:  # one sample lands in one window, whole (see restart_window)
                for key in FIELDS.keys() & s.keys():
                    self._series[key].append(s[key])
                self._t.append(s["t"])  # last: readers index the series by len(self._t)
        self._ready.set()  # a probe that failed before its first sample: start() waits no longer
        code = proc.wait()
        if code in GROUP_SIGNALS:  # a SIGTERM to the whole group (a scheduler's stop): the training stops it next
            self._stop_asked.wait(PROBE_STOP_S)
        if not self._stop_asked.is_set() and proc is self._proc:  # it ended on its own (killed, or failed), not a
            # probe of an earlier start that a stop left behind: its last figures are not today's
            self.lost = why or f"it ended with exit code {code}"
            LOGGER.warning(f"yolofeed monitor: the system probe (PID {proc.pid}) stopped ({self.lost}): CPU, GPU and "
                           "disk figures are not sampled from here on; training goes on")

    def __len__(self) -> int:
        """Samples in the current window."""
        return len(self._t)

    def restart_window(self) -> None:
        """Forget the samples so far: the means from now on cover what follows (the probe keeps running)."""
        with self._lock:
            self._reset()

    def _stats(self, first: int = 0) -> SystemStats:
        """Means over the samples from index ``first`` on."""
        out = {}
        for key, (name, empty) in FIELDS.items():
            v = self._series[key][first:]
            out[name] = statistics.fmean(v) if v else empty
        return SystemStats(samples=len(self._t) - first, cores=self.cores, **out)

    def recent(self, seconds: float) -> SystemStats:
        """Means over the samples of the last ``seconds`` (for live alerts and gauges); none once the probe is lost
        (its last samples would read as now's for ever)."""
        if not self._t or self.lost:
            return self._stats(len(self._t))
        cut = self._t[-1] - seconds
        return self._stats(next((i for i in range(len(self._t) - 1, -1, -1) if self._t[i] < cut), -1) + 1)

    def timeline(self) -> dict[str, list]:
        """Every sample: time (s, from the first), GPU %, machine and own cores busy, disk MB/s."""
        t0 = self._t[0] if self._t else 0.0
        series = {FIELDS[k][0]: list(self._series[k]) for k in ("gpu", "clock", "cpu", "own", "disk", "ram", "swap")}
        return {"t": [t - t0 for t in self._t], **series, "t0": t0}

    def _reset(self) -> None:
        self._series: dict[str, list[float]] = {key: [] for key in FIELDS}
        self._t: list[float] = []

    def start(self, device: Any = None, timeout: float = 10.0) -> SystemSampler:
        """Start the probe process and wait (up to ``timeout`` s) until it samples: the window starts now.

        Args:
            device: the training's torch device; NVML then reads that GPU. None: the first GPU NVML lists.
        """
        self.stop()
        self._reset()
        self._ready = threading.Event()
        self._stop_asked, self.lost = threading.Event(), None
        # by path, not ``-m yolofeed.monitor.probe``: the package would import torch and Ultralytics (seconds)
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("probe.py")), str(os.getpid()), str(self.interval),
             nvml_spec(device)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, args=(self._proc,), daemon=True, name="yolofeed-sampler")
        self._thread.start()
        self._ready.wait(timeout)
        return self

    def stop(self) -> SystemStats:
        """End the probe; the means of the current window (``SystemStats.samples`` 0: none was taken, or the probe
        was lost before the window began, ``lost`` says why)."""
        self._stop_asked.set()
        if self._proc is not None:
            self._proc.terminate()
            if not _ended(self._proc, PROBE_STOP_S):  # a probe stuck in a driver call: SIGKILL is not ignored
                self._proc.kill()
                if not _ended(self._proc, PROBE_STOP_S):  # in the kernel (a GPU off the bus): left to the system
                    LOGGER.warning(f"yolofeed monitor: the system probe (PID {self._proc.pid}) did not end when "
                                   "killed; going on without it")
                    self._proc = None
                    return self._stats()
            self._thread.join(PROBE_STOP_S)  # the pipe is closed: the reader has seen every sample
            self._proc.stdout.close()
            self._proc = None
        return self._stats()


def _ended(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether ``proc`` ends within ``seconds``."""
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def _cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo on Linux, else what ``platform`` knows (macOS, Windows)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # older NVML bindings return bytes


def _nvidia() -> tuple[str | None, list[str]]:
    """(driver version, GPU model names) from NVML; (None, []) without an NVIDIA driver.

    NVML, not ``torch.cuda``: asking torch would initialise CUDA in this process before Ultralytics sets
    CUDA_VISIBLE_DEVICES for ``device=3``, and the run would then train on GPU 0.
    """
    try:
        import pynvml
    except ImportError:
        return None, []
    try:
        pynvml.nvmlInit()
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        names = [_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                 for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError:  # no NVIDIA driver or GPU on this machine
        return None, []
    return driver, names


def environment() -> dict[str, Any]:
    """What a report needs to be read on another desk: date, versions, host and GPUs.

    Returns:
        ``date`` (UTC, ISO 8601), ``yolofeed``, ``ultralytics``, ``torch``, ``cuda`` (torch's build, None
        without), ``driver`` (NVIDIA, None without), ``python``, ``os``, ``host``, ``cpu`` (model),
        ``cores`` (the machine's), ``usable_cores`` (this process's affinity, fewer under a cgroup's CPU quota:
        yolofeed.limits), ``ram_gb`` and ``gpus`` (the machine's NVIDIA GPUs by model name, as NVML lists them;
        empty without).
    """
    from importlib.metadata import PackageNotFoundError, version

    import torch

    import yolofeed

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    driver, gpus = _nvidia()
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "yolofeed": yolofeed.__version__, "ultralytics": installed("ultralytics"),
            "torch": torch.__version__, "cuda": torch.version.cuda, "driver": driver,
            "python": platform.python_version(), "os": platform.platform(), "host": platform.node(),
            "cpu": _cpu_model(), "cores": psutil.cpu_count() or 0,
            "usable_cores": usable_cores(),
            "ram_gb": round(psutil.virtual_memory().total / 1e9, 1), "gpus": gpus}
