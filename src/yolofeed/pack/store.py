"""The pack file: one memory-mappable file per split, and its reader.

Layout (little-endian), chosen so a parallel build can write images in one pass and a reader
can tell a finished file from an interrupted one::

    [preamble][payloads ...][index][labels][files][label_crc][header JSON][trailer: magic, header CRC32, offset, length]

* preamble: 64 bytes, ``PREAMBLE``, written first thing when the build creates its temporary file: what proves a
  temporary file, or a file under a pack's name, to be yolofeed's before it is deleted or replaced (a build's
  payloads and tail come much later). Packs written before it was added have their payloads from byte 0, under the
  same format version: readers go by the index's offsets, never by where payloads start.
* payloads: each image's bytes at a 64-byte aligned offset, as the codec of the header's ``storage``
  encoded them (``yolofeed.pack.codecs``: decoded pixels, encoded files, ...).
* index: one ``INDEX_DTYPE`` record per image, in Ultralytics' (sorted) image order, with the CRC32
  of the image's payload.
* labels: (M, 5) float32 [class, x, y, w, h] normalised; image i owns rows
  ``label_start[i] : label_start[i] + label_count[i]``.
* files: the image paths, NUL-separated, as the file system's bytes (``os.fsencode``: UTF-8, with a name
  that is not valid UTF-8 kept byte for byte, as Linux allows and Ultralytics accepts; paths cannot hold NUL).
* label_crc: one uint32 per source image tried (skipped ones too, in source order): the CRC32 of
  its label file's bytes (0 when missing), for ``rebuild=check``.
* header: format version, imgsz, storage (the codec's name), source fingerprint, counts, skipped samples, build stats,
  and the CRC32 of every section above but the payloads.
* trailer: written last. A file without it was never finished; the builder also writes under a
  temporary name and renames, so a reader never sees a half-written file under the real name.

What is checked, and when (CRC32 from ``zlib``: no new dependency):

* ``Pack.open``: the header's CRC32 (kept in the trailer), its keys and types, every section's
  bounds and CRC32, and the index and label values (payloads inside the file, sizes those of an
  image of this pack, classes in ``[0, nc)``, finite coordinates within Ultralytics' tolerance).
  Cost: one CRC32 pass over the metadata, ~30 MB for COCO's 118k training images, 10-20 ms at the
  1.7-3 GB/s measured below. A damaged or foreign file is refused with what is damaged and the
  command that rebuilds it.
* Payloads (the pixels): their CRC32s are checked by ``Pack.verify`` (``yolofeed pack ...
  verify=True``) and at the end of every build, never on every read. ``python -m tools.pack_crc_cost``
  on the 2-core development machine (raw 640-px pack, batches of 64, page cache warm, three runs): the
  loader's copy ran at 4.3-5.3 GB/s, ``zlib.crc32`` of the same bytes at 1.7-3.0 GB/s; checking in the
  loader's thread would take 2.7-4.2x the copy's time and cap it at 1,300-2,100 img/s, around what one
  H200 trains yolo11n at (~1,700 img/s). Not cheap, so not done:
  reads rely on the page cache and the disk's own error correction, and ``verify=True`` is there after a disk
  or copy fault.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import mmap
import os
import re
import shlex
import stat
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from yolofeed import __version__
from yolofeed.config import usable_cores
from yolofeed.errors import NewerPackError, PackError, StalePackError
from yolofeed.pack import codecs, files

LOGGER = logging.getLogger(__name__)
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
COORD_TOLERANCE = 1.01  # as pack/verify.py: Ultralytics accepts normalised coordinates up to 1 % out of range
GENERIC_FIX = "rebuild it with 'yolofeed pack data=... rebuild=always'"
# what interpreting a crafted header can raise beyond the checks (a value of the wrong kind or size): damage too
HEADER_ERRORS = (KeyError, TypeError, ValueError, IndexError, OverflowError, RecursionError, AttributeError)

INDEX_DTYPE = np.dtype([
    ("offset", "<u8"), ("nbytes", "<u8"),  # payload position in the file
    ("h0", "<u4"), ("w0", "<u4"),  # original (decoded, EXIF-upright) size
    ("h", "<u4"), ("w", "<u4"),  # size the loader delivers (Ultralytics' load_image size)
    ("label_start", "<u8"), ("label_count", "<u4"), ("crc32", "<u4"),  # crc32: zlib.crc32 of the payload
])
SECTIONS = {"index": INDEX_DTYPE, "labels": np.dtype("<f4"), "files": np.dtype("u1"), "label_crc": np.dtype("<u4")}


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # a newline or tab in a file name (legal on Linux) would break a line


def printable(path: str) -> str:
    """A file name for a message or a text file: bytes that are not UTF-8 shown as ``\\xe9`` (a terminal or a
    UTF-8 file cannot take the lone surrogates Python decodes them to), and control characters as ``\\n``,
    ``\\t`` or ``\\x1b``, so that a message stays on one line."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text) if CONTROL.search(text) else text


