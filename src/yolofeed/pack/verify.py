"""Check and decode one sample with Ultralytics' rules, never touching the user's files; its codec stores it.

The rules are those of ``ultralytics.data.utils.verify_image_label`` (``read_labels`` for detection,
``read_pose_labels`` for pose, ``read_obb_labels`` for OBB, which takes detection's segment path and refuses two
files Ultralytics does not skip: its docstring says which) in the installed release (``ultralytics_seam.LABEL_RULES``:
a few changed within the range yolofeed supports, and a pack records which it was built under) and the pixels those of
``BaseDataset.load_image``: the same decoder
(``ultralytics.utils.patches.imread``), the same long-side resize with ``cv2.INTER_LINEAR``. Two deliberate
differences, both to keep the user's data intact and the run offline:

* A JPEG with bytes after its end marker is "restored" by Ultralytics by rewriting the file; we
  build the same restored bytes in memory (Pillow, quality 100, no subsampling) and decode those,
  so the pixels equal what Ultralytics trains on after its rewrite.
* A file Pillow cannot identify makes Ultralytics pip-install ``pi-heif``; we use Pillow's own
  opener and report the file (registering pi-heif only if it is already installed).

And one in the labels: a pose row's box and visibility are only checked from below by Ultralytics, so ``inf`` passes
there; a pack holds finite numbers, and such a row is refused (a finite box above 1 passes, as there).
"""

from __future__ import annotations

import errno
import io
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

import cv2
import numpy as np
from PIL import Image, ImageOps

from yolofeed.ultralytics_seam import (
    IMG_FORMATS,
    LABEL_RULES,
    LabelRules,
    exif_size,
    imread,
    pil_open,
    restores_in_place,
    segments2boxes,
)


class SampleError(Exception):
    """This sample cannot be used; the message is the reason shown in the pack report (long ones shortened in the
    middle: a binary file's bytes quoted by a parser must not fill the report)."""

    LIMIT = 400  # characters

    def __init__(self, message: str = ""):
        if len(message) > self.LIMIT:
            message = f"{message[:self.LIMIT - 80]} [...] {message[-70:]}"
        super().__init__(message)


@dataclass
class ImageInfo:
    """What the header check learnt about an image, before any decode."""

    hw: tuple[int, int]  # EXIF-corrected (height, width), as Ultralytics records in its label cache
    format: str  # Pillow's format name, upper case
    orientation: int  # EXIF orientation tag, 1 when absent
    mode: str  # Pillow's mode: "RGB", "L", "CMYK", ...
    restored: bytes | None = None  # in-memory restoration of a JPEG with trailing bytes


@dataclass
class Sample:
    """One verified sample, ready for the store.

    Shape:
        payload: the bytes the pack stores, as the format's codec encoded them (``Codec.encode``).
        labels: (n, 5) float32 rows [class, x_centre, y_centre, width, height], normalised.
        keypoints: (n, K, 3) float32 normalised x, y and visibility, one row per label (pose); None for detection.
        corners: (n, 4, 2) float32 normalised x, y of each label's rotated box (obb); None otherwise.
        polygons: n arrays of (P_j, 2) float32 normalised x, y, each label's polygon as written (segment); None
            otherwise.
    """

    payload: np.ndarray
    ori_hw: tuple[int, int]
    hw: tuple[int, int]
    labels: np.ndarray
    notes: list[str] = field(default_factory=list)
    keypoints: np.ndarray | None = None
    corners: np.ndarray | None = None
    polygons: list[np.ndarray] | None = None


def _is_heif(path: str) -> bool:
    """Whether the file starts as an ISO media file (HEIC/HEIF/AVIF: an ``ftyp`` box at byte 4)."""
    with open(path, "rb") as f:
        return f.read(12)[4:8] == b"ftyp"


def _open(path: str) -> Image.Image:
    try:
        return pil_open(path)
    except Image.UnidentifiedImageError:
        if not _is_heif(path):
            raise SampleError("not an image: Pillow recognises no image format in its bytes (a text or other file "
                              "with an image's name?); replace it with the image or remove it") from None
        try:  # HEIC/HEIF: only with the plugin the user already has; never install at run time
            from pi_heif import register_heif_opener
        except ImportError:
            raise SampleError("a HEIC/HEIF image, which Pillow reads only with 'pip install pi-heif'; "
                              "convert it to JPEG or PNG or remove it") from None
        register_heif_opener()
        return pil_open(path)


