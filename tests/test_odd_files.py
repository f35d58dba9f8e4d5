"""Files a dataset folder can hold that are not plain images and labels: FIFOs, folders and links with image
names, text files named .jpg, file names that are not UTF-8.

Each is read as Ultralytics reads it (a label that is not a regular file is a missing label; a name that is
not UTF-8 is a file like any other) or skipped with its own reason; none hangs a build or raises after it.
RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from yolofeed.cli import main
from yolofeed.pack import Pack
from yolofeed.pack.paths import store_dir
from yolofeed.pack.report import read_report
from yolofeed.pack.source import split_source
from yolofeed.pack.verify import SampleError, check_image

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


def test_file_names_that_are_not_utf8_round_trip(dataset, capsys):
    """Linux allows any bytes but '/' and NUL in a name, and Ultralytics trains on such files. The pack keeps
    each name byte for byte, the summary shows it escaped, the report holds its bytes; nothing raises after the
    build has decoded every image (it used to, when writing the file list)."""
    raw = os.fsdecode(b"caf\xe9-\xff")  # Python's name for these bytes: lone surrogates
    img, lab = dataset / "images" / "train", dataset / "labels" / "train"
    shutil.copy(img / "train_000003.jpg", img / f"{raw}.jpg")
    shutil.copy(lab / "train_000003.txt", lab / f"{raw}.txt")
    (img / f"{raw}-empty.jpg").write_bytes(b"")  # skipped: its name goes to the header, the report and the summary
    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "workers=1", "splits=train"]) == 0
    out = capsys.readouterr().out
    assert "caf\\xe9-\\xff-empty.jpg: empty file" in out

    pack = Pack.open(store_dir(dataset / "data.yaml", 64, "raw") / "train.yfpack")
    source = split_source(dataset / "data.yaml", "train").im_files
    assert pack.im_files == [f for f in source if not f.endswith("-empty.jpg")]
    k = pack.im_files.index(str(img / f"{raw}.jpg"))
    np.testing.assert_array_equal(pack.image(k), pack.image(pack.im_files.index(str(img / "train_000003.jpg"))))
    np.testing.assert_array_equal(pack.labels(k), np.loadtxt(lab / "train_000003.txt", ndmin=2, dtype=np.float32))
    assert [Path(f).name for f, _ in pack.header["skipped"]] == [f"{raw}-empty.jpg"]
    assert [Path(row[0]).name for row in read_report(pack.path)] == [f"{raw}-empty.jpg"]


def test_a_name_with_a_newline_or_a_tab_stays_one_report_entry(dataset, capsys):
    """Linux allows a newline or a tab in a file name: the report (one entry a line, tab-separated) broke in two
    lines, or grew a column. Such a field is now quoted as ``ls`` quotes such names (``$'...'``), which pastes into
    bash as the very name and ``read_report`` reads back; the summary shows it escaped, on one line."""
    img = dataset / "images" / "train"
    odd = [img / "two\nlines.jpg", img / "a\ttab, it's.jpg", img / "$'looks quoted'.jpg"]
    for path in odd:
        path.write_bytes(b"")  # skipped: empty
    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "workers=1", "splits=train"]) == 0
    out = capsys.readouterr().out
    assert "two\\nlines.jpg: empty file" in out and "a\\ttab, it's.jpg: empty file" in out
    dest = store_dir(dataset / "data.yaml", 64, "raw") / "train.yfpack"
    lines = (dest.parent / "train.report.txt").read_text().split("\n")[1:-1]
    assert len(lines) == 3 and all(len(line.split("\t")) == 3 for line in lines), lines
    assert sorted(row[0] for row in read_report(dest)) == sorted(map(str, odd))
    quoted = [line.split("\t")[0] for line in lines if line.startswith("$'")]
    assert len(quoted) == 2  # the newline and the tab; a quote or a $ alone needs none
    if shutil.which("bash"):  # pasted into a shell, each names its file
        for field in quoted:
            assert subprocess.run(["bash", "-c", f"test -e {field}"]).returncode == 0, field


def test_an_image_too_wide_for_a_jpeg_pack_points_to_a_raw_pack(dataset, capsys):
    """A PNG 70,000 px wide (Ultralytics trains on it) was skipped from a jpeg pack as "could not re-encode the image
    as JPEG", with no way out; JPEG's sides end at 65,500 px. Now the reason says so and names format=raw, which
    keeps it."""
    import cv2

    img, lab = dataset / "images" / "train", dataset / "labels" / "train"
    cv2.imwrite(str(img / "panorama.png"), np.full((20, 70_000, 3), 127, np.uint8))
    (lab / "panorama.txt").write_text("0 0.5 0.5 0.1 0.5\n")
    base = ["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "workers=1", "splits=train"]
    assert main(base + ["format=jpeg"]) == 0
    reason = dict(Pack.open(store_dir(dataset / "data.yaml", 64, "jpeg") / "train.yfpack").header["skipped"])
    why = reason[str(img / "panorama.png")]
    assert "70000x20 px" in why and "65,500 px" in why and "format=raw" in why, why
    assert main(base + ["format=raw"]) == 0
    assert str(img / "panorama.png") in Pack.open(store_dir(dataset / "data.yaml", 64, "raw") / "train.yfpack").im_files
