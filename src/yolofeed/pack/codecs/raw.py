"""The raw format: decoded RGB pixels, exactly as Ultralytics' ``load_image`` returns them (after BGR->RGB).

Build: OpenCV decode (the decoder Ultralytics uses), long side resized to imgsz with ``cv2.INTER_LINEAR``,
stored as (h, w, 3) uint8 RGB. Host: one memcpy per image from the memory map into the pinned buffer
(``Raw.gather``), which the loader copies to the device; nothing is decoded there. The fastest format
to read, and the largest: about imgsz x imgsz x 3 bytes an image.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from yolofeed.pack.codecs import BUILTIN, Codec, PackView
from yolofeed.pack.layout import align
from yolofeed.pack.verify import ImageInfo, decode_bgr, exif_size, pil_open, resized_hw


class Raw(Codec):
    name = "raw"
    summary = BUILTIN[name]

    def encode(self, im_file: str, info: ImageInfo, imgsz: int, notes: list[str]) -> tuple[Any, tuple, tuple]:
        import cv2

        im = decode_bgr(im_file, info)
        h0, w0 = im.shape[:2]
        h, w = resized_hw(h0, w0, imgsz)
        if (h, w) != (h0, w0):
            im = cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR)
        return cv2.cvtColor(im, cv2.COLOR_BGR2RGB), (h0, w0), (h, w)

    def payload_estimate(self, im_file: str, imgsz: int) -> int:
        with pil_open(im_file) as im:
            w, h = exif_size(im)
        return align(int(np.prod(resized_hw(h, w, imgsz))) * 3)

    def max_payload(self, imgsz: int) -> int:
        return imgsz * imgsz * 3

    def index_problem(self, index: np.ndarray, imgsz: int) -> str:
        if len(index) and (index["nbytes"] != index["h"].astype(np.uint64) * index["w"] * 3).any():
            return "an index record has a size that is not an image of this pack"
        return self.sizes_problem(index, imgsz)

    def image(self, pack: PackView, i: int) -> np.ndarray:
        r = pack.index[i]
        return pack.encoded(i).reshape(int(r["h"]), int(r["w"]), 3)

    def gather(self, pack: PackView, indices: np.ndarray, out: Any) -> np.ndarray:
        """Copy the payloads of ``indices``, read as (h, w, 3) pixels, into the top-left corner of ``out[k]``.

        One memcpy per image.

        Args:
            indices: B sample indices.
            out: a (>=B, imgsz, imgsz, 3) uint8 numpy array or CPU torch tensor (pinned, say);
                the area right of and below each image is left as it was.

        Returns:
            (B, 2) int64 (h, w) of each copied image.
        """
        buf = out.numpy() if hasattr(out, "numpy") else out  # a torch tensor shares its memory
        idx = np.asarray(indices, dtype=np.int64)
        rec = pack.index[idx]
        if len(idx) > len(buf) or (len(idx) and (rec["h"].max() > buf.shape[1] or rec["w"].max() > buf.shape[2])):
            raise ValueError(f"out {tuple(buf.shape)} cannot hold {len(idx)} images of up to "
                             f"{pack.imgsz}x{pack.imgsz}")
        for k, r in enumerate(rec):  # one memcpy per image; numpy releases the GIL for these copies
            h, w, off = int(r["h"]), int(r["w"]), int(r["offset"])
            buf[k, :h, :w] = pack.buffer[off:off + h * w * 3].reshape(h, w, 3)
        return np.stack([rec["h"], rec["w"]], 1).astype(np.int64)


CODEC = Raw()
