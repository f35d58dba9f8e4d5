"""Ours vs Ultralytics' pipeline over >= 2,500 augmented samples of the synthetic dataset.

The ops match Ultralytics exactly given the same draws (test_augment_ops.py); what can still differ
is how draws are made, chiefly mosaic and mix partners taken from the batch instead of a buffer of
recent images. These statistics must agree:

* boxes per image: means within 5 % (sampling error of the mean at n = 2,560 is ~1.4 %);
* box width, height and area: two-sample Kolmogorov-Smirnov distance < 0.03 (~50 k boxes a side, where
  chance alone stays under 0.01; a real geometric bug, e.g. a wrong scale range or a missed clip, moves
  it past 0.1);
* per-channel pixel mean within four standard errors of the difference (each side's from its 20 batch means:
  images in one batch share mosaic partners, so batches, not images, are the independent draws; two seeds of
  Ultralytics alone differ by about 1.5 levels) and std within 3 %;
* fraction of pure-grey pixels (the 114 mosaic/border fill, which HSV keeps grey) within 1 point.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from helpers import source_batch
from yolofeed import synth
from yolofeed.augment import AugmentHyp, GpuAugment
from yolofeed.config import SynthConfig
from yolofeed.pack import open_or_build

S, N_SAMPLES, BATCH = 160, 2560, 128  # the CPU reference augments ~80 samples/s: the test's cost


def ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov distance."""
    a, b = np.sort(a), np.sort(b)
    x = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, x, "right") / len(a) - np.searchsorted(b, x, "right") / len(b)).max())


class Stats:
    """Accumulates what the test compares, one augmented image at a time or a batch at a time."""

    def __init__(self):
        self.counts, self.wh, self.px_sum, self.px_sq, self.px_n, self.grey = [], [], 0.0, 0.0, 0, 0
        self.batch_means: list[np.ndarray] = []  # (3,) per batch added: the independent draws of the mean

    def add(self, img: torch.Tensor, boxes_per_image: list[int], wh: np.ndarray) -> None:
        """img (B, 3, S, S) uint8; wh (N, 2) normalised box sizes."""
        x = img.double()
        self.batch_means.append(x.mean((0, 2, 3)).numpy())
        self.px_sum = self.px_sum + x.sum((0, 2, 3))
        self.px_sq = self.px_sq + (x ** 2).sum((0, 2, 3))
        self.px_n += img.shape[0] * img.shape[2] * img.shape[3]
        self.grey += int(((img[:, 0] == img[:, 1]) & (img[:, 1] == img[:, 2])).sum())
        self.counts += boxes_per_image
        self.wh.append(wh)

    def summary(self) -> dict:
        mean = self.px_sum / self.px_n
        wh = np.concatenate(self.wh)
        means = np.stack(self.batch_means)
        return {"n": len(self.counts), "boxes": float(np.mean(self.counts)), "mean": mean.numpy(),
                "mean_se": means.std(0, ddof=1) / np.sqrt(len(means)),
                "std": (self.px_sq / self.px_n - mean ** 2).sqrt().numpy(), "grey": self.grey / self.px_n,
                "w": wh[:, 0], "h": wh[:, 1], "area": wh[:, 0] * wh[:, 1]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    return synth.run(SynthConfig(out=str(root), n_train=300, n_val=4, imgsz=S, seed=11, workers=2))


def ultralytics_stats(yaml_file) -> dict:
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    d = check_det_dataset(str(yaml_file), autodownload=False)
    ds = YOLODataset(img_path=d["train"], imgsz=S, augment=True, hyp=get_cfg(overrides={"imgsz": S}), data=d,
                     batch_size=16, rect=False)
    random.seed(0), np.random.seed(0)
    st, order = Stats(), []
    while len(order) < N_SAMPLES:
        order += np.random.permutation(len(ds)).tolist()
    for k in range(0, N_SAMPLES, BATCH):  # added a batch at a time, as ours: the same sums, far fewer small ops
        samples = [ds[i] for i in order[k:k + BATCH]]
        st.add(torch.stack([s["img"] for s in samples]), [len(s["bboxes"]) for s in samples],
               np.concatenate([s["bboxes"][:, 2:].numpy() for s in samples]))
    return st.summary()


def yolofeed_stats(yaml_file) -> dict:
    pack = open_or_build(yaml_file, "train", S, rebuild="auto", progress=False, workers=2)
    aug = GpuAugment(AugmentHyp.from_args({"imgsz": S}))
    g = torch.Generator().manual_seed(0)
    st, order = Stats(), []
    while len(order) < N_SAMPLES:
        order += torch.randperm(len(pack), generator=g).tolist()
    for k in range(0, N_SAMPLES, BATCH):
        out = aug(source_batch(pack, order[k:k + BATCH]), g).to_ultralytics()
        per = torch.bincount(out["batch_idx"].long(), minlength=BATCH).tolist()
        st.add(out["img"], per, out["bboxes"][:, 2:].numpy())
    return st.summary()


@pytest.fixture(scope="module")
def both(data) -> tuple[dict, dict]:
    """Ultralytics' statistics and ours, computed once for the tests below (each checks one of them)."""
    theirs, ours = ultralytics_stats(data), yolofeed_stats(data)
    assert ours["n"] >= 2500 and theirs["n"] >= 2500
    return theirs, ours


def _report(theirs: dict, ours: dict) -> str:
    return (f"boxes/img {ours['boxes']:.2f} vs {theirs['boxes']:.2f}; mean {ours['mean']} vs {theirs['mean']}; "
            f"std {ours['std']} vs {theirs['std']}; grey {ours['grey']:.4f} vs {theirs['grey']:.4f}; "
            + "; ".join(f"KS {k} {ks(ours[k], theirs[k]):.4f}" for k in ("w", "h", "area")))


@pytest.mark.slow
def test_boxes_per_image_match_ultralytics(both):
    theirs, ours = both
    print(_report(theirs, ours))
    assert abs(ours["boxes"] / theirs["boxes"] - 1) < 0.05, _report(theirs, ours)


@pytest.mark.slow
@pytest.mark.parametrize("k", ["w", "h", "area"])
def test_box_sizes_match_ultralytics(both, k):
    theirs, ours = both
    assert ks(ours[k], theirs[k]) < 0.03, _report(theirs, ours)


@pytest.mark.slow
def test_pixel_mean_and_std_match_ultralytics(both):
    theirs, ours = both
    tolerance = 4 * np.sqrt(ours["mean_se"] ** 2 + theirs["mean_se"] ** 2)  # per channel
    assert (np.abs(ours["mean"] - theirs["mean"]) < tolerance).all(), (tolerance, _report(theirs, ours))
    assert tolerance.max() < 6, tolerance  # the test still tells a shift of a few levels from chance
    assert np.abs(ours["std"] / theirs["std"] - 1).max() < 0.03, _report(theirs, ours)


@pytest.mark.slow
def test_grey_fill_fraction_matches_ultralytics(both):
    theirs, ours = both
    assert abs(ours["grey"] - theirs["grey"]) < 0.01, _report(theirs, ours)
