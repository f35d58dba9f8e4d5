"""The pack file: one memory-mappable file per split, and its reader.

Layout (little-endian), chosen so a parallel build can write images in one pass and a reader
can tell a finished file from an interrupted one::

    [payloads ...][index][labels][files][header JSON][trailer: magic, header offset, header length]

* payloads: each image's bytes at a 64-byte aligned offset: raw packs hold (h, w, 3) RGB uint8
  exactly as Ultralytics' ``load_image`` returns them (after BGR->RGB); jpeg packs hold encoded files.
* index: one ``INDEX_DTYPE`` record per image, in Ultralytics' (sorted) image order.
* labels: (M, 5) float32 [class, x, y, w, h] normalised; image i owns rows
  ``label_start[i] : label_start[i] + label_count[i]``.
* files: the image paths, NUL-separated UTF-8 (paths cannot contain NUL).
* header: format version, imgsz, storage, source fingerprint, counts, skipped samples, build stats.
* trailer: written last. A file without it was never finished; the builder also writes under a
  temporary name and renames, so a reader never sees a half-written file under the real name.
"""

from __future__ import annotations

import json
import os
import struct
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from yolofeed.errors import PackError, StalePackError

FORMAT_NAME = "yolofeed-pack"
FORMAT_VERSION = 1
MAGIC = b"YOLOFEEDPACK\x00\x01\x00\x00"  # 16 bytes
TRAILER = struct.Struct("<16sQQ")  # magic, header offset, header length
ALIGN = 64  # payload alignment: cache lines, and friendly to vectorised copies
SUFFIX = ".yfpack"

