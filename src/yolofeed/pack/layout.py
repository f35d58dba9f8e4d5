"""The pack file's layout: one memory-mappable file per split, its sections, trailer and checksums.

Layout (little-endian), chosen so a parallel build can write images in one pass and a reader
can tell a finished file from an interrupted one::

    [preamble][payloads ...][index][labels][files][label_crc]([keypoints|corners|polygon_lengths polygon_points])
    [source_files source_stats][header JSON][trailer: magic, ...]

* preamble: 64 bytes, ``PREAMBLE``, written first thing when the build creates its temporary file: what proves a
  temporary file, or a file under a pack's name, to be yolofeed's before it is deleted or replaced (a build's
  payloads and tail come much later). Packs written before it was added have their payloads from byte 0, under the
  same format version: readers go by the index's offsets, never by where payloads start.
* payloads: each image's bytes at a 64-byte aligned offset, as the codec of the header's format (its key
  ``storage``) encoded them (``yolofeed.pack.codecs``: decoded pixels, encoded files, ...).
* index: one ``INDEX_DTYPE`` record per image, in Ultralytics' (sorted) image order, with the CRC32
  of the image's payload.
* labels: (M, 5) float32 [class, x, y, w, h] normalised; image i owns rows
  ``label_start[i] : label_start[i] + label_count[i]``.
* files: the image paths, NUL-separated, as the file system's bytes (``os.fsencode``: UTF-8, with a name
  that is not valid UTF-8 kept byte for byte, as Linux allows and Ultralytics accepts; paths cannot hold NUL).
* label_crc: one uint32 per source image tried (skipped ones too, in source order): the CRC32 of
  its label file's bytes (0 when missing), for ``rebuild=check``.
* keypoints (pose packs only, ``task: pose``): (M, K, 3) float32 [x, y, visibility], row j the keypoints of labels
  row j, x and y normalised as the boxes are; K is the header's ``kpt_shape[0]``. A yaml's ``kpt_shape: [K, 2]`` is
  stored as K x 3 too, with Ultralytics' visibility (0 where x or y is negative, else 1).
* corners (OBB packs only, ``task: obb``): (M, 4, 2) float32 [x, y] of each rotated box's 4 corners as the label
  file lists them, row j those of labels row j, normalised as the boxes are; labels row j is their enclosing box
  (Ultralytics' ``segments2boxes``, what its OBB dataset's ``bboxes`` hold before ``Format`` makes x, y, w, h, r).
* polygon_lengths, polygon_points (segment packs, ``task: segment``; and detection packs whose every label row is a
  polygon, as Ultralytics' detection dataset keeps them only then: ``detect_keeps_polygons``): (M,) uint32, the number
  of points of each label row's polygon as its label file lists it (1 or more: a row ``class x y`` among polygon rows
  is a polygon of one point to Ultralytics), and (P, 2) float32 [x, y] of all of them, row j's after rows 0 .. j-1's,
  normalised as the boxes are; labels row j is its polygon's enclosing box (``segments2boxes``). Ultralytics resamples
  each polygon to 1,000 points when it loads the labels: the pack keeps them as written.
* source_files, source_stats: every source image tried, in source order, as the files section writes paths; and
  (2 x tried, 2) int64 [size, mtime in ns] of each of those images, then of each one's label file (-1, -1: missing),
  the fingerprint's inputs (``SplitSource.stats``). Only to say which files changed when the fingerprint does
  (``rebuild``): a pack written before them is found stale all the same, without the names.
* header: format version, imgsz, ``storage`` (the format's name), ``task`` ("detect", "pose", "obb" or "segment";
  packs written before it are detection packs), ``kpt_shape`` (pose: the yaml's [K, D]), ``detect_polygons``
  (detection packs: ``DETECT_POLYGONS``, the rule by which they keep polygons; one without it is stale), source
  fingerprint, counts,
  skipped
  samples, build stats, and where each section above but the payloads lies (``sections``: name -> [offset, length])
  with its CRC32 (``checksums``: name -> CRC32).
* trailer: written last. A file without it was never finished; the builder also writes under a
  temporary name and renames, so a reader never sees a half-written file under the real name.

Sections are found by name, never by position, and each has its own CRC32. A reader requires the sections it knows
(``SECTIONS``), and checks the bounds and CRC32 of every section the header lists, one it does not know too. So a
new label kind (keypoints, corners, masks) is one more named section, written by ``encode_tail`` after these with
its own checksum, and the existing sections keep their bytes and meaning: packs without it read as before, and
this version reads packs with it (``test_a_new_section_leaves_the_others_as_they_are``). The format version
changes only where an existing section's meaning does; a reader refuses a pack of another version with its
rebuild command.

``Pack.open`` (pack/store.py) checks the header's CRC32, its keys and types (``header_problem``), every section's
bounds and CRC32, and the index and label values; payload CRC32s are checked by ``Pack.verify`` and at the end of
every build, never on every read (see store.py for the cost).
"""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from yolofeed.limits import usable_cores

