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

from helpers import BAD_CASES, POSE_TRAINED, add_bad_samples, copy_dataset, kept, ultralytics_dataset
from yolofeed import ultralytics_seam as seam
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


def test_a_restored_jpeg_the_user_cannot_write_says_ultralytics_would_skip_it(tmp_path, monkeypatch):
    """Ultralytics restores a JPEG with trailing bytes by rewriting the file, and skips it as corrupt where it cannot
    (a read-only dataset); the pack keeps it, restored in memory: the note says so there, and only there."""
    from helpers import GOOD_LABEL, _jpeg
    from yolofeed.pack import codecs
    from yolofeed.pack.verify import load_sample

    im, lb = tmp_path / "trailing.jpg", tmp_path / "trailing.txt"
    im.write_bytes(_jpeg(seed=2) + b"trailing junk")
    lb.write_text(GOOD_LABEL)
    encode = codecs.find("raw").encode
    writable = load_sample(str(im), str(lb), 80, 64, encode).notes
    assert any("restored in memory" in n and "read-only" not in n for n in writable), writable
    im.chmod(0o444)  # the file read-only, its folder not: 8.4.167 on renames a new file over it, before writes it
    blocked = os.geteuid() != 0 and not seam.since("8.4.167")
    notes = load_sample(str(im), str(lb), 80, 64, encode).notes
    assert any("as here (read-only)" in n for n in notes) == blocked, notes
    real = os.access  # a read-only mount (root too): neither the file nor its folder takes writes
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False if str(tmp_path) in str(path) else
                        real(path, mode))
    read_only = load_sample(str(im), str(lb), 80, 64, encode).notes
    assert any("skips it as corrupt where it cannot, as here (read-only): yolofeed keeps it" in n for n in read_only)


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


def test_an_image_over_pillows_limit_says_so_not_corrupt(tmp_path, monkeypatch):
    """Pillow refuses an image over twice MAX_IMAGE_PIXELS (Ultralytics skips it as corrupt, with Pillow's words);
    the reason said it was corrupt or truncated, re-export it. A small limit stands in for a 196 MP image."""
    from PIL import Image

    big = tmp_path / "big.png"
    Image.new("RGB", (64, 64)).save(big)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(SampleError) as e:
        check_image(str(big))
    assert "image too large for Pillow" in str(e.value) and "corrupt" not in str(e.value), str(e.value)


def test_an_offending_value_is_quoted_as_the_label_file_wrote_it(tmp_path):
    """1.0100001 was quoted as 'above 1 (1.01)', a value the same check lets through."""
    lb = tmp_path / "a.txt"
    lb.write_text("0 0.5 0.5 0.2 0.2\n0 1.0100001 0.5 0.2 0.2\n0 0.5 -0.1 0.2 0.2\n")
    with pytest.raises(SampleError, match=r"above 1 \(1\.0100001\)"):
        read_labels(str(lb), 2)
    lb.write_text("0 0.5 -0.1 0.2 0.2\n")
    with pytest.raises(SampleError, match=r"negative values \(-0\.1\)"):
        read_labels(str(lb), 2)


