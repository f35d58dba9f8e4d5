"""``yolofeed doctor``: profile the user's own setup, then print and write the verdict."""

from __future__ import annotations

from yolofeed.config import DoctorConfig
from yolofeed.doctor import report
from yolofeed.doctor.rules import Facts, diagnose
from yolofeed.errors import ConfigError
from yolofeed.measure.profile import profile
from yolofeed.measure.progress import Progress
from yolofeed.monitor.system import environment
from yolofeed.train import keys
from yolofeed.train.keys import check_device, model_task, refuse_run_folder_keys
from yolofeed.train.run import check_model_and_data


def trainer_class(mode: str, task: str = "detect") -> type:
    """The doctor profiles the user's setup as Ultralytics trains it (``stock``), then with ``yolofeed``; the trainers
    of the model's ``task`` (detect, segment, pose, obb)."""
    if mode == "stock":
        from yolofeed.ultralytics_seam import DetectionTrainer, OBBTrainer, PoseTrainer, SegmentationTrainer

        return {"detect": DetectionTrainer, "pose": PoseTrainer, "obb": OBBTrainer,
                "segment": SegmentationTrainer}[task]
    from yolofeed.train.tasks import TRAINERS

    return TRAINERS[task]


def facts_from(stock: dict, yolofeed: dict | None, amp: bool, task: str = "detect") -> Facts:
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
                 optimizer_share=ph.get("optimizer", 0.0) / total, optimizer=stock.get("optimizer", ""),
                 loss_share=ph.get("loss", 0.0) / total, task=task)


def workers_said(asked: int, stock: dict) -> str:
    """The DataLoader workers stock ran with, and why where that is not what ``workers=`` asked for."""
    used = stock["workers"]
    if used == asked:
        return str(used)
    cpu = stock["device"] in ("cpu", "mps")
    why = "Ultralytics trains on the CPU without DataLoader workers" if cpu else "set so by Ultralytics"
    return f"{used} (workers={asked} asked; {why})"


def run(cfg: DoctorConfig) -> list:
    """Profile stock (and yolofeed), diagnose, print the verdict, write the report folder.

    ``out=`` is checked before the profile starts, and the verdict is printed even when the report
    cannot be written afterwards (a full disk): minutes of profiling are never lost to the folder.
    """
    if cfg.steps < 5:
        raise ConfigError(f"steps={cfg.steps}: expected at least 5 (default 40): the doctor's breakdown needs 5 "
                          "measured steps")
    refuse_run_folder_keys(cfg.extra, "yolofeed doctor")
    check_device(cfg.extra.get("device"), ours=cfg.yolofeed)  # as yolofeed train checks it, before any profiling
    check_model_and_data(cfg.model, cfg.data, cfg.extra.get("split") or "val")  # and these, before out= is made
    if cfg.yolofeed:  # what yolofeed's side refuses (rect=True...): not after stock's profile
        keys.check({**cfg.extra, "model": cfg.model, "data": cfg.data})
    task = model_task(cfg.model, None)
    out = report.writable_folder(cfg.out, reports=report.FILES)
    runs = out / "runs"  # each mode's Ultralytics run folder (args.yaml, TensorBoard events when enabled)
    args = {"model": cfg.model, "data": cfg.data, "imgsz": cfg.imgsz, "batch": cfg.batch, "workers": cfg.workers,
            "project": str(runs), **cfg.extra}
    modes = ["stock"] + (["yolofeed"] if cfg.yolofeed else [])
    command = report.command_line("doctor", cfg)
    env = environment()
    profiles = []
    progress = Progress(modes, cfg.steps, cfg.warmup)
    # val=False: the run validates only its final weights, and the validation rule's advice would be its own setting
    time_validation = cfg.time_validation and cfg.extra.get("val", True) is not False
    try:
        for k, mode in enumerate(modes):
            progress.write(f"yolofeed doctor: profiling {mode} ({k + 1}/{len(modes)}): {cfg.warmup} warm-up + "
                           f"{cfg.steps} steps" + (" + one validation pass" if mode == "stock" and time_validation
                                                   else ""))
            p = profile(mode, trainer_class(mode, task), args, cfg.steps, cfg.warmup, window=max(1, cfg.steps // 5),
                        time_validation=time_validation and mode == "stock", progress=progress)
            profiles.append(p.to_dict())
    finally:
        progress.close()
    by_mode = {p["mode"]: p for p in profiles}
    verdicts = diagnose(facts_from(by_mode["stock"], by_mode.get("yolofeed"), bool(cfg.extra.get("amp", True)),
                                   task))
    batch, images = profiles[0]["batch"], profiles[0]["n_train"]
    batch_said = f"{batch} (the set's {images} images a step)" if images < batch else batch  # Ultralytics' loader
    summary = (f"{cfg.model} on {cfg.data}, batch {batch_said}, imgsz {cfg.imgsz}, "
               f"workers {workers_said(cfg.workers, profiles[0])}, device {profiles[0]['device']}, {cfg.steps} steps "
               f"after {profiles[0]['warmup']}")
    failed = None
    try:
        html = report.write(out, {"summary": summary, "command": command, **cfg.__dict__}, profiles, verdicts, env)
    except OSError as e:  # the disk filled or the folder went away while profiling: the verdict still stands
        failed = e
    lines = [f"yolofeed doctor: {summary}"]
    for p in profiles:
        util = f"GPU {p['gpu_util']:.0f} %" if p["gpu_util"] is not None else "no GPU"
        machine = f"{util}  {p['own_cores_busy']:.1f}/{p['cores']} cores"
        if p.get("machine_samples") == 0:  # the probe was lost: zeros, not measurements
            machine = "GPU and CPU not sampled"
        lines.append(f"  {p['mode']:<9} {p['images_per_s']:>8,.0f} img/s  mean step {p['mean_step_ms']:,.0f} ms  "
                     f"data wait {100 * p['data_wait_fraction']:.0f} %  {machine}")
        if p.get("probe_lost"):
            lines.append(f"  ({p['mode']}: the system probe stopped, {p['probe_lost']}: its GPU, CPU and disk figures "
                         "cover only the samples before; the verdicts that read them may not stand: run again)")
    for v in verdicts:
        lines.append(("VERDICT: " if v.bottleneck else "ALSO: ") + v.title)
        lines.append(f"  evidence: {v.evidence}")
        lines += [f"  - {a}" for a in v.advice]
    lines.append(f"report: {html}" if failed is None else f"report: not written ({report.unwritten(failed)})")
    print("\n".join(lines), flush=True)
    if failed is not None:
        raise report.not_written("out", cfg.out, out, failed, "the verdict")
    return verdicts
