"""What ``yolofeed train`` checks before Ultralytics makes the run folder or builds a model, and the one line each
mistake gets: the data yaml (read by Ultralytics' own ``check_det_dataset``), model= and resume= files, cfg=, the
packs the run needs, and a pack damaged under a running loader.

Each used to end in a traceback (two, for the data yaml) and, for most, a run folder left behind; cfg= holding
model= and data= was refused though ``yolo train cfg=...`` trains. RELIABILITY.md lists these tests.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from yolofeed.cli import build_config, main
from yolofeed.errors import ConfigError, PackError, YolofeedError
from yolofeed.loader.prefetch import Prefetcher
from yolofeed.pack import open_or_build
from yolofeed.pack.paths import store_dir
from yolofeed.train import FastDetectionTrainer
from yolofeed.train.run import resume_checkpoint, with_cfg_file

TINY = ["imgsz=64", "epochs=1", "batch=8", "device=cpu", "workers=0", "plots=False"]


def _one_line(capsys, argv: list[str]) -> str:
    """Run the CLI in this process; the one stderr line of a user error (any other exception fails the test)."""
    assert main(argv) == 1
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


def _train(tmp_path: Path, *args: str) -> list[str]:
    return ["train", "model=yolo11n.yaml", *TINY, f"project={tmp_path / 'runs'}", "name=r", *args]


DATA_MISTAKES = {  # data yaml text -> Ultralytics' reason, kept in the line
    "no_val": ("train: images/train\nnames: {0: a}\n", "'val:' key missing"),
    "empty": ("", "'train:' key missing"),
    "broken": ("train: [\n", "YAML syntax error"),
    "no_names": ("train: images/train\nval: images/val\n", "either 'names' or 'nc' are required"),
    "names_nc": ("train: images/train\nval: images/val\nnc: 3\nnames: [a, b]\n",
                 "'names' length 2 and 'nc: 3' must match"),
    "val_folder": ("train: images/train\nval: images/nope\nnames: {0: a}\n", "images not found, missing path"),
}


@pytest.mark.parametrize("case", DATA_MISTAKES)
def test_data_yaml_mistakes_are_one_line_with_ultralytics_reason_and_no_run_folder(case, synth_root, tmp_path, capsys):
    text, reason = DATA_MISTAKES[case]
    yaml_file = tmp_path / f"{case}.yaml"
    yaml_file.write_text(f"path: {synth_root}\n" + text)
    line = _one_line(capsys, _train(tmp_path, f"data={yaml_file}"))
    assert f"data={yaml_file}: " in line and reason in line and "❌" not in line, line
    assert not (tmp_path / "runs").exists()


def test_a_data_yaml_with_no_class_is_one_line_before_the_run_folder(synth_root, tmp_path, capsys):
    """``nc: 0``: Ultralytics' own check (``check_class_names``) refuses it, in the words yolofeed pack now uses too."""
    yaml_file = tmp_path / "none.yaml"
    yaml_file.write_text(f"path: {synth_root}\ntrain: images/train\nval: images/val\nnc: 0\n")
    line = _one_line(capsys, _train(tmp_path, f"data={yaml_file}"))
    assert f"data={yaml_file}: '0-class dataset, at least one class name is required" in line, line
    assert not (tmp_path / "runs").exists()