FORMAT_NAME = "yolofeed-pack"
FORMAT_VERSION = 2  # 2: payload, section and header CRC32s; label file CRC32s; counts.label_files
MAGIC = b"YOLOFEEDPACK"  # 12 bytes
# magic, CRC32 of the header bytes, header offset, header length. Format 1 had 4 fixed bytes where the
# CRC32 now is, so a format-1 file still reaches the version check and its "rebuild" message.
TRAILER = struct.Struct("<12sIQQ")
ALIGN = 64  # payload alignment: cache lines, and friendly to vectorised copies
SUFFIX = ".yfpack"
PREAMBLE = (MAGIC + b" pack, written by yolofeed pack\n").ljust(ALIGN, b"\0")
MAX_HEADER = 1 << 30  # bytes: a larger "header" is a damaged trailer, not a header worth reading
# what interpreting a crafted header can raise beyond the checks (a value of the wrong kind or size): damage too
HEADER_ERRORS = (KeyError, TypeError, ValueError, IndexError, OverflowError, RecursionError, AttributeError)
INDEX_DTYPE = np.dtype([
    ("offset", "<u8"), ("nbytes", "<u8"),  # payload position in the file
    ("h0", "<u4"), ("w0", "<u4"),  # original (decoded, EXIF-upright) size
    ("h", "<u4"), ("w", "<u4"),  # size the loader delivers (Ultralytics' load_image size)
    ("label_start", "<u8"), ("label_count", "<u4"), ("crc32", "<u4"),  # crc32: zlib.crc32 of the payload
])
SECTIONS = {"index": INDEX_DTYPE, "labels": np.dtype("<f4"), "files": np.dtype("u1"), "label_crc": np.dtype("<u4")}
# The label kinds' sections: each in the packs of its task only (``TASK_SECTIONS``), required there.
LABEL_SECTIONS = {"keypoints": np.dtype("<f4"), "corners": np.dtype("<f4"), "polygon_lengths": np.dtype("<u4"),
                  "polygon_points": np.dtype("<f4")}
TASKS = ("detect", "pose", "obb", "segment")  # what a pack is built for: its label rules differ (pose: keypoints...)
TASK_SECTIONS = {"detect": (), "pose": ("keypoints",), "obb": ("corners",),
                 "segment": ("polygon_lengths", "polygon_points")}
DETECT_POLYGONS = 1  # header key detect_polygons: detection packs keep polygons by detect_keeps_polygons


def detect_keeps_polygons(task: str, polygons: int, rows: int) -> bool:
    """Whether a ``task`` pack of ``rows`` label rows, ``polygons`` of them polygon rows, keeps the polygons as the
    segment packs do: a detection pack where every row is one. Ultralytics' detection dataset keeps the polygons then
    (``YOLODataset.get_labels``; with fewer it drops them all and warns), resamples them to 1,000 points, and its
    augmentation makes each box of its moved polygon (``RandomPerspective``: ``segment2box``), not of the moved box."""
    return task == "detect" and rows > 0 and polygons == rows


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # a newline or tab in a file name (legal on Linux) would break a line


