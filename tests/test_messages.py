"""Messages that were unclear or wrong: each says what the problem is, in the user's words, with the fix.

RELIABILITY.md lists these tests with what each message said before.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import struct

import pytest

from yolofeed.cli import main
from yolofeed.doctor.rules import Facts, diagnose
from yolofeed.errors import PackError
from yolofeed.pack import Pack, open_or_build
from yolofeed.pack.store import TRAILER


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
    assert "a list of data yamls" in line and "one dataset at a time" in line


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
    from yolofeed.pack.build import store_dir

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
