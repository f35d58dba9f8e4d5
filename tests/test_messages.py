"""Messages that were unclear or wrong: each says what the problem is, in the user's words, with the fix.

RELIABILITY.md lists these tests with what each message said before.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import socket
import struct
from pathlib import Path

import pytest

from yolofeed.cli import main
from yolofeed.doctor.rules import Facts, diagnose
from yolofeed.errors import DatasetError, PackError
from yolofeed.pack import Pack, open_or_build
from yolofeed.pack.layout import TRAILER


def _one_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 1
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


def test_data_a_folder_or_a_list_is_named_as_such(synth_root, tmp_path, capsys):
    """Both used to say "file not found"."""
    line = _one_line(capsys, ["train", "model=yolo11n.yaml", f"data={synth_root}"])
    assert f"data={synth_root} is a folder: pass the data yaml inside it, e.g. data={synth_root / 'data.yaml'}" in line
    line = _one_line(capsys, ["pack", f"data={tmp_path}"])
    assert "is a folder with no data yaml in it" in line
    line = _one_line(capsys, ["train", "model=yolo11n.yaml", f"data=[{synth_root}/data.yaml,{synth_root}/data.yaml]"])
    assert "yolofeed trains on one dataset a run: run it once per data yaml, or from Python" in line
    assert "data=[...]), Ultralytics' MultiTrainer" in line


def test_pack_out_a_link_loop_is_one_line(synth_root, tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    line = _one_line(capsys, ["pack", f"data={synth_root / 'data.yaml'}", f"out={tmp_path / 'a'}", "imgsz=64"])
    assert "cannot resolve the path" in line and "link loop" in line.lower()


def test_a_damaged_trailer_says_so(dataset, tmp_path):
    """Not "truncated or padded (header at 18446462598733231872+2572, ...)"."""
    pack = open_or_build(dataset / "data.yaml", "val", 64, rebuild="auto", workers=1, progress=False)
    data = bytearray(pack.path.read_bytes())
    magic, crc, off, length = TRAILER.unpack(data[-TRAILER.size:])
    data[-TRAILER.size:] = TRAILER.pack(magic, crc, off ^ 0xFFFF_0000_0000_0000, length)
    bad = tmp_path / "val.yfpack"
    bad.write_bytes(bytes(data))
    with pytest.raises(PackError, match="is damaged: its trailer points outside the file"):
        Pack.open(bad)
    bad.write_bytes(bytes(data[:-TRAILER.size - 100]) + struct.pack("<12sIQQ", magic, crc, off, length))  # cut
    with pytest.raises(PackError, match=r"is truncated or padded: its trailer says [\d,]+ bytes, the file has"):
        Pack.open(bad)


def test_verify_on_an_intact_pack_says_what_it_checked(dataset, capsys):
    args = ["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "workers=1", "splits=val"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args + ["verify=True"]) == 0
    out = capsys.readouterr().out
    assert "up to date" in out and "verified: the stored pixels of all 8 images match their checksums" in out
    assert main(args) == 0
    assert "verified" not in capsys.readouterr().out  # said only when it was done


def test_one_worker_builds_without_a_disk_space_line(dataset, caplog):
    """A one-worker build never maps the file; it used to log "N GB free, up to M needed: writing without
    reserving the space first", which reads as a disk-space warning."""
    with caplog.at_level(logging.INFO):
        open_or_build(dataset / "data.yaml", "val", 64, rebuild="auto", workers=1, progress=False)
    assert "free" not in caplog.text and "reserv" not in caplog.text


def test_the_doctor_names_the_median_step():
    """Its verdict said "each step took 159 ms" right under "mean step 191 ms"."""
    facts = Facts(images_per_s=40, step_ms=159, data_wait=0.05, preprocess_share=0.03, gpu_util=None, cores=2,
                  machine_cores_busy=1.0, own_cores_busy=1.0, iowait=0.0, disk_read_mb_s=0, workers=0, batch=8,
                  amp=True, n_train=40, n_val=10, val_images_per_s=100)
    v = diagnose(facts)[0]
    assert v.rule == "cpu_only_compute" and "the median step took 159 ms" in v.evidence
    small = diagnose(dataclasses.replace(facts, gpu_util=35.0, batch=4, step_ms=22, data_wait=0.03))
    assert any("the median step takes 22 ms" in x.evidence for x in small)