# -- pose labels -------------------------------------------------------------------------------------------------------
KPT = "0.4 0.4 2 0.6 0.6 1"  # two keypoints (kpt_shape [2, 3]) inside a box at the centre
# label text -> whether Ultralytics keeps the image, for kpt_shape [2, 3] (11 columns a row)
POSE_CASES: dict[str, tuple[str, bool]] = {
    "good": (f"0 0.5 0.5 0.2 0.2 {KPT}\n3 0.2 0.3 0.1 0.1 0.15 0.25 2 0.25 0.35 0\n", True),
    "short": ("0 0.5 0.5 0.2 0.2 0.4 0.4 2\n", False),  # a keypoint short
    "box_only": ("0 0.5 0.5 0.2 0.2\n", False),  # a detection row in a pose set
    "segment": ("0 0.1 0.1 0.4 0.1 0.4 0.5 0.1 0.5 0.2 0.2\n", True),  # 11 numbers: read as a pose row, as there
    "ragged": (f"0 0.5 0.5 0.2 0.2 {KPT}\n1 0.5 0.5 0.2 0.2\n", False),
    "text": (f"person 0.5 0.5 0.2 0.2 {KPT}\n", False),
    "kpt_above": ("0 0.5 0.5 0.2 0.2 1.2 0.4 2 0.6 0.6 1\n", False),
    "kpt_edge": ("0 0.5 0.5 0.2 0.2 1.005 0.4 2 0.6 1.01 1\n", True),  # within Ultralytics' 1 %
    "box_above": (f"0 1.5 0.5 0.2 0.2 {KPT}\n", True),  # the box is not checked from above for pose
    "kpt_slightly_negative": ("0 0.5 0.5 0.2 0.2 -0.005 0.4 2 0.6 0.6 1\n", True),
    "kpt_negative": ("0 0.5 0.5 0.2 0.2 -0.5 0.4 2 0.6 0.6 1\n", False),
    "visibility_negative": ("0 0.5 0.5 0.2 0.2 0.4 0.4 -1 0.6 0.6 1\n", False),
    "visibility_fraction": ("0 0.5 0.5 0.2 0.2 0.4 0.4 0.5 0.6 0.6 7\n", True),
    "kpt_nan": ("0 0.5 0.5 0.2 0.2 nan 0.4 2 0.6 0.6 1\n", False),
    "cls_fraction": (f"1.5 0.5 0.5 0.2 0.2 {KPT}\n", False),
    "cls_range": (f"8 0.5 0.5 0.2 0.2 {KPT}\n", False),
    "dupes": (f"5 0.5 0.5 0.2 0.2 {KPT}\n1 0.3 0.3 0.1 0.1 {KPT}\n5 0.5 0.5 0.2 0.2 {KPT}\n", True),
    "same_box_other_points": (f"5 0.5 0.5 0.2 0.2 {KPT}\n5 0.5 0.5 0.2 0.2 0.45 0.45 2 0.6 0.6 1\n", True),
    "empty": ("", True),
    "missing": (None, True),
}


def _ultralytics_verify(im_file: Path, lb_file: Path, nc: int, kpt_shape, keypoint: bool):
    from ultralytics.data.utils import verify_image_label

    return verify_image_label((str(im_file), str(lb_file), "", keypoint, nc, *kpt_shape, False))


def _case(tmp_path: Path, text: str | None) -> tuple[Path, tuple]:
    """A label file of ``text`` (none where None) beside an image Ultralytics reads, and Ultralytics' verdict on it
    (8 classes, no keypoints)."""
    im, lb = tmp_path / "a.jpg", tmp_path / "a.txt"
    im.write_bytes(BAD_CASES["plain.png"][0])
    if text is not None:
        lb.write_text(text)
    return lb, _ultralytics_verify(im, lb, 8, (0, 0), False)


@pytest.mark.parametrize("text, says", [
    ("1 0.5 0.5 0.2\n0 0.5 0.5 0.2 0.2\n", r"row 1 \('1 0\.5 0\.5 0\.2'\) has 4 values where its other box rows "
                                            r"have 5 \(class x y w h\); fix or remove that row"),
    ("0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2 0.3\n", r"row 2 \('0 0\.5 0\.5 0\.2 0\.2 0\.3'\) has 6 values"),
    ("0 0.5 0.5 0.2 0.2\nfoo 0.5 0.5 0.2 0.2\n", r"row 2 \('foo 0\.5 0\.5 0\.2 0\.2'\) holds 'foo', which is not "
                                                   r"a number: YOLO rows are numbers \(class x y w h\)"),
])
def test_a_row_numpy_cannot_read_is_named_with_why(tmp_path, text, says):
    """A row of another length among box rows, or a word that is not a number: the file, the row, its text and why,
    where numpy's own reason ('inhomogeneous shape after 1 dimensions') said none of them."""

    lb = tmp_path / "a.txt"
    lb.write_text(text)
    with pytest.raises(SampleError, match=says) as e:
        read_labels(str(lb), 3)
    assert str(e.value).startswith(f"{lb} row ") and "inhomogeneous" not in str(e.value)


