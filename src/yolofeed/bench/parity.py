"""``yolofeed parity``: does yolofeed train as well as stock Ultralytics on this data? Seeds on both sides.

Each seed trains the same model from scratch twice, with Ultralytics' own trainer (``stock``) and with
``FastDetectionTrainer`` (``yolofeed``), every other setting equal. Runs are subprocesses spread over the
GPUs (``device=0,1``; ``parallel=N`` runs at once per GPU), each pinned to its share of the host's cores.
The answer is the difference of the two sides' mean final mAP50-95 with Welch's 95 % interval
(``bench/stats.py``), the per-epoch training losses of both sides, and a one-line verdict.

Parity holds when the mean difference is within +-0.5 mAP50-95 points, the interval's lower end is above -1.0 point,
and each training loss's mean +- sd bands of the two sides overlap in at least 90 % of epochs. A verdict needs at
least two seeds a side (more give a narrower interval), final values that are numbers, runs that learnt something (a
mean final mAP50-95 of 1 point or more a side) and a spread on each side (not every run at the same value): without
them the verdict line says what is missing and ``passed`` is null. A comparison stopped early (Ctrl-C: exit 130;
SIGTERM: exit 143) stops its runs, keeps what finished in parity.json and gives no verdict. The runs an earlier
comparison in ``out=`` finished with the same settings are kept, not trained again (``finished_before``): the same
command goes on where it stopped, and ``first_seed=`` adds seeds to it.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from yolofeed import processes
from yolofeed.atomic import read_back
from yolofeed.bench.stats import Difference, bands_overlap, mean_sd, welch
from yolofeed.config import ParityConfig
from yolofeed.errors import ConfigError, YolofeedError
from yolofeed.limits import usable_cores
from yolofeed.processes import kill_with_parent

SIDES = ("stock", "yolofeed")
COLOURS = {"stock": "#999999", "yolofeed": "#2a7ab0"}
MAP, MAP50 = "metrics/mAP50-95(B)", "metrics/mAP50(B)"  # the boxes' (every task's results.csv has them)
TASK_METRICS = ("P", "M", "B")  # the task's own metric first: pose's keypoints (P), segmentation's masks (M), boxes


def metrics(jobs: list[Job]) -> tuple[str, str]:
    """The results.csv columns the comparison is made on: the task's own mAP50-95 and mAP50 (a pose run's (P), a
    segmentation run's (M), else the boxes')."""
    keys = {k for j in jobs if j.ok for k in j.curves}
    kind = next((t for t in TASK_METRICS if f"metrics/mAP50-95({t})" in keys), "B")
    return f"metrics/mAP50-95({kind})", f"metrics/mAP50({kind})"


def metric_name(jobs: list[Job]) -> str:
    """How the verdict names the metric: "mAP50-95" for boxes, "mAP50-95(P)" for keypoints..."""
    key = metrics(jobs)[0]
    return "mAP50-95" if key == MAP else key.split("/", 1)[1]


MEAN_BAR, LOW_BAR, OVERLAP_BAR = 0.5, -1.0, 0.9  # points, points, share of epochs
LEARNT_FLOOR = 1.0  # mAP50-95 points: a side whose runs end below it on average learnt too little to compare
LEARN_MORE = "train longer: epochs=, or check the data and the labels"


@dataclass
class Job:
    """One training: a side and a seed, where it runs, and what came of it."""

    side: str
    seed: int
    name: str
    log: Path
    device: str = ""
    cores: list[int] = field(default_factory=list)
    returncode: int | None = None
    wall_s: float = 0.0
    curves: dict[str, list[float]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.curves.get(MAP))


# -- scheduling --------------------------------------------------------------------------------------------
def devices_of(device: str) -> list[str]:
    """``device=`` as a list of places to run: GPU indices, or ["cpu"]."""
    text = str(device).strip().lower()
    if text in ("", "none"):
        import torch

        return ["0"] if torch.cuda.is_available() else ["cpu"]
    if text == "cpu":
        return [text]
    parts = [p.strip() for p in text.replace("cuda:", "").split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise ConfigError(f"device={device}: expected cpu, a GPU index, or GPU indices like 0,1")
    return parts


def slots(devices: list[str], parallel: int, cores: list[int]) -> list[tuple[str, list[int]]]:
    """Where runs go: ``parallel`` slots per device, the cores split evenly between all of them (shared round
    robin when there are fewer cores than slots)."""
    places = [d for d in devices for _ in range(parallel)]
    share = max(1, len(cores) // len(places))
    return [(d, [cores[(k * share + i) % len(cores)] for i in range(share)]) for k, d in enumerate(places)]


def _preexec(cores: list[int]):
    """In the child, before exec: its own cores, and death with the parent (Linux), so a killed parity
    run never leaves trainings behind on the GPUs."""
    def setup() -> None:
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)
        kill_with_parent()  # not Linux: the parent's handler below still stops them
    return setup


def _launch(job: Job, spec: dict) -> subprocess.Popen:
    env = os.environ | {"YOLO_OFFLINE": "1", "OMP_NUM_THREADS": str(max(1, len(job.cores)))}
    if job.device.isdigit():
        env["CUDA_VISIBLE_DEVICES"] = job.device  # the run sees one GPU, as cuda:0
    job.log.parent.mkdir(parents=True, exist_ok=True)
    from yolofeed.atomic import NOFOLLOW

    # never through a link planted at the log's name (no_links refused one before the runs: this is its last guard)
    log = os.fdopen(os.open(job.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o666), "w")
    try:
        return subprocess.Popen([sys.executable, "-m", "yolofeed.bench.parity", json.dumps(spec)], stdout=log,
                                stderr=subprocess.STDOUT, env=env, preexec_fn=_preexec(job.cores),
                                start_new_session=True)
    finally:
        log.close()


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)  # the run and its DataLoader workers
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


# -- one run (in the child process) ---------------------------------------------------------------------------
def train_one(spec: dict) -> None:
    """Train one side of one seed; ``spec`` holds the side, the model and Ultralytics' train arguments."""
    from yolofeed.ultralytics_seam import YOLO

    trainer = None
    if spec["side"] == "yolofeed":
        from yolofeed.train.keys import model_task
        from yolofeed.train.tasks import TRAINERS

        trainer = TRAINERS[model_task(spec["model"], None)].with_options(**spec["options"])
    t0 = time.perf_counter()
    YOLO(spec["model"]).train(trainer=trainer, **spec["args"])
    Path(spec["args"]["project"], spec["args"]["name"], "wall.json").write_text(
        json.dumps({"wall_s": time.perf_counter() - t0}))