def file_problem(path: str) -> str:
    """Why ``path`` cannot be read as an image file, found without opening it; "" when it can be.

    One ``os.stat``. A FIFO (or a socket, a device) is refused here because opening it would block
    the reader forever (Ultralytics hangs on one); a folder, a broken link or a link loop, an empty
    file each get their own reason rather than Pillow's "cannot identify" for all of them.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "image file not found" + (" (a broken symbolic link)" if os.path.islink(path) else "")
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop: point the link at an image file or remove it"
        return f"cannot read the file ({e.strerror or e}); check its permissions or remove it"
    if stat.S_ISDIR(st.st_mode):
        return "a folder with an image's name, not an image file: rename or remove it"
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket or device"
        return (f"not a regular file but {kind}, never read (a read could block forever): replace it with the image "
                "file or remove it")
    if st.st_size == 0:  # say so, rather than Pillow's "cannot identify" and the HEIC hint
        return "empty file (0 bytes): re-export the image or remove it"
    return ""


def check_image(path: str, rules: LabelRules = LABEL_RULES) -> ImageInfo:
    """Ultralytics' ``check_image`` without its rewrite: integrity, size >= 10 px, a known format (``rules``: the
    installed release's; JPEG 2000 from 8.4.164).

    Raises:
        SampleError: the file is missing, not a regular file, empty, unreadable, truncated, too small or of
            an unknown format.
    """
    problem = file_problem(path)
    if problem:
        raise SampleError(problem)
    try:
        with _open(path) as im:
            im.verify()  # Pillow's integrity check: headers and, for PNG, chunk CRCs
            w, h = exif_size(im)
            fmt, mode = (im.format or "").upper(), im.mode
            try:
                orientation = int(im.getexif().get(274, 1) or 1)
            except Exception:  # malformed EXIF: Ultralytics' exif_size ignores it too
                orientation = 1
    except SampleError:
        raise
    except FileNotFoundError:
        raise SampleError("image file not found") from None
    except OSError as e:
        if e.errno is None:  # Pillow's own errors ("image file is truncated") carry no errno
            raise SampleError(f"not a readable image ({e}): the file is corrupt or truncated; re-export or remove "
                              "it") from None
        raise SampleError(f"cannot read the file ({e.strerror or e}); check its permissions or remove it") from None
    except Image.DecompressionBombError as e:  # Ultralytics skips it too: its Image.open raises the same
        raise SampleError(f"image too large for Pillow ({e}): Ultralytics skips it too; downscale it") from None
    except Exception as e:
        raise SampleError(f"not a readable image ({e}): the file is corrupt or truncated; "
                          "re-export or remove it") from None
    if h < rules.min_side or w < rules.min_side:
        raise SampleError(f"image is {w}x{h} px; Ultralytics needs at least {rules.min_side} px a side: remove it")
    if fmt.lower() not in IMG_FORMATS | ({"jpeg2000"} if rules.jpeg2000 else set()):
        raise SampleError(f"image format {fmt or 'unknown'} is not one Ultralytics reads; convert it to JPEG or PNG")
    info = ImageInfo((h, w), fmt, orientation, mode)
    if fmt in ("JPEG", "JPG"):
        with open(path, "rb") as f:
            f.seek(-2, os.SEEK_END)
            if f.read() != b"\xff\xd9":  # no end-of-image marker last: Ultralytics restores it
                info.restored = _restore_jpeg(path)
    return info


def _restore_jpeg(path: str) -> bytes:
    """The bytes Ultralytics would write over a JPEG with trailing data (it fails the same way on a truncated one)."""
    try:
        with pil_open(path) as im:
            upright = ImageOps.exif_transpose(im)
            buf = io.BytesIO()
            upright.save(buf, "JPEG", subsampling=0, quality=100)
            return buf.getvalue()
    except Exception as e:
        raise SampleError(f"JPEG is truncated or corrupt ({e}); re-export or remove it") from None


def _rows(lb_file: str, rules: LabelRules = LABEL_RULES) -> list[list[str]] | None:
    """The label file's rows of words, as the installed Ultralytics splits them; None when there is no file.

    Raises:
        SampleError: not readable as text in ``rules.encoding``.
    """
    if not os.path.isfile(lb_file):
        return None
    try:
        with open(lb_file, encoding=rules.encoding) as f:
            lines = f.read().strip().splitlines()
    except UnicodeDecodeError as e:
        raise SampleError(f"cannot read label file {lb_file} ({e}); it must be UTF-8 text") from None
    except OSError as e:  # permissions, a folder or a FIFO with a label's name, an I/O error
        raise SampleError(f"cannot read label file {lb_file} ({e.strerror or e}); check its permissions or remove "
                          "it") from None
    return [x.split() for x in lines if (x.strip() if rules.blank_lines else x)]


def _check_values(lb: np.ndarray, lb_file: str, nc: int, rules: LabelRules = LABEL_RULES) -> None:
    """Ultralytics' checks every row of a task shares: finite, not negative (boxes to -0.01), whole classes < nc, as
    the installed release checks them (``rules``).

    Raises:
        SampleError: the first rule broken, with the file and the fix.
    """
    if not np.isfinite(lb).all():
        raise SampleError(f"{lb_file} holds NaN or infinite values; fix or remove those rows")
    low = lb.min()
    if not (low >= 0 or (low >= -rules.negative and (not rules.negative_sizes or lb[:, 3:5].min() >= 0))):
        raise SampleError(f"{lb_file} has negative values ({_values(lb[lb < 0])}); fix those rows")
    if rules.integer_classes and not (lb[:, 0] % 1 == 0).all():
        raise SampleError(f"{lb_file} has non-integer class ids ({_values(lb[:, 0][lb[:, 0] % 1 != 0])}); class ids "
                          "are whole numbers from 0: fix those rows")
    if lb[:, 0].max() >= nc:
        raise SampleError(f"{lb_file} uses class {int(lb[:, 0].max())} but the data yaml has nc={nc} "
                          f"(classes 0-{nc - 1}); fix the label, or add the class to the yaml's names")


# Words of the skip reasons for files Ultralytics would not skip: it refuses the whole run on them, or trains them
# otherwise (an OBB polygon of other than 4 corners). A pack built with such skips is not stock's data: training
# refuses it (``not_stock_skips``), where stock would have refused the run or trained on those images.
WHOLE_RUN = "Ultralytics refuses the whole run on such a file"
FITTED_BY_STOCK = "yolo train fits a rotated box to such a polygon"


def not_stock_skips(skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The skipped files (file, reason) that Ultralytics would not have skipped (``WHOLE_RUN``, ``FITTED_BY_STOCK``)."""
    return [(f, r) for f, r in skipped if WHOLE_RUN in r or FITTED_BY_STOCK in r]


