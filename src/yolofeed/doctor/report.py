"""The doctor's report folder: report.json, timeline.png, breakdown.png and a self-contained report.html."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import html
import io
import json
import os
import shlex
import stat
import tempfile
from pathlib import Path
from typing import Any

from yolofeed.atomic import MEANINGS, write_atomically
from yolofeed.doctor.rules import Verdict
from yolofeed.errors import ConfigError, YolofeedError
from yolofeed.monitor.steps import PHASES

COLOURS = {"data_wait": "#d62728", "preprocess": "#ff7f0e", "forward": "#1f77b4", "loss": "#9467bd",
           "backward": "#2ca02c", "optimizer": "#8c564b"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """``fig`` as ``path`` (its format named by the suffix), whole or not at all (``write_atomically``: a full disk
    leaves the file before or none, never part of one; a link at ``path`` is replaced, not written through); the
    figure is closed either way."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=Path(path).suffix[1:] or "png")
    finally:
        _plt().close(fig)
    write_atomically(path, buf.getbuffer())


def not_written(key: str, value: Any, out: Path, e: OSError, stands: str, kept: str = "") -> YolofeedError:
    """The one line for a report that could not be written after minutes of measuring: the file, what the error
    means, that ``stands`` (printed above) is not lost, what an earlier write ``kept`` on disk, the fix."""
    meaning = MEANINGS.get(e.errno, "the write failed")
    what = Path(e.filename).name if getattr(e, "filename", None) else "the report"
    return YolofeedError(f"{key}={value}: {what} could not be written in {out}: {meaning} ({e.strerror or e}); "
                         f"{stands} above stands{kept}. Mend that, or choose another {key}=, and run again.")


def unwritten(e: OSError) -> str:
    """``report: not written (...)``'s words: the error's own (``not_written``'s line after it says the rest)."""
    return str(e.strerror or e)


def timeline_png(profiles: list[dict], path: Path) -> None:
    """GPU utilisation, per-step data-wait share, CPU cores busy and disk reads over time, one line per run."""
    plt = _plt()
    fig, axes = plt.subplots(4, 1, figsize=(8, 7.5), dpi=110, sharex=True)
    for p in profiles:
        t = p["timeline"]
        label = p["mode"]
        if any(v is not None for v in t.get("gpu_util", [])):
            axes[0].plot(t["t"], t["gpu_util"], label=label)
        axes[1].plot(t.get("step_t", []), [100 * w for w in t.get("step_wait_fraction", [])], ".-", label=label)
        axes[2].plot(t["t"], t["own_cores_busy"], label=f"{label} (this run)")
        axes[2].plot(t["t"], t["cpu_cores_busy"], ":", label=f"{label} (machine)")
        axes[3].plot(t["t"], t["disk_read_mb_s"], label=label)
    for ax, name in zip(axes, ("GPU busy (%)", "data wait (% of step)", "CPU cores busy", "disk read (MB/s)")):
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7, loc="upper right")
        else:
            ax.text(0.5, 0.5, "no GPU in this run", ha="center", va="center", transform=ax.transAxes, color="#888")
    axes[0].set_ylim(0, 105)
    axes[1].set_ylim(0, 105)
    axes[-1].set_xlabel("seconds after warm-up")
    fig.tight_layout()
    save_figure(fig, path)


