"""A detection run on polygon labels: Ultralytics' detection dataset keeps the polygons where every label row of the
split is one (``YOLODataset.get_labels``), resamples them to 1,000 points, and its augmentation makes each box of its
moved polygon (``RandomPerspective``: ``segment2box``), not of the moved box. The detection pack keeps them then, and
the detection trainer's boxes are the polygon path's, which ``test_augment_segments.py`` holds to Ultralytics'."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from yolofeed.errors import StalePackError
from yolofeed.pack import open_or_build

TINY = dict(imgsz=64, batch=4, device="cpu", workers=0, plots=False, verbose=False, exist_ok=True)


def _pack(root: Path, tmp_path: Path, task: str = "detect", rebuild: str = "auto", split: str = "train"):
    return open_or_build(root / "data.yaml", split, 64, out=tmp_path / "packs", rebuild=rebuild, progress=False,
                         task=task)


def test_a_detection_pack_of_polygon_rows_keeps_them_as_the_segment_pack(segment_dataset, tmp_path):
    detect, segment = _pack(segment_dataset, tmp_path), _pack(segment_dataset, tmp_path, "segment")
    assert detect.task == "detect" and detect.header["detect_polygons"] == 1
    assert detect.polygon_lengths is not None and len(detect.polygon_lengths) == len(detect.label_table) > 0
    for name in ("label_table", "polygon_lengths", "polygon_points"):
        assert (getattr(detect, name) == getattr(segment, name)).all(), name


def test_a_detection_pack_keeps_no_polygons_unless_every_row_is_one(segment_dataset, dataset, tmp_path):
    """Box rows: nothing to keep. Box files among polygon files: Ultralytics drops every polygon (and warns), so the
    pack keeps none."""
    assert _pack(dataset, tmp_path / "boxes").polygon_lengths is None
    label = sorted((segment_dataset / "labels" / "train").glob("*.txt"))[0]
    label.write_text("0 0.5 0.5 0.2 0.2\n")
    mixed = _pack(segment_dataset, tmp_path / "mixed")
    assert mixed.polygon_lengths is None and len(mixed.label_table) > 1


def test_a_detection_pack_built_before_it_kept_polygons_is_stale(segment_dataset, tmp_path, monkeypatch):
    from yolofeed.pack import rebuild

    _pack(segment_dataset, tmp_path)
    monkeypatch.setattr(rebuild, "DETECT_POLYGONS", 2)  # the rule this yolofeed expects is not the one it was built by
    with pytest.raises(StalePackError, match="built before detection packs kept polygon labels"):
        _pack(segment_dataset, tmp_path, rebuild="never")
    assert _pack(segment_dataset, tmp_path).polygon_lengths is not None  # auto: built again


def test_a_detection_batch_takes_its_boxes_from_the_moved_polygons(segment_dataset, tmp_path):
    """FastDetectionTrainer's first batch on polygon labels, augmented in ``preprocess_batch`` and by
    ``AugmentAhead``: the loader hands it the polygons, and its classes, boxes and batch indices are those of the
    polygon path with the same draws, with no masks."""
    import dataclasses

    from yolofeed.augment import GpuAugment
    from yolofeed.train import FastDetectionTrainer

    batches, source = [], None
    for ahead in (False, True):
        trainer = FastDetectionTrainer.with_options(augment_ahead=ahead, partner_pool=0)(overrides=dict(
            model="yolo11n.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name=f"r{ahead}",
            epochs=1, **TINY))
        loader = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
        try:
            raw = next(iter(loader))
            source = raw["source"] if not ahead else source
            batches.append(trainer.preprocess_batch(raw))
        finally:
            loader.close()
    assert source.polygons is not None
    plain = GpuAugment(trainer.hyp)(source, torch.Generator().manual_seed(trainer.args.seed))  # the same draws
    assert plain.segments is not None and int(plain.valid.sum()) > 3
    stock = dataclasses.replace(plain, segments=None).to_ultralytics()
    for batch in batches:
        assert "masks" not in batch
        for key in ("cls", "bboxes", "batch_idx"):
            assert torch.equal(batch[key], stock[key]), key


def test_the_polygons_a_batch_moves_are_bounded_by_the_labels_and_an_epoch_past_it_says_so(
        segment_dataset, dataset, tmp_path, monkeypatch, caplog):
    """On polygon labels the perspective moves the training set's bound on a batch's instances (``mask_capacity`` of
    its source images), not every padded slot (4 x the most labels an image, most of them padding); instances past it
    are counted on the device, and the epoch's end warns once and moves every slot from then on. On box labels, or for
    a batch of few source images, there is no bound."""
    from yolofeed.augment.masks import mask_capacity
    from yolofeed.train import FastDetectionTrainer

    def trainer(name, batch, data=segment_dataset):
        t = FastDetectionTrainer.with_options(partner_pool=0)(overrides=dict(
            model="yolo11n.yaml", data=str(data / "data.yaml"), project=str(tmp_path), name=name, seed=3,
            **{**TINY, "batch": batch}))
        t.train_loader = t.get_dataloader(t.data["train"], batch_size=batch, rank=-1, mode="train")
        return t

    t = trainer("bound", 32)
    try:
        counts = t.train_loader.prefetcher.labels.count[t.train_loader.dataset.indices]
        bound = t._polygon_capacity()
        assert bound == mask_capacity(32, 4, float(counts.mean()), float(counts.std()), float(counts.max()))
        assert bound < 32 * 4 * t.train_loader.prefetcher.labels.width  # the slots of 32 rows of a 4-tile mosaic
        assert t._new_augment().polygon_capacity == bound
        monkeypatch.setattr(FastDetectionTrainer, "_polygon_capacity", lambda self: 1)  # far too few
        t._augment = None
        t.preprocess_batch(next(iter(t.train_loader)))
        assert int(t._polygon_bound.past) > 0
        monkeypatch.undo()
        t.epoch, t.epochs = 0, 3  # not the last: the next epochs move every slot
        with caplog.at_level("WARNING"):
            t._check_polygons()
        assert "epoch 1:" in caplog.text and "every polygon slot is moved" in caplog.text
        assert t._polygon_bound.past is None and t._polygon_capacity() is None and t._augment is None
        caplog.clear()
        t._check_polygons()  # unbounded now: nothing to read, nothing said
        assert not caplog.text
    finally:
        t.train_loader.close()
    for name, batch, data in (("boxes", 32, dataset), ("few", 8, segment_dataset)):  # 8 x 4 source images: too few
        t = trainer(name, batch, data)
        try:
            assert t._polygon_capacity() is None and t._new_augment().polygon_capacity is None
        finally:
            t.train_loader.close()


@pytest.mark.parametrize("kept", ("polygon_lengths", "polygon_points"))
def test_a_detection_pack_with_half_its_polygon_sections_is_refused(segment_dataset, tmp_path, kept):
    """A header that names one polygon section of a detection pack, its checksum right: damaged, not a box pack."""
    import json
    import zlib

    from yolofeed.errors import PackError
    from yolofeed.pack import Pack
    from yolofeed.pack.layout import MAGIC, TRAILER

    path = _pack(segment_dataset, tmp_path).path
    data = path.read_bytes()
    _, _, off, n = TRAILER.unpack(data[-TRAILER.size:])
    header = json.loads(data[off:off + n])
    gone = "polygon_points" if kept == "polygon_lengths" else "polygon_lengths"
    for key in ("sections", "checksums"):
        header[key].pop(gone)
    blob = json.dumps(header).encode()
    path.write_bytes(data[:off] + blob + TRAILER.pack(MAGIC, zlib.crc32(blob), off, len(blob)))
    with pytest.raises(PackError, match=f"{gone} section None is malformed.*rebuild"):
        Pack.open(path)


def test_a_share_of_polygon_rows_in_a_mixed_split_is_warned(segment_dataset, tmp_path, caplog):
    """Ultralytics cuts ``fraction=`` first: where the share holds only polygon rows of a split that also has box
    rows, it keeps the polygons and the pack does not; said in one line. A share that reaches a box-row image, or the
    whole split, is Ultralytics' decision as the pack made it: nothing said."""
    import logging

    from yolofeed.train import FastDetectionTrainer

    label = sorted((segment_dataset / "labels" / "train").glob("*.txt"))[-1]  # the last file: past half the split
    label.write_text("0 0.5 0.5 0.2 0.2\n")
    for fraction, warned in ((0.5, True), (1.0, False)):
        caplog.clear()
        trainer = FastDetectionTrainer.with_options(augment_ahead=False, partner_pool=0)(overrides=dict(
            model="yolo11n.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name="r",
            epochs=1, fraction=fraction, **TINY))
        with caplog.at_level(logging.WARNING):
            trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train").close()
        said = [r.message for r in caplog.records if "polygon rows only" in r.message]
        assert bool(said) == warned, said
        # and Ultralytics' own warning where the images used mix the two, each run, with the split's counts (every
        # row a box, all but one a polygon); not for the share of polygon rows only, where Ultralytics keeps them
        rows = [line for f in (segment_dataset / "labels" / "train").glob("*.txt") for line in f.read_text().split("\n")
                if line.strip()]
        mixed = [r.message for r in caplog.records if "Box and segment counts should be equal" in r.message]
        assert len(mixed) == (not warned), mixed
        assert warned or (f"len(segments) = {len(rows) - 1}, len(boxes) = {len(rows)}. To resolve this only boxes will "
                          "be used and all segments will be removed") in mixed[0], mixed


