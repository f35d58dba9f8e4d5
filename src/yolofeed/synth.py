"""A synthetic, COCO-like YOLO dataset that the tests, the demo and every benchmark use.

It looks like COCO to the pipeline: JPEGs around 640x480 in several shapes (both sides of the
resize to imgsz are exercised), JPEG quality 90 with texture so a file weighs what a photo weighs
(about 60-150 KB at 640 px; ``quality=95``: about 155 KB, as COCO's photos; decode cost is what we
measure), 1-20 boxes per image over 80 classes.
Each class is a (shape, colour) pair drawn as a filled figure that touches its box on all four
sides, so the label is the figure's tight box and a detector can learn the classes. Figures never
overlap, so every labelled object is fully visible.

For accuracy comparisons the defaults are too hard to learn in a few dozen epochs (small figures,
80 classes that share shapes and colours): ``classes=8 boxes=8 min_box=16`` gives 8 classes that
differ in both shape and colour, fewer and larger figures, on which yolo11n learns quickly.

``task=pose`` adds five keypoints to each figure, in its own upright frame: the middle of its top, right, bottom
and left extremes (where it touches its box) and its box's centre, a model can find them as it finds the box. About
one point in ten is painted over by a grey disc (visibility 1: labelled, occluded), one in twenty is not labelled
(0 0 0, as COCO writes such a point), the rest are visible (2). The pictures are those of ``task=detect`` with the discs
added (their draws come from a stream of their own), and ``task=detect`` writes the bytes it always wrote.

``task=obb`` draws pictures of its own (a stream of their own): each figure turned by an angle drawn uniformly in
[0, 180) degrees about its centre, labelled by its turned box's 4 corners, clockwise on the image from the corner that
was its top left (``class x1 y1 x2 y2 x3 y3 x4 y4``, normalised, as Ultralytics' DOTA8), the whole turned box inside
the image and apart from the others' enclosing boxes.

``task=segment`` draws the pictures of ``task=detect`` (the same bytes) and labels each figure by its outline, a
polygon of pixel centres (``cv2.findContours``, its outer boundary: a ring's or frame's hole is inside the polygon),
as ``class x1 y1 x2 y2 ...``, normalised (Ultralytics' coco8-seg).

Files are a pure function of (seed, split, index): the same seed gives the same bytes, in any
number of processes.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import yaml
from tqdm import tqdm

from yolofeed.config import SynthConfig, worker_count
from yolofeed.errors import ConfigError
from yolofeed.pack.workers import Workers
from yolofeed.processes import signals_deferred

LOGGER = logging.getLogger(__name__)

SHAPES = ("rect", "ellipse", "triangle", "diamond", "cross", "ring", "hexagon", "frame")
# Ten hues far apart, full saturation: JPEG chroma subsampling blurs edges, not identity.
COLOURS = {
    "red": (220, 30, 30), "orange": (240, 140, 20), "yellow": (235, 220, 30), "lime": (140, 230, 30),
    "green": (20, 150, 50), "cyan": (30, 210, 220), "blue": (30, 60, 220), "purple": (130, 40, 200),
    "magenta": (230, 40, 180), "white": (245, 245, 245),
}
CLASS_NAMES = [f"{c}_{s}" for s in SHAPES for c in COLOURS]  # 80 classes: class id = shape * 10 + colour
DISTINCT = len(SHAPES)  # up to this many classes can differ from each other in shape and in colour
# (width, height) as fractions of imgsz: 4:3, 3:4, 1:1, 16:9, and larger/smaller than imgsz so the
# pack's resize both shrinks and enlarges. At imgsz=640 the first is 640x480.
SHAPE_CHOICES = ((1.0, 0.75), (1.0, 0.75), (1.0, 0.75), (0.75, 1.0), (1.0, 1.0), (1.0, 0.5625),
                 (1.25, 0.9375), (0.8, 0.6))
MIN_BOX = 8  # px: smaller figures are not learnable after JPEG and a 640 resize
MAX_BOXES = 20
JPEG_QUALITY = 90  # the default of quality=
SPLITS = {"train": 0, "val": 1}  # a split's term of the seed (others: 2)
KEYPOINTS = ("top", "right", "bottom", "left", "centre")  # task=pose: each figure's points, in its upright frame
# A mirror swaps the figure's right and left. Ultralytics applies one flip_idx to both flips: a flip upside down is a
# mirror too (a half turn and a left-right flip), so the figure's top point, now lowest, is still its top.
FLIP_IDX = [0, 3, 2, 1, 4]
OCCLUDED, UNLABELLED = 0.10, 0.05  # task=pose: shares of points painted over (visibility 1) and not labelled (0)


@dataclass(frozen=True)
class Sample:
    """One generated image before encoding.

    Shape:
        image: (H, W, 3) uint8 RGB. boxes: (N, 4) int pixel x1, y1, x2, y2 (x2, y2 exclusive).
        classes: (N,) int. keypoints: (N, K, 3) float64 pixel x, y and visibility (0, 1, 2), or None (detection).
        corners: (N, 4, 2) float64 pixel x, y of each figure's turned box (task=obb; ``boxes`` then encloses them,
            rounded outwards), or None.
        polygons: N arrays of (P, 2) float64 pixel x, y of each figure's outline (task=segment), or None.
    """

    image: np.ndarray
    boxes: np.ndarray
    classes: np.ndarray
    keypoints: np.ndarray | None = None
    corners: np.ndarray | None = None
    polygons: list[np.ndarray] | None = None


def figure_mask(shape: str, w: int, h: int) -> np.ndarray:
    """Boolean (h, w) mask of a figure that touches all four sides of its w x h box."""
    u = (np.arange(w) + 0.5) / w * 2 - 1  # pixel centres in [-1, 1]
    v = (np.arange(h) + 0.5) / h * 2 - 1
    x, y = np.abs(u)[None, :], np.abs(v)[:, None]
    ones = np.ones((h, w), bool)
    if shape == "rect":
        return ones
    if shape == "ellipse":
        return x**2 + y**2 <= 1 + 1 / min(w, h)  # the epsilon keeps the extreme pixel centres inside
    if shape == "triangle":  # apex at the top middle, base along the bottom
        return ones & (np.abs(u)[None, :] <= (v[:, None] + 1) / 2 + 1 / w)
    if shape == "diamond":
        return x + y <= 1 + 1 / min(w, h)
    if shape == "cross":
        return (x <= 0.34) | (y <= 0.34)
    if shape == "ring":
        r = x**2 + y**2
        return (r <= 1 + 1 / min(w, h)) & (r >= 0.3)
    if shape == "hexagon":  # points left and right, flat top and bottom
        return ones & (x <= 1 - 0.5 * y + 1 / w)
    if shape == "frame":
        return ~((x < 0.5) & (y < 0.5))
    raise ValueError(f"unknown shape {shape}")


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Smooth colour fields plus fine grain: about the entropy of a photo, so JPEGs weigh like photos."""
    coarse = rng.uniform(40, 215, size=(max(2, h // 80), max(2, w // 80), 3)).astype(np.float32)
    base = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    mid = cv2.resize(rng.normal(0, 18, size=(h // 8, w // 8, 3)).astype(np.float32), (w, h),
                     interpolation=cv2.INTER_LINEAR)
    return base + mid


def class_ids(classes: int = len(CLASS_NAMES)) -> list[int]:
    """Which of the 80 (shape, colour) classes a dataset of ``classes`` classes uses, in label order.

    Up to ``DISTINCT`` classes: shape k in colour k, so no two share a shape or a colour; more: the
    first ``classes`` of the 80.
    """
    if not 1 <= classes <= len(CLASS_NAMES):
        raise ConfigError(f"classes={classes}: expected 1 to {len(CLASS_NAMES)}")
    if classes <= DISTINCT:
        return [k * len(COLOURS) + k for k in range(classes)]
    return list(range(classes))


def render(seed: int, split: str, index: int, imgsz: int = 640, classes: int = len(CLASS_NAMES),
           boxes: int = MAX_BOXES, min_box: int = MIN_BOX) -> Sample:
    """Draw image ``index`` of ``split``: a pure function of its arguments.

    Args:
        classes: how many classes (``class_ids``); labels are 0 .. classes - 1.
        boxes: at most this many figures (1 to ``boxes``, uniformly).
        min_box: the smallest figure side, in pixels of the drawn image.
    """
    ids = class_ids(classes)
    rng = np.random.default_rng([seed, SPLITS.get(split, 2), index])
    fw, fh = SHAPE_CHOICES[rng.integers(len(SHAPE_CHOICES))]
    w, h = max(32, round(imgsz * fw)), max(32, round(imgsz * fh))
    img = _background(rng, h, w)
    occupied = np.zeros((h, w), bool)
    drawn, labels = [], []
    want = int(rng.integers(1, boxes + 1))
    max_side = max(min_box + 1, int(0.6 * min(h, w)))
    for _ in range(want * 30):  # rejection sampling for non-overlapping figures
        if len(drawn) == want:
            break
        # log-uniform sizes: many small objects, some large, as in COCO
        bw = int(math.exp(rng.uniform(math.log(min_box), math.log(max_side))))
        bh = int(np.clip(bw * math.exp(rng.uniform(-0.7, 0.7)), min_box, max_side))
        x1, y1 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
        if occupied[max(0, y1 - 2):y1 + bh + 2, max(0, x1 - 2):x1 + bw + 2].any():
            continue
        label = int(rng.integers(len(ids)))
        cls = ids[label]
        mask = figure_mask(SHAPES[cls // len(COLOURS)], bw, bh)
        colour = np.array(list(COLOURS.values())[cls % len(COLOURS)], np.float32)
        region = img[y1:y1 + bh, x1:x1 + bw]
        region[mask] = colour + (region[mask] - region[mask].mean(0)) * 0.25  # keep some texture
        occupied[y1:y1 + bh, x1:x1 + bw] = True
        drawn.append((x1, y1, x1 + bw, y1 + bh))
        labels.append(label)
    img += rng.normal(0, 6, size=img.shape).astype(np.float32)  # sensor grain over everything
    image = np.clip(img, 0, 255).astype(np.uint8)
    return Sample(image, np.array(drawn, np.int64).reshape(-1, 4), np.array(labels, np.int64))


def figure_keypoints(shape: str, x1: int, y1: int, x2: int, y2: int) -> np.ndarray:
    """(5, 2) pixel x, y of ``KEYPOINTS``: where the figure touches the top, right, bottom and left sides of its box
    (the middle of the pixels it has there, on the box's edge), and the box's centre."""
    m = figure_mask(shape, x2 - x1, y2 - y1)
    cols, rows = np.arange(x2 - x1) + 0.5, np.arange(y2 - y1) + 0.5  # pixel centres
    return np.array([[x1 + cols[m[0]].mean(), y1], [x2, y1 + rows[m[:, -1]].mean()],
                     [x1 + cols[m[-1]].mean(), y2], [x1, y1 + rows[m[:, 0]].mean()],
                     [(x1 + x2) / 2, (y1 + y2) / 2]], np.float64)


def with_keypoints(sample: Sample, seed: int, split: str, index: int, classes: int = len(CLASS_NAMES)) -> Sample:
    """``sample`` with its figures' keypoints (``figure_keypoints``), some painted over (visibility 1) or left
    unlabelled (0), a pure function of its arguments; the discs are drawn from a stream of their own, so the
    detection sample's draws, and its bytes, stay as they are.

    Args:
        classes: as for ``render`` (which class is which figure).
    """
    ids = class_ids(classes)
    rng = np.random.default_rng([seed, SPLITS.get(split, 2), index, 1])
    image = sample.image.copy()
    points = np.zeros((len(sample.boxes), len(KEYPOINTS), 3))
    draw = rng.random((len(sample.boxes), len(KEYPOINTS)))
    for k, ((x1, y1, x2, y2), label) in enumerate(zip(sample.boxes.tolist(), sample.classes.tolist())):
        xy = figure_keypoints(SHAPES[ids[label] // len(COLOURS)], x1, y1, x2, y2)
        points[k, :, :2], points[k, :, 2] = xy, 2
        radius = max(2.0, 0.25 * min(x2 - x1, y2 - y1))
        yy, xx = np.mgrid[y1:y2, x1:x2] + 0.5
        for j in np.nonzero(draw[k] < OCCLUDED)[0]:  # a grey disc over the point, inside the figure's box only
            disc = (xx - xy[j, 0]) ** 2 + (yy - xy[j, 1]) ** 2 <= radius**2
            grey = rng.uniform(90, 170) + rng.normal(0, 6, size=(int(disc.sum()), 1))
            image[y1:y2, x1:x2][disc] = np.clip(grey, 0, 255).astype(np.uint8)
            points[k, j, 2] = 1
        points[k, (draw[k] >= OCCLUDED) & (draw[k] < OCCLUDED + UNLABELLED)] = 0  # not labelled: 0 0 0
    return dataclasses.replace(sample, image=image, keypoints=points)


def render_obb(seed: int, split: str, index: int, imgsz: int = 640, classes: int = len(CLASS_NAMES),
               boxes: int = MAX_BOXES, min_box: int = MIN_BOX) -> Sample:
    """Draw image ``index`` of ``split`` for ``task=obb``: figures turned about their centres, a pure function of its
    arguments (a stream of draws of its own, so ``render``'s are untouched). Arguments as for ``render``; ``min_box``
    bounds the figure's own sides, before turning.
    """
    ids = class_ids(classes)
    rng = np.random.default_rng([seed, SPLITS.get(split, 2), index, 2])
    fw, fh = SHAPE_CHOICES[rng.integers(len(SHAPE_CHOICES))]
    w, h = max(32, round(imgsz * fw)), max(32, round(imgsz * fh))
    img = _background(rng, h, w)
    occupied = np.zeros((h, w), bool)
    drawn, labels, corners = [], [], []
    want = int(rng.integers(1, boxes + 1))
    max_side = max(min_box + 1, int(0.42 * min(h, w)))  # a turned figure's enclosing box is up to 1.41 x its side
    for _ in range(want * 30):
        if len(drawn) == want:
            break
        bw = int(math.exp(rng.uniform(math.log(min_box), math.log(max_side))))
        bh = int(np.clip(bw * math.exp(rng.uniform(-0.7, 0.7)), min_box, max_side))
        theta = rng.uniform(0, math.pi)
        c, s = math.cos(theta), math.sin(theta)
        ew, eh = abs(bw * c) + abs(bh * s), abs(bw * s) + abs(bh * c)  # the turned box's enclosing box
        if ew >= w - 1 or eh >= h - 1:
            continue
        cx, cy = rng.uniform(ew / 2, w - ew / 2), rng.uniform(eh / 2, h - eh / 2)
        local = np.array([[-bw, -bh], [bw, -bh], [bw, bh], [-bw, bh]], np.float64) / 2  # clockwise, y down
        quad = local @ np.array([[c, s], [-s, c]]) + (cx, cy)  # turned by theta (clockwise on the image)
        x1, y1 = int(math.floor(quad[:, 0].min())), int(math.floor(quad[:, 1].min()))
        x2, y2 = int(math.ceil(quad[:, 0].max())), int(math.ceil(quad[:, 1].max()))
        if occupied[max(0, y1 - 2):y2 + 2, max(0, x1 - 2):x2 + 2].any():
            continue
        label = int(rng.integers(len(ids)))
        cls = ids[label]
        mask = figure_mask(SHAPES[cls // len(COLOURS)], bw, bh)
        yy, xx = np.mgrid[y1:y2, x1:x2] + 0.5  # pixel centres of the enclosing box, into the figure's own frame
        u = (xx - cx) * c + (yy - cy) * s + bw / 2
        v = -(xx - cx) * s + (yy - cy) * c + bh / 2
        inside = (u >= 0) & (u < bw) & (v >= 0) & (v < bh)
        inside[inside] = mask[v[inside].astype(int), u[inside].astype(int)]
        colour = np.array(list(COLOURS.values())[cls % len(COLOURS)], np.float32)
        region = img[y1:y2, x1:x2]
        region[inside] = colour + (region[inside] - region[inside].mean(0)) * 0.25
        occupied[y1:y2, x1:x2] = True
        drawn.append((x1, y1, x2, y2))
        labels.append(label)
        corners.append(quad)
    img += rng.normal(0, 6, size=img.shape).astype(np.float32)
    image = np.clip(img, 0, 255).astype(np.uint8)
    return Sample(image, np.array(drawn, np.int64).reshape(-1, 4), np.array(labels, np.int64),
                  corners=np.array(corners, np.float64).reshape(-1, 4, 2))


def figure_outline(shape: str, x1: int, y1: int, x2: int, y2: int) -> np.ndarray:
    """(P, 2) float64 pixel x, y of the outline of a figure drawn in the box (x1, y1, x2, y2): the centres of its
    boundary pixels where the boundary turns (``cv2.findContours``' simple chain), its largest outer contour."""
    mask = figure_mask(shape, x2 - x1, y2 - y1).astype(np.uint8)
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    outline = max(contours, key=cv2.contourArea).reshape(-1, 2).astype(np.float64)
    if len(outline) < 3:  # a figure one pixel thin: its box's corners
        outline = np.array([[0, 0], [x2 - x1 - 1, 0], [x2 - x1 - 1, y2 - y1 - 1], [0, y2 - y1 - 1]], np.float64)
    return outline + 0.5 + np.array([x1, y1])


def with_polygons(sample: Sample, classes: int = len(CLASS_NAMES)) -> Sample:
    """``sample`` (of ``render``) with each figure's outline: no draw of its own, so the pictures stay detect's."""
    ids = class_ids(classes)
    polygons = [figure_outline(SHAPES[ids[c] // len(COLOURS)], *box)
                for box, c in zip(sample.boxes.tolist(), sample.classes.tolist())]
    return dataclasses.replace(sample, polygons=polygons)


def label_text(sample: Sample) -> str:
    """YOLO label lines: class x_centre y_centre width height, normalised to [0, 1]; with keypoints, each point's
    x y (normalised) and visibility after them; with corners (task=obb), class and the 4 corners' x y instead; with
    polygons (task=segment), class and the polygon's points' x y."""
    h, w = sample.image.shape[:2]
    if sample.polygons is not None:
        return "".join(f"{c} " + " ".join(f"{x / w:.6f} {y / h:.6f}" for x, y in poly.tolist()) + "\n"
                       for c, poly in zip(sample.classes.tolist(), sample.polygons)) or "\n"
    if sample.corners is not None:
        return "".join(f"{c} " + " ".join(f"{x / w:.6f} {y / h:.6f}" for x, y in quad.tolist()) + "\n"
                       for c, quad in zip(sample.classes.tolist(), sample.corners)) or "\n"
    rows = []
    for k, ((x1, y1, x2, y2), c) in enumerate(zip(sample.boxes.tolist(), sample.classes.tolist())):
        row = f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}"
        if sample.keypoints is not None:
            row += "".join(f" {x / w:.6f} {y / h:.6f} {int(v)}" for x, y, v in sample.keypoints[k].tolist())
        rows.append(row)
    return "\n".join(rows) + "\n"


def _write_one(args: tuple[Path, SynthConfig, str, int]) -> int:
    root, cfg, split, index = args
    draw = render_obb if cfg.task == "obb" else render
    sample = draw(cfg.seed, split, index, cfg.imgsz, cfg.classes, cfg.boxes, cfg.min_box)
    if cfg.task == "pose":
        sample = with_keypoints(sample, cfg.seed, split, index, cfg.classes)
    elif cfg.task == "segment":
        sample = with_polygons(sample, cfg.classes)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(sample.image, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, cfg.quality])
    if not ok:
        raise RuntimeError(f"OpenCV could not encode synthetic image {split}/{index}")
    stem = f"{split}_{index:06d}"
    _atomic_write(root / "images" / split / f"{stem}.jpg", buf.tobytes())
    _atomic_write(root / "labels" / split / f"{stem}.txt", label_text(sample).encode())
    return len(buf)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a killed run never leaves a half-written image that looks whole


def _jobs(root: Path, cfg: SynthConfig) -> Iterator[tuple[Path, SynthConfig, str, int]]:
    for split, n in (("train", cfg.n_train), ("val", cfg.n_val)):
        for i in range(n):
            yield root, cfg, split, i


MANIFEST = "synth.json"  # in out=: the settings that wrote the folder; the same settings again rewrite the same bytes
MIN_IMGSZ = 32  # px: the smallest image side render draws
# px: the largest imgsz drawn. An image is up to 1.25 x imgsz wide, and its texture is drawn in float32: at 4096 about
# 1 GB and 13 s an image on one core, with one image a worker in memory at once
MAX_IMGSZ = 4096
BOXES_LIMIT = 1000  # figures an image at most: about 0.3 s at 640 px (Ultralytics keeps 300 detections an image)


def smallest_side(imgsz: int) -> int:
    """The shortest side of any image ``render`` draws at ``imgsz``."""
    return min(max(MIN_IMGSZ, round(imgsz * f)) for shape in SHAPE_CHOICES for f in shape)


def manifest(cfg: SynthConfig) -> dict:
    """What makes the files of ``out=``: every setting but the number of processes (the bytes do not depend on it)."""
    written = {"generator": "yolofeed synth", "seed": cfg.seed, "n_train": cfg.n_train, "n_val": cfg.n_val,
               "imgsz": cfg.imgsz, "classes": cfg.classes, "boxes": cfg.boxes, "min_box": cfg.min_box}
    if cfg.quality != JPEG_QUALITY:  # named only when not the default: folders written before it existed still match
        written["quality"] = cfg.quality
    if cfg.task != "detect":  # the same
        written["task"] = cfg.task
    return written


def _settings(written: dict) -> dict:
    """A manifest with the keys it names only when not the default (task, quality) named."""
    rest = {k: v for k, v in written.items() if k not in ("task", "quality")}
    return {**rest, "task": written.get("task", "detect"), "quality": written.get("quality", JPEG_QUALITY)}


def check(cfg: SynthConfig) -> Path:
    """Refuse settings that cannot make the dataset asked for, and an ``out=`` that holds another one.

    A folder written by the same settings (its ``synth.json`` says so) is fine: the run rewrites the same
    bytes, so ``make demo`` can run again. A folder with another dataset in it (other settings, or files
    and no ``synth.json``) is refused: new files would mix with its old ones.

    Returns:
        The dataset's folder, absolute.

    Raises:
        ConfigError: a count or a seed below 0, imgsz below 32 or above 4096, boxes above 1000 or a box setting
            that cannot be drawn, out= a file or a folder holding another dataset.
    """
    class_ids(cfg.classes)
    if cfg.n_train < 0 or cfg.n_val < 0:
        raise ConfigError(f"n_train={cfg.n_train} n_val={cfg.n_val}: image counts cannot be negative")
    if cfg.imgsz < MIN_IMGSZ:
        raise ConfigError(f"imgsz={cfg.imgsz}: expected at least {MIN_IMGSZ} (the long side of the commonest image)")
    if cfg.imgsz > MAX_IMGSZ:
        raise ConfigError(f"imgsz={cfg.imgsz}: expected at most {MAX_IMGSZ} (an image of imgsz=4096 takes about 1 GB "
                          "and 13 s to draw, in each worker)")
    if cfg.seed < 0:
        raise ConfigError(f"seed={cfg.seed}: expected 0 or more (the same seed writes the same files)")
    if cfg.task not in ("detect", "pose", "obb", "segment"):
        raise ConfigError(f"task={cfg.task}: expected detect, pose, obb or segment")
    if not 1 <= cfg.quality <= 100:
        raise ConfigError(f"quality={cfg.quality}: JPEG quality runs from 1 to 100 (90 is the default, 95 weighs "
                          "about what COCO's photos do)")
    if cfg.boxes > BOXES_LIMIT:
        raise ConfigError(f"boxes={cfg.boxes}: expected at most {BOXES_LIMIT} figures an image (Ultralytics keeps "
                          "300 detections an image)")
    if cfg.boxes < 1 or cfg.min_box < 2:
        raise ConfigError(f"boxes={cfg.boxes} min_box={cfg.min_box}: expected at least 1 box per image and "
                          "figures of at least 2 px")
    side = smallest_side(cfg.imgsz)
    if cfg.min_box >= side:  # render may draw a figure min_box + 1 px tall: it must fit inside every image
        raise ConfigError(f"min_box={cfg.min_box}: figures that large do not fit the smallest images of imgsz="
                          f"{cfg.imgsz} ({side} px on their short side); use min_box={side - 1} or less, or a larger "
                          "imgsz=")
    try:
        root = Path(cfg.out).expanduser().resolve()
    except (RuntimeError, OSError) as e:  # a symbolic link loop
        raise ConfigError(f"out={cfg.out}: cannot resolve the path ({e})") from None
    if root.exists() and not root.is_dir():
        raise ConfigError(f"out={cfg.out} is a file; out= names the folder the dataset is written to (made if "
                          "missing)")
    found = [p.name for p in (root / "data.yaml", root / "images", root / "labels") if p.exists()]
    if found:
        try:
            written = json.loads((root / MANIFEST).read_text())
        except (OSError, ValueError):
            written = None
        asked = _settings(manifest(cfg))  # a manifest without quality (or task) was written at the default
        if isinstance(written, dict):
            written = _settings(written)
        if written != asked:
            if isinstance(written, dict):
                differ = " ".join(f"{k}={v}" for k, v in asked.items() if written.get(k) != v)
                was = (" with " + " ".join(f"{k}={v}" for k, v in written.items() if k != "generator")
                       + f" (this run asks for {differ})")
            else:
                was = f" ({', '.join(found)}, and no {MANIFEST} of yolofeed synth)"
            raise ConfigError(f"out={cfg.out} already holds another dataset{was}; new files would mix with its old "
                              "ones. Choose another out=, or delete that folder first")
    return root


def run(cfg: SynthConfig) -> Path:
    """Write the dataset described by ``cfg``; returns the path of its data.yaml.

    Raises:
        ConfigError: see ``check``.
    """
    names = [CLASS_NAMES[i] for i in class_ids(cfg.classes)]
    root = check(cfg)
    root.mkdir(parents=True, exist_ok=True)
    # first: a run stopped half-way leaves a folder the same command completes, and another one refuses
    _atomic_write(root / MANIFEST, json.dumps(manifest(cfg), indent=1).encode())
    for split in ("train", "val"):
        for kind in ("images", "labels"):
            (root / kind / split).mkdir(parents=True, exist_ok=True)
    total = cfg.n_train + cfg.n_val
    workers = worker_count(cfg.workers)
    nbytes = 0
    jobs = _jobs(root, cfg)
    # 16 images a worker's turn; one where an image takes seconds: a signal is acted on between chunks
    per_chunk = 16 if cfg.imgsz <= 1280 else 1
    chunks = iter(lambda: list(itertools.islice(jobs, per_chunk)), [])
    pool = Workers(workers, _no_setup, ())
    try:
        with signals_deferred() as act_on_signals, tqdm(total=total, desc=f"synth {root}", unit="img") as bar:
            for size in pool.imap(_write_chunk, chunks, act_on_signals):
                nbytes += size
                bar.update()
    except BaseException:
        pool.stop()  # Ctrl-C: a rerun of the same command completes the folder
        raise
    pool.close()
    data = {"path": str(root), "train": str(root / "images" / "train"), "val": str(root / "images" / "val")}
    if cfg.task == "pose":  # where Ultralytics' coco8-pose.yaml has them
        data |= {"kpt_shape": [len(KEYPOINTS), 3], "flip_idx": FLIP_IDX}
    data |= {"nc": len(names), "names": dict(enumerate(names))}
    if cfg.task == "pose":
        data["kpt_names"] = {i: list(KEYPOINTS) for i in range(len(names))}
    (root / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    LOGGER.info(f"synth: {total} images ({nbytes / max(total, 1) / 1e3:.0f} KB mean) in {root}\n"
                f"data yaml: {root / 'data.yaml'}")
    return root / "data.yaml"


def _no_setup() -> None:
    pass


def _write_chunk(jobs: list[tuple[Path, SynthConfig, str, int]]) -> list[int]:
    return [_write_one(job) for job in jobs]
