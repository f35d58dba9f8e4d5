"""Every ``yolo train`` key and what ``yolofeed train`` does with it: what stock does, or a refusal up front.

One table, three readers: ``FastDetectionTrainer`` checks a run's final arguments against it before anything
is built (``refusal``), the CLI and the trainer name the closest key for a typo from it (``check_names``),
and ``tests/test_keys.py`` proves its rows and checks that ``docs/train-keys.md`` is ``markdown()``'s output.
A key of a newer Ultralytics that is missing here fails that test until someone decides its row.

Kinds of row:

* ``stock``: read by Ultralytics' own trainer, validator, loss or plots; yolofeed hands it over untouched.
* ``yolofeed``: applied by yolofeed's pack, loader or GPU augmentation, the way ``yolo train`` applies it.
* ``replaced``: a speed setting of Ultralytics' CPU loader; yolofeed's pack does that job and says so at start.
* ``unused``: detection training never reads it, in ``yolo train`` either (prediction, export, other tasks).

Any row may refuse some values (``refuse``): the run stops before its first step with one line that says
what is not supported, why, and what to do instead.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from yolofeed.config import TrainConfig, fields_of
from yolofeed.errors import ConfigError
from yolofeed.loader.labels import class_ids
from yolofeed.pack.source import DATA_LIST

if TYPE_CHECKING:
    from yolofeed.ultralytics_seam import Family

STOCK, OURS, REPLACED, UNUSED = "stock", "yolofeed", "replaced", "unused"

# Keys Ultralytics accepts beyond default.yaml: check_dict_alignment's allowed extras, and the old names
# cfg._handle_deprecation maps or drops with a warning (ultralytics 8.4; tests/test_keys.py checks them).
EXTRA_KEYS = ("augmentations", "save_dir")
# Keys of default.yaml in older releases of the seam's range only, deprecated names since (8.4.142 maps end2end onto
# nms, 8.4.164 drops keras): each has its row, for the releases that have it.
OLDER_KEYS = ("end2end", "keras")
DEPRECATED_KEYS = ("boxes", "hide_labels", "hide_conf", "line_thickness", "end2end", "int8", "half",
                   "label_smoothing", "save_hybrid", "crop_fraction", "keras")


@dataclass(frozen=True)
class Rule:
    """One key's row: its kind, what happens, and the values refused (with the message's reason and fix)."""

    kind: str
    note: str
    refuse: Callable[[Any], bool] | None = None  # True for a refused value
    refused: str = ""  # the refused values, in words (docs/train-keys.md)
    reason: str = ""  # why, and what to do; the message is "key=value: reason"
    tasks: tuple[str, ...] = ()  # the tasks whose runs refuse those values (none named: every task's)


def _gpu_backend(value: Any) -> bool:
    return str(value).lower().replace(" ", "").startswith(("mps", "npu", "xpu"))


def _not_class_ids(value: Any) -> bool:
    try:
        class_ids(value)
    except ConfigError:
        return True
    return False


def _not_a_side_divisor(value: Any) -> bool:
    return value is not None and (isinstance(value, bool) or value not in (1, 2, 4, 8, 16, 32))


def _not_an_image_size(value: Any) -> bool:
    from yolofeed.ultralytics_seam import train_side

    try:
        train_side(value)
    except ValueError:
        return value is not None
    return False


def _not_a_batch(value: Any) -> bool:
    """A number of images that is not whole (1.5, 2.0): AutoBatch takes fractions below 1 and -1 (every value below 1),
    Ultralytics' DataLoader any other int; anything else fails there, after the model and the data are built."""
    return isinstance(value, float) and value >= 1


def _not_an_optimizer(value: Any) -> bool:
    from yolofeed.ultralytics_seam import OPTIMIZERS

    return value is not None and str(value).lower() not in {name.lower() for name in OPTIMIZERS}


def _listed(value: Any) -> bool:
    return isinstance(value, (list, tuple))


AUGMENT = "GPU augmentation with Ultralytics' meaning, probability and default"
VALIDATOR = "read by Ultralytics' validator, which yolofeed feeds the same batches as stock"
PREDICT = "prediction, tracking or export only"

