"""The doctor's diagnosis: one readable table of rules over the measurements.

Each rule names a cause, tests measured numbers against thresholds (all in ``THRESHOLDS``), and
says what it saw and what to change, with the expected gain where a measurement supports one.
The first matching *bottleneck* rule is the verdict; *also* rules add findings that hold at the
same time (validation cost, AMP off, CPU-only).

| rule             | fires when                                                                     |
|------------------|--------------------------------------------------------------------------------|
| cpu_contention   | other processes keep >= max(1, 25 % of cores) busy; data wait high or starved  |
| disk_io          | data wait high and iowait >= 10 % (the loader waits on reads)                  |
| too_few_workers  | data wait high, workers saturated, >= 30 % of cores idle                       |
| cpu_augmentation | the run keeps >= 70 % of cores busy (CPU decode/augment); wait high or starved |
| host_to_device   | preprocess (copy + normalise) >= 15 % of the step, data wait low               |
| optimizer        | the optimiser step (clip, step, EMA) >= 25 % of the step, data wait low        |
| small_batch      | data wait low, GPU < 70 % busy, batch <= 16 or steps < 60 ms (launch-bound)    |
| gpu_bound        | data wait < 5 % and GPU >= 85 % busy: already fed                              |
| also: yolofeed_slower | yolofeed's profile ran slower than stock's (CPU-only runs, typically)       |
| also: validation | one validation pass >= 20 % of an epoch's training time                        |
| also: logging    | the trainer's callbacks (loggers, integrations) take >= 5 % of the step        |
| also: amp_off    | AMP off on a GPU                                                               |
| also: cpu_only   | no GPU in the run (only cpu_contention and disk_io are judged then)            |

"The trainer starved": data wait low, yet the GPU < 70 % busy while >= 70 % of the machine's cores
are busy. The loader keeps up, but the training loop (one Python thread launching every kernel)
gets too little CPU: on the H200 machine, mixup + cutmix on 16 workers made yolo11n's forward pass
take 102 ms of host time instead of 25, with no data wait at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

THRESHOLDS = {
    "wait_high": 0.15,  # share of step time blocked on the loader
    "wait_low": 0.05,
    "contention_cores": 1.0,  # other processes' cores, at least ...
    "contention_share": 0.25,  # ... or this share of the machine
    "iowait": 0.10,
    "workers_saturated": 0.8,  # run's cores busy / workers (the waiting main thread adds little: seen 1.3 cores
                               # for workers=1 on the H200 machine)
    "idle_share": 0.30,
    "cpu_saturated": 0.70,  # run's cores busy / machine cores
    "preprocess_share": 0.15,
    "util_low": 70.0,
    "util_fed": 85.0,
    "optimizer_share": 0.25,  # yolo11n, batch 16, MuSGD (optimizer=auto) on the H200 machine: 44 % of the step
    "loss_share": 0.25,  # yolo11n-seg, batch 128, stock on the H200 machine: 36 % of the step, the GPU 34 % busy;
                         # detection's loss: about 15 %
    "small_step_ms": 60.0,
    "small_batch": 16,  # images per step; yolo11n at batch 4 on the H200 machine: 62 ms steps, GPU 16 % busy
    "validation_share": 0.20,
    "logging_share": 0.05,  # host time in callbacks per step / step time
}


@dataclass
class Verdict:
    """A finding: its rule, a headline, the numbers behind it, and what to change."""

    rule: str
    title: str
    evidence: str
    advice: list[str]
    bottleneck: bool = True


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


@dataclass
class Facts:
    """The measurements the rules read (from the stock run; yolofeed's when it was measured too)."""

    images_per_s: float
    step_ms: float
    data_wait: float
    preprocess_share: float
    gpu_util: float | None
    cores: int
    machine_cores_busy: float
    own_cores_busy: float
    iowait: float
    disk_read_mb_s: float
    workers: int
    batch: int
    amp: bool
    n_train: int
    n_val: int
    val_images_per_s: float | None = None
    yolofeed_images_per_s: float | None = None
    callbacks_ms: dict[str, float] | None = None  # host ms per step in each trainer callback, largest first
    optimizer_share: float = 0.0  # share of the step from optimizer_step on (clip, step, EMA)
    optimizer: str = ""  # the optimiser's class: optimizer=auto picks SGD, AdamW or MuSGD by the run's length
    loss_share: float = 0.0  # share of the step from the head's output to the backward pass (the loss)
    task: str = "detect"  # the model's task: detect, segment, pose, obb

    @property
    def other_cores_busy(self) -> float:
        return max(0.0, self.machine_cores_busy - self.own_cores_busy)

    @property
    def idle_cores(self) -> float:
        return max(0.0, self.cores - self.machine_cores_busy)


def _starved(f: Facts) -> bool:
    """Data arrives in time, but a saturated CPU slows the training loop itself (see the module doc)."""
    return (f.gpu_util is not None and f.data_wait < T["wait_high"] and f.gpu_util < T["util_low"]
            and f.machine_cores_busy >= T["cpu_saturated"] * f.cores)


def _waited_or_starved(f: Facts) -> str:
    if f.data_wait >= T["wait_high"]:
        return f"each step waited {_pct(f.data_wait)} for data"
    return (f"data arrived in time (wait {_pct(f.data_wait)}), but the training loop, which needs a core of its own "
            f"to launch the GPU's work, was starved: the GPU was busy only {f.gpu_util:.0f} % of the time")


def _slower(f: Facts) -> bool:
    """yolofeed was measured, and slower than stock (on the CPU its GPU pipeline runs in the training process)."""
    return bool(f.yolofeed_images_per_s) and f.yolofeed_images_per_s < f.images_per_s


def _more_workers(f: Facts) -> int:
    """Workers to try: double, or enough to use the idle cores, at least one more, at most the cores."""
    return min(f.cores, max(2 * f.workers, f.workers + round(f.idle_cores), f.workers + 1))


def _more_data(f: Facts) -> float:
    """How much faster data could come: bounded by the wait removed and by the idle cores put to work."""
    return min(1 / (1 - f.data_wait), (f.own_cores_busy + f.idle_cores) / max(f.own_cores_busy, 1e-9))


def _gain(f: Facts) -> str:
    if _slower(f):
        return (f"but measured here yolofeed was slower: {f.yolofeed_images_per_s:,.0f} img/s vs "
                f"{f.images_per_s:,.0f} stock")
    if f.yolofeed_images_per_s:
        return (f"measured here: {f.yolofeed_images_per_s:,.0f} img/s with yolofeed vs {f.images_per_s:,.0f} stock "
                f"({f.yolofeed_images_per_s / f.images_per_s:.1f}x)")
    return f"removes the {_pct(f.data_wait)} of each step spent waiting (up to {1 / (1 - f.data_wait):.1f}x)"


def _duration(seconds: float) -> str:
    """Seconds as a reader takes them: milliseconds under 1 s (a small set's validation is not "0 s"), one decimal
    under 10 s, whole seconds above."""
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:,.0f} s"