def breakdown_png(profiles: list[dict], path: Path) -> None:
    """Mean step time split into phases, one stacked bar per run."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.7 * len(profiles)), dpi=110)
    names = [p["mode"] for p in profiles]
    left = [0.0] * len(profiles)
    for phase in PHASES:
        widths = [p["phases_ms"].get(phase, 0.0) for p in profiles]
        ax.barh(names, widths, left=left, color=COLOURS[phase], label=phase.replace("_", " "))
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("ms per step")
    ax.legend(fontsize=7, ncol=6, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    save_figure(fig, path)


FILES = ("report.json", "report.html", "timeline.png", "breakdown.png")  # what ``write`` puts in the folder


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{path.stem}" src="data:image/png;base64,{data}" style="max-width:100%">'


def writable_folder(path: str, key: str = "out", reports: tuple[str, ...] = ()) -> Path:
    """``path`` as a folder this process can write in, made if missing: checked before minutes of profiling.

    Args:
        reports: the files the command writes there at its end (replaced whole, by a rename): a folder at one of those
            names would refuse that rename after every run.

    Raises:
        ConfigError: it cannot be made or written in (a file in the way, no permission, a read-only disk), or a
            report's name is a folder.
    """
    try:
        folder = Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as e:  # a symbolic link loop: RuntimeError before Python 3.13, OSError after
        raise ConfigError(f"{key}={path}: cannot resolve the path ({e}); pass {key}= a folder that is not a link loop"
                          ) from None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass  # created and removed: the folder takes files
    except OSError as e:
        raise ConfigError(f"{key}={path}: cannot write in {folder} ({e.strerror or e}); pass {key}= a folder "
                          "you can write in") from None
    for name in reports:
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(folder / name).st_mode):
                raise ConfigError(f"{key}={path}: {folder / name} is a folder where the report {name} goes; move it "
                                  f"away, or pass another {key}=")
    return folder


def command_line(command: str, cfg: Any) -> str:
    """The ``yolofeed`` command that asks for ``cfg``: its keys away from their defaults, then the passed-through ones.

    Rebuilt from the configuration rather than read from ``sys.argv``, so it is the same from the CLI,
    ``python -m yolofeed`` or a library call.
    """
    words = ["yolofeed", command]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.metadata.get("passthrough"):
            words += [f"{k}={v}" for k, v in value.items()]
        elif value != f.default:
            words.append(f"{f.name}={value}")
    return shlex.join(words)


ENV_ROWS = (("date", "Date (UTC)"), ("command", "Command"), ("versions", "Versions"), ("host", "Host"),
            ("cpu", "CPU"), ("ram", "RAM"), ("gpu", "GPU"))


def _env_rows(env: dict[str, Any], command: str) -> dict[str, str]:
    gpus = env.get("gpus") or []
    return {"date": env.get("date", "-"), "command": command,
            "versions": f"yolofeed {env.get('yolofeed')}, Ultralytics {env.get('ultralytics')}, "
                        f"torch {env.get('torch')}, CUDA {env.get('cuda') or '-'}, "
                        f"NVIDIA driver {env.get('driver') or '-'}, Python {env.get('python')}",
            "host": f"{env.get('host')} ({env.get('os')})",
            "cpu": f"{env.get('cpu')}, {env.get('cores')} cores ({env.get('usable_cores')} usable by the run)",
            "ram": f"{env.get('ram_gb')} GB",
            "gpu": ", ".join(gpus) if gpus else "none (no NVIDIA driver found)"}


def write(out: Path, config: dict, profiles: list[dict], verdicts: list[Verdict],
          env: dict[str, Any] | None = None) -> Path:
    """Write the report folder; returns the path of report.html (opens offline: images are inline).

    Args:
        config: the doctor's settings; ``summary`` and ``command`` are shown at the top.
        env: ``monitor.system.environment()``: date, versions, host, GPUs (shown, and kept in report.json).
    """
    out.mkdir(parents=True, exist_ok=True)
    timeline_png(profiles, out / "timeline.png")
    breakdown_png(profiles, out / "breakdown.png")
    env = env or {}
    report = {"config": config, "environment": env, "verdicts": [v.__dict__ for v in verdicts],
              "profiles": profiles}
    write_atomically(out / "report.json", json.dumps(report, indent=1, default=str).encode())
    e = html.escape
    about = _env_rows(env, config.get("command", "-"))
    env_table = "".join(f"<tr><th>{e(label)}</th><td>{e(str(about[k]))}</td></tr>" for k, label in ENV_ROWS)
    def util(p: dict) -> str:
        if p["gpu_util"] is None:
            return "-"
        clock = f" at {p['gpu_clock_mhz']:,.0f} MHz" if p.get("gpu_clock_mhz") else ""
        return f"{p['gpu_util']:.0f} %{clock}"

    def memory(p: dict) -> str:
        if p.get("ram_used_gb") is None:
            return "-"
        return f"{p['ram_used_gb']:.1f} GB" + (f", swap {p['swap_used_gb']:.1f} GB" if p.get("swap_used_gb") else "")

    def flops(p: dict) -> str:
        if p.get("train_tflops") is None:
            return "-"
        return f"{p['train_tflops']:.1f}" + (f" ({100 * p['mfu']:.1f} % MFU)" if p.get("mfu") is not None else "")

    def mean_step(p: dict) -> str:
        return f"{p['mean_step_ms']:.1f}" if p.get("mean_step_ms") else "-"

    rows = "".join(
        f"<tr><td>{e(p['mode'])}</td><td>{p['images_per_s']:,.0f}</td><td>{mean_step(p)}</td>"
        f"<td>{p['step_ms']:.1f}</td>"
        f"<td>{100 * p['data_wait_fraction']:.0f} %</td><td>{util(p)}</td><td>{flops(p)}</td>"
        f"<td>{p['own_cores_busy']:.1f} / {p['cores']}</td><td>{100 * p.get('busiest_core', 0):.0f} %</td>"
        f"<td>{memory(p)}</td></tr>" for p in profiles)
    items = "".join(
        f"<li class='{'main' if v.bottleneck else 'also'}'><b>{e(v.title)}</b><br><span>{e(v.evidence)}</span>"
        f"<ul>{''.join(f'<li>{e(a)}</li>' for a in v.advice)}</ul></li>" for v in verdicts)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>yolofeed doctor</title>
<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}
table.env td,table.env th{{text-align:left}}table.env td{{font-family:monospace}}
li.main>b{{color:#b00}}li{{margin-bottom:.8em}}span{{color:#555}}</style></head><body>
<h1>yolofeed doctor</h1><p>{e(config.get('summary', ''))}</p>
<table class="env">{env_table}</table>
<h2>Verdict</h2><ul>{items}</ul>
<h2>Measured</h2><table><tr><th>run</th><th>img/s</th><th>mean step, ms<br>(wall time / steps)</th>
<th>median step, ms</th><th>data wait</th><th>GPU busy</th><th>training TFLOP/s</th>
<th>cores busy / cores</th><th>busiest core</th><th>RAM in use</th></tr>{rows}</table>
<h2>Step breakdown</h2>{_img(out / 'breakdown.png')}
<h2>Timeline</h2>{_img(out / 'timeline.png')}
<p style="color:#888">Figures: img/s is the median rate over windows of steps after warm-up; the mean step is the
measured steps' wall time over their number and agrees with it (batch / mean step), while the median step is the
typical step, which hides the waiting when batches arrive in bursts. GPU busy is NVML utilisation (time a kernel
ran), not the share of the chip's arithmetic used; training TFLOP/s is img/s x 3 x the model's forward GFLOPs at
the training size (Ultralytics' count), and MFU its share of the GPU's dense bf16/fp16 peak (the vendor's datasheet).
Raw numbers in report.json.</p></body></html>"""
    write_atomically(out / "report.html", page.encode("utf-8"))
    return out / "report.html"