RULES: dict[str, Rule] = {
    # what and where
    "task": Rule(OURS, "detect, segment, pose, obb", lambda v: v not in (None, "detect", "segment", "pose", "obb"),
                 "any other task", "yolofeed trains detection, segmentation, pose and oriented-box models "
                 "(classification not yet). Train this model with 'yolo train' (same keys), or pick one such as "
                 "model=yolo11n.yaml"),
    "mode": Rule(STOCK, "train"),
    "model": Rule(STOCK, "a detection model yaml or .pt, built or loaded by Ultralytics (other tasks: see task)"),
    "data": Rule(OURS, "one Ultralytics detection data yaml, a local file; packs are built from it on first use. "
                       "From Python a list is Ultralytics' MultiTrainer, which fine-tunes on each in turn with "
                       "yolofeed's trainer", _listed, "a list of data yamls in one run", DATA_LIST),
    "cfg": Rule(OURS, "a yaml of yolo train keys, read as yolo train reads it (model= and data= too): the command "
                      "line's keys override the file's, and every key goes through this table"),
    "device": Rule(OURS, "CUDA GPUs (several: DDP, as in yolo train) or the CPU", _gpu_backend, "mps, npu, xpu",
                   "yolofeed's loader and augmentation run on CUDA GPUs and the CPU only; use 'yolo train' on "
                   "Apple, Ascend or Intel devices"),
    # the loop
    "epochs": Rule(STOCK, "Ultralytics' loop"),
    "time": Rule(STOCK, "Ultralytics' loop"),
    "patience": Rule(STOCK, "Ultralytics' early stopping"),
    "batch": Rule(OURS, "the loader's batch; -1 or a fraction: Ultralytics' AutoBatch chooses it first", _not_a_batch,
                  "a float of 1 or more (1.5, 2.0)",
                  "a batch is a whole number of images (or -1, or a fraction below 1 of the GPU's memory for "
                  "Ultralytics' AutoBatch); yolo train fails on it too, in its DataLoader"),
    "imgsz": Rule(OURS, "rounded up to a multiple of the model's stride as yolo train does; the pack is built at "
                        "the rounded size", _not_an_image_size, "what Ultralytics' check_imgsz refuses (abc, 640.5)",
                  "not an image size: pass a whole number such as imgsz=640 (a list [h, w] trains at its largest "
                  "side); yolo train refuses it too, once the model and data are built"),
    "save": Rule(STOCK, "Ultralytics' checkpoints"),
    "save_period": Rule(STOCK, "Ultralytics' checkpoints"),
    "cache": Rule(REPLACED, "not needed: packs are memory-mapped and the page cache keeps them in RAM"),
    "workers": Rule(REPLACED, "no loader processes: one thread gathers batches from the pack and the device "
                              "augments them (Ultralytics' start line says 0 workers)"),
    "project": Rule(STOCK, "run folder, as in yolo train"),
    "name": Rule(STOCK, "run folder, as in yolo train"),
    "exist_ok": Rule(STOCK, "run folder, as in yolo train"),
    "save_dir": Rule(STOCK, "run folder, as in yolo train"),
    "pretrained": Rule(STOCK, "Ultralytics' weight loading"),
    "cls_remap": Rule(STOCK, "Ultralytics' weight loading: a pretrained head's class rows matched to the data's "
                             "names"),
    "optimizer": Rule(STOCK, "Ultralytics' optimizer; the MuSGD it builds (optimizer=MuSGD, or auto past 10,000 "
                             "iterations) steps as one CUDA graph, the same update within float32 roundings "
                             "(train/musgd.py)", _not_an_optimizer, "a name Ultralytics does not build",
                      "not an optimizer Ultralytics builds: pick one of Adam, Adamax, AdamW, NAdam, RAdam, RMSprop, "
                      "SGD, MuSGD or auto (the default); yolo train refuses it too, once the model is built"),
    "verbose": Rule(STOCK, "Ultralytics' logging"),
    "seed": Rule(OURS, "seeds Ultralytics (model, CUDA) and yolofeed's shuffle and GPU augmentation: the same "
                       "distributions as stock, other random draws"),
    "deterministic": Rule(STOCK, "Ultralytics' init_seeds (torch deterministic algorithms)"),
    "single_cls": Rule(OURS, "every class id becomes 0 and nc 1, in training and validation, as yolo train does"),
    "rect": Rule(OURS, "False", lambda v: bool(v), "True",
                 "rectangular training batches are not supported: yolofeed's GPU pipeline builds square mosaic "
                 "batches (in yolo train, rect=True also turns off mosaic, mixup and shuffling). Train with "
                 "rect=False; validation uses rectangular batches either way, as in yolo train. For rectangular "
                 "training use 'yolo train'"),
    "cos_lr": Rule(STOCK, "Ultralytics' scheduler"),
    "close_mosaic": Rule(OURS, "the GPU augmentation turns mosaic, mixup and cutmix off for the last N epochs"),
    "resume": Rule(OURS, "resume=path/to/last.pt, or model=path/to/last.pt with resume=True or a bare 'resume'; a "
                         "bare 'resume' alone takes the newest last.pt under the current folder, as yolo train does. "
                         "results.csv rows of epochs after the checkpoint's (a run stopped between an epoch's row and "
                         "its last.pt, or resumed from an older checkpoint) are dropped, as the run trains them again: "
                         "stock writes them twice"),
    "amp": Rule(STOCK, "Ultralytics' AMP check and GradScaler"),
    "fraction": Rule(OURS, "the first share (or count) of each split's sorted files, as yolo train cuts them; a "
                           "[train, val, test] list too. The pack holds the whole split (one pack for every fraction; "
                           "said at start)"),
    "profile": Rule(STOCK, "Ultralytics' loggers"),
    "freeze": Rule(STOCK, "Ultralytics freezes the layers"),
    "multi_scale": Rule(STOCK, "Ultralytics' preprocess_batch resizes each batch; the detection loss then takes "
                               "Ultralytics' own path (said at start): at 0.5, 1.5x stock's speed where the same "
                               "measurement gave 1.8x without (before the step ran as one CUDA graph)"),
    "compile": Rule(STOCK, "Ultralytics' torch.compile; the loader drops the last partial batch, as stock does"),
    "channels_last": Rule(STOCK, "Ultralytics' memory format"),
    "val": Rule(STOCK, "Ultralytics validates each epoch (yolofeed's val_period=N: every N epochs and the last; "
                       "val_overlap: beside the next epoch)"),
    "split": Rule(OURS, "the split validated on; its pack is built on first use"),
    "classes": Rule(OURS, "boxes of other classes are dropped in training and validation (images stay, class ids "
                          "are not renumbered), as yolo train does", _not_class_ids, "anything but class ids",
                    "expected a class id or a list of them, e.g. classes=0 or classes=[0,2,3]"),
    "quantize": Rule(STOCK, "the validator sets its own precision during training; 8 is refused",
                     lambda v: str(v).lower() in ("8", "int8"), "8",
                     "quantization-aware training (NVIDIA ModelOpt) is not supported by yolofeed; train in float "
                     "with yolofeed and quantize on export, or use 'yolo train quantize=8'"),
    "distill_model": Rule(STOCK, "None; knowledge distillation is refused", lambda v: v is not None, "any model",
                          "knowledge distillation is not supported by yolofeed yet (its teacher and loss are "
                          "untested with the GPU pipeline); use 'yolo train distill_model=...'"),
    "dis": Rule(STOCK, "read only with distill_model"),
    "augmentations": Rule(OURS, "None; custom Albumentations are refused", lambda v: bool(v), "any list",
                          "custom Albumentations transforms run on the CPU inside yolo train's dataset; yolofeed "
                          "augments on the GPU and cannot apply them. Drop augmentations=, or use 'yolo train'"),
    # optimisation and loss
    "lr0": Rule(STOCK, "Ultralytics' optimizer"),
    "lrf": Rule(STOCK, "Ultralytics' scheduler"),
    "momentum": Rule(STOCK, "Ultralytics' optimizer"),
    "weight_decay": Rule(STOCK, "Ultralytics' optimizer"),
    "warmup_epochs": Rule(STOCK, "Ultralytics' warm-up"),
    "warmup_momentum": Rule(STOCK, "Ultralytics' warm-up"),
    "warmup_bias_lr": Rule(STOCK, "Ultralytics' warm-up"),
    "nbs": Rule(STOCK, "Ultralytics' gradient accumulation"),
    "box": Rule(STOCK, "the detection loss's gain (yolofeed's sync-free loss is Ultralytics' with the same gains)"),
    "cls": Rule(STOCK, "the detection loss's gain"),
    "dfl": Rule(STOCK, "the detection loss's gain"),
    "cls_pw": Rule(STOCK, "Ultralytics' class weights, counted from the loader's labels"),
    # augmentation
    **{k: Rule(OURS, AUGMENT) for k in ("hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear",
                                         "perspective", "flipud", "fliplr", "bgr", "mosaic", "mixup", "cutmix")},
    "copy_paste": Rule(OURS, "segment and obb: Ultralytics' copy-paste (flip mode) on the GPU; pose, and detect on "
                       "box labels: nothing to paste, as in Ultralytics; detect on polygon labels: refused above 0 "
                       "(the paste of polygons is built for segment and obb runs)"),
    "copy_paste_mode": Rule(OURS, "flip; mixup refused where copy_paste is above 0 (but for pose and detect on box "
                                  "labels, where Ultralytics pastes nothing)"),
    # validation and plots during training
    **{k: Rule(STOCK, VALIDATOR) for k in ("conf", "iou", "max_det", "save_json", "save_txt", "save_conf",
                                            "visualize", "augment", "agnostic_nms", "nms", "dnn", "show_labels",
                                            "show_conf")},
    "end2end": Rule(STOCK, f"{VALIDATOR} (a key until 8.4.141; from 8.4.142 an old name of nms)"),
    "plots": Rule(STOCK, "Ultralytics' plots (label plots from the loader's labels)"),
    # pose: the loss's keypoint gains, Ultralytics' PoseTrainer's
    **{k: Rule(STOCK, "pose only: the keypoint loss's gains (FastPoseTrainer)") for k in ("pose", "kobj", "rle")},
    "angle": Rule(STOCK, "OBB only: the angle loss's gain, read by FastOBBTrainer's loss as by Ultralytics'"),
    # other tasks
    # segmentation: Format's masks, made on the device (augment/masks.py) for training and validation batches
    "overlap_mask": Rule(OURS, "segmentation only: one index mask per image (instances sorted by area) or one mask "
                               "per instance, as Format makes them; the loss and validator read it too"),
    "mask_ratio": Rule(OURS, "segmentation only: the masks' downsampling, as Format's", _not_a_side_divisor,
                       "anything but 1, 2, 4, 8, 16 or 32", "yolofeed makes masks by a whole ratio that divides "
                       "every image side (multiples of 32); pick mask_ratio=4 (the default) or another of 1, 2, 8, "
                       "16, 32, or use 'yolo train'", ("segment",)),
    **{k: Rule(UNUSED, "OBB, classification or depth only") for k in (
        "dropout", "dlog", "dgrad", "dlam",
        "auto_augment", "erasing")},
    # prediction and export
    **{k: Rule(UNUSED, PREDICT) for k in (
        "source", "vid_stride", "stream_buffer", "retina_masks", "embed", "show", "save_frames", "save_crop",
        "show_boxes", "line_width", "format", "optimize", "dynamic", "simplify", "opset", "workspace", "tracker")},
    "keras": Rule(UNUSED, f"{PREDICT} (a key until 8.4.163)"),
}