# -- results ----------------------------------------------------------------------------------------------------
def read_curves(run_dir: Path) -> dict[str, list[float]]:
    """results.csv columns by name (Ultralytics pads names with spaces), one value per epoch."""
    path = run_dir / "results.csv"
    if not path.is_file():
        return {}
    with open(path) as f:
        rows = [{k.strip(): v for k, v in r.items()} for r in csv.DictReader(f)]
    return {k: [float(r[k]) for r in rows] for k in (rows[0] if rows else {}) if k != "epoch"}


@dataclass
class Summary:
    """Both sides' final metrics, their difference, the loss bands and the verdict."""

    seeds: dict[str, list[int]]
    final: dict[str, dict[str, list[float]]]  # side -> metric -> per seed (points)
    difference: Difference
    overlap: dict[str, float]  # loss -> share of epochs whose mean +- sd bands overlap
    passed: bool | None
    verdict: str
    not_written: OSError | None = None  # parity.json's write failed (``_report``): said after the table


def summarise(jobs: list[Job]) -> Summary:
    """The comparison over the runs that finished; see the module docstring for the bar.

    No verdict comes from fewer than two runs a side, from a final mAP that is not a number, from a side whose runs
    all ended at 0 (nothing learnt: every model is equally useless), or from a side whose runs all ended at the same
    value (no spread: the interval would be a point). The verdict then says what is missing, and ``passed`` is None.
    """
    done = {s: sorted((j for j in jobs if j.side == s and j.ok), key=lambda j: j.seed) for s in SIDES}
    key, key50 = metrics(jobs)
    name = metric_name(jobs)
    final = {s: {"map50_95": [100 * j.curves[key][-1] for j in done[s]],
                 "map50": [100 * j.curves[key50][-1] for j in done[s]]} for s in SIDES}
    d = welch(final["stock"]["map50_95"], final["yolofeed"]["map50_95"])
    losses = sorted({k for s in SIDES for j in done[s] for k in j.curves if k.startswith("train/")})
    overlap = {}
    for k in losses:
        arrays = [_stack([j.curves.get(k, []) for j in done[s]]) for s in SIDES]
        if all(a.size for a in arrays) and arrays[0].shape[1] == arrays[1].shape[1]:
            overlap[k] = float(bands_overlap(*arrays).mean())
    n = {s: len(done[s]) for s in SIDES}
    seeds = f"{n['stock']} stock / {n['yolofeed']} yolofeed seeds" if n["stock"] != n["yolofeed"] \
        else f"{n['stock']} seed{'' if n['stock'] == 1 else 's'} each"
    missing = _missing(done, final, n, seeds)
    if missing:
        so_far = f"; difference so far {d.diff:+.2f} points" if math.isfinite(d.diff) else ""
        return Summary({s: [j.seed for j in done[s]] for s in SIDES}, final, d, overlap, None,
                       f"no verdict: {'; '.join(missing)}{so_far}")
    ci = f"(95 % CI {d.low:+.2f} … {d.high:+.2f}, {seeds})"
    if d.low > 0:
        verdict = f"yolofeed trains better: {d.diff:+.2f} {name} points {ci}"
    elif d.high < 0:
        verdict = f"yolofeed trains worse: {d.diff:+.2f} {name} points {ci}"
    else:
        verdict = f"no difference detected: {d.diff:+.2f} {name} points {ci}"
    fails = []
    if abs(d.diff) > MEAN_BAR:
        fails.append(f"|difference| > {MEAN_BAR}")
    if not d.low > LOW_BAR:
        fails.append(f"CI lower end <= {LOW_BAR}")
    fails += [f"{k} bands overlap in {100 * v:.0f} % of epochs" for k, v in overlap.items() if v < OVERLAP_BAR]
    verdict += "; parity holds" if not fails else f"; parity not shown ({', '.join(fails)})"
    return Summary({s: [j.seed for j in done[s]] for s in SIDES}, final, d, overlap, not fails, verdict)


