"""``yolofeed train``: ``YOLO(model).train(trainer=FastDetectionTrainer, ...)`` with a speed summary (the trainer
of the model's task: ``FastPoseTrainer`` for a pose model)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from yolofeed import processes
from yolofeed.config import TrainConfig, fields_of
from yolofeed.errors import ConfigError, first_line
from yolofeed.train import keys, options
from yolofeed.train.checkpoints import UNPICKLING_ERRORS, check_intact, refuse_nothing_to_resume, way_on


def resume_checkpoint(cfg: TrainConfig) -> str | None:
    """The checkpoint to continue from, read as ``yolo train`` reads ``resume``; None to start a new run.

    ``resume=path/to/last.pt``, or ``resume=True`` (a bare ``resume`` on the command line) with
    ``model=path/to/last.pt``; ``resume=False`` starts a new run.

    Raises:
        ConfigError: resume=True without model=, or no file at the checkpoint's path.
    """
    value = cfg.resume
    if value is None or str(value).lower() == "false":
        return None
    path = cfg.model if str(value).lower() == "true" else value
    if not path:  # as yolo train: the newest last*.pt under the current folder
        from yolofeed.ultralytics_seam import get_latest_run

        try:
            path = get_latest_run()
        except OSError as e:  # its newest-first sort reads each last*.pt's time: a broken link raises there
            raise ConfigError(f"resume: could not read the last*.pt files under {Path.cwd()} to take the newest "
                              f"({first_line(e)}: a broken link, or a file removed meanwhile); pass "
                              "resume=path/to/last.pt") from None
        if not path:
            raise ConfigError(f"resume: no last.pt under {Path.cwd()} to continue (a bare 'resume' takes the newest "
                              "one there, as yolo train does); pass resume=path/to/last.pt, or model=path/to/last.pt "
                              "resume")
        print(f"yolofeed train: resuming the newest checkpoint under this folder, {path}", flush=True)
    if str(value).lower() == "true" and Path(str(path)).suffix.lower() in (".yaml", ".yml"):
        raise ConfigError(f"resume: model={path} is a model to build, not a checkpoint to continue; pass "
                          "model=<run>/weights/last.pt resume, or a bare 'resume' without model= for the newest "
                          "last.pt under this folder")
    if not Path(path).is_file():
        raise ConfigError(f"resume: no checkpoint at {path}; point at a run's weights/last.pt")
    return str(path)


def with_cfg_file(cfg: TrainConfig) -> TrainConfig:
    """``cfg=file.yaml`` read as ``yolo train`` reads it: every key in the file, under the command line's.

    The file may hold model=, data= and resume= (yolofeed's own keys here: the file fills them when the
    command line leaves them out) and any other ``yolo train`` key, which goes to Ultralytics as if typed
    and is checked as such.

    Raises:
        ConfigError: no such file, or not a yaml mapping; a ``save_dir`` in it that names a folder holding something
            (a run's args.yaml names its own run), where the command line neither resumes nor names ``save_dir``.
    """
    path = cfg.extra.get("cfg")
    if path is None:
        return cfg
    from yolofeed.ultralytics_seam import YAML, check_yaml

    try:
        loaded = YAML.load(check_yaml(path))
    except FileNotFoundError:
        raise ConfigError(f"cfg={path}: file not found. cfg= names a yaml of yolo train keys (a run's args.yaml, "
                          "say), whose keys the command line's override") from None
    except (ValueError, AssertionError) as e:  # YAML syntax, not a mapping, not a .yaml name
        raise ConfigError(f"cfg={path}: {' '.join(str(e).split())}") from None
    loaded.pop("cfg", None)
    ours = sorted(set(loaded) & {f.name for f in fields_of(TrainConfig)} - {"model", "data", "resume"})
    if ours:  # the command line would not know whether it set them or left their defaults
        raise ConfigError(f"cfg={path} holds {', '.join(ours)}: yolofeed's own keys go on the command line; cfg= "
                          "holds yolo train keys (model=, data= and resume= too)")
    own = {k: loaded.pop(k) for k in ("model", "data", "resume") if k in loaded}
    fill = {k: v for k, v in own.items() if getattr(cfg, k) is None and v is not None}
    folder = loaded.get("save_dir")
    if folder and "save_dir" not in cfg.extra and not (cfg.resume or fill.get("resume")) and Path(folder).is_dir() \
            and any(Path(folder).iterdir()):  # a run's args.yaml: its save_dir wins over name= and project=
        raise ConfigError(f"cfg={path} holds save_dir: {folder}, an existing run folder this run would write over "
                          "(save_dir wins over name= and project=, as in yolo train); remove save_dir from the file, "
                          "or pass save_dir= a new folder")
    extra = {**loaded, **{k: v for k, v in cfg.extra.items() if k != "cfg"}}
    return dataclasses.replace(cfg, **fill, extra=extra)


def check_model_file(name: str) -> str | None:
    """A model yaml that is not one (a data yaml passed as model=, say), a ``.pt`` that is not there and that
    Ultralytics would not download (``seam.downloads_weights``: for such a name it asks GitHub which assets it could
    download, with YOLO_OFFLINE set too, then fails), and a name that is neither (an ONNX file, a text file:
    Ultralytics trains neither, and said so in a traceback once the run had started), refused before Ultralytics
    builds or looks for it. A bare name of Ultralytics' models is its ``.pt`` (``seam.weights_name``); a URL or a
    platform name (``seam.remote_model``) is left to Ultralytics, which fetches it, as are its downloads by name (a
    failed one is said in one line where the model is built: ``load_model``).

    Returns:
        the ``.pt`` the name stands for (``yolo11n.pt`` for yolo11n), there or to download; None for a yaml, a URL or a
        platform name.

    Raises:
        ConfigError: the yaml has no backbone and head, or is not valid YAML; no file at the ``.pt`` path, and not a
            name Ultralytics downloads; a name that is no yaml or ``.pt``.
    """
    from yolofeed.ultralytics_seam import downloads_weights, remote_model, weights_name

    name = str(name)
    if remote_model(name):  # a URL or a platform name: Ultralytics fetches it (a .pt) as it loads it
        return None
    weights = name if name.lower().endswith((".pt", ".yaml", ".yml")) else weights_name(name)  # yolo11n: yolo11n.pt
    if not weights.lower().endswith((".pt", ".yaml", ".yml")):
        what = "a file of another kind" if Path(name).is_file() else "no such file"
        raise ConfigError(f"model={name}: {what}. yolofeed trains from a model yaml (model=yolo11n.yaml) or PyTorch "
                          "weights (model=path/to/best.pt); an exported model (ONNX, TensorRT...) predicts and "
                          "validates only")
    if weights.lower().endswith(".pt") and not Path(weights).exists() and not downloads_weights(weights):
        raise _no_such_model(name if weights == name else f"{name} ({weights})")
    if not name.lower().endswith((".yaml", ".yml")):
        return weights
    from yolofeed.ultralytics_seam import yaml_model_load

    try:
        spec = yaml_model_load(name)
    except FileNotFoundError:  # not a file, and no model yaml of Ultralytics' own by that name
        raise _no_such_model(name) from None
    except ValueError as e:
        raise ConfigError(f"model={name}: {' '.join(str(e).split())}") from None
    if not (spec.get("backbone") and spec.get("head")):
        data_like = " (it reads as a data yaml: pass it as data=)" if {"train", "names", "nc"} & set(spec) else ""
        raise ConfigError(f"model={name} is not a model yaml: it has no backbone: and head:{data_like}. Pass a model "
                          "yaml such as model=yolo11n.yaml, or weights such as model=path/to/best.pt")
    return None


def _not_a_checkpoint(name: str, key: str, e: BaseException | str) -> ConfigError:
    """The error for a weights file that does not load; for ``resume=``, naming the run's checkpoint to go on from
    (checkpoints.py: writes are atomic, yet a file can be damaged by other means)."""
    reason = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
    reason = " ".join(reason.replace("ERROR ❌️", "").split("\n")[0].split()).rstrip(".")[:300]
    on = way_on(name) if key == "resume" else ("point at a run's weights/last.pt or best.pt, or train from a model "
                                               "yaml")
    return ConfigError(f"{key}={name}: not a PyTorch checkpoint Ultralytics can load (damaged or truncated?): "
                       f"{reason}; {on}")


def check_checkpoint(name: str, key: str = "model", checked: bool = False) -> None:
    """Read a weights file as ``YOLO()`` will (Ultralytics' ``torch_safe_load``), so a damaged or foreign one is one
    line; errors after the read stay Ultralytics' own. Costs a second read of the file (a second or so for the
    largest YOLO weights), and a third for its checksums (``check_intact``) unless ``checked``.

    Raises:
        ConfigError: it does not unpickle, or holds no model (a bare tensor, a list...).
    """
    from yolofeed.ultralytics_seam import torch_safe_load

    if not checked:
        check_intact(name, key)
    try:
        ckpt, _ = torch_safe_load(name)
    except (*UNPICKLING_ERRORS, AttributeError) as e:  # AttributeError: a tensor or list saved alone (no .model)
        raise _not_a_checkpoint(name, key, e) from None
    if not isinstance(ckpt, dict) or not (ckpt.get("ema") or ckpt.get("model")):
        raise _not_a_checkpoint(name, key, f"it holds a {type(ckpt).__name__}, not an Ultralytics model")


def _is_weights_file(name: str) -> bool:
    """An existing ``.pt`` file: what Ultralytics unpickles."""
    path = Path(name)
    return path.is_file() and path.suffix.lower() == ".pt"


def load_model(name: str, key: str = "model", checked: bool = False) -> Any:
    """``YOLO(name)``, with a missing, damaged or wrong file reported in one line (naming ``key=``); ``checked``: its
    checksums were (``check_intact``).

    Raises:
        ConfigError: neither a file nor a model Ultralytics knows by name; a yaml that is not a model's; a
            ``.pt`` that does not load.
    """
    from yolofeed.ultralytics_seam import YOLO

    check_model_file(name)
    if _is_weights_file(name):
        check_checkpoint(name, key, checked)
    try:
        return YOLO(name)
    except TypeError as e:  # not a file: a name Ultralytics resolves (and reads as above)
        if "checkpoint" not in str(e):
            raise
        raise _not_a_checkpoint(name, key, e) from None
    except FileNotFoundError:
        raise _no_such_model(name) from None
    except ConnectionError:  # Ultralytics' weights by name (yolo11n.pt) are downloaded on first use
        raise _offline(name) from None


def _offline(name: str) -> ConfigError:
    return ConfigError(f"model={name}: not on this machine, and its download failed (offline?). Download it once "
                       "with network access, pass the path of a local .pt, or train from scratch with a yaml such as "
                       "model=yolo11n.yaml")


TRAINER_KEYS = ("pack_format", "pack_rebuild", "pack_dir", "partner_pool", "warm_up", "validate_beside", "val_overlap",
                "val_period", "batched_val_metrics", "mask_room", "augment_ahead",
                "sync_free_step", "sync_free_loss", "fast_musgd", "graphed_step", "half_input")  # with_options'


def given_keys(cfg: TrainConfig) -> set[str]:
    """yolofeed train's own keys the user gave: typed on the command line (even at their default), or, for a config
    made in Python, set away from their default."""
    return set(cfg.given) | {f.name for f in fields_of(TrainConfig)
                             if not f.metadata.get("passthrough") and getattr(cfg, f.name) != f.default}


def monitor_options(cfg: TrainConfig, given: set[str], recorded: dict | None) -> dict | None:
    """The live monitor's options: the command line's for a new run; on resume the run's recorded ones, with the
    monitor keys given again in their place (``monitor=False`` turns it off).

    Raises:
        ConfigError: a monitor key's value is refused (``MonitorConfig``), or ``monitor=False`` is given with a key
            that turns the monitor on (``monitor.live.asking``: a port, an alert or summary key away from its
            default).
    """
    from yolofeed.monitor.live import TRAIN_KEYS, MonitorConfig, asking, options_from

    if not isinstance(cfg.monitor, bool):  # a config made in Python: the string "False" would be True
        raise ConfigError(f"monitor={cfg.monitor!r}: expected True or False")
    if "monitor" in given and not cfg.monitor:  # typed on the command line (from Python, False is not told apart)
        asked = asking(cfg)
        if asked:
            both = ", ".join(f"{k}={getattr(cfg, k)}" for k in asked)
            raise ConfigError(f"monitor=False and {both} ask for opposite things: drop monitor=False to run the "
                              f"monitor with {'them' if len(asked) > 1 else 'it'}, or drop {both} to train without it")
        return None
    if recorded is None:
        return options_from(cfg)
    before = recorded.get("monitor")
    again = [k for k in TRAIN_KEYS if k in given]
    if before is None or not (again or "monitor" in given):
        return options_from(cfg) if before is None else before
    merged = {**before, **{k: getattr(cfg, k) for k in again}}
    MonitorConfig(**merged)  # checks the values now, before the model is built
    return merged


def _no_such_model(name: str) -> ConfigError:
    return ConfigError(f"model={name}: no such file, and not a model Ultralytics knows by name. Pass the path of a "
                       "model .yaml or .pt, or a name such as model=yolo11n.yaml")


def check_model_and_data(model: str, data: str, split: str = "val") -> None:
    """``model=`` and ``data=`` checked as ``yolofeed train`` checks them, building nothing (``yolofeed doctor`` and
    ``yolofeed parity``, before their folders and runs): a model yaml must be one (Ultralytics' own names included),
    a ``.pt`` path must exist and load; the data yaml goes through Ultralytics' ``check_det_dataset``. A bare weights
    name (``yolo11n.pt``, ``yolo11n``) not on this machine is downloaded now, as Ultralytics would at a run's start
    (``seam.fetch_weights``): a failed download is one line before any run.

    Raises:
        ConfigError: the model is missing, not a model, does not load, is of a family yolofeed does not train
            (RT-DETR, YOLO-World, YOLOE), or of a task it does not train.
        DatasetError: the data yaml is missing or unusable (Ultralytics' reason).
    """
    from yolofeed.train.checks import check_data_yaml, check_task_data
    from yolofeed.ultralytics_seam import fetch_weights

    weights = check_model_file(model)
    keys.refuse_other_family(model)  # before a download of its weights
    if weights is not None and not Path(weights).exists():
        try:  # as yolofeed train's load_model: a download that fails is one line, before any mode or run starts
            fetch_weights(weights)
        except ConnectionError:
            raise _offline(model) from None
    task = keys.model_task(model, None)
    if task not in keys.TRAINED:  # their modes are yolofeed's trainers of a task and Ultralytics' of the same
        kinds = [keys.KIND.get(t, t) for t in keys.TRAINED]
        raise ConfigError(f"model={model} is {keys.a_kind(task)} model: yolofeed doctor, bench and parity "
                          f"take {', '.join(kinds[:-1])} and {kinds[-1]} models")
    if _is_weights_file(model):
        check_checkpoint(model)
    check_data_yaml(data, split)
    check_task_data(model, task, data)


def run(cfg: TrainConfig) -> Path:
    """Train; returns the path of the best weights."""
    from yolofeed.train.checks import check_data_yaml, check_task_data
    from yolofeed.train.tasks import TRAINERS
    from yolofeed.train.trainer import FastTrainer

    reserved = {"trainer", "model"} & set(cfg.extra)
    if reserved:
        raise ConfigError(f"{', '.join(sorted(reserved))}= cannot be passed here: yolofeed train sets the trainer")
    cfg = with_cfg_file(cfg)
    keys.check_overrides(cfg.extra, own=[f.name for f in fields_of(TrainConfig)])
    if cfg.pack_dir and Path(cfg.pack_dir).exists() and not Path(cfg.pack_dir).is_dir():
        raise ConfigError(f"pack_dir={cfg.pack_dir} is a file; pack_dir= names the folder packs go to (made if "
                          "missing)")
    checkpoint = resume_checkpoint(cfg)
    if checkpoint:  # first: a truncated one sends Ultralytics' reads of it (the task's below) to GitHub
        check_intact(checkpoint)
    # the task, refused values and the data yaml known from the command line, before Ultralytics builds a model
    # (and prints it); the trainer's check_resume checks the final arguments again, and the packs
    keys.check({**cfg.extra, "model": checkpoint or cfg.model, "data": cfg.data})
    asked, own = cfg.extra.get("task"), keys.model_task(checkpoint or cfg.model, None)
    if asked and own != "detect" and asked != own:  # given here, task=detect is asked for too (a trainer's default)
        raise ConfigError(f"task={asked}: model={checkpoint or cfg.model} is {keys.a_kind(own)} model, which yolofeed "
                          f"train trains as such: drop task= (or pass task={own})")
    if cfg.data and not checkpoint:
        check_data_yaml(cfg.data, cfg.extra.get("split") or "val")
        task = keys.model_task(cfg.model, cfg.extra.get("task"))
        if task in ("segment", "obb"):  # box rows for such a model: one line before the model is built (and printed)
            check_task_data(cfg.model, task, cfg.data)
    if checkpoint:
        model = load_model(checkpoint, "resume", checked=True)
        refuse_nothing_to_resume(checkpoint, model.ckpt)
        # the data given, else the run's own: older Ultralytics (8.4.138) hands a resume its task's default data
        # (coco8.yaml for detection) where none is given, and the resume trains on that
        data = cfg.data or (model.ckpt.get("train_args") or {}).get("data")
        kwargs = {**cfg.extra, "resume": checkpoint, **({"data": data} if data else {})}
    else:
        if not cfg.model:
            raise ConfigError("yolofeed train needs model=... (a model yaml such as yolo11n.yaml, or weights), or "
                              "resume=.../last.pt")
        if not cfg.data:
            raise ConfigError("yolofeed train needs data=path/to/data.yaml (or resume=.../last.pt)")
        model, kwargs = load_model(cfg.model), {"data": cfg.data, **cfg.extra}
    from yolofeed.monitor.live import attach
    from yolofeed.monitor.throughput import RunThroughput

    given = given_keys(cfg)
    recorded = None
    if checkpoint:  # the run's own options (the trainer restores them too; the monitor is attached here)
        recorded = options.read(options.file_for(checkpoint, model.ckpt.get("train_args", {}).get("save_dir")))
    monitor = monitor_options(cfg, given, recorded)
    # only the options given: on resume the trainer restores the others from the run (train/options.py)
    task = keys.model_task(checkpoint or cfg.model, cfg.extra.get("task"))
    trainer = TRAINERS[task].with_options(**{k: getattr(cfg, k) for k in TRAINER_KEYS if k in given},
                                           monitor=monitor)
    if monitor is not None:
        attach(model, **monitor)
    speed = RunThroughput()  # under DDP its callbacks run in the ranks, which report back (monitor/throughput.py)
    for event, fn in speed.callbacks().items():
        model.add_callback(event, fn)
    try:
        with processes.sigterm_exits():  # SIGTERM (timeout, docker stop) stops the run as Ctrl-C does: closed, said
            model.train(trainer=trainer, **kwargs)
    except (KeyboardInterrupt, processes.Terminated) as e:  # the CLI says "interrupted" (or "stopped by SIGTERM")
        tr = model.trainer  # and this, in one line
        saved = tr.resumable_checkpoint() if isinstance(tr, FastTrainer) else None
        instead = tr.nothing_to_resume() if isinstance(tr, FastTrainer) else "no epoch was saved yet"
        said = (f"the last epoch saved is in {saved}; continue with: "
                f"{shlex.join(['yolofeed', 'train', f'resume={saved}'])}" if saved else
                instead[0].lower() + instead[1:])
        if isinstance(e, processes.Terminated):
            raise processes.Terminated(f"stopped by SIGTERM; {said}") from None
        raise KeyboardInterrupt(said) from None
    tr = model.trainer
    best = tr.best if tr.best.exists() else tr.last
    gpus = f"{tr.world_size} GPUs" if tr.world_size > 1 else str(tr.device)
    if speed.learn_from_ranks(tr.save_dir):
        print(f"yolofeed train: {speed.images:,} images in {speed.seconds:.1f} s of training steps "
              f"({speed.rate:,.0f} img/s on {gpus}); weights: {best}", flush=True)
    else:
        print(f"yolofeed train: the DDP ranks reported no speed; weights: {best}", flush=True)
    return best