def value_of(args: Any, key: str) -> Any:
    return args.get(key) if isinstance(args, dict) else getattr(args, key, None)


def refusal(args: Any, task: str | None = None) -> str | None:
    """The first refused value among ``args`` (Ultralytics' final training arguments, or a dict), as one line; a rule
    of some tasks (``Rule.tasks``) only for a run of one of them (``task``)."""
    for key, rule in RULES.items():
        value = value_of(args, key)
        if rule.tasks and task not in rule.tasks:
            continue
        if rule.refuse is not None and rule.refuse(value):
            return f"{key}={value}: {rule.reason}"
    return None


TRAINED = {"detect": "FastDetectionTrainer", "pose": "FastPoseTrainer",  # the tasks yolofeed trains, and their trainer
           "obb": "FastOBBTrainer", "segment": "FastSegmentationTrainer"}
KIND = {"detect": "detection", "segment": "segmentation", "obb": "oriented-box", "classify": "classification"}


def a_kind(task: str) -> str:
    """"a detection", "an oriented-box": the task's kind of model with its article."""
    kind = KIND.get(task, task)
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def check(args: Any, carried: tuple[str, ...] = tuple(TRAINED)) -> None:
    """Raise on the first refused value, model task included (before anything is built).

    Args:
        carried: the tasks the trainer at hand trains (``FastDetectionTrainer``: detect; ``yolofeed train``: any in
            ``TRAINED``, it picks the trainer by the model's task).

    Raises:
        ConfigError: a refused value; its message says why and what to do.
    """
    model, asked = value_of(args, "model"), value_of(args, "task")
    refuse_other_family(model)
    task, own = model_task(model, asked), model_task(model, None)
    if own != "detect" and own != task:  # the model's head is of another task than the one asked (a trainer's own)
        task = own
    if own == "detect" and task != "detect" and task in TRAINED and str(model).lower().endswith((".yaml", ".yml")):
        # a detection yaml's head for a pose run: Ultralytics fails building the model (KeyError: 'kpt_shape')
        article = "an" if task[:1] in "aeiou" else "a"
        tag = {"segment": "seg"}.get(task, task)  # Ultralytics' file names: yolo11n-seg.yaml
        raise ConfigError(f"model={model} is a detection model, and this run is task={task}: pick {article} {task} "
                          f"model such as model=yolo11n-{tag}.yaml, or train this one as detection (drop task=; "
                          f"FastDetectionTrainer)")
    if task not in carried:
        if asked == task and own in carried:  # the model is of a carried task: task= is the problem
            raise ConfigError(f"task={task}: model={model} is {a_kind(own)} model: drop task= (or pass "
                              f"task={own})")
        if task in TRAINED:
            raise ConfigError(f"model={model} is {a_kind(task)} model: train it with yolofeed's "
                              f"{TRAINED[task]} (YOLO(...).train(trainer={TRAINED[task]}), or yolofeed train, which "
                              "picks it)")
        raise ConfigError(f"task={task} (model={model}): {RULES['task'].reason}")
    from yolofeed.ultralytics_seam import check_task

    check_task(task)  # pose under a release older than the pose rules yolofeed follows: one line, before any build
    check_copy_paste(args, task)
    if (why := refusal({**args, "task": None} if isinstance(args, dict) else _without_task(args), task)) is not None:
        raise ConfigError(why)