def _missing(done: dict[str, list[Job]], final: dict, n: dict[str, int], seeds: str) -> list[str]:
    """What a verdict lacks, in words; [] when the finished runs can carry one."""
    if min(n.values()) < 2:
        return [f"{seeds} finished, and a verdict needs at least 2 a side (more give a narrower interval)"]
    if all(v == 0 for side in SIDES for v in final[side]["map50_95"]):  # said once for both
        return [f"every run of both sides ended at mAP50-95 0.00: nothing was learnt, so there is nothing to compare "
                f"({LEARN_MORE})"]
    missing, learnt_little = [], False
    for side in SIDES:
        values = final[side]["map50_95"]
        bad = [j for j, v in zip(done[side], values) if not math.isfinite(v)]
        if bad:  # a finished run is kept by the same comparison run again (``finished_before``): say how to redo it
            folders = " ".join(shlex.quote(str(j.log.parent.parent / "runs" / j.name)) for j in bad)
            missing.append(f"the final mAP50-95 of {side} seed(s) {', '.join(str(j.seed) for j in bad)} is not a "
                           f"number (see results.csv in {folders}; the same comparison run again keeps "
                           f"{'them' if len(bad) > 1 else 'it'}: delete {folders} to train again)")
        elif all(v == 0 for v in values):
            missing.append(f"every {side} run ended at mAP50-95 0.00: nothing was learnt, so there is nothing to "
                           "compare")
            learnt_little = True
        elif sum(values) / len(values) < LEARNT_FLOOR:
            missing.append(f"the {side} runs ended at a mean mAP50-95 of {sum(values) / len(values):.2f} points, "
                           f"below {LEARNT_FLOOR:g}: too little was learnt for a difference to mean anything")
            learnt_little = True
        elif max(values) == min(values):
            missing.append(f"the {n[side]} {side} runs all ended at exactly {values[0]:.2f} mAP50-95 (sd 0): no "
                           "spread to build an interval on (do the seeds change the runs? deterministic settings "
                           "or a cut dataset can make them equal)")
    if learnt_little:  # the advice once, however many sides it serves
        missing.append(LEARN_MORE)
    return missing


def _stack(curves: list[list[float]]) -> np.ndarray:
    """(runs, epochs) over the epochs every run has."""
    if not curves or not all(curves):
        return np.zeros((0, 0))
    e = min(len(c) for c in curves)
    return np.array([c[:e] for c in curves], dtype=np.float64)


