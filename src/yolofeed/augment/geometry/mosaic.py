"""Ultralytics' ``Mosaic`` (its 2x2, or the 3x3 ``Mosaic(n=9)``): the first step of the warp.

It places tiles by integer offsets on a canvas (``Layout``: where each tile's pixels land); the warp never builds
the canvas, it looks each output pixel's neighbours up in the tile that covers them (``kernels/warp.py``). The
boxes: every tile's stored boxes on the canvas, clipped to it (``mosaic_boxes``); their keypoints the same way, a
point off the canvas made invisible (``mosaic_keypoints``); an oriented box's segment moved the same way and, where it
leaves the canvas, clipped as Ultralytics' OBB clip does (``mosaic_segments``); a segmentation polygon moved the same
way, its points clipped to the canvas (``mosaic_polygons``). Everything is batched; loops run
over the 4 or 9 tiles, never over samples.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from yolofeed.augment.geometry.obb import box_area, clip_obb
from yolofeed.augment.geometry.polygons import to_longest
from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.op import Draw, GeometricOp, Labels, WarpPlan, clip_keypoints, coin, uniform
from yolofeed.augment.partners import Partners


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


def tile_boxes(layout: Layout, boxes: Tensor, valid: Tensor, hw: Tensor) -> tuple[Tensor, Tensor]:
    """Every tile's boxes on the canvas (``Mosaic._update_labels``), before the clip: (B, T*L, 4) pixel xyxy, and
    (B, T*L) bool (a single image keeps only its own). Args as ``mosaic_boxes``."""
    b, t = layout.src.shape
    src_boxes = boxes[layout.src]  # (B, T, L, 4)
    xyxy = xywhn_to_xyxy(src_boxes, hw[layout.src][:, :, None, :])
    xyxy = xyxy + layout.pad.repeat(1, 1, 2)[:, :, None, :].to(xyxy.dtype)
    ok = valid[layout.src].clone()
    ok[:, 1:] &= layout.mosaic[:, None, None]  # single images keep only their own labels
    return xyxy.reshape(b, -1, 4), ok.reshape(b, -1)


def mosaic_boxes(layout: Layout, boxes: Tensor, valid: Tensor, hw: Tensor) -> tuple[Tensor, Tensor]:
    """Every tile's boxes on the canvas, clipped to it, zero-area ones dropped (mosaic samples only).

    Args:
        boxes: (N, L, 4) normalised xywh of the batch's images; valid: (N, L) bool.
        hw: (N, 2) stored (h, w).

    Returns:
        (B, T*L, 4) float32 pixel xyxy on the canvas, and (B, T*L) bool.
    """
    xyxy, ok = tile_boxes(layout, boxes, valid, hw)
    ch, cw = layout.canvas_hw[:, 0, None].to(xyxy.dtype), layout.canvas_hw[:, 1, None].to(xyxy.dtype)
    clipped = torch.stack([xyxy[..., 0].clamp(min=0).minimum(cw), xyxy[..., 1].clamp(min=0).minimum(ch),
                           xyxy[..., 2].clamp(min=0).minimum(cw), xyxy[..., 3].clamp(min=0).minimum(ch)], -1)
    area_ok = (clipped[..., 2] - clipped[..., 0]) * (clipped[..., 3] - clipped[..., 1]) > 0
    m = layout.mosaic[:, None]
    return torch.where(m[..., None], clipped, xyxy), ok & torch.where(m, area_ok, torch.ones_like(area_ok))


def mosaic_keypoints(layout: Layout, keypoints: Tensor, hw: Tensor) -> Tensor:
    """Every tile's keypoints on the canvas (``Mosaic._update_labels``: denormalise, then add the tile's offset),
    clipped to it on mosaic samples (``_cat_labels``' ``Instances.clip``: visibility 0 off the canvas).

    Args:
        keypoints: (N, L, P, 3) normalised x, y and visibility of the batch's images. hw: (N, 2) stored (h, w).

    Returns:
        (B, T*L, P, 3) float32 canvas pixels, row-aligned with ``mosaic_boxes``.
    """
    b = len(layout.src)
    kp = keypoints[layout.src]  # (B, T, L, P, 3)
    size = hw[layout.src].to(kp.dtype)  # (B, T, 2) h, w
    pad = layout.pad.to(kp.dtype)  # (B, T, 2) x, y
    x = kp[..., 0] * size[:, :, None, None, 1] + pad[:, :, None, None, 0]  # float32 x * w, then + padw, as numpy
    y = kp[..., 1] * size[:, :, None, None, 0] + pad[:, :, None, None, 1]
    kp = torch.stack([x, y, kp[..., 2]], -1).reshape(b, -1, *kp.shape[-2:])
    ch, cw = (layout.canvas_hw[:, j, None, None].to(kp.dtype) for j in (0, 1))
    return torch.where(layout.mosaic[:, None, None, None], clip_keypoints(kp, cw, ch), kp)


def on_canvas(layout: Layout, points: Tensor, hw: Tensor) -> Tensor:
    """Each tile's points on its row's canvas (``_update_labels``: denormalise, then add the tile's offset, float32
    x * w then + padw, as numpy does). Shape: points (N, L, P, 2) normalised -> (R, T*L, P, 2) pixels: each tile's
    copy, the mosaic's largest label tensor."""
    b = len(layout.src)
    seg = points[layout.src]  # (R, T, L, P, 2)
    size = hw[layout.src].to(seg.dtype)  # (R, T, 2) h, w
    pad = layout.pad.to(seg.dtype)
    x = seg[..., 0] * size[:, :, None, None, 1] + pad[:, :, None, None, 0]
    y = seg[..., 1] * size[:, :, None, None, 0] + pad[:, :, None, None, 1]
    return torch.stack([x, y], -1).reshape(b, -1, *seg.shape[-2:])


def mosaic_polygons(layout: Layout, labels: Labels, moved: Labels, hw: Tensor) -> Labels:
    """The segmentation polygons of each row's tiles on its canvas (``_update_labels``), then on mosaic samples
    ``Instances.concatenate`` (where the tiles differ in points, each resampled to the most, in canvas pixels) and
    ``Instances.clip`` (each point's x and y clipped to the canvas). The boxes and ``valid`` are ``moved``'s: the
    stored boxes clipped and filtered as detection's (``mosaic_boxes``), as Ultralytics leaves them here.

    Args:
        labels: the batch's (N, L) labels, polygons (N, L, W, 2) normalised. moved: ``apply_boxes``' (R, T*L) labels.
        hw: (N, 2) stored (h, w).

    Returns:
        ``moved`` with polygons (R, T*L, W, 2) canvas pixels and polygon_points (R,) (None where every row has 1,000).
    """
    seg = on_canvas(layout, labels.polygons, hw)
    points = labels.polygon_points
    if points is not None:  # a stored polygon of more than 1,000 points: tiles of another n are resampled
        tile = points[layout.src]  # (R, T): each tile image's n; a tile without labels counts, as its (0, n, 2) does
        points = torch.where(layout.mosaic, tile.amax(1), tile[:, 0])
        slots = labels.polygons.shape[1]
        seg = to_longest(seg, tile[:, :, None].expand(-1, -1, slots).reshape(len(tile), -1), points)
    ch, cw = (layout.canvas_hw[:, j, None, None].to(seg.dtype) for j in (0, 1))
    clipped = torch.stack([seg[..., 0].clamp(min=0).minimum(cw), seg[..., 1].clamp(min=0).minimum(ch)], -1)
    seg = torch.where(layout.mosaic[:, None, None, None], clipped, seg)
    return dataclasses.replace(moved, polygons=seg, polygon_points=points)


def mosaic_segments(layout: Layout, labels: Labels, hw: Tensor) -> Labels:
    """The oriented boxes of each row's tiles on its canvas: their segments denormalised and offset by the tile
    (``_update_labels``), then on mosaic samples ``Instances.clip(canvas, preserve_obb=True)`` (``clip_obb``: a
    segment that leaves the canvas becomes the rectangle of its visible part, its box that part's bounds, a box inside
    stays unclipped) and ``remove_zero_area_boxes``.

    Args:
        labels: the batch's (N, L) labels, segments (N, L, 100, 2) normalised. hw: (N, 2) stored (h, w).

    Returns:
        (R, T*L) labels: cls, boxes, valid and segments (R, T*L, 100, 2) canvas pixels.
    """
    b = len(layout.src)
    xyxy, ok = tile_boxes(layout, labels.boxes, labels.valid, hw)
    seg = on_canvas(layout, labels.segments, hw)
    ch, cw = (layout.canvas_hw[:, j, None].to(seg.dtype) for j in (0, 1))
    boxes, seg = clip_obb(seg, xyxy, cw, ch, rows=layout.mosaic)
    keep = ok & ((box_area(boxes) > 0) | ~layout.mosaic[:, None])
    return Labels(labels.cls[layout.src].reshape(b, -1), boxes, keep, segments=seg)


class Mosaic(GeometricOp):
    """Ultralytics' ``Mosaic``: each row's canvas of its own image and ``mosaic_grid - 1`` partners, by ``mosaic``."""

    name, Params, takes_images = "mosaic", MosaicParams, True

    def on(self, hyp: AugmentHyp) -> bool:
        return hyp.mosaic > 0

    def sample(self, draw: Draw, hyp: AugmentHyp, generator: torch.Generator | None) -> MosaicParams:
        return sample_mosaic(draw.partners, hyp, generator)

    def warp_step(self, plan: WarpPlan, p: MosaicParams, hyp: AugmentHyp) -> WarpPlan:
        return dataclasses.replace(plan, tiles=mosaic_layout(p, plan.hw, hyp.imgsz))

    def apply_boxes(self, labels: Labels, plan: WarpPlan, p: MosaicParams, hyp: AugmentHyp) -> Labels:
        """The stored labels of each row's tiles, on its canvas: (N, L) source rows -> (R, T * L)."""
        layout = plan.tiles
        boxes, valid = mosaic_boxes(layout, labels.boxes, labels.valid, plan.hw)
        return Labels(labels.cls[layout.src].reshape(len(layout.src), -1), boxes, valid)

    def apply_keypoints(self, keypoints: Tensor, plan: WarpPlan, p: MosaicParams, hyp: AugmentHyp) -> Tensor:
        """The stored keypoints of each row's tiles, on its canvas: (N, L, P, 3) -> (R, T * L, P, 3)."""
        return mosaic_keypoints(plan.tiles, keypoints, plan.hw)

    def apply_corners(self, labels: Labels, moved: Labels, plan: WarpPlan, p: MosaicParams,
                      hyp: AugmentHyp) -> Labels:
        """The stored oriented boxes of each row's tiles, on its canvas, with the boxes and ``valid`` of Ultralytics'
        OBB clip in place of ``moved``'s: (N, L, 100, 2) -> (R, T * L, 100, 2)."""
        return dataclasses.replace(mosaic_segments(plan.tiles, labels, plan.hw), keypoints=moved.keypoints)

    def apply_polygons(self, labels: Labels, moved: Labels, plan: WarpPlan, p: MosaicParams,
                       hyp: AugmentHyp) -> Labels:
        """The stored polygons of each row's tiles, on its canvas, clipped to it (``mosaic_polygons``):
        (N, L, W, 2) -> (R, T * L, W, 2)."""
        return mosaic_polygons(plan.tiles, labels, moved, plan.hw)