def check_copy_paste(args: Any, task: str) -> None:
    """Refuse copy-paste where yolofeed does not paste as Ultralytics does: the mixup mode is not built. Pose labels
    have nothing to paste, as in Ultralytics; a detection run's labels decide (``check_detect_copy_paste``).

    Raises:
        ConfigError: one line, with the fix.
    """
    value = value_of(args, "copy_paste")
    if not value or float(value) <= 0 or task in ("detect", "pose"):
        return
    mode = value_of(args, "copy_paste_mode") or "flip"
    if mode != "flip":
        raise ConfigError(f"copy_paste_mode={mode}: yolofeed builds copy-paste's flip mode only (its own images' "
                          "mirrored objects). Use copy_paste_mode=flip, copy_paste=0, or 'yolo train'")


def check_detect_copy_paste(value: float, polygons: str | None) -> None:
    """A detection run's ``copy_paste``: on box labels Ultralytics pastes nothing (``CopyPaste`` needs segments), as
    here; on polygon labels it pastes them, which yolofeed builds for segmentation and OBB runs only.

    Args:
        polygons: where the run's polygon rows are (a label file found early, or the pack's label folder), or None.

    Raises:
        ConfigError: one line, with the fix.
    """
    if value > 0 and polygons is not None:
        raise ConfigError(f"copy_paste={value}: Ultralytics pastes mirrored copies of the polygon rows in {polygons} "
                          "in a detection run; yolofeed pastes in segmentation and oriented-box runs only. Train with "
                          "copy_paste=0, a segmentation model, or 'yolo train'")


