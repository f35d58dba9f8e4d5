"""``yolofeed train`` as a user types it: values read as Ultralytics reads them, one line per mistake, and the
keys that used to fail (single_cls, classes, imgsz=100, the resume forms) trained end to end."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from yolofeed.cli import build_config, main
from yolofeed.errors import ConfigError
from yolofeed.monitor.throughput import REPORT
from yolofeed.train.run import resume_checkpoint

TINY = ["epochs=1", "imgsz=40", "batch=8", "device=cpu", "workers=0", "plots=False", "exist_ok=True"]


def _errors(capsys, argv: list[str]) -> str:
    """Run the CLI in this process; the one stderr line of a user error (any other exception fails the test)."""
    assert main(argv) == 1
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.fixture()
def base(synth_root, tmp_path) -> list[str]:
    return ["train", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}", f"project={tmp_path}", "name=r"]


def test_values_are_read_as_ultralytics_reads_them():
    cfg = build_config("train", ["model=m.yaml", "classes=[0,1]", "fraction=0.5", "name=007", "scale=(0.5,1.5)",
                                 "cache=ram", "amp=False", "single_cls", "freeze=None"])
    assert cfg.extra == {"classes": [0, 1], "fraction": 0.5, "name": "007", "scale": (0.5, 1.5), "cache": "ram",
                         "amp": False, "single_cls": True, "freeze": None}


@pytest.mark.parametrize("argv, expect", [
    (["model=runs/w/last.pt", "resume"], "runs/w/last.pt"),
    (["model=runs/w/last.pt", "resume=True"], "runs/w/last.pt"),
    (["resume=runs/w/last.pt"], "runs/w/last.pt"),
    (["model=runs/w/last.pt", "resume=False"], None),
    (["model=runs/w/last.pt"], None),
])
def test_the_resume_forms_of_yolo_train(tmp_path, monkeypatch, argv, expect):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "w").mkdir(parents=True)
    (tmp_path / "runs" / "w" / "last.pt").write_bytes(b"")
    assert resume_checkpoint(build_config("train", argv)) == expect


def test_resume_without_a_checkpoint_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a bare resume looks for the newest last.pt here, as yolo train does
    for argv, words in ((["resume"], "no last.pt under"),
                        ([f"resume={tmp_path}/nope.pt"], "no checkpoint at"),
                        ([f"model={tmp_path}/nope.pt", "resume"], "no checkpoint at"),
                        # stock starts a new run with a warning; here one line with the two ways to resume
                        (["model=yolo11n.yaml", "resume"], r"model=yolo11n\.yaml is a model to build, not a "
                                                           r"checkpoint to continue; pass model=<run>/weights/last\.pt "
                                                           r"resume, or a bare 'resume' without model=")):
        with pytest.raises(ConfigError, match=words):
            resume_checkpoint(build_config("train", argv))
    with pytest.raises(ConfigError, match="not key=value"):
        build_config("train", ["model=m.yaml", "lr0"])  # a bare word only sets a bool key


def test_user_mistakes_are_one_line(capsys, base, synth_root, tmp_path, monkeypatch):
    """Each prints 'yolofeed COMMAND: error: ...' naming the problem and the fix; no traceback, exit code 1."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    line = _errors(capsys, base + ["foo=1"])
    assert "'foo' is not a key" in line
    assert "Did you mean 'epochs'" in _errors(capsys, base + ["epoch=3"])
    assert "no such file" in _errors(capsys, ["train", "model=nope.yaml", f"data={synth_root / 'data.yaml'}"])
    assert "is a file" in _errors(capsys, base + [f"pack_dir={a_file}"])
    assert "is a file" in _errors(capsys, ["pack", f"data={synth_root / 'data.yaml'}", f"out={a_file}"])
    for size in ("0", "-5"):
        assert "imgsz=" + size + ": expected at least 32" in _errors(capsys, ["pack", f"data={synth_root}/data.yaml",
                                                                               f"imgsz={size}"])
    line = _errors(capsys, ["doctor", f"data={tmp_path}/nope.yaml"])
    assert "data=" in line and "not found" in line and "data=path/to/data.yaml" in line
    for steps in ("0", "4"):  # one minimum, the breakdown's, whichever check meets it (it said 1, then 5)
        assert f"steps={steps}: expected at least 5 (default 40)" in _errors(
            capsys, ["doctor", f"data={synth_root}/data.yaml", f"steps={steps}"])
    assert "rect=True" in _errors(capsys, base + ["rect"])
    assert "trains detection, segmentation, pose and oriented-box models" in _errors(capsys, ["train",
                                                                                         "model=yolo11n-cls.yaml",
                                                       f"data={synth_root / 'data.yaml'}"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = _errors(capsys, base + ["device=cuda"])
    assert "device=cuda" in line and "no CUDA GPU" in line and "device=cpu" in line
    assert not (tmp_path / "r").exists()  # every one stopped before the run folder was made


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = os.environ | {"YOLO_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "yolofeed", *argv], env=env, capture_output=True, text=True,
                          timeout=900)


def _rows(run: Path) -> list[dict]:
    with open(run / "results.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_single_cls_classes_and_odd_imgsz_train_and_count_real_images(synth_root, tmp_path):
    """The keys that crashed or were ignored, through the CLI: single_cls (an IndexError in the loss), classes
    given as '[...]' (ignored), imgsz=40 (not a multiple of 32: trains at 64), and 11 images at batch 8: the
    closing line counts 11, not two full batches."""
    r = _run(["train", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}", f"project={tmp_path}", "name=k",
              *TINY, "single_cls=True", "classes=[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]",
              "fraction=11"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"yolofeed train: 11 images in", r.stdout), r.stdout[-1000:]
    assert "Using 0 dataloader workers" in r.stdout and "slower than stock" in r.stdout
    assert "updating to [64]" in r.stdout  # Ultralytics' own rounding, then the pack at 64
    run = tmp_path / "k"
    assert len(_rows(run)) == 1 and float(_rows(run)[0]["train/cls_loss"]) > 0
    best = torch.load(run / "weights" / "best.pt", map_location="cpu", weights_only=False)
    assert best["model"].nc == 1 and best["model"].names == {0: "item"}
    assert best["train_args"]["classes"] == list(range(21)) and best["train_args"]["imgsz"] == 64


def _crashed_after_epoch_1(synth_root: Path, project: Path, name: str) -> Path:
    """A 2-epoch run in ``project``/``name`` stopped at its first checkpoint's save (a crash after epoch 1); its
    last.pt."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    class Crash(Exception):
        pass

    def crash(trainer):
        raise Crash

    m = YOLO("yolo11n.yaml")
    m.add_callback("on_model_save", crash)
    with pytest.raises(Crash):
        m.train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"), project=str(project), name=name,
                epochs=2, imgsz=64, batch=8, device="cpu", workers=0, plots=False, val=False, exist_ok=True)
    return project / name / "weights" / "last.pt"


@pytest.mark.slow
def test_resume_forms(synth_root, tmp_path, capsys):
    """A crash after epoch 1 of 2 leaves a resumable last.pt; 'model=last.pt resume' finishes the run as
    yolo train would; the finished checkpoint is then refused in one line."""
    last = _crashed_after_epoch_1(synth_root, tmp_path, "c")
    assert torch.load(last, map_location="cpu", weights_only=False)["epoch"] == 0
    r = _run(["train", f"model={last}", "resume"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Resuming training" in r.stdout and "yolofeed train: 24 images in" in r.stdout
    assert [row["epoch"].strip() for row in _rows(tmp_path / "c")] == ["1", "2"]
    assert not (tmp_path / "c" / REPORT).exists()  # written by DDP rank 0 only
    capsys.readouterr()  # the crashed run's progress bars
    line = _errors(capsys, ["train", f"model={last}", "resume=True"])  # exit 1, one line, no traceback
    assert "finished run" in line and "nothing to resume" in line


def test_every_trainer_option_is_a_key_of_yolofeed_train(monkeypatch, synth_root):
    """``augment_ahead=False``, which the README offers, was refused ("Did you mean 'augment'?"): the step's options
    were ``FastDetectionTrainer.with_options`` keywords only. Now each option is a key, handed to the trainer."""
    from yolofeed.train import run as train_run
    from yolofeed.train.trainer import FastDetectionTrainer

    with pytest.raises(ConfigError) as e:
        FastDetectionTrainer.with_options(no_such_option=1)
    options = str(e.value).split("expected ", 1)[1].split(", ")
    flags = [o for o in options if isinstance(getattr(FastDetectionTrainer, o), bool)]
    assert {"augment_ahead", "sync_free_step", "sync_free_loss", "fast_musgd"} <= set(flags)

    class Given(Exception):
        pass

    def given(cls, **chosen):
        raise Given(chosen)

    monkeypatch.setattr(FastDetectionTrainer, "with_options", classmethod(given))
    with pytest.raises(Given) as e:
        train_run.run(build_config("train", ["model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}",
                                             *(f"{o}=False" for o in flags)]))
    chosen = e.value.args[0]  # the options given (a resume restores the others from the run: train/options.py)
    assert set(chosen) == set(flags) | {"monitor"} and all(chosen[o] is False for o in flags)


def test_a_run_stopped_before_its_final_strip_is_refused_in_one_line_by_the_cli_and_the_api(synth_root, tmp_path,
                                                                                             capsys):
    """A run killed after its last epoch's save, before its final strip and validation, leaves a last.pt holding
    every epoch with its optimizer (and the strip's temporary copy). A resume of it was Ultralytics' assertion with a
    traceback ("training to 1 epochs is finished"), where a stripped one was refused in one line. Now both are, from
    the command line and from the Python API, and the dead writer's copy is swept."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    class Killed(BaseException):
        pass

    def killed(trainer):
        raise Killed

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FastDetectionTrainer, "final_eval", killed)
        with pytest.raises(Killed):
            YOLO("yolo11n.yaml").train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"),
                                       project=str(tmp_path), name="k", epochs=1, imgsz=64, batch=8, device="cpu",
                                       workers=0, plots=False, val=False, exist_ok=True)
    weights = tmp_path / "k" / "weights"
    ckpt = torch.load(weights / "last.pt", map_location="cpu", weights_only=False)
    assert ckpt["epoch"] == 0 and ckpt["optimizer"] is not None  # every epoch, not stripped
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = weights / f".last.pt.tmp-{int(dead.stdout)}-0123abcd"
    left.write_bytes(b"")  # the strip's copy, its writer gone
    capsys.readouterr()
    line = _errors(capsys, ["train", f"resume={weights / 'last.pt'}"])
    assert "holds every epoch of its run (1 of 1" in line and "nothing to resume" in line, line
    assert not left.exists()
    line = _errors(capsys, ["train", f"resume={weights / 'last.pt'}", "time=0.01"])  # time= recounts after an epoch
    assert "holds every epoch of its run" in line, line
    args = (tmp_path / "k" / "args.yaml").stat().st_mtime_ns
    for time_limit in (None, 0.01):
        with pytest.raises(ConfigError, match=r"holds every epoch of its run \(1 of 1.*nothing to resume"):
            YOLO(weights / "last.pt").train(trainer=FastDetectionTrainer, resume=True, device="cpu", workers=0,
                                            time=time_limit)
    # refused in the trainer's constructor: its folder's args.yaml not rewritten, no model or loader built
    assert (tmp_path / "k" / "args.yaml").stat().st_mtime_ns == args
    assert torch.load(weights / "last.pt", map_location="cpu", weights_only=False)["epoch"] == 0  # untouched
    from ultralytics.utils.torch_utils import strip_optimizer

    strip_optimizer(weights / "last.pt")
    line = _errors(capsys, ["train", f"resume={weights / 'last.pt'}", "time=0.01"])
    assert "is the checkpoint of a finished run" in line and "nothing to resume" in line, line


def test_a_resume_from_a_copied_run_folder_says_where_the_run_is_written(synth_root, tmp_path, caplog):
    """A run folder copied, then resumed from the copy: Ultralytics resumes the run in the folder it recorded (as
    stock does), so the weights and results.csv of the original change, not the copy's. One line says so."""
    import shutil

    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    _crashed_after_epoch_1(synth_root, tmp_path, "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copied = tmp_path / "b" / "weights" / "last.pt"
    with caplog.at_level("WARNING"):
        YOLO(copied).train(trainer=FastDetectionTrainer, resume=True, device="cpu", workers=0)
    said = [r.getMessage() for r in caplog.records if "lies in" in r.getMessage()]
    assert len(said) == 1 and str(tmp_path / "b") in said[0] and f"results.csv in {tmp_path / 'a'}" in said[0], said
    assert torch.load(tmp_path / "a" / "weights" / "last.pt", map_location="cpu", weights_only=False)["epoch"] == -1
    assert torch.load(copied, map_location="cpu", weights_only=False)["epoch"] == 0  # the copy as it was