class _ReadFile:
    """A pack file's read-only descriptor, closed when no Pack (nor a copy made by unpickling) holds it."""

    def __init__(self, fd: int):
        self.fd = fd
        self.advise = hasattr(os, "posix_fadvise")  # not on Windows or macOS

    @classmethod
    def open(cls, path: Path, fix: str) -> _ReadFile:
        """Open a pack for reading: a regular file (through a link, a user's choice of where it lies), never blocking.

        Raises:
            PackError: missing, not a regular file (a folder, a FIFO, a device), or one this user may not read.
        """
        try:
            fd = os.open(path, os.O_RDONLY | files.NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
        except FileNotFoundError:
            if os.path.islink(path):
                raise PackError(f"{path} is {files.describe(path)}: point the link at a pack or remove it, then "
                                f"{fix}") from None
            raise PackError(f"pack {path} does not exist; {fix}") from None
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise files.denied(path, e, "read", "a pack") from None
            raise PackError(f"cannot open {path} ({e.strerror or e}): it is {files.describe(path)}; move it away, "
                            f"then {fix}") from None
        file = cls(fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO opened without blocking, a device, a folder
            raise PackError(f"{path} is not a regular file but {files.describe(path)}: a pack is a file that yolofeed "
                            f"pack writes; move it away, then {fix}")
        return file

    def __del__(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.close(self.fd)


class Pack:
    """Read-only view of one split's pack file.

    ``labels(i)``, ``encoded(i)`` and (formats that store pixels) ``image(i)`` are zero-copy views into the
    memory map; ``gather`` copies many payloads as pixels into a caller's (pinned) buffer in one call. The
    format's codec (``codec``, picked by the header's ``storage``) says how payloads become pixels.

    Example:
        >>> pack = Pack.open("datasets/synth/yolofeed-packs/data-raw-640/train.yfpack")
        >>> img = pack.image(0)  # (h, w, 3) uint8 RGB, a view of the file
    """

    def __init__(self, path: Path, header: dict[str, Any], mm: np.ndarray, file: _ReadFile | None = None):
        self.path, self.header, self._mm, self._file = path, header, mm, file
        self.codec = codecs.get(header["storage"])
        sec = header["sections"]
        self.index = self._section(sec["index"], INDEX_DTYPE)
        self.label_table = self._section(sec["labels"], np.float32).reshape(-1, 5)
        self.label_crc = self._section(sec["label_crc"], np.uint32)
        self._files_section = sec["files"]

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, expect: dict[str, Any] | None = None, fix: str = "") -> Pack:
        """Open and validate a pack file.

        Args:
            path: a ``.yfpack`` file.
            expect: header values the caller needs (e.g. ``{"imgsz": 640, "storage": codecs.DEFAULT,
                "data": yaml path, "fingerprint": ...}``); any mismatch raises ``StalePackError``.
            fix: the command that rebuilds this pack, quoted in error messages (default: built from
                the header when it is readable).

        Raises:
            PackError: missing, truncated, unfinished, foreign or damaged (a checksum, key, bound or
                label value that is wrong).
            StalePackError: of another format version, or valid but not matching ``expect``.
        """
        path = Path(path)
        generic = fix or GENERIC_FIX
        file = _ReadFile.open(path, generic)
        try:
            size = os.fstat(file.fd).st_size
            if size < TRAILER.size:
                raise PackError(f"{path} is {size} bytes: not a finished yolofeed pack; {generic}")
            with open(file.fd, "rb", closefd=False) as f:
                f.seek(size - TRAILER.size)
                magic, h_crc, h_off, h_len = TRAILER.unpack(f.read(TRAILER.size))
                if magic != MAGIC:
                    raise PackError(f"{path} is not a finished yolofeed pack (no trailer: foreign file or an "
                                    f"interrupted build); {generic}")
                if h_off >= size or h_len >= size or h_len > MAX_HEADER:  # no file this short holds such a header
                    raise PackError(f"{path} is damaged: its trailer points outside the file (a header of {h_len:,} "
                                    f"bytes at byte {h_off:,} of {size:,}); {generic}")
                if h_off + h_len + TRAILER.size != size:
                    raise PackError(f"{path} is truncated or padded: its trailer says "
                                    f"{h_off + h_len + TRAILER.size:,} bytes, the file has {size:,}; {generic}")
                f.seek(h_off)
                blob = f.read(h_len)
        except OSError as e:  # EIO from a failing disk, say
            raise PackError(f"cannot read {path} ({e.strerror or e}); check the disk (dmesg), or {generic}") from None
        try:
            header = json.loads(blob)
        except (ValueError, RecursionError) as e:  # invalid UTF-8 is a ValueError; deep nesting a RecursionError
            header = "deep" if isinstance(e, RecursionError) else None
        if not isinstance(header, dict):
            why = ("checksum mismatch" if zlib.crc32(blob) != h_crc else "checksum ok, nested too deep to read: a "
                   "foreign file" if header == "deep" else "checksum ok, not JSON: a foreign file")
            raise PackError(f"{path} is damaged: its header is not readable ({why}); {generic}")
        if header.get("format") != FORMAT_NAME:
            raise PackError(f"{path} is not a yolofeed pack (format {printable(str(header.get('format')))[:40]!r}); "
                            f"{generic}")
        fix = fix or _fix_from_header(path, header) or generic
        try:
            return cls._validated(path, header, blob, h_crc, h_off, expect, fix, file)
        except HEADER_ERRORS as e:
            raise PackError(f"{path} is damaged or foreign: its header cannot be read ({type(e).__name__}: "
                            f"{printable(str(e))[:200]}); {fix}") from None

    @classmethod
    def _validated(cls, path: Path, header: dict[str, Any], blob: bytes, h_crc: int, h_off: int,
                   expect: dict[str, Any] | None, fix: str, file: _ReadFile) -> Pack:
        """The rest of ``open``, once the header is a yolofeed JSON object: version, checksums, keys, content."""
        version = header.get("format_version")
        if version != FORMAT_VERSION:
            built_by = printable(str(header.get("yolofeed_version")))[:40]
            if type(version) is int and version > FORMAT_VERSION:
                raise NewerPackError(f"{path} was built by a newer yolofeed ({built_by}, pack format {version}); this "
                                     f"yolofeed ({__version__}) reads format {FORMAT_VERSION}: train with that "
                                     "yolofeed or upgrade this one (a pack this one rebuilds, the newer one rebuilds "
                                     f"again), or {fix}")
            raise StalePackError(f"{path} has pack format {printable(str(version))[:40]} (yolofeed {built_by}); this "
                                 f"yolofeed reads format {FORMAT_VERSION}: {fix}")
        if zlib.crc32(blob) != h_crc:
            raise PackError(f"{path} is damaged: its header fails its checksum; {fix}")
        problem = _header_problem(header, h_off)
        if problem:
            raise PackError(f"{path} is damaged or foreign: {problem}; {fix}")
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
        pack = cls(path, header, np.frombuffer(mmap.mmap(file.fd, 0, access=mmap.ACCESS_READ), dtype=np.uint8), file)
        problem = pack._content_problem()
        if problem:
            raise PackError(f"{path} is damaged: {problem}; {fix}")
        return pack

    def _content_problem(self) -> str:
        """What is wrong with the sections and labels (checksums, bounds, values); "" when nothing.

        Vectorised over the index and the label table: a few ms for COCO, plus the CRC32 pass.
        """
        sums = self.header["checksums"]
        for name in SECTIONS:
            off, nbytes = self.header["sections"][name]
            if zlib.crc32(self._mm[off:off + nbytes]) != sums[name]:
                return f"its {name} section fails its checksum"
        c, idx, n = self.header["counts"], self.index, len(self.index)
        data_end = min(off for off, _ in self.header["sections"].values())
        if n != c["images"] or len(self.label_table) != c["boxes"] or len(self.label_crc) != c["tried"]:
            return "its sections disagree with the header's counts"
        # each term bounded first, so that the uint64 sums cannot wrap around (a crafted offset near 2**64)
        if n and (int(idx["offset"].max()) > data_end or int(idx["nbytes"].max()) > data_end
                  or int((idx["offset"] + idx["nbytes"]).max()) > data_end or (idx["offset"] % ALIGN).any()):
            return "an index record points outside the payloads"
        if n and (int(idx["label_start"].max()) > len(self.label_table)
                  or int((idx["label_start"] + idx["label_count"]).max()) > len(self.label_table)):
            return "an index record points outside the labels"
        problem = self.codec.index_problem(idx, self.imgsz)
        if problem:
            return problem
        if len(self.files_bytes_split()) != n:
            return "its file list does not match its index"
        lb = self.label_table
        if len(lb):
            nc = self.header["source"]["nc"]
            cls = lb[:, 0]
            if not np.isfinite(lb).all():
                return "the labels hold NaN or infinite values"
            if (cls < 0).any() or (cls >= nc).any() or (cls % 1 != 0).any():
                bad = cls[(cls < 0) | (cls >= nc) | (cls % 1 != 0)][:3].tolist()
                return f"the labels hold classes {bad} outside 0-{nc - 1} (nc={nc})"
            if lb[:, 1:].max() > COORD_TOLERANCE or lb[:, 1:].min() < -0.01 or lb[:, 3:].min() < 0:
                return "the labels hold coordinates outside [0, 1]"
        return ""

    def files_bytes_split(self) -> list[bytes]:
        return bytes(self._section(self._files_section, np.uint8)).split(b"\0") if len(self.index) else []

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
    def fix(self) -> str:
        """What to do about damage found while reading: "rebuild it with: <the exact command for this pack>"."""
        return _fix_from_header(self.path, self.header) or GENERIC_FIX

    @property
    def imgsz(self) -> int:
        return self.header["imgsz"]

    @property
    def storage(self) -> str:
        """The format's name, which picks its codec (``yolofeed.pack.codecs``)."""
        return self.header["storage"]

    @property
    def shapes(self) -> np.ndarray:
        """(N, 2) (h, w) each image is delivered at: Ultralytics' ``load_image`` size."""
        return np.stack([self.index["h"], self.index["w"]], 1).astype(np.int64)

    @property
    def ori_shapes(self) -> np.ndarray:
        """(N, 2) original (h, w) of the source images, EXIF-upright."""
        return np.stack([self.index["h0"], self.index["w0"]], 1).astype(np.int64)

    @cached_property
    def im_files(self) -> list[str]:
        """Source image paths, in pack order (Ultralytics' sorted order, skipped files left out)."""
        return [os.fsdecode(f) for f in self.files_bytes_split()]

    # -- samples ----------------------------------------------------------------------------
    def image(self, i: int) -> np.ndarray:
        """Image ``i`` as a read-only (h, w, 3) uint8 RGB view of the file (formats that store pixels).

        Raises:
            PackError: the pack's format stores no pixels (its codec says what to use instead).
        """
        return self.codec.image(self, i)

    def encoded(self, i: int) -> np.ndarray:
        """Image ``i``'s stored bytes (its payload) as a 1-D uint8 view."""
        r = self.index[i]
        return self._mm[r["offset"]:r["offset"] + r["nbytes"]]

    def will_need(self, indices: Any) -> None:
        """Ask the kernel to read the payloads of ``indices`` now, all at once (``posix_fadvise(WILLNEED)``).

        The loader calls it before it copies or decodes a batch. A page fault on a memory map reads
        around the page it faults on: when the pack does not fit in the memory the process may use, the
        pages read around are evicted before the loader reaches them, and each epoch read the pack about
        four times from storage (measured in a memory cgroup smaller than the pack). Reading exactly the
        batch's byte ranges, queued together, reads each byte about once. A call per image (~1 us where the
        pages are cached; it releases the GIL where it has to wait); a no-op where the system has no
        ``posix_fadvise``, and for good after the first call that fails.
        """
        if self._file is None or not self._file.advise:
            return
        rec = self.index[np.asarray(indices, dtype=np.int64)]
        try:
            for off, n in zip(rec["offset"].tolist(), rec["nbytes"].tolist()):
                os.posix_fadvise(self._file.fd, off, n, os.POSIX_FADV_WILLNEED)
        except OSError as e:  # advice only: reading goes on without it
            self._file.advise = False
            LOGGER.debug(f"{self.path}: posix_fadvise(WILLNEED) failed ({e}); reading without it")

    def labels(self, i: int) -> np.ndarray:
        """(n, 5) float32 [class, x, y, w, h] normalised, a view."""
        r = self.index[i]
        return self.label_table[r["label_start"]:r["label_start"] + r["label_count"]]

    def gather(self, indices: Any, out: Any) -> np.ndarray:
        """Copy the payloads of ``indices``, read as (h, w, 3) pixels, into the top-left corner of ``out[k]``.

        The host gather of formats that store pixels: one memcpy per image.

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
        mm = self._mm
        for s, off, n in zip(starts.tolist(), rec["offset"].tolist(), sizes.tolist()):
            buf[s:s + n] = mm[off:off + n]  # one memcpy per file; numpy releases the GIL for it
        return starts, sizes

    # -- payload checksums --------------------------------------------------------------------
    def damaged(self, threads: int = 0) -> np.ndarray:
        """Indices of images whose payload no longer matches the CRC32 recorded when it was written.

        Reads every payload once (the whole file): ``threads`` threads (0: all usable cores) run
        ``zlib.crc32``, which releases the GIL.
        """
        return np.nonzero(payload_crcs(self._mm, self.index, threads) != self.index["crc32"])[0]

    def verify(self, threads: int = 0, fix: str = "") -> None:
        """Check every payload's CRC32 (``yolofeed pack ... verify=True``).

        Raises:
            PackError: some payloads are damaged; the message names them and the rebuild command.
        """
        bad = self.damaged(threads)
        if len(bad):
            fix = fix or _fix_from_header(self.path, self.header)
            files = self.im_files
            names = ", ".join(printable(files[i]) for i in bad[:3])
            names += f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            raise PackError(f"{self.path} is damaged: the stored pixels of {len(bad)} image(s) fail their "
                            f"checksum ({names}); {fix}")

    # -- pickling: workers and DDP ranks reopen the file instead of copying the map -----------
    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        other = Pack.open(state["path"])
        self.__dict__.update(other.__dict__)


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


def write_tail(fd: int, data_end: int, index: np.ndarray, labels: np.ndarray, files: list[str],
               label_crc: np.ndarray, header: dict[str, Any]) -> int:
    """Append the index, labels, file list, label file CRCs, header and trailer after the payloads.

    Args:
        fd: the pack file, open for writing; payloads occupy ``[0, data_end)``.
        label_crc: (tried,) uint32, the CRC32 of each source label file's bytes.
        header: completed with ``sections``, ``checksums``, ``format`` and ``format_version`` here.

    Returns:
        The file's final size.
    """
    pos = align(data_end)
    sections, sums = {}, {}
    for name, blob in (("index", index.astype(INDEX_DTYPE).tobytes()),
                       ("labels", np.ascontiguousarray(labels, np.float32).tobytes()),
                       ("files", b"\0".join(map(os.fsencode, files))),
                       ("label_crc", np.ascontiguousarray(label_crc, np.uint32).tobytes())):
        _pwrite_all(fd, blob, pos)
        sections[name], sums[name] = [pos, len(blob)], zlib.crc32(blob)
        pos = align(pos + len(blob))
    header = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **header, "sections": sections,
              "checksums": sums}
    blob = json.dumps(header, indent=1).encode("utf-8")
    _pwrite_all(fd, blob, pos)
    _pwrite_all(fd, TRAILER.pack(MAGIC, zlib.crc32(blob), pos, len(blob)), pos + len(blob))
    end = pos + len(blob) + TRAILER.size
    os.ftruncate(fd, end)  # a reused temp name could hold more bytes from an earlier attempt
    return end


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


def _header_problem(h: dict[str, Any], h_off: int) -> str:
    """What is missing or malformed in a header of the current format; "" when it is well formed."""
    def ints(v: Any, n: int) -> bool:
        return isinstance(v, list) and len(v) == n and all(isinstance(x, int) and x >= 0 for x in v)

    spec = {"split": str, "imgsz": int, "storage": str, "source": dict, "counts": dict, "skipped": list,
            "notes": list, "sections": dict, "checksums": dict, "created": str}
    for key, kind in spec.items():
        if not isinstance(h.get(key), kind):
            return f"header key '{key}' is missing or not a {kind.__name__}"
    if codecs.find(h["storage"]) is None:
        return f"its storage format {h['storage']!r} is not one this yolofeed reads ({', '.join(codecs.names())})"
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
    for name, dtype in SECTIONS.items():
        where = h["sections"].get(name)
        if not ints(where, 2) or where[0] + where[1] > h_off or where[1] % dtype.itemsize:
            return f"header's {name} section {where} is malformed or out of bounds"
        if not isinstance(h["checksums"].get(name), int):
            return f"header's checksum of the {name} section is missing"
    if h["sections"]["labels"][1] % (5 * 4):
        return "header's labels section is not whole rows"
    return ""


def _fix_from_header(path: Path, header: dict[str, Any]) -> str:
    """The rebuild command for a pack whose header names its source, or "" (a header too damaged to tell)."""
    try:
        data, imgsz, storage = str(header["source"]["data"]), int(header["imgsz"]), str(header["storage"])
        if codecs.find(storage) is None or imgsz < 1 or "\0" in data:
            return ""
        default = store_dir(data, imgsz, storage)
    except (*HEADER_ERRORS, PackError, OSError):  # a path that cannot be resolved (a link loop, too long)
        return ""
    folder = path.parent
    if folder == default:
        out = None
    elif folder.name == default.name:  # <out>/<stem>-<format>-<imgsz>: rebuilt by out=<out>
        out = folder.parent
    else:  # a pack file moved elsewhere: a new one is built under the folder it is in
        out = folder
    return f"rebuild it with: {rebuild_command(data, imgsz, storage, out)}"


def store_dir(yaml_file: str | os.PathLike, imgsz: int, storage: str, out: str | os.PathLike | None = None) -> Path:
    """Where the packs of a data yaml live: ``<folder>/<yaml stem>-<format>-<imgsz>``, the folder being ``out``, or
    ``yolofeed-packs`` beside the yaml (see ``build.pack_folders``). Each dataset, format and size in a folder of its
    own, so that several of them share one ``out=`` without replacing each other's packs."""
    try:
        y = Path(yaml_file).resolve()
        base = Path(out).expanduser().resolve() if out else y.parent / "yolofeed-packs"
    except (RuntimeError, OSError) as e:  # a symbolic link loop: RuntimeError before Python 3.13, OSError after
        raise PackError(f"{out or yaml_file}: cannot resolve the path ({e}); pass a folder that is not a link loop"
                        ) from None
    return base / f"{y.stem}-{storage}-{imgsz}"


def rebuild_command(yaml_file: str, imgsz: int, storage: str, out: str | os.PathLike | None = None) -> str:
    """The exact command that rebuilds this pack, for error messages: quoted for a POSIX shell, so that a path with a
    space or a quote in it pastes whole."""
    return shlex.join(["yolofeed", "pack", f"data={yaml_file}", f"imgsz={imgsz}", f"format={storage}",
                       *([f"out={out}"] if out else []), "rebuild=always"])


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset``: ``os.pwrite``, or seek + write where it is missing (Windows).

    The fallback moves the descriptor's position, so each writer needs its own descriptor (as build
    workers have).
    """
    view = memoryview(data).cast("B")
    pwrite = getattr(os, "pwrite", None)
    while view:
        if pwrite is not None:
            n = pwrite(fd, view, offset)
        else:
            os.lseek(fd, offset, os.SEEK_SET)
            n = os.write(fd, view)
        view, offset = view[n:], offset + n