@pytest.mark.parametrize("dims", [3, 2])
@pytest.mark.parametrize("case", list(POSE_CASES))
def test_pose_rows_are_checked_as_ultralytics_checks_them(tmp_path, case, dims):
    """Each pose case kept or refused as Ultralytics' verify_image_label (task=pose) keeps or refuses it, with the same
    boxes, keypoints (D = 2: its visibility from the signs) and duplicates removed; a refusal says why in one line."""
    from yolofeed.pack.verify import read_pose_labels

    text, _ = POSE_CASES[case]
    if dims == 2 and text:  # the same cases for kpt_shape [2, 2]: each point's third value dropped
        text = "\n".join(" ".join(w for j, w in enumerate(r.split()) if j < 5 or (j - 5) % 3 != 2)
                         if len(r.split()) == 11 else r for r in text.splitlines()) + "\n"
    im = tmp_path / "a.jpg"
    im.write_bytes(BAD_CASES["plain.png"][0])  # any image Ultralytics reads
    lb = tmp_path / "a.txt"
    if text is not None:
        lb.write_text(text)
    ref = _ultralytics_verify(im, lb, 8, (2, dims), True)
    try:
        labels, kpts, notes = read_pose_labels(str(lb), 8, (2, dims))
    except SampleError as e:
        assert ref[0] is None, (case, str(e))
        assert "\n" not in str(e) and str(lb) in str(e)
        if "columns" in ref[-1]:
            assert f"labels require {5 + 2 * dims} columns each" in str(e) and ref[-1].endswith(
                f"labels require {5 + 2 * dims} columns each")
        return
    assert ref[0] is not None, (case, ref[-1])
    np.testing.assert_array_equal(labels, ref[1])
    np.testing.assert_array_equal(kpts, ref[4].reshape(-1, 2, 3))
    assert kpts.dtype == np.float32 and kpts.shape == (len(labels), 2, 3)
    assert ("duplicate" in ref[-1]) == any("duplicate" in n for n in notes)


def test_the_pose_cases_cover_what_they_say():
    """The table above is what Ultralytics does (kept or refused, for kpt_shape [2, 3]), so the comparison covers
    both outcomes of each rule."""
    assert {kept for _, kept in POSE_CASES.values()} == {True, False}


def test_a_box_task_on_a_pose_yaml_keeps_the_boxes_of_pose_rows(tmp_path):
    """Detection training on a pose dataset: Ultralytics drops the keypoints of rows of exactly 5 + K x D columns and
    reads every other row as before (a segment stays a segment); yolofeed read such rows as polygons."""

    im = tmp_path / "a.jpg"
    im.write_bytes(BAD_CASES["plain.png"][0])
    lb = tmp_path / "a.txt"
    for text in (f"0 0.5 0.5 0.2 0.2 {KPT}\n3 0.2 0.3 0.1 0.1 {KPT}\n", f"0 0.5 0.5 0.2 0.2 {KPT}\n1 0.5 0.5 0.1 0.1\n",
                 "2 0.1 0.1 0.4 0.1 0.4 0.5 0.1 0.5\n", f"0 0.5 0.5 0.2 0.2 {KPT} 0.1\n"):  # the last: 12 columns
        lb.write_text(text)
        ref = _ultralytics_verify(im, lb, 8, (2, 3), False)
        try:
            ours, _ = read_labels(str(lb), 8, kpt_shape=(2, 3))
        except SampleError:
            assert ref[0] is None, text
            continue
        np.testing.assert_array_equal(ours, ref[1])
    lb.write_text(f"0 0.5 0.5 0.2 0.2 {KPT}\n")
    with pytest.raises(SampleError, match="coordinates above 1"):  # without kpt_shape: a polygon, visibility 2 and all
        read_labels(str(lb), 8)