def _values(values: np.ndarray, first: int = 4) -> str:
    """The first of a label file's offending values as its text wrote them: the shortest text that reads back as the
    same float32 (-0.1, not -0.10000000149011612; 1.0100001, which 1.01 is not)."""
    return ", ".join(str(np.float32(v)) for v in np.asarray(values).ravel()[:first])


def read_labels(lb_file: str, nc: int, rules: LabelRules = LABEL_RULES,
                kpt_shape: tuple[int, int] | None = None) -> tuple[np.ndarray, list[str]]:
    """Parse and check a YOLO label file with Ultralytics' rules (``rules``: the installed release's; where the
    releases differ, ``LabelRules`` says how).

    Args:
        kpt_shape: the data yaml's (keypoints, dims), if it has one: a row of exactly 5 + K x D columns is a pose
            row, whose keypoints are dropped (Ultralytics' "pose labels for a box task: keep the box").

    Returns:
        labels: (n, 5) float32 [class, x, y, w, h]; duplicates removed (then in ``np.unique`` order,
            as Ultralytics leaves them): equal rows, or for polygons equal class and polygon (two polygons with one
            box are two labels, as in Ultralytics' ``verify_image_label`` from 8.4.165). Segment rows become their
            boxes.
        notes: "label file missing", "label file empty", "N duplicate labels removed".

    Raises:
        SampleError: columns, coordinates outside [0, 1], negative or non-finite values, fractional
            class ids or a class >= nc. The message names the file and the fix.
    """
    lb, _, notes = read_detect_labels(lb_file, nc, rules, kpt_shape)
    return lb, notes


