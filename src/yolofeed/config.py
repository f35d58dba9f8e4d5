"""What each command accepts: frozen dataclasses whose fields are the ``key=value`` keys.

The CLI reads the field names, types, defaults and help text from here, so ``yolofeed help`` and
the parser can never disagree with the code. This module imports nothing heavy on purpose:
``yolofeed help`` must answer without loading torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# ``choices=`` of the keys that name a pack format: the CLI reads the names (and their help) from the
# codec registry, ``yolofeed.pack.codecs``, when it parses or prints them; this module imports no stage.
PACK_FORMATS = "pack formats"
DEFAULT_PACK_FORMAT = "auto"  # codecs.AUTO: chosen for the dataset and the machine; a test keeps the two equal
MIN_IMGSZ = 32  # the smallest image size a pack and the augmentation take (Ultralytics' largest stride)


def key(default: Any, help: str, choices: tuple[str, ...] | str | None = None,  # noqa: A002 - mirrors argparse
        minimum: int | None = None) -> Any:
    """A config field with its help text (and allowed values, for strings; the smallest value, for numbers).

    Args:
        choices: the allowed values, or ``PACK_FORMATS``: the pack codecs' names, looked up when used.
    """
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum})


def passthrough(help: str) -> Any:  # noqa: A002 - mirrors argparse
    """The field that collects every other ``key=value`` (handed to Ultralytics unchanged)."""
    return field(default_factory=dict, metadata={"help": help, "choices": None, "passthrough": True})


def typed(help: str) -> Any:  # noqa: A002 - mirrors argparse
    """The field the command line fills with the keys it was given (not a key itself: ``fields_of`` leaves it out)."""
    return field(default=frozenset(), metadata={"help": help, "choices": None, "internal": True})


def worker_count(asked: int) -> int:
    """The processes a job of ``asked`` workers starts (0: all usable cores): never more than the usable cores, as
    Ultralytics caps its DataLoader's ``workers`` at the CPU count (more would share them, each with its memory)."""
    from yolofeed import limits  # psutil: not at import

    cores = limits.usable_cores()
    return min(asked or cores, cores)


@dataclass(frozen=True)
class SynthConfig:
    """Write a synthetic, COCO-like YOLO dataset (images/, labels/, data.yaml)."""

    out: str = key("datasets/synth", "folder to write; data.yaml is written inside it")
    n_train: int = key(1000, "training images")
    n_val: int = key(200, "validation images")
    imgsz: int = key(640, "long side of the most common image shape (shapes vary around it; 32 to 4096)")
    seed: int = key(0, "same seed, same files, byte for byte")
    classes: int = key(80, "classes (1-80); up to 8 differ in both shape and colour: classes=8 boxes=8 "
                       "min_box=16 is a set yolo11n learns in a few dozen epochs, for accuracy comparisons")
    boxes: int = key(20, "at most this many objects per image (1 to boxes; boxes up to 1000)")
    min_box: int = key(8, "smallest object side in pixels of the written image")
    quality: int = key(90, "JPEG quality of the written images, 1-100: 90 is about 95 KB an image at 640 px, "
                       "95 about 155 KB, as COCO's photos weigh", minimum=1)
    task: str = key("detect", "detect: class and box rows; pose: each figure's 5 keypoints (top, right, bottom, left, "
                    "centre; some occluded or unlabelled) after its box, and kpt_shape and flip_idx in data.yaml; obb: "
                    "figures turned by any angle, rows of class and their 4 corners (x1 y1 ... x4 y4), as DOTA's; "
                    "segment: the pictures of detect, rows of class and each figure's outline (x1 y1 x2 y2 ...)",
                    ("detect", "pose", "obb", "segment"))
    workers: int = key(0, "processes; 0 = all usable cores, and more are capped at them", minimum=0)


