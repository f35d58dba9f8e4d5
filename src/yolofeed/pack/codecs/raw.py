"""The raw format: decoded RGB pixels, exactly as Ultralytics' ``load_image`` returns them (after BGR->RGB).

Build: OpenCV decode (the decoder Ultralytics uses), long side resized to imgsz with ``cv2.INTER_LINEAR``,
stored as (h, w, 3) uint8 RGB. Host: one memcpy per image from the memory map into the pinned buffer
(``Pack.gather``), which the loader copies to the device; nothing is decoded there. The fastest format
to read, and the largest: about imgsz x imgsz x 3 bytes an image.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from yolofeed.pack.codecs import BUILTIN, Codec
from yolofeed.pack.store import Pack, align
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

    def image(self, pack: Pack, i: int) -> np.ndarray:
        r = pack.index[i]
        return pack.encoded(i).reshape(int(r["h"]), int(r["w"]), 3)

    def gather(self, pack: Pack, indices: np.ndarray, out: Any) -> np.ndarray:
        return pack.gather(indices, out)


CODEC = Raw()