def test_a_missing_split_and_unusable_packs_are_refused_before_the_run_folder(dataset, tmp_path, capsys):
    data = f"data={dataset / 'data.yaml'}"
    assert ("no 'test:' entry (splits present: train, val): name one of them (yolofeed pack's splits=, a validation's "
            "split=), or add a 'test:' entry"
            in _one_line(capsys, _train(tmp_path, data, "split=test")))
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    line = _one_line(capsys, _train(tmp_path, data, f"pack_dir={a_file / 'packs'}"))
    assert f"cannot write packs to {a_file / 'packs' / 'data-raw-64'} ({a_file} is a file" in line
    assert "pack_dir=" in line
    assert not (tmp_path / "runs").exists()

    # the same checks run inside Ultralytics' __init__ (check_resume) for Python API users: no model is built yet
    never = FastDetectionTrainer.with_options(pack_rebuild="never")
    overrides = dict(model="yolo11n.yaml", data=str(dataset / "data.yaml"), imgsz=64, device="cpu",
                     project=str(tmp_path / "runs"), name="r")
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    with pytest.raises(PackError, match=rf"pack {folder / 'train.yfpack'} does not exist; rebuild it with: yolofeed "
                                        rf"pack data={dataset / 'data.yaml'} imgsz=64 format=raw rebuild=always"):
        never(overrides=overrides)
    open_or_build(dataset / "data.yaml", "train", 64, rebuild="auto", workers=1, progress=False)
    open_or_build(dataset / "data.yaml", "val", 64, rebuild="auto", workers=1, progress=False)
    label = dataset / "labels" / "val" / "val_000002.txt"
    label.write_text(label.read_text() + "0 0.5 0.5 0.1 0.1\n")  # the val pack is stale now
    with pytest.raises(PackError, match=f"{folder / 'val.yfpack'} is stale"):
        never(overrides=overrides)
    with pytest.raises(PackError, match="cannot write packs to"):
        FastDetectionTrainer.with_options(pack_dir=str(a_file / "packs"))(overrides=overrides)
    assert not (tmp_path / "runs").exists()


def test_pack_rebuild_never_is_checked_before_the_run_folder_at_any_imgsz(dataset, tmp_path):
    """At an imgsz a P6 model (stride 64) would train at another side than a P5 one, a missing pack is still refused
    before the run folder: neither side's pack is there. Either side's pack is enough."""
    never = FastDetectionTrainer.with_options(pack_rebuild="never")
    overrides = dict(model="yolo11n.yaml", data=str(dataset / "data.yaml"), imgsz=160, device="cpu",
                     project=str(tmp_path / "runs"), name="r")
    folder = store_dir(dataset / "data.yaml", 160, "raw")
    with pytest.raises(PackError, match=rf"pack {folder / 'train.yfpack'} does not exist"):
        never(overrides=overrides)
    assert not (tmp_path / "runs").exists()
    for split in ("train", "val"):  # a P6 model's side
        open_or_build(dataset / "data.yaml", split, 192, rebuild="auto", workers=1, progress=False)
    never(overrides=overrides)  # not refused: the model decides which side it trains at


def test_a_run_folder_that_cannot_be_made_is_one_line_before_anything(dataset, tmp_path, capsys, monkeypatch):
    data = f"data={dataset / 'data.yaml'}"
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    line = _one_line(capsys, _train(tmp_path, data, f"project={a_file}"))
    assert f"the run folder {a_file / 'r'} cannot be made: {a_file} is not a folder" in line and "project=" in line
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path / "ro" else real(p, mode))
    (tmp_path / "ro").mkdir()
    line = _one_line(capsys, _train(tmp_path, data, f"project={tmp_path / 'ro' / 'runs'}"))
    assert f"{tmp_path / 'ro'} cannot be written by this user" in line
    assert not (tmp_path / "ro" / "runs").exists() and not (tmp_path / "runs").exists()


def _checkpoint(path: Path) -> Path:
    """A real Ultralytics checkpoint of a freshly built yolo11n (no training needed)."""
    from ultralytics import YOLO

    YOLO("yolo11n.yaml").save(path)
    return path


def test_model_and_resume_files_that_are_not_models(synth_root, tmp_path, capsys):
    data = f"data={synth_root / 'data.yaml'}"
    line = _one_line(capsys, ["train", f"model={synth_root / 'data.yaml'}", data, f"project={tmp_path}"])
    assert "is not a model yaml" in line and "pass it as data=" in line  # was KeyError: 'backbone'
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(random.Random(0).randbytes(2000))  # Ultralytics says TypeError naming the checkpoint
    truncated = tmp_path / "last.pt"
    truncated.write_bytes(_checkpoint(tmp_path / "whole.pt").read_bytes()[:100_000])
    # random bytes that unpickle into other errors, which escape Ultralytics' own check
    escaping = {seed: tmp_path / f"garbage{seed}.pt" for seed in (43, 45, 195)}  # Overflow, Value, UnicodeDecode
    for seed, path in escaping.items():
        path.write_bytes(random.Random(seed).randbytes(2000))
    # PyTorch files that hold no model: a tensor or a list saved alone, a dict without one
    foreign = {name: tmp_path / f"{name}.pt" for name in ("tensor", "list", "dict")}
    for name, obj in zip(foreign, (torch.zeros(3), [1, 2], {"epoch": 3})):
        torch.save(obj, foreign[name])
    for argv in ([f"model={garbage}"], [f"resume={garbage}"], [f"resume={truncated}"],
                 [f"model={truncated}", "resume"], *([f"model={p}"] for p in [*escaping.values(), *foreign.values()])):
        line = _one_line(capsys, ["train", *argv, data, *TINY, f"project={tmp_path / 'runs'}"])
        key = "resume" if any(a.startswith("resume") for a in argv) else "model"
        if any(str(truncated) in a for a in argv):  # named before Ultralytics reads it (its refusal asks GitHub)
            assert f"{key}={truncated}: damaged: truncated" in line, line
        else:
            assert f"{key}=" in line and "not a PyTorch checkpoint" in line and "damaged or truncated" in line, line
    assert not (tmp_path / "runs").exists()