@dataclass(frozen=True)
class PackConfig:
    """Pack an Ultralytics detection dataset into one memory-mappable file per split."""

    data: str = key(None, "Ultralytics data yaml (train/val as folders, .txt lists or lists of both)")
    imgsz: int = key(640, "long side images are resized to, as Ultralytics' load_image does (rounded up to a "
                     "multiple of 32, as yolo train rounds it)", minimum=MIN_IMGSZ)
    format: str = key(DEFAULT_PACK_FORMAT, "pack format", PACK_FORMATS)
    out: str | None = key(None, "folder for the packs: each data yaml, format and imgsz gets a folder of its own in "
                          "it, <yaml stem>-<format>-<imgsz> (a second yaml of that name <yaml stem>-<hash of its "
                          "path>-<format>-<imgsz>); default <data yaml folder>/yolofeed-packs")
    splits: str = key("train,val", "comma-separated splits of the data yaml to pack")
    task: str = key("detect", "detect; pose: the yaml's kpt_shape, Ultralytics' pose label rules and the "
                    "keypoints stored too (in <yaml stem>-<format>-<imgsz>-pose); obb: rows of 4 corners, stored "
                    "beside their enclosing boxes (in ...-obb); segment: polygon rows, stored as written beside "
                    "their enclosing boxes (in ...-segment)", ("detect", "pose", "obb", "segment"))
    workers: int = key(0, "processes; 0 = all usable cores, and more are capped at them", minimum=0)
    rebuild: str = key("auto", "auto: build missing or stale packs (a changed path, size or time, as Ultralytics' "
                       "label cache); check: auto, and compare the label files' contents too; always: rebuild; "
                       "never: refuse stale packs", ("auto", "check", "always", "never"))
    sync: bool = key(False, "fsync before publishing: survives power loss, costs the disk's write time "
                     "(atomic against a killed build either way)")
    verify: bool = key(False, "check every stored image's checksum (reads the whole pack); damaged packs are rebuilt "
                       "(refused with rebuild=never)")


@dataclass(frozen=True)
class TrainConfig:
    """Ultralytics' DetectionTrainer fed by a GPU-resident pipeline; any ``yolo train`` key passes through."""

    model: str | None = key(None, "model yaml or weights, as for yolo train (e.g. yolo11n.yaml); required unless "
                            "resume=path")
    data: str | None = key(None, "Ultralytics data yaml (not needed with resume=)")
    resume: str | None = key(None, "a last.pt to continue training from; or model=.../last.pt with resume=True "
                             "(or a bare 'resume'), as in yolo train. yolofeed's own keys come back from the run's "
                             "yolofeed.yaml; one given again wins")
    pack_format: str = key(DEFAULT_PACK_FORMAT, "pack format", PACK_FORMATS)
    pack_rebuild: str = key("auto", "auto: build missing or stale packs first; check: also compare the label files' "
                            "contents; always: rebuild them; never: refuse them", ("auto", "check", "always", "never"))
    pack_dir: str | None = key(None, "folder for the packs: each data yaml, format and imgsz gets a folder of its own "
                               "in it, <yaml stem>-<format>-<imgsz> (a second yaml of that name <yaml stem>-<hash of "
                               "its path>-<format>-<imgsz>); default <data yaml folder>/yolofeed-packs")
    partner_pool: str = key("auto", "images mosaic/MixUp/CutMix partners are drawn from, per GPU: auto = "
                            "Ultralytics' buffer, min(n, 8 x batch, 1000), 1.39 GB of GPU memory at 640 px and batch "
                            "128; a smaller number for small GPUs; 0 = the batch itself")
    val_period: int = key(1, "validate every N epochs and at the last (1: every epoch, as yolo train); an epoch not "
                          "validated writes nan metrics to results.csv, and best.pt is the best validated epoch's",
                          minimum=1)
    warm_up: bool = key(True, "on CUDA, train each batch size's first pass before the first epoch (cuDNN's set-up, "
                        "3-7 s a size, which stock pays inside its first epoch); False: inside it, as stock")
    validate_beside: bool = key(True, "on one CUDA GPU, run each validation in a thread of its own whose cuDNN set-up "
                                "for every validation's batch shapes is paid during the first epoch (the same "
                                "calls, metrics and files; the final validation about 4 s sooner); False: in the "
                                "training thread, as stock")
    val_overlap: bool | None = key(None, "with validate_beside: each epoch's validation runs while the next epoch "
                                   "trains, on a copy of the EMA; its results.csv row, checkpoints and "
                                   "on_fit_epoch_end come at the next epoch's end (the same metrics and files, written "
                                   "an epoch later; a killed run resumes an epoch further back). None (default): on, "
                                   "except where a callback reads each epoch as it ends (an Ultralytics logger, "
                                   "Weights & Biases, MLflow, ..., or one of yours); True: those run an epoch late (a "
                                   "logger that writes at on_train_epoch_end, as Weights & Biases' training losses, "
                                   "pairs them with the epoch before's metrics; one that logs at on_fit_epoch_end only "
                                   "after its own on_train_epoch_start, as DVC's, drops the last epoch); False: each "
                                   "validation waited for. "
                                   "Validated in place: the last epoch, any early stopping may end the run after, and "
                                   "any where free GPU memory would not hold the validation's largest batch at a "
                                   "training pass's peak per image beside the training")
    batched_val_metrics: bool = key(True, "a detection validation gathers its statistics for a whole batch at once "
                                    "(one IoU and one copy to the host; the same statistics and metrics); False: "
                                    "image by image, as stock")
    mask_room: int = key(1, "segment: the GPU mask rasteriser's slots, in multiples of its default (1 to 64); a "
                         "run that overflows them warns and doubles it (recorded for a resume)", minimum=1)
    # the step's options (FastDetectionTrainer.with_options): each True is a speed-up, False Ultralytics' way
    augment_ahead: bool = key(True, "augment each batch one step ahead; False: in preprocess_batch, with a host sync "
                              "a step")
    sync_free_step: bool = key(True, "the step without its host sync after the backward pass (the progress bar's "
                               "losses arrive a step late); False: Ultralytics' step")
    sync_free_loss: bool = key(True, "the detection loss takes its counts from the batch instead of syncing for them "
                               "(the same loss); False: Ultralytics' loss")
    fast_musgd: bool = key(True, "step the MuSGD Ultralytics builds as one CUDA graph (the same update); False: "
                           "Ultralytics' MuSGD")
    graphed_step: bool = key(True, "on one CUDA GPU with Triton, replay the model's forward and backward as CUDA "
                             "graphs at the full batch's shape, batch norm and SiLU fused (the loss eager); False: "
                             "eager, as Ultralytics")
    half_input: bool = key(True, "on CUDA with amp, make the step's input image in the autocast's dtype from the "
                           "uint8 batch in one kernel (the same values its first convolution's cast makes of "
                           "Ultralytics' float32 image, which takes three); False: float32, as Ultralytics")
    # the live monitor's keys (yolofeed.monitor.live.MonitorConfig, same defaults)
    monitor: bool = key(False, "live step breakdown, GPU/CPU load, low-utilisation alert, Prometheus, TensorBoard; "
                        "prometheus_port= or an alert_*/summary_seconds key turns it on too")
    prometheus_port: int | None = key(None, "serve Prometheus metrics on prometheus_addr:<port>/metrics (0: any free "
                                      "port; a port in use moves to the next free one)")
    prometheus_addr: str = key("127.0.0.1", "address the metrics endpoint binds: 127.0.0.1 lets only this machine "
                               "scrape it (it has no authentication); 0.0.0.0 lets a Prometheus server on "
                               "another host scrape it")
    tensorboard: bool = key(True, "monitor scalars under <run>/yolofeed_tb (needs the tensorboard package)")
    alert_util: float = key(60.0, "alert when GPU utilisation (%) stays under this while alert_wait holds")
    alert_wait: float = key(0.15, "... and this share of each step (0-1) waits for data")
    alert_seconds: float = key(30.0, "... for this many seconds (one warning per episode)")
    summary_seconds: float = key(30.0, "seconds between the monitor's one-line summaries")
    extra: dict = passthrough("every other key=value goes to Ultralytics' train")
    given: frozenset = typed("yolofeed's own keys typed on the command line: on resume, one typed again wins over the "
                             "run's recorded value, even when it is the default")