def test_prometheus_blames_the_address_or_the_port_whichever_is_wrong():
    from yolofeed.monitor.exporter import Collector, serve

    log = logging.getLogger("test-messages-exporter")
    seen: list[str] = []
    log.addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: seen.append(r.getMessage())})())
    collector = Collector("r", dict)
    assert serve(collector, "192.0.2.1", 0, log) is None  # TEST-NET-1: an address this machine does not have
    assert "prometheus_addr=192.0.2.1 is not an address of this machine" in seen[-1]
    assert "prometheus_port" not in seen[-1]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert serve(collector, "127.0.0.1", taken.getsockname()[1], log, tries=1) is None
    assert "Choose a free prometheus_port=" in seen[-1] and "prometheus_addr" not in seen[-1]


def test_commands_in_messages_paste_into_a_shell_with_a_space_in_the_path(synth_root, tmp_path, capsys):
    """A rebuild command printed ``data=/my data/data.yaml`` unquoted: pasted, the shell split it into two arguments.
    Now every printed command is quoted for the shell; the test pastes it (``shlex.split``) and runs it."""
    import shlex

    from helpers import copy_dataset
    from yolofeed.pack.paths import store_dir

    root = copy_dataset(synth_root, tmp_path / "my data")
    yaml_file, out = root / "data.yaml", tmp_path / "my packs"
    for where in (None, out):
        pack = open_or_build(yaml_file, "val", 64, "raw", out=where, rebuild="auto", workers=1, progress=False)
        data = bytearray(pack.path.read_bytes())
        _, _, h_off, _ = TRAILER.unpack(bytes(data[-TRAILER.size:]))
        data[h_off] ^= 0xFF  # the header no longer parses: the command comes from the caller
        pack.path.write_bytes(bytes(data))
        with pytest.raises(PackError) as e:
            open_or_build(yaml_file, "val", 64, "raw", out=where, rebuild="never")
        command = str(e.value).split("rebuild it with: ", 1)[1]
        argv = shlex.split(command)
        assert argv[:2] == ["yolofeed", "pack"] and f"data={yaml_file}" in argv, argv
        assert (f"out={out}" in argv) == (where is not None)
        assert main(argv[1:] + ["splits=val", "workers=1"]) == 0
        assert len(Pack.open(store_dir(yaml_file, 64, "raw", where) / "val.yfpack")) == 8
    capsys.readouterr()
    line = _one_line(capsys, ["pack", f"data={root}"])
    hint = line.split("e.g. ", 1)[1]
    assert shlex.split(hint) == [f"data={yaml_file}"], line


@pytest.mark.slow
def test_a_build_from_python_says_its_summary_once(dataset):
    """From Python, with no logging configured, a clean build said nothing: its summary (the format chosen and why,
    the counts, '-> <pack>') is logged at INFO, which Python drops. Now yolofeed says it as Ultralytics says its own
    lines, and under the CLI's logging (``basicConfig``) it is said once, not twice."""
    import os
    import subprocess
    import sys

    build = ("import logging, sys\n"
             "if sys.argv[2] == 'cli':\n"
             "    logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
             "from yolofeed.pack import open_or_build\n"
             "open_or_build(sys.argv[1], 'val', 64, 'auto', rebuild='always', workers=1, progress=False)\n")
    for logs in ("python", "cli"):
        r = subprocess.run([sys.executable, "-c", build, str(dataset / "data.yaml"), logs], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "YOLO_OFFLINE": "1"})
        assert r.returncode == 0, r.stderr
        assert r.stderr.count("pack: format raw (auto): ") == 1, r.stderr
        assert r.stderr.count("pack val: 8 images") == 1 and r.stderr.count("  -> ") == 1, r.stderr
        assert "val.yfpack" in r.stderr.split("  -> ")[1]


