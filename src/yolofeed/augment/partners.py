"""Which source images each augmented row takes its pixels from: the batch itself, or a ``PartnerPool``'s ring.

The mosaic draws its tiles from a sample's window of source images, and each mixing op (MixUp, CutMix) one
more image per sample, which the warp augments as a row of its own (``mix_partner``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Partners:
    """Which rows of the source images each sample of a batch may take partners from.

    A sample draws a row uniformly from the ``window`` rows that end at ``newest`` and count back (modulo
    ``ring``): for a pool, the images loaded up to and including its own; for ``within_batch``, the batch.

    Shape: own (B,) int64, each sample's own row; newest (B,) int64; window (B,) int64, each >= 1.
    """

    own: Tensor
    newest: Tensor
    window: Tensor
    ring: int

    @classmethod
    def within_batch(cls, batch_size: int, device: torch.device | str = "cpu") -> Partners:
        """Partners from the batch itself (rows 0..B-1, uniformly): the pool switched off."""
        own = torch.arange(batch_size, device=device)
        full = torch.full_like(own, batch_size)
        return cls(own, full - 1, full, max(batch_size, 1))

    def draw(self, k: int, generator: torch.Generator | None) -> Tensor:
        """(B, k) int64 rows, each uniform over its sample's window, with replacement (``random.choices``)."""
        u = torch.rand((len(self.own), k), generator=generator, device=self.own.device, dtype=torch.float64)
        back = (u * self.window[:, None]).long().minimum(self.window[:, None] - 1)  # 0 .. window-1
        return (self.newest[:, None] - back) % self.ring

    def mix_partner(self, generator: torch.Generator | None) -> Partners:
        """One more image per sample, drawn from its window, with that window for its own mosaic partners.

        Ultralytics' MixUp and CutMix blend in a fresh Mosaic + RandomPerspective of one more image: this
        is that image (Ultralytics picks it from the whole dataset; a window of the epoch's shuffle is a
        uniform sample of it too).
        """
        return Partners(self.draw(1, generator)[:, 0], self.newest, self.window, self.ring)

    @staticmethod
    def cat(parts: list[Partners]) -> Partners:
        """One ``Partners`` for the rows of several, in order (all over the same ring)."""
        return Partners(*(torch.cat([getattr(p, f) for p in parts]) for f in ("own", "newest", "window")),
                        parts[0].ring)