def test_other_tasks_are_refused_before_the_model_is_built(synth_root, tmp_path, capsys):
    data = f"data={synth_root / 'data.yaml'}"
    assert main(["train", "model=yolo11n-cls.yaml", data, f"project={tmp_path}"]) == 1
    captured = capsys.readouterr()
    assert "task=classify" in captured.err and "parameters" not in captured.out + captured.err  # no model summary
    line = _one_line(capsys, ["train", "model=yolo11n.yaml", "task=segment", data, f"project={tmp_path}"])
    assert "model=yolo11n.yaml is a detection model, and this run is task=segment: pick a segment model such as " \
           "model=yolo11n-seg.yaml" in line and "drop task=" in line


def test_every_ultralytics_model_yaml_of_another_family_is_told_by_its_head():
    """RT-DETR, YOLO-World and YOLOE (their own losses, text embeddings or decoder): told by the head each yaml builds,
    for every model yaml Ultralytics ships; none of YOLO's is."""
    import ultralytics

    from yolofeed.train.keys import model_family
    from yolofeed.ultralytics_seam import yaml_model_load

    yamls = sorted((Path(ultralytics.__file__).parent / "cfg" / "models").rglob("*.yaml"))
    assert len(yamls) > 50
    for path in yamls:
        stem = path.stem.lower()
        expected = ("RT-DETR" if "rtdetr" in stem else "YOLO-World" if "world" in stem else
                    "YOLOE" if "yoloe" in stem else None)
        family = model_family(str(path))
        assert (family and family.words) == expected, (path, family)
        if expected is None:  # the same answer from the dict and from a name's yaml
            assert model_family(yaml_model_load(str(path))) is None


@pytest.mark.parametrize("command", ["train", "doctor", "bench", "parity"])
def test_models_of_another_family_are_one_line_before_anything_is_made(command, synth_root, tmp_path, capsys):
    """yolofeed train ended in two tracebacks (Ultralytics' "'YOLO' model does not support '_new' mode for 'None'
    task" for an RT-DETR yaml; after the pack and the run folder, a missing ``guide`` for YOLO-World); the doctor's
    stock mode built a DetectionTrainer for it. Now one line naming the family and stock's way, nothing made: for a
    yaml, for weights whose head is of the family whatever their name, and for a name to download (offline here)."""
    from ultralytics import YOLO

    world = tmp_path / "mine.pt"
    torch.save({"model": YOLO("yolov8n-worldv2.yaml").model.half(), "train_args": {}}, world)
    out = tmp_path / "out"
    for model, family, trains in (("rtdetr-l.yaml", "an RT-DETR", "RTDETR"), ("yoloe-11s-seg.yaml", "a YOLOE", "YOLOE"),
                                  (str(world), "a YOLO-World", "YOLOWorld"), ("rtdetr-x.pt", "an RT-DETR", "RTDETR")):
        where = [f"project={out}"] if command == "train" else [f"out={out}"]
        line = _one_line(capsys, [command, f"model={model}", f"data={synth_root / 'data.yaml'}", *TINY[:4], *where])
        assert f"model={model} is {family} model, which yolofeed does not train" in line, line
        assert f"{trains}(...).train() without trainer=" in line, line
        assert not out.exists()
    assert not Path("rtdetr-x.pt").exists()  # nothing downloaded (nor tried: offline, a download is a line of its own)
    mistyped = tmp_path / "runs" / "my_yoloe_baseline.pt"  # not there, and no name Ultralytics downloads
    line = _one_line(capsys, [command, f"model={mistyped}", f"data={synth_root / 'data.yaml'}", *TINY[:4],
                              *([f"project={out}"] if command == "train" else [f"out={out}"])])
    assert "no such file" in line and "YOLOE" not in line, line
    line = _one_line(capsys, ["train", f"resume={world}", f"project={out}"])
    assert "is a YOLO-World model" in line and not out.exists()


