"""One sample checked and decoded with Ultralytics' rules (pack/verify.py): the same pixels and labels as
Ultralytics, bad samples skipped as it skips them with the reason reported, and files that are not images (a FIFO,
a folder, a link loop, a text file named .jpg) each with its own reason, never a hang. RELIABILITY.md lists these
tests with their outcomes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import BAD_CASES, add_bad_samples, copy_dataset, kept, ultralytics_dataset
from yolofeed.pack import Pack, open_or_build
from yolofeed.pack.paths import store_dir
from yolofeed.pack.rebuild import ensure_split
from yolofeed.pack.report import read_report
from yolofeed.pack.summary import summary
from yolofeed.pack.verify import SampleError, check_image, read_labels
from yolofeed.ultralytics_seam import LABEL_RULE_SETS, LABEL_RULES


def _build(root: Path, split="train", imgsz=160, storage="raw", workers=2, **kw) -> Pack:
    return open_or_build(root / "data.yaml", split, imgsz, storage, rebuild="auto", workers=workers,
                         progress=False, **kw)


@pytest.mark.parametrize("imgsz", [160, 100, 320])  # shrink, odd sizes (ceil), enlarge
def test_pixels_equal_ultralytics_load_image(dataset, imgsz):
    pack = _build(dataset, imgsz=imgsz)
    ref = ultralytics_dataset(dataset / "data.yaml", "train", imgsz)
    assert pack.im_files == ref.im_files
    for i in range(len(pack)):
        bgr, hw0, hw = ref.load_image(i)
        np.testing.assert_array_equal(pack.image(i), bgr[..., ::-1])  # exact: same decoder, same resize
        assert tuple(pack.ori_shapes[i]) == hw0 and tuple(pack.shapes[i]) == hw


def test_labels_equal_ultralytics_label_cache(dataset):
    pack = _build(dataset, split="val")
    ref = ultralytics_dataset(dataset / "data.yaml", "val", 160)
    assert len(pack) == len(ref.labels) == 8
    for i, lb in enumerate(ref.labels):
        assert pack.im_files[i] == lb["im_file"]
        np.testing.assert_array_equal(pack.labels(i)[:, :1], lb["cls"])
        np.testing.assert_array_equal(pack.labels(i)[:, 1:], lb["bboxes"])
        assert tuple(pack.ori_shapes[i]) == lb["shape"]
    assert pack.header["counts"]["boxes"] == sum(len(lb["cls"]) for lb in ref.labels)


def test_duplicate_labels_are_ultralytics_duplicates_for_polygons_too(dataset):
    """Two different polygons of one class with the same box are two labels in Ultralytics' YOLODataset (it compares
    polygons, not boxes); the pack made them one. A polygon given twice is one in both, in Ultralytics' order."""
    lb_file = sorted((dataset / "labels" / "val").glob("*.txt"))[0]
    square = "0.2 0.2 0.6 0.2 0.6 0.6 0.2 0.6"  # a square, and a diamond with the same box
    diamond = "0.4 0.2 0.6 0.4 0.4 0.6 0.2 0.4"
    lb_file.write_text(f"1 {diamond}\n1 {square}\n1 {diamond}\n2 {square}\n")
    labels, notes = read_labels(str(lb_file), nc=8)
    if LABEL_RULES.polygon_duplicates:  # 8.4.165 on; before, duplicates by class and box: two labels
        assert len(labels) == 3 and notes == ["1 duplicate labels removed"]
    else:
        assert len(labels) == 2 and notes == ["2 duplicate labels removed"]
    pack = _build(dataset, split="val")
    ref = ultralytics_dataset(dataset / "data.yaml", "val", 160)
    for i, lb in enumerate(ref.labels):
        np.testing.assert_array_equal(pack.labels(i), np.concatenate([lb["cls"], lb["bboxes"]], 1))


def test_bad_samples_are_skipped_like_ultralytics_and_reported(synth_root, tmp_path):
    ours_root = copy_dataset(synth_root, tmp_path / "ours")
    theirs_root = copy_dataset(synth_root, tmp_path / "theirs")  # Ultralytics rewrites files: give it a copy
    paths = add_bad_samples(ours_root)
    add_bad_samples(theirs_root)
    before = {p: Path(p).read_bytes() for p in paths.values()}
    pack = _build(ours_root)
    ref = ultralytics_dataset(theirs_root / "data.yaml", "train", 160)

    # the same samples survive, with the same labels and the same pixels
    assert [Path(f).name for f in pack.im_files] == [Path(f).name for f in ref.im_files]
    for i, lb in enumerate(ref.labels):
        np.testing.assert_array_equal(pack.labels(i), np.concatenate([lb["cls"], lb["bboxes"]], 1))
        np.testing.assert_array_equal(pack.image(i), ref.load_image(i)[0][..., ::-1])

    # every skipped case has a report line naming the file and the reason
    report = {Path(row[0]).name: row for row in read_report(pack.path)}
    skipped = {Path(f).name: r for f, r in pack.header["skipped"]}
    for name, (_, _, _, words) in BAD_CASES.items():
        if kept(name):
            assert name not in skipped
        else:
            assert name in skipped and report[name][1] == "skipped"
            assert words in skipped[name], (name, skipped[name])
    assert pack.header["counts"]["skipped"] == sum(not kept(name) for name in BAD_CASES)
    text = summary(ensure_split(ours_root / "data.yaml", "train", 160, rebuild="never", progress=False))
    assert "skipped" in text and "report.txt" in text

    # nothing of the user's was touched (Ultralytics rewrote its copy of trailing.jpg; we did not)
    assert all(Path(p).read_bytes() == b for p, b in before.items())
    assert (theirs_root / "images/train/trailing.jpg").read_bytes() != before[paths["trailing.jpg"]]

    # the good samples survive intact
    good = [i for i, f in enumerate(pack.im_files) if Path(f).name.startswith("train_")]
    assert len(good) == 24


