"""The pack's reader: a read-only view of one split's pack file (layout in pack/layout.py).

What is checked, and when (CRC32 from ``zlib``: no new dependency):

* ``Pack.open``: the header's CRC32 (kept in the trailer), its keys and types, every section's
  bounds and CRC32, and the index and label values (payloads inside the file, sizes those of an
  image of this pack, classes in ``[0, nc)``, finite coordinates within Ultralytics' tolerance; a pose pack's
  keypoints too, by its rules: boxes not bounded from above, keypoints' x and y are).
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

The reader holds views only: how a format's payloads become pixels (a batch gathered on the host, decoded on the
device) is its codec's (``yolofeed.pack.codecs``), picked by the header's format.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import mmap
import os
import stat
import warnings
import zlib
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from yolofeed import __version__
from yolofeed.errors import ForeignPackError, NewerPackError, PackError, StalePackError, describe
from yolofeed.pack import codecs, files
from yolofeed.pack.layout import (
    ALIGN,
    FORMAT_NAME,
    FORMAT_VERSION,
    HEADER_ERRORS,
    INDEX_DTYPE,
    MAGIC,
    MAX_HEADER,
    TRAILER,
    header_problem,
    payload_crcs,
    printable,
)
from yolofeed.pack.paths import GENERIC_FIX, fix_from_header
from yolofeed.ultralytics_seam import LABEL_RULES, UNRECORDED_LABEL_RULES, LabelRules, label_rules_named

LOGGER = logging.getLogger(__name__)
DEFAULTS = {"task": "detect"}  # header keys packs written before them lack: what those packs are


def label_rules_of(header: dict[str, Any]) -> LabelRules:
    """The label rules a pack was built under (``header["label_rules"]``, the first release of those rules); the
    installed release's where the name is unknown (a newer yolofeed's: the pack is stale for this one anyway)."""
    return label_rules_named(header.get("label_rules", UNRECORDED_LABEL_RULES)) or LABEL_RULES


class _ReadFile:
    """A pack file's read-only descriptor, closed when no Pack (nor a copy made by unpickling) holds it."""

    def __init__(self, fd: int):
        self.fd = fd
        self.advise = hasattr(os, "posix_fadvise")  # not on Windows or macOS
        self.mtime_ns = os.fstat(fd).st_mtime_ns  # as opened: a write into the file since moves it (changed)

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
                raise PackError(f"{path} is {describe(path)}: point the link at a pack or remove it, then "
                                f"{fix}") from None
            raise PackError(f"pack {path} does not exist; {fix}") from None
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise files.denied(path, e, "read", "a pack") from None
            raise PackError(f"cannot open {path} ({e.strerror or e}): it is {describe(path)}; move it away, "
                            f"then {fix}") from None
        file = cls(fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO opened without blocking, a device, a folder
            raise PackError(f"{path} is not a regular file but {describe(path)}: a pack is a file that yolofeed "
                            f"pack writes; move it away, then {fix}")
        return file

    def __del__(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.close(self.fd)


def _renamed(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def _encloses(lo: np.ndarray, hi: np.ndarray, labels: np.ndarray) -> bool:
    """Whether each label row's box is the one from ``lo`` to ``hi`` (its points' bounds, ``segments2boxes``), to
    float32 rounding. Shape: lo, hi (M, 2); labels (M, 5)."""
    return bool(np.abs(np.concatenate([(lo + hi) / 2, hi - lo], 1) - labels[:, 1:]).max() <= 1e-5)


class Pack:
    """Read-only view of one split's pack file.

    ``labels(i)``, ``encoded(i)`` and (formats that store pixels) ``image(i)`` are zero-copy views into the
    memory map (``buffer``, the whole file as 1-D uint8). The format's codec (``codec``, picked by the header's
    format) says how payloads become pixels: ``pack.codec.gather(pack, indices, out)`` copies a batch into a
    caller's (pinned) buffer in one call.

    Example:
        >>> pack = Pack.open("datasets/synth/yolofeed-packs/data-raw-640/train.yfpack")
        >>> img = pack.image(0)  # (h, w, 3) uint8 RGB, a view of the file
    """

    def __init__(self, path: Path, header: dict[str, Any], mm: np.ndarray, file: _ReadFile | None = None):
        self.path, self.header, self.buffer, self._file = path, header, mm, file
        self.codec = codecs.get(header["storage"])
        sec = header["sections"]
        self.index = self._section(sec["index"], INDEX_DTYPE)
        self.label_table = self._section(sec["labels"], np.float32).reshape(-1, 5)
        self.label_crc = self._section(sec["label_crc"], np.uint32)
        self._files_section = sec["files"]
        # pose: (M, K, 3) [x, y, visibility], row j the keypoints of label_table row j; None in a detection pack
        self.keypoint_table = (self._section(sec["keypoints"], np.float32).reshape(-1, self.kpt_shape[0], 3)
                               if self.task == "pose" else None)
        # obb: (M, 4, 2) [x, y] of the rotated box of label_table row j (its enclosing box); None in other packs
        self.corner_table = (self._section(sec["corners"], np.float32).reshape(-1, 4, 2)
                             if self.task == "obb" else None)
        # segment (and detect, where every row is a polygon): (M,) points of label_table row j's polygon, (P, 2) [x, y]
        # of all of them in row order, and (M + 1,) where each row's start (the lengths' cumulative sum, made here
        # once); None in other packs
        self.polygon_lengths = self.polygon_points = self.polygon_starts = None
        if self.task == "segment" or (self.task == "detect" and "polygon_lengths" in sec):  # both (the header's check)
            self.polygon_lengths = self._section(sec["polygon_lengths"], np.uint32)
            self.polygon_points = self._section(sec["polygon_points"], np.float32).reshape(-1, 2)
            self.polygon_starts = np.concatenate([[0], np.cumsum(self.polygon_lengths, dtype=np.int64)])

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, expect: dict[str, Any] | None = None, fix: str = "") -> Pack:
        """Open and validate a pack file.

        Args:
            path: a ``.yfpack`` file.
            expect: header values the caller needs (e.g. ``{"imgsz": 640, "storage": codecs.DEFAULT,
                "data": yaml path, "task": "pose"}``); any mismatch raises ``StalePackError`` (the sources'
                fingerprint is ``pack.rebuild``'s to compare, which says what changed).
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
        fix = fix or fix_from_header(path, header) or generic
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
        problem = header_problem(header, h_off, codecs.names())
        if problem:
            raise PackError(f"{path} is damaged or foreign: {problem}; {fix}")
        expect = dict(expect or {})
        if "data" in expect and header["source"].get("data") != expect["data"]:  # checked first: the clearer
            raise ForeignPackError(f"{path} was built from {header['source'].get('data')}, not from "
                                   f"{expect['data']}; point out= elsewhere or {fix}")
        for key, want in expect.items():
            have = (header["source"].get(key) if key == "data"
                    else header.get(key, UNRECORDED_LABEL_RULES) if key == "label_rules"
                    else header.get(key, DEFAULTS.get(key)))
            if have != want:
                what = {"split": f"it is the {printable(str(have))[:40]} split's pack, not the {want} split's (a file "
                                 "copied or renamed?)",
                        "label_rules": f"its labels were checked with the rules of Ultralytics {have} on, and the "
                                       f"installed Ultralytics checks them as {want} on does",
                        "detect_polygons": "it was built before detection packs kept polygon labels (Ultralytics makes "
                                           "a detection run's augmented boxes of them; a pack of box labels is "
                                           "rebuilt once too, as its header cannot say which it holds)"}.get(
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
        for name in self.header["sections"]:  # every section listed, one this yolofeed does not read too
            off, nbytes = self.header["sections"][name]
            if zlib.crc32(self.buffer[off:off + nbytes]) != sums[name]:
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
            rules = label_rules_of(self.header)  # what its build accepted: fractional ids before 8.4.164, ...
            wrong = (cls >= nc) | (cls < (0 if rules.integer_classes else -rules.negative))
            if rules.integer_classes:
                wrong |= cls % 1 != 0
            if wrong.any():
                return f"the labels hold classes {cls[wrong][:3].tolist()} outside 0-{nc - 1} (nc={nc})"
            # a pose row's box is not bounded from above (verify.read_pose_labels, as Ultralytics)
            top = lb[:, 1:].max() if self.keypoint_table is None else -np.inf
            if (top > rules.coord_max or lb[:, 1:].min() < -rules.negative
                    or (rules.negative_sizes and lb[:, 3:].min() < 0)):
                return "the labels hold coordinates outside [0, 1]"
        kp = self.keypoint_table
        if kp is not None and len(kp):
            if len(kp) != len(lb):
                return "its keypoints section does not have one row per label"
            top = label_rules_of(self.header).coord_max
            if not np.isfinite(kp).all() or kp[..., :2].max() > top or kp.min() < -0.01:
                return "the keypoints hold values outside [0, 1] (x, y) or below 0, or not finite"
        quads = self.corner_table
        if quads is not None and len(quads):
            if len(quads) != len(lb):
                return "its corners section does not have one row per label"
            if not np.isfinite(quads).all():
                return "the corners hold values that are not finite"
            if not _encloses(quads.min(1), quads.max(1), lb):  # each row's box is its corners' (segments2boxes)
                return "the corners do not lie on their labels' boxes (each box encloses its row's 4 corners)"
        if self.polygon_lengths is not None:
            problem = self._polygon_problem()
            if problem:
                return problem
        return ""

    def _polygon_problem(self) -> str:
        """What is wrong with a segment pack's polygons: one per label row, a point or more each (a row ``class x y``
        among polygon rows is a polygon of one point to Ultralytics, which keeps it), as many points as the lengths
        add up to, finite, each row's box the one enclosing its polygon; "" when nothing."""
        lengths, points, lb = self.polygon_lengths, self.polygon_points, self.label_table
        if len(lengths) != len(lb):
            return "its polygon_lengths section does not have one length per label"
        if len(lengths) and int(lengths.min()) < 1:  # a row of a single point is Ultralytics' too (segments2boxes)
            return "a polygon has no points"
        if int(self.polygon_starts[-1]) != len(points):
            return "its polygon lengths do not add up to its points"
        if not len(points):
            return ""
        if not np.isfinite(points).all():
            return "the polygons hold values that are not finite"
        starts = self.polygon_starts[:-1]
        lo = np.stack([np.minimum.reduceat(points[:, k], starts) for k in range(2)], 1)
        hi = np.stack([np.maximum.reduceat(points[:, k], starts) for k in range(2)], 1)
        if not _encloses(lo, hi, lb):
            return "the polygons do not lie on their labels' boxes (each box encloses its row's polygon)"
        return ""

    def sources(self) -> tuple[list[str], np.ndarray] | None:
        """The source images tried, in source order, and (2 x tried, 2) [size, mtime in ns] of each and then of its
        label file, as the fingerprint read them at the build (``layout.source_sections``); None for a pack written
        before it recorded them, or whose record does not add up (checked only here: it only names files)."""
        sec = self.header["sections"]
        if "source_files" not in sec or "source_stats" not in sec:
            return None
        tried = self.header["counts"]["tried"]
        blob = bytes(self._section(sec["source_files"], np.uint8))
        names = [os.fsdecode(b) for b in blob.split(b"\0")] if tried else []
        stats = self._section(sec["source_stats"], np.uint8)
        if len(names) != tried or len(stats) != tried * 32:  # two files an image, two int64 each
            return None
        return names, stats.view("<i8").reshape(-1, 2)

    def files_bytes_split(self) -> list[bytes]:
        return bytes(self._section(self._files_section, np.uint8)).split(b"\0") if len(self.index) else []

    def _section(self, where: list[int], dtype: Any) -> np.ndarray:
        off, nbytes = where
        return self.buffer[off:off + nbytes].view(dtype)

    # -- metadata ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        return (f"Pack({str(self.path)!r}, split={self.split!r}, images={len(self)}, "
                f"format={self.format!r}, imgsz={self.imgsz})")

    @property
    def split(self) -> str:
        return self.header["split"]

    def changed(self) -> bool:
        """Whether another program wrote into the file, or cut or grew it, since it was opened (its size or its
        modification time moved). What a read of it then finds is the file's damage, not a fault of the reader.
        False for a pack without its file (released) or one whose file cannot be asked."""
        if self._file is None:
            return False
        try:
            st = os.fstat(self._file.fd)
        except OSError:
            return False
        return st.st_size != len(self.buffer) or st.st_mtime_ns != self._file.mtime_ns

    @property
    def fix(self) -> str:
        """What to do about damage found while reading: "rebuild it with: <the exact command for this pack>"."""
        return fix_from_header(self.path, self.header) or GENERIC_FIX

    @property
    def imgsz(self) -> int:
        return self.header["imgsz"]

    @property
    def format(self) -> str:
        """The pack's format (the header's key ``storage``, kept from packs already written): it picks the codec."""
        return self.header["storage"]

    # -- names of the API before the format's codec owned its gather (they warn, then work as before) ------------
    @property
    def storage(self) -> str:
        """Deprecated: ``format``."""
        _renamed("Pack.storage", "Pack.format")
        return self.format

    def gather(self, indices: Any, out: Any) -> np.ndarray:
        """Deprecated: ``pack.codec.gather(pack, indices, out)``."""
        _renamed("Pack.gather(indices, out)", "pack.codec.gather(pack, indices, out)")
        return self.codec.gather(self, np.asarray(indices, dtype=np.int64), out)

    def gather_encoded(self, indices: Any, out: Any) -> tuple[np.ndarray, np.ndarray]:
        """Deprecated: ``yolofeed.pack.codecs.jpeg.gather_encoded(pack, indices, out)``."""
        from yolofeed.pack.codecs.jpeg import gather_encoded

        _renamed("Pack.gather_encoded(indices, out)", "yolofeed.pack.codecs.jpeg.gather_encoded(pack, indices, out)")
        return gather_encoded(self, indices, out)

    @property
    def task(self) -> str:
        """What the pack was built for: "detect", "pose", "obb" or "segment" (its label rules, and the keypoints,
        corners or polygons sections)."""
        return self.header.get("task", DEFAULTS["task"])

    @property
    def kpt_shape(self) -> tuple[int, int] | None:
        """Pose: the data yaml's (K, D) the pack was built for (stored as K x 3 either way); None for detection."""
        return tuple(self.header["kpt_shape"]) if self.task == "pose" else None

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
        return self.buffer[r["offset"]:r["offset"] + r["nbytes"]]

    def will_need(self, indices: Any) -> None:
        """Ask the kernel to read the payloads of ``indices`` now, all at once (``posix_fadvise(WILLNEED)``).

        The loader calls it before it copies or decodes a batch. A page fault on a memory map reads
        around the page it faults on: when the pack does not fit in the memory the process may use, the
        pages read around are evicted before the loader reaches them, and each epoch read the pack about
        four times from storage (measured in a memory cgroup smaller than the pack). Reading exactly the
        batch's byte ranges, queued together, reads each byte about once. A call per image (~1 us where the
        pages are cached; it releases the GIL where it has to wait); a no-op where the system has no
        ``posix_fadvise``, and for good after the first call that fails.

        First, one ``fstat``: a file cut shorter since it was opened (another program truncating or rewriting it in
        place) is refused here, between batches, where reading its map past the new end would kill the process
        with SIGBUS.

        Raises:
            PackError: the file is shorter than its map.
        """
        if self._file is None:
            return
        size = os.fstat(self._file.fd).st_size
        if size < len(self.buffer):
            raise PackError(f"{self.path} was cut to {size:,} bytes while it was read (it had {len(self.buffer):,} "
                            f"when opened): another program truncated or rewrote it in place; {self.fix}")
        if not self._file.advise:
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

    def keypoints(self, i: int) -> np.ndarray | None:
        """(n, K, 3) float32 [x, y, visibility], x and y normalised, one row per label of ``labels(i)``, a view;
        None for a detection pack."""
        if self.keypoint_table is None:
            return None
        r = self.index[i]
        return self.keypoint_table[r["label_start"]:r["label_start"] + r["label_count"]]

    def corners(self, i: int) -> np.ndarray | None:
        """(n, 4, 2) float32 [x, y] normalised, the rotated box of each label of ``labels(i)`` (which is its enclosing
        box), a view; None for a pack of another task."""
        if self.corner_table is None:
            return None
        r = self.index[i]
        return self.corner_table[r["label_start"]:r["label_start"] + r["label_count"]]

    def polygons(self, i: int) -> list[np.ndarray] | None:
        """The (P_j, 2) float32 [x, y] normalised polygon of each label of ``labels(i)`` (whose box encloses it), as
        its label file lists it, views; None for a pack of another task."""
        if self.polygon_lengths is None:
            return None
        r = self.index[i]
        bounds = self.polygon_starts[r["label_start"]:r["label_start"] + r["label_count"] + 1].tolist()
        return [self.polygon_points[a:b] for a, b in zip(bounds, bounds[1:])]

    # -- payload checksums --------------------------------------------------------------------
    def damaged(self, threads: int = 0) -> np.ndarray:
        """Indices of images whose payload no longer matches the CRC32 recorded when it was written.

        Reads every payload once (the whole file): ``threads`` threads (0: all usable cores) run
        ``zlib.crc32``, which releases the GIL.
        """
        return np.nonzero(payload_crcs(self.buffer, self.index, threads) != self.index["crc32"])[0]

    def verify(self, threads: int = 0, fix: str = "") -> None:
        """Check every payload's CRC32 (``yolofeed pack ... verify=True``).

        Raises:
            PackError: some payloads are damaged; the message names them and the rebuild command.
        """
        bad = self.damaged(threads)
        if len(bad):
            fix = fix or fix_from_header(self.path, self.header)
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
