"""Augmenting one batch ahead changes when work is launched, never what the trainer receives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import no_host_sync
from yolofeed.augment import AugmentHyp, GpuAugment
from yolofeed.loader import TrainLoader
from yolofeed.schema import AugmentedBatch
from yolofeed.train.ahead import AugmentAhead

HYP = dict(mixup=0.5, cutmix=0.5, degrees=5.0)
KEYS = ("img", "cls", "bboxes", "batch_idx")


class StaticAugment:
    """``GpuAugment`` whose output lives in buffers it overwrites on every call, as ``GraphedAugment``'s does."""

    def __init__(self, hyp: AugmentHyp, seed: int):
        self.aug, self.gen = GpuAugment(hyp), torch.Generator().manual_seed(seed)
        self.static: dict[tuple, AugmentedBatch] = {}
        self.calls = 0

    def __call__(self, source):
        self.calls += 1
        out = self.aug(source, self.gen)
        key = tuple(out.valid.shape)
        if key not in self.static:
            self.static[key] = AugmentedBatch(*(torch.empty_like(t) for t in (out.img, out.cls, out.boxes, out.valid)))
        s = self.static[key]
        for dst, src in zip((s.img, s.cls, s.boxes, s.valid), (out.img, out.cls, out.boxes, out.valid)):
            dst.copy_(src)
        return s


def _plain(loader, hyp, seed):
    """The reference: augment each batch when it arrives and flatten by boolean indexing."""
    aug, gen = GpuAugment(hyp), torch.Generator().manual_seed(seed)
    out = []
    for b in loader:
        d = aug(b["source"], gen).to_ultralytics()
        out.append({**d, "img": d["img"].float(), "im_file": b["im_file"]})
    return out


def _assert_same(got, want):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g["im_file"] == w["im_file"], k
        for key in KEYS:
            assert g[key].dtype == w[key].dtype and torch.equal(g[key], w[key]), (k, key)


@pytest.mark.parametrize("sync", [True, False])
def test_lookahead_yields_the_plain_sequence(pack, sync):
    pack64 = pack(64)
    hyp = AugmentHyp(imgsz=64, **HYP)
    want = _plain(TrainLoader(pack64, 5, "cpu", seed=1, sync=sync), hyp, seed=9)
    assert [len(d["img"]) for d in want] == [5, 5, 5, 5, 4]  # a full epoch, the last batch partial
    aug = StaticAugment(hyp, seed=9)
    ahead = AugmentAhead(TrainLoader(pack64, 5, "cpu", seed=1, sync=sync), aug)
    got = list(ahead)
    _assert_same(got, want)
    assert aug.calls == len(ahead) == 5
    assert ahead.batch_size == 5 and ahead.sampler.epoch == 1  # the loader's attributes show through


def test_nothing_is_launched_before_the_first_request(pack):
    pack64 = pack(64)
    aug = StaticAugment(AugmentHyp(imgsz=64), seed=0)
    it = iter(AugmentAhead(TrainLoader(pack64, 5, "cpu"), aug))
    assert aug.calls == 0  # iter() alone (Ultralytics' enumerate before close_mosaic) starts nothing
    next(it)
    assert aug.calls == 2  # the first request launches its batch and the next one
    it.close()


def test_an_abandoned_pass_stops_the_loader_and_the_next_is_a_full_epoch(pack):
    pack64 = pack(64)
    loader = TrainLoader(pack64, 5, "cpu", seed=2)
    ahead = AugmentAhead(loader, StaticAugment(AugmentHyp(imgsz=64), seed=0))
    for k, _ in enumerate(ahead):
        if k == 1:
            break
    assert loader.prefetcher._thread is None  # the prefetcher's thread was stopped, not left waiting
    it = iter(ahead)
    next(it)
    with pytest.raises(RuntimeError, match="step failed"):
        it.throw(RuntimeError("step failed"))
    assert loader.prefetcher._thread is None
    files = [f for d in ahead for f in d["im_file"]]
    assert sorted(files) == sorted(pack64.im_files)  # every sample once


def test_lookahead_never_crosses_an_epoch(pack):
    """Each pass augments only its own batches, with the augmenter current when the pass runs."""
    pack64 = pack(64)
    hyps = iter([AugmentHyp(imgsz=64, **HYP), AugmentHyp(imgsz=64, **HYP).closed()])
    current = {}

    def augment(source):
        return current["aug"](source)

    ahead = AugmentAhead(TrainLoader(pack64, 5, "cpu", seed=3), augment)
    reference = TrainLoader(pack64, 5, "cpu", seed=3)
    for hyp in hyps:  # as close_mosaic does between epochs: a new augmenter
        current["aug"] = StaticAugment(hyp, seed=4)
        got = list(ahead)
        _assert_same(got, _plain(reference, hyp, seed=4))
        assert current["aug"].calls == 5


def test_trainer_with_and_without_lookahead_gives_the_same_batches(synth_root, tmp_path):
    """Through FastDetectionTrainer: preprocess_batch's output, epoch after epoch, across close_mosaic."""
    from yolofeed import FastDetectionTrainer

    args = dict(model="yolo11n.yaml", data=str(synth_root / "data.yaml"), imgsz=64, batch=5, device="cpu",
                workers=0, plots=False, verbose=False, project=str(tmp_path), exist_ok=True, seed=5, mixup=0.5)
    runs = []
    for ahead in (False, True):
        trainer = FastDetectionTrainer.with_options(augment_ahead=ahead)(overrides={**args, "name": str(ahead)})
        loader = trainer.get_dataloader(trainer.data["train"], batch_size=5, rank=-1, mode="train")
        assert isinstance(loader, AugmentAhead) == ahead
        epochs = []
        for epoch in range(2):
            if epoch == 1:
                trainer._close_dataloader_mosaic()
            loader.sampler.set_epoch(epoch)
            epochs.append([trainer.preprocess_batch(b) for b in loader])
        loader.close()
        runs.append(epochs)
    for plain, ahead in zip(*runs):
        assert len(plain) == len(ahead) == 5
        _assert_same(ahead, plain)
        for d in ahead:
            assert d["img"].max() <= 1.0 and np.isfinite(d["img"].numpy()).all()


@pytest.mark.gpu
def test_cuda_lookahead_equals_the_plain_path_and_never_syncs(pack):
    """Graphed augmentation one batch ahead: the same batches as augment-then-flatten, and after the
    first request (graph capture, first count) no host sync: no ``.item()``, no boolean indexing."""
    from yolofeed.augment.graphs import GraphedAugment

    p160 = pack(160)
    hyp = AugmentHyp(imgsz=160, **HYP)
    plain = GraphedAugment(GpuAugment(hyp), seed=7)
    want = []
    for b in TrainLoader(p160, 8, "cuda", seed=1):  # 24 images: three full batches, one graph
        d = plain(b["source"]).to_ultralytics()
        d["img"] = d["img"].float()  # copied out of the graph's memory before the next replay
        want.append({**{k: v.cpu() for k, v in d.items()}, "im_file": b["im_file"]})
    ahead = AugmentAhead(TrainLoader(p160, 8, "cuda", seed=1), GraphedAugment(GpuAugment(hyp), seed=7))
    it = iter(ahead)
    got = [next(it)]  # captures the graph and reads the first count: syncs allowed
    with no_host_sync():
        for d in it:
            d["scaled"] = d["img"] / 255  # what Ultralytics' preprocess_batch adds
            got.append(d)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g["im_file"] == w["im_file"]
        for key in KEYS:
            assert torch.equal(g[key].cpu(), w[key]), key