INDEX_DTYPE = np.dtype([
    ("offset", "<u8"), ("nbytes", "<u8"),  # payload position in the file
    ("h0", "<u4"), ("w0", "<u4"),  # original (decoded, EXIF-upright) size
    ("h", "<u4"), ("w", "<u4"),  # stored size (raw) or size after the loader's resize (jpeg)
    ("label_start", "<u8"), ("label_count", "<u4"), ("_pad", "<u4"),
])


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Pack:
    """Read-only view of one split's pack file.

    ``image(i)`` and ``labels(i)`` are zero-copy views into the memory map; ``gather`` copies many
    images into a caller's (pinned) buffer in one call.

    Example:
        >>> pack = Pack.open("datasets/synth/yolofeed-packs/data-raw-640/train.yfpack")
        >>> img = pack.image(0)  # (h, w, 3) uint8 RGB, a view of the file
    """

    def __init__(self, path: Path, header: dict[str, Any], mm: np.memmap):
        self.path, self.header, self._mm = path, header, mm
        sec = header["sections"]
        self.index = self._section(sec["index"], INDEX_DTYPE)
        self.label_table = self._section(sec["labels"], np.float32).reshape(-1, 5)
        self._files_section = sec["files"]

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, expect: dict[str, Any] | None = None, fix: str = "") -> Pack:
        """Open and validate a pack file.

        Args:
            path: a ``.yfpack`` file.
            expect: header values the caller needs (e.g. ``{"imgsz": 640, "storage": "raw",
                "data": yaml path, "fingerprint": ...}``); any mismatch raises ``StalePackError``.
            fix: the command that rebuilds this pack, quoted in error messages.

        Raises:
            PackError: missing, truncated, unfinished, foreign or of another format version.
            StalePackError: valid, but does not match ``expect``.
        """
        path = Path(path)
        fix = fix or "rebuild it with 'yolofeed pack data=... rebuild=always'"
        if not path.is_file():
            raise PackError(f"pack {path} does not exist; {fix}")
        size = path.stat().st_size
        if size < TRAILER.size:
            raise PackError(f"{path} is {size} bytes: not a finished yolofeed pack; {fix}")
        with open(path, "rb") as f:
            f.seek(size - TRAILER.size)
            magic, h_off, h_len = TRAILER.unpack(f.read(TRAILER.size))
            if magic[:12] != MAGIC[:12]:
                raise PackError(f"{path} is not a finished yolofeed pack (no trailer: foreign file or an "
                                f"interrupted build); {fix}")
            if h_off + h_len + TRAILER.size != size:
                raise PackError(f"{path} is truncated or padded (header at {h_off}+{h_len}, file {size} B); {fix}")
            f.seek(h_off)
            try:
                header = json.loads(f.read(h_len))
            except ValueError as e:
                raise PackError(f"{path}: header is not valid JSON ({e}); {fix}") from None
        if header.get("format") != FORMAT_NAME or header.get("format_version") != FORMAT_VERSION:
            raise StalePackError(
                f"{path} has pack format {header.get('format_version')} (yolofeed "
                f"{header.get('yolofeed_version')}); this yolofeed reads format {FORMAT_VERSION}: {fix}")
        expect = dict(expect or {})
        if "data" in expect and header["source"].get("data") != expect["data"]:  # checked first: the clearer
            raise StalePackError(f"{path} was built from {header['source'].get('data')}, not from "
                                 f"{expect['data']}; point out= elsewhere or {fix}")
        for key, want in expect.items():
            have = header["source"].get(key) if key in ("fingerprint", "data") else header.get(key)
            if have != want:
                what = {"fingerprint": "the source images or labels changed since it was built"}.get(
                    key, f"it was built for {key}={have}, this run asks for {key}={want}")
                raise StalePackError(f"{path} is stale: {what}; {fix}")
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        return cls(path, header, mm)

    def _section(self, where: list[int], dtype: Any) -> np.ndarray:
        off, nbytes = where
        return self._mm[off:off + nbytes].view(dtype)

    # -- metadata ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        return (f"Pack({str(self.path)!r}, split={self.split!r}, images={len(self)}, "
                f"storage={self.storage!r}, imgsz={self.imgsz})")

    @property
    def split(self) -> str:
        return self.header["split"]

    @property
    def imgsz(self) -> int:
        return self.header["imgsz"]

    @property
    def storage(self) -> str:
        return self.header["storage"]

    @property
    def shapes(self) -> np.ndarray:
        """(N, 2) stored (h, w): what ``image(i)`` returns (raw) or the loader resizes to (jpeg)."""
        return np.stack([self.index["h"], self.index["w"]], 1).astype(np.int64)

    @property
    def ori_shapes(self) -> np.ndarray:
        """(N, 2) original (h, w) of the source images, EXIF-upright."""
        return np.stack([self.index["h0"], self.index["w0"]], 1).astype(np.int64)

    @cached_property
    def im_files(self) -> list[str]:
        """Source image paths, in pack order (Ultralytics' sorted order, skipped files left out)."""
        return bytes(self._section(self._files_section, np.uint8)).decode("utf-8").split("\0")

    # -- samples ----------------------------------------------------------------------------
    def image(self, i: int) -> np.ndarray:
        """Image ``i`` as a read-only (h, w, 3) uint8 RGB view of the file (raw packs)."""
        if self.storage != "raw":
            raise PackError(f"{self.path} stores JPEG bytes; use encoded(i), or build a raw pack with format=raw")
        r = self.index[i]
        return self._mm[r["offset"]:r["offset"] + r["nbytes"]].reshape(int(r["h"]), int(r["w"]), 3)

    def encoded(self, i: int) -> np.ndarray:
        """Image ``i``'s stored bytes as a 1-D uint8 view (the JPEG file, for jpeg packs)."""
        r = self.index[i]
        return self._mm[r["offset"]:r["offset"] + r["nbytes"]]

    def labels(self, i: int) -> np.ndarray:
        """(n, 5) float32 [class, x, y, w, h] normalised, a view."""
        r = self.index[i]
        return self.label_table[r["label_start"]:r["label_start"] + r["label_count"]]

    def gather(self, indices: Any, out: Any) -> np.ndarray:
        """Copy images ``indices`` into the top-left corner of ``out[k]`` (raw packs).

        Args:
            indices: B sample indices.
            out: a (>=B, imgsz, imgsz, 3) uint8 numpy array or CPU torch tensor (pinned, say);
                the area right of and below each image is left as it was.

        Returns:
            (B, 2) int64 (h, w) of each copied image.
        """
        buf = out.numpy() if hasattr(out, "numpy") else out  # a torch tensor shares its memory
        idx = np.asarray(indices, dtype=np.int64)
        rec = self.index[idx]
        if len(idx) > len(buf) or (len(idx) and (rec["h"].max() > buf.shape[1] or rec["w"].max() > buf.shape[2])):
            raise ValueError(f"out {tuple(buf.shape)} cannot hold {len(idx)} images of up to "
                             f"{self.imgsz}x{self.imgsz}")
        for k, r in enumerate(rec):  # one memcpy per image; numpy releases the GIL for these copies
            h, w, off = int(r["h"]), int(r["w"]), int(r["offset"])
            buf[k, :h, :w] = self._mm[off:off + h * w * 3].reshape(h, w, 3)
        return np.stack([rec["h"], rec["w"]], 1).astype(np.int64)

    def gather_encoded(self, indices: Any, out: Any) -> tuple[np.ndarray, np.ndarray]:
        """Concatenate the stored bytes of ``indices`` into the 1-D uint8 buffer ``out``.

        Returns:
            (starts, sizes): (B,) int64 byte ranges of each image within ``out``.
        """
        buf = out.numpy() if hasattr(out, "numpy") else out
        rec = self.index[np.asarray(indices, dtype=np.int64)]
        sizes = rec["nbytes"].astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        if sizes.sum() > len(buf):
            raise ValueError(f"out holds {len(buf)} bytes, these images need {int(sizes.sum())}")
        for s, r in zip(starts.tolist(), rec):
            off, n = int(r["offset"]), int(r["nbytes"])
            buf[s:s + n] = self._mm[off:off + n]
        return starts, sizes

    # -- pickling: workers and DDP ranks reopen the file instead of copying the map -----------
    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        other = Pack.open(state["path"])
        self.__dict__.update(other.__dict__)


def write_tail(fd: int, data_end: int, index: np.ndarray, labels: np.ndarray, files: list[str],
               header: dict[str, Any]) -> int:
    """Append the index, labels, file list, header and trailer after the payloads.

    Args:
        fd: the pack file, open for writing; payloads occupy ``[0, data_end)``.
        header: completed with ``sections``, ``format`` and ``format_version`` here.

    Returns:
        The file's final size.
    """
    pos = align(data_end)
    sections = {}
    for name, blob in (("index", index.astype(INDEX_DTYPE).tobytes()),
                       ("labels", np.ascontiguousarray(labels, np.float32).tobytes()),
                       ("files", "\0".join(files).encode("utf-8"))):
        _pwrite_all(fd, blob, pos)
        sections[name] = [pos, len(blob)]
        pos = align(pos + len(blob))
    header = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **header, "sections": sections}
    blob = json.dumps(header, indent=1).encode("utf-8")
    _pwrite_all(fd, blob, pos)
    _pwrite_all(fd, TRAILER.pack(MAGIC, pos, len(blob)), pos + len(blob))
    end = pos + len(blob) + TRAILER.size
    os.ftruncate(fd, end)  # a reused temp name could hold more bytes from an earlier attempt
    return end


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