T = THRESHOLDS
Rule = tuple[str, Callable[[Facts], bool], Callable[[Facts], Verdict]]

RULES: list[Rule] = [
    ("cpu_contention",
     lambda f: (f.data_wait >= T["wait_high"] or _starved(f))
     and f.other_cores_busy >= max(T["contention_cores"], T["contention_share"] * f.cores),
     lambda f: Verdict("cpu_contention", "Another process is taking the CPU that training needs",
                       f"other processes kept {f.other_cores_busy:.1f} of {f.cores} cores busy; "
                       + _waited_or_starved(f),
                       ["stop or renice the other process (top / htop shows it)",
                        f"yolofeed train needs about one core for data, so it suffers least: {_gain(f)}"])),
    ("disk_io",
     lambda f: f.data_wait >= T["wait_high"] and f.iowait >= T["iowait"],
     lambda f: Verdict("disk_io", "The data loader waits on the disk",
                       f"{_pct(f.iowait)} of CPU time was iowait, reads at {f.disk_read_mb_s:,.0f} MB/s, and each step "
                       f"waited {_pct(f.data_wait)} for data",
                       ["cache=ram (if the decoded dataset fits in memory), or move the dataset to a local SSD",
                        "yolofeed pack stores the dataset in one memory-mapped file the page cache keeps: "
                        + _gain(f)])),
    ("too_few_workers",
     lambda f: f.gpu_util is not None and f.data_wait >= T["wait_high"]
     and f.own_cores_busy >= T["workers_saturated"] * max(f.workers, 1) and f.idle_cores >= T["idle_share"] * f.cores,
     lambda f: Verdict("too_few_workers", "Too few DataLoader workers for this GPU",
                       f"workers={f.workers} kept {f.own_cores_busy:.1f} cores busy while {f.idle_cores:.1f} of "
                       f"{f.cores} cores sat idle; each step waited {_pct(f.data_wait)} for data",
                       [f"workers={_more_workers(f)}: about {_more_data(f):.1f}x more data per second, until the "
                        "GPU is the limit",
                        "or yolofeed train, which needs no workers: " + _gain(f)])),
    ("cpu_augmentation",
     lambda f: f.gpu_util is not None and (f.data_wait >= T["wait_high"] or _starved(f))
     and f.own_cores_busy >= T["cpu_saturated"] * f.cores,
     lambda f: Verdict("cpu_augmentation", "Decoding and augmenting images on the CPU cannot keep up with the GPU"
                       if f.data_wait >= T["wait_high"] else
                       "Decoding and augmenting images on the CPU leaves the training loop too little CPU",
                       f"the run kept {f.own_cores_busy:.1f} of {f.cores} cores busy; " + _waited_or_starved(f),
                       ["yolofeed train: packs the dataset once and augments on the GPU: " + _gain(f),
                        "cache=ram saves the JPEG decode (about a third of the CPU cost)",
                        "mixup/cutmix/copy_paste cost extra CPU per image: turn them off if not needed"])),
    ("host_to_device",
     lambda f: f.gpu_util is not None and f.preprocess_share >= T["preprocess_share"] and f.data_wait < T["wait_high"],
     lambda f: Verdict("host_to_device", "Copying and normalising batches costs a large share of each step",
                       f"preprocess (host-to-device copy, uint8 -> float) took {_pct(f.preprocess_share)} of the step",
                       ["keep pinned memory on (Ultralytics' PIN_MEMORY=True, the default)",
                        "yolofeed train copies uint8 on a side CUDA stream ahead of time: " + _gain(f)])),
    ("optimizer",
     lambda f: f.gpu_util is not None and f.data_wait < T["wait_high"] and f.optimizer_share >= T["optimizer_share"],
     lambda f: Verdict("optimizer", "The optimiser step takes a large share of every step",
                       f"the optimiser step ({f.optimizer or 'unknown'}: clip, step, EMA) took "
                       f"{f.optimizer_share * f.step_ms:.0f} ms of the median {f.step_ms:.0f} ms step "
                       f"({_pct(f.optimizer_share)})",
                       (["yolofeed train keeps Ultralytics' MuSGD and its update (within float32 roundings) and "
                         "steps it as one CUDA graph, its found_inf read on the GPU: yolo11n's optimiser step at "
                         "batch 128 on an H200 fell from 46-49 ms to 3.9 ms; " + _gain(f),
                         "only if that is not enough, optimizer=AdamW (or SGD): optimizer=auto picks MuSGD when a run "
                         "has more than 10,000 iterations (epochs x images / batch); another optimiser trains "
                         "differently, so check that accuracy holds"] if f.optimizer == "MuSGD" else [])
                       + ["a batch above nbs=64: the optimiser runs once per max(batch, 64) images, so a larger "
                          "batch spreads its cost"])),
    ("loss",
     lambda f: f.gpu_util is not None and f.data_wait < T["wait_high"] and f.gpu_util < T["util_low"]
     and f.loss_share >= T["loss_share"],
     lambda f: Verdict("loss", "Ultralytics' loss keeps the GPU waiting on the host",
                       f"the loss took about {f.loss_share * f.step_ms:.0f} ms of the median {f.step_ms:.0f} ms step "
                       f"({_pct(f.loss_share)}) while the GPU was busy {f.gpu_util:.0f} % of the time"
                       + (": its mask loss runs image by image, about 15 small kernels and 5 host syncs an image"
                          if f.task == "segment" else ": its target counts are read from the GPU (host syncs)"),
                       [("yolofeed train computes the mask loss for groups of images at once, with a few host syncs "
                         "a step (the same loss to float32's rounding): yolo11n-seg's loss at batch 128 on an H200 "
                         "took 45 ms against 210; " if f.task == "segment" else
                         "yolofeed train's loss takes its counts from the batch, without host syncs (the same loss): ")
                        + _gain(f)])),
    ("small_batch",
     lambda f: f.data_wait < T["wait_low"] * 2 and f.gpu_util is not None and f.gpu_util < T["util_low"]
     and (f.batch <= T["small_batch"] or f.step_ms < T["small_step_ms"]),
     lambda f: Verdict("small_batch", "The batch is too small to fill the GPU",
                       f"the median step takes {f.step_ms:.0f} ms with batch={f.batch} and the GPU is busy only "
                       f"{f.gpu_util:.0f} % of the time: per-step overhead dominates",
                       [f"batch={2 * f.batch} (or batch=-1 for Ultralytics' auto-batch): more images per step for "
                        "about the same overhead", "if memory is short, keep batch and accumulate (nbs)"])),
    ("gpu_bound",
     lambda f: f.gpu_util is not None and f.data_wait < T["wait_low"] and f.gpu_util >= T["util_fed"],
     lambda f: Verdict("gpu_bound", "The GPU is already fed: the model's compute is the limit",
                       f"each step waited {_pct(f.data_wait)} for data and the GPU was busy "
                       f"{f.gpu_util:.0f} % of the time",
                       ["the data pipeline is not the problem; a faster step needs AMP, a smaller model or imgsz, "
                        "or more GPUs (device=0,1)"])),
]

