"""Ultralytics' own geometric transforms replayed with yolofeed's draws, for the tests that hold each task's labels
(keypoints, oriented boxes, polygons) to Ultralytics': ``Mosaic``, ``CopyPaste``, ``RandomPerspective`` and
``RandomFlip`` as ``v8_transforms`` builds them, on a reference dataset whose ``get_image_and_label`` gives the
task's labels."""

from __future__ import annotations

import random
from typing import Any
from unittest import mock

import torch
from ultralytics.data.augment import CopyPaste, Mosaic, RandomFlip, RandomPerspective

from yolofeed.augment import AugmentHyp
from yolofeed.augment import geometry as ours


def mosaic(ref: Any, hyp: AugmentHyp, params: Any, row: int, size: int) -> dict:
    """Ultralytics' Mosaic for augmented row ``row`` with our draws (its own image alone where it does not mosaic)."""
    mp = params.mosaic
    labels = ref.get_image_and_label(int(mp.sources[row, 0]))
    if bool(mp.apply[row]):
        m = Mosaic(ref, imgsz=size, p=1.0, n=hyp.mosaic_grid)
        xc, yc = mp.center[row].tolist()
        with mock.patch.object(m, "get_indexes", return_value=mp.sources[row, 1:].tolist()), \
                mock.patch.object(random, "uniform", side_effect=[float(yc), float(xc)]):  # yc is drawn first
            p = m.get_params(labels)
        labels = m.apply_instances(m.apply_image(labels, p), p)
        labels.pop("mix_labels", None)
    return labels


def geometry(ref: Any, hyp: AugmentHyp, params: Any, row: int, size: int, preserve_obb: bool = False) -> dict:
    """Ultralytics' Mosaic -> RandomPerspective for augmented row ``row`` (a sample or a mix partner), our draws;
    ``preserve_obb`` as ``v8_transforms`` sets it for an OBB dataset. With ``copy_paste``, ``CopyPaste`` in its flip
    mode between the two, where ``v8_transforms`` inserts it (it draws nothing)."""
    labels = mosaic(ref, hyp, params, row, size)
    if hyp.copy_paste:
        labels = CopyPaste(p=hyp.copy_paste, mode="flip")(labels)
    canvas = torch.tensor([labels["img"].shape[:2]])
    one = ours.PerspectiveParams(*(getattr(params.perspective, f)[row:row + 1] for f in
                                   ours.PerspectiveParams.__dataclass_fields__))
    M, scale = ours.perspective_matrix(one, canvas, size)
    rp = RandomPerspective(degrees=hyp.degrees, translate=hyp.translate, scale=hyp.scale, shear=hyp.shear,
                           perspective=hyp.perspective, size=(size, size), preserve_obb=preserve_obb)
    rparams = {"M": M[0].numpy(), "scale": float(scale[0]), "orig_shape": labels["img"].shape[:2],
               "size": (size, size)}
    return rp.apply_instances(rp.apply_image(labels, rparams), rparams)


def flips(labels: dict, ud: bool, lr: bool, size: int, flip_idx: Any = ()) -> dict:
    """``RandomFlip`` vertical, then horizontal, as ``v8_transforms`` builds them (``flip_idx`` for pose, else [])."""
    for direction, on in (("vertical", ud), ("horizontal", lr)):
        f = RandomFlip(p=1.0, direction=direction, flip_idx=list(flip_idx))
        p = {"flip": on, "h": size, "w": size, "direction": direction, "flip_idx": f.flip_idx}
        labels = f.apply_instances(f.apply_image(labels, p), p)
    return labels