@pytest.mark.skipif(not POSE_TRAINED, reason="pose packs need Ultralytics POSE_SINCE or newer (refused: test_seam.py)")
def test_bad_pose_rows_are_skipped_like_ultralytics_and_reported(pose_root, tmp_path):
    """A pose set with bad rows (kpt_shape [5, 3], 20 columns): the pack keeps the images Ultralytics' YOLODataset
    (task=pose) keeps, with its boxes and keypoints, and lists each image it skips with the reason in its header and
    report; nothing else is left out."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    kpt = " ".join(["0.5 0.5 2"] * 5)
    cases = {  # image -> (label text, kept by Ultralytics, words of our reason)
        "p_good.jpg": (f"1 0.5 0.5 0.2 0.2 {kpt}\n", True, ""),
        "p_short.jpg": (f"1 0.5 0.5 0.2 0.2 {kpt} 0.1\n", False, "pose labels require 20 columns each"),
        "p_box.jpg": ("1 0.5 0.5 0.2 0.2\n", False, "pose labels require 20 columns each"),
        "p_far.jpg": (f"1 0.5 0.5 0.2 0.2 {kpt.replace('0.5 0.5 2', '1.5 0.5 2', 1)}\n", False,
                      "keypoint coordinates above 1"),
        "p_negative.jpg": (f"1 0.5 0.5 0.2 0.2 {kpt.replace('0.5 0.5 2', '0.5 0.5 -1', 1)}\n", False, "negative"),
        "p_class.jpg": (f"9 0.5 0.5 0.2 0.2 {kpt}\n", False, "nc=8"),
        "p_dupes.jpg": (f"1 0.5 0.5 0.2 0.2 {kpt}\n1 0.5 0.5 0.2 0.2 {kpt}\n", True, ""),
        "p_box_above.jpg": (f"1 1.2 0.5 0.2 0.2 {kpt}\n", True, ""),
        "p_empty.jpg": ("", True, ""),
    }
    ours_root, theirs_root = (copy_dataset(pose_root, tmp_path / name) for name in ("ours", "theirs"))
    for root in (ours_root, theirs_root):
        for name, (label, _, _) in cases.items():
            (root / "images" / "train" / name).write_bytes(BAD_CASES["plain.png"][0])
            (root / "labels" / "train" / name.replace(".jpg", ".txt")).write_text(label)
    pack = open_or_build(ours_root / "data.yaml", "train", 64, "raw", rebuild="auto", workers=2, progress=False,
                         task="pose")
    data = check_det_dataset(str(theirs_root / "data.yaml"), autodownload=False)
    ref = YOLODataset(img_path=data["train"], imgsz=64, augment=False, data=data, hyp=get_cfg(), batch_size=4,
                      rect=False, task="pose")
    assert [Path(f).name for f in pack.im_files] == [Path(lb["im_file"]).name for lb in ref.labels]
    for i, lb in enumerate(ref.labels):
        np.testing.assert_array_equal(pack.labels(i), np.concatenate([lb["cls"], lb["bboxes"]], 1))
        np.testing.assert_array_equal(pack.keypoints(i), lb["keypoints"])
    skipped = {Path(f).name: why for f, why in pack.header["skipped"]}
    report = {Path(row[0]).name: row[1] for row in read_report(pack.path)}
    assert set(skipped) == {name for name, (_, keeps, _) in cases.items() if not keeps}
    for name, (_, keeps, words) in cases.items():
        if not keeps:
            assert words in skipped[name] and report[name] == "skipped", (name, skipped[name])
    notes = {Path(f).name: n for f, n in pack.header["notes"]}
    assert "duplicate" in notes["p_dupes.jpg"] and "empty" in notes["p_empty.jpg"]
    assert pack.header["counts"]["skipped"] == len(skipped) and len(pack) == 16 + 4


# -- OBB labels --------------------------------------------------------------------------------------------------------
QUAD = "0.3 0.2 0.6 0.3 0.5 0.6 0.2 0.5"  # a turned box's 4 corners, clockwise
# label text -> (kept by Ultralytics' verify_image_label for task=obb, kept by yolofeed)
OBB_CASES: dict[str, tuple[str | None, bool, bool]] = {
    "good": (f"0 {QUAD}\n3 0.1 0.1 0.2 0.1 0.2 0.2 0.1 0.2\n", True, True),
    "odd": ("0 0.3 0.2 0.6 0.3 0.5 0.6 0.2\n", False, False),  # 7 coordinates: its reshape fails there
    "mixed": (f"0 {QUAD}\n1 0.5 0.5 0.2 0.2\n", False, False),  # "labels mix segment and detection rows"
    "boxes": ("0 0.5 0.5 0.2 0.2\n", True, False),  # kept here, the run refused by verify_labels; ours: the file
    "triangle": ("0 0.3 0.2 0.6 0.3 0.5 0.6\n", True, False),  # a polygon of 3: ours refuses (not 4 corners)
    "hexagon": (f"0 {QUAD} 0.1 0.1 0.15 0.15\n", True, False),
    "text": (f"plane {QUAD}\n", False, False),
    "corner_far": ("0 0.3 0.2 1.6 0.3 0.5 0.6 0.2 0.5\n", False, False),  # its box's centre above 1.01
    "corner_edge": ("0 0.3 0.2 1.015 0.3 0.5 0.6 0.2 0.5\n", True, True),  # the box is checked, not the corner
    "corner_negative": ("0 -0.3 0.2 0.6 0.3 0.5 0.6 0.2 0.5\n", True, True),  # the box's centre and size >= 0
    "corner_far_negative": ("0 -0.9 0.2 0.6 0.3 0.5 0.6 0.2 0.5\n", False, False),
    "nan": ("0 nan 0.2 0.6 0.3 0.5 0.6 0.2 0.5\n", False, False),
    "cls_fraction": (f"1.5 {QUAD}\n", False, False),
    "cls_range": (f"8 {QUAD}\n", False, False),
    "dupes": (f"5 {QUAD}\n1 0.1 0.1 0.2 0.1 0.2 0.2 0.1 0.2\n5 {QUAD}\n", True, True),
    "same_box_other_corners": (f"5 {QUAD}\n5 0.2 0.2 0.6 0.2 0.6 0.6 0.2 0.6\n", True, True),
    "empty": ("", True, True),
    "missing": (None, True, True),
}


@pytest.mark.parametrize("case", list(OBB_CASES))
def test_obb_rows_are_checked_as_ultralytics_checks_them(tmp_path, case):
    """Each OBB case kept or refused as Ultralytics' verify_image_label (task=obb: rows read as segments) keeps or
    refuses it, with its boxes (the corners' enclosing box), its segments as our corners, and its duplicates removed;
    our two own refusals (box rows, other than 4 corners) say so in one line."""
    from yolofeed.pack.verify import read_obb_labels

    text, theirs, ours = OBB_CASES[case]
    if case == "cls_fraction" and not LABEL_RULES.integer_classes:  # before 8.4.164 a fractional class id is kept
        theirs = ours = True
    lb, ref = _case(tmp_path, text)
    assert (ref[0] is not None) == theirs, (case, ref[-1])
    try:
        labels, corners, notes = read_obb_labels(str(lb), 8)
    except SampleError as e:
        assert not ours and "\n" not in str(e) and str(lb) in str(e), (case, str(e))
        if theirs:
            assert "OBB labels require 9 columns each" in str(e)
        if case in ("triangle", "hexagon"):  # Ultralytics trains on it: the refusal says so
            assert "yolo train fits a rotated box to such a polygon" in str(e)
        return
    assert ours, case
    np.testing.assert_array_equal(labels, ref[1])
    np.testing.assert_array_equal(corners, np.stack(ref[3]) if ref[3] else np.zeros((0, 4, 2), np.float32))
    assert corners.dtype == np.float32 and corners.shape == (len(labels), 4, 2)
    assert ("duplicate" in ref[-1]) == any("duplicate" in n for n in notes)


def test_the_obb_cases_cover_what_they_say():
    """Both outcomes of Ultralytics and of ours occur, and ours differs only where it refuses more."""
    assert {t for _, t, _ in OBB_CASES.values()} == {o for _, _, o in OBB_CASES.values()} == {True, False}
    assert all(t or not o for _, t, o in OBB_CASES.values())


@pytest.mark.parametrize("text, says", [("0 0.1 0.1 0.5 0.1 0.5\n", "a row of 6 columns"),
                                        ("0 0.1 0.1 0.5 0.1 0.5 0.5 0.1\n", "a row of 8 columns"),
                                        ("0 0.5 0.5 0.2 0.2 " + "0.5 0.5 2 " * 5 + "\n", "pose rows")])
def test_obb_refusals_name_the_obb_format(tmp_path, text, says):
    """A malformed OBB row is refused (Ultralytics skips the file too) in words about OBB rows, not detection's."""
    from yolofeed.pack.verify import SampleError, read_obb_labels

    lb = tmp_path / "a.txt"
    lb.write_text(text)
    with pytest.raises(SampleError, match=says) as e:
        read_obb_labels(str(lb), 8, kpt_shape=(5, 3))
    assert "9 columns" in str(e.value) and "class x y w h'" not in str(e.value)


# -- segment labels ----------------------------------------------------------------------------------------------------
TRI = "0.2 0.2 0.4 0.2 0.3 0.4"  # a triangle's 3 points
# label text -> (kept by Ultralytics' verify_image_label, kept by yolofeed, words of our refusal)
SEGMENT_CASES: dict[str, tuple[str | None, bool, bool, str]] = {
    "triangle": (f"0 {TRI}\n", True, True, ""),
    "one_point": (f"0 {TRI}\n1 0.5 0.5\n", True, True, ""),  # a polygon of one point there: a zero-size box
    "odd": ("0 0.2 0.2 0.4 0.2 0.3 0.4 0.5\n", False, False, "an odd number of coordinates (7)"),
    "odd_short": (f"0 {TRI}\n1 0.5\n", False, False, "an odd number of coordinates (1)"),
    "class_alone": (f"0 {TRI}\n2\n", False, False, "a polygon row with no point ('2')"),
    "six_columns": ("0 0.2 0.2 0.4 0.2 0.3\n", False, False, "polygon rows the class, then 3 or more x y points"),
    "mixed": (f"0 {TRI}\n1 0.5 0.5 0.2 0.2\n", False, False, "mixes segment and box rows"),
    "boxes": ("0 0.5 0.5 0.2 0.2\n", True, False, "segment labels require a polygon"),  # the run refused there
    "beyond_in_box": ("0 0.5 0.2 1.3 0.2 0.9 0.6\n", True, True, ""),  # the box is checked, not the points
    "beyond": ("0 1.5 0.2 1.6 0.2 1.55 0.6\n", False, False, "coordinates above 1"),
    "nan": ("0 0.2 0.2 nan 0.2 0.3 0.4\n", False, False, "NaN or infinite"),
    "cls_range": (f"8 {TRI}\n", False, False, "uses class 8"),
    "dupes": (f"0 {TRI}\n0 {TRI}\n", True, True, ""),
    "empty": ("", True, True, ""),
    "missing": (None, True, True, ""),
}


@pytest.mark.parametrize("case", list(SEGMENT_CASES))
def test_segment_rows_are_checked_as_ultralytics_checks_them(tmp_path, case):
    """Each segment case kept or refused as Ultralytics' verify_image_label keeps or skips it, with its boxes and
    polygons; a refusal is one line naming the file and, for a malformed polygon row, that row in polygon words
    (not Ultralytics' "cannot reshape array" or "detection labels need 5 columns")."""
    from yolofeed.pack.verify import read_segment_labels

    text, theirs, ours, words = SEGMENT_CASES[case]
    lb, ref = _case(tmp_path, text)
    assert (ref[0] is not None) == theirs, (case, ref[-1])
    try:
        labels, polygons, notes = read_segment_labels(str(lb), 8)
    except SampleError as e:
        assert not ours and "\n" not in str(e) and str(lb) in str(e) and words in str(e), (case, str(e))
        assert "reshape" not in str(e) and "identity" not in str(e) and "detection labels" not in str(e)
        return
    assert ours, case
    np.testing.assert_array_equal(labels, ref[1])
    assert len(polygons) == len(ref[3]) and all(np.array_equal(a, b) for a, b in zip(polygons, ref[3]))
    assert ("duplicate" in ref[-1]) == any("duplicate" in n for n in notes)


def test_a_reason_quoting_a_binary_file_is_shortened(tmp_path):
    """A parser quoting a megabyte of a binary label file does not fill the report: the reason keeps its start (the
    file) and its end (the fix)."""
    from yolofeed.pack.verify import SampleError, read_labels

    lb = tmp_path / "junk.txt"
    lb.write_bytes(b"a" * 1_000_000)
    with pytest.raises(SampleError) as e:
        read_labels(str(lb), 8)
    message = str(e.value)
    assert len(message) <= SampleError.LIMIT and message.startswith(str(lb)) and message.endswith("that row")


def test_a_label_file_that_cannot_be_read_says_so_not_that_it_must_be_text(tmp_path, monkeypatch):
    """A label file this user may not read got "it must be UTF-8 text" (root here ignores modes: simulated)."""
    import builtins

    from yolofeed.pack import verify

    label = tmp_path / "a.txt"
    label.write_text("0 0.5 0.5 0.1 0.1\n")
    real = builtins.open

    def refused(file, *a, **k):
        if str(file) == str(label):
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, *a, **k)

    monkeypatch.setattr(builtins, "open", refused)
    with pytest.raises(SampleError, match=r"cannot read label file .*a\.txt \(Permission denied\); check its "
                                          r"permissions or remove it$"):
        verify._rows(str(label))
    monkeypatch.setattr(builtins, "open", real)
    label.write_bytes(b"\xff\xfe0 0.5")
    with pytest.raises(SampleError, match="it must be UTF-8 text"):
        verify._rows(str(label))


@pytest.mark.skipif(not POSE_TRAINED, reason="pose rows are read from Ultralytics POSE_SINCE on (test_seam.py)")
def test_pose_rows_where_segment_labels_belong_are_named_as_such(tmp_path):
    """A pose dataset packed for segmentation: its rows' keypoints are dropped as a detection split drops them, which
    left "box rows of 5 columns" where the file has 20."""
    from yolofeed.pack.verify import read_segment_labels

    lb = tmp_path / "a.txt"
    lb.write_text(" ".join(["0"] + ["0.5"] * 19) + "\n")
    with pytest.raises(SampleError, match=r"a\.txt holds box rows \(class x y w h, or a pose row's 20 columns: its box "
                                          r"and 5 keypoints\); segment labels require a polygon"):
        read_segment_labels(str(lb), 8, kpt_shape=(5, 3))
    lb.write_text("0 0.5 0.5 0.2 0.2\n")
    with pytest.raises(SampleError, match=r"holds box rows of 5 columns \(class x y w h\); segment"):
        read_segment_labels(str(lb), 8)