@dataclass(frozen=True)
class MeasuredRunConfig:
    """The keys of the commands that train a setup for a few steps and measure it (``bench``, ``doctor``)."""

    data: str = key(None, "Ultralytics data yaml (e.g. from yolofeed synth)")
    model: str = key("yolo11n.yaml", "model yaml, as for yolo train")
    batch: int = key(16, "batch size (Ultralytics' default)")
    imgsz: int = key(640, "image size", minimum=MIN_IMGSZ)
    steps: int = key(40, "measured training steps per mode, after warm-up", minimum=1)
    warmup: int = key(10, "steps ignored at the start of each mode", minimum=0)


def redefault(config_cls: type, name: str, default: Any) -> Any:
    """The key ``name`` of ``config_cls`` (its help, choices and minimum) with another default."""
    return field(default=default, metadata=config_cls.__dataclass_fields__[name].metadata)


@dataclass(frozen=True)
class BenchConfig(MeasuredRunConfig):
    """Stock Ultralytics vs yolofeed vs the GPU-resident ceiling, in turn, on the same data, model and batch."""

    batch: int = key(128, "batch size")
    steps: int = redefault(MeasuredRunConfig, "steps", 100)
    warmup: int = redefault(MeasuredRunConfig, "warmup", 20)
    window: int = key(10, "steps per rate window; the reported rate is the median window")
    first_epoch: bool = key(True, "also train each mode to the end of its first epoch, if the steps end inside it, "
                            "and report that epoch's img/s (a run's one-off costs fall in it); False on a dataset "
                            "whose epoch is long")
    isolate: bool = key(True, "train each mode in a process of its own, as a user's run is, paying its own one-off "
                        "costs (CUDA's context, cuDNN's plans, compiles); False trains them all in this process, where "
                        "a later mode finds an earlier one's costs paid (its first step and first epoch look faster)")
    whole_run: int = key(0, "train each mode this many whole epochs as a user's run does (validation every epoch, "
                         "checkpoints, plots, the final validation, optimizer=auto as for that length; first epoch "
                         "included) and time the run end to end (modes stock,yolofeed unless given); 0: measure "
                         "training steps only", minimum=0)
    modes: str = key("stock,yolofeed,ceiling", "comma-separated modes to run: stock, yolofeed, yolofeed_jpeg "
                     "(a jpeg pack decoded on the GPU), yolofeed_inline (augmented in preprocess_batch, not "
                     "one batch ahead), yolofeed_nopool (mosaic partners from the batch itself, partner_pool=0), "
                     "yolofeed_val_inline (validate_beside=False: validations in the training thread, as "
                     "stock; with whole_run), yolofeed_val_overlap (val_overlap=True: each epoch's validation "
                     "beside the next epoch; with whole_run), yolofeed_val_waited (val_overlap=False: each waited "
                     "for, in its own thread; with whole_run), ceiling, ceiling_stock (the ceiling with Ultralytics' "
                     "own step and loss: what yolofeed's sync-free step and loss add)")
    # the step's options, as yolofeed train takes them: for the yolofeed modes and the ceiling (stock: Ultralytics')
    sync_free_step: bool = redefault(TrainConfig, "sync_free_step", True)
    sync_free_loss: bool = redefault(TrainConfig, "sync_free_loss", True)
    fast_musgd: bool = redefault(TrainConfig, "fast_musgd", True)
    graphed_step: bool = redefault(TrainConfig, "graphed_step", True)
    half_input: bool = redefault(TrainConfig, "half_input", True)
    out: str = key("runs/bench", "folder for bench.json, bench.png and each mode's Ultralytics run folder "
                   "(runs/<mode>: args.yaml, TensorBoard events if enabled; no weights)")
    extra: dict = passthrough("every other key=value goes to the trainers (device, workers, amp, ...)")


