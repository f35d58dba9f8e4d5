"""Validation batches: Ultralytics' ``LetterBox(new_shape, scaleup=False)`` on stored images.

Packs store images with their long side already at imgsz, so validation never scales them
(``scaleup=False`` and a target at least as large): LetterBox reduces to centring the image on a
114-filled canvas, which is one batched copy here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from yolofeed.kernels.warp import BORDER


def _py_round(x: Tensor) -> Tensor:
    """Python's ``round`` (half to even), which LetterBox uses for its offsets."""
    return torch.round(x)


def letterbox_offsets(hw: Tensor, shape: Tensor) -> Tensor:
    """Top-left offsets (top, left) where LetterBox puts each image, centred (Ultralytics' rounding).

    Shape: hw (B, 2) int64 image sizes; shape (B, 2) or (2,) int64 targets. Returns (B, 2) int64.
    """
    d = (shape.expand_as(hw) - hw).double() / 2
    return _py_round(d - 0.1).long()


def letterbox(images: Tensor, hw: Tensor, shape: tuple[int, int] | Tensor,
              border: int = BORDER) -> tuple[Tensor, Tensor]:
    """Centre each image on a ``shape`` canvas filled with ``border``.

    Args:
        images: (B, Hmax, Wmax, 3) uint8 RGB, image b in its top-left ``hw[b]`` corner.
        hw: (B, 2) int64 image sizes; every image must fit in ``shape`` (no scaling: packs are stored at imgsz).
        shape: (h, w) of the output, e.g. a rect batch shape from Ultralytics' ``batch_shapes``.

    Returns:
        (B, 3, h, w) uint8 and the (B, 2) int64 (top, left) offsets, for boxes and ``ratio_pad``.

    Raises:
        ValueError: an image is larger than ``shape`` (it would need scaling, which packs never do).
    """
    h, w = (int(v) for v in shape)  # from the caller's values: reading them back off the device would sync
    sh = torch.tensor([h, w], dtype=torch.long).to(images.device)
    off = letterbox_offsets(hw, sh)
    if bool((off < 0).any()):  # a sync, but only here in validation, once per batch
        raise ValueError(f"images up to {hw.max(0).values.tolist()} do not fit letterbox shape {sh.tolist()}; "
                         "a pack's images are stored at imgsz: validate at the pack's imgsz")
    ys = torch.arange(h, device=images.device)[None, :] - off[:, :1]  # (B, h) source row per output row
    xs = torch.arange(w, device=images.device)[None, :] - off[:, 1:]
    inside = ((ys >= 0) & (ys < hw[:, :1]))[:, :, None] & ((xs >= 0) & (xs < hw[:, 1:]))[:, None, :]
    b = torch.arange(len(images), device=images.device)[:, None, None]
    pix = images[b, ys.clamp(0, images.shape[1] - 1)[:, :, None], xs.clamp(0, images.shape[2] - 1)[:, None, :]]
    out = torch.where(inside[..., None], pix, torch.full_like(pix, border))
    return out.permute(0, 3, 1, 2).contiguous(), off