def _without_task(args: Any) -> dict[str, Any]:
    """Ultralytics' arguments as a dict, the task (checked above) left out."""
    return {k: v for k, v in vars(args).items() if k != "task"}


def model_task(model: Any, task: str | None) -> str:
    """The model's task: ``task`` when it is not detection, else what the model yaml's head (or name) says."""
    if task not in (None, "detect") or not isinstance(model, (str, Path)):
        return task or "detect"
    from yolofeed.ultralytics_seam import guess_model_task, yaml_model_load

    path = str(model)
    try:
        spec = yaml_model_load(path) if path.lower().endswith((".yaml", ".yml")) else path
    except FileNotFoundError:  # reported with the fix where the model is loaded
        return "detect"
    guessed = guess_model_task(spec) if isinstance(spec, dict) and spec.get("head") else None
    if guessed is None and path.lower().endswith(".pt") and Path(path).is_file():
        guessed = _weights_task(path)  # a run's last.pt, a fine-tuned copy: what it holds, whatever its name
    if guessed is None and not isinstance(spec, dict):  # weights or a name: the file name's -seg, -pose...
        stem = Path(path).stem
        guessed = next((t for t, tag in (("segment", "-seg"), ("pose", "-pose"), ("obb", "-obb"),
                                         ("classify", "-cls"), ("semantic", "-sem"), ("depth", "-depth"))
                        if tag in stem), None)
    return guessed or "detect"


