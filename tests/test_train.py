"""FastDetectionTrainer end to end on the CPU: trains, writes Ultralytics' files, resumes after a kill."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from yolofeed.monitor.throughput import REPORT

TINY = dict(epochs=2, imgsz=64, batch=8, device="cpu", workers=0, plots=False, verbose=False, exist_ok=True)


def _columns(run: Path) -> list[str]:
    with open(run / "results.csv") as f:
        return next(csv.reader(f))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.mark.slow
def test_trains_and_writes_ultralytics_results(synth_root, runs):
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    ours = YOLO("yolo11n.yaml")
    pools = []  # the partner pool at each epoch's end (a finished run lets go of it: test_notebook.py)
    ours.add_callback("on_train_epoch_end", lambda t: pools.append((t._pool.capacity, t._pool.loaded)))
    ours.train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"), project=str(runs), name="ours",
               close_mosaic=1, **TINY)
    stock = YOLO("yolo11n.yaml")
    stock.train(data=str(synth_root / "data.yaml"), project=str(runs), name="stock", **{**TINY, "epochs": 1})
    assert _columns(runs / "ours") == _columns(runs / "stock")
    # mosaic partners from Ultralytics' buffer window: min(24 images, 8 x 8, 1000), filled in the first epoch
    assert pools[0] == (24, 24)
    with open(runs / "ours" / "results.csv") as f:
        assert len(list(csv.reader(f))) == 1 + 2  # header + one row per epoch
    best = YOLO(str(runs / "ours" / "weights" / "best.pt"))  # loadable by Ultralytics itself
    assert best.model.yaml["nc"] == 80
    metrics = best.val(data=str(synth_root / "data.yaml"), imgsz=64, batch=8, device="cpu", plots=False, verbose=False)
    assert 0.0 <= metrics.box.map <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("model", ["yolov8n.yaml", "yolo26n.yaml"])  # yolo11n above; YOLO26's end-to-end loss too
def test_other_detection_families_train(synth_root, runs, model):
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    m = YOLO(model)
    m.train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"), project=str(runs), name=model,
            **{**TINY, "epochs": 1})
    assert (runs / model / "weights" / "last.pt").exists()


def _loader_threads() -> set:
    """The loader threads alive now (other tests' loaders not yet collected included: compare before and after)."""
    import threading

    return {t for t in threading.enumerate() if t.name == "yolofeed-loader" and t.is_alive()}


@pytest.mark.slow
def test_out_of_memory_in_the_first_epoch_halves_the_batch_and_goes_on(synth_root, runs):
    """Ultralytics' own OOM retry rebuilds the loaders at half the batch: ours must rebuild too (a new
    prefetcher and lookahead; the abandoned pass's thread stopped) and training must finish."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    class OomOnce(FastDetectionTrainer):
        raised = 0
        batches: list[int] = []

        def preprocess_batch(self, batch):
            if not OomOnce.raised:
                OomOnce.raised = 1
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            OomOnce.batches.append(len(batch["img"]))
            return super().preprocess_batch(batch)

    m = YOLO("yolo11n.yaml")
    before = _loader_threads()
    m.train(trainer=OomOnce, data=str(synth_root / "data.yaml"), project=str(runs), name="oom", **{**TINY, "epochs": 1})
    assert OomOnce.raised and OomOnce.batches and max(OomOnce.batches) == TINY["batch"] // 2
    assert (runs / "oom" / "weights" / "last.pt").exists()
    assert not _loader_threads() - before  # none left


@pytest.mark.slow
def test_a_failure_between_epochs_leaves_no_loader_thread(synth_root, runs):
    """Ctrl-C (or any error) in validation, a checkpoint or a callback: the train loader had started on the next
    epoch, Ultralytics closes its loaders only when training ends normally, and the YOLO object keeps the trainer."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    class FailInVal(FastDetectionTrainer):
        def validate(self):
            raise KeyboardInterrupt

    before = _loader_threads()
    model = YOLO("yolo11n.yaml")
    with pytest.raises(KeyboardInterrupt):
        model.train(trainer=FailInVal, data=str(synth_root / "data.yaml"), project=str(runs), name="between",
                    **{**TINY, "epochs": 2})
    assert model.trainer is not None  # it lives on with the model: so would the loader's thread and its slots
    assert not _loader_threads() - before


@pytest.mark.slow
def test_cli_resumes_a_killed_run(synth_root, runs):
    env = os.environ | {"YOLO_OFFLINE": "1"}
    run = runs / "killed"
    cmd = [sys.executable, "-m", "yolofeed", "train", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}",
           "epochs=3", "imgsz=64", "batch=8", "device=cpu", "workers=0", "plots=False", f"project={runs}",
           "name=killed", "exist_ok=True"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    results, last = run / "results.csv", run / "weights" / "last.pt"
    while time.monotonic() - t0 < 600 and proc.poll() is None:  # kill once the first epoch is saved
        # Ultralytics writes the results row, then last.pt (in place, not atomically): wait until the file
        # is newer than the row and loads, so the kill lands between checkpoints, as a crash usually does
        if results.exists() and last.exists() and last.stat().st_mtime_ns >= results.stat().st_mtime_ns:
            try:
                torch.load(last, map_location="cpu", weights_only=False)
                break
            except Exception:  # still being written
                pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with open(run / "results.csv") as f:
        before = [row[0].strip() for row in list(csv.reader(f))[1:]]
    saved = torch.load(run / "weights" / "last.pt", map_location="cpu", weights_only=False)["epoch"]  # 0-based
    assert 0 <= saved < 2, "the run finished before it could be killed"
    r = subprocess.run([sys.executable, "-m", "yolofeed", "train", f"resume={run / 'weights' / 'last.pt'}"],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "yolofeed train:" in r.stdout and "img/s" in r.stdout and "best.pt" in r.stdout
    images, seconds = re.search(r"yolofeed train: ([\d,]+) images in ([\d.]+) s", r.stdout).groups()
    assert int(images.replace(",", "")) > 0 and float(seconds) > 0
    assert not (run / REPORT).exists()  # one process learns its speed itself: the report is DDP rank 0's
    with open(run / "results.csv") as f:
        after = [row[0].strip() for row in list(csv.reader(f))[1:]]
    # continued after the saved epoch (a row written after the last save is redone, as Ultralytics does)
    assert after == before + [str(e) for e in range(saved + 2, 4)]


@pytest.mark.slow
def test_loader_failure_mid_epoch_names_the_cause_and_leaves_a_resumable_checkpoint(synth_root, runs, caplog):
    """The loader thread fails in the second epoch (a disk error while gathering a batch): training stops with
    a message naming the cause, the batch and the pack; the thread is gone; the first epoch's last.pt is there
    to resume from, and the log says so. Ultralytics itself saves nothing when an exception ends a run: last.pt
    is the one its previous epoch saved."""
    import logging

    from ultralytics import YOLO

    import yolofeed.loader.prefetch as prefetch
    from yolofeed import FastDetectionTrainer

    real, calls = prefetch.gather, []
    per_epoch = 3  # 24 images, batch 8

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == per_epoch + 2:
            raise OSError(5, "Input/output error")
        return real(*a, **k)

    prefetch.gather = failing
    before = _loader_threads()
    try:
        m = YOLO("yolo11n.yaml")
        with caplog.at_level(logging.ERROR), pytest.raises(prefetch.LoaderError) as e:
            m.train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"), project=str(runs),
                    name="loader-fault", **TINY)
    finally:
        prefetch.gather = real
    assert re.search(r"the loader thread stopped at batch \d of 3 of the epoch", str(e.value))
    assert "train.yfpack: OSError: [Errno 5] Input/output error" in str(e.value)
    assert isinstance(e.value.__cause__, OSError)
    assert not _loader_threads() - before
    last = runs / "loader-fault" / "weights" / "last.pt"
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["epoch"] == 0 and ckpt["optimizer"] is not None  # what Ultralytics' resume needs
    assert "training stopped in epoch 2 by LoaderError" in caplog.text
    assert f"yolofeed train resume={last}" in caplog.text


def test_val_period_validates_every_nth_epoch_the_last_and_where_early_stopping_may_stop(monkeypatch):
    from types import SimpleNamespace

    from yolofeed import FastDetectionTrainer
    from yolofeed.ultralytics_seam import DetectionTrainer

    monkeypatch.setattr(DetectionTrainer, "validate", lambda self: ({"metrics/mAP50-95(B)": 0.5}, 0.5))
    trainer = FastDetectionTrainer.with_options(val_period=3).__new__(FastDetectionTrainer.with_options(val_period=3))
    trainer.epochs, trainer.stop = 7, False
    trainer.stopper = SimpleNamespace(possible_stop=False)
    trainer.metrics = {"metrics/mAP50-95(B)": 0.0, "val/box_loss": 0.0}
    validated = []
    for epoch in range(7):
        trainer.epoch = epoch
        metrics, fitness = trainer.validate()
        if fitness is not None:
            validated.append(epoch + 1)
        else:  # the columns kept, each nan: no stale value is written as if measured
            assert metrics.keys() == trainer.metrics.keys() and all(v != v for v in metrics.values())
    assert validated == [3, 6, 7]
    trainer.epoch = 0
    for flag in ("possible_stop", "stop"):  # Ultralytics validates there whatever val= says: so does val_period
        owner = trainer.stopper if flag == "possible_stop" else trainer
        setattr(owner, flag, True)
        assert trainer.validate()[1] == 0.5
        setattr(owner, flag, False)
    with pytest.raises(Exception, match="val_period=0: expected a whole number"):
        FastDetectionTrainer.with_options(val_period=0)


PERIOD_SAID = ("yolofeed: val_period=2 changes nothing with val=False, which validates the last epoch alone, as yolo "
               "train does")
OVERLAP_SAID = ("yolofeed: val_overlap needs validations in a thread of their own (validate_beside, on one CUDA GPU): "
                "each epoch is validated before the next starts")


@pytest.mark.parametrize("options, val, said", [
    ({"val_period": 2}, False, [PERIOD_SAID]),
    ({"val_period": 2}, True, []),
    ({"val_period": 1}, False, []),
    ({"val_overlap": True}, True, [OVERLAP_SAID]),  # on the CPU: no validation thread to overlap in
])
def test_the_validation_plan_says_what_the_run_cannot_follow(monkeypatch, options, val, said):
    """``val=False val_period=2`` validated the last epoch alone, as stock's val=False, without a word of the
    val_period given (found by a hostile pass): one line says so, once, before the first epoch, as for val_overlap
    without a validation thread."""
    from types import SimpleNamespace

    import yolofeed.train.validating as validating
    from yolofeed import FastDetectionTrainer

    lines = []
    monkeypatch.setattr(validating, "LOGGER", SimpleNamespace(info=lines.append))
    cls = FastDetectionTrainer.with_options(**options)
    trainer = cls.__new__(cls)
    trainer.args, trainer.device = SimpleNamespace(val=val), SimpleNamespace(type="cpu")
    trainer._say_validation_plan()
    assert lines == said


def test_the_run_says_its_validation_plan_before_ultralytics_callbacks(synth_root, tmp_path):
    """``_say_validation_plan`` is among the trainer's first callbacks at ``on_pretrain_routine_end``, which run last
    to first as registered: the warm-up, the validation thread, the plan, the labels plot joined."""
    from yolofeed import FastDetectionTrainer

    t = FastDetectionTrainer(overrides={"model": "yolo11n.yaml", "data": str(synth_root / "data.yaml"), "device": "cpu",
                                        "project": str(tmp_path), "name": "plan"})
    first = [getattr(fn, "__name__", "") for fn in t.callbacks["on_pretrain_routine_end"][:4]]
    assert first == ["_warm_up", "_start_validation_thread", "_say_validation_plan", "_join_label_plots"]


@pytest.mark.slow
def test_cli_val_period_writes_nan_rows_and_keeps_the_best_validated_epoch(synth_root, runs):
    from yolofeed.cli import main

    # the command line's main in this process: what it writes is the property, not how a process starts
    assert main(["train", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}", "epochs=3", "imgsz=64", "batch=8",
                 "device=cpu", "workers=0", "plots=False", f"project={runs}", "name=val-period", "exist_ok=True",
                 "val_period=2"]) == 0
    with open(runs / "val-period" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    key = next(k for k in rows[0] if "mAP50-95" in k)
    assert [row[key].strip() == "nan" for row in rows] == [True, False, False]  # epoch 2 (the period) and 3 (last)
    best = torch.load(runs / "val-period" / "weights" / "best.pt", map_location="cpu", weights_only=False)
    metrics = best["train_metrics"]  # what was known when it was saved: a validated epoch's, not epoch 1's nan
    assert metrics["fitness"] is not None and metrics[key] == metrics[key]


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, said", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_ctrl_c_after_an_epoch_says_how_to_resume(synth_root, tmp_path, sig, code, said):
    """Ctrl-C (SIGINT to the training process) once an epoch is saved: one line names the command that continues,
    quoted for the shell (the run folder here has a space in it), and the command resumes. It said "interrupted".
    SIGTERM alike (it ended the process at once, exit 143 and nothing said)."""
    import shlex

    env = os.environ | {"YOLO_OFFLINE": "1"}
    project = tmp_path / "my runs"
    last = project / "r" / "weights" / "last.pt"
    proc = subprocess.Popen([sys.executable, "-m", "yolofeed", "train", "model=yolo11n.yaml",
                             f"data={synth_root / 'data.yaml'}", "epochs=3", "imgsz=64", "batch=8", "device=cpu",
                             "workers=0", "plots=False", f"project={project}", "name=r"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 600 and proc.poll() is None:
        try:
            torch.load(last, map_location="cpu", weights_only=False)
            break
        except Exception:  # not saved yet
            time.sleep(0.05)
    proc.send_signal(sig)
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == code, err[-2000:]
    line = [x for x in err.splitlines() if x.startswith("yolofeed train:")][-1]
    assert line.startswith(f"yolofeed train: {said}; the last epoch saved is in {last}; continue with: ")
    argv = shlex.split(line.split("continue with: ")[1])
    assert argv == ["yolofeed", "train", f"resume={last}"]
    # the command, run by the command line's main in this process (a resume in a fresh one:
    # test_cli_resumes_a_killed_run)
    from yolofeed.cli import main

    assert main(argv[1:]) == 0


def test_ctrl_c_before_any_epoch_says_none_was_saved(synth_root, tmp_path, monkeypatch, capsys):
    from yolofeed import FastDetectionTrainer
    from yolofeed.cli import main

    def interrupted(trainer):
        raise KeyboardInterrupt  # Ctrl-C while the first epoch is set up

    monkeypatch.setattr(FastDetectionTrainer, "_warm_up", interrupted)
    assert main(["train", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}", "epochs=1", "imgsz=64",
                 "batch=8", "device=cpu", "workers=0", "plots=False", f"project={tmp_path}", "name=r"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "yolofeed train: interrupted; no epoch was saved yet"


def test_sigterm_before_any_epoch_says_none_was_saved_and_exits_143(synth_root, tmp_path, monkeypatch, capsys):
    from yolofeed import FastDetectionTrainer
    from yolofeed.cli import main

    def terminated(trainer):
        os.kill(os.getpid(), signal.SIGTERM)  # while the first epoch is set up: the handler raises Terminated
        time.sleep(5)  # not reached

    monkeypatch.setattr(FastDetectionTrainer, "_warm_up", terminated)
    assert main(["train", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}", "epochs=1", "imgsz=64",
                 "batch=8", "device=cpu", "workers=0", "plots=False", f"project={tmp_path}", "name=r"]) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("yolofeed train: stopped by SIGTERM; no epoch was "
                                                                "saved yet")
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # put back


def test_the_checkpoint_a_stopped_run_continues_from(tmp_path):
    """This run's last.pt; before its first save, the checkpoint it resumed from (it used to say "no epoch was saved
    yet" there); never an older run's last.pt in a reused folder (exist_ok=True)."""
    from types import SimpleNamespace

    from yolofeed import FastDetectionTrainer

    last, source = tmp_path / "last.pt", tmp_path / "best.pt"
    last.write_bytes(b"older")
    source.write_bytes(b"resumed from")
    os.utime(last, (time.time() - 3600, time.time() - 3600))
    t = SimpleNamespace(last=last, _started=time.time(), resume=False, args=SimpleNamespace(resume=False),
                        trained=False)
    assert FastDetectionTrainer.resumable_checkpoint(t) is None  # another run's
    t.resume, t.args.resume = True, str(source)
    assert FastDetectionTrainer.resumable_checkpoint(t) == source
    last.write_bytes(b"saved by this run")  # one that does not load is not taken for a finished run's
    assert FastDetectionTrainer.resumable_checkpoint(t) == last
    t.trained = True  # final_eval has stripped it: a finished run's
    assert FastDetectionTrainer.resumable_checkpoint(t) is None
    t.trained = False  # stripped in another process (DDP's rank 0): the file says so
    torch.save({"epoch": -1, "optimizer": None}, last)
    assert FastDetectionTrainer.resumable_checkpoint(t) is None and t.trained


def test_ctrl_c_in_the_final_validation_says_the_weights_are_whole_and_how_to_validate(synth_root, tmp_path,
                                                                                      monkeypatch, capsys):
    """Every epoch trained and saved, Ctrl-C in the final validation of best.pt: last.pt is stripped by then, so the
    line names the weights and the validation left, not a resume that would be refused ("a finished run")."""
    import shlex

    from yolofeed import FastDetectionTrainer
    from yolofeed.cli import main

    validate = FastDetectionTrainer._in_validation_thread

    def interrupted(self, fn, *args, final=False, **kwargs):
        if final:
            raise KeyboardInterrupt
        return validate(self, fn, *args, final=final, **kwargs)

    monkeypatch.setattr(FastDetectionTrainer, "_in_validation_thread", interrupted)
    assert main(["train", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}", "epochs=1", "imgsz=64",
                 "batch=8", "device=cpu", "workers=0", "plots=False", f"project={tmp_path}", "name=r"]) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    best = tmp_path / "r" / "weights" / "best.pt"
    assert line.startswith(f"yolofeed train: interrupted; every epoch was trained and saved, in {best}; its final "
                           "validation did not end"), line
    assert best.is_file()
    assert shlex.split(line.split("run it with: ")[1]) == ["yolo", "val", f"model={best}",
                                                            f"data={synth_root / 'data.yaml'}"]



@pytest.mark.slow
def test_a_list_of_data_yamls_from_python_is_ultralytics_multitrainer_with_yolofeeds_trainer(synth_root, tmp_path):
    """``YOLO(...).train(trainer=FastDetectionTrainer, data=[a, b])`` is Ultralytics' MultiTrainer: the base model
    fine-tuned on each dataset in series, each run yolofeed's trainer on that one dataset (its packs, its
    yolofeed.yaml), a {run: metrics} dict returned. The CLI refuses a list (keys.py's data row) and says this."""
    from ultralytics import YOLO

    from helpers import copy_dataset
    from yolofeed import FastDetectionTrainer

    other = copy_dataset(synth_root, tmp_path / "other")
    model = YOLO("yolo11n.yaml")
    results = model.train(trainer=FastDetectionTrainer, data=[str(synth_root / "data.yaml"), str(other / "data.yaml")],
                          project=str(tmp_path / "runs"), **{**TINY, "epochs": 1})
    assert isinstance(results, dict) and len(results) == 2, results
    runs = sorted(p for p in (tmp_path / "runs" / "multitrain").iterdir() if p.is_dir())
    assert len(runs) == 2
    for run in runs:
        assert (run / "weights" / "last.pt").is_file() and (run / "yolofeed.yaml").is_file()
    assert (other / "yolofeed-packs").is_dir()  # the second dataset trained from its own pack
