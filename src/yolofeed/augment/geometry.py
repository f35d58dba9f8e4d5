"""Where pixels and boxes go: mosaic placement, the random perspective matrix, box transforms, flips.

Each op samples its per-sample parameters apart from applying them (``sample_*`` -> a params
dataclass of (B, ...) tensors), so a test can hand the same parameters to Ultralytics' CPU op.
Geometry is matrices: the mosaic places tiles by integer offsets on a canvas, then one (B, 3, 3)
matrix ``M`` (T @ S @ R @ P @ C, Ultralytics' order) maps canvas pixels to output pixels; the
image is sampled once through it (``warp.py``) and boxes go through the same matrix here.

Everything is batched torch on any device; loops run over the 4 or 9 mosaic tiles, never over samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.op import coin, matmul3, uniform
from yolofeed.augment.partners import Partners

BOX_WH_MIN = 2.0  # Ultralytics box_candidates: width and height must exceed 2 px
BOX_AR_MAX = 100.0  # ... aspect ratio below 100
BOX_AREA_RATIO = 0.10  # ... and keep more than 10 % of the (scaled) original area


# -- mosaic --------------------------------------------------------------------------------------
@dataclass
class MosaicParams:
    """Per-sample mosaic draws.

    Shape:
        apply: (B,) bool. center: (B, 2) int64 canvas (xc, yc), 4-grid only.
        sources: (B, T) int64 rows of the source images (the batch, or a ``PartnerPool``'s ring) of the tiles;
            column 0 is the sample's own image.
    """

    apply: Tensor
    center: Tensor
    sources: Tensor
    grid: int


def sample_mosaic(partners: Partners, hyp: AugmentHyp, generator: torch.Generator | None) -> MosaicParams:
    """Draw mosaic decisions, centres and partner images, one sample per row of ``partners``.

    Each sample's own image is tile 0; the other tiles are drawn uniformly, with replacement, from its
    window (``Partners``): Ultralytics' ``random.choices(dataset.buffer, k=n - 1)``.
    """
    s, t, dev = hyp.imgsz, hyp.mosaic_grid, partners.own.device
    batch_size = len(partners.own)
    apply = coin(generator, batch_size, hyp.mosaic, dev)
    border = -s // 2  # Ultralytics' self.border (floor division of the negative)
    c = uniform(generator, (batch_size, 2), -border, 2 * s + border, dev).floor().long()  # int(uniform(...))
    sources = torch.cat([partners.own[:, None], partners.draw(t - 1, generator)], 1)
    return MosaicParams(apply, c, sources, t)


@dataclass
class Layout:
    """Where each tile's pixels land on a sample's canvas.

    A canvas pixel (cx, cy) inside ``rect[b, k]`` shows source pixel (cx - pad_x, cy - pad_y) of
    image ``src[b, k]``; later tiles win where rectangles overlap (the 9-grid, as Ultralytics
    pastes in order); anything else is the fill value 114.

    Shape:
        src: (B, T) int64. rect: (B, T, 4) int64 x1, y1, x2, y2 (empty when x2 <= x1). pad: (B, T, 2) int64.
        canvas_hw: (B, 2) int64. mosaic: (B,) bool.
    """

    src: Tensor
    rect: Tensor
    pad: Tensor
    canvas_hw: Tensor
    mosaic: Tensor


def mosaic_layout(p: MosaicParams, hw: Tensor, imgsz: int) -> Layout:
    """Ultralytics' ``Mosaic.get_params`` for every sample at once (single images where ``apply`` is False).

    Args:
        hw: (N, 2) int64 stored (h, w) of the batch's images.
    """
    s = imgsz
    src = p.sources
    h, w = hw[src, 0], hw[src, 1]  # (B, T)
    zero = torch.zeros_like(h)
    if p.grid == 4:
        xc, yc = p.center[:, :1], p.center[:, 1:]
        two_s = torch.full_like(h, 2 * s)
        x1a = torch.stack([(xc - w[:, 0:1]).clamp(min=0)[:, 0], xc[:, 0], (xc - w[:, 2:3]).clamp(min=0)[:, 0],
                           xc[:, 0]], 1)
        y1a = torch.stack([(yc - h[:, 0:1]).clamp(min=0)[:, 0], (yc - h[:, 1:2]).clamp(min=0)[:, 0], yc[:, 0],
                           yc[:, 0]], 1)
        x2a = torch.stack([xc[:, 0], torch.minimum(xc + w[:, 1:2], two_s[:, :1])[:, 0], xc[:, 0],
                           torch.minimum(xc + w[:, 3:4], two_s[:, :1])[:, 0]], 1)
        y2a = torch.stack([yc[:, 0], yc[:, 0], torch.minimum(yc + h[:, 2:3], two_s[:, :1])[:, 0],
                           torch.minimum(yc + h[:, 3:4], two_s[:, :1])[:, 0]], 1)
        # source top-left: right/bottom-aligned for tiles left of / above the centre
        k = torch.arange(4, device=h.device)  # built on the device: no host-to-device copy in the hot path
        x1b = torch.where(k % 2 == 0, w - (x2a - x1a), zero)  # tiles 0, 2 (left of the centre) right-aligned
        y1b = torch.where(k < 2, h - (y2a - y1a), zero)  # tiles 0, 1 (above the centre) bottom-aligned
        rect = torch.stack([x1a, y1a, x2a, y2a], -1)
        pad = torch.stack([x1a - x1b, y1a - y1b], -1)
        canvas = torch.full((len(src), 2), 2 * s, dtype=torch.long, device=h.device)
    else:  # 3x3: Ultralytics places tiles on a 3s canvas, then crops ceil(s/2) off each side
        off = -(-s // 2)
        h0, w0 = h[:, 0], w[:, 0]
        corners = []
        hp, wp = h[:, 0], w[:, 0]
        for k in range(9):
            hk, wk = h[:, k], w[:, k]
            c = {0: (s, s, s + wk, s + hk), 1: (s, s - hk, s + wk, s), 2: (s + wp, s - hk, s + wp + wk, s),
                 3: (s + w0, s, s + w0 + wk, s + hk), 4: (s + w0, s + hp, s + w0 + wk, s + hp + hk),
                 5: (s + w0 - wk, s + h0, s + w0, s + h0 + hk), 6: (s + w0 - wp - wk, s + h0, s + w0 - wp, s + h0 + hk),
                 7: (s - wk, s + h0 - hk, s, s + h0), 8: (s - wk, s + h0 - hp - hk, s, s + h0 - hp)}[k]
            corners.append(torch.stack([v if isinstance(v, Tensor) else torch.full_like(hk, v) for v in c], -1))
            hp, wp = hk, wk
        c = torch.stack(corners, 1)  # (B, 9, 4) in 3s-canvas coordinates, before clipping at 0
        rect = c.clamp(min=0) - off
        pad = c[..., :2] - off
        canvas = torch.full((len(src), 2), 3 * s - 2 * off, dtype=torch.long, device=h.device)
    # samples without mosaic: their own image, alone, on a canvas of its size
    single_rect = torch.zeros_like(rect)
    single_rect[:, 0, 2], single_rect[:, 0, 3] = w[:, 0], h[:, 0]
    m = p.apply[:, None, None]
    return Layout(src=src, rect=torch.where(m, rect, single_rect), pad=torch.where(m, pad, torch.zeros_like(pad)),
                  canvas_hw=torch.where(p.apply[:, None], canvas, hw[src[:, 0]]), mosaic=p.apply)


def xywhn_to_xyxy(boxes: Tensor, hw: Tensor) -> Tensor:
    """Normalised xywh -> pixel xyxy, in Ultralytics' order (convert, then denormalise), float32.

    Shape:
        boxes: (..., 4). hw: (..., 2) broadcastable (h, w).
    """
    xy, half = boxes[..., :2], boxes[..., 2:] / 2
    xyxy = torch.cat([xy - half, xy + half], -1)
    wh = torch.stack([hw[..., 1], hw[..., 0]], -1).to(boxes.dtype)
    return xyxy * torch.cat([wh, wh], -1)


def mosaic_boxes(layout: Layout, boxes: Tensor, valid: Tensor, hw: Tensor) -> tuple[Tensor, Tensor]:
    """Every tile's boxes on the canvas, clipped to it, zero-area ones dropped (mosaic samples only).

    Args:
        boxes: (N, L, 4) normalised xywh of the batch's images; valid: (N, L) bool.
        hw: (N, 2) stored (h, w).

    Returns:
        (B, T*L, 4) float32 pixel xyxy on the canvas, and (B, T*L) bool.
    """
    b, t = layout.src.shape
    src_boxes = boxes[layout.src]  # (B, T, L, 4)
    xyxy = xywhn_to_xyxy(src_boxes, hw[layout.src][:, :, None, :])
    xyxy = xyxy + layout.pad.repeat(1, 1, 2)[:, :, None, :].to(xyxy.dtype)
    ok = valid[layout.src].clone()
    ok[:, 1:] &= layout.mosaic[:, None, None]  # single images keep only their own labels
    xyxy, ok = xyxy.reshape(b, -1, 4), ok.reshape(b, -1)
    ch, cw = layout.canvas_hw[:, 0, None].to(xyxy.dtype), layout.canvas_hw[:, 1, None].to(xyxy.dtype)
    clipped = torch.stack([xyxy[..., 0].clamp(min=0).minimum(cw), xyxy[..., 1].clamp(min=0).minimum(ch),
                           xyxy[..., 2].clamp(min=0).minimum(cw), xyxy[..., 3].clamp(min=0).minimum(ch)], -1)
    area_ok = (clipped[..., 2] - clipped[..., 0]) * (clipped[..., 3] - clipped[..., 1]) > 0
    m = layout.mosaic[:, None]
    return torch.where(m[..., None], clipped, xyxy), ok & torch.where(m, area_ok, torch.ones_like(area_ok))


# -- random perspective --------------------------------------------------------------------------
@dataclass
class PerspectiveParams:
    """Per-sample draws of ``RandomPerspective`` (Ultralytics' names), float64 like Python's ``random``.

    Shape: every field (B,). ``translate`` fields are fractions of the output size.
    """

    persp_x: Tensor
    persp_y: Tensor
    angle: Tensor
    scale: Tensor
    shear_x: Tensor
    shear_y: Tensor
    translate_x: Tensor
    translate_y: Tensor


def sample_perspective(batch_size: int, hyp: AugmentHyp, generator: torch.Generator | None,
                       device: torch.device) -> PerspectiveParams:
    """Draw rotation, scale, shear, translation and perspective as ``RandomPerspective`` does."""
    n = (batch_size,)
    p, d, sh, t = hyp.perspective, hyp.degrees, hyp.shear, hyp.translate
    lo, hi = (hyp.scale if isinstance(hyp.scale, (tuple, list)) else (1 - hyp.scale, 1 + hyp.scale))
    return PerspectiveParams(
        persp_x=uniform(generator, n, -p, p, device), persp_y=uniform(generator, n, -p, p, device),
        angle=uniform(generator, n, -d, d, device), scale=uniform(generator, n, lo, hi, device),
        shear_x=uniform(generator, n, -sh, sh, device), shear_y=uniform(generator, n, -sh, sh, device),
        translate_x=uniform(generator, n, 0.5 - t, 0.5 + t, device),
        translate_y=uniform(generator, n, 0.5 - t, 0.5 + t, device))


def perspective_matrix(p: PerspectiveParams, canvas_hw: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Ultralytics' ``_compute_affine_matrix``: ``M = T @ S @ R @ P @ C`` in float32.

    Returns:
        M: (B, 3, 3) float32, canvas pixel -> output pixel. scale: (B,) float32.
    """
    b, dev = canvas_hw.shape[0], canvas_hw.device
    eye = torch.eye(3, dtype=torch.float32, device=dev).repeat(b, 1, 1)
    C, P, R, S, T = (eye.clone() for _ in range(5))
    C[:, 0, 2] = -canvas_hw[:, 1].to(torch.float32) / 2
    C[:, 1, 2] = -canvas_hw[:, 0].to(torch.float32) / 2
    P[:, 2, 0], P[:, 2, 1] = p.persp_x.float(), p.persp_y.float()
    a = p.angle * (math.pi / 180)  # cv2.getRotationMatrix2D, centre (0, 0): computed in float64
    alpha, beta = torch.cos(a) * p.scale, torch.sin(a) * p.scale
    R[:, 0, 0], R[:, 0, 1], R[:, 1, 0], R[:, 1, 1] = alpha.float(), beta.float(), (-beta).float(), alpha.float()
    S[:, 0, 1] = torch.tan(p.shear_x * (math.pi / 180)).float()
    S[:, 1, 0] = torch.tan(p.shear_y * (math.pi / 180)).float()
    T[:, 0, 2] = (p.translate_x * size).float()
    T[:, 1, 2] = (p.translate_y * size).float()
    return matmul3(T, matmul3(S, matmul3(R, matmul3(P, C)))), p.scale.float()


def transform_boxes(boxes: Tensor, M: Tensor, perspective: bool) -> Tensor:
    """Ultralytics' ``apply_bboxes``: the four corners through ``M``, then their bounding box.

    Shape:
        boxes: (B, K, 4) xyxy. M: (B, 3, 3). Returns (B, K, 4).
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    corners = torch.stack([torch.stack([x1, y1], -1), torch.stack([x2, y2], -1), torch.stack([x1, y2], -1),
                           torch.stack([x2, y1], -1)], -2)  # (B, K, 4, 2)
    xy1 = torch.cat([corners, torch.ones_like(corners[..., :1])], -1)  # (B, K, 4, 3)
    out = xy1 @ M.transpose(1, 2)[:, None]  # (B, K, 4, 3)
    xy = out[..., :2] / out[..., 2:3] if perspective else out[..., :2]
    return torch.cat([xy.amin(-2), xy.amax(-2)], -1)


def box_candidates(before: Tensor, after: Tensor, area_thr: float = BOX_AREA_RATIO, eps: float = 1e-16) -> Tensor:
    """Ultralytics' ``box_candidates``: wide and tall enough, not too thin, enough area kept.

    Shape: before, after: (..., 4) xyxy. Returns (...) bool.
    """
    w1, h1 = before[..., 2] - before[..., 0], before[..., 3] - before[..., 1]
    w2, h2 = after[..., 2] - after[..., 0], after[..., 3] - after[..., 1]
    ar = torch.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > BOX_WH_MIN) & (h2 > BOX_WH_MIN) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < BOX_AR_MAX)


def warp_boxes(boxes: Tensor, valid: Tensor, M: Tensor, scale: Tensor, size: int,
               perspective: bool) -> tuple[Tensor, Tensor]:
    """``RandomPerspective.apply_instances`` for boxes: transform, clip to the output, filter.

    Returns:
        (B, K, 4) xyxy in output pixels, and the updated (B, K) validity.
    """
    new = transform_boxes(boxes, M, perspective).clamp(0, size)
    old = boxes * scale[:, None, None]  # Ultralytics compares against the original box scaled by s
    return new, valid & box_candidates(old, new)


# -- flips ---------------------------------------------------------------------------------------
@dataclass
class FlipParams:
    """Shape: ud, lr: (B,) bool (``RandomFlip`` vertical, then horizontal)."""

    ud: Tensor
    lr: Tensor


def sample_flips(batch_size: int, hyp: AugmentHyp, generator: torch.Generator | None,
                 device: torch.device) -> FlipParams:
    return FlipParams(coin(generator, batch_size, hyp.flipud, device), coin(generator, batch_size, hyp.fliplr, device))


def flip_boxes(boxes: Tensor, p: FlipParams, size: int) -> Tensor:
    """Reflect boxes of flipped samples: x -> size - x (``Instances.fliplr``), y likewise."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    lr, ud = p.lr[:, None], p.ud[:, None]
    return torch.stack([torch.where(lr, size - x2, x1), torch.where(ud, size - y2, y1),
                        torch.where(lr, size - x1, x2), torch.where(ud, size - y1, y2)], -1)