def test_a_built_model_of_another_family_is_told_as_its_yolo_object_is():
    from ultralytics import YOLO

    from yolofeed.train.keys import model_family

    world, plain = YOLO("yolov8n-worldv2.yaml"), YOLO("yolo11n.yaml")
    assert model_family(world).words == model_family(world.model).words == "YOLO-World"
    assert model_family(plain) is None and model_family(plain.model) is None


def test_the_python_api_refuses_another_family_before_the_run_folder(synth_root, tmp_path):
    """``RTDETR(...).train(trainer=FastDetectionTrainer)`` built the pack and the run folder, then failed in a traceback
    (``'RTDETRDecoder' object has no attribute 'stride'``): yolofeed's loss is YOLO's."""
    from ultralytics import RTDETR

    with pytest.raises(ConfigError, match="is an RT-DETR model, which yolofeed does not train"):
        RTDETR("rtdetr-l.yaml").train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"), imgsz=64,
                                      epochs=1, batch=8, device="cpu", workers=0, project=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["train", "pack", "doctor"])
def test_a_data_file_that_is_no_yaml_says_what_it_is_and_the_way_on(command, synth_root, tmp_path, capsys):
    """``data=list.txt`` gave Ultralytics' "Not a YAML file: list.txt"; ``data=x.ndjson`` the same, where yolo train
    converts one; ``yolofeed pack data=s1.zip`` "not a .yaml file", where yolofeed train unzips it. Each is one line
    naming what the file is and what to pass."""
    listed = tmp_path / "list.txt"
    listed.write_text(f"{next((synth_root / 'images' / 'train').iterdir())}\n")
    exported = tmp_path / "set.ndjson"
    exported.write_text("{}\n")
    zipped = tmp_path / "set.zip"
    zipped.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip
    out = tmp_path / "out"
    where = {"train": [f"project={out}", "model=yolo11n.yaml"], "pack": [f"out={out}"], "doctor": [f"out={out}"]}
    cases = [(listed, "a .txt list of images belongs in a data yaml (train: list.txt, or val:)"),
             (exported, "an NDJSON dataset (an Ultralytics Platform export), which yolofeed does not convert")]
    if command == "pack":
        cases.append((zipped, "a zipped dataset, which yolofeed pack does not unzip: unzip it and pass its data.yaml"))
    for data, words in cases:
        line = _one_line(capsys, [command, f"data={data}", *where[command]])
        assert f"data={data}: {words}" in line, line
        assert not out.exists()
    with pytest.raises(YolofeedError, match="a .txt list of images belongs in a data yaml"):
        FastDetectionTrainer(overrides={"model": "yolo11n.yaml", "data": str(listed), "project": str(out)})
    assert not out.exists()


