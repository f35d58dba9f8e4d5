"""Mosaic partners come from where Ultralytics takes them: a window of the images loaded lately.

Three levels:
* the pool's window for each sample is exactly Ultralytics' ``dataset.buffer`` at that sample's mosaic
  (the same dataset indices, replaying ``BaseDataset.load_image``'s append-and-pop rule);
* augmenting from the pool's ring equals augmenting the same images gathered as a batch (the ring's
  copies keep pixels, sizes and labels);
* over 100 batches, batches are composed as Ultralytics' own DataLoader composes them: distinct images
  per batch, appearances per image and epoch, and partner age, each within a stated tolerance.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
from unittest import mock

import numpy as np
import pytest
import torch

from helpers import no_host_sync, source_batch
from yolofeed import synth
from yolofeed.augment import AugmentHyp, GpuAugment
from yolofeed.augment.partners import Partners
from yolofeed.augment.pool import PartnerPool, ultralytics_capacity
from yolofeed.config import SynthConfig
from yolofeed.errors import ConfigError
from yolofeed.loader.sampler import EpochSampler
from yolofeed.schema import SourceBatch


def _tiny_batch(ids: np.ndarray, width: int = 3, side: int = 4) -> SourceBatch:
    """A batch whose pixels and labels encode its dataset ids, to find them again in the ring."""
    n = len(ids)
    t = torch.as_tensor(ids, dtype=torch.float32)
    images = (torch.as_tensor(ids) % 251).to(torch.uint8)[:, None, None, None].expand(n, side, side, 3).clone()
    hw = torch.stack([torch.full((n,), side), torch.as_tensor(ids) % side + 1], 1)
    valid = torch.arange(width)[None, :] < (torch.as_tensor(ids) % (width + 1))[:, None]
    return SourceBatch(images, hw, t[:, None].expand(n, width).clone(), t[:, None, None].expand(n, width, 4) / 1e5,
                       valid)


def _windows(partners: Partners) -> list[list[int]]:
    rows = [(int(n) - np.arange(int(w))) % partners.ring for n, w in zip(partners.newest, partners.window)]
    return [sorted(r.tolist()) for r in rows]


def test_window_is_ultralytics_buffer():
    """Each sample's window holds exactly the images Ultralytics' buffer holds when that sample's Mosaic runs."""
    n_images, batch = 50, 4
    cap = ultralytics_capacity(n_images, batch)
    pool = PartnerPool(cap, batch + 1)
    buffer: list[int] = []  # BaseDataset.buffer, by load_image's rule
    rng = np.random.default_rng(0)
    sizes = [batch] * 9 + [batch + 1, 1, batch, 2] + [batch] * 6  # the sampler's B + 1 and a short last batch
    for size in sizes:
        ids = rng.choice(10_000, size, replace=False)  # distinct ids, as a shuffled epoch gives
        first = pool.push(_tiny_batch(ids), ids)
        partners = pool.partners(first, size)
        for k, i in enumerate(ids):
            buffer.append(int(i))
            if 1 < len(buffer) >= cap:
                buffer.pop(0)
            window = [int(pool.ids[r]) for r in (int(partners.newest[k]) - np.arange(int(partners.window[k])))
                      % pool.rows]
            assert sorted(window) == sorted(buffer), (size, k)
            assert int(pool.ids[int(partners.own[k])]) == i


