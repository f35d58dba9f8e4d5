"""FastOBBTrainer on the CPU: an OBB model trains from an OBB pack, its batches carry the oriented boxes Ultralytics'
OBB loss reads, and it writes what ``yolo train`` writes for OBB; bench compares an OBB model with its own trainers."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

TINY = dict(epochs=1, imgsz=64, batch=8, device="cpu", workers=0, plots=False, verbose=False, exist_ok=True)


def _columns(run: Path) -> list[str]:
    with open(run / "results.csv") as f:
        return next(csv.reader(f))


def test_the_batches_carry_the_oriented_boxes_ultralytics_obb_loss_reads(obb_dataset, tmp_path):
    """One augmented batch of FastOBBTrainer's loader, through Ultralytics' own OBB loss: each box is (cx, cy, w, h,
    theta), the first four normalised, w the longer side and theta in [-pi/4, 3pi/4) (Ultralytics' canonical form),
    row-aligned with the classes, and the loss is finite."""
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import OBBModel

    from yolofeed import FastOBBTrainer

    trainer = FastOBBTrainer(overrides=dict(model="yolo11n-obb.yaml", data=str(obb_dataset / "data.yaml"),
                                            project=str(tmp_path), name="r", **TINY))
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=8, rank=-1, mode="train")
    try:
        batch = trainer.preprocess_batch(next(iter(loader)))
    finally:
        loader.close()
    n = len(batch["cls"])
    b = batch["bboxes"]
    assert n > 0 and b.shape == (n, 5) and len(batch["batch_idx"]) == n
    assert (b[:, :2] >= 0).all() and (b[:, :2] <= 1).all() and (b[:, 2] >= b[:, 3]).all()
    assert (b[:, 4] >= -math.pi / 4).all() and (b[:, 4] < 3 * math.pi / 4).all()
    model = OBBModel("yolo11n-obb.yaml", nc=trainer.data["nc"], verbose=False)
    model.args = get_cfg()
    loss, _ = model.loss(batch, model(batch["img"]))
    assert torch.isfinite(loss).all() and loss.sum() > 0


def test_copy_paste_trains_an_obb_batch_with_its_copies(obb_dataset, tmp_path):
    """copy_paste=1.0 on an OBB run: the same draws (copy-paste makes none), every eligible mirrored box pasted, so
    the first batch holds more oriented boxes than without it, each a canonical (cx, cy, w, h, theta); the loss is
    finite."""
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import OBBModel

    from yolofeed import FastOBBTrainer

    counts = []
    for p in (0.0, 1.0):
        trainer = FastOBBTrainer(overrides=dict(model="yolo11n-obb.yaml", data=str(obb_dataset / "data.yaml"),
                                                project=str(tmp_path), name=f"cp{p}", seed=3, copy_paste=p, **TINY))
        loader = trainer.get_dataloader(trainer.data["train"], batch_size=8, rank=-1, mode="train")
        try:
            batch = trainer.preprocess_batch(next(iter(loader)))
        finally:
            loader.close()
        b = batch["bboxes"]
        assert (b[:, 2] >= b[:, 3]).all() and (b[:, 4] >= -math.pi / 4).all() and (b[:, 4] < 3 * math.pi / 4).all()
        counts.append(len(batch["cls"]))
    assert counts[1] > counts[0]
    model = OBBModel("yolo11n-obb.yaml", nc=trainer.data["nc"], verbose=False)
    model.args = get_cfg()
    loss, _ = model.loss(batch, model(batch["img"]))
    assert torch.isfinite(loss).all()


def test_the_copies_a_batch_fills_are_bounded_by_the_labels_and_a_bound_that_fell_short_is_dropped(
        obb_dataset, tmp_path, caplog, monkeypatch):
    """copy_paste on an OBB run: the copies a batch fills are the labels' bound on its source images' instances, far
    below the padded copy slots (a dense image widens every row's); copies left out are counted on the device, and
    the epoch's end warns once and fills every slot from then on. Without copy-paste, or for a batch of few source
    images, there is no bound."""
    import torch

    from yolofeed import FastOBBTrainer
    from yolofeed.augment.masks import mask_capacity

    def trainer(name, batch, **kw):
        t = FastOBBTrainer(overrides=dict(model="yolo11n-obb.yaml", data=str(obb_dataset / "data.yaml"),
                                          project=str(tmp_path), name=name, seed=3, **{**TINY, "batch": batch, **kw}))
        t.train_loader = t.get_dataloader(t.data["train"], batch_size=batch, rank=-1, mode="train")
        return t

    t = trainer("bound", 32, copy_paste=1.0)
    try:
        counts = t.train_loader.prefetcher.labels.count[t.train_loader.dataset.indices]
        width = t.train_loader.prefetcher.labels.width
        bound = t._paste_capacity()
        assert bound == mask_capacity(32, 4, float(counts.mean()), float(counts.std()), float(counts.max()))
        assert bound < 32 * 2 * 4 * width  # the copy slots of 32 rows of a 4-tile mosaic (mixup's rows besides)
        assert t._new_augment().paste_capacity == bound
        monkeypatch.setattr(FastOBBTrainer, "_paste_capacity", lambda self: 1)  # far too few: copies are left out
        t._augment = None
        t.preprocess_batch(next(iter(t.train_loader)))
        assert int(t._paste_bound.past) > 0
        monkeypatch.undo()
        t.epoch, t.epochs = 0, 3  # not the last: the next epochs fill every slot
        with caplog.at_level("WARNING"):
            t._check_pastes()
        assert "epoch 1: copy_paste left" in caplog.text and "every copy slot is filled" in caplog.text
        assert t._paste_bound.past is None and t._paste_capacity() is None and t._augment is None
        caplog.clear()
        t._paste_bound.past = torch.tensor(2)
        with caplog.at_level("WARNING"):
            t._check_pastes()  # every slot filled already: still said, never silent
        assert "with every copy slot filled" in caplog.text
    finally:
        t.train_loader.close()
    for name, batch, kw in (("off", 32, {}), ("few", 8, {"copy_paste": 1.0})):  # 8 x 4 source images: too few
        t = trainer(name, batch, **kw)
        try:
            assert t._paste_capacity() is None
        finally:
            t.train_loader.close()


@pytest.mark.slow
def test_an_obb_model_trains_from_an_obb_pack_and_writes_ultralytics_obb_files(obb_dataset, tmp_path):
    from ultralytics import YOLO
    from ultralytics.models.yolo.obb import OBBTrainer

    from yolofeed import FastOBBTrainer
    from yolofeed.pack import Pack

    seen = []
    stock = YOLO("yolo11n-obb.yaml")
    stock.train(trainer=OBBTrainer, data=str(obb_dataset / "data.yaml"), project=str(tmp_path), name="stock", **TINY)
    ours = YOLO("yolo11n-obb.yaml")
    ours.add_callback("on_train_batch_end", lambda t: seen.append(t.batch_images))
    ours.train(trainer=FastOBBTrainer, data=str(obb_dataset / "data.yaml"), project=str(tmp_path), name="ours",
               **TINY)
    assert seen and all(n > 0 for n in seen)
    assert _columns(tmp_path / "ours") == _columns(tmp_path / "stock")
    packs = list(obb_dataset.glob("yolofeed-packs/*-obb/train.yfpack"))
    assert len(packs) == 1 and Pack.open(packs[0]).header["task"] == "obb"
    best = YOLO(str(tmp_path / "ours" / "weights" / "best.pt"))
    assert best.task == "obb"
    metrics = best.val(data=str(obb_dataset / "data.yaml"), imgsz=64, device="cpu", plots=False, verbose=False)
    assert metrics.box is not None  # yolo val reads yolofeed's best.pt as an OBB model


def test_a_trainer_refuses_a_model_of_another_task_in_one_line(obb_dataset, tmp_path):
    from yolofeed import FastDetectionTrainer, FastOBBTrainer
    from yolofeed.errors import ConfigError

    data = str(obb_dataset / "data.yaml")
    with pytest.raises(ConfigError, match="is an oriented-box model: train it with yolofeed's FastOBBTrainer"):
        FastDetectionTrainer(overrides=dict(model="yolo11n-obb.yaml", data=data, project=str(tmp_path / "runs"),
                                            **TINY))
    with pytest.raises(ConfigError, match="is a detection model, and this run is task=obb: pick an obb model"):
        FastOBBTrainer(overrides=dict(model="yolo11n.yaml", data=data, project=str(tmp_path / "runs"), **TINY))
    assert not (tmp_path / "runs").exists()  # refused before the run folder


@pytest.mark.slow
def test_bench_compares_an_obb_model_with_its_own_trainers(obb_dataset, tmp_path):
    import json

    from ultralytics.models.yolo.obb import OBBTrainer

    from yolofeed.bench.ceiling import CeilingOBBTrainer
    from yolofeed.bench.modes import trainer_class
    from yolofeed.cli import main
    from yolofeed.train import FastOBBTrainer

    assert trainer_class("stock", task="obb") is OBBTrainer
    assert trainer_class("ceiling", task="obb") is CeilingOBBTrainer
    assert issubclass(trainer_class("yolofeed", task="obb"), FastOBBTrainer)
    assert main(["bench", "model=yolo11n-obb.yaml", f"data={obb_dataset / 'data.yaml'}", "modes=yolofeed,ceiling",
                 "steps=4", "warmup=2", "window=2", "imgsz=64", "batch=4", "device=cpu", f"out={tmp_path / 'b'}"]) == 0
    results = json.loads((tmp_path / "b" / "bench.json").read_text())["results"]
    assert [r["mode"] for r in results] == ["yolofeed", "ceiling"] and all(r["images_per_s"] > 0 for r in results)


@pytest.mark.slow
def test_obb_training_uses_the_counts_read_ahead_and_they_are_right(obb_dataset, tmp_path, monkeypatch):
    """FastOBBTrainer on the CPU: after the first steps every OBB loss call takes the candidate count AugmentAhead
    computed a step early from the augmented oriented boxes, and every epoch's check finds them right."""
    from ultralytics import YOLO

    from yolofeed import FastOBBTrainer
    from yolofeed.train import loss as sfl

    calls = {"counted": 0, "measured": 0}
    own = sfl.SyncFreeRotatedAssigner.get_box_metrics

    def spy(self, *a, **k):
        calls["counted" if self.candidates is not None else "measured"] += 1
        return own(self, *a, **k)

    checks = []
    check = sfl.check_counts
    monkeypatch.setattr(sfl.SyncFreeRotatedAssigner, "get_box_metrics", spy)
    monkeypatch.setattr(sfl, "check_counts", lambda model: checks.append(check(model)) or checks[-1])
    YOLO("yolo11n-obb.yaml").train(trainer=FastOBBTrainer, data=str(obb_dataset / "data.yaml"), project=str(tmp_path),
                                   name="r", epochs=2, imgsz=64, batch=4, device="cpu", workers=0, plots=False,
                                   verbose=False, val=False)
    assert calls["measured"] == 2 and calls["counted"] >= 2  # the first two batches: before the anchors are known
    assert checks == [True, True]


@pytest.mark.parametrize("model, task", [("yolo11n-obb.yaml", "obb"), ("yolo11n-seg.yaml", "segment")])
def test_files_ultralytics_would_not_skip_refuse_the_run_wherever_they_are(segment_root, obb_root, tmp_path, model,
                                                                          task):
    """A file of box rows that is not the first of a segment or OBB set (Ultralytics refuses the whole run on it), and
    an OBB set's outline of 8 points (Ultralytics fits a rotated box to it): the pack skips those files, and the run
    trained on the rest, exit 0 (an OBB model on a segment set: 2 of 16 images). Now it is refused before the first
    step, naming the first such file and the report."""
    from ultralytics import YOLO

    from helpers import copy_dataset
    from yolofeed import FastOBBTrainer, FastSegmentationTrainer
    from yolofeed.errors import DatasetError

    def last_file_holds(name: str, rows: str) -> Path:  # not the first file: the up-front look passes it
        root = copy_dataset(segment_root if task == "segment" else obb_root, tmp_path / name)
        sorted((root / "labels" / "train").glob("*.txt"))[-1].write_text(rows)
        return root

    cases = [last_file_holds("boxed", "0 0.5 0.5 0.2 0.2\n")]
    if task == "obb":  # an outline of 8 points
        cases.append(last_file_holds("outline", "0 0.3 0.2 0.5 0.1 0.7 0.2 0.8 0.4 0.7 0.6 0.5 0.7 0.3 0.6 0.2 0.4\n"))
    trainer = FastOBBTrainer if task == "obb" else FastSegmentationTrainer
    for root in cases:
        with pytest.raises(DatasetError, match=r"image\(s\) of split 'train' were skipped where Ultralytics would "
                                               r"not skip them \(each listed in .*train\.report\.txt\); the first: "):
            YOLO(model).train(trainer=trainer, data=str(root / "data.yaml"), project=str(tmp_path / "runs"),
                              name=root.name, **TINY)