ALSO: list[Rule] = [
    ("yolofeed_slower",
     _slower,
     lambda f: Verdict("yolofeed_slower", "yolofeed was slower than stock Ultralytics here",
                       f"{f.yolofeed_images_per_s:,.0f} img/s with yolofeed vs {f.images_per_s:,.0f} img/s stock "
                       f"({f.yolofeed_images_per_s / f.images_per_s:.2f}x)"
                       + ("; without a GPU, yolofeed's augmentation, written for the GPU, runs on the CPU cores "
                          "the model needs" if f.gpu_util is None else ""),
                       ["train with stock Ultralytics (yolo train) on this machine; yolofeed pays off when a CUDA "
                        "GPU waits for data" if f.gpu_util is None else
                        "keep stock Ultralytics for this setup, and compare on more steps (steps=) before "
                        "switching"], bottleneck=False)),
    ("validation",
     lambda f: f.val_images_per_s is not None and f.n_val / f.val_images_per_s
     >= T["validation_share"] * (f.n_train / max(f.images_per_s, 1e-9)),
     lambda f: Verdict("validation", "Validation takes a large share of every epoch",
                       f"one validation pass ({f.n_val:,} images at {f.val_images_per_s:,.0f} img/s) takes "
                       f"{_duration(f.n_val / f.val_images_per_s)} against "
                       f"{_duration(f.n_train / max(f.images_per_s, 1e-9))} of training per epoch",
                       ["yolofeed train val_period=N: validate every N epochs and the last (best.pt is the best "
                        "validated epoch's)",
                        "yolofeed train (one CUDA GPU) runs each epoch's validation while the next epoch trains, the "
                        "same metrics and files written an epoch later (val_overlap; where a logger reads each epoch "
                        "as it ends, val_overlap=True)",
                        "or val=False while training and validate the final weights (yolo val), or use a smaller "
                        "validation split"], bottleneck=False)),
    ("logging",
     lambda f: bool(f.callbacks_ms) and sum(f.callbacks_ms.values()) >= T["logging_share"] * f.step_ms,
     lambda f: Verdict("logging", "Logging callbacks take a share of every step",
                       f"the trainer's callbacks took {sum(f.callbacks_ms.values()):.1f} ms of the median "
                       f"{f.step_ms:.0f} ms step; most: "
                       + ", ".join(f"{k} {v:.1f} ms" for k, v in list(f.callbacks_ms.items())[:3]),
                       ["switch off the integration you do not read (yolo settings wandb=False, tensorboard=False, "
                        "mlflow=False, ...) or make it log once per epoch"], bottleneck=False)),
    ("amp_off",
     lambda f: not f.amp and f.gpu_util is not None,
     lambda f: Verdict("amp_off", "Mixed precision (AMP) is off", "amp=False on a GPU",
                       ["amp=True: typically 1.5-2x faster steps on tensor-core GPUs"], bottleneck=False)),
    ("cpu_only",
     lambda f: f.gpu_util is None,
     lambda f: Verdict("cpu_only", "This run used no GPU",
                       "no NVIDIA GPU was visible (NVML), so GPU utilisation and memory are not reported",
                       ["device=0 on a machine with an NVIDIA GPU; on the CPU, the model's compute usually dominates"],
                       bottleneck=False)),
]


