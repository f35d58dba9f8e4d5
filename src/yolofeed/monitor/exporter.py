"""The live monitor's Prometheus endpoint: what it exports, under which names, and how it binds a port.

Names follow Prometheus' conventions: base units (seconds, bytes, hertz, watts), counters end in
``_total`` (graph them with ``rate()``), shares of 0-1 end in ``_ratio``. Every series carries a
``run`` label (the run folder's name, e.g. ``train3``); Prometheus adds ``job`` and ``instance``
from its scrape configuration, so the exporter sets neither.

The values are read at scrape time from the last snapshot the training thread published (once a
second by default): a scrape costs the training loop nothing, and a series whose value is unknown
(every ``yolofeed_gpu_*`` one on a machine without an NVIDIA GPU) is left out rather than shown as 0.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# name -> (kind, help, snapshot key). A snapshot value of None leaves the series out of the scrape.
METRICS: dict[str, tuple[str, str, str]] = {
    "yolofeed_steps_total": ("counter", "training steps finished", "steps"),
    "yolofeed_images_total": ("counter", "training images stepped over (batch size summed over steps)", "images"),
    "yolofeed_data_wait_seconds_total": ("counter", "seconds the training loop waited for its next batch",
                                         "data_wait_seconds"),
    "yolofeed_step_phase_seconds_total": ("counter", "seconds of training steps by phase (data_wait on the host "
                                          "clock; the others on CUDA events with a GPU)", "phase_seconds"),
    "yolofeed_alerts_total": ("counter", "low-utilisation alerts logged: GPU starved for data (one per episode)",
                              "alerts"),
    "yolofeed_disk_read_bytes_total": ("counter", "bytes read from the machine's disks since the run started",
                                       "disk_read_bytes"),
    "yolofeed_images_per_second": ("gauge", "training images per second over the last 50 steps", "images_per_s"),
    "yolofeed_data_wait_ratio": ("gauge", "share of step time waiting for data, last 50 steps (0-1)", "data_wait"),
    "yolofeed_low_utilization_alert": ("gauge", "1 while the GPU is starved for data (an alert episode), else 0",
                                       "alert_active"),
    "yolofeed_cpu_cores": ("gauge", "CPU cores the run may use (its affinity)", "cores"),
    "yolofeed_cpu_cores_busy": ("gauge", "CPU cores busy, of those the run may use (all processes)", "cpu_cores_busy"),
    "yolofeed_process_cpu_cores_busy": ("gauge", "CPU cores busy in the training process and its children",
                                        "own_cores_busy"),
    "yolofeed_cpu_iowait_ratio": ("gauge", "share of those cores' time waiting on disk (0-1)", "iowait"),
    "yolofeed_memory_used_bytes": ("gauge", "RAM in use on the machine (total - available)", "ram_used_bytes"),
    "yolofeed_swap_used_bytes": ("gauge", "swap in use on the machine", "swap_used_bytes"),
    "yolofeed_gpu_utilization_ratio": ("gauge", "NVML utilisation of the run's GPU: share of time a kernel ran (0-1)",
                                       "gpu_util"),
    "yolofeed_gpu_memory_used_bytes": ("gauge", "memory in use on the run's GPU (all processes, NVML)",
                                       "gpu_mem_bytes"),
    "yolofeed_gpu_sm_clock_hertz": ("gauge", "SM clock of the run's GPU", "gpu_clock_hz"),
    "yolofeed_gpu_power_watts": ("gauge", "power drawn by the run's GPU", "gpu_power_w"),
}
INFO = "yolofeed_run_info"  # one series with value 1: the run's folder and device as labels


class Collector:
    """A prometheus_client collector over ``snapshot()``: ``{key: value or {phase: value}}``, plus ``info``."""

    def __init__(self, run: str, snapshot: Callable[[], dict[str, Any]]):
        self.run, self.snapshot = run, snapshot

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        snap = self.snapshot()  # one dict, replaced whole by the training thread: a consistent set of values
        for name, (kind, doc, key) in METRICS.items():
            value = snap.get(key)
            if value is None:
                continue
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            if isinstance(value, dict):
                metric = family(name, doc, labels=["run", "phase"])
                for phase, v in value.items():
                    metric.add_metric([self.run, phase], float(v))
            else:
                metric = family(name, doc, labels=["run"])
                metric.add_metric([self.run], float(value))
            yield metric
        info = InfoMetricFamily(INFO.removesuffix("_info"), "the monitored run", labels=["run"])
        info.add_metric([self.run], {k: str(v) for k, v in snap.get("info", {}).items()})
        yield info


@dataclass
class Endpoint:
    """A running ``/metrics`` server; ``close()`` stops it."""

    server: Any
    addr: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def exposure(addr: str) -> str | None:
    """Who other than this machine can reach an endpoint bound to ``addr``, in words; None for a loopback address.

    A host name other than ``localhost`` counts as reachable: it may resolve to any interface.
    """
    if addr.strip().lower() == "localhost":
        return None
    try:
        ip = ipaddress.ip_address(addr.strip("[]"))
    except ValueError:
        return f"on {addr}, as that name resolves"
    if ip.is_loopback:
        return None
    return "on every network interface" if ip.is_unspecified else f"on {addr}"


def exposed_warning(endpoint: Endpoint, save_dir: str) -> str | None:
    """The warning for an endpoint other machines can reach (it has no authentication, and names the run's folder);
    None for one only this machine can."""
    where = exposure(endpoint.addr)
    if where is None:
        return None
    return (f"yolofeed monitor: prometheus_addr={endpoint.addr} serves {endpoint.url} {where}, without authentication: "
            f"anyone who can reach port {endpoint.port} of this machine can read the run's metrics, and they name "
            f"the run's folder ({save_dir}). To keep them on this machine, use prometheus_addr=127.0.0.1 (the "
            "default) and let Prometheus scrape through an SSH tunnel; otherwise allow only the Prometheus server to "
            "that port (a firewall)")


def serve(collector: Collector, addr: str, port: int, log: logging.Logger, tries: int = 10) -> Endpoint | None:
    """Serve ``collector`` on ``addr:port``; the next free port if that one is taken; None if none can be had.

    Monitoring must never stop training: a port in use moves to the next one (up to ``tries`` ports, and
    says which), any other failure to bind (an address this machine does not have, a port below 1024
    without the right) is logged as a warning and the run goes on without the endpoint.

    Args:
        port: 0 asks the operating system for a free port.
    """
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)  # private: several monitors (tests) never clash
    registry.register(collector)
    last = port if port == 0 else min(port + tries - 1, 65535)
    for p in range(port, last + 1):
        try:
            server, _ = start_http_server(p, addr=addr, registry=registry)
        except OSError as e:
            if e.errno == errno.EADDRINUSE and p < last:
                continue
            if e.errno == errno.EADDRINUSE:
                fix = "Choose a free prometheus_port= (or 0 for any free port)."
            elif e.errno == errno.EACCES:
                fix = "Ports below 1024 need privileges: choose prometheus_port=1024 or above."
            else:  # EADDRNOTAVAIL, or a name that does not resolve (socket.gaierror): the address is the problem
                fix = (f"prometheus_addr={addr} is not an address of this machine: use 127.0.0.1 (this machine only) "
                       "or 0.0.0.0 (every interface).")
            tried = f"{port}-{p}" if p > port else f"{p}"  # the ports tried: those taken, then this one
            log.warning(f"yolofeed monitor: no Prometheus endpoint on {addr}:{tried}"
                        + f" ({e.strerror or e}); training goes on "
                        f"without it. {fix}")
            return None
        endpoint = Endpoint(server, addr, server.server_port)
        if p != port:
            log.warning(f"yolofeed monitor: port {port} is in use; Prometheus metrics on port {endpoint.port} instead")
        return endpoint
    return None  # not reached: the loop returns on its last port
