"""The model as Ultralytics builds and calls it: its input (``scaled_input``), how its layers take each other's output
(``layer_inputs``), its stride, its loss (the criterion), its forward GFLOPs, whether it is compiled, and Ultralytics'
objects made ours in place (``swap_class``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch

from yolofeed.ultralytics_seam.arguments import _QuietHere
from yolofeed.ultralytics_seam.names import (
    LOGGER,
    YAML,
    Conv,
    DetectionModel,
    E2EDetectLoss,
    E2ELoss,
    RTDETRDecoder,
    WorldDetect,
    YOLOEDetect,
    _tasks_module,
    get_flops,
    torch_safe_load,
    unwrap_model,
    yaml_model_load,
)
from yolofeed.ultralytics_seam.version import since


def scaled_input(img: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Ultralytics' training input, ``img.float() / 255`` (``DetectionTrainer.preprocess_batch``, RELIED_ON), made
    straight in ``dtype``, as the step's first convolution receives it when it autocasts to ``dtype``: one kernel
    from ``img`` (uint8, or float in [0, 255]), where stock writes a float32 copy, divides it into another and casts
    that (at batch 128 and 640 px, 2.5 GB more read and written a step). The division is float32's, rounded once to
    ``dtype`` on the store, as the autocast's cast rounds it: the same values (tests/test_step_input.py)."""
    return torch.div(img, 255, out=torch.empty(img.shape, dtype=dtype, device=img.device))


def image_feeds_a_convolution(model: Any) -> bool:
    """Whether the model's first layer is Ultralytics' ``Conv`` and takes the image alone (``m.f == -1``; the image is
    not kept for a later layer: ``DetectionModel._predict_once``), so that the first thing done to the image under
    autocast is the convolution's cast of it."""
    layers = getattr(unwrap_model(model), "model", None)
    first = layers[0] if isinstance(layers, torch.nn.Sequential) and len(layers) else None
    return isinstance(first, Conv) and getattr(first, "f", None) == -1


def layer_inputs(model: Any) -> dict[int, list[torch.nn.Module]]:
    """For each layer of the model's ``model`` (its ``Sequential``), by index, the layers that take its output, as
    ``BaseModel._predict_once`` (RELIED_ON) routes them: ``f`` names the layers a layer takes, -1 (or any negative
    index) counting back from the layer itself (the first layer's -1 is the image). The last layer's output is the
    model's: nothing takes it here."""
    layers = list(unwrap_model(model).model)
    takers: dict[int, list[torch.nn.Module]] = {i: [] for i in range(len(layers))}
    for j, m in enumerate(layers):
        for f in ([m.f] if isinstance(m.f, int) else m.f):
            if j + f >= 0 or f >= 0:
                takers[j + f if f < 0 else f].append(m)
    return takers


class Family(NamedTuple):
    """A model family Ultralytics builds beside YOLO's that yolofeed's trainers do not train (their own losses, text
    embeddings or decoder)."""

    head: type  # the head every model of the family ends in (subclasses included)
    words: str  # "RT-DETR"
    article: str  # "an": as "RT-DETR" is read
    trains: str  # the Ultralytics class that trains it
    tag: str  # what a model name holds for Ultralytics to build the family: its command line's rule ("rtdetr"),
    # YOLO()'s for a yaml ("-world", "yoloe")


OTHER_FAMILIES = (Family(RTDETRDecoder, "RT-DETR", "an", "RTDETR", "rtdetr"),
                  Family(WorldDetect, "YOLO-World", "a", "YOLOWorld", "-world"),
                  Family(YOLOEDetect, "YOLOE", "a", "YOLOE", "yoloe"))


def other_family(model: Any) -> Family | None:
    """The family of a model yolofeed does not train, told by its head, or None.

    Args:
        model: a built model (its last layer is the head), a ``YOLO()`` object (its model's), or a model yaml's dict
            (its last head row's module name, looked up among ``ultralytics.nn.tasks``' names as ``parse_model`` looks
            it up).
    """
    if isinstance(model, dict):
        rows = model.get("head")
        row = rows[-1] if isinstance(rows, list) and rows else None
        name = row[2] if isinstance(row, (list, tuple)) and len(row) > 2 else None
        head = getattr(_tasks_module, name, None) if isinstance(name, str) else None
    else:
        inner = getattr(model, "model", None)
        if isinstance(inner, torch.nn.Module) and not isinstance(inner, torch.nn.Sequential):
            model = inner  # a YOLO() object: its DetectionModel
        layers = getattr(unwrap_model(model), "model", None) if isinstance(model, torch.nn.Module) else None
        head = type(layers[-1]) if isinstance(layers, torch.nn.Sequential) and len(layers) else None
    return next((f for f in OTHER_FAMILIES if isinstance(head, type) and issubclass(head, f.head)), None)


def family_by_name(name: str) -> Family | None:
    """The family Ultralytics builds for a model name it downloads (no file to read the head of yet), by its rule on
    the name's stem (``Family.tag``), or None."""
    stem = Path(name).stem.lower()
    return next((f for f in OTHER_FAMILIES if f.tag in stem), None)