def table(jobs: list[Job], s: Summary) -> str:
    key, key50 = metrics(jobs)
    name = metric_name(jobs)
    lines = [f"{'side':<10}{'seed':>5}{name:>13}{name.replace('50-95', '50'):>11}{'epochs':>8}{'wall':>8}"]
    for j in sorted(jobs, key=lambda j: (j.side, j.seed)):
        if j.ok:
            lines.append(f"{j.side:<10}{j.seed:>5}{100 * j.curves[key][-1]:>13.2f}{100 * j.curves[key50][-1]:>11.2f}"
                         f"{len(j.curves[key]):>8}{j.wall_s:>7.0f}s")
        else:
            lines.append(f"{j.side:<10}{j.seed:>5}  failed (exit {j.returncode}): see {j.log}")
    for side in SIDES:
        if not s.final[side]["map50_95"]:
            lines.append(f"{side + ' mean':<15}  no run finished")
            continue
        m, sd = mean_sd(s.final[side]["map50_95"])
        m50, sd50 = mean_sd(s.final[side]["map50"])
        spread = f"sd {sd:.2f} / {sd50:.2f}" if len(s.final[side]["map50_95"]) > 1 else "sd - (one run)"
        lines.append(f"{side + ' mean':<15}{m:>13.2f}{m50:>11.2f}   {spread}")
    return "\n".join(lines)


def parity_title(cfg: ParityConfig) -> str:
    """What was compared: model, set, epochs, imgsz, batch, and the training keys given (``optimizer=MuSGD``; all but
    ``device=``, which places the runs and does not change them)."""
    return (f"{Path(cfg.model).name} on {Path(cfg.data).name}: {cfg.epochs} epochs, imgsz {cfg.imgsz}, "
            f"batch {cfg.batch}" + "".join(f", {k}={v}" for k, v in cfg.extra.items() if k != "device"))