@pytest.fixture()
def ultralytics_datasets(tmp_path, monkeypatch):
    """Ultralytics' datasets folder (its settings' ``datasets_dir``) moved to an empty one; the user cache too."""
    import ultralytics.data.utils

    from yolofeed.pack import source

    folder = tmp_path / "datasets"
    folder.mkdir()
    monkeypatch.setattr(source, "DATASETS_DIR", folder)
    monkeypatch.setattr(ultralytics.data.utils, "DATASETS_DIR", folder)
    monkeypatch.setattr(ultralytics.data.utils, "safe_download", lambda *a, **k: pytest.fail("it downloaded"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return folder


def test_a_dataset_ultralytics_ships_is_found_by_name_and_never_downloaded(ultralytics_datasets, synth_root,
                                                                            tmp_path, capsys):
    """``data=coco8.yaml`` was "file not found", where ``yolo train`` finds the yaml among the ones Ultralytics ships.
    Now it is found as there; offline, with its images not here, one line says which path is missing and that
    yolofeed does not download (through the CLI and FastDetectionTrainer, whose check would have downloaded it);
    with the images in Ultralytics' datasets folder it packs, into the user cache (never into the package)."""
    from yolofeed.errors import DatasetError
    from yolofeed.train import FastDetectionTrainer

    for data in ("coco8.yaml", "coco8"):
        line = _one_line(capsys, ["pack", f"data={data}", "imgsz=64"])
        assert f"data={data}: the images of coco8.yaml are not on this machine: " in line, line
        assert f"{ultralytics_datasets / 'coco8' / 'images' / 'train'} does not exist" in line
        assert "yolofeed does not download datasets" in line and "check_det_dataset(" in line
    line = _one_line(capsys, ["train", "model=yolo11n.yaml", "data=coco8.yaml", "device=cpu"])
    assert "does not download" in line
    with pytest.raises(DatasetError, match="does not download"):
        FastDetectionTrainer(overrides={"model": "yolo11n.yaml", "data": "coco8.yaml", "device": "cpu",
                                        "project": str(tmp_path / "runs")})
    assert not (tmp_path / "runs").exists()
    assert "nor a dataset yaml Ultralytics ships" in _one_line(capsys, ["pack", "data=no-such-set.yaml"])

    for split in ("train", "val"):  # coco8's layout, with the synthetic set's files
        for kind in ("images", "labels"):
            shutil.copytree(synth_root / kind / split, ultralytics_datasets / "coco8" / kind / split)
    assert main(["pack", "data=coco8.yaml", "imgsz=64", "workers=1"]) == 0
    out = capsys.readouterr().out
    packs = [Path(x.split("-> ", 1)[1]) for x in out.splitlines() if "-> " in x]
    assert len(packs) == 2 and all(p.is_file() and p.is_relative_to(tmp_path / "cache") for p in packs), out
    assert len(Pack.open(packs[0])) == 24


def test_the_help_examples_name_no_dataset_that_is_not_here():
    """The doctor's example was data=coco.yaml: a 20 GB download that yolofeed refuses to make."""
    from yolofeed.cli import COMMANDS

    assert not any("coco" in spec.example for spec in COMMANDS.values())


def test_a_wrong_train_path_is_said_before_anything_else(dataset, caplog, capsys):
    """A typo in the data yaml's train: path first logged "pack: format raw (auto): its raw packs (0.0 MB) fit ...",
    from an estimate that had left the split out, then refused the path. Now the path is the one line, naming
    its key."""
    from yolofeed.pack.rebuild import check_split

    yaml_file = dataset / "data.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("images/train", "images/trian"))
    with caplog.at_level(logging.INFO):
        line = _one_line(capsys, ["pack", f"data={yaml_file}", "imgsz=64"])
        with pytest.raises(DatasetError) as e:  # what yolofeed train checks before its run folder
            check_split(yaml_file, "train", 64, "auto", rebuild="auto")
    assert f"{yaml_file}: 'train:' '{dataset / 'images' / 'trian'}' does not exist" in line
    assert "'train:'" in str(e.value) and "trian" in str(e.value)
    assert "format" not in caplog.text and "fit" not in caplog.text
    # a split not packed now may be wrong (found by the full suite: an earlier fix refused splits=train here)
    yaml_file.write_text(yaml_file.read_text().replace("images/trian", "images/train").replace("images/val", "nope"))
    assert main(["pack", f"data={yaml_file}", "imgsz=64", "splits=train", "workers=1"]) == 0


def test_splits_naming_no_split_is_one_line(dataset, capsys):
    """``splits=,`` packed nothing and said nothing (exit 0)."""
    line = _one_line(capsys, ["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "splits=,"])
    assert "splits=,: names no split" in line and "splits=train,val" in line


@pytest.mark.parametrize("key, value, call", [
    ("pack_rebuild", "always", "with_options(pack_rebuild='always')"),
    ("pack_dir", "/fast/ssd", "with_options(pack_dir='/fast/ssd')"),
    ("val_period", 5, "with_options(val_period=5)"),
    ("augment_ahead", False, "with_options(augment_ahead=False)"),
    ("prometheus_port", 9400, "with_options(monitor={'prometheus_port': 9400})"),
    ("monitor", True, "with_options(monitor={})"),
])
def test_yolofeeds_own_keys_passed_to_ultralytics_train_say_where_they_go(synth_root, tmp_path, key, value, call):
    """``YOLO(...).train(trainer=FastDetectionTrainer, pack_rebuild="always")`` answered "'pack_rebuild' is not a key
    of 'yolofeed train'", which it is."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer
    from yolofeed.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        YOLO("yolo11n.yaml").train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"),
                                   project=str(tmp_path), **{key: value})
    assert str(e.value) == (f"'{key}' is a key of 'yolofeed train', not of Ultralytics' train(): from Python it goes "
                            f"through the trainer, YOLO(...).train(trainer=FastDetectionTrainer.{call}, ...)")
    assert not list(tmp_path.iterdir())  # refused before the run folder
    with pytest.raises(ConfigError, match="Did you mean 'pack_rebuild'"):  # a typo of one is still a typo
        YOLO("yolo11n.yaml").train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"),
                                   pack_rebiuld="always")


def test_data_a_mapping_or_a_list_from_python_is_one_line_before_the_run_folder(synth_root, tmp_path):
    """Ultralytics' trainer takes a path: a dict failed deep inside it (TypeError), and yolofeed said "'{...}' does
    not exist"."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer
    from yolofeed.errors import DatasetError
    from yolofeed.pack.source import load_data_yaml

    given = {"path": str(synth_root), "train": "images/train", "val": "images/val", "names": {0: "a"}}
    with pytest.raises(DatasetError, match=r"^data= takes the path of a data yaml, not a dict: write the dict to a "
                                           r"\.yaml file \(yaml\.safe_dump\) and pass that file's path$"):
        YOLO("yolo11n.yaml").train(trainer=FastDetectionTrainer, data=given, epochs=1, imgsz=64, device="cpu",
                                   project=str(tmp_path), name="dict")
    assert not (tmp_path / "dict").exists()
    with pytest.raises(DatasetError, match=r"\]: yolofeed trains on one dataset a run: run it once per data yaml"):
        load_data_yaml([str(synth_root / "data.yaml")] * 2)
    with pytest.raises(DatasetError, match=r"^data= takes the path of a data yaml; got None: pass "
                                           r"data=path/to/data\.yaml$"):
        load_data_yaml(None)


def test_a_dataset_of_other_than_3_channels_is_refused_with_what_to_do(synth_root, tmp_path):
    from yolofeed.errors import DatasetError
    from yolofeed.pack.source import load_data_yaml

    yaml_file = tmp_path / "gray.yaml"
    yaml_file.write_text((synth_root / "data.yaml").read_text() + "channels: 1\n")
    with pytest.raises(DatasetError, match=r"channels=1; yolofeed packs 3-channel \(RGB\) datasets only: train this "
                                           r"one with yolo train$"):
        load_data_yaml(yaml_file)


def test_a_stop_line_is_logged_or_left_to_the_caller_that_prints_it():
    """``say_stopped``: logged (the Python API); within ``caller_says_stops`` (the CLI) put on a yolofeed error for the
    caller's one line instead; another exception's (a traceback follows it) is logged even there, and so is one from
    a thread of its own (a notebook's training beside the CLI's)."""
    import threading

    from yolofeed.errors import WriteError, caller_says_stops, say_stopped, stop_line

    logged = []
    e = WriteError("could not write last.pt")
    say_stopped(e, "training stopped in epoch 2", logged.append)
    assert logged == ["training stopped in epoch 2"] and e.stopped is None and stop_line(e) is None
    with caller_says_stops():
        say_stopped(e, "training stopped in epoch 3", logged.append)
        say_stopped(RuntimeError("CUDA error"), "training stopped in epoch 4", logged.append)
        beside = threading.Thread(target=say_stopped, args=(WriteError("x"), "in a thread", logged.append))
        beside.start()
        beside.join()
    assert e.stopped == "training stopped in epoch 3" == stop_line(e)
    assert logged[1:] == ["training stopped in epoch 4", "in a thread"]
    say_stopped(WriteError("again"), "after", logged.append)  # the caller is gone: logged again
    assert logged[-1] == "after"
    try:  # a Ctrl-C during the stop's clean-up replaces the error: its line is found through the context
        try:
            raise e
        except WriteError:
            raise KeyboardInterrupt from None
    except KeyboardInterrupt as interrupt:
        assert stop_line(interrupt) == "training stopped in epoch 3"


@pytest.mark.parametrize("signal", [KeyboardInterrupt, "terminated"])
def test_a_ctrl_c_or_sigterm_during_a_stopped_trainings_clean_up_keeps_its_stop_line(synth_root, monkeypatch, capsys,
                                                                                      signal):
    """``yolofeed train`` stopped by an error, then interrupted while it closes (the signal deferred to the clean-up's
    end replaces the error): stderr says the stop line, with the resume, then that it was interrupted, without the
    resume again."""
    from yolofeed import processes
    from yolofeed.errors import WriteError, say_stopped
    from yolofeed.train import run

    def stopped_then_interrupted(config):
        try:
            raise WriteError("could not write last.pt: the disk is full")
        except WriteError as e:
            say_stopped(e, "training stopped in epoch 2 by WriteError: could not write last.pt: the disk is full. "
                           "The last epoch saved is in w/last.pt; once the cause is fixed, continue with: yolofeed "
                           "train resume=w/last.pt", logging.getLogger("never").error)
            said = "the last epoch saved is in w/last.pt; continue with: yolofeed train resume=w/last.pt"
            raise (KeyboardInterrupt(said) if signal is KeyboardInterrupt  # noqa: B904 - as train/run.py raises it
                   else processes.Terminated(f"stopped by SIGTERM; {said}"))

    monkeypatch.setattr(run, "run", stopped_then_interrupted)
    assert main(["train", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}"]) in (130, 143)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("yolofeed train: error: training stopped in epoch 2") and "resume=w/last.pt" in err[0]
    assert err[1:] == ["yolofeed train: interrupted" if signal is KeyboardInterrupt
                       else "yolofeed train: stopped by SIGTERM"], err  # the resume said once, on the line before


def test_another_commands_training_logs_its_own_stop_line(synth_root, monkeypatch, capsys, caplog):
    """``yolofeed bench`` (a training in its own process, or in-process with isolate=False): its error line is the
    cause alone, whether the training logged its stop line (which names yolofeed train's resume) or kept it on the
    error (the whole run's, which logs none)."""
    from yolofeed.bench import run as bench_run
    from yolofeed.errors import WriteError, say_stopped

    def stopped(config):
        e = WriteError("could not write last.pt: the disk is full")
        say_stopped(e, "training stopped ... continue with: yolofeed train resume=w/last.pt",
                    logging.getLogger("yolofeed-test").error)
        raise e

    def stopped_in_a_whole_run(config):  # bench's whole run keeps the line on the error (bench/whole.py)
        from yolofeed.errors import caller_says_stops

        with caller_says_stops():
            stopped(config)

    for run, said in ((stopped, True), (stopped_in_a_whole_run, False)):
        monkeypatch.setattr(bench_run, "run", run)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="yolofeed-test"):
            assert main(["bench", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}"]) == 1
        assert capsys.readouterr().err.strip() == "yolofeed bench: error: could not write last.pt: the disk is full"
        assert ("continue with: yolofeed train resume" in caplog.text) is said
