"""``yolofeed doctor``: profile the user's own setup, then print and write the verdict."""

from __future__ import annotations

import tempfile
from pathlib import Path

from yolofeed.config import DoctorConfig
from yolofeed.doctor import report
from yolofeed.doctor.profile import profile
from yolofeed.doctor.rules import Facts, diagnose
from yolofeed.errors import ConfigError


def facts_from(stock: dict, yolofeed: dict | None, amp: bool) -> Facts:
    step = stock["step_ms"] or 1e-9
    ph = stock["phases_ms"]
    total = sum(ph.values()) or step
    return Facts(images_per_s=stock["images_per_s"], step_ms=stock["step_ms"], data_wait=stock["data_wait_fraction"],
                 preprocess_share=ph.get("preprocess", 0.0) / total, gpu_util=stock["gpu_util"], cores=stock["cores"],
                 machine_cores_busy=stock["cpu_cores_busy"], own_cores_busy=stock["own_cores_busy"],
                 iowait=stock["iowait"], disk_read_mb_s=stock["disk_read_mb_s"], workers=stock["workers"],
                 batch=stock["batch"], amp=amp, n_train=stock["n_train"], n_val=stock["n_val"],
                 val_images_per_s=stock["val_images_per_s"],
                 yolofeed_images_per_s=yolofeed["images_per_s"] if yolofeed else None,
                 callbacks_ms=stock.get("callbacks_ms") or None,
                 optimizer_share=ph.get("optimizer", 0.0) / total, optimizer=stock.get("optimizer", ""))


def run(cfg: DoctorConfig) -> list:
    """Profile stock (and yolofeed), diagnose, print the verdict, write the report folder."""
    if cfg.steps < 5:
        raise ConfigError(f"steps={cfg.steps}: the doctor needs at least 5 measured steps")
    args = {"model": cfg.model, "data": cfg.data, "imgsz": cfg.imgsz, "batch": cfg.batch, "workers": cfg.workers,
            **cfg.extra}
    modes = ["stock"] + (["yolofeed"] if cfg.yolofeed else [])
    profiles = []
    with tempfile.TemporaryDirectory(prefix="yolofeed-doctor-") as tmp:
        for k, mode in enumerate(modes):
            print(f"yolofeed doctor: profiling {mode} ({k + 1}/{len(modes)}): {cfg.warmup} warm-up + {cfg.steps} "
                  "steps" + (" + one validation pass" if mode == "stock" and cfg.time_validation else ""), flush=True)
            p = profile(mode, {**args, "project": tmp}, cfg.steps, cfg.warmup, window=max(1, cfg.steps // 5),
                        time_validation=cfg.time_validation and mode == "stock")
            profiles.append(p.to_dict())
    by_mode = {p["mode"]: p for p in profiles}
    verdicts = diagnose(facts_from(by_mode["stock"], by_mode.get("yolofeed"), bool(cfg.extra.get("amp", True))))
    summary = (f"{cfg.model} on {cfg.data}, batch {profiles[0]['batch']}, imgsz {cfg.imgsz}, "
               f"workers {profiles[0]['workers']}, device {profiles[0]['device']}, {cfg.steps} steps after "
               f"{profiles[0]['warmup']}")
    html = report.write(Path(cfg.out).expanduser().resolve(), {"summary": summary, **cfg.__dict__}, profiles, verdicts)
    lines = [f"yolofeed doctor: {summary}"]
    for p in profiles:
        util = f"GPU {p['gpu_util']:.0f} %" if p["gpu_util"] is not None else "no GPU"
        lines.append(f"  {p['mode']:<9} {p['images_per_s']:>8,.0f} img/s  data wait {100 * p['data_wait_fraction']:.0f} %  "
                     f"{util}  {p['own_cores_busy']:.1f}/{p['cores']} cores")
    for v in verdicts:
        lines.append(("VERDICT: " if v.bottleneck else "ALSO: ") + v.title)
        lines.append(f"  evidence: {v.evidence}")
        lines += [f"  - {a}" for a in v.advice]
    lines.append(f"report: {html}")
    print("\n".join(lines), flush=True)
    return verdicts