def read_detect_labels(lb_file: str, nc: int, rules: LabelRules = LABEL_RULES,
                       kpt_shape: tuple[int, int] | None = None) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
    """``read_labels``, keeping a file's polygon rows: Ultralytics' detection dataset keeps them too (resampled to
    1,000 points), and its augmentation makes each box of its moved polygon where every label row of the split is
    one (``YOLODataset.get_labels``).

    Returns:
        labels, notes: as ``read_labels``. polygons: n arrays of (P_j, 2) float32 normalised x, y, polygon j that of
            labels row j, for a file of polygon rows; [] for a file of box rows.
    """
    rows = _rows(lb_file, rules)
    if rows is None:
        return np.zeros((0, 5), np.float32), [], ["label file missing: used as a background image"]
    if kpt_shape is not None and rules.pose_box_rows:
        rows = [r[:5] if len(r) == 5 + kpt_shape[0] * kpt_shape[1] else r for r in rows]
    lb, segments, notes = _box_rows(rows, lb_file, nc, rules)
    return lb, [np.ascontiguousarray(p, np.float32) for p in segments], notes


def _rows_problem(rows: list[list[str]], lb_file: str) -> str | None:
    """Which row of a label file numpy could not read, and why: the first with a value that is not a number, else the
    first box row whose count of values is not 5 among rows of 5; None where neither (the caller says numpy's
    reason). A row is the file's k-th row that holds anything."""
    for k, row in enumerate(rows, 1):
        bad = next((v for v in row if not _number(v)), None)
        if bad is not None:
            return (f"{lb_file} row {k} ('{_shown(row)}') holds {_word(bad)!r}, which is not a number: YOLO rows are "
                    "numbers (class x y w h); fix or remove that row")
    odd = next(((k, r) for k, r in enumerate(rows, 1) if len(r) != 5), None)
    if odd is not None and any(len(r) == 5 for r in rows) and not any(len(r) > 6 for r in rows):
        k, row = odd
        if not row:  # a blank line, which this release reads as a row
            return f"{lb_file} row {k} is blank among its box rows (class x y w h); remove that line"
        return (f"{lb_file} row {k} ('{_shown(row)}') has {len(row)} values where its other box rows have 5 "
                "(class x y w h); fix or remove that row")
    return None


def _number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _shown(row: list[str]) -> str:
    """A row as a message quotes it: its first 6 words, each of 20 characters at most."""
    return " ".join(_word(w) for w in row[:6]) + (" ..." if len(row) > 6 else "")


def _word(word: str, most: int = 20) -> str:
    return word if len(word) <= most else word[:most] + "..."


def _box_rows(rows: list[list[str]], lb_file: str, nc: int,
              rules: LabelRules = LABEL_RULES) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
    """``verify_image_label``'s rows without keypoints: box rows, or segment rows as their boxes (``read_labels``).

    Returns:
        labels: (n, 5) float32, duplicates removed. segments: the (P, 2) polygons of the rows kept ([] for box
            rows). notes: "label file empty", "N duplicate labels removed".
    """
    try:
        if any(len(r) > 6 for r in rows):  # segment polygons: class x1 y1 x2 y2 ...
            if any(len(r) == 5 for r in rows):
                raise SampleError(f"{lb_file} mixes segment and box rows; use one kind per file")
            # Ultralytics skips these files on a reshape or an empty reduction: say which row, in polygon words
            if (short := next((r for r in rows if len(r) % 2 == 0 or len(r) == 1), None)) is not None:
                what = "no point" if len(short) == 1 else f"an odd number of coordinates ({len(short) - 1})"
                raise SampleError(f"{lb_file} has a polygon row with {what} ('{' '.join(short[:5])}"
                                  f"{' ...' if len(short) > 5 else ''}'): polygon rows are the class, then x y "
                                  "pairs (class x1 y1 x2 y2 x3 y3 ...); fix or remove that row")
            classes = np.array([r[0] for r in rows], dtype=np.float32)
            segments = [np.array(r[1:], dtype=np.float32).reshape(-1, 2) for r in rows]
            lb = np.concatenate((classes.reshape(-1, 1), segments2boxes(segments)), 1)
        else:
            segments = []
            lb = np.array(rows, dtype=np.float32)
    except (ValueError, IndexError) as e:  # ragged rows, non-numeric text (a BOM too), odd polygon length, no value
        raise SampleError(_rows_problem(rows, lb_file)
                          or f"{lb_file} is not numeric YOLO rows of 'class x y w h' ({e}); fix the file") from None
    if not len(lb):
        return np.zeros((0, 5), np.float32), [], ["label file empty: used as a background image"]
    if lb.ndim != 2 or lb.shape[1] != 5:
        raise SampleError(f"{lb_file} rows have {lb.shape[-1]} columns; box rows have 5 (class x y w h), polygon rows "
                          "the class, then 3 or more x y points (class x1 y1 x2 y2 x3 y3 ...); fix the file")
    if np.isfinite(lb).all() and lb[:, 1:].max() > rules.coord_max:
        bad = lb[:, 1:][lb[:, 1:] > rules.coord_max]
        raise SampleError(f"{lb_file} has coordinates above 1 ({_values(bad)}): YOLO labels are normalised "
                          "to [0, 1] by image width and height; convert pixel boxes by dividing")
    _check_values(lb, lb_file, nc, rules)
    notes = []
    _, keep = np.unique(lb, axis=0, return_index=True)
    if len(keep) < len(lb) and segments and rules.polygon_duplicates:  # distinct polygons can share a box
        polygons = np.array([c.tobytes() + p.tobytes() for c, p in zip(lb[:, 0], segments)], dtype=object)
        _, keep = np.unique(polygons, return_index=True)
    if len(keep) < len(lb):
        notes.append(f"{len(lb) - len(keep)} duplicate labels removed")
        lb = lb[keep]
        segments = [segments[i] for i in keep] if segments else []
    return lb, segments, notes