@dataclass(frozen=True)
class ParityConfig:
    """Train from scratch with stock Ultralytics and with yolofeed, several seeds each: is the model as good?"""

    data: str = key(None, "Ultralytics data yaml")
    model: str = key("yolo11n.yaml", "model yaml, as for yolo train")
    epochs: int = key(40, "epochs per run")
    seeds: int = key(4, "seeds per side (first_seed, first_seed + 1, ...): 4 or more for a useful interval")
    first_seed: int = key(0, "the first seed: with out= an earlier comparison's folder (the same settings), these "
                          "seeds join the runs it finished, which are kept")
    imgsz: int = key(640, "image size", minimum=MIN_IMGSZ)
    batch: int = key(16, "batch size")
    device: str = key("", "GPUs to spread runs over, e.g. 0,1; cpu; default GPU 0 if there is one")
    parallel: int = key(1, "runs at once on each GPU (a small model leaves a large GPU mostly idle)")
    pack_format: str = key(DEFAULT_PACK_FORMAT, "yolofeed's pack format", PACK_FORMATS)
    partner_pool: str = key("auto", "yolofeed's partner pool (see yolofeed train)")
    out: str = key("runs/parity", "folder for parity.json, parity.png, each run's folder and log")
    extra: dict = passthrough("every other key=value goes to both sides' training (any yolo train key)")


@dataclass(frozen=True)
class DoctorConfig(MeasuredRunConfig):
    """Profile a training setup for a few steps and say where the time goes and what to change."""

    steps: int = key(40, "measured training steps per mode, after warm-up", minimum=5)  # a breakdown needs 5
    workers: int = key(8, "DataLoader workers (Ultralytics' default)")
    yolofeed: bool = key(True, "also profile yolofeed train on the same setup, for the expected gain")
    time_validation: bool = key(True, "time one validation pass (for the validation-cost rule)")
    out: str = key("runs/doctor", "report folder: report.html, report.json, timeline.png, breakdown.png, and "
                   "each mode's Ultralytics run folder (runs/<mode>; no weights); checked before profiling")
    extra: dict = passthrough("every other key=value goes to the trainer (device, amp, cache, ...)")


def fields_of(config_cls: type) -> list[dataclasses.Field]:
    """The keys of a config class, in declaration order (not the field the command line fills itself: ``typed``)."""
    return [f for f in dataclasses.fields(config_cls) if not f.metadata.get("internal")]