def test_ring_keeps_pixels_sizes_and_labels():
    """Rows of the ring hold the pushed images, sizes and labels, through wrap-arounds and narrower label widths."""
    pool = PartnerPool(7, 5)
    rng = np.random.default_rng(1)
    seen: dict[int, SourceBatch] = {}
    for _ in range(12):
        ids = rng.choice(1000, int(rng.integers(1, 6)), replace=False)
        batch = _tiny_batch(ids, width=int(rng.integers(1, 4)))
        first = pool.push(batch, ids)
        for k, i in enumerate(ids):
            seen[int(i)] = SourceBatch(*(t[k] for t in (batch.images, batch.hw, batch.cls, batch.boxes, batch.valid)))
        for k in range(len(ids)):
            newest, window = first + k, min(pool.keep, first + k + 1)
            for pos in range(newest - window + 1, newest + 1):  # everything a sample may draw is intact
                row = pos % pool.rows
                want, ring = seen[int(pool.ids[row])], pool.sources
                width = want.valid.shape[0]
                assert torch.equal(ring.images[row], want.images) and torch.equal(ring.hw[row], want.hw)
                assert torch.equal(ring.valid[row, :width], want.valid) and not ring.valid[row, width:].any()
                v = want.valid
                assert torch.equal(ring.cls[row, :width][v], want.cls[v])
                assert torch.equal(ring.boxes[row, :width][v], want.boxes[v])


def test_pool_refuses_what_does_not_fit():
    pool = PartnerPool(4, 2)
    with pytest.raises(ValueError, match="does not fit"):
        pool.push(_tiny_batch(np.arange(3)))
    pool.push(_tiny_batch(np.arange(2), width=2))
    with pytest.raises(ValueError, match="label slots"):
        pool.push(_tiny_batch(np.arange(2), width=40))
    with pytest.raises(ConfigError, match="partner_pool=0"):
        PartnerPool(0, 2)


def test_draws_are_uniform_over_the_window():
    partners = Partners(torch.tensor([5, 0]), torch.tensor([5, 1]), torch.tensor([4, 3]), ring=8)
    rows = partners.draw(40_000, torch.Generator().manual_seed(0))
    for b, expect in ((0, [2, 3, 4, 5]), (1, [0, 1, 7])):  # the second window wraps: rows 1, 0, 7
        values, counts = rows[b].unique(return_counts=True)
        assert values.tolist() == expect
        share = counts.double() / counts.sum()
        assert (share - 1 / len(expect)).abs().max() < 0.01  # sampling sd ~0.0025


def test_pooled_augmentation_equals_the_gathered_batch(pack):
    """The same draws give the same pixels and boxes whether sources are the ring or the images gathered as a batch."""
    train = pack(64)
    hyp = AugmentHyp(imgsz=64, mixup=0.5, cutmix=0.5, degrees=10.0)
    aug, gen = GpuAugment(hyp), torch.Generator().manual_seed(3)
    pool = PartnerPool(10, 5)
    order = np.random.default_rng(2).permutation(len(train))
    checked = 0
    for start in range(0, 20, 5):
        ids = order[start:start + 5]
        first = pool.push(source_batch(train, ids.tolist()), ids)
        params = aug.sample(len(ids), gen, partners=pool.partners(first, len(ids)))
        pooled = aug.apply(pool.sources, params)
        rows = params.mosaic.sources.unique()
        gathered = source_batch(train, pool.ids[rows.numpy()].tolist())
        pad = pool.sources.valid.shape[1] - gathered.valid.shape[1]  # the ring's label width
        gathered.boxes = torch.nn.functional.pad(gathered.boxes, (0, 0, 0, pad))
        gathered.cls = torch.nn.functional.pad(gathered.cls, (0, pad))
        gathered.valid = torch.nn.functional.pad(gathered.valid, (0, pad))
        params.mosaic.sources = torch.searchsorted(rows, params.mosaic.sources)  # ring rows -> gathered rows
        plain = aug.apply(gathered, params)
        assert torch.equal(pooled.img, plain.img)
        assert torch.equal(pooled.valid, plain.valid)
        assert torch.equal(pooled.boxes[pooled.valid], plain.boxes[plain.valid])
        assert torch.equal(pooled.cls[pooled.valid], plain.cls[plain.valid])
        checked += int(pooled.valid.sum())
    assert checked > 50


