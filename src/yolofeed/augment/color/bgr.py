"""Ultralytics' ``Format(bgr=...)``: each image's channels in BGR order instead of RGB, with probability ``bgr``.

The swap is the last term of the compose pass; boxes stay where they are.
"""

from __future__ import annotations

import torch
from torch import Tensor

from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.op import Draw, Labels, PixelOp, coin


class ToBGR(PixelOp):
    """The channel swap of Ultralytics' ``Format``; its draw is one (B,) bool tensor: swap this image."""

    name, Params, term = "bgr", Tensor, "bgr"

    def on(self, hyp: AugmentHyp) -> bool:
        return hyp.bgr > 0

    def sample(self, draw: Draw, hyp: AugmentHyp, generator: torch.Generator | None) -> Tensor:
        return coin(generator, draw.rows, hyp.bgr, draw.device)

    def compose_term(self, p: Tensor, labels: Labels, rows: Labels, hyp: AugmentHyp) -> Tensor | None:
        return p if self.on(hyp) else None