def diagnose(f: Facts) -> list[Verdict]:
    """The first bottleneck rule that fires, then every 'also' finding that holds.

    Without a GPU only CPU-wide causes (contention, disk) are judged: the rest are about feeding a GPU.
    """
    out = []
    if f.gpu_util is None and not any(t(f) for name, t, _ in RULES if name in ("cpu_contention", "disk_io")):
        out.append(Verdict("cpu_only_compute", "CPU-only run: the model's compute sets the pace",
                           f"the median step took {f.step_ms:.0f} ms, {_pct(f.data_wait)} of all step time waiting "
                           f"for data, with {f.own_cores_busy:.1f} of {f.cores} cores busy",
                           ["train on a GPU (device=0); the data-pipeline verdicts apply once a GPU is in the loop"]))
        return out + [verdict(f) for name, test, verdict in ALSO if test(f) and name != "cpu_only"]
    for _, test, verdict in RULES:
        if test(f):
            out.append(verdict(f))
            break
    else:
        out.append(Verdict("mixed", "No single bottleneck stands out",
                           f"data wait {_pct(f.data_wait)}, preprocess {_pct(f.preprocess_share)}, GPU "
                           + (f"{f.gpu_util:.0f} %" if f.gpu_util is not None else "n/a")
                           + f", {f.own_cores_busy:.1f} of {f.cores} cores busy",
                           ["compare with yolofeed bench to see what a GPU-fed run reaches"]))
    out += [verdict(f) for _, test, verdict in ALSO if test(f)]
    return out
