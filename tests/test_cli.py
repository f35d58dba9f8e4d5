"""The command line: every command and key is listed, bad arguments are explained."""

from __future__ import annotations

import subprocess
import sys

import pytest

from yolofeed.cli import COMMANDS, build_config, help_text, main
from yolofeed.config import fields_of
from yolofeed.errors import ConfigError


def test_help_lists_every_command_and_key(capsys):
    for argv in (["help"], ["--help"], []):
        assert main(argv) == 0
        out = capsys.readouterr().out
        for name, spec in COMMANDS.items():
            assert f"  {name} " in out
            for f in fields_of(spec.config):  # every key (not the field the parser fills itself, config.typed)
                if not f.metadata.get("passthrough"):
                    assert f"{f.name}=" in out, (name, f.name)


def test_command_help_shows_only_that_command(capsys):
    assert main(["pack", "help"]) == 0
    out = capsys.readouterr().out
    assert "data=" in out and "n_train=" not in out


def test_values_are_typed_like_ultralytics():
    cfg = build_config("pack", ["data=x.yaml", "imgsz=320", "format=jpeg", "out=None"])
    assert (cfg.data, cfg.imgsz, cfg.format, cfg.out) == ("x.yaml", 320, "jpeg", None)


def test_a_key_typed_twice_takes_its_last_value_as_ultralytics_cli():
    """``yolo train epochs=3 epochs=6`` trains 6 epochs; ``yolofeed doctor steps=-1 steps=6`` refused the -1 it would
    not use. The last value counts, of yolofeed's keys and of Ultralytics'; a bad last value is still refused."""
    cfg = build_config("doctor", ["data=x.yaml", "steps=-1", "steps=6", "lr0=x", "lr0=0.02"])
    assert cfg.steps == 6 and cfg.extra == {"lr0": 0.02}
    with pytest.raises(ConfigError, match="steps=-1"):
        build_config("doctor", ["data=x.yaml", "steps=6", "steps=-1"])


def test_words_around_a_lone_equals_sign_and_a_split_list_are_one_word_as_ultralytics_cli():
    """``yolo train epochs = 1`` trains one epoch (its ``merge_equals_args``); yolofeed said "'epochs' is not
    key=value". Each spacing is read as there, of yolofeed's keys and Ultralytics'; an unmatched bracket is one line."""
    for words in (["epochs", "=", "3"], ["epochs=", "3"], ["epochs", "=3"]):
        assert build_config("train", ["model=yolo11n.yaml", "data=x.yaml", *words]).extra == {"epochs": 3}
    cfg = build_config("train", ["model=yolo11n.yaml", "data=x.yaml", "imgsz=[64,", "96]", "val_period", "=", "2"])
    assert cfg.extra == {"imgsz": [64, 96]} and cfg.val_period == 2
    with pytest.raises(ConfigError, match=r"unmatched '\[' or '\]' bracket: close the list \(imgsz=\[640,480\]\)"):
        build_config("train", ["model=yolo11n.yaml", "data=x.yaml", "imgsz=[64,"])
    # a bracket that opens no list (a legal folder name) is the value as typed, as before
    cfg = build_config("train", ["model=yolo11n.yaml", "data=/d/set[old/data.yaml", "name=a[1", "project=]"])
    assert cfg.data == "/d/set[old/data.yaml" and cfg.extra == {"name": "a[1", "project": "]"}


@pytest.mark.parametrize("command, key", [("doctor", "val_period=2"), ("bench", "pack_dir=/tmp/p"),
                                          ("parity", "monitor=True")])
def test_a_key_of_yolofeed_train_given_to_another_command_says_whose_it_is(command, key):
    """``yolofeed doctor val_period=2`` said "Did you mean 'save_period'?", and bench's ``pack_dir=`` "'save_dir'?":
    not a typo, a key of another command (found by a hostile pass)."""
    with pytest.raises(ConfigError) as e:
        build_config(command, ["model=yolo11n.yaml", "data=x.yaml", key])
    name = key.split("=")[0]
    assert str(e.value) == (f"'{name}' is a key of 'yolofeed train', not of 'yolofeed {command}'; "
                            f"'yolofeed {command} help' lists its keys.")


@pytest.mark.parametrize("args, words", [
    (["data=x.yaml", "imgsize=320"], ["imgsize", "Did you mean 'imgsz'"]),
    (["data=x.yaml", "imgsz=big"], ["imgsz=big: expected a whole number"]),
    (["data=x.yaml", "imgsz=[640,480]"], ["imgsz=[640,480]: expected a whole number"]),  # was Python's "invalid
    # literal for int() with base 10"
    (["data=x.yaml", "format=png"], ["raw", "jpeg"]),
    (["imgsz=320"], ["needs data="]),
    (["data"], ["not key=value"]),
])
def test_bad_arguments_say_what_to_do(args, words):
    with pytest.raises(ConfigError) as e:
        build_config("pack", args)
    for w in words:
        assert w in str(e.value)


def test_errors_exit_nonzero_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "yolofeed", "pack", f"data={tmp_path}/nope.yaml"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "nope.yaml" in r.stderr and "not found" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "yolofeed", "pakc"], capture_output=True, text=True)
    assert r.returncode == 2 and "Did you mean 'pack'" in r.stderr


def test_help_text_does_not_import_torch():
    code = "import sys, yolofeed.cli as c; c.help_text(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert "synth" in help_text()


# a command stopped by Ctrl-C that left a thread a bounded wait gave up on (here one that never ends: the interpreter's
# exit would wait for it for ever, where one inside torch aborts it)
LEFT = """
import sys, threading, time
import yolofeed.synth
from yolofeed import processes
from yolofeed.cli import entry

def run(config):
    threading.Thread(target=time.sleep, args=(600,), name="yolofeed-loader").start()
    processes.left_running("the loader thread")
    raise {raised}

yolofeed.synth.run = run
sys.argv = ["yolofeed", "synth", "out=" + sys.argv[1]]
sys.exit(entry())
"""


@pytest.mark.parametrize("raised, code, said", [
    ("KeyboardInterrupt", 130, "yolofeed synth: interrupted"),
    ("RuntimeError('a failure main does not say')", 1, "RuntimeError: a failure main does not say"),
    ("processes.Terminated()", 143, "yolofeed synth: stopped by SIGTERM")])
def test_a_command_that_left_a_thread_running_ends_the_process_with_its_code(tmp_path, raised, code, said):
    out = subprocess.run([sys.executable, "-c", LEFT.format(raised=raised), str(tmp_path / "s")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == code, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-2:] == [
        said, "yolofeed: the loader thread did not stop; ending the process now"]


@pytest.mark.parametrize("said", ["", "stopped by SIGTERM with 1 of 4 runs finished: no verdict"])
def test_a_command_stopped_by_sigterm_says_so_in_one_line_and_exits_143(monkeypatch, capsys, tmp_path, said):
    import yolofeed.synth
    from yolofeed import processes

    def run(config):
        raise processes.Terminated(said)

    monkeypatch.setattr(yolofeed.synth, "run", run)
    assert main(["synth", f"out={tmp_path / 's'}"]) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"yolofeed synth: {said or 'stopped by SIGTERM'}"