def plot(jobs: list[Job], path: Path, title: str) -> None:
    """mAP50-95 by epoch and the training losses, each side's mean with a +- sd band."""
    import matplotlib

    from yolofeed.doctor.report import save_figure

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    done = [j for j in jobs if j.ok]
    key = metrics(jobs)[0]
    keys = [key] + sorted({k for j in done for k in j.curves if k.startswith("train/")})
    cols = min(2, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), dpi=110, squeeze=False)
    for ax, k in zip(axes.flat, keys):
        for side in SIDES:
            a = _stack([j.curves.get(k, []) for j in done if j.side == side])
            if not a.size:
                continue
            scale = 100 if k == keys[0] else 1
            m, sd = a.mean(0) * scale, (a.std(0, ddof=1) if len(a) > 1 else np.zeros(a.shape[1])) * scale
            x = np.arange(1, a.shape[1] + 1)
            # a line through one point draws nothing: with few epochs each one is a marker
            ax.plot(x, m, color=COLOURS[side], label=f"{side} ({len(a)} seeds)",
                    marker="o" if a.shape[1] <= 20 else None, markersize=4)
            ax.fill_between(x, m - sd, m + sd, color=COLOURS[side], alpha=0.25, linewidth=0)
        ax.set_title(f"{metric_name(jobs)} (points)" if k == keys[0] else k, fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


# -- the command ------------------------------------------------------------------------------------------------
def _prepare(cfg: ParityConfig) -> None:
    """Build what concurrent runs would otherwise race to build: yolofeed's packs and Ultralytics' label caches."""
    from yolofeed.pack import open_or_build
    from yolofeed.train.keys import model_task
    from yolofeed.ultralytics_seam import YOLODataset, check_det_dataset, get_cfg

    data = check_det_dataset(cfg.data, autodownload=False)
    task = model_task(cfg.model, None)  # the packs and label caches of the model's task, which the runs use
    for split in ("train", "val"):
        YOLODataset(img_path=data[split], imgsz=cfg.imgsz, augment=False, data=data, hyp=get_cfg(), rect=False,
                    task=task)
        open_or_build(cfg.data, split, cfg.imgsz, format=cfg.pack_format, rebuild="auto", progress=True, task=task)


def run(cfg: ParityConfig) -> Summary:
    """Train every (side, seed), print the table and the verdict, write parity.json and parity.png under out=."""
    cfg = _typed(cfg)
    for name, least in (("seeds", 1), ("parallel", 1), ("epochs", 1), ("first_seed", 0)):
        if getattr(cfg, name) < least:  # the CLI's own check, for the Python API
            default = ParityConfig.__dataclass_fields__[name].default
            raise ConfigError(f"{name}={getattr(cfg, name)}: expected at least {least} (default {default})")
    if not Path(cfg.data).is_file():
        raise ConfigError(f"data={cfg.data}: no such file; point it at your dataset's data.yaml")
    if cfg.extra.get("resume") not in (None, False):
        raise ConfigError(f"resume={cfg.extra['resume']}: yolofeed parity trains each run from scratch; a stopped "
                          "comparison goes on where it stopped with the same command (its out= keeps the runs that "
                          "finished)")
    # exist_ok=False would send a run to <name>-2, beside the folder parity reads its results from
    reserved = {"trainer", "model", "data", "seed", "device", "project", "name", "exist_ok", "epochs", "imgsz",
                "batch"}
    clash = sorted(reserved & set(cfg.extra))
    if clash:
        own = {"seed": "seeds= and first_seed=", "device": "device=", "epochs": "epochs=", "imgsz": "imgsz=",
               "batch": "batch=", "model": "model=", "data": "data="}
        instead = [own[k] for k in clash if k in own]
        raise ConfigError(f"{', '.join(f'{k}=' for k in clash)} {'is' if len(clash) == 1 else 'are'} set by yolofeed "
                          "parity itself for each run" + (f"; use its own {', '.join(instead)}" if instead else ""))
    from dataclasses import fields

    from yolofeed.train import keys

    keys.check_overrides(cfg.extra, own=[f.name for f in fields(cfg)], command="yolofeed parity")  # a typo: one line
    device = keys.check_device(cfg.device, ddp=False)  # as yolofeed train checks it: before either side's runs
    cfg = replace(cfg, device=device or cfg.device)  # Ultralytics' canonical form: device=cuda is GPU 0
    # by absolute path in parity.json: a comparison in out= made from another folder is told apart (finished_before)
    cfg = replace(cfg, data=str(Path(cfg.data).resolve()),
                  model=str(Path(cfg.model).resolve()) if Path(cfg.model).is_file() else cfg.model)
    from yolofeed.train.run import check_model_and_data

    check_model_and_data(cfg.model, cfg.data, cfg.extra.get("split") or "val")  # as yolofeed train: before any run
    keys.check({**cfg.extra, "model": cfg.model, "data": cfg.data})  # what yolofeed's side refuses (rect=True...)
    from yolofeed.doctor.report import writable_folder
    from yolofeed.pack.lock import FolderLock

    # before any run: a file in the way, no permission or a folder at a report's name is one line
    out = writable_folder(cfg.out, reports=("parity.json", "parity.png"))
    lock = FolderLock(out)
    if not lock.try_acquire():  # two comparisons in one folder mix their runs' rows and report each other's
        holder = lock.holder()
        raise ConfigError(f"out={cfg.out}: another yolofeed parity writes in {out}"
                          + (f" ({holder.describe()})" if holder else "")
                          + "; wait for it to end, or choose another out=")
    try:
        return _compare(cfg, out)
    finally:
        lock.release()


def _compare(cfg: ParityConfig, out: Path) -> Summary:
    """``run``'s runs, table and verdict, with ``out`` checked and held."""
    from tqdm import tqdm

    from yolofeed.doctor.report import unwritten as report_words

    places = slots(devices_of(cfg.device), cfg.parallel, sorted(os.sched_getaffinity(0))
                   if hasattr(os, "sched_getaffinity") else list(range(usable_cores())))
    _prepare(cfg)
    inputs = inputs_of(cfg)
    kept = finished_before(cfg, out, inputs)
    asked = [Job(side, seed, f"{side}-seed{seed}", out / "logs" / f"{side}-seed{seed}.log")
             for seed in range(cfg.first_seed, cfg.first_seed + cfg.seeds) for side in SIDES]
    to_train = [j for j in asked if j.name not in {k.name for k in kept}]
    no_links(out, to_train)
    jobs = sorted(kept + to_train, key=lambda j: (j.seed, SIDES.index(j.side)))
    if kept:
        print(f"parity: {len(kept)} run(s) of an earlier comparison in {out} with these settings kept, not trained "
              f"again (seeds {_seed_list(kept)}); {len(to_train)} to train", flush=True)
    a_side = min(sum(j.side == side for j in jobs) for side in SIDES)
    if a_side < 2:
        print(f"parity: {a_side} seed a side gives no verdict (a verdict needs 2 or more: seeds=2); training it all "
              f"the same: more seeds join it later, with out={cfg.out} first_seed={cfg.first_seed + cfg.seeds}",
              flush=True)
    title = parity_title(cfg)

    def spec(job: Job) -> dict:
        args = {"data": str(Path(cfg.data).resolve()), "epochs": cfg.epochs, "imgsz": cfg.imgsz, "batch": cfg.batch,
                "seed": job.seed, "device": "0" if job.device.isdigit() else job.device,  # CUDA_VISIBLE_DEVICES
                "workers": min(8, len(job.cores)), "project": str(out / "runs"), "name": job.name,
                "exist_ok": True, "plots": False, "verbose": False, **cfg.extra}
        options = {"pack_format": cfg.pack_format, "partner_pool": cfg.partner_pool}
        return {"side": job.side, "model": cfg.model, "args": args, "options": options}

    pending, running, free = list(to_train), {}, list(range(len(places)))
    held = len(kept)  # the runs the last parity.json written holds
    bar = tqdm(total=len(to_train), desc="parity runs", unit="run")
    previous = signal.signal(signal.SIGTERM, _terminate)  # a scheduler's stop: end the runs, keep the report
    try:
        while pending or running:
            while pending and free:
                k = free.pop(0)
                job = pending.pop(0)
                job.device, job.cores = places[k]
                running[k] = (job, _launch(job, spec(job)), time.perf_counter())
            time.sleep(1.0)
            for k, (job, proc, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                job.returncode, job.wall_s = proc.returncode, time.perf_counter() - t0
                job.curves = read_curves(out / "runs" / job.name)
                del running[k]
                free.append(k)
                bar.update(1)
                if not job.ok:
                    tqdm.write(f"parity: {job.name} failed (exit {job.returncode}); log: {job.log}")
                # after each run: an interrupted comparison keeps what finished (held: how many)
                if _report(cfg, jobs, title, out, inputs=inputs).not_written is None:
                    held = sum(j.returncode is not None for j in jobs)
            bar.set_postfix_str(", ".join(j.name for j, _, _ in running.values()))
    except (KeyboardInterrupt, Terminated) as e:
        _stop([p for _, p, _ in running.values()])
        bar.close()  # its line ends before ours
        how = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"
        unwritten = _report(cfg, jobs, title, out, stopped=how, inputs=inputs).not_written
        done = sum(j.ok for j in jobs)
        kept = (f"what finished is in {out / 'parity.json'}, and the same command goes on from it"
                if unwritten is None else
                f"{out / 'parity.json'} could not be written ({report_words(unwritten)}); the runs are in "
                f"{out / 'runs'}")
        said = (f"stopped by {how} with {done} of {len(jobs)} runs finished: no verdict (the comparison is not "
                f"complete); {kept}")
        if isinstance(e, Terminated):
            raise processes.Terminated(said) from None
        raise KeyboardInterrupt(said) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        bar.close()
    s = _report(cfg, jobs, title, out, inputs=inputs)
    if not any(j.ok for j in jobs):  # nothing to plot or compare: the table names each run's log
        print(f"{title}\n{table(jobs, s)}", flush=True)
        failed = next(j for j in jobs if not j.ok)
        raise YolofeedError(f"no run finished (the first failed with exit {failed.returncode}): its log says why, "
                            f"{failed.log}")
    unwritten = s.not_written
    if unwritten is None:
        try:
            plot(jobs, out / "parity.png", title)
        except OSError as e:
            unwritten = e
    files = (f"-> {out / 'parity.json'}, {out / 'parity.png'}" if unwritten is None
             else f"report: not written ({report_words(unwritten)})")
    print(f"{title}\n{table(jobs, s)}\n{s.verdict}\n{files}", flush=True)
    if unwritten is not None:
        from yolofeed.doctor.report import not_written

        kept = (f"; {out / 'parity.json'} holds the first {held} of {len(jobs)} runs, no verdict of them all"
                if 0 < held < len(jobs) else "")
        raise not_written("out", cfg.out, out, unwritten, "the verdict", kept)
    failed = [j for j in jobs if not j.ok]
    if s.passed is None and failed:  # a verdict the failed runs cost: an error, not a comparison that ended
        raise YolofeedError(f"no verdict: {len(failed)} of {len(jobs)} runs failed ({', '.join(j.name for j in failed)}"
                            f"); the first's log says why: {failed[0].log}")
    return s


# what a run's result depends on: an earlier comparison's finished runs are kept where these are the same (and the
# installed yolofeed and Ultralytics, ``versions``)
SAME_RUNS = ("data", "model", "epochs", "imgsz", "batch", "device", "pack_format", "partner_pool", "extra")


def inputs_of(cfg: ParityConfig) -> dict[str, str]:
    """What the runs train on, as it is now: the dataset's files (the data yaml's bytes, and each train and val image
    and label path with its size and mtime, as a pack's fingerprint and Ultralytics' label cache count them), the
    model's (a yaml's or a checkpoint's bytes; a name Ultralytics resolves, as given) and those of the files training
    keys name (``cfg=``, ``pretrained=``). An earlier comparison's runs are kept only where these are the same
    (``finished_before``): labels fixed since, an edited model yaml or cfg file, train again."""
    import hashlib

    from yolofeed.errors import DatasetError
    from yolofeed.pack.source import split_source
    from yolofeed.train.keys import model_task

    def digest(path: Path) -> str:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    task = model_task(cfg.model, None)
    data = hashlib.sha256(digest(Path(cfg.data)).encode())
    for split in ("train", "val"):
        try:
            data.update(split_source(cfg.data, split, task).fingerprint().encode())
        except (DatasetError, OSError) as e:  # a split the runs refuse themselves, each in its log
            data.update(f"{split}: {type(e).__name__}".encode())
    model = Path(cfg.model)
    inputs = {"dataset's": data.hexdigest(), "model's": digest(model) if model.is_file() else str(cfg.model)}
    # a training key naming a file (cfg=, pretrained=): its bytes, which an edit in place changes under the same path
    named = sorted((k, v) for k, v in (cfg.extra or {}).items() if isinstance(v, str) and Path(v).is_file())
    if named:
        inputs["keys'"] = hashlib.sha256(" ".join(f"{k}={digest(Path(v))}" for k, v in named).encode()).hexdigest()
    return inputs


def no_links(out: Path, jobs: list[Job]) -> None:
    """Refuse to train where a run would write through a link or into a file: ``out``'s logs and runs folders, and
    each of ``jobs``' log and run folder (Ultralytics writes a run's files into its folder, which a planted link would
    send elsewhere: a user's folder lost its results.csv to one).

    Raises:
        ConfigError: naming the path and what to do.
    """
    paths = [out / "logs", out / "runs"] + [p for j in jobs for p in (j.log, out / "runs" / j.name)]
    for p in paths:
        if p.is_symlink():
            raise ConfigError(f"{p} is a link (to {os.readlink(p)}): yolofeed parity writes its runs there and would "
                              f"write through it; remove the link, or choose another out=")
    for p in (out / "logs", out / "runs"):
        if p.exists() and not p.is_dir():
            raise ConfigError(f"{p} is a file where yolofeed parity keeps its runs' {p.name}: move it, or choose "
                              "another out=")


def _typed(cfg: ParityConfig) -> ParityConfig:
    """``cfg`` as the command line would make it, for the Python API: paths (``Path``) as text, each whole-number key a
    whole number, ``extra`` a dict (None: none).

    Raises:
        ConfigError: naming the key, what it holds and what it takes.
    """
    from dataclasses import fields

    changes: dict = {}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "extra":
            if value is None:
                changes["extra"] = {}
            elif not isinstance(value, dict):
                raise ConfigError(f"extra={value!r}: expected a dict of training keys, e.g. {{'lr0': 0.01}}")
        elif f.default is not None and isinstance(f.default, int) and not isinstance(f.default, bool):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{f.name}={value!r}: expected a whole number (default {f.default})")
        elif isinstance(value, os.PathLike):
            changes[f.name] = os.fspath(value)
    return replace(cfg, **changes) if changes else cfg


def versions() -> dict[str, str | None]:
    """The yolofeed and Ultralytics whose runs a report holds: a run of another is trained again."""
    from importlib.metadata import PackageNotFoundError, version

    import yolofeed

    try:
        ultralytics = version("ultralytics")
    except PackageNotFoundError:
        ultralytics = None
    return {"yolofeed": yolofeed.__version__, "ultralytics": ultralytics}


REPORT_MAX_BYTES = 64 << 20  # a parity.json larger than this is not one parity wrote (its runs' curves: kilobytes)


def finished_before(cfg: ParityConfig, out: Path, inputs: dict) -> list[Job]:
    """The runs an earlier comparison in ``out`` finished with the same settings (``SAME_RUNS``, the data and model
    files by absolute path, the same ``versions``, the same ``inputs``: the dataset's and the model's files as they
    are now; its parity.json), each kept where its results.csv, read again, still holds the curves the report
    recorded for it (not another comparison's, which overwrote it and was stopped before its report): not trained
    again. A comparison stopped by a Ctrl-C goes on where it stopped; ``first_seed=`` adds seeds to it. [] where there
    is none, other settings or a report it cannot read (each said in one line)."""
    path = out / "parity.json"
    if not os.path.lexists(path):  # none: a new comparison
        return []
    try:
        report = json.loads(read_back(path, REPORT_MAX_BYTES))  # a FIFO or a device would never end
        before, runs = report["config"], report["runs"]
        if not isinstance(before, dict) or not isinstance(runs, list):
            raise TypeError("not a parity report")
        now = json.loads(json.dumps(asdict(cfg)))  # as the report holds it: tuples as lists
        changed = [k for k in SAME_RUNS if before.get(k) != now[k]]
        if report.get("versions") != versions():
            changed.append("the yolofeed or Ultralytics version")
        if not isinstance(report.get("inputs"), dict):
            changed.append("no record of the files it trained on (an older yolofeed's report)")
        elif report["inputs"] != inputs:
            changed += [f"the {what} files" for what in ("dataset's", "model's", "keys'")
                        if report["inputs"].get(what) != inputs.get(what)] or ["the dataset's or the model's files"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # not a report of this yolofeed's
        print(f"parity: {path} is not a report this yolofeed can read ({type(e).__name__}: {e}); no run of it is "
              "kept", flush=True)
        return []
    if changed:
        print(f"parity: {out} holds a comparison with other settings ({', '.join(changed)}): its runs are not kept, "
              "and are trained again where their seeds are asked", flush=True)
        return []
    kept: dict[str, Job] = {}
    for r in runs:
        try:
            if not r["ok"] or r["side"] not in SIDES:
                continue
            name = f"{r['side']}-seed{int(r['seed'])}"
            job = Job(r["side"], int(r["seed"]), name, out / "logs" / f"{name}.log", device=str(r.get("device", "")),
                      cores=list(range(int(r.get("cores") or 0))), returncode=0, wall_s=float(r.get("wall_s") or 0.0),
                      curves=read_curves(out / "runs" / name))
            recorded = r["curves"]
        except (KeyError, TypeError, ValueError, AttributeError, OSError):  # a run entry not of this yolofeed's making
            continue
        if job.ok and _finite(job.curves) == recorded:  # its run folder still holds its own results, whole
            kept.setdefault(name, job)  # each run once, however often the report lists it
    return list(kept.values())


def _seed_list(jobs: list[Job]) -> str:
    return ", ".join(map(str, sorted({j.seed for j in jobs})))


class Terminated(Exception):
    """SIGTERM (a scheduler's stop, ``timeout``) while the runs train: stop them, keep the report, exit 143."""


def _terminate(signum, frame) -> None:
    raise Terminated


def _report(cfg: ParityConfig, jobs: list[Job], title: str, out: Path, stopped: str | None = None,
            inputs: dict | None = None) -> Summary:
    """Summarise the runs that finished and write parity.json.

    Args:
        stopped: what stopped the comparison before its runs finished ("SIGTERM", "Ctrl-C"): no verdict then.
        inputs: ``inputs_of(cfg)``, the runs' files as they were trained on (a later comparison compares them).
    """
    s = summarise(jobs)
    if stopped is not None:
        s = replace(s, passed=None, verdict=f"no verdict: stopped by {stopped} with {sum(j.ok for j in jobs)} of "
                                            f"{len(jobs)} runs finished")
    report = {"config": asdict(cfg), "versions": versions(), "inputs": inputs, "title": title,
              "verdict": s.verdict, "passed": s.passed, "stopped": stopped,
              "difference": asdict(s.difference), "final": s.final, "seeds": s.seeds, "loss_overlap": s.overlap,
              "bars": {"mean_points": MEAN_BAR, "ci_low_points": LOW_BAR, "loss_overlap": OVERLAP_BAR},
              "runs": [{"side": j.side, "seed": j.seed, "ok": j.ok, "returncode": j.returncode, "wall_s": j.wall_s,
                        "device": j.device, "cores": len(j.cores), "log": str(j.log), "curves": j.curves}
                       for j in jobs]}
    from yolofeed.atomic import write_atomically

    try:
        write_atomically(out / "parity.json", json.dumps(_finite(report), indent=1).encode())
    except OSError as e:  # a full disk: the comparison goes on, and its end says so after the table
        s.not_written = e
    return s


def _finite(x):
    """``x`` with nan and infinities as None: JSON has no such numbers."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


if __name__ == "__main__":  # one run, launched by ``run`` above; it ends at once where a thread was given up on
    from yolofeed.processes import own_process

    own_process(lambda: train_one(json.loads(sys.argv[1])), "yolofeed parity")