@pytest.mark.parametrize("rules", LABEL_RULE_SETS, ids=[r.since for r in LABEL_RULE_SETS])
def test_each_releases_rules_keep_what_that_release_keeps(rules, tmp_path):
    """Under the label rules of each release of the range (not only the installed one), a case is kept exactly where
    that release keeps it: the BOM (8.4.183), negative sizes (8.4.182), whitespace lines and polygon duplicates
    (8.4.165), fractional class ids and JPEG 2000 (8.4.164)."""
    for name, (data, label, _, words) in BAD_CASES.items():
        img, lb = tmp_path / name, tmp_path / f"{Path(name).stem}.txt"
        img.write_bytes(data)
        if label is not None:
            lb.write_text(label, encoding="utf-8")
        try:
            check_image(str(img), rules)
            read_labels(str(lb), 80, rules)
        except SampleError as e:
            assert not kept(name, rules) and words in str(e), (rules.since, name, str(e))
        else:
            assert kept(name, rules), (rules.since, name)
    square, diamond = "0.2 0.2 0.6 0.2 0.6 0.6 0.2 0.6", "0.4 0.2 0.6 0.4 0.4 0.6 0.2 0.4"  # one box, two polygons
    lb.write_text(f"1 {diamond}\n1 {square}\n")
    assert len(read_labels(str(lb), 80, rules)[0]) == (2 if rules.polygon_duplicates else 1)


def test_notes_for_backgrounds_duplicates_and_restored(dataset):
    add_bad_samples(dataset)
    pack = _build(dataset)
    notes = {Path(f).name: n for f, n in pack.header["notes"]}
    assert "missing" in notes["no_label.jpg"] and "empty" in notes["empty_label.jpg"]
    assert "duplicate" in notes["dupes.jpg"] and "restored" in notes["trailing.jpg"]


# -- files that are not plain images and labels ------------------------------------------------------------------------
fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


# The build runs in a child process: were a FIFO opened for reading, the child would block forever, and
# the bound (far above the ~5 s this takes) turns that hang into a failure instead of a stuck test run.
HANG_BOUND_S = 120


@fifo
def test_a_fifo_as_label_or_image_never_blocks_a_build(dataset):
    """A FIFO label is a missing label (the image trains as a background, as in Ultralytics, whose
    ``os.path.isfile`` test says so); a FIFO image is skipped with its reason. Builds with one worker, with
    two, and ``rebuild=check`` (which reads every label file) all finish."""
    label = dataset / "labels" / "train" / "train_000001.txt"
    label.unlink()
    os.mkfifo(label)
    os.mkfifo(dataset / "images" / "train" / "zz_fifo.jpg")
    code = (
        "import sys\n"
        "from yolofeed.pack.rebuild import ensure_split\n"
        "for rebuild, workers in (('auto', 1), ('check', 1), ('always', 2)):\n"
        f"    r = ensure_split({str(dataset / 'data.yaml')!r}, 'train', 64, rebuild=rebuild, workers=workers,\n"
        "                     progress=False)\n"
        "    print(rebuild, r.built, len(r.pack))\n")
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_BOUND_S, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["auto", "True", "24", "check", "False", "24", "always", "True", "24"]
    pack = Pack.open(store_dir(dataset / "data.yaml", 64, "raw") / "train.yfpack")
    notes = {Path(f).name: n for f, n in pack.header["notes"]}
    skipped = {Path(f).name: why for f, why in pack.header["skipped"]}
    assert notes["train_000001.jpg"].startswith("label file missing")
    assert len(pack.labels(pack.im_files.index(str(dataset / "images" / "train" / "train_000001.jpg")))) == 0
    assert "FIFO" in skipped["zz_fifo.jpg"] and "block" in skipped["zz_fifo.jpg"]


def test_files_that_are_not_images_get_their_own_reason(tmp_path):
    """Not the HEIC hint for a text file, nor "corrupt or truncated" for a link loop."""
    text = tmp_path / "notes.jpg"
    text.write_text("hello, not a photo\n")
    (tmp_path / "loop1.jpg").symlink_to(tmp_path / "loop2.jpg")
    (tmp_path / "loop2.jpg").symlink_to(tmp_path / "loop1.jpg")
    (tmp_path / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (tmp_path / "folder.jpg").mkdir()
    heic = tmp_path / "photo.jpg"  # an ISO media file's start: the HEIC hint is right for this one
    heic.write_bytes(b"\0\0\0\x18ftypheic" + bytes(200))
    expect = {text: "Pillow recognises no image format", tmp_path / "loop1.jpg": "symbolic link loop",
              tmp_path / "dangling.jpg": "broken symbolic link", tmp_path / "folder.jpg": "a folder",
              heic: "HEIC/HEIF"}
    for path, words in expect.items():
        with pytest.raises(SampleError) as e:
            check_image(str(path))
        assert words in str(e.value), (path.name, str(e.value))
        if path != heic:
            assert "HEIC" not in str(e.value) and "corrupt" not in str(e.value)