def mosaic_tiles_come_from_the_window(augment, device: str = "cpu") -> int:
    """Augment batches of flat-coloured images (colour = dataset id + 1) with a pure-translation mosaic and
    check that every colour in an output image is an image of its sample's window. Returns the tiles seen
    from earlier batches (there must be some)."""
    s, batch, cap = 64, 8, 20
    keep, older = cap - 1, 0
    for start in range(0, 48, batch):
        ids = np.arange(start, start + batch)
        images = torch.from_numpy(ids + 1).to(torch.uint8)[:, None, None, None].expand(batch, s, s, 3).contiguous()
        hw = torch.tensor([[s, s - 8 * (k % 3)] for k in range(batch)])
        src = SourceBatch(images, hw, torch.zeros(batch, 1), torch.full((batch, 1, 4), 0.5),
                          torch.ones(batch, 1, dtype=torch.bool))
        out = augment(SourceBatch(*(x.to(device) for x in (src.images, src.hw, src.cls, src.boxes, src.valid))))
        img = out.img.cpu()
        for k in range(batch):
            g = start + k  # the sample's load position = its id here
            colours = set(img[k].unique().tolist()) - {114}
            allowed = set(range(max(0, g - keep + 1) + 1, g + 2))
            assert colours <= allowed, (g, sorted(colours - allowed))
            older += len([c for c in colours if c - 1 < start])
    return older


