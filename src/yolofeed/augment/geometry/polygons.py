"""Segmentation polygons as Ultralytics resamples them before any op: each to the same number of points.

``YOLODataset.update_labels_info`` resamples every polygon of an image to ``n`` points (``resample_segments``):
1,000, or one more than the image's longest polygon where that is longer. A polygon of L points is closed (its first
point again, m = L + 1 points); where m < n, ``np.linspace(0, L, n - m)`` positions along it with the m vertex
positions 0 .. L inserted before equal values (so every vertex is kept); else ``np.linspace(0, L, n)``. Each position
x is then ``np.interp``'d between vertices floor(x) and floor(x) + 1: ``(b - a) * (x - j) + a`` in float64, two
roundings (numpy fuses nothing), the last position exactly the closing point; float32 at the end. A polygon of n points
is left as it is.

Here every polygon of a batch at once, padded: the positions of each row are its linspace values and vertex positions
sorted together (a stable sort, the vertices first among equals), as the insertion orders them. No loop over
polygons and no host sync; the per-row lengths stay on the device.
"""

from __future__ import annotations

import torch
from torch import Tensor

POINTS = 1000  # Ultralytics' segment_resamples for segmentation (update_labels_info)


def resample_polygons(points: Tensor, lengths: Tensor, n: int = POINTS) -> Tensor:
    """Ultralytics' ``resample_segments(segments, n)`` of padded polygons, bit for bit.

    Args:
        points: (R, P, 2) float32 x, y, row r's first ``lengths[r]`` points its polygon, the rest padding (ignored).
        lengths: (R,) int64 points of each polygon, 1 to P (Ultralytics' labels have 3 or more).
        n: the points each polygon is resampled to (``POINTS``, or more where the image's longest polygon is longer).

    Returns:
        (R, n, 2) float32. A row of exactly n points is returned as it is.
    """
    r, p, _ = points.shape
    dev = points.device
    if r == 0:
        return points.new_zeros((0, n, 2))
    length = lengths.to(dev, torch.int64)
    m = length + 1  # the closed polygon's points
    closed = torch.cat([points, points.new_zeros((r, 1, 2))], 1).double()
    closed.scatter_(1, length[:, None, None].expand(r, 1, 2), points[:, :1].double())  # the first point again, at L
    inserts = m < n  # rows whose vertex positions are inserted among fewer linspace positions
    count = torch.where(inserts, n - m, torch.full_like(m, n))  # linspace's num
    k = torch.arange(n, dtype=torch.float64, device=dev)[None]  # (1, n)
    last = (count - 1).double()[:, None]
    span = length.double()[:, None]
    # np.linspace(0, L, num): k * (L / (num - 1)), the end set to L exactly (num = 1: just 0, a polygon of n - 2
    # points); positions past num are padding
    lin = torch.where((k == last) & (last > 0), span, k * (span / last.clamp(min=1)))
    lin = torch.where(k < count[:, None], lin, torch.full_like(lin, torch.inf))
    j = torch.arange(p + 1, dtype=torch.float64, device=dev)[None].expand(r, -1)  # vertex positions 0 .. P
    vertex = torch.where((j <= span) & inserts[:, None], j, torch.full_like(j, torch.inf))
    x = torch.cat([vertex, lin], 1).sort(dim=1, stable=True).values[:, :n]  # vertices first among equal values
    lo = x.floor().clamp(max=(span - 1).clamp(min=0)).long()  # the vertex at or before x; the last edge for x = L
    a = closed.gather(1, lo[..., None].expand(-1, -1, 2))
    b = closed.gather(1, (lo + 1).clamp(max=p)[..., None].expand(-1, -1, 2))
    t = (x - lo.double())[..., None]
    out = (b - a) * t + a  # two kernels, as numpy rounds: no fused multiply-add
    end = closed.gather(1, length[:, None, None].expand(r, 1, 2))  # np.interp gives fp[-1] itself at x = xp[-1]
    out = torch.where((x == span)[..., None], end, out).float()
    if p >= n:  # a polygon of exactly n points is kept as it is
        out = torch.where((length == n)[:, None, None], points[:, :n], out)
    return out