@pytest.mark.gpu
def test_a_detection_model_on_polygon_labels_trains_on_cuda_with_the_graphed_paths(segment_dataset, tmp_path):
    """Two epochs on one GPU with every default on, on polygon labels: the augmentation graphed with the polygons
    and one batch ahead, the graphed step; the run writes stock's files with finite losses, and its first batch's
    boxes are the polygon path's (the eager CPU batch of the same draws is checked above)."""
    import csv

    import numpy as np
    from ultralytics import YOLO

    from yolofeed import ultralytics_seam as seam
    from yolofeed.train import FastDetectionTrainer

    model = YOLO("yolo11n.yaml")
    seen = {}  # at the run's end, before the trainer lets go of its loaders and graph (test_notebook.py)
    model.add_callback("on_train_end", lambda t: seen.update(
        polygons=t.train_loader.loader.prefetcher.labels.polygons, graph=seam.unwrap_model(t.model).__dict__.get(
            "_graph")))
    model.train(trainer=FastDetectionTrainer, data=str(segment_dataset / "data.yaml"), project=str(tmp_path),
                name="gpu", epochs=2, imgsz=64, batch=4, nbs=4, device=0, workers=0, plots=False, verbose=False)
    assert seen["polygons"] is not None  # the pack kept them, the loader read
    graph = seen["graph"]
    assert graph is not None and graph.flat is not None and not graph.failed
    with open(tmp_path / "gpu" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(np.isfinite(float(r["train/box_loss"])) for r in rows)