def loader_stride(model: Any) -> int:
    """The stride ``DetectionTrainer.build_dataset`` gives the loaders: the model's largest, at least 32 (32 before a
    model is built)."""
    return max(int(unwrap_model(model).stride.max()), 32) if model is not None else 32


def criterion(model: Any) -> Any:
    """The model's loss (``BaseModel.criterion``; None until the first loss call or ``make_criterion``)."""
    return getattr(unwrap_model(model), "criterion", None)


def set_criterion(model: Any, value: Any) -> None:
    """Replace the model's loss: ``BaseModel.loss`` calls ``self.criterion(preds, batch)``."""
    unwrap_model(model).criterion = value


def make_criterion(model: Any) -> Any:
    """A new loss for the model, as ``BaseModel.loss`` makes it on its first call (``init_criterion``)."""
    return unwrap_model(model).init_criterion()


def detection_losses_in(crit: Any) -> list:
    """The plain detection losses in a criterion: itself, or the two of YOLO26's end-to-end loss
    (``E2ELoss.one2many`` and ``one2one``)."""
    if isinstance(crit, (E2ELoss, E2EDetectLoss)):
        return [crit.one2many, crit.one2one]
    return [crit]


def swap_class(obj: Any, ultralytics_class: type, ours: type) -> bool:
    """Make ``obj`` an instance of ``ours`` in place if it is exactly an ``ultralytics_class`` (listed in ``SWAPPED``).

    The object keeps its state, so ``ours`` must subclass ``ultralytics_class`` and add methods only.
    Returns whether it was swapped.
    """
    if not issubclass(ours, ultralytics_class):
        raise TypeError(f"{ours.__name__} must subclass {ultralytics_class.__name__} to replace it in place")
    if type(obj) is not ultralytics_class:
        return False
    obj.__class__ = ours
    return True


def forward_gflops(trainer: Any) -> float | None:
    """The trainer's model's forward GFLOPs for one image at its training size (``get_flops``: THOP, a multiply-add
    as 2 FLOPs), or None where Ultralytics cannot count them (it returns 0.0: no THOP, a model THOP cannot trace)."""
    gflops = get_flops(unwrap_model(trainer.model), trainer.args.imgsz)
    return float(gflops) if gflops else None


def compiled(trainer: Any) -> bool:
    """Whether the trainer's model runs under ``torch.compile`` (``compile=True``: ``attempt_compile`` wrapped it,
    and ``unwrap_model`` finds the model under its ``_orig_mod``)."""
    return unwrap_model(trainer.model) is not _unparallel(trainer.model)


def _unparallel(m: Any) -> Any:
    """The module under DataParallel / DistributedDataParallel wrappers (their ``module``), compile left on."""
    while type(m).__name__ in ("DataParallel", "DistributedDataParallel"):
        m = m.module
    return m


def model_ahead(args: Any) -> torch.nn.Module | None:
    """A detection model with the layers ``DetectionTrainer.get_model`` (RELIED_ON) will build for a run's ``args``
    (its ``model``: a model yaml, or a .pt file whose ``yaml`` it holds; its ``data``: a data yaml file, its ``names``
    or ``nc`` and its ``channels``, one class with ``single_cls``, as ``get_dataset`` reads them), on the CPU, its
    weights its own: for cuDNN's plans before the trainer exists (train/plans.py). None where either cannot be read
    without Ultralytics' checks (a dataset or model to download, a data yaml that names neither). Its random weights
    draw from torch's random stream: build it before ``init_seeds`` seeds it."""
    data_file = Path(str(args.data or ""))
    name = str(args.model or "")
    if not data_file.is_file() or not name.lower().endswith((".yaml", ".yml", ".pt")):
        return None
    data = YAML.load(data_file)
    names = data.get("names") if isinstance(data, dict) else None
    nc = 1 if args.single_cls else len(names) if isinstance(names, (list, dict)) else data.get("nc")
    if not isinstance(nc, int) or nc < 1:
        return None
    if name.lower().endswith(".pt"):
        if not Path(name).is_file():
            return None
        ckpt, _ = torch_safe_load(name)
        cfg = getattr(ckpt.get("ema") or ckpt.get("model"), "yaml", None)
    else:
        cfg = yaml_model_load(name)
    if not isinstance(cfg, dict):
        return None
    quiet = _QuietHere()  # "Overriding model.yaml nc=80 with nc=...": the trainer's own build says it
    LOGGER.addFilter(quiet)
    try:
        return DetectionModel(cfg, nc=nc, ch=int(data.get("channels", 3)), verbose=False)
    finally:
        LOGGER.removeFilter(quiet)


def trains_channels_last(args: Any) -> bool:
    """Whether ``BaseTrainer._setup_train`` (RELIED_ON) puts the model in the channels-last layout on CUDA for a run's
    ``args``: ``channels_last=True``, or left unset (None) off Windows (on Windows too before 8.4.146)."""
    import platform

    if args.channels_last is None:
        return platform.system() != "Windows" or not since("8.4.146")
    return args.channels_last is True