def test_a_split_to_train_without_label_files_is_one_line_before_its_pack(synth_root, tmp_path, capsys):
    """Labels the loader cannot find (moved, or under 'Labels/' where Ultralytics looks in 'labels/'): yolofeed decoded
    every image into the train pack and made the run folder, then refused ("No labels found"), where stock refuses
    after a label scan; a COCO-sized set cost a full build and left the pack. Now refused first, naming the fix,
    with nothing made; from Python too."""
    import shutil

    root = tmp_path / "set"
    shutil.copytree(synth_root, root, ignore=shutil.ignore_patterns("yolofeed-packs"))
    (root / "data.yaml").write_text((root / "data.yaml").read_text().replace(str(synth_root), str(root)))
    (root / "labels" / "train").rename(root / "labels" / "moved")
    runs = tmp_path / "runs"
    line = _one_line(capsys, ["train", "model=yolo11n.yaml", f"data={root / 'data.yaml'}", *TINY, f"project={runs}"])
    assert line.endswith(f"No labels found in {root / 'labels' / 'train'}: none of the "
                         f"{len(list((root / 'images' / 'train').iterdir()))} images of split 'train' has a label "
                         "file; Ultralytics refuses to train on such a split, and so does yolofeed. Put YOLO .txt "
                         "labels there, one per image, named as the image"), line
    with pytest.raises(YolofeedError, match="No labels found in"):
        FastDetectionTrainer(overrides={"model": "yolo11n.yaml", "data": str(root / "data.yaml"), "project": str(runs),
                                        "imgsz": 64, "epochs": 1, "device": "cpu"})
    (root / "labels" / "moved").rename(root / "labels" / "train")
    for folder in ("images", "labels"):  # a capitalised layout: the labels are there, where Ultralytics never looks
        (root / folder).rename(root / folder.capitalize())
    (root / "data.yaml").write_text((root / "data.yaml").read_text().replace("images", "Images"))
    line = _one_line(capsys, ["train", "model=yolo11n.yaml", f"data={root / 'data.yaml'}", *TINY, f"project={runs}"])
    assert "these images lie under no folder named 'images' (the name's case counts" in line, line
    assert not runs.exists() and not list(root.rglob("*.yfpack"))


def test_cfg_file_is_read_as_yolo_train_reads_it(synth_root, tmp_path, capsys, monkeypatch):
    """Its keys fill what the command line leaves out, model= and data= included; a missing file is one line."""
    assert "cfg=/nope/cfg.yaml: file not found" in _one_line(capsys, ["train", "cfg=/nope/cfg.yaml"])
    cfg_file = tmp_path / "cfg_all.yaml"
    cfg_file.write_text(f"model: yolo11n.yaml\ndata: {synth_root / 'data.yaml'}\nimgsz: 64\nepochs: 3\nlr0: 0.02\n"
                        f"project: {tmp_path / 'runs'}\n")
    cfg = with_cfg_file(build_config("train", [f"cfg={cfg_file}", "epochs=1", "device=cpu"]))
    assert (cfg.model, cfg.data) == ("yolo11n.yaml", str(synth_root / "data.yaml"))
    assert cfg.extra == {"imgsz": 64, "epochs": 1, "lr0": 0.02, "project": str(tmp_path / "runs"), "device": "cpu"}

    seen = {}

    class Handed(Exception):
        pass

    def train(self, trainer=None, **kwargs):
        seen.update(kwargs, model=self.model_name)
        raise Handed

    monkeypatch.setattr("ultralytics.engine.model.Model.train", train)
    with pytest.raises(Handed):  # no longer "yolofeed train needs model=..."
        main(["train", f"cfg={cfg_file}", "epochs=1", "device=cpu"])
    assert seen["model"] == "yolo11n.yaml" and seen["data"] == str(synth_root / "data.yaml")
    assert (seen["epochs"], seen["imgsz"], seen["lr0"]) == (1, 64, 0.02) and "cfg" not in seen
    cfg_file.write_text(cfg_file.read_text() + "pack_format: jpeg\n")
    line = _one_line(capsys, ["train", f"cfg={cfg_file}"])
    assert "holds pack_format: yolofeed's own keys go on the command line" in line


def test_a_bare_resume_takes_the_newest_last_pt_here_as_yolo_train_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=f"no last.pt under {tmp_path}"):
        resume_checkpoint(build_config("train", ["resume"]))
    (tmp_path / "runs" / "x" / "weights").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "weights" / "last.pt").write_bytes(b"")
    assert Path(resume_checkpoint(build_config("train", ["resume"]))).resolve() == (
        tmp_path / "runs" / "x" / "weights" / "last.pt")
    (tmp_path / "runs" / "y" / "weights").mkdir(parents=True)  # a broken link among them: one line, not a traceback
    (tmp_path / "runs" / "y" / "weights" / "last.pt").symlink_to(tmp_path / "gone.pt")
    with pytest.raises(ConfigError, match=r"could not read the last\*.pt files under .*broken link") as e:
        resume_checkpoint(build_config("train", ["resume"]))
    assert "\n" not in str(e.value) and "resume=path/to/last.pt" in str(e.value)


