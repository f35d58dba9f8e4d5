"""When a pack is reused, refused or rebuilt (pack/rebuild.py), and the checks before a run starts.

Stale sources, a label edited to the same size and time (``rebuild=check``), a malformed or newer pack, packs that
do not fit the free space (alone or together), a lock that is not yolofeed's, skipped images and a split with no
labels said when a pack is built or reused. RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import VICTIM, Free, cli_lines, craft_pack
from helpers import planted_folder as _folder
from yolofeed.cli import build_config, main
from yolofeed.errors import DatasetError, ForeignPackError, PackError, PackSpaceError, StalePackError
from yolofeed.pack import Pack, command, disk, open_or_build, rebuild, source, space
from yolofeed.pack.paths import store_dir
from yolofeed.pack.rebuild import ensure_split


def _build(root: Path, imgsz: int = 64, workers: int = 1, **kw) -> Pack:
    return open_or_build(root / "data.yaml", "train", imgsz, rebuild="auto", workers=workers, progress=False, **kw)


def test_reused_when_fresh_refused_or_rebuilt_when_stale(dataset):
    yaml_file = dataset / "data.yaml"
    first = ensure_split(yaml_file, "train", 160, rebuild="auto", progress=False)
    assert first.built
    again = ensure_split(yaml_file, "train", 160, rebuild="auto", progress=False)
    assert not again.built and again.pack.header["created"] == first.pack.header["created"]

    # a changed source file is detected; the message names the rebuild command
    lb = sorted((dataset / "labels" / "train").glob("*.txt"))[3]
    lb.write_text("0 0.5 0.5 0.5 0.5\n")
    with pytest.raises(StalePackError, match=r"source images or labels changed.*yolofeed pack data=.* imgsz=160"):
        open_or_build(yaml_file, "train", 160)
    rebuilt = ensure_split(yaml_file, "train", 160, rebuild="auto", progress=False)
    assert rebuilt.built
    np.testing.assert_array_equal(rebuilt.pack.labels(3), [[0, 0.5, 0.5, 0.5, 0.5]])

    # a pack of another imgsz where this one belongs (moved there by hand: each size has a folder of its own) is
    # refused with a message naming both sizes
    built = store_dir(yaml_file, 160, "raw") / "train.yfpack"
    moved = store_dir(yaml_file, 320, "raw") / "train.yfpack"
    moved.parent.mkdir()
    shutil.copy(built, moved)
    with pytest.raises(StalePackError, match="built for imgsz=160, this run asks for imgsz=320.*imgsz=320"):
        open_or_build(yaml_file, "train", 320)
    # another split's pack copied under this one's name is named as such, not as changed sources
    shutil.copy(built, built.with_name("val.yfpack"))
    with pytest.raises(StalePackError, match=r"val\.yfpack is stale: it is the train split's pack, not the val "
                                             r"split's \(a file copied or renamed\?\); rebuild it with"):
        open_or_build(yaml_file, "val", 160)
    built.with_name("val.yfpack").unlink()
    # a pack of another dataset of the same name, in a shared out=, is named as such
    other = dataset / "other" / "data.yaml"
    other.parent.mkdir()
    other.write_text((dataset / "data.yaml").read_text())
    out = dataset / "shared"
    store_dir(yaml_file, 160, "raw", out).mkdir(parents=True)
    shutil.copy(built, store_dir(yaml_file, 160, "raw", out) / "train.yfpack")
    foreign = store_dir(yaml_file, 160, "raw", out) / "train.yfpack"
    with pytest.raises(ForeignPackError, match=r"was built from .*ds/data.yaml, not from .*other/data.yaml"):
        Pack.open(foreign, {"data": str(other)})
    # ... and left to it: the other yaml's pack goes to a folder of its own there (tests/pack/test_paths.py)
    with pytest.raises(PackError, match=r"shared/data-[0-9a-f]{12}-raw-160/train.yfpack does not exist.*out="):
        open_or_build(other, "train", 160, out=out)
    # missing pack with rebuild=never
    with pytest.raises(PackError, match="does not exist.*yolofeed pack"):
        open_or_build(yaml_file, "val", 160)


def test_a_stale_pack_names_what_changed(dataset, caplog, monkeypatch):
    """The fingerprint says only that something changed; the pack records each source file's size and time, so the
    refusal (and rebuild=auto's line) names the files: added, removed, another size, the time alone, a label file
    created or deleted. A pack without that record is stale all the same, said without names."""
    yaml_file = dataset / "data.yaml"
    assert ensure_split(yaml_file, "train", 64, rebuild="auto", workers=1, progress=False).built
    src = source.split_source(yaml_file, "train")
    images, labels = [Path(f) for f in src.im_files], [Path(f) for f in src.label_files]
    shutil.copy(images[0], images[0].with_name("added.jpg"))
    images[1].unlink()
    labels[2].write_text(labels[2].read_text() + "0 0.5 0.5 0.1 0.1\n")
    st = images[3].stat()
    os.utime(images[3], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    labels[4].unlink()

    def refusal() -> str:
        with pytest.raises(StalePackError) as e:
            open_or_build(yaml_file, "train", 64)
        return str(e.value)

    def rel(p: Path) -> str:
        return str(p.relative_to(dataset))

    said = refusal()
    assert (f"is stale: the source images or labels changed since it was built (1 image added: "
            f"{rel(images[0].with_name('added.jpg'))}; 1 image removed: {rel(images[1])}; 1 file deleted: "
            f"{rel(labels[4])}; 1 file of another size: {rel(labels[2])}; 1 file of the same size with another "
            f"modification time (edited, touched, or copied without their times): {rel(images[3])}); rebuild it "
            "with: yolofeed pack") in said, said
    held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")]
    assert not any(h.endswith("train.yfpack") for h in held), held  # refused: its map and file not kept for a GC

    calls = []
    stats = source.SplitSource.stats

    def counted(self):
        calls.append(1)
        return stats(self)

    monkeypatch.setattr(source.SplitSource, "stats", counted)
    with caplog.at_level(logging.INFO):
        assert ensure_split(yaml_file, "train", 64, rebuild="auto", workers=1, progress=False).built
    assert "1 image added" in caplog.text and "rebuilding it" in caplog.text
    rebuilt = next(r.getMessage() for r in caplog.records if "rebuilding it" in r.getMessage())
    assert "rebuild it with" not in rebuilt and rebuilt.endswith("train_000003.jpg); rebuilding it")  # no command
    assert len(calls) == 2  # one stat of every file for the look at the pack (and its message), one for the build
    monkeypatch.undo()

    # many changes: two names a kind, then a count; a label file created
    for f in [Path(f) for f in source.split_source(yaml_file, "train").im_files][:5]:
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    labels[4].write_text("0 0.5 0.5 0.2 0.2\n")
    said = refusal()
    assert re.search(r"\(1 file created: [^;]+; 5 files of the same size [^:]*: [^,;]+\.jpg, [^,;]+\.jpg, \.\.\.\);",
                     said), said
    assert f"1 file created: {rel(labels[4])}" in said

    # a pack written before the record: the same refusal, without names
    pack = ensure_split(yaml_file, "train", 64, rebuild="auto", workers=1, progress=False).pack
    assert pack.sources()[0] == list(source.split_source(yaml_file, "train").im_files)
    craft_pack(pack.path, pack.path, header=lambda h: {**h, "sections": {k: v for k, v in h["sections"].items()
                                                                         if not k.startswith("source_")}})
    assert Pack.open(pack.path).sources() is None
    labels[4].unlink()
    assert re.search(r"is stale: the source images or labels changed since it was built; rebuild it with", refusal())

    # the fingerprint's other input, which a detection pack's header does not hold: said as such
    ensure_split(yaml_file, "train", 64, rebuild="auto", workers=1, progress=False)
    yaml_file.write_text(yaml_file.read_text() + "kpt_shape: [5, 3]\n")
    assert ("since it was built (no image or label file changed its size or time: the yaml's kpt_shape, which the "
            "fingerprint counts, did); rebuild it") in refusal()


def test_a_malformed_header_is_rebuilt_not_a_key_error(dataset, caplog):
    pack = _build(dataset)
    craft_pack(pack.path, pack.path, header=lambda x: {k: v for k, v in x.items() if k != "split"})
    with pytest.raises(PackError, match="header key 'split' is missing"):
        open_or_build(dataset / "data.yaml", "train", 64, rebuild="never")
    with caplog.at_level(logging.INFO):
        r = ensure_split(dataset / "data.yaml", "train", 64, rebuild="auto", workers=1, progress=False)
    assert r.built and r.pack.split == "train" and "rebuilding it" in caplog.text


def test_a_pack_from_a_newer_yolofeed_is_named_before_it_is_rebuilt(dataset, caplog):
    """A pack of format 3 was rebuilt by rebuild=auto with an info line, "has pack format 3". Now it is said to be a
    newer yolofeed's: refused by rebuild=never, a warning before rebuild=auto replaces it."""
    from yolofeed.errors import NewerPackError

    pack = _build(dataset)
    craft_pack(pack.path, pack.path, header=lambda h: {**h, "format_version": 3, "yolofeed_version": "9.0.0"})
    words = rf"{pack.path} was built by a newer yolofeed \(9.0.0, pack format 3\); this yolofeed \(.*\) reads format 2"
    with pytest.raises(NewerPackError, match=words + ".*rebuild it with: yolofeed pack"):
        open_or_build(dataset / "data.yaml", "train", 64, rebuild="never")
    rc, lines = cli_lines(["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "splits=train", "rebuild=never"])
    assert rc == 1 and len(lines) == 1 and "built by a newer yolofeed (9.0.0, pack format 3)" in lines[0], lines
    with caplog.at_level(logging.INFO):
        assert ensure_split(dataset / "data.yaml", "train", 64, rebuild="auto", workers=1, progress=False).built
    newer = [r for r in caplog.records if "newer yolofeed" in r.getMessage()]
    assert newer and newer[0].levelno == logging.WARNING and "rebuilding it" in newer[0].getMessage()


# -- a label file edited behind the fingerprint's back -----------------------------------------------------------------
def test_label_edited_to_the_same_size_and_time_needs_rebuild_check(dataset, caplog):
    from ultralytics.data.utils import get_hash

    yaml_file = dataset / "data.yaml"
    assert ensure_split(yaml_file, "train", 64, rebuild="auto", workers=1, progress=False).built
    src = source.split_source(yaml_file, "train")
    lb = Path(src.label_files[2])
    st, text = lb.stat(), lb.read_text()
    cls = int(text.split()[0])
    edited = f"{(cls + 1) % 10}{text[len(str(cls)):]}" if cls < 10 else f"{cls - 1}{text[len(str(cls)):]}"
    before = get_hash(list(src.label_files) + list(src.im_files))
    lb.write_text(edited)
    os.utime(lb, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert lb.stat().st_size == st.st_size and lb.read_text() != text
    # Ultralytics' label cache keeps its old labels here; so does the default rule, which is the same
    assert get_hash(list(src.label_files) + list(src.im_files)) == before
    assert not ensure_split(yaml_file, "train", 64, rebuild="auto", progress=False).built
    with pytest.raises(StalePackError, match=rf"1 label file\(s\) changed content .*{lb.name}.*rebuild it with"):
        rebuild._open_checked(store_dir(yaml_file, 64, "raw") / "train.yfpack", {}, "rebuild it with ...", src,
                              "check", False)
    with caplog.at_level(logging.INFO):
        r = ensure_split(yaml_file, "train", 64, rebuild="check", workers=1, progress=False)
    assert r.built and "changed content" in caplog.text
    i = r.pack.im_files.index(src.im_files[2])
    assert int(r.pack.labels(i)[:, 0].min()) != int(r.pack.labels(i)[:, 0].max()) or \
        sorted(r.pack.labels(i)[:, 0].tolist()) != sorted([cls] * len(r.pack.labels(i)))
    assert not ensure_split(yaml_file, "train", 64, rebuild="check", progress=False).built  # up to date now
    assert build_config("pack", ["data=x.yaml", "rebuild=check"]).rebuild == "check"
    assert build_config("train", ["data=x.yaml", "model=m.yaml", "pack_rebuild=check"]).pack_rebuild == "check"


# -- the checks before a run: free space, the lock file ----------------------------------------------------------------
def test_a_pack_that_cannot_fit_is_refused_by_the_pre_run_check_too(dataset):
    """``check_split`` runs in a DDP launcher before any rank: the space error must come from there, with its type
    (the bench adds its jpeg hint to a PackSpaceError), and nothing may be created."""
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    with (disk.using(Free(10**5)),
          pytest.raises(PackSpaceError, match=f"not enough free space for the train pack in {folder}: ")):
        rebuild.check_split(dataset / "data.yaml", "train", 64, "raw", rebuild="auto")  # where the build would put it
    assert not folder.exists()
    rebuild.check_split(dataset / "data.yaml", "train", 64, "raw", rebuild="auto")  # room: nothing to say


def test_packs_that_fit_one_at_a_time_but_not_together_are_refused_before_the_first(dataset, tmp_path, capsys):
    """Room for the train pack and for the val pack, not for both: checked one at a time, the val pack failed for want
    of room after the train pack was written (and after the run folder and the model). Now ``yolofeed pack``, the
    trainer's pre-run check (through the CLI) and ``FastDetectionTrainer`` itself refuse it first, nothing written."""
    from yolofeed.pack.source import load_data_yaml, split_source
    from yolofeed.train import FastDetectionTrainer

    d = load_data_yaml(dataset / "data.yaml")
    need = {s: space.estimate_bytes(split_source(d, s), 64, "raw") for s in ("train", "val")}
    free = max(need.values()) + (min(need.values()) // 2)  # either alone fits, the two do not
    with disk.using(Free(free)):
        folder = store_dir(dataset / "data.yaml", 64, "raw")
        message = (rf"not enough free space for the train and val packs in {folder}: together they need [\d.]+ [MK]B "
                   rf"\({sum(need.values()):,} bytes: train [\d.]+ [MK]B, val [\d.]+ [MK]B\), [\d.]+ [MK]B \({free:,} "
                   r"bytes\) are free\. Free some space, or put the packs on a disk with room")
        with pytest.raises(PackSpaceError, match=message):
            rebuild.check_splits(dataset / "data.yaml", ("train", "val"), 64, "raw", rebuild="auto")
        rebuild.check_split(dataset / "data.yaml", "val", 64, "raw", rebuild="auto")  # alone it fits: nothing to say
        with pytest.raises(PackSpaceError, match=message):
            command.run(build_config("pack", [f"data={dataset / 'data.yaml'}", "imgsz=64", "format=raw", "workers=1"]))
        assert not folder.exists()  # no train pack written first
        runs = tmp_path / "runs"
        assert main(["train", "model=yolo11n.yaml", f"data={dataset / 'data.yaml'}", "imgsz=64", "pack_format=raw",
                     "device=cpu", f"project={runs}"]) == 1
        assert re.search(message, capsys.readouterr().err)
        with pytest.raises(PackSpaceError, match=message):
            FastDetectionTrainer.with_options(pack_format="raw")(overrides={"model": "yolo11n.yaml", "imgsz": 64,
                                                                "data": str(dataset / "data.yaml"), "device": "cpu",
                                                                "project": str(runs)})
    assert not runs.exists() and not folder.exists()


def test_yolofeed_train_refuses_a_lock_that_is_not_yolofeeds_before_the_run_folder(dataset, tmp_path):
    """The pack is built after Ultralytics made the run folder and the model: the check before them (``check_split``,
    in the trainer's ``__init__``) looks at the lock file a build would take, as it looks at the free space."""
    from yolofeed.train import FastDetectionTrainer

    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    (_folder(yaml_file, out) / ".lock").symlink_to(victim)
    overrides = dict(model="yolo11n.yaml", data=str(yaml_file), imgsz=64, device="cpu", project=str(tmp_path / "runs"),
                     name="r")
    with pytest.raises(PackError, match=r"\.lock is a symbolic link to .*its build lock"):
        FastDetectionTrainer.with_options(pack_dir=str(out), pack_format="raw")(overrides=overrides)
    assert not (tmp_path / "runs").exists() and victim.read_bytes() == VICTIM


# -- messages: skipped images on first use, no labels at all -----------------------------------------------------------
def test_first_use_build_says_which_images_were_skipped_and_why(dataset, caplog):
    (dataset / "images" / "train" / "zero.jpg").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        _build(dataset)
    assert "zero.jpg: empty file (0 bytes)" in caplog.text and "HEIC" not in caplog.text
    assert "train.report.txt" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _build(dataset)  # reused: still said, in one line, as Ultralytics repeats its cache's warnings
    assert "1 image(s) were skipped when it was built (1x empty file (0 bytes)" in caplog.text
    assert "train.report.txt" in caplog.text and "more" not in caplog.text


def test_a_reused_packs_reminder_names_three_reasons_and_counts_the_rest(dataset, caplog):
    """Six images skipped for five reasons: the commonest three named, the other two images counted, not dropped."""
    train = dataset / "images" / "train"
    for name in ("zero.jpg", "zero2.jpg"):
        (train / name).write_bytes(b"")
    for name, text in (("a", "0 0.5 0.5 0.2\n0 0.5 0.5 0.2 0.2\n"), ("b", "word 0.5 0.5 0.2 0.2\n"),
                       ("c", "0 0.5 0.5 2 0.2\n"), ("d", "99 0.5 0.5 0.2 0.2\n")):
        shutil.copy(next(train.glob("*.jpg")), train / f"{name}.jpg")
        (dataset / "labels" / "train" / f"{name}.txt").write_text(text)
    _build(dataset)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _build(dataset)
    said = next(r.getMessage() for r in caplog.records if "skipped when it was built" in r.getMessage())
    assert said.startswith("pack train: 6 image(s) were skipped when it was built (2x empty file (0 bytes)")
    assert said.count("x ") >= 3 and "; and 2 more); full list: " in said, said


def test_a_reused_packs_reminder_counts_one_mistake_in_many_files_once(dataset, caplog):
    """Class ids beyond the yaml's names in every label file: the reminder said "1x ...; 1x ...; 1x ...; and 16 more";
    now one reason with its count."""
    labels = sorted((dataset / "labels" / "train").glob("*.txt"))[:5]
    for i, lb in enumerate(labels):
        lb.write_text(f"{400 + i} 0.5 0.5 0.2 0.2\n")
    _build(dataset)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _build(dataset)
    said = next(r.getMessage() for r in caplog.records if "skipped when it was built" in r.getMessage())
    assert f"(5x, the first: {labels[0]} uses class 400 but the data yaml has nc=" in said, said
    assert "more" not in said, said


def test_a_refused_packs_message_said_before_its_rebuild_drops_the_command():
    from yolofeed.pack.rebuild import without_fix

    fix = "rebuild it with: yolofeed pack data=d.yaml imgsz=64 rebuild=always"
    assert without_fix(f"p is stale: 1 image added; {fix}", fix) == "p is stale: 1 image added"
    assert without_fix(f"p was built by yolofeed 9: {fix}", fix) == "p was built by yolofeed 9"
    assert without_fix(f"p is damaged (x again), or {fix}", fix) == "p is damaged (x again)"
    assert without_fix("p is stale: another imgsz", fix) == "p is stale: another imgsz"


def test_no_labels_folder_warns_at_pack_time_and_training_refuses(dataset, tmp_path, caplog):
    from yolofeed import FastDetectionTrainer

    shutil.rmtree(dataset / "labels")
    with caplog.at_level(logging.WARNING):
        pack = open_or_build(dataset / "data.yaml", "val", 64, rebuild="auto", workers=1, progress=False)
    assert len(pack) == 8
    assert f"No labels found in {dataset / 'labels' / 'val'}" in caplog.text
    assert "training may not work correctly" in caplog.text
    with pytest.raises(DatasetError, match=f"No labels found in {dataset / 'labels' / 'train'}.*Ultralytics refuses "
                                           "to train on such a split"):  # before the run folder and the train pack
        FastDetectionTrainer(overrides=dict(model="yolo11n.yaml", data=str(dataset / "data.yaml"), imgsz=64,
                                            device="cpu", project=str(tmp_path), name="nolabels", plots=False,
                                            exist_ok=True))
    assert not (tmp_path / "nolabels").exists()


def test_pose_and_detection_packs_of_one_yaml_are_kept_apart_and_refuse_each_other(pose_dataset, capsys):
    """A pose yaml packs for both tasks, each in its own folder, and each is reused; a detection pack where the pose
    pack belongs (put there by hand) is refused, naming both tasks and the command with task=pose, and rebuilt under
    rebuild=auto; another kpt_shape in the yaml rebuilds the pose pack; a missing one names task=pose."""
    yaml_file = pose_dataset / "data.yaml"
    with pytest.raises(PackError, match=r"does not exist.*yolofeed pack data=\S+ imgsz=64 format=raw task=pose"):
        open_or_build(yaml_file, "train", 64, "raw", task="pose")
    assert main(["pack", f"data={yaml_file}", "imgsz=64", "format=raw", "splits=train", "task=pose"]) == 0
    assert "up to date" not in capsys.readouterr().out
    pose = ensure_split(yaml_file, "train", 64, "raw", rebuild="auto", progress=False, task="pose")
    plain = ensure_split(yaml_file, "train", 64, "raw", rebuild="auto", progress=False)
    assert not pose.built and plain.built and pose.pack.path.parent != plain.pack.path.parent
    assert ensure_split(yaml_file, "train", 64, "raw", rebuild="never", task="pose").pack.task == "pose"
    assert not ensure_split(yaml_file, "train", 64, "raw", rebuild="auto", progress=False).built

    where = store_dir(yaml_file, 64, "raw", task="pose") / "train.yfpack"
    assert where == pose.pack.path
    shutil.copy(plain.pack.path, where)
    with pytest.raises(StalePackError) as e:
        open_or_build(yaml_file, "train", 64, "raw", task="pose")
    text = str(e.value)
    assert "it was built for task=detect, this run asks for task=pose" in text and "\n" not in text
    assert text.endswith(f"yolofeed pack data={yaml_file} imgsz=64 format=raw task=pose rebuild=always"), text
    again = ensure_split(yaml_file, "train", 64, "raw", rebuild="auto", progress=False, task="pose")
    assert again.built and again.pack.task == "pose"
    shutil.copy(again.pack.path, plain.pack.path)  # and the other way round
    with pytest.raises(StalePackError, match="built for task=pose, this run asks for task=detect.*format=raw rebui"):
        open_or_build(yaml_file, "train", 64, "raw")

    text = yaml_file.read_text().replace("- 5\n- 3\n", "- 5\n- 2\n", 1)  # kpt_shape [5, 2]: rows are 15 columns
    yaml_file.write_text(text)
    with pytest.raises(StalePackError, match="source images or labels changed"):
        open_or_build(yaml_file, "train", 64, "raw", task="pose")
    with pytest.raises(DatasetError, match=r"(?s)16 tried.*rows have 20 columns; pose labels require 15 columns each"):
        ensure_split(yaml_file, "train", 64, "raw", rebuild="auto", progress=False, task="pose")


def test_obb_and_detection_packs_of_one_yaml_are_kept_apart_and_refuse_each_other(obb_dataset):
    """An OBB yaml packs for task=obb in <stem>-<format>-<imgsz>-obb; a detection pack put where it belongs is
    refused, naming both tasks and the command with task=obb, and rebuilt under rebuild=auto; a detection build of
    the same yaml reads its 9-column rows as polygons, their boxes (Ultralytics' detect task does so too)."""
    yaml_file = obb_dataset / "data.yaml"
    with pytest.raises(PackError, match=r"does not exist.*yolofeed pack data=\S+ imgsz=64 format=raw task=obb"):
        open_or_build(yaml_file, "train", 64, "raw", task="obb")
    assert main(["pack", f"data={yaml_file}", "imgsz=64", "format=raw", "splits=train", "task=obb"]) == 0
    obb = ensure_split(yaml_file, "train", 64, "raw", rebuild="auto", progress=False, task="obb")
    plain = ensure_split(yaml_file, "train", 64, "raw", rebuild="auto", progress=False)
    assert not obb.built and plain.built and obb.pack.path.parent.name == plain.pack.path.parent.name + "-obb"
    np.testing.assert_array_equal(obb.pack.label_table, plain.pack.label_table)
    where = store_dir(yaml_file, 64, "raw", task="obb") / "train.yfpack"
    assert where == obb.pack.path
    shutil.copy(plain.pack.path, where)
    with pytest.raises(StalePackError) as e:
        open_or_build(yaml_file, "train", 64, "raw", task="obb")
    text = str(e.value)
    assert "it was built for task=detect, this run asks for task=obb" in text and "\n" not in text
    assert text.endswith(f"yolofeed pack data={yaml_file} imgsz=64 format=raw task=obb rebuild=always"), text
    again = ensure_split(yaml_file, "train", 64, "raw", rebuild="auto", progress=False, task="obb")
    assert again.built and again.pack.task == "obb"
