"""The registry of pack formats: one codec implements each, registered under the name a pack's header records.

As ffcv's fields, a codec is the whole life of an image in one format:

* build time, in a build worker: ``encode`` turns one checked source image into the payload bytes the
  pack stores, and says the sizes the index records (original and resized (h, w));
  ``payload_estimate``/``max_payload`` size the pack before it is written;
* open time: ``index_problem`` checks the index records against what this format can hold;
* the loader's host thread: ``gather`` writes a batch's RGB pixels into the (pinned) host buffer, which
  the loader copies to the device on its side stream;
* the device, on the loader's side stream: when ``decodes_on_device`` says so, the host buffer holds no
  pixels and ``decode`` writes the batch's RGB pixels straight into the slot's device buffer, staging the
  payloads in a pinned host buffer of ``staging_bytes`` first if it asks for one.

Either way the augmentation receives (N, S, S, 3) uint8 RGB images, image k in the top-left
``(h, w)`` corner of row k. A new format is one new module in this folder (a ``Codec`` subclass named
``CODEC``) and its name in ``BUILTIN``; a codec from elsewhere (a test, a plug-in) is added with ``register``.

This module is light on purpose (no numpy, no torch): ``yolofeed help`` lists the formats from it. A
built-in codec's module is imported the first time its name is asked for.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from yolofeed.errors import PackError

if TYPE_CHECKING:
    import numpy as np
    import torch

    from yolofeed.pack.verify import ImageInfo

# The built-in formats: module name under this package -> what it stores, for help text. The first is the default.
BUILTIN = {
    "raw": "decoded RGB pixels",
    "jpeg": "encoded bytes (5-10x smaller for photos of about imgsz), decoded later on the GPU",
}
DEFAULT = next(iter(BUILTIN))
AUTO = "auto"  # pack_format=auto (yolofeed's default): ``choose`` picks a built-in format for the dataset and machine
COMPACT = "jpeg"  # what ``auto`` picks where the default's packs would crowd the machine's RAM
RAM_SHARE = 0.5  # ... more than this share of it: the page cache must keep a pack beside the training's own memory
DISK_SHARE = 0.9  # ... or more than this share of the free space where the packs go
_LOADED: dict[str, Codec] = {}  # built-in codecs imported so far, and registered ones


class PackView(Protocol):
    """What a codec reads of a pack: ``yolofeed.pack.store.Pack`` is one (the codecs import no reader)."""

    path: Path
    index: np.ndarray  # one ``layout.INDEX_DTYPE`` record per image
    buffer: np.ndarray  # the whole file, 1-D uint8, a read-only view of its memory map
    imgsz: int
    shapes: np.ndarray
    im_files: list[str]

    def __len__(self) -> int: ...

    def encoded(self, i: int) -> np.ndarray: ...


class Codec:
    """One format's codec. Subclasses override what their format does differently; see the module docstring.

    Every method is called with the pack (or the build worker's arguments) it works on, so a codec keeps no
    state of its own and one instance serves every pack of its format.
    """

    name: str = ""
    summary: str = ""  # one line for help text: what a payload holds

    # -- build time ---------------------------------------------------------------------------
    def encode(self, im_file: str, info: ImageInfo, imgsz: int, notes: list[str]) -> tuple[Any, tuple, tuple]:
        """The payload of one checked image (``verify.check_image`` read its header), in a build worker.

        Args:
            notes: append what the pack report should say about this image (a re-encode, say).

        Returns:
            (payload, (h0, w0), (h, w)): a contiguous uint8 array whose bytes are stored; the original
            (decoded, EXIF-upright) size; the size the loader delivers (Ultralytics' ``load_image`` size).

        Raises:
            verify.SampleError: the image must be skipped; the message is the reason.
        """
        raise NotImplementedError

    def payload_estimate(self, im_file: str, imgsz: int) -> int:
        """Bytes one image's payload will take, from its header or size (no decode): sizes the pack up front."""
        raise NotImplementedError

    def max_payload(self, imgsz: int) -> int | None:
        """The largest payload an image can have, when the format bounds it (the build reserves that much)."""
        return None

    # -- open time ----------------------------------------------------------------------------
    def index_problem(self, index: np.ndarray, imgsz: int) -> str:
        """What is wrong with a pack's index records for this format (``Pack.open``); "" when nothing."""
        return ""

    @staticmethod
    def sizes_problem(index: np.ndarray, imgsz: int, *stored: str) -> str:
        """``index_problem`` for the sizes every format records: each image at least 1x1 and at most imgsz (what
        the loader writes into a batch slot of imgsz x imgsz), and at least 1 in the ``stored`` fields too."""
        if len(index) and (max(int(index["h"].max()), int(index["w"].max())) > imgsz
                           or min(int(index[f].min()) for f in ("h", "w", *stored)) < 1):
            return "an index record has a size that is not an image of this pack"
        return ""

    # -- host: the loader's thread -----------------------------------------------------------------
    def image(self, pack: PackView, i: int) -> np.ndarray:
        """Image ``i`` as a read-only (h, w, 3) uint8 RGB view of the file, for formats that store pixels.

        Raises:
            PackError: this format stores no pixels.
        """
        raise PackError(f"{pack.path} stores {self.name} payloads, not pixels; use encoded(i), or build a "
                        f"{DEFAULT} pack with format={DEFAULT}")

    def gather(self, pack: PackView, indices: np.ndarray, out: Any) -> np.ndarray:
        """Write images ``indices`` as RGB pixels into the top-left corner of ``out[k]``, on the host.

        Args:
            indices: (B,) int64 sample indices.
            out: a (>=B, S, S, 3) uint8 numpy array or CPU torch tensor (pinned, say); the area right of and
                below each image is left as it was.

        Returns:
            (B, 2) int64 (h, w) of each image.
        """
        raise NotImplementedError

    # -- device: the loader's side stream ----------------------------------------------------------
    def decodes_on_device(self, device: torch.device, decode: str) -> bool:
        """Whether the loader calls ``decode`` (pixels made on ``device``) instead of ``gather`` (made on the host).

        Args:
            decode: the loader's ``decode=`` option ("auto", "torchvision" or "cv2", already checked).
        """
        return False

    def staging_bytes(self, pack: PackView, batch: int) -> int:
        """Host bytes ``decode`` may stage a batch of up to ``batch`` payloads in (the loader pins them); 0: none."""
        return 0

    def decode(self, pack: PackView, indices: np.ndarray, out: torch.Tensor,
               staging: torch.Tensor | None = None) -> None:
        """Write images ``indices`` as RGB pixels into ``out[k, :h, :w]`` on ``out.device``, on the current stream.

        Called from the loader's thread with its side stream current: it may wait on that stream (never on
        the training stream).

        Args:
            staging: None, or a 1-D uint8 host tensor of ``staging_bytes(pack, len(indices))`` or more (pinned on
                CUDA machines), the same buffer every batch: ``decode`` may overwrite it once the current stream's
                reads of it (the last batch's copies to the device) are done.

        Shape:
            out: (>=B, S, S, 3) uint8.
        """
        raise NotImplementedError


def names() -> tuple[str, ...]:
    """Every format this yolofeed reads and writes: the built-in ones (default first), then registered ones."""
    return tuple(BUILTIN) + tuple(n for n in _LOADED if n not in BUILTIN)


def choices() -> tuple[str, ...]:
    """What a ``format=``/``pack_format=`` key accepts: ``auto``, then every format's name."""
    return (AUTO, *names())


def choose(default_bytes: int, ram_bytes: int, free_bytes: int | None = None, where: str = "",
           compact_bytes: int | None = None) -> tuple[str, str]:
    """``auto``'s pick: the default format where its packs fit comfortably in RAM and on the disk, else the compact
    one, where it is smaller.

    Read from storage, a raw pack needs ~1.7 GB/s of reads to train yolo11n at full speed on an H200, a jpeg pack
    ~0.15 GB/s (BENCHMARKS.md, "Packs larger than the memory allowed"): raw only pays where the page cache keeps it.
    A compact pack is no smaller where the images are small or stored much larger than imgsz (a JPEG pack keeps a
    source JPEG of about imgsz as it is, and re-encodes others): there the default is kept whatever the sizes.

    Args:
        default_bytes: the estimated size of the dataset's packs in the default format.
        ram_bytes: the memory this process may use (the machine's, or its cgroup's limit).
        free_bytes: free space on the disk the packs go to (None: not known, not checked).
        where: that disk's folder, for the reason.
        compact_bytes: the estimated size of its packs in the compact format (None: not estimated, taken as smaller).

    Returns:
        (format name, the reason in words, for the log).
    """
    def gb(n: int) -> str:
        return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"

    size, ram = gb(default_bytes), f"{ram_bytes / 1e9:,.0f} GB"
    if compact_bytes is not None and compact_bytes >= default_bytes:
        return DEFAULT, (f"its {COMPACT} packs would be no smaller than its {DEFAULT} packs ({gb(compact_bytes)} "
                         f"against {size})")
    smaller = (f"{COMPACT} packs would take {gb(compact_bytes)}" if compact_bytes is not None
               else f"{COMPACT} packs are 5-10x smaller for photos of about imgsz")
    anyway = f"pack_format={DEFAULT}, or format={DEFAULT} for yolofeed pack, to choose {DEFAULT} anyway"
    if default_bytes > RAM_SHARE * ram_bytes:
        return COMPACT, (f"{DEFAULT} packs would take {size}, more than {RAM_SHARE:.0%} of the {ram} of memory here; "
                         f"{smaller} ({anyway})")
    if free_bytes is not None and default_bytes > DISK_SHARE * free_bytes:
        place = where or "their folder"
        return COMPACT, (f"{DEFAULT} packs would take {size}, more than {DISK_SHARE:.0%} of the {gb(free_bytes)} "
                         f"free in {place}; {smaller} (free space, or {anyway})")
    return DEFAULT, (f"its {DEFAULT} packs ({size}) fit in {RAM_SHARE:.0%} of the {ram} of memory here, where the "
                     "page cache keeps them")


def summaries() -> dict[str, str]:
    """Format name -> one line on what it stores (help text), without importing any codec."""
    return {n: BUILTIN.get(n) or _LOADED[n].summary for n in names()}


def find(name: str) -> Codec | None:
    """The codec registered as ``name``, or None: the check of the format a pack's header names."""
    if not isinstance(name, str):
        return None
    if name not in _LOADED and name in BUILTIN:
        _LOADED[name] = importlib.import_module(f"{__name__}.{name}").CODEC
    return _LOADED.get(name)


def get(name: str) -> Codec:
    """The codec of format ``name``.

    Raises:
        PackError: no codec has that name; the message lists the formats there are.
    """
    codec = find(name)
    if codec is None:
        raise PackError(f"format={name}: expected one of {', '.join(names())}")
    return codec


def register(codec: Codec) -> Codec:
    """Add a codec under ``codec.name`` (a plug-in's, a test's); returns it.

    Raises:
        ValueError: the name is empty, not usable in a folder name, or taken.
    """
    name = codec.name
    if not name or not name.replace("_", "").isalnum() or name in BUILTIN or name in _LOADED or name == AUTO:
        raise ValueError(f"cannot register a codec as {name!r}: the name is empty, not alphanumeric, or taken")
    _LOADED[name] = codec
    return codec


def unregister(name: str) -> None:
    """Remove a codec ``register`` added (tests); the built-in ones stay."""
    if name not in BUILTIN:
        _LOADED.pop(name, None)


__all__ = ["AUTO", "BUILTIN", "COMPACT", "DEFAULT", "Codec", "PackView", "choices", "choose", "find", "get", "names",
           "register", "summaries", "unregister"]