def read_obb_labels(lb_file: str, nc: int, rules: LabelRules = LABEL_RULES,
                    kpt_shape: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Parse and check a YOLO OBB label file: ``verify_image_label`` for task=obb, which reads every row
    ``class x1 y1 x2 y2 x3 y3 x4 y4`` as a segment (``read_labels``' rules: its box the polygon's enclosing box, the
    bounds, signs and classes checked on that box, not on the corners; duplicates by class and polygon).

    Two rules are ours, both refusing the file where Ultralytics would not skip it: a file of box rows alone (5
    columns), for which Ultralytics' ``YOLODataset.verify_labels`` stops the whole run ("OBB dataset requires equal
    numbers of boxes and segments"), and a polygon of other than 4 corners, which Ultralytics fits a rotated box to
    (``cv2.minAreaRect``) where the pack keeps the 4 corners as they are written.

    Args:
        kpt_shape: as for ``read_labels`` (a pose row keeps its box, and is then a box row).

    Returns:
        labels: (n, 5) float32 [class, x, y, w, h], the box enclosing the corners (Ultralytics' ``segments2boxes``).
        corners: (n, 4, 2) float32 normalised x, y, row j the corners of labels row j.
        notes: "label file missing", "label file empty", "N duplicate labels removed".

    Raises:
        SampleError: Ultralytics' refusals as ``read_labels`` has them, a file of box rows, a row of another number
            of corners.
    """
    rows = _rows(lb_file, rules)
    if rows is None:
        return np.zeros((0, 5), np.float32), np.zeros((0, 4, 2), np.float32), ["label file missing: used as a "
                                                                               "background image"]
    pose_rows = kpt_shape is not None and any(len(r) == 5 + kpt_shape[0] * kpt_shape[1] for r in rows)
    if kpt_shape is not None:
        rows = [r[:5] if len(r) == 5 + kpt_shape[0] * kpt_shape[1] else r for r in rows]
    odd = next((len(r) for r in rows if len(r) != 5 and len(r) % 2 == 0), None)
    if odd is not None:  # an odd number of coordinates: no polygon (Ultralytics skips the file too)
        raise SampleError(f"{lb_file} has a row of {odd} columns; OBB labels require 9 columns each (class x1 y1 x2 "
                          "y2 x3 y3 x4 y4: the 4 corners); fix the file")
    lb, segments, notes = _box_rows(rows, lb_file, nc, rules)
    if len(lb) and not segments:
        what = (f"pose rows (class, box and {kpt_shape[0]} keypoints)" if pose_rows
                else "box rows of 5 columns (class x y w h)")
        raise SampleError(f"{lb_file} holds {what}; OBB labels require 9 columns each "
                          f"(class x1 y1 x2 y2 x3 y3 x4 y4: the 4 corners): {WHOLE_RUN} ('Please supply an OBB "
                          "dataset, not a detect dataset'); convert the rows or pack the yaml with task=detect")
    if any(len(p) != 4 for p in segments):
        n = next(len(p) for p in segments if len(p) != 4)
        raise SampleError(f"{lb_file} has a polygon of {n} points; OBB labels require 9 columns each (class and the 4 "
                          f"corners x1 y1 ... x4 y4 of the rotated box): {FITTED_BY_STOCK} (its minimum-area "
                          "rectangle, after each augmentation), yolofeed moves 4 corners; "
                          "write each object's 4 corners, or train this dataset with yolo train")
    corners = np.stack(segments) if segments else np.zeros((0, 4, 2), np.float32)
    return np.ascontiguousarray(lb), np.ascontiguousarray(corners, dtype=np.float32), notes


def read_segment_labels(lb_file: str, nc: int, rules: LabelRules = LABEL_RULES,
                        kpt_shape: tuple[int, int] | None = None) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
    """Parse and check a YOLO segment label file: ``verify_image_label`` for task=segment, which is detection's (rows
    ``class x1 y1 x2 y2 x3 y3 ...``, each becoming its enclosing box; ``read_labels``' rules and
    duplicates), keeping the polygons.

    One rule is ours, refusing the file where Ultralytics would not skip it: a file of box rows (5 columns), for which
    Ultralytics' ``YOLODataset.get_labels`` stops the whole run ("Segment dataset requires equal numbers of boxes and
    segments").

    Args:
        kpt_shape: as for ``read_labels``.

    Returns:
        labels: (n, 5) float32 [class, x, y, w, h], each the box enclosing its polygon (``segments2boxes``).
        polygons: n arrays of (P_j, 2) float32 normalised x, y, polygon j that of labels row j, as written.
        notes: "label file missing", "label file empty", "N duplicate labels removed".

    Raises:
        SampleError: Ultralytics' refusals as ``read_labels`` has them (a file mixing segment and box rows too), a
            file of box rows.
    """
    lb, segments, notes = read_detect_labels(lb_file, nc, rules, kpt_shape)
    if len(lb) and not segments:
        rows = ("box rows of 5 columns (class x y w h)" if kpt_shape is None else
                f"box rows (class x y w h, or a pose row's {5 + kpt_shape[0] * kpt_shape[1]} columns: its box and "
                f"{kpt_shape[0]} keypoints)")
        raise SampleError(f"{lb_file} holds {rows}; segment labels require a polygon "
                          f"each (class x1 y1 x2 y2 x3 y3 ...: 3 points or more): {WHOLE_RUN} ('Please supply a "
                          "segment dataset, not a detect dataset'); convert the rows or pack the yaml with task=detect")
    return np.ascontiguousarray(lb), segments, notes


def read_pose_labels(lb_file: str, nc: int, kpt_shape: tuple[int, int],
                     rules: LabelRules = LABEL_RULES) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Parse and check a YOLO pose label file with Ultralytics' rules (``verify_image_label`` with ``keypoint``).

    Every row is ``class x y w h`` and K keypoints of D values (``kpt_shape``: (K, D)): x y, or x y visibility. The
    keypoints' x and y must be at most 1.01 (the box is not checked from above, as in Ultralytics), every value at
    least 0 (-0.01 where the box's size is not negative); no segment rows.

    Returns:
        labels: (n, 5) float32 [class, x, y, w, h]. keypoints: (n, K, 3) float32 x, y, visibility; for D = 2 the
            visibility is Ultralytics': 0 where x or y is negative, else 1. Duplicate rows (box and keypoints equal)
            removed, then in ``np.unique`` order, as Ultralytics leaves them.
        notes: "label file missing", "label file empty", "N duplicate labels removed".

    Raises:
        SampleError: a row of another number of columns (Ultralytics: "labels require N columns each"), keypoint
            coordinates above 1, negative or non-finite values, fractional class ids or a class >= nc.
    """
    k, d = kpt_shape
    width = 5 + k * d
    rows = _rows(lb_file, rules)
    if not rows:
        note = "label file missing" if rows is None else "label file empty"
        return np.zeros((0, 5), np.float32), np.zeros((0, k, 3), np.float32), [f"{note}: used as a background image"]
    try:
        lb = np.array(rows, dtype=np.float32)
    except ValueError as e:  # ragged rows, non-numeric text
        raise SampleError(f"{lb_file} is not numeric YOLO pose rows of 'class x y w h' and {k} keypoints ({e}); fix "
                          "the file") from None
    if lb.shape[1] != width:
        raise SampleError(f"{lb_file} rows have {lb.shape[1]} columns; pose labels require {width} columns each "
                          f"(class x y w h, then {k} keypoints of {d} values: the yaml's kpt_shape [{k}, {d}]); fix "
                          "the rows or the yaml's kpt_shape")
    points = lb[:, 5:].reshape(-1, d)[:, :2]
    if np.isfinite(lb).all() and points.max() > rules.coord_max:
        bad = _values(points[points > rules.coord_max])
        raise SampleError(f"{lb_file} has keypoint coordinates above 1 ({bad}): YOLO keypoints are normalised to "
                          "[0, 1] by image width and height; convert pixel coordinates by dividing")
    _check_values(lb, lb_file, nc, rules)
    notes = []
    _, keep = np.unique(lb, axis=0, return_index=True)
    if len(keep) < len(lb):
        notes.append(f"{len(lb) - len(keep)} duplicate labels removed")
        lb = lb[keep]
    kpts = lb[:, 5:].reshape(-1, k, d)
    if d == 2:
        seen = np.where((kpts[..., 0] < 0) | (kpts[..., 1] < 0), 0.0, 1.0).astype(np.float32)
        kpts = np.concatenate([kpts, seen[..., None]], axis=-1)
    return np.ascontiguousarray(lb[:, :5]), np.ascontiguousarray(kpts), notes


def resized_hw(h0: int, w0: int, imgsz: int) -> tuple[int, int]:
    """Ultralytics' ``load_image`` size: long side to imgsz, aspect kept, ceil, capped at imgsz."""
    r = imgsz / max(h0, w0)
    if r == 1:
        return h0, w0
    return min(math.ceil(h0 * r), imgsz), min(math.ceil(w0 * r), imgsz)


def decode_bgr(path: str, info: ImageInfo) -> np.ndarray:
    """Full-resolution BGR pixels, as Ultralytics' ``imread`` returns them (EXIF orientation applied)."""
    if info.restored is not None:
        im = cv2.imdecode(np.frombuffer(info.restored, np.uint8), cv2.IMREAD_COLOR)
    else:
        im = imread(path)
    if im is None:
        raise SampleError("OpenCV cannot decode the pixels (Ultralytics would fail on it while training); "
                          "re-export it as JPEG or PNG or remove it")
    if im.ndim == 2 or im.shape[2] == 1:
        im = cv2.cvtColor(im, cv2.COLOR_GRAY2BGR)
    return im


def load_sample(im_file: str, lb_file: str, nc: int, imgsz: int, encode: Callable[..., tuple], task: str = "detect",
                kpt_shape: tuple[int, int] | None = None) -> Sample:
    """Verify one image/label pair and produce what the store keeps for it.

    Args:
        encode: the ``encode`` of the pack's format's codec (``yolofeed.pack.codecs``), given the checked image.
        task: "detect" (``read_detect_labels``), "pose" (``read_pose_labels``, which needs ``kpt_shape``), "obb"
            (``read_obb_labels``) or "segment" (``read_segment_labels``).
        kpt_shape: the data yaml's (keypoints, dims), or None.

    Raises:
        SampleError: the sample must be skipped; the message is the reason.
    """
    info = check_image(im_file)
    keypoints = corners = polygons = None
    if task == "pose":
        labels, keypoints, notes = read_pose_labels(lb_file, nc, kpt_shape)
    elif task == "obb":
        labels, corners, notes = read_obb_labels(lb_file, nc, kpt_shape=kpt_shape)
    elif task == "segment":
        labels, polygons, notes = read_segment_labels(lb_file, nc, kpt_shape=kpt_shape)
    else:
        labels, polygons, notes = read_detect_labels(lb_file, nc, kpt_shape=kpt_shape)
    if info.restored is not None:
        notes.append("JPEG with trailing bytes: restored in memory as Ultralytics restores it (source untouched)"
                     + ("" if restores_in_place(im_file) else "; Ultralytics rewrites the file to restore it, and "
                        "skips it as corrupt where it cannot, as here (read-only): yolofeed keeps it"))
    payload, ori_hw, hw = encode(im_file, info, imgsz, notes)
    return Sample(payload, ori_hw, hw, labels, notes, keypoints, corners, polygons)