def _weights_task(path: str) -> str | None:
    """The task of the model in a weights file, as Ultralytics reads it (its training arguments', else its head's), or
    None where the file does not read (the trainer reports that one with the fix)."""
    return _weights_summary(path)[0]


def _weights_summary(path: str) -> tuple[str | None, Family | None]:
    """A weights file's task (``_weights_task``) and model family (``model_family``), from one read of it while the
    file is unchanged: the checks before a run ask both, more than once, and each read unpickles the whole model."""
    try:
        st = Path(path).stat()
    except OSError:
        return None, None
    return _read_weights_summary(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _read_weights_summary(path: str, mtime_ns: int, size: int) -> tuple[str | None, Family | None]:
    from yolofeed.ultralytics_seam import guess_model_task, other_family, torch_safe_load

    try:
        ckpt, _ = torch_safe_load(path)
        model = ckpt.get("ema") or ckpt.get("model")
        task = (ckpt.get("train_args") or {}).get("task")
        return (task if isinstance(task, str) else guess_model_task(model)), other_family(model)
    except Exception:  # damaged or foreign: train.run.check_checkpoint says so in one line
        return None, None


def model_family(model: Any) -> Family | None:
    """The family of a model yolofeed does not train (``seam.other_family``: RT-DETR, YOLO-World, YOLOE), told by the
    model's head: a yaml's, a weights file's, a built model's; for a name Ultralytics downloads (no file yet), by its
    own rule on the name (``seam.family_by_name``). None for any other model, and for a file that is not there or does
    not read (the run's checks say so in one line, with the fix)."""
    from yolofeed.ultralytics_seam import (
        downloads_weights,
        family_by_name,
        other_family,
        remote_model,
        weights_name,
        yaml_model_load,
    )

    if not isinstance(model, (str, Path)):
        return other_family(model)
    path = str(model)
    if path.lower().endswith((".yaml", ".yml")):
        try:
            return other_family(yaml_model_load(path))
        except Exception:  # missing or not a model's yaml: reported with the fix where the model is loaded
            return None
    if Path(path).is_file():
        return _weights_summary(path)[1] if path.lower().endswith(".pt") else None
    named = path if path.lower().endswith(".pt") else weights_name(path)
    return family_by_name(path) if remote_model(path) or downloads_weights(named) else None


def refuse_other_family(model: Any) -> None:
    """Raise where the model is of a family yolofeed does not train (``model_family``), before anything is built.

    Raises:
        ConfigError: one line naming the family and stock Ultralytics' way to train it.
    """
    if (family := model_family(model)) is None:
        return
    name = model if isinstance(model, (str, Path)) else type(model).__name__
    raise ConfigError(f"model={name} is {family.article} {family.words} model, which yolofeed does not train (it "
                      "trains YOLO detection, segmentation, pose and oriented-box models): train it with stock "
                      f"Ultralytics, yolo train model={name} ... or {family.trains}(...).train() without trainer=")


def valid_names() -> set[str]:
    """Every key Ultralytics' training accepts: default.yaml's, its allowed extras and deprecated names."""
    from yolofeed.ultralytics_seam import DEFAULT_CFG_DICT

    return set(DEFAULT_CFG_DICT) | set(EXTRA_KEYS) | set(DEPRECATED_KEYS)


def check_names(names: Iterable[str], own: Iterable[str] = (), command: str = "yolofeed train") -> None:
    """Refuse a key that neither Ultralytics nor yolofeed knows, naming the closest valid one.

    Args:
        names: the keys passed on to Ultralytics.
        own: the command's own keys (also offered as the closest match).

    Raises:
        ConfigError: an unknown key (one line, instead of Ultralytics' help text and traceback).
    """
    valid = valid_names()
    trains = {f.name for f in fields_of(TrainConfig) if not f.metadata.get("passthrough")}  # yolofeed train's own
    for name in names:
        # another command's key is no typo: the closest of this command's keys would mislead
        if name not in valid and name in trains and command != "yolofeed train":
            raise ConfigError(f"'{name}' is a key of 'yolofeed train', not of '{command}'; '{command} help' lists "
                              "its keys.")
        if name not in valid:
            near = difflib.get_close_matches(name, sorted(valid | set(own)), n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            raise ConfigError(f"'{name}' is not a key of '{command}' or of 'yolo train'.{hint} "
                              f"'{command} help' lists yolofeed's keys, 'yolo cfg' Ultralytics' keys.")


def refuse_run_folder_keys(extra: dict[str, Any], command: str) -> None:
    """``yolofeed bench`` and ``doctor`` put each mode's run in ``out=``'s runs folder themselves, from scratch:
    ``project=``, ``name=`` or ``exist_ok=`` sent both modes into one folder (the second overwrote the first's files
    while the report named another), and ``resume=`` trained on the newest last.pt of the working folder, a stranger's.

    Raises:
        ConfigError: naming the key and what to use instead.
    """
    if extra.get("resume") not in (None, False):
        raise ConfigError(f"resume={extra['resume']}: {command} trains runs of its own from scratch; go on with a "
                          "training of yours with yolofeed train model=<run>/weights/last.pt resume")
    clash = [k for k in ("project", "name", "exist_ok") if k in extra]
    if clash:
        raise ConfigError(f"{', '.join(f'{k}={extra[k]}' for k in clash)}: {command} puts each mode's run in "
                          "out=/runs/<mode> itself; choose the folder with out=")


def check_overrides(overrides: dict[str, Any], own: Iterable[str] = (), command: str = "yolofeed train",
                    routes: Callable[[str, Any], str | None] | None = None) -> None:
    """Keys handed to Ultralytics, checked as ``ultralytics.cfg.get_cfg`` checks them, but in one line.

    Args:
        overrides: key -> value, as Ultralytics' ``smart_value`` reads the command line.
        own: the command's own keys (offered as the closest match of a typo).
        routes: for a key Ultralytics does not know, the message that says where it goes instead, or None (the
            trainer's: a key of ``yolofeed train`` passed to ``YOLO(...).train()`` goes through ``with_options``).

    Raises:
        ConfigError: an unknown key (with the closest valid one, or where it goes), or a value of the wrong type or
            range.
    """
    from yolofeed.ultralytics_seam import check_cfg

    if routes is not None:
        valid = valid_names()
        for name, value in overrides.items():
            if name not in valid and (said := routes(name, value)):
                raise ConfigError(said)
    check_names(overrides, own, command)
    try:
        check_cfg(dict(overrides))  # on a copy: it converts values in place
    except (TypeError, ValueError) as e:  # Ultralytics' messages are one line: key=value, what is valid
        raise ConfigError(str(e).strip()) from None


def check_device(device: Any, ddp: bool = True, ours: bool = True) -> str:
    """Ultralytics' canonical device string, refused in one line where ``select_device`` would raise.

    ``ddp``: several devices are one DDP run's (``yolofeed train``, ``bench``), not places for runs of their own
    (``parity``). ``ours``: yolofeed trains on it (not only stock: ``doctor yolofeed=False``, ``bench modes=stock``,
    which profile Apple's, Ascend's and Intel's devices as Ultralytics trains on them).

    Raises:
        ConfigError: a device that is not the CPU or CUDA indices this machine has (Apple's, Ascend's and Intel's
            devices as ``RULES["device"]`` refuses them).
        UltralyticsError: several devices, under a release that cannot start yolofeed's DDP ranks (``check_ddp``).
    """
    import torch

    from yolofeed.ultralytics_seam import parse_device

    canonical = parse_device(device if device is not None else "")
    if _gpu_backend(canonical) and ours:
        raise ConfigError(f"device={device}: {RULES['device'].reason}")
    if canonical in ("", "cpu") or _gpu_backend(canonical):
        return canonical
    # as typed: device=0,1 reaches here as the tuple (0, 1), which Ultralytics' value parser makes of it
    device = ",".join(map(str, device)) if isinstance(device, (list, tuple)) else device
    indices = canonical.split(",")
    if not all(i.isdigit() for i in indices):
        raise ConfigError(f"device={device}: expected cpu, a CUDA GPU index such as device=0, or several such as "
                          "device=0,1")
    if not torch.cuda.is_available():
        raise ConfigError(f"device={device}: torch sees no CUDA GPU on this machine (torch.cuda.is_available() is "
                          "False). Train on the CPU with device=cpu, or install a CUDA build of torch "
                          "(https://pytorch.org/get-started/locally/)")
    n = torch.cuda.device_count()
    if any(int(i) >= n for i in indices):
        raise ConfigError(f"device={device}: torch sees {n} CUDA GPU(s) here, device=0 to device={n - 1}")
    if len(indices) > 1 and ddp:
        from yolofeed.ultralytics_seam import check_ddp

        check_ddp()  # releases whose DDP ranks cannot rebuild yolofeed's trainer refuse it here, in one line
    return canonical


def triton_available() -> bool:
    """Whether the augmentation's Triton kernels can load here (importing them imports Triton)."""
    from yolofeed.augment.warp import triton_kernels

    return triton_kernels() is not None


def start_notes(args: Any, device_type: str) -> list[str]:
    """The lines said before training: what yolofeed does differently from stock for these arguments."""
    notes = []
    if device_type == "cpu":
        notes.append("yolofeed: on the CPU yolofeed trains slower than stock Ultralytics; for speed use a GPU, or "
                     "plain 'yolo train' on the CPU")
    if device_type == "cuda" and not triton_available():
        notes.append("yolofeed: Triton is not installed, so the GPU augmentation runs as plain PyTorch operations: "
                     "the same images, at about 0.45x the speed (yolo11n on an H200: 738 img/s, slower than stock's "
                     "~900); install the triton that matches your torch for full speed")
    if value_of(args, "multi_scale"):
        notes.append(f"yolofeed: multi_scale={value_of(args, 'multi_scale')}: the detection loss takes Ultralytics' "
                     "own path, which waits for the GPU a few times a step (the next batch's size is not known "
                     "ahead): yolofeed trained yolo11n 1.5x faster than stock at multi_scale=0.5, against 1.8x without "
                     "in the same measurement")
    if value_of(args, "cache"):
        notes.append(f"yolofeed: cache={value_of(args, 'cache')} is not needed: packs are memory-mapped and the page "
                     "cache keeps them in RAM")
    fraction = value_of(args, "fraction")
    if fraction is not None and any(f != 1 for f in (fraction if isinstance(fraction, (list, tuple)) else [fraction])):
        notes.append(f"yolofeed: fraction={fraction}: the pack holds the whole split and training reads its share, "
                     "as yolo train cuts it; one pack serves every fraction, so none rebuilds it (built once: 4-11 s "
                     "for 10,000 images at 640 on the H200 machine)")
    if value_of(args, "workers"):  # Ultralytics sets 0 on the CPU itself
        notes.append(f"yolofeed: workers={value_of(args, 'workers')} is not used: one thread gathers batches from "
                     "the pack and the device augments them (Ultralytics' start line says 0 dataloader workers)")
    return notes


def markdown() -> str:
    """docs/train-keys.md: the table, for users."""
    from yolofeed.ultralytics_seam import DEFAULT_CFG_DICT

    lines = ["# Train keys", "",
             "What `yolofeed train` does with each `yolo train` key (Ultralytics "
             f"{_ultralytics_version()}). Generated from `src/yolofeed/train/keys.py` by\n"
             "`python -c 'from yolofeed.train.keys import markdown; print(markdown(), end=\"\")' > "
             "docs/train-keys.md`;\n`tests/test_keys.py` checks both agree.", "",
             "- **stock**: Ultralytics' own trainer, validator, loss or plots read it; yolofeed passes it on "
             "untouched.",
             "- **yolofeed**: yolofeed's pack, loader or GPU augmentation applies it as `yolo train` does.",
             "- **replaced**: a speed setting of Ultralytics' CPU loader; yolofeed's pack does that job.",
             "- **unused**: detection training does not read it, in `yolo train` either.",
             "- A value under *refused* stops the run before its first step, with the reason and what to do.", "",
             "| key | default | kind | what happens | refused |", "|---|---|---|---|---|"]
    for key, rule in RULES.items():
        default = DEFAULT_CFG_DICT.get(key, "")
        refused = rule.refused + (f" (in {', '.join(KIND[t] for t in rule.tasks)} runs)" if rule.tasks else "")
        lines.append(f"| `{key}` | {'' if default is None else f'`{default}`'} | {rule.kind} | {rule.note} | "
                     f"{refused} |")
    return "\n".join(lines) + "\n"


def _ultralytics_version() -> str:
    """The releases the table holds for, and whose defaults it shows: the seam's range (`make test-releases` checks
    the table under its ends and a middle; older releases lack no key, and have OLDER_KEYS), the defaults TESTED's."""
    from yolofeed.ultralytics_seam import RANGE, TESTED

    return f"{RANGE}; the defaults of {TESTED}"

