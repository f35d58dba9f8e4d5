"""The synthetic dataset: deterministic, COCO-like, and its labels are where its objects are."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from yolofeed import synth
from yolofeed.cli import main
from yolofeed.config import SynthConfig
from yolofeed.errors import ConfigError


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in (".jpg", ".txt")}


def test_same_seed_same_bytes_any_worker_count(tmp_path):
    a = synth.run(SynthConfig(out=str(tmp_path / "a"), n_train=6, n_val=2, imgsz=128, seed=7, workers=1)).parent
    b = synth.run(SynthConfig(out=str(tmp_path / "b"), n_train=6, n_val=2, imgsz=128, seed=7, workers=2)).parent
    c = synth.run(SynthConfig(out=str(tmp_path / "c"), n_train=6, n_val=2, imgsz=128, seed=8, workers=2)).parent
    da, db, dc = _digest(a), _digest(b), _digest(c)
    assert len(da) == 16 and da == db
    assert all(da[k] != dc[k] for k in da if k.endswith(".jpg"))


def test_layout_and_yaml(synth_root):
    d = yaml.safe_load((synth_root / "data.yaml").read_text())
    assert Path(d["path"]).is_absolute() and Path(d["train"]).is_absolute()
    assert d["nc"] == 80 and len(d["names"]) == 80
    assert len(list((synth_root / "images" / "train").glob("*.jpg"))) == 24
    assert len(list((synth_root / "labels" / "val").glob("*.txt"))) == 8


def test_ultralytics_reads_the_yaml(synth_root):
    from ultralytics.data.utils import check_det_dataset

    d = check_det_dataset(str(synth_root / "data.yaml"), autodownload=False)
    assert d["nc"] == 80 and Path(d["train"]) == synth_root / "images" / "train"


def _boxes(label_file: Path, w: int, h: int) -> list[tuple[int, int, int, int, int]]:
    out = []
    for line in label_file.read_text().splitlines():
        c, x, y, bw, bh = map(float, line.split())
        out.append((int(c), round((x - bw / 2) * w), round((y - bh / 2) * h), round((x + bw / 2) * w),
                    round((y + bh / 2) * h)))
    return out


def test_labels_match_the_drawn_objects(synth_root):
    """Decode the written JPEG: inside each labelled box, where the class's figure should be, the pixels have
    the class's colour (a misplaced, mis-scaled or mis-classed label lands on the random background)."""
    colours = np.array(list(synth.COLOURS.values()), np.float32)
    checked = 0
    for img_file in sorted((synth_root / "images" / "train").glob("*.jpg"))[:12]:
        im = cv2.cvtColor(cv2.imread(str(img_file)), cv2.COLOR_BGR2RGB).astype(np.float32)
        h, w = im.shape[:2]
        for c, x1, y1, x2, y2 in _boxes(synth_root / "labels" / "train" / f"{img_file.stem}.txt", w, h):
            assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h
            if min(x2 - x1, y2 - y1) < 12:
                continue  # JPEG chroma blur dominates tiny figures
            mask = synth.figure_mask(synth.SHAPES[c // 10], x2 - x1, y2 - y1)
            core = cv2.erode(mask.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
            if core.sum() < 8:
                continue  # thin figure: nothing left once the JPEG-blurred edge is eroded away
            inside = im[y1:y2, x1:x2][core].mean(0)
            dist = np.abs(colours - inside).sum(1)
            assert dist.argmin() == c % 10 and dist.min() < 120, (img_file.name, c, inside)
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("shape", synth.SHAPES)
def test_every_figure_touches_its_box(shape):
    for w, h in ((8, 8), (9, 31), (40, 13), (120, 90)):
        m = synth.figure_mask(shape, w, h)
        assert m[0].any() and m[-1].any() and m[:, 0].any() and m[:, -1].any(), (shape, w, h)


def test_photo_like_weight_and_counts(tmp_path):
    root = synth.run(SynthConfig(out=str(tmp_path / "big"), n_train=16, n_val=0, imgsz=640, seed=1, workers=2)).parent
    sizes = [p.stat().st_size for p in (root / "images" / "train").glob("*.jpg")]
    assert 60e3 <= np.mean(sizes) <= 150e3
    counts = [len(p.read_text().splitlines()) for p in (root / "labels" / "train").glob("*.txt")]
    assert min(counts) >= 1 and max(counts) <= 20
    shapes = {cv2.imread(str(p)).shape[:2] for p in (root / "images" / "train").glob("*.jpg")}
    assert len(shapes) >= 3  # several shapes


def test_quality_sets_the_weight_and_nothing_else(tmp_path):
    """quality=95 weighs about what COCO's photos do (~160 KB at 640 px); the pictures and labels stay the same."""
    base = dict(n_train=8, n_val=0, imgsz=640, seed=1, workers=2)
    plain = synth.run(SynthConfig(out=str(tmp_path / "q90"), **base)).parent
    heavy = synth.run(SynthConfig(out=str(tmp_path / "q95"), quality=95, **base)).parent
    files = sorted(p.name for p in (plain / "images" / "train").glob("*.jpg"))
    light = [(plain / "images" / "train" / f).stat().st_size for f in files]
    weight = [(heavy / "images" / "train" / f).stat().st_size for f in files]
    assert all(w > 1.3 * x for w, x in zip(weight, light)) and 120e3 <= np.mean(weight) <= 200e3
    for f in files:
        a, b = (cv2.imread(str(r / "images" / "train" / f)).astype(int) for r in (plain, heavy))
        assert np.abs(a - b).mean() < 8  # the same picture, encoded finer (another picture differs by tens)
        stem = Path(f).stem + ".txt"
        assert (plain / "labels" / "train" / stem).read_bytes() == (heavy / "labels" / "train" / stem).read_bytes()
    assert "quality" not in synth.manifest(SynthConfig(**base))  # folders written before quality= still match
    assert synth.manifest(SynthConfig(quality=95, **base))["quality"] == 95
    for bad in (0, 101):
        with pytest.raises(ConfigError, match=f"quality={bad}: JPEG quality runs from 1 to 100"):
            synth.run(SynthConfig(out=str(tmp_path / "bad"), quality=bad, **base))


def test_a_learnable_set_for_accuracy_comparisons(tmp_path):
    """classes=8 boxes=8 min_box=16: 8 classes that differ in shape and colour, 1-8 figures of >= 16 px."""
    root = synth.run(SynthConfig(out=str(tmp_path / "easy"), n_train=24, n_val=2, imgsz=160, seed=2, classes=8,
                                 boxes=8, min_box=16, workers=2)).parent
    d = yaml.safe_load((root / "data.yaml").read_text())
    assert d["nc"] == 8
    shapes, colours = zip(*(name.split("_")[::-1] for name in d["names"].values()))
    assert len(set(shapes)) == 8 and len(set(colours)) == 8
    sides, counts = [], []
    for img_file in (root / "images" / "train").glob("*.jpg"):
        h, w = cv2.imread(str(img_file)).shape[:2]
        rows = _boxes(root / "labels" / "train" / f"{img_file.stem}.txt", w, h)
        counts.append(len(rows))
        for c, x1, y1, x2, y2 in rows:
            assert 0 <= c < 8
            sides.append(min(x2 - x1, y2 - y1))
    assert 1 <= min(counts) and max(counts) <= 8 and min(sides) >= 15  # 16 px, less the label's rounding
    for bad in (dict(classes=0), dict(classes=81), dict(boxes=0)):
        with pytest.raises(ConfigError):
            synth.run(SynthConfig(out=str(tmp_path / "bad"), n_train=1, n_val=0, imgsz=64, **bad))


def test_settings_that_cannot_make_the_dataset_are_refused(tmp_path, capsys):
    """Each used to be taken: negative counts wrote nothing and said nothing, imgsz=0 drew 32 px images, a
    min_box larger than the images failed in a worker (ValueError: high <= 0), out= a file gave a traceback, and so
    did seed=-1 and imgsz=100000 (numpy's seed, OpenCV's allocation), after writing a folder that the command put
    right then refused."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    base = dict(out=str(tmp_path / "new"), n_train=2, n_val=1, imgsz=32, workers=1)
    side = synth.smallest_side(32)
    for bad, words in ((dict(n_train=-3), "cannot be negative"), (dict(n_val=-1), "cannot be negative"),
                       (dict(imgsz=0), "imgsz=0: expected at least 32"), (dict(imgsz=31), "at least 32"),
                       # a traceback in a worker, and folders left that refused the command put right
                       (dict(seed=-1), "seed=-1: expected 0 or more"),
                       (dict(imgsz=100_000), "imgsz=100000: expected at most 4096"),
                       (dict(boxes=10**9), "boxes=1000000000: expected at most 1000"),
                       (dict(min_box=side), f"use min_box={side - 1} or less"),
                       (dict(out=str(a_file)), "is a file")):
        with pytest.raises(ConfigError, match=words):
            synth.run(SynthConfig(**{**base, **bad}))
    assert not (tmp_path / "new").exists()
    assert main(["synth", f"out={a_file}"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    # the largest min_box that fits is drawn, exactly: figures may be min_box + 1 px tall
    root = synth.run(SynthConfig(**{**base, "min_box": side - 1, "n_train": 6})).parent
    assert len(list((root / "images" / "train").glob("*.jpg"))) == 6


def test_a_folder_holding_another_dataset_is_refused_and_the_same_one_rewritten(tmp_path):
    """Synth into a folder of another dataset used to mix the two (5 + 5 images, then 2 + 2 with another
    seed: 5 + 5 files, most of them old, reported as 2 + 2). The same command again, as 'make demo' runs it,
    rewrites the same bytes."""
    cfg = SynthConfig(out=str(tmp_path / "d"), n_train=5, n_val=5, imgsz=64, seed=1, workers=1)
    root = synth.run(cfg).parent
    first = _digest(root)
    assert synth.run(cfg).parent == root and _digest(root) == first
    with pytest.raises(ConfigError, match="already holds another dataset with seed=1 n_train=5 n_val=5 imgsz=64"):
        synth.run(dataclasses.replace(cfg, n_train=2, n_val=2, seed=9))
    assert _digest(root) == first  # untouched
    (root / synth.MANIFEST).unlink()  # a user's dataset, or one an older yolofeed wrote: its settings are unknown
    with pytest.raises(ConfigError, match=f"data.yaml, images, labels, and no {synth.MANIFEST}"):
        synth.run(cfg)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert synth.run(dataclasses.replace(cfg, out=str(empty))).parent == empty  # an empty folder is fine


def test_a_folder_at_another_quality_is_refused_naming_it(tmp_path):
    """A folder written before quality= existed (no "quality" in its synth.json) is at the default: quality=95 on it
    was refused with a message listing identical settings; a synth.json naming quality=90 refused the default run."""
    cfg = SynthConfig(out=str(tmp_path / "d"), n_train=2, n_val=0, imgsz=64, seed=1, workers=1)
    root = synth.run(cfg).parent
    with pytest.raises(ConfigError, match=r"quality=90 \(this run asks for quality=95\)"):
        synth.run(dataclasses.replace(cfg, quality=95))
    written = json.loads((root / synth.MANIFEST).read_text())
    (root / synth.MANIFEST).write_text(json.dumps({**written, "quality": 90}))
    assert synth.run(cfg).parent == root  # the same dataset, its quality named


# -- task=pose -----------------------------------------------------------------------------------------------------
def _pose_rows(label_file: Path) -> np.ndarray:
    """(n, 20) float32 label rows: class, box, then 5 keypoints of x, y, visibility."""
    return np.loadtxt(label_file, dtype=np.float32, ndmin=2)


def test_pose_labels_parse_under_ultralytics_with_the_same_counts(pose_dataset):
    """Ultralytics' own YOLODataset (task=pose) reads every image and every row, box and keypoints as written; the
    yaml has coco8-pose's keys; visible, occluded and unlabelled points all occur."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    d = yaml.safe_load((pose_dataset / "data.yaml").read_text())
    assert d["kpt_shape"] == [len(synth.KEYPOINTS), 3] and d["flip_idx"] == synth.FLIP_IDX
    assert d["kpt_names"][0] == list(synth.KEYPOINTS) and len(d["kpt_names"]) == d["nc"] == 8
    data = check_det_dataset(str(pose_dataset / "data.yaml"), autodownload=False)
    seen = []
    for split, n in (("train", 16), ("val", 6)):
        ref = YOLODataset(img_path=data[split], imgsz=160, augment=False, data=data, hyp=get_cfg(), batch_size=4,
                          rect=False, task="pose")
        assert len(ref.labels) == n
        for lb in ref.labels:
            rows = _pose_rows(pose_dataset / "labels" / split / f"{Path(lb['im_file']).stem}.txt")
            np.testing.assert_array_equal(lb["cls"][:, 0], rows[:, 0])
            np.testing.assert_array_equal(lb["bboxes"], rows[:, 1:5])
            np.testing.assert_array_equal(lb["keypoints"], rows[:, 5:].reshape(-1, 5, 3))
            seen.append(rows[:, 5:].reshape(-1, 5, 3))
    v = np.concatenate(seen)[..., 2]
    assert set(np.unique(v).tolist()) == {0, 1, 2} and (v == 2).mean() > 0.75
    assert (np.concatenate(seen)[v == 0][:, :2] == 0).all()  # an unlabelled point is 0 0 0, as COCO writes it


def test_pose_pictures_are_the_detection_pictures_with_the_occluders_painted(tmp_path):
    """Same seed: the boxes and classes of task=detect, its pixels everywhere but at the grey discs over the occluded
    points; each visible side point is on its figure (the pixel inside the box there has the figure's colour), each
    occluded one under a grey disc; flip_idx maps a mirrored figure's points onto its own."""
    colours = np.array(list(synth.COLOURS.values()), np.float32)
    ids = synth.class_ids(8)
    checked = {1: 0, 2: 0}
    for index in range(12):
        plain = synth.render(4, "train", index, 160, 8, 8, 16)
        pose = synth.with_keypoints(plain, 4, "train", index, 8)
        assert [r.split()[:5] for r in synth.label_text(pose).splitlines()] == [
            r.split() for r in synth.label_text(plain).splitlines()]
        changed = (pose.image != plain.image).any(-1)
        for (x1, y1, x2, y2), label, points in zip(plain.boxes.tolist(), plain.classes.tolist(), pose.keypoints):
            changed[y1:y2, x1:x2] = False
            for j, (x, y, v) in enumerate(points[:4].tolist()):  # the side points: on the box's edge
                col, row = min(int(x), x2 - 1), min(int(y), y2 - 1)
                if v == 2:
                    dist = np.abs(colours - pose.image[row, col].astype(np.float32)).sum(1)
                    assert dist.argmin() == ids[label] % len(colours), (index, j)
                elif v == 1:
                    px = pose.image[row, col].astype(int)
                    assert np.ptp(px) < 40 and (px != plain.image[row, col]).any(), (index, j, px)
                checked[int(v)] = checked.get(int(v), 0) + 1  # v=0 too: an unlabelled point is 0 0 0
            mirrored = points.copy()
            mirrored[:, 0] = np.where(points[:, 2] > 0, x1 + x2 - points[:, 0], 0)
            shape = synth.SHAPES[ids[label] // len(synth.COLOURS)]
            want = synth.figure_keypoints(shape, x1, y1, x2, y2)  # every figure is its own mirror image
            np.testing.assert_allclose(mirrored[synth.FLIP_IDX][:, :2][points[synth.FLIP_IDX][:, 2] > 0],
                                       want[points[synth.FLIP_IDX][:, 2] > 0], atol=1e-9)
        assert not changed.any()  # nothing outside the figures' boxes was painted
    assert checked[1] >= 3 and checked[2] >= 40


def test_pose_is_its_own_dataset_for_the_folder_check(tmp_path):
    """A pose folder is not a detection folder of the same settings (and the other way round); the same command
    again rewrites the same bytes."""
    cfg = SynthConfig(out=str(tmp_path / "p"), n_train=3, n_val=1, imgsz=64, seed=1, task="pose", workers=1)
    root = synth.run(cfg).parent
    first = _digest(root)
    assert synth.run(cfg).parent == root and _digest(root) == first
    assert json.loads((root / synth.MANIFEST).read_text())["task"] == "pose"
    with pytest.raises(ConfigError, match=r"task=pose quality=90 \(this run asks for task=detect\)"):
        synth.run(dataclasses.replace(cfg, task="detect"))
    assert "task" not in synth.manifest(dataclasses.replace(cfg, task="detect"))  # detection folders still match
    with pytest.raises(ConfigError, match="task=classify: expected detect, pose, obb or segment"):
        synth.run(dataclasses.replace(cfg, task="classify", out=str(tmp_path / "s")))
    with pytest.raises(ConfigError, match=r"task=pose quality=90 \(this run asks for task=segment\)"):
        synth.run(dataclasses.replace(cfg, task="segment"))  # the same pictures as detect, other labels
    assert main(["synth", f"out={tmp_path / 'cli'}", "n_train=2", "n_val=1", "imgsz=64", "task=pose"]) == 0
    assert yaml.safe_load((tmp_path / "cli" / "data.yaml").read_text())["kpt_shape"] == [5, 3]


# -- task=obb ------------------------------------------------------------------------------------------------------
def test_detect_and_pose_write_the_bytes_they_wrote_before_obb(tmp_path):
    """The digests of a small detection and pose set, as written before task=obb existed (its draws are its own)."""
    for task, want in (("detect", "3d76c5e87a187deb"), ("pose", "6d0507998a140416")):
        root = synth.run(SynthConfig(out=str(tmp_path / task), n_train=3, n_val=2, imgsz=96, seed=3, classes=8,
                                     boxes=4, min_box=12, task=task, workers=1)).parent
        h = hashlib.sha256()
        for p in sorted(root.rglob("*")):
            if p.is_file() and p.suffix in (".jpg", ".txt"):
                h.update(str(p.relative_to(root)).encode())
                h.update(p.read_bytes())
        assert h.hexdigest()[:16] == want, task


def test_obb_labels_parse_under_ultralytics_as_dota8(tmp_path):
    """Ultralytics' YOLODataset (task=obb) reads every image and row: its segments are the written corners, its boxes
    their enclosing box (segments2boxes); the same seed writes the same bytes in any number of processes."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    cfg = SynthConfig(out=str(tmp_path / "a"), n_train=8, n_val=3, imgsz=128, seed=2, classes=8, boxes=6, min_box=12,
                      task="obb", workers=1)
    root = synth.run(cfg).parent
    again = synth.run(dataclasses.replace(cfg, out=str(tmp_path / "b"), workers=2)).parent
    assert _digest(root) == _digest(again) and json.loads((root / synth.MANIFEST).read_text())["task"] == "obb"
    data = check_det_dataset(str(root / "data.yaml"), autodownload=False)
    for split, n in (("train", 8), ("val", 3)):
        ref = YOLODataset(img_path=data[split], imgsz=128, augment=False, data=data, hyp=get_cfg(), batch_size=4,
                          rect=False, task="obb")
        assert len(ref.labels) == n
        for lb in ref.labels:
            rows = np.loadtxt(root / "labels" / split / f"{Path(lb['im_file']).stem}.txt", np.float32, ndmin=2)
            assert rows.shape[1] == 9 and (rows[:, 1:] >= 0).all() and (rows[:, 1:] <= 1).all()
            np.testing.assert_array_equal(lb["cls"][:, 0], rows[:, 0])
            quads = rows[:, 1:].reshape(-1, 4, 2)
            np.testing.assert_array_equal(np.stack(lb["segments"]), quads)
            lo, hi = quads.min(1), quads.max(1)
            np.testing.assert_allclose(lb["bboxes"], np.concatenate([(lo + hi) / 2, hi - lo], 1), atol=1e-6)
    with pytest.raises(ConfigError, match=r"task=obb quality=90 \(this run asks for task=detect\)"):
        synth.run(dataclasses.replace(cfg, task="detect"))


def test_obb_figures_lie_in_their_turned_boxes_at_angles_of_every_kind():
    """Inside each turned box at least 30 % of the pixels are nearest the class's colour (the figure: a ring fills
    about half its box); the corners run clockwise, at more angles than the four right ones."""
    colours = np.array(list(synth.COLOURS.values()), np.float32)
    ids = synth.class_ids(8)
    angles = []
    for index in range(8):
        s = synth.render_obb(6, "train", index, 160, 8, 6, 14)
        assert len(s.corners) == len(s.classes) >= 1
        nearest = np.abs(s.image[:, :, None].astype(np.float32) - colours).sum(-1).argmin(-1)
        for quad, label in zip(s.corners, s.classes.tolist()):
            edge, turn = quad[1] - quad[0], quad[2] - quad[1]
            assert edge[0] * turn[1] - edge[1] * turn[0] > 0  # clockwise on the image (y down)
            angles.append(math.degrees(math.atan2(edge[1], edge[0])) % 90)
            inside = np.zeros(s.image.shape[:2], np.uint8)
            cv2.fillPoly(inside, [np.round(quad).astype(np.int32)], 1)
            hits = np.bincount(nearest[inside.astype(bool)], minlength=len(colours))
            assert hits[ids[label] % len(colours)] >= 0.3 * hits.sum(), (index, label, hits)
    assert np.histogram(angles, bins=3, range=(0, 90))[0].min() >= 2


# -- task=segment ------------------------------------------------------------------------------------------------------
def test_segment_sets_are_the_detection_pictures_labelled_by_outlines_ultralytics_reads(segment_root, tmp_path):
    """task=segment writes task=detect's pictures byte for byte; Ultralytics' segment dataset reads every image and
    row, each polygon as written (3 points or more), its box enclosing it; each outline runs along its figure: the
    polygon filled covers the figure's pixels (its outer boundary: a ring's hole too) and little more."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    detect = synth.run(SynthConfig(out=str(tmp_path / "d"), n_train=12, n_val=4, imgsz=128, seed=5, classes=8,
                                   boxes=6, min_box=12, workers=1)).parent
    for p in sorted((detect / "images").rglob("*.jpg")):
        assert p.read_bytes() == (segment_root / p.relative_to(detect)).read_bytes()
    data = check_det_dataset(str(segment_root / "data.yaml"), autodownload=False)
    for split, n in (("train", 12), ("val", 4)):
        ref = YOLODataset(img_path=data[split], imgsz=128, augment=False, data=data, hyp=get_cfg(), batch_size=4,
                          rect=False, task="segment")
        assert len(ref.labels) == n
        for lb in ref.labels:
            rows = (segment_root / "labels" / split / f"{Path(lb['im_file']).stem}.txt").read_text().splitlines()
            assert len(rows) == len(lb["segments"]) == len(lb["cls"]) > 0
            for row, poly, box in zip(rows, lb["segments"], lb["bboxes"]):
                written = np.array(row.split()[1:], np.float32).reshape(-1, 2)
                np.testing.assert_array_equal(poly, written)
                assert len(poly) >= 3 and np.allclose((poly.min(0) + poly.max(0)) / 2, box[:2], atol=1e-6)
    sample = synth.render(5, "train", 0, 128, 8, 6, 12)
    outlined = synth.with_polygons(sample, 8)
    h, w = sample.image.shape[:2]
    for (x1, y1, x2, y2), c, poly in zip(sample.boxes.tolist(), sample.classes.tolist(), outlined.polygons):
        shape = synth.SHAPES[synth.class_ids(8)[c] // len(synth.COLOURS)]
        figure = np.zeros((h, w), np.uint8)
        figure[y1:y2, x1:x2] = synth.figure_mask(shape, x2 - x1, y2 - y1)
        filled = np.zeros((h, w), np.uint8)
        cv2.fillPoly(filled, [np.round(poly - 0.5).astype(np.int32)], 1)
        assert (filled[figure > 0] == 1).mean() > 0.98, shape
        assert filled.sum() <= (x2 - x1) * (y2 - y1), shape  # inside its box


@pytest.mark.slow
def test_killing_synth_alone_leaves_no_worker(tmp_path):
    """SIGKILL to the synth process alone (not its group): its worker processes end with it, and the same command
    then completes the folder."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    cmd = [sys.executable, "-m", "yolofeed", "synth", f"out={tmp_path / 's'}", "n_train=4000", "n_val=10",
           "imgsz=320", "workers=2", "seed=3"]
    env = os.environ | {"YOLO_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while len(psutil.Process(proc.pid).children()) < 2 or not list((tmp_path / "s").rglob("*.jpg")):
            assert time.monotonic() - t0 < 60 and proc.poll() is None, "synth never started its workers"
            time.sleep(0.05)
        workers = psutil.Process(proc.pid).children()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers outlived their parent: {[p.pid for p in alive]}"
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=600).returncode == 0
