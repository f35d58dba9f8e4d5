"""yolofeed's own options of a run are kept with it and come back when it resumes, through the CLI and the Python API.

They used to be forgotten: a run started with ``pack_dir=/fast/ssd`` resumed building raw packs beside the dataset.
On resume an option given again wins over the recorded one (train/options.py). RELIABILITY.md lists these tests.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from yolofeed.cli import build_config
from yolofeed.errors import ConfigError, DatasetError
from yolofeed.train import FastDetectionTrainer, options

TINY = dict(epochs=2, imgsz=64, batch=8, device="cpu", workers=0, plots=False, verbose=False, exist_ok=True)
MONITOR = {"prometheus_port": 0, "tensorboard": False, "summary_seconds": 5.0}


class Stopped(KeyboardInterrupt):
    pass


def _stop_after_first_save(trainer) -> None:
    if trainer.epoch == 0:
        raise Stopped


def _stopped_run(data: Path, project: Path, name: str, **given) -> Path:
    """A run stopped after its first epoch was saved (as a Ctrl-C there leaves it); returns its last.pt."""
    from ultralytics import YOLO

    model = YOLO("yolo11n.yaml")
    model.add_callback("on_model_save", _stop_after_first_save)
    with pytest.raises(Stopped):
        model.train(trainer=FastDetectionTrainer.with_options(**given), data=str(data), project=str(project),
                    name=name, **TINY)
    return project / name / "weights" / "last.pt"


@pytest.fixture(scope="module")
def stopped(synth_root, tmp_path_factory) -> tuple[Path, Path]:
    """A stopped run with options away from their defaults, and its pack_dir; its yolofeed.yaml put back after each
    test (a resuming trainer records the options it runs with)."""
    root = tmp_path_factory.mktemp("options")
    packs = root / "fast ssd"  # a space: it must come back as it was
    last = _stopped_run(synth_root / "data.yaml", root / "runs", "stopped", pack_dir=str(packs), val_period=2,
                        partner_pool=0, warm_up=False, monitor=MONITOR)
    return last, packs


@pytest.fixture()
def run(stopped):
    last, packs = stopped
    record = last.parents[1] / options.FILE
    text = record.read_text()
    yield last, packs
    record.write_text(text)


def test_the_run_folder_records_every_option(run):
    last, packs = run
    recorded = yaml.safe_load((last.parents[1] / "yolofeed.yaml").read_text())
    assert set(recorded) == set(options.OPTIONS)
    assert (recorded["pack_dir"], recorded["val_period"], recorded["partner_pool"]) == (str(packs), 2, 0)
    assert recorded["warm_up"] is False and recorded["monitor"] == MONITOR and recorded["pack_rebuild"] == "auto"


def test_the_python_api_resume_restores_them_and_a_given_one_wins(run, caplog):
    """``YOLO(last.pt).train(resume=True, trainer=FastDetectionTrainer)`` builds the trainer so: the options were
    the class defaults there (pack_dir None: packs beside the dataset)."""
    from yolofeed.monitor.live import attached

    last, packs = run
    with caplog.at_level(logging.INFO, logger="ultralytics"):
        t = FastDetectionTrainer(overrides={"resume": str(last)})
    assert (t.pack_dir, t.val_period, t.partner_pool, t.warm_up, t.monitor) == (str(packs), 2, 0, False, MONITOR)
    assert attached(t.callbacks)  # the monitor is back too
    assert f"resuming with this run's options from {last.parents[1] / 'yolofeed.yaml'}: pack_dir=" in caplog.text
    other = str(packs.parent / "other")
    t = FastDetectionTrainer.with_options(pack_dir=other, monitor=None)(overrides={"resume": str(last)})
    assert (t.pack_dir, t.monitor, t.val_period, t.partner_pool) == (other, None, 2, 0) and not attached(t.callbacks)
    assert f"given again, and so used instead: pack_dir={other!r} (recorded {str(packs)!r})" in caplog.text
    assert yaml.safe_load((last.parents[1] / "yolofeed.yaml").read_text())["pack_dir"] == other  # for the next resume
    caplog.clear()  # the same options given again (a notebook's same trainer class): said as such, not "defaults"
    same = dict(pack_dir=other, val_period=2, partner_pool=0, warm_up=False, monitor=None)
    with caplog.at_level(logging.INFO, logger="ultralytics"):
        FastDetectionTrainer.with_options(**same)(overrides={"resume": str(last)})
    assert (f"yolofeed.yaml (as recorded: pack_dir={other!r}, partner_pool=0, warm_up=False, "
            "val_period=2)") in caplog.text and "yolofeed's defaults" not in caplog.text


def test_a_damaged_record_is_one_line_before_anything_is_built(run):
    last, _ = run
    record = last.parents[1] / "yolofeed.yaml"
    for text, words in (("pack_dir: [\n", "is damaged"), ("- a\n", "holds a list"),
                        ("val_period: 0\n", "option val_period=0: expected a whole number"),
                        ("speed: 11\n", "unknown options ['speed'] (written by a newer yolofeed?)")):
        record.write_text(text)
        with pytest.raises(ConfigError) as e:
            FastDetectionTrainer(overrides={"resume": str(last)})
        assert words in str(e.value) and str(record) in str(e.value) and "\n" not in str(e.value), str(e.value)
        assert "delete it" in str(e.value)


def test_the_command_line_tells_a_key_typed_again_from_a_default():
    base = ["resume=runs/x/weights/last.pt"]
    assert build_config("train", base + ["pack_rebuild=auto"]).given == {"resume", "pack_rebuild"}
    from yolofeed.train.run import given_keys

    assert given_keys(build_config("train", base)) == {"resume"}
    assert "pack_rebuild" in given_keys(build_config("train", base + ["pack_rebuild=auto"]))  # the default, typed
    from yolofeed.config import TrainConfig

    assert given_keys(TrainConfig(resume="x", val_period=3)) == {"resume", "val_period"}  # made in Python


def test_yolofeed_train_resume_hands_the_recorded_monitor_and_only_the_given_options_over(run, monkeypatch):
    """The wiring in train/run.py: the trainer restores what is not given; the monitor, attached here, is the
    recorded one with the keys typed again in their place."""
    import ultralytics.engine.model

    import yolofeed.monitor.live as live
    from yolofeed.train.run import run as train_run

    last, _ = run
    seen = {}

    class Handed(Exception):
        pass

    def train(self, trainer=None, **kwargs):
        seen["trainer"] = trainer
        raise Handed

    monkeypatch.setattr(live, "attach", lambda target, **cfg: seen.update(monitor=cfg))
    monkeypatch.setattr(ultralytics.engine.model.Model, "train", train)
    with pytest.raises(Handed):
        train_run(build_config("train", [f"resume={last}", "pack_rebuild=auto", "summary_seconds=9"]))
    assert seen["monitor"] == {**MONITOR, "summary_seconds": 9.0}
    trainer = seen["trainer"]
    assert trainer._given == {"pack_rebuild", "monitor"} and trainer.pack_rebuild == "auto"
    seen.clear()
    with pytest.raises(Handed):
        train_run(build_config("train", [f"resume={last}", "monitor=False"]))
    assert "monitor" not in seen and seen["trainer"].monitor is None  # turned off, and recorded so


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cli", "python"])
def test_a_resume_builds_its_packs_where_the_run_put_them(dataset, tmp_path, how, caplog):
    """The issue's case end to end: a run started with pack_dir= and stopped; its packs removed; ``yolofeed train
    resume=`` and ``YOLO(last.pt).train(resume=True, trainer=FastDetectionTrainer)`` build them again in pack_dir
    (not beside the dataset, as they did), with the run's monitor."""
    import shutil

    packs = tmp_path / "packs"
    last = _stopped_run(dataset / "data.yaml", tmp_path / "runs", "r", pack_dir=str(packs), monitor=MONITOR)
    shutil.rmtree(packs)
    if how == "cli":
        r = subprocess.run([sys.executable, "-m", "yolofeed", "train", f"resume={last}"], capture_output=True,
                           text=True, env=os.environ | {"YOLO_OFFLINE": "1"}, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        out = r.stdout + r.stderr
    else:
        from ultralytics import YOLO

        with caplog.at_level(logging.INFO, logger="ultralytics"):
            YOLO(str(last)).train(resume=True, trainer=FastDetectionTrainer)
        out = caplog.text
    assert sorted(p.name for p in packs.glob("*/*.yfpack")) == ["train.yfpack", "val.yfpack"]
    assert not (dataset / "yolofeed-packs").exists()
    assert "yolofeed monitor: Prometheus metrics on http://127.0.0.1:" in out


@pytest.mark.parametrize("options, words", [
    ({"pack_format": "RAW"}, "option pack_format='RAW': expected one of auto, raw, jpeg"),
    ({"monitor": {"prometheus_port": "abc"}}, "option monitor: prometheus_port='abc': expected a whole number"),
    ({"monitor": {"alert_wait": "0.5"}}, "option monitor: alert_wait='0.5': expected a number"),
])
def test_an_option_the_run_would_refuse_is_refused_by_with_options_in_one_line(options, words):
    with pytest.raises(ConfigError) as e:
        FastDetectionTrainer.with_options(**options)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.slow
def test_a_resume_whose_dataset_moved_says_how_to_give_it_again(synth_root, tmp_path, capsys):
    """Its yaml recorded in last.pt is gone: the one line says data= may name it again, as Ultralytics' resume
    takes it (was: only "does not exist")."""
    import shutil

    from yolofeed.cli import main

    shutil.copytree(synth_root, tmp_path / "ds", ignore=shutil.ignore_patterns("yolofeed-packs"))
    yaml_file = tmp_path / "ds" / "data.yaml"
    yaml_file.write_text(yaml_file.read_text().replace(str(synth_root), str(tmp_path / "ds")))
    last = _stopped_run(yaml_file, tmp_path / "runs", "moved")
    (tmp_path / "ds").rename(tmp_path / "ds2")
    assert main(["train", f"resume={last}"]) == 1
    err = capsys.readouterr().err
    assert f"data={yaml_file}: '{yaml_file}' does not exist. This is the data yaml last.pt recorded; where the " \
           f"dataset moved, give its yaml again: yolofeed train resume={last} data=NEW.yaml" in err


def test_an_option_refused_names_the_trainer_given_it():
    """A segment run's mask_room=100 was "FastDetectionTrainer option mask_room=100"."""
    from yolofeed.errors import ConfigError
    from yolofeed.train import FastPoseTrainer, FastSegmentationTrainer

    with pytest.raises(ConfigError, match=r"^FastSegmentationTrainer option mask_room=100: expected a whole number"):
        FastSegmentationTrainer.with_options(mask_room=100)
    with pytest.raises(ConfigError, match=r"^FastPoseTrainer option partner_pool=-3"):
        FastPoseTrainer.with_options(partner_pool=-3)


def _unfinished_checkpoint(path: Path, data: Path, nc: int, **train_args) -> Path:
    """A last.pt as a stopped run leaves it (epoch, optimizer state, train_args), its model yolo11n of ``nc``
    classes, made without training."""
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolo11n.yaml", nc=nc, verbose=False)
    model.nc = nc
    args = {**vars(get_cfg()), "data": str(data), "model": "yolo11n.yaml", "imgsz": 64, "batch": 8, "epochs": 3,
            "device": "cpu", "workers": 0, "project": str(path.parent.parent.parent), "name": path.parent.parent.name,
            **train_args}
    path.parent.mkdir(parents=True)
    torch.save({"epoch": 0, "best_fitness": 0.0, "model": model, "ema": None, "updates": 3,
                "optimizer": {"state": {}, "param_groups": []}, "train_args": args}, path)
    return path


@pytest.mark.parametrize("api", ["cli", "python"])
def test_a_resume_onto_data_with_another_class_count_is_refused(dataset, tmp_path, capsys, monkeypatch, api):
    """Ultralytics rebuilds the head for the new data's count, drops the labels beyond it and goes on: no longer the
    run that stopped. Refused in one line naming both counts and the ways on, before any folder or pack is made; the
    checkpoint's checksums read once on the way (the CLI's check, then the trainer's of the same file, unchanged)."""
    from yolofeed.cli import main
    from yolofeed.train import checkpoints

    reads = []
    monkeypatch.setattr(checkpoints, "damage", lambda path, read=checkpoints.damage: reads.append(path) or read(path))
    last = _unfinished_checkpoint(tmp_path / "runs" / "r" / "weights" / "last.pt", dataset / "data.yaml", 3)
    said = (f"data={dataset / 'data.yaml'} has 80 classes, and resume={last} trained a model of 3: a resume goes on "
            f"with the classes it trained; give it the data it trained on, or start a new run from its weights: "
            f"yolofeed train model={last} data={dataset / 'data.yaml'}")
    if api == "cli":
        assert main(["train", f"resume={last}"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    else:
        with pytest.raises(DatasetError) as e:
            FastDetectionTrainer(overrides={"resume": str(last)})
        assert said in str(e.value)
    assert sorted(p.name for p in (tmp_path / "runs" / "r").iterdir()) == ["weights"]
    assert not (dataset / "yolofeed-packs").exists()
    assert reads == [str(last)]


def test_a_single_class_runs_resume_counts_one_class(dataset, tmp_path):
    """``single_cls``: the model predicts one class whatever the yaml's count, so its resume is not refused (it
    was, by the class count's check: found by a review); a single-class run's checkpoint of 3 classes still is."""
    one = _unfinished_checkpoint(tmp_path / "runs" / "one" / "weights" / "last.pt", dataset / "data.yaml", 1,
                                 single_cls=True)
    trainer = FastDetectionTrainer(overrides={"resume": str(one)})
    assert trainer.args.single_cls and trainer.resume
    three = _unfinished_checkpoint(tmp_path / "runs" / "three" / "weights" / "last.pt", dataset / "data.yaml", 3,
                                   single_cls=True)
    with pytest.raises(DatasetError, match="has 1 classes, and resume=.* trained a model of 3"):
        FastDetectionTrainer(overrides={"resume": str(three)})


def test_resume_true_checks_the_latest_runs_checkpoint_before_ultralytics_reads_it(dataset, tmp_path, monkeypatch):
    """``train(resume=True)`` takes the newest last.pt under the working folder; a truncated one is named as such
    (Ultralytics said "Resume checkpoint not found" of a file that is there: found by a review)."""
    monkeypatch.chdir(tmp_path)
    last = _unfinished_checkpoint(tmp_path / "runs" / "r" / "weights" / "last.pt", dataset / "data.yaml", 80)
    last.write_bytes(last.read_bytes()[:1000])
    with pytest.raises(ConfigError, match=r"resume=.*runs/r/weights/last.pt: damaged: truncated"):
        FastDetectionTrainer(overrides={"resume": True, "data": str(dataset / "data.yaml")})


def test_a_retired_option_in_a_record_is_dropped_and_the_rest_kept(tmp_path):
    """A yolofeed.yaml of an earlier yolofeed naming an option since removed (one that changed only where time went)
    still resumes: that option dropped, the others as recorded; an option never known is still refused."""
    record = tmp_path / options.FILE
    record.write_text("val_period: 2\nsave_beside: true\n")
    assert options.read(record) == {"val_period": 2}
    record.write_text("val_period: 2\nsave_besides: true\n")
    with pytest.raises(ConfigError, match="unknown options"):
        options.read(record)


def test_numpy_values_given_to_with_options_are_taken_and_recorded_as_python_values(tmp_path):
    """``with_options(val_period=np.int64(2))`` (a value read from an array or a config library) was refused as
    "expected a whole number of epochs", and a monitor port given as one could not be written to yolofeed.yaml: each
    is taken as Python's value, checked, and recorded."""
    import numpy as np

    trainer = FastDetectionTrainer.with_options(val_period=np.int64(2), warm_up=np.bool_(False),
                                                monitor={"prometheus_port": np.int64(9400), "tensorboard": np.False_})
    assert trainer.val_period == 2 and type(trainer.val_period) is int and trainer.warm_up is False
    assert trainer.monitor == {"prometheus_port": 9400, "tensorboard": False}
    path = options.record(tmp_path, {k: getattr(trainer, k) for k in ("val_period", "warm_up", "monitor")})
    assert options.read(path) == {"val_period": 2, "warm_up": False,
                                  "monitor": {"prometheus_port": 9400, "tensorboard": False}}
    with pytest.raises(ConfigError, match="val_period=0: expected a whole number"):
        FastDetectionTrainer.with_options(val_period=np.int64(0))
