"""The sampling loop of ``SystemSampler``, run as its own process: ``python probe.py PID INTERVAL GPU``.

Why a process: reading psutil's process tree and NVML ten times a second is Python work. In a
thread it takes the GIL from the training loop, which in a launch-bound trainer (yolo11n at the
ceiling keeps one core busy) costs step time one for one — 4 % measured on the H200 in-thread.
Here it costs the trainer one short line to parse per sample.

GPU names the training's GPU for NVML: its UUID (``GPU-...``, what ``SystemSampler`` passes: CUDA
and NVML number GPUs differently once CUDA_VISIBLE_DEVICES is set, as Ultralytics sets it for
``device=3``), an NVML index, or ``-`` for none.

"The machine" is the cores process PID may run on (its CPU affinity: a Slurm cpuset, taskset,
a container's cpuset), not every core of the host: load on other cores does not compete with it.

Writes one JSON line per sample to stdout: t (perf_counter s), cpu (cores busy among those),
busiest (the busiest one's busy share), own (cores busy in process PID and its descendants, this
probe excluded), iow (iowait share of those cores), disk (MB/s read), ram and swap (GB in use) and,
with an NVIDIA GPU, gpu (%), mem (GB), clock (SM MHz), power (W).
The first line says what is measured: ``{"ready": true, "gpu": bool, "cores": n}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
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
            try:
                kids = [p for p in self.root.children(recursive=True) if p.pid != me]
            except psutil.Error:  # the training ended (a kill): the loop sees it gone next
                kids = self.members[1:]
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


def _gpu(spec: str):
    if spec == "-":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        if spec.startswith("GPU-"):
            handle = pynvml.nvmlDeviceGetHandleByUUID(spec)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(spec))
    except Exception:  # no NVIDIA driver or GPU: host figures only
        return None

    unsupported = getattr(pynvml, "NVMLError_NotSupported", pynvml.NVMLError)
    readers = {"gpu": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
               "mem": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / 1e9,
               "clock": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
               "power": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3}

    def read() -> dict:
        values = {}
        for key, reader in list(readers.items()):
            try:
                values[key] = reader()
            except unsupported:  # N/A on this GPU (some report no utilisation or power): left out from now on,
                del readers[key]  # as on a GPU without it
            except pynvml.NVMLError:  # another failure (a timeout): this sample goes without it
                pass
        return values

    return read


def allowed_cpus(pid: int) -> list[int] | None:
    """The cores process ``pid`` may run on, or None where that cannot be read or is every core."""
    try:
        cpus = sorted(psutil.Process(pid).cpu_affinity())
    except (AttributeError, psutil.Error):  # no affinity API here (macOS)
        return None
    return None if len(cpus) >= (psutil.cpu_count() or 0) else cpus


class _Cores:
    """Per-core busy and iowait seconds over a set of cores (every core when ``cpus`` is None)."""

    def __init__(self, cpus: list[int] | None):
        self.cpus = cpus
        self.n = len(cpus) if cpus else psutil.cpu_count() or 1

    def read(self) -> tuple[list[float], float]:
        """(busy seconds of each core, iowait seconds of them all), cumulative."""
        every = psutil.cpu_times(percpu=True)
        times = every if self.cpus is None else [every[i] for i in self.cpus if i < len(every)]
        busy = [sum(t) - t.idle - getattr(t, "iowait", 0.0) for t in times]
        return busy, sum(getattr(t, "iowait", 0.0) for t in times)


def main(pid: int, interval: float, gpu_spec: str) -> None:
    # a Ctrl-C reaches the whole group: the training stops the probe (or the probe sees it gone), so it is not lost
    # before the training has said "interrupted"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tree, gpu, cores = _Tree(pid), _gpu(gpu_spec), _Cores(allowed_cpus(pid))
    out = sys.stdout
    t0 = time.perf_counter()
    (busy0, iow0), disk0, own0 = cores.read(), psutil.disk_io_counters(), tree.cpu(t0)
    out.write(json.dumps({"ready": True, "gpu": gpu is not None, "cores": cores.n}) + "\n")
    out.flush()
    while psutil.pid_exists(pid):
        time.sleep(max(0.0, interval - (time.perf_counter() - t0)))
        t1 = time.perf_counter()
        (busy1, iow1), disk1, own1 = cores.read(), psutil.disk_io_counters(), tree.cpu(t1)
        dt = t1 - t0
        # a core is busy at most all the time: /proc/stat counts in ticks (10 ms), so over a short interval a
        # core's ticks can outrun the wall clock read beside them
        per_core = [min(1.0, max(0.0, b1 - b0) / dt) for b0, b1 in zip(busy0, busy1)]
        mem, swap = psutil.virtual_memory(), psutil.swap_memory()
        s = {"t": t1, "cpu": sum(per_core), "busiest": max(per_core, default=0.0),
             "own": max(0.0, own1 - own0) / dt, "iow": max(0.0, iow1 - iow0) / max(cores.n * dt, 1e-9),
             "ram": (mem.total - mem.available) / 1e9, "swap": swap.used / 1e9}
        if disk0 is not None and disk1 is not None:
            s["disk"] = (disk1.read_bytes - disk0.read_bytes) / dt / 1e6
        if gpu is not None:
            s.update(gpu())
        try:
            out.write(json.dumps(s) + "\n")
            out.flush()
        except (BrokenPipeError, OSError):  # the sampler stopped reading
            return
        t0, busy0, iow0, disk0, own0 = t1, busy1, iow1, disk1, own1


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
    except KeyboardInterrupt:  # a Ctrl-C reaches the whole group: the run says "interrupted", not the probe
        sys.exit(130)
    except psutil.NoSuchProcess:  # the training it samples ended (a kill) before it began: nothing to say
        sys.exit(0)
    except Exception as e:  # said by the sampler in one line (the training's output gets no traceback)
        with contextlib.suppress(OSError):
            sys.stdout.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
            sys.stdout.flush()
        sys.exit(1)