def test_mosaic_tiles_come_from_the_window():
    hyp = AugmentHyp(imgsz=64, translate=0.0, scale=0.0, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    aug, gen, pool = GpuAugment(hyp), torch.Generator().manual_seed(0), PartnerPool(20, 9)
    assert mosaic_tiles_come_from_the_window(lambda b: aug(b, gen, pool)) > 20


@pytest.mark.gpu
def test_graphed_pool_draws_from_the_moving_window():
    """One CUDA graph serves every batch: it reads the ring at the batch's load position (never stale rows),
    replays reproducibly from its seed, and makes no host sync once captured."""
    from yolofeed.augment.graphs import GraphedAugment

    hyp = AugmentHyp(imgsz=64, translate=0.0, scale=0.0, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    outs: list[list[torch.Tensor]] = [[], []]
    for k in range(2):
        graphed = GraphedAugment(GpuAugment(hyp), seed=0, device="cuda", pool=PartnerPool(20, 9))

        def run(batch, graphed=graphed, k=k):
            with no_host_sync() if outs[k] else contextlib.nullcontext():  # captured on the first call
                out = graphed(batch)
            outs[k].append(out.img.clone())
            return out

        assert mosaic_tiles_come_from_the_window(run, "cuda") > 20
        assert graphed.captured == 1
    assert len(outs[0]) == 6 and all(torch.equal(a, b) for a, b in zip(*outs))


# -- batch composition against Ultralytics' DataLoader ---------------------------------------------------
N_IMAGES, BATCH, EPOCHS, IMGSZ = 400, 8, 2, 64  # buffer min(400, 64, 1000) = 64; 100 batches


POSE = {"kpt_shape": (5, 3), "flip_idx": (0, 3, 2, 1, 4)}  # yolofeed synth task=pose's


@pytest.fixture(scope="module", params=["detect", "pose", "obb", "segment"])
def composition_data(tmp_path_factory, request):
    """The set both sides compose batches from, and its task (keypoints, corners or polygons ride along: the draws
    are the same; Ultralytics' dataset of that task on its side)."""
    root = tmp_path_factory.mktemp(f"composition-{request.param}")
    return synth.run(SynthConfig(out=str(root), n_train=N_IMAGES, n_val=2, imgsz=IMGSZ, seed=5, workers=2,
                                 task=request.param)), request.param


class Composition:
    """Per-batch source images, per-image appearances and partner ages, from (batch, primary, partners) records."""

    def __init__(self):
        self.batches: list[set[int]] = []
        self.primary: dict[tuple[int, int], int] = {}  # (epoch, image) -> times primary
        self.partner: dict[tuple[int, int], int] = {}  # (epoch, image) -> times drawn as partner
        self.ages: list[int] = []
        self.loaded_at: dict[int, int] = {}

    def add(self, epoch: int, batch_no: int, image: int, partners: list[int]) -> None:
        if batch_no == len(self.batches):
            self.batches.append(set())
        self.loaded_at[image] = batch_no
        self.batches[batch_no].update([image, *partners])
        self.primary[(epoch, image)] = self.primary.get((epoch, image), 0) + 1
        for p in partners:
            self.partner[(epoch, p)] = self.partner.get((epoch, p), 0) + 1
            self.ages.append(batch_no - self.loaded_at[p])

    def summary(self) -> dict:
        partner_counts = np.array([self.partner.get((e, i), 0) for e in range(EPOCHS) for i in range(N_IMAGES)])
        return {"batches": len(self.batches), "distinct": np.mean([len(b) for b in self.batches]),
                "primary": set(self.primary.values()), "partner_mean": partner_counts.mean(),
                "partner_sd": partner_counts.std(), "ages": np.array(self.ages)}


def ultralytics_composition(yaml_file, task: str = "detect") -> dict:
    """Ultralytics' own training DataLoader (one process: one buffer), instrumented, for EPOCHS epochs."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.augment import Mosaic
    from ultralytics.data.build import build_dataloader
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    d = check_det_dataset(str(yaml_file), autodownload=False)
    ds = YOLODataset(img_path=d["train"], imgsz=IMGSZ, augment=True, hyp=get_cfg(overrides={"imgsz": IMGSZ}),
                     data=d, batch_size=BATCH, rect=False, task=task)
    comp, state = Composition(), {"sample": 0, "epoch": 0, "image": None}
    get_item, get_indexes = YOLODataset.__getitem__, Mosaic.get_indexes

    def item(self, index):
        state["image"] = index
        out = get_item(self, index)
        state["sample"] += 1
        return out

    def indexes(self):
        chosen = get_indexes(self)
        comp.add(state["epoch"], state["sample"] // BATCH, state["image"], list(chosen))
        return chosen

    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    with mock.patch.object(YOLODataset, "__getitem__", item), mock.patch.object(Mosaic, "get_indexes", indexes):
        loader = build_dataloader(ds, BATCH, workers=0, shuffle=True, device="cpu")
        for epoch in range(EPOCHS):
            state["epoch"] = epoch
            for _ in loader:
                pass
    return comp.summary()


def yolofeed_composition(task: str = "detect") -> dict:
    """The trainer's sampler + partner pool + mosaic draws for the same epochs (pixels play no part here)."""
    sampler = EpochSampler(np.arange(N_IMAGES), BATCH, seed=0)
    pool = PartnerPool(ultralytics_capacity(N_IMAGES, BATCH), BATCH + 1)
    hyp = AugmentHyp(imgsz=IMGSZ, **(POSE if task == "pose" else {}))
    aug, gen = GpuAugment(hyp), torch.Generator().manual_seed(0)
    comp, batch_no = Composition(), 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for ids in sampler.batches():
            first = pool.push(_tiny_batch(ids), ids)
            sources = aug.sample(len(ids), gen, partners=pool.partners(first, len(ids))).mosaic.sources
            for k, i in enumerate(ids):
                comp.add(epoch, batch_no, int(i), pool.ids[sources[k, 1:].numpy()].tolist())
            batch_no += 1
    return comp.summary()


def ks(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.sort(a), np.sort(b)
    x = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, x, "right") / len(a) - np.searchsorted(b, x, "right") / len(b)).max())


