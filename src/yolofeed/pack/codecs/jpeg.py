"""The jpeg format: the encoded files, decoded when loaded (on the GPU with nvJPEG, or on two host threads).

Build: a JPEG that a GPU decoder reads as is (baseline or progressive JPEG, RGB or grey, upright, no
trailing bytes) is kept byte for byte; any other image is decoded as Ultralytics decodes it and
re-encoded at quality ``REENCODE_QUALITY`` (noted in the pack report). 5-10x smaller than raw for photos of
about imgsz (at 640: 90-150 KB against 0.93 MB, BENCHMARKS.md); a JPEG much larger than imgsz can outweigh its
raw payload, which holds it resized.

Device (``decode="torchvision"``, the default on CUDA): the loader stages a batch's files in one pinned
buffer, one ``decode_jpeg`` call decodes them all, then one Triton kernel resizes them and writes them into
the batch (``place_triton``). Elsewhere torch ops do that: one resize per group of images that share a
(decoded size, target size) pair (a COCO-like batch is a handful of groups) and one strided copy per image.
The same code runs on the CPU (libjpeg-turbo behind the same call), which is how the tests exercise the
grouping, the resize and the fallbacks.

An image the batched call refuses (nvJPEG declines some CMYK and unusual JPEGs) is decoded alone on
the same device; one that still fails is decoded on the host by OpenCV, exactly as the ``cv2`` path
and Ultralytics' ``load_image`` decode it, and reported once.

Host (``decode="cv2"``, the default without CUDA): two threads decode with OpenCV and resize as
``load_image`` into the pinned buffer, which the loader copies like a raw batch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from yolofeed.errors import PackError
from yolofeed.pack.codecs import BUILTIN, Codec, PackView
from yolofeed.pack.layout import align
from yolofeed.pack.verify import ImageInfo, SampleError, decode_bgr, resized_hw

LOGGER = logging.getLogger(__name__)
REENCODE_QUALITY = 95  # for non-JPEG, EXIF-rotated, CMYK or restored sources
HOST_THREADS = 2  # the cv2 decoder's threads: the loader's CPU budget
JPEG_MAX_SIDE = 65_500  # libjpeg's JPEG_MAX_DIMENSION: no JPEG, so no re-encoding, has a longer side
RAW_INSTEAD = "a raw pack keeps it: format=raw (pack_format=raw for yolofeed train)"
STAGING_MAX = 1 << 30  # pinned host bytes the loader may hold for a batch's files (COCO-like, batch 128: ~30 MB)

# Files the device decoder refused: reported once, then sent straight to OpenCV, so one odd file
# does not send its whole batch through the one-by-one retry every epoch.
_REFUSED: set[str] = set()


def _decode_jpeg(data: list[Tensor], device: torch.device) -> list[Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    if device.type == "cuda":
        # torchvision's CUDA decode allocates its outputs on the caller's stream but writes them from
        # a private stream that does not wait for the caller's: a block the caching allocator recycles
        # while kernels queued on this stream still read it gets overwritten (pytorch/vision#9606,
        # meta-pytorch/torchcodec#1634; seen on Hopper). Draining this stream first makes every recycled
        # block idle. The loader decodes on its side stream from its own thread: training never waits.
        torch.cuda.current_stream(device).synchronize()
    return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def decode_cv2(encoded: np.ndarray, h: int, w: int, name: str) -> np.ndarray:
    """OpenCV decode + INTER_LINEAR resize, as Ultralytics' ``load_image``: (h, w, 3) RGB uint8 on the host.

    Releases the GIL while decoding and resizing (the ``cv2`` decoder runs it on two threads).
    """
    import cv2

    im = cv2.imdecode(encoded, cv2.IMREAD_COLOR)
    if im is None:  # the build proved OpenCV reads every stored file: these bytes changed on disk since
        # the loader that read them adds the pack's own rebuild command (Pack.fix) to the message
        raise PackError(f"{name}: OpenCV cannot decode the JPEG bytes stored in the pack (the pack file is damaged)")
    if im.shape[:2] != (h, w):
        im = cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR)
    return cv2.cvtColor(im, cv2.COLOR_BGR2RGB)


def decode_into(encoded: Sequence[np.ndarray | Tensor], shapes: np.ndarray, out: Tensor,
                names: Sequence[str] | None = None) -> None:
    """Decode JPEGs on ``out.device`` and write each, resized to ``shapes[k]``, into ``out[k]``'s top-left corner.

    The resize is ``interpolate(bilinear, align_corners=False, antialias=False)`` in float32, rounded:
    the same half-pixel sample positions and weights as ``cv2.resize(INTER_LINEAR)``, but not
    bit-exact (OpenCV blends in 11-bit fixed point), and nvJPEG's IDCT and chroma upsampling differ
    from libjpeg-turbo's: pixels match the ``cv2`` path within a level or two, not exactly.

    On CUDA this host-synchronizes the current stream before decoding (see ``_decode_jpeg``): call it
    on a side stream from a loader thread, never on the training stream.

    Args:
        encoded: B JPEG files, 1-D uint8 CPU tensors (used as they are) or arrays (views of a pack's memory map
            are fine: each is copied into a tensor).
        shapes: target (h, w) of each image.
        out: images are written to ``out[k, :h, :w]``; the rest of ``out`` is left as it was.
        names: each image's file, for the warning when one falls back to OpenCV.

    Shape:
        shapes: (B, 2) int. out: (>=B, H, W, 3) uint8 with H >= every h, W >= every w.
    """
    n = len(encoded)
    if n == 0:
        return
    names = list(names) if names is not None else [f"image {k} of the batch" for k in range(n)]
    hw = [(int(h), int(w)) for h, w in np.asarray(shapes).tolist()]
    # An array becomes a fresh tensor: torch.frombuffer on a read-only memory map warns, and a copy is ~100 KB.
    data = [e if isinstance(e, Tensor) else torch.from_numpy(np.array(e, dtype=np.uint8)) for e in encoded]
    on_host = [k for k in range(n) if names[k] in _REFUSED]
    todo = [k for k in range(n) if names[k] not in _REFUSED]
    images: dict[int, Tensor] = {}
    try:
        images = dict(zip(todo, _decode_jpeg([data[k] for k in todo], out.device))) if todo else {}
    except (RuntimeError, ValueError):
        for k in todo:  # one odd file fails the whole batched call: find it, keep the others on the device
            try:
                images[k] = _decode_jpeg([data[k]], out.device)[0]
            except (RuntimeError, ValueError) as e:
                _REFUSED.add(names[k])
                LOGGER.warning(f"yolofeed: {names[k]}: the {out.device.type} JPEG decoder refused it ({e}); "
                               "decoding it with OpenCV on the CPU from now on (slower, same pixels as a raw pack)")
                on_host.append(k)
    for k in on_host:
        h, w = hw[k]
        out[k, :h, :w] = torch.from_numpy(decode_cv2(np.asarray(encoded[k]), h, w, names[k])).to(out.device)
    place(images, hw, out)


def place(images: dict[int, Tensor], hw: Sequence[tuple[int, int]], out: Tensor) -> None:
    """Write decoded image k, resized to ``hw[k]``, into ``out[k]``'s top-left corner: one resize per group of
    images that share a (decoded size, target size) pair, then one copy per image.

    The copy per image is a plain strided copy (CHW to HWC). An indexed write per group would be one launch,
    but under Ultralytics' ``deterministic=True`` CUDA's indexed write sorts its index and copies the whole
    target view out and back, beside the training step.

    On CUDA, one Triton kernel does all of it (``place_triton``).

    Shape:
        images: k -> (3, h0, w0) uint8 on ``out.device``. out: (>=B, H, W, 3) uint8.
    """
    if out.is_cuda and out.stride()[2:] == (3, 1) and (kernels := triton_kernels()) is not None:
        kernels.place(images, hw, out)
        return
    groups: dict[tuple[tuple[int, int], tuple[int, int]], list[int]] = {}
    for k, im in images.items():
        groups.setdefault((tuple(im.shape[1:]), hw[k]), []).append(k)
    for (src, (h, w)), ks in groups.items():
        if src == (h, w):
            resized = [images[k] for k in ks]
        else:
            x = torch.stack([images[k] for k in ks]) if len(ks) > 1 else images[ks[0]][None]
            x = F.interpolate(x.float(), size=(h, w), mode="bilinear", align_corners=False, antialias=False)
            resized = x.round_().clamp_(0, 255).to(torch.uint8)
        for k, im in zip(ks, resized):
            out[k, :h, :w].copy_(im.permute(1, 2, 0))  # CHW -> HWC in the copy: no extra pass


def triton_kernels():
    """The Triton module, or None where Triton is not installed (torch without CUDA wheels, macOS...)."""
    try:
        from yolofeed.kernels import place_triton
    except ImportError:
        return None
    return place_triton


class Jpeg(Codec):
    name = "jpeg"
    summary = BUILTIN[name]

    def encode(self, im_file: str, info: ImageInfo, imgsz: int, notes: list[str]) -> tuple[Any, tuple, tuple]:
        import cv2

        keep_as_is = (info.format == "JPEG" and info.restored is None and info.orientation == 1
                      and info.mode in ("RGB", "L"))
        if keep_as_is:
            payload = np.fromfile(im_file, np.uint8)
            # A 1/8-scale decode (DCT scaling, ~10x cheaper than a full one) proves the entropy-coded
            # data is readable, which Pillow's verify() does not look at.
            if cv2.imdecode(payload, cv2.IMREAD_REDUCED_COLOR_8) is None:
                raise SampleError("OpenCV cannot decode the JPEG data; re-export it or remove it")
            h0, w0 = info.hw
        else:
            im = decode_bgr(im_file, info)
            h0, w0 = im.shape[:2]
            if max(h0, w0) > JPEG_MAX_SIDE:
                raise SampleError(f"{w0}x{h0} px: a jpeg pack re-encodes this {info.format or 'image'} as JPEG, "
                                  f"whose sides end at {JPEG_MAX_SIDE:,} px; {RAW_INSTEAD}")
            ok, buf = cv2.imencode(".jpg", im, [cv2.IMWRITE_JPEG_QUALITY, REENCODE_QUALITY])
            if not ok:
                raise SampleError(f"OpenCV could not re-encode the {w0}x{h0} px {info.format or 'image'} as JPEG, "
                                  f"which a jpeg pack stores; {RAW_INSTEAD}")
            payload = buf.reshape(-1)
            notes.append(f"{info.format or 'image'} (orientation {info.orientation}, {info.mode}) "
                         f"re-encoded as JPEG q{REENCODE_QUALITY} for GPU decoding")
        return payload, (h0, w0), resized_hw(h0, w0, imgsz)

    def payload_estimate(self, im_file: str, imgsz: int) -> int:
        return align(os.path.getsize(im_file))

    def index_problem(self, index: np.ndarray, imgsz: int) -> str:
        # the device decode writes each image into a batch slot of imgsz x imgsz without checking its size
        return self.sizes_problem(index, imgsz, "h0", "w0")

    def image(self, pack: PackView, i: int) -> np.ndarray:
        raise PackError(f"{pack.path} stores JPEG bytes; use encoded(i), or build a raw pack with format=raw")

    def gather(self, pack: PackView, indices: np.ndarray, out: Any) -> np.ndarray:
        """CPU decode on ``HOST_THREADS`` threads, resized as Ultralytics' load_image.

        The same pixels as a raw pack for files kept byte for byte; re-encoded files (non-JPEG sources,
        EXIF-rotated or restored ones) carry their quality-95 re-encoding.
        """
        buf = out.numpy() if hasattr(out, "numpy") else out
        indices = np.asarray(indices, dtype=np.int64)
        shapes = pack.shapes[indices]
        files = pack.im_files

        def one(k: int) -> None:
            i = int(indices[k])
            h, w = (int(v) for v in shapes[k])
            buf[k, :h, :w] = decode_cv2(pack.encoded(i), h, w, files[i])

        with ThreadPoolExecutor(HOST_THREADS) as ex:
            list(ex.map(one, range(len(indices))))
        return shapes

    def decodes_on_device(self, device: torch.device, decode: str) -> bool:
        return decode == "torchvision" or (decode == "auto" and device.type == "cuda")

    def staging_bytes(self, pack: PackView, batch: int) -> int:
        """The ``batch`` largest files together: no batch of that many distinct images needs more (``decode``
        leaves a batch that repeats files past it unstaged). 0, no staging (a pageable copy per file), where that
        passes ``STAGING_MAX``, which packs of multi-megabyte photos can."""
        need = int(np.sort(pack.index["nbytes"])[-batch:].sum()) if batch > 0 and len(pack) else 0
        return need if need <= STAGING_MAX else 0

    def decode(self, pack: PackView, indices: np.ndarray, out: Tensor, staging: Tensor | None = None) -> None:
        idx = np.asarray(indices, np.int64)
        files = pack.im_files
        sizes = pack.index["nbytes"][idx].astype(np.int64)
        # A batch that repeats large files (a padded last batch) can outgrow the buffer: it goes unstaged.
        if staging is None or sizes.sum() > staging.numel():
            encoded: Sequence[Any] = [pack.encoded(i) for i in idx.tolist()]
        else:  # one copy per file into the pinned buffer, then views of it made in one call: nvJPEG copies
            # the files to the GPU from pinned memory without blocking (read from 128 pageable tensors, the decode
            # alone slowed the training beside it by ~10 %: BENCHMARKS.md), and no array is allocated per file.
            if out.device.type == "cuda":  # the last batch's copies from this buffer are done before it is refilled
                torch.cuda.current_stream(out.device).synchronize()
            gather_encoded(pack, idx, staging)
            encoded = torch.split(staging[:int(sizes.sum())], sizes.tolist())
        decode_into(encoded, pack.shapes[idx], out, names=[files[i] for i in idx.tolist()])


def gather_encoded(pack: PackView, indices: Any, out: Any) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate the stored bytes of ``indices`` into the 1-D uint8 buffer ``out``.

    Returns:
        (starts, sizes): (B,) int64 byte ranges of each image within ``out``.
    """
    buf = out.numpy() if hasattr(out, "numpy") else out
    rec = pack.index[np.asarray(indices, dtype=np.int64)]
    sizes = rec["nbytes"].astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    if sizes.sum() > len(buf):
        raise ValueError(f"out holds {len(buf)} bytes, these images need {int(sizes.sum())}")
    mm = pack.buffer
    for s, off, n in zip(starts.tolist(), rec["offset"].tolist(), sizes.tolist()):
        buf[s:s + n] = mm[off:off + n]  # one memcpy per file; numpy releases the GIL for it
    return starts, sizes


CODEC = Jpeg()

__all__ = ["CODEC", "Jpeg", "decode_cv2", "decode_into", "gather_encoded", "place"]