@pytest.mark.parametrize("command", ["doctor", "bench", "parity"])
def test_doctor_bench_and_parity_check_the_device_before_profiling(command, synth_root, tmp_path, capsys,
                                                                     monkeypatch):
    """One line before anything runs: parity trained every stock run with device=mps and then failed every yolofeed
    one, and doctor profiled stock first (found by the adversarial tester)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = _one_line(capsys, [command, f"data={synth_root / 'data.yaml'}", "device=0,1", f"out={tmp_path / 'out'}"])
    assert "device=0,1: torch sees no CUDA GPU" in line and "device=cpu" in line  # not device=(0, 1)
    line = _one_line(capsys, [command, f"data={synth_root / 'data.yaml'}", "device=mps", f"out={tmp_path / 'out'}"])
    assert "device=mps: yolofeed's loader and augmentation run on CUDA GPUs and the CPU only" in line
    assert not (tmp_path / "out").exists()


def test_a_damaged_jpeg_pack_names_its_own_rebuild_command(dataset):
    """Bytes of a stored JPEG that no longer decode: a PackError (one line in the CLI, not a LoaderError under two
    tracebacks) with the command that rebuilds this jpeg 64-px pack, not the default raw 640 one."""
    pack = open_or_build(dataset / "data.yaml", "train", 64, format="jpeg", rebuild="auto", workers=1, progress=False)
    r = pack.index[2]
    with open(pack.path, "r+b") as f:
        f.seek(int(r["offset"]))
        f.write(bytes(int(r["nbytes"])))  # the whole payload zeroed: no JPEG marker left
    damaged = type(pack).open(pack.path)
    command = f"rebuild it with: yolofeed pack data={dataset / 'data.yaml'} imgsz=64 format=jpeg rebuild=always"
    for sync in (False, True):
        with pytest.raises(PackError) as e:
            list(Prefetcher(damaged, "cpu", 4, sync=sync, decode="cv2").iterate([np.arange(4), np.arange(4, 8)]))
        assert isinstance(e.value, YolofeedError) and command in str(e.value) and "data=..." not in str(e.value)
        assert "batch 1 of 2" in str(e.value) and Path(pack.im_files[2]).name in str(e.value)


def test_a_cfg_file_naming_an_existing_run_folder_is_refused_before_it_is_written_over(synth_root, tmp_path):
    """A run's args.yaml as cfg= holds that run's save_dir, which wins over name= and project= (as in yolo train), so
    the new run wrote over the old one's results and weights: refused in one line, unless the command line resumes
    or names save_dir; a save_dir that does not exist yet, or is empty, is taken as it is."""
    run = tmp_path / "runs" / "base"
    (run / "weights").mkdir(parents=True)
    (run / "weights" / "last.pt").write_bytes(b"a run's")
    cfg_file = tmp_path / "args.yaml"
    cfg_file.write_text(f"model: yolo11n.yaml\ndata: {synth_root / 'data.yaml'}\nimgsz: 64\nsave_dir: {run}\n")
    with pytest.raises(ConfigError, match="an existing run folder this run would write over") as e:
        with_cfg_file(build_config("train", [f"cfg={cfg_file}", "name=fromcfg"]))
    assert "\n" not in str(e.value) and str(run) in str(e.value) and "remove save_dir from the file" in str(e.value)
    new = tmp_path / "runs" / "new"
    assert with_cfg_file(build_config("train", [f"cfg={cfg_file}", f"save_dir={new}"])).extra["save_dir"] == str(new)
    assert with_cfg_file(build_config("train", [f"cfg={cfg_file}", f"resume={run / 'weights' / 'last.pt'}"]))
    cfg_file.write_text(cfg_file.read_text().replace(str(run), str(new)))  # not there yet: as yolo train
    assert with_cfg_file(build_config("train", [f"cfg={cfg_file}"])).extra["save_dir"] == str(new)
    assert (run / "weights" / "last.pt").read_bytes() == b"a run's"


def test_cfg_values_reach_the_trainer_checks(synth_root, tmp_path, capsys):
    """A refused value in the cfg file is refused as if typed."""
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(json.dumps({"model": "yolo11n.yaml", "data": str(synth_root / "data.yaml"), "rect": True}))
    assert "rect=True" in _one_line(capsys, ["train", f"cfg={cfg_file}", f"project={tmp_path / 'runs'}"])
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["doctor", "parity", "bench"])
def test_doctor_parity_and_bench_check_the_model_and_the_data_yaml_first(command, synth_root, tmp_path, capsys):
    """A model that does not exist: the doctor ended in a FileNotFoundError traceback after it had started; parity
    ran every run, each failing, and said "0 seeds each finished ... +nan points" with exit 0; the bench started its
    first mode, which stopped with a traceback. A data yaml whose val folder is missing: found by the runs. Now each
    is one line before anything is made, as in yolofeed train."""
    data = synth_root / "data.yaml"
    broken = tmp_path / "broken.yaml"
    broken.write_text(f"path: {synth_root}\ntrain: images/train\nval: images/nope\nnames: {{0: a}}\n")
    out = tmp_path / "out"
    common = [f"out={out}", "imgsz=64", "batch=8", "device=cpu"]
    for argv, words in (([f"data={data}", "model=nope.yaml"], "model=nope.yaml: no such file, and not a model"),
                        ([f"data={data}", f"model={tmp_path / 'runs' / 'best.pt'}"], "best.pt: no such file"),
                        ([f"data={data}", f"model={data}"], "is not a model yaml"),
                        ([f"data={broken}", "model=yolo11n.yaml"], f"data={broken}: ")):
        line = _one_line(capsys, [command, *argv, *common])
        assert words in line, line
        assert not out.exists()


def test_a_weights_path_that_is_not_there_is_refused_before_ultralytics_looks_for_it(tmp_path, monkeypatch):
    """Ultralytics asked GitHub which assets it could download for such a path (two requests, YOLO_OFFLINE set too)
    before its error; a path is not a name to download: one line, and Ultralytics is not called."""
    from yolofeed import ultralytics_seam as seam
    from yolofeed.train import run

    def called(*a, **k):
        raise AssertionError("Ultralytics was asked to load a path that is not there")

    monkeypatch.setattr(seam, "YOLO", called)
    with pytest.raises(ConfigError, match=r"^model=.*/weights/nope\.pt: no such file, and not a model Ultralytics"):
        run.load_model(str(tmp_path / "weights" / "nope.pt"))
    # what Ultralytics downloads or fetches where no file is: its assets by name (to that path; a bare name is its .pt),
    # URLs and platform names whatever their ending; left to it (a failed download is one line where it is built)
    for name in (str(tmp_path / "weights" / "yolo11n.pt"), "yolo11n.pt", "https://example.com/w/best.pt",
                 str(tmp_path / "yolov5s.pt"), "yolo11n", "https://host/best.pt?token=abc", "ul://user/project/model",
                 Path("yolo11n.yaml")):
        run.check_model_file(name)
    # what it stands for: the .pt to load or fetch (doctor, bench and parity fetch it up front); None for the rest
    assert run.check_model_file("yolo11n") == "yolo11n.pt" and run.check_model_file("yolo11n.pt") == "yolo11n.pt"
    assert run.check_model_file("yolo11n.yaml") is None and run.check_model_file("ul://user/project/model") is None
    # neither a yaml nor weights: an exported model, a text file, a name of nothing (a traceback once started)
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    for name, what in ((str(tmp_path / "model.onnx"), "a file of another kind"), ("no_such_model", "no such file")):
        with pytest.raises(ConfigError, match=rf"^model={re.escape(name)}: {what}\. yolofeed trains from a model yaml"):
            run.check_model_file(name)


@pytest.mark.parametrize("model, task, own", [("yolo11n-obb.yaml", "detect", "oriented-box"),
                                              ("yolo11n-pose.yaml", "obb", "pose"),
                                              ("yolo11n-seg.yaml", "pose", "segmentation")])
def test_a_task_other_than_the_models_is_one_line_naming_task(synth_root, capsys, model, task, own):
    """task=detect with an OBB model trained OBB without a word (yolo train trains detection on it); task=obb with a
    pose model said to train it with FastPoseTrainer "or yolofeed train", the command being run. Now both name task=."""
    line = _one_line(capsys, ["train", f"model={model}", f"data={synth_root / 'data.yaml'}", f"task={task}", *TINY])
    assert line.startswith(f"yolofeed train: error: task={task}: model={model} is an {own} model"
                           if own[0] in "aeiou" else f"yolofeed train: error: task={task}: model={model} is a {own} "
                           "model"), line
    assert "drop task=" in line