def test_batches_are_composed_as_ultralytics_composes_them(composition_data):
    """100 batches of 8 mosaics, two epochs, against Ultralytics' DataLoader over the same dataset.

    Tolerances, each several sampling sds wide and far tighter than the difference they guard against
    (partners from the batch itself: ~17 distinct images a batch against ~27, ages all 0):
    * distinct source images per batch: means within 4 % (sd of the mean ~0.5 %);
    * each image is the primary of exactly one mosaic per epoch, on both sides;
    * appearances as a partner per image and epoch: means within 2 % (both are 3 x 400 draws over 400
      images, the mean is exact), sds within 12 % (sd of an sd at n = 800 is ~3 %; and where an epoch
      begins, Ultralytics' buffer does not take again an image it still holds from the last epoch's end,
      ~10 of 400 images, where the pool holds it twice: measured, ours reads 2-7 % higher);
    * partner age in batches (batches since the partner was loaded): means within 5 % and
      Kolmogorov-Smirnov distance < 0.04 (2,400 draws a side: the 1 % critical value is 0.047).
    """
    data, task = composition_data  # the same for pose (its augmentation: the same draws, keypoints ride along)
    theirs, ours = ultralytics_composition(data, task), yolofeed_composition(task)
    report = (f"batches {ours['batches']} vs {theirs['batches']}; distinct/batch {ours['distinct']:.2f} vs "
              f"{theirs['distinct']:.2f}; partner appearances {ours['partner_mean']:.3f}±{ours['partner_sd']:.3f} vs "
              f"{theirs['partner_mean']:.3f}±{theirs['partner_sd']:.3f}; age {ours['ages'].mean():.2f} vs "
              f"{theirs['ages'].mean():.2f} (KS {ks(ours['ages'], theirs['ages']):.3f})")
    print(report)
    assert ours["batches"] == theirs["batches"] == EPOCHS * N_IMAGES // BATCH, report
    assert abs(ours["distinct"] / theirs["distinct"] - 1) < 0.04, report
    assert ours["primary"] == theirs["primary"] == {1}, report
    assert abs(ours["partner_mean"] / theirs["partner_mean"] - 1) < 0.02, report
    assert abs(ours["partner_sd"] / theirs["partner_sd"] - 1) < 0.12, report
    assert abs(ours["ages"].mean() / theirs["ages"].mean() - 1) < 0.05, report
    assert ks(ours["ages"], theirs["ages"]) < 0.04, report


@pytest.mark.parametrize("option, keep", [("auto", 63), (10, 9), ("10", 9), (0, None)])
def test_partner_pool_option(option, keep, caplog):
    """auto sizes the pool as Ultralytics' buffer (400 images, batch 8: min(400, 64, 1000)); 0 switches it off. Its
    line says the memory it holds, and the GPU's only on a GPU."""
    from types import SimpleNamespace

    from yolofeed.train.trainer import FastDetectionTrainer
    from yolofeed.ultralytics_seam import LOGGER

    for device in ("cpu", "cuda"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=LOGGER.name):
            pool = FastDetectionTrainer._partner_pool(
                SimpleNamespace(partner_pool=option, device=torch.device(device)), 400, 8, 64)
        assert (pool.keep if pool is not None else None) == keep
        if pool is not None:
            assert pool.max_batch == 9  # the sampler's last batch may hold one image more
            said = re.search(r"\((\d[\d.,]* (?:GB|MB|KB)) of (GPU )?memory; partner_pool=N for fewer\)", caplog.text)
            assert said and bool(said.group(2)) == (device == "cuda") and not said.group(1).startswith("0.00"), \
                caplog.text


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5", "\u00b2", -3, 2.5, True])
def test_bad_partner_pool_is_refused_with_the_options_before_a_run(bad):
    """``with_options`` (and the CLI through it) refuses the value before Ultralytics makes the run folder; what it
    lets through, the trainer uses."""
    from yolofeed.train import options
    from yolofeed.train.trainer import FastDetectionTrainer

    with pytest.raises(ConfigError, match="option partner_pool="):
        FastDetectionTrainer.with_options(partner_pool=bad)
    FastDetectionTrainer.with_options(partner_pool=" 12 ")
    FastDetectionTrainer.with_options(partner_pool="auto")
    for given, used in ((" 12 ", 12), (" auto ", "auto"), (0, 0), ("7", 7)):  # what the trainer then uses
        assert options.partner_pool_size(given) == used


@pytest.mark.parametrize("bad", ["big", -1, True, 2.5])
def test_bad_partner_pool_is_refused(bad):
    from types import SimpleNamespace

    from yolofeed.train.trainer import FastDetectionTrainer

    with pytest.raises(ConfigError, match="partner_pool="):
        FastDetectionTrainer._partner_pool(SimpleNamespace(partner_pool=bad), 400, 8, 64)