def printable(path: str) -> str:
    """A file name for a message or a text file: bytes that are not UTF-8 shown as ``\\xe9`` (a terminal or a
    UTF-8 file cannot take the lone surrogates Python decodes them to), and control characters as ``\\n``,
    ``\\t`` or ``\\x1b``, so that a message stays on one line."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text) if CONTROL.search(text) else text


def is_pack_file(fd: int) -> bool:
    """Whether the open file ``fd`` is a pack or a build's temporary file, yolofeed's to replace or delete: it starts
    with the preamble, or (a pack written before the preamble) ends with a pack trailer."""
    size = os.fstat(fd).st_size
    with open(fd, "rb", closefd=False) as f:
        if f.read(len(PREAMBLE)) == PREAMBLE:
            return True
        if size < TRAILER.size:
            return False
        f.seek(size - TRAILER.size)
        return f.read(TRAILER.size).startswith(MAGIC)


def detection_sections(index: np.ndarray, labels: np.ndarray, files: list[str],
                       label_crc: np.ndarray) -> dict[str, bytes]:
    """The bytes of the sections every pack has (``SECTIONS``), in file order.

    Args:
        index: (N,) ``INDEX_DTYPE`` records of the images kept.
        labels: (M, 5) float32 [class, x, y, w, h], image i's rows from ``index["label_start"][i]``.
        files: the N image paths.
        label_crc: (tried,) uint32, the CRC32 of each source label file's bytes.
    """
    return {"index": index.astype(INDEX_DTYPE).tobytes(),
            "labels": np.ascontiguousarray(labels, np.float32).tobytes(),
            "files": b"\0".join(map(os.fsencode, files)),
            "label_crc": np.ascontiguousarray(label_crc, np.uint32).tobytes()}


def source_sections(im_files: tuple[str, ...], stats: np.ndarray) -> dict[str, bytes]:
    """The bytes of the source_files and source_stats sections.

    Args:
        im_files: the tried image paths, in source order.
        stats: (2 x tried, 2) int64, ``SplitSource.stats``.
    """
    return {"source_files": b"\0".join(map(os.fsencode, im_files)),
            "source_stats": np.ascontiguousarray(stats, "<i8").tobytes()}


def keypoint_section(keypoints: np.ndarray) -> bytes:
    """The bytes of the keypoints section.

    Args:
        keypoints: (M, K, 3) float32 [x, y, visibility], row j those of labels row j.
    """
    return np.ascontiguousarray(keypoints, np.float32).tobytes()


def corner_section(corners: np.ndarray) -> bytes:
    """The bytes of the corners section.

    Args:
        corners: (M, 4, 2) float32 [x, y], row j those of labels row j.
    """
    return np.ascontiguousarray(corners, np.float32).tobytes()


def polygon_sections(polygons: list[np.ndarray]) -> dict[str, bytes]:
    """The bytes of the polygon_lengths and polygon_points sections.

    Args:
        polygons: M arrays of (P_j, 2) float32 [x, y], polygon j that of labels row j.
    """
    lengths = np.array([len(p) for p in polygons], np.uint32)
    points = np.concatenate(polygons) if polygons else np.zeros((0, 2), np.float32)
    return {"polygon_lengths": lengths.tobytes(), "polygon_points": np.ascontiguousarray(points, np.float32).tobytes()}


def encode_tail(data_end: int, sections: dict[str, bytes], header: dict[str, Any]) -> tuple[int, bytes]:
    """The sections, header and trailer, as the bytes that follow the payloads.

    Args:
        data_end: payloads occupy ``[0, data_end)``.
        sections: name -> bytes, in file order: ``detection_sections``, then a label kind's (``keypoint_section``).
        header: completed with ``sections``, ``checksums``, ``format`` and ``format_version`` here.

    Returns:
        (offset, tail): where the tail starts (``data_end`` aligned) and its bytes, sections zero-padded to
        ``ALIGN``; the file ends with them.
    """
    start = pos = align(data_end)
    where, sums, parts = {}, {}, []
    for name, blob in sections.items():
        where[name], sums[name] = [pos, len(blob)], zlib.crc32(blob)
        parts.append(blob.ljust(align(len(blob)), b"\0"))
        pos = align(pos + len(blob))
    header = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **header, "sections": where,
              "checksums": sums}
    blob = json.dumps(header, indent=1).encode("utf-8")
    parts += [blob, TRAILER.pack(MAGIC, zlib.crc32(blob), pos, len(blob))]
    return start, b"".join(parts)


def payload_crcs(mm: np.ndarray, index: np.ndarray, threads: int = 0) -> np.ndarray:
    """(N,) uint32 CRC32 of each payload ``mm[offset:offset + nbytes]``, on ``threads`` threads (0: all cores)."""
    out = np.zeros(len(index), np.uint32)
    offsets, sizes = index["offset"].tolist(), index["nbytes"].tolist()

    def run(lo_hi: tuple[int, int]) -> None:
        for i in range(*lo_hi):
            out[i] = zlib.crc32(mm[offsets[i]:offsets[i] + sizes[i]])

    threads = max(1, min(threads or usable_cores(), len(index)))
    step = max(1, -(-len(index) // (threads * 4)))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, [(lo, min(lo + step, len(index))) for lo in range(0, len(index), step)]))
    return out


def header_problem(h: dict[str, Any], h_off: int, formats: tuple[str, ...]) -> str:
    """What is missing or malformed in a header of the current format version; "" when it is well formed.

    Args:
        formats: the format names this yolofeed reads (``codecs.names()``).
    """
    def ints(v: Any, n: int) -> bool:
        return isinstance(v, list) and len(v) == n and all(isinstance(x, int) and x >= 0 for x in v)

    spec = {"split": str, "imgsz": int, "storage": str, "source": dict, "counts": dict, "skipped": list,
            "notes": list, "sections": dict, "checksums": dict, "created": str}
    for key, kind in spec.items():
        if not isinstance(h.get(key), kind):
            return f"header key '{key}' is missing or not a {kind.__name__}"
    if h["storage"] not in formats:
        return f"its storage format {h['storage']!r} is not one this yolofeed reads ({', '.join(formats)})"
    if not 1 <= h["imgsz"] < 2**32:  # the index holds image sides as uint32
        return f"header has storage={h['storage']!r}, imgsz={h['imgsz']!r}"
    src = h["source"]
    if not (isinstance(src.get("data"), str) and isinstance(src.get("fingerprint"), str)
            and isinstance(src.get("label_dir"), str) and isinstance(src.get("nc"), int) and src["nc"] > 0
            and isinstance(src.get("names"), list)):
        return "header's source (data, fingerprint, label_dir, nc, names) is missing or malformed"
    if "\0" in src["data"] or "\0" in src["label_dir"]:  # no file system allows one in a path
        return "header's source paths hold a NUL byte"
    for key in ("skipped", "notes"):  # read as (file, reason) pairs by the summary and the reuse message
        if not all(isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x) for x in h[key]):
            return f"header's {key} are not (file, reason) pairs"
    for key in ("images", "boxes", "tried", "skipped", "label_files", "data_bytes"):
        if not isinstance(h["counts"].get(key), int):
            return f"header's counts.{key} is missing or not an integer"
    task = h.get("task", "detect")  # packs written before tasks are detection packs
    if task not in TASKS:
        return f"its task {printable(str(task))[:40]!r} is not one this yolofeed reads ({', '.join(TASKS)})"
    if task == "pose":
        k = h.get("kpt_shape")
        if not ints(k, 2) or k[0] < 1 or k[1] not in (2, 3):
            return f"header's kpt_shape {printable(str(k))[:40]} is missing or malformed (a pose pack's [K, 2 or 3])"
    # a detection pack keeps both polygon sections or neither: half a pair is refused below as a missing section
    polygons = task == "segment" or (task == "detect" and bool(set(TASK_SECTIONS["segment"]) & h["sections"].keys()))
    kinds = (*TASK_SECTIONS[task], *(TASK_SECTIONS["segment"] if polygons and task != "segment" else ()))
    known = {**SECTIONS, **{n: LABEL_SECTIONS[n] for n in kinds}}
    for name in (*known, *(n for n in h["sections"] if n not in known)):  # a section it does not know: checked
        where, itemsize = h["sections"].get(name), known[name].itemsize if name in known else 1  # as bytes
        if not ints(where, 2) or where[0] + where[1] > h_off or where[1] % itemsize:
            return f"header's {printable(str(name))[:40]} section {where} is malformed or out of bounds"
        if not isinstance(h["checksums"].get(name), int):
            return f"header's checksum of the {printable(str(name))[:40]} section is missing"
    if h["sections"]["labels"][1] % (5 * 4):
        return "header's labels section is not whole rows"
    rows = h["sections"]["labels"][1] // (5 * 4)
    if task == "pose" and h["sections"]["keypoints"][1] != rows * h["kpt_shape"][0] * 3 * 4:
        return "header's keypoints section is not one row of K x 3 values per label"
    if task == "obb" and h["sections"]["corners"][1] != rows * 4 * 2 * 4:
        return "header's corners section is not one row of 4 x 2 values per label"
    if polygons and (h["sections"]["polygon_lengths"][1] != rows * 4
                              or h["sections"]["polygon_points"][1] % (2 * 4)):
        return "header's polygon sections are not one length per label and whole points"
    return ""
