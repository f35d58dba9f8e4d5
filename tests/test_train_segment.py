"""FastSegmentationTrainer on the CPU: a segment model trains from a segment pack; its training batches carry the masks
Ultralytics' ``Format`` makes of the same augmented polygons, its validation batches equal stock's, and it writes what
``yolo train`` writes for segmentation; what it cannot do is refused in one line."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import copy_dataset
from yolofeed.errors import ConfigError, DatasetError
from yolofeed.train import options

TINY = dict(imgsz=64, batch=4, device="cpu", workers=0, plots=False, verbose=False, exist_ok=True)


def _columns(run: Path) -> list[str]:
    with open(run / "results.csv") as f:
        return next(csv.reader(f))


def _stock_format(out, ratio: int, overlap: bool) -> dict:
    """Ultralytics' ``Format`` (segment task) of each image of an augmented batch, from its polygons, boxes and classes
    as the augmentation left them (Instances in pixels, as v8_transforms hands them over), then ``collate_fn``."""
    from ultralytics.data.augment import Format
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.utils.instance import Instances

    fmt = Format(bbox_format="xywh", normalize=True, return_mask=True, batch_idx=True, mask_ratio=ratio,
                 mask_overlap=overlap)
    size = out.img.shape[-1]
    items = []
    for i in range(len(out.img)):
        v = out.valid[i]
        segments = out.segments[i][v].numpy()
        inst = Instances(out.boxes[i][v].numpy(), segments=segments, bbox_format="xyxy", normalized=False)
        items.append(fmt({"img": np.zeros((size, size, 3), np.uint8), "cls": out.cls[i][v].numpy()[:, None],
                          "instances": inst}))
    return YOLODataset.collate_fn(items)


@pytest.mark.parametrize("overlap", (True, False))
def test_the_training_batch_is_formats_masks_of_the_augmented_polygons(segment_dataset, tmp_path, overlap):
    """One batch of FastSegmentationTrainer, through ``preprocess_batch``: its masks, sem_masks, classes, boxes and
    batch indices equal what Ultralytics' ``Format`` + ``collate_fn`` make of the same augmented polygons (the same
    draws, replayed without masks), in Ultralytics' label order; and Ultralytics' segment loss takes it."""
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import SegmentationModel

    from yolofeed.augment import GpuAugment
    from yolofeed.train import FastSegmentationTrainer

    trainer = FastSegmentationTrainer.with_options(augment_ahead=False, partner_pool=0)(overrides=dict(
        model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name="r",
        overlap_mask=overlap, mask_ratio=2, epochs=1, **TINY))
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
    try:
        raw = next(iter(loader))
        source = raw["source"]
        plain = GpuAugment(trainer.hyp)(source, torch.Generator().manual_seed(trainer.args.seed))  # the same draws
        batch = trainer.preprocess_batch(raw)
    finally:
        loader.close()
    assert plain.segments is not None and int(plain.valid.sum()) > 3
    stock = _stock_format(plain, 2, overlap)
    n = len(stock["cls"])
    assert batch["masks"].shape == stock["masks"].shape == ((4,) if overlap else (n,)) + (32, 32)
    assert torch.equal(batch["masks"].float(), stock["masks"].float())
    assert torch.equal(batch["sem_masks"], stock["sem_masks"])
    assert torch.equal(batch["cls"], stock["cls"]) and torch.equal(batch["batch_idx"], stock["batch_idx"])
    assert torch.equal(batch["bboxes"], stock["bboxes"])
    if overlap:  # the index masks name instances by rank: the order is the area sort, not the slots'
        assert batch["masks"].max() > 1
    model = SegmentationModel("yolo11n-seg.yaml", nc=trainer.data["nc"], verbose=False)
    model.args = get_cfg(overrides={"overlap_mask": overlap})
    loss, items = model.loss(batch, model(batch["img"]))
    assert torch.isfinite(loss).all() and items["seg_loss"] > 0


@pytest.mark.parametrize("overlap", (True, False))
def test_the_look_ahead_batch_equals_the_inline_one(segment_dataset, tmp_path, overlap):
    """``AugmentAhead`` (the default: the batch's count read a step early, no sync) hands the step the same masks,
    sem_masks and labels as augmenting in ``preprocess_batch`` does, for the same seed."""
    from yolofeed.train import FastSegmentationTrainer

    batches = []
    for ahead in (False, True):
        trainer = FastSegmentationTrainer.with_options(augment_ahead=ahead)(overrides=dict(
            model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path),
            name=f"r{ahead}", overlap_mask=overlap, epochs=1, **TINY))
        loader = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
        try:
            batches.append(trainer.preprocess_batch(next(iter(loader))))
        finally:
            loader.close()
    inline, ahead = batches
    assert ahead["masks"].shape[0] == (4 if overlap else len(ahead["cls"]))
    for key in ("img", "cls", "bboxes", "batch_idx", "masks", "sem_masks"):
        assert torch.equal(inline[key], ahead[key]), key


def _assert_val_batches_equal(root: Path, tmp_path: Path, overlap: bool) -> None:
    """yolofeed's validation batches of ``root``'s val split equal Ultralytics' segment val loader's, value for value
    (masks, sem_masks, classes, boxes, batch indices, pixels)."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    from yolofeed.loader import ValLoader
    from yolofeed.pack import open_or_build

    imgsz, batch = 96, 3
    data = check_det_dataset(str(root / "data.yaml"), autodownload=False)
    cfg = get_cfg(overrides={"imgsz": imgsz, "batch": batch, "task": "segment", "overlap_mask": overlap,
                             "mask_ratio": 4})
    ds = build_yolo_dataset(cfg, data["val"], batch, data, mode="val", rect=True, stride=32)
    theirs = list(build_dataloader(ds, batch, 0, shuffle=False, rank=-1))
    pack = open_or_build(root / "data.yaml", "val", imgsz, out=tmp_path / "packs", rebuild="auto", progress=False,
                         task="segment")
    ours = list(ValLoader(pack, batch, "cpu", stride=32, masks=(4, overlap)))
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs):
        assert [Path(f).name for f in a["im_file"]] == [Path(f).name for f in b["im_file"]]
        assert torch.equal(a["img"], b["img"])
        for key in ("cls", "bboxes", "batch_idx", "sem_masks"):
            assert torch.equal(a[key], b[key]), key
        assert a["masks"].shape == b["masks"].shape and torch.equal(a["masks"].float(), b["masks"].float())
        assert int((b["masks"] > 0).sum()) > 0


@pytest.mark.parametrize("overlap", (True, False))
def test_val_batches_equal_ultralytics_segment_val_loader(segment_root, tmp_path, overlap):
    """The validator's batch: rect batches, letterboxed, the polygons resampled and moved as the boxes are, then
    Format's masks at the batch's shape and its label order: equal to Ultralytics' segment val loader's."""
    _assert_val_batches_equal(copy_dataset(segment_root, tmp_path / "seg"), tmp_path, overlap)


def test_a_polygon_row_of_one_point_is_kept_as_ultralytics_keeps_it(segment_root, tmp_path):
    """A row ``class x y`` among polygon rows is a polygon of one point to ``verify_image_label`` (a zero-size box,
    kept, counted by the validator): the pack keeps it too, opens (it once refused its own build as damaged, "fewer
    than 3 points", and its rebuild command rebuilt the same pack), and its validation batches equal stock's."""
    root = copy_dataset(segment_root, tmp_path / "seg")
    for i, lf in enumerate(sorted((root / "labels" / "val").glob("*.txt"))):
        lf.write_text(lf.read_text().rstrip("\n") + f"\n{i % 3} 0.{i + 2}1 0.{i + 3}7\n")
    _assert_val_batches_equal(root, tmp_path, overlap=False)  # with overlap, tied areas sort as the machine does


def test_copy_paste_mixup_mode_and_odd_mask_ratios_are_refused_in_one_line(segment_dataset, tmp_path):
    from yolofeed.train import FastSegmentationTrainer

    base = dict(model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path / "runs"),
                **TINY)
    with pytest.raises(ConfigError, match=r"^copy_paste_mode=mixup: yolofeed builds copy-paste's flip mode only"):
        FastSegmentationTrainer(overrides={**base, "copy_paste": 0.5, "copy_paste_mode": "mixup"})
    with pytest.raises(ConfigError, match=r"^mask_ratio=3: yolofeed makes masks by a whole ratio"):
        FastSegmentationTrainer(overrides={**base, "mask_ratio": 3})
    assert not (tmp_path / "runs").exists()  # refused before the run folder


def _first_raw(trainer) -> dict:
    """The training loader's first item (batches of 4), the loader closed after it."""
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
    try:
        return next(iter(loader))
    finally:
        loader.close()


def test_copy_paste_trains_a_segment_batch_with_its_copies(segment_dataset, tmp_path):
    """copy_paste=1.0 on a segment run: the same draws (copy-paste makes none), every eligible copy pasted, so the
    first batch holds more instances than without it, each with its mask; nothing left out (the masks' overflow)."""
    from yolofeed.train import FastSegmentationTrainer

    counts = []
    for p in (0.0, 1.0):
        trainer = FastSegmentationTrainer.with_options(augment_ahead=False)(overrides=dict(
            model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name=f"cp{p}",
            epochs=1, seed=3, copy_paste=p, **TINY))
        batch = trainer.preprocess_batch(_first_raw(trainer))
        assert trainer.hyp.copy_paste == p
        counts.append(len(batch["cls"]))
        assert batch["masks"].shape[0] == 4 and int(batch["masks"].amax()) >= 1
        assert int(trainer._dropped) == 0
    assert counts[1] > counts[0]


def test_a_segment_model_on_box_labels_is_refused_in_one_line(synth_root, tmp_path, capsys):
    """A detection dataset (rows of class x y w h) has no polygons to make masks of: one line that says so, from
    yolofeed train, and from the Python API before the run folder."""
    from yolofeed.cli import main
    from yolofeed.train import FastSegmentationTrainer

    data = str(synth_root / "data.yaml")
    assert main(["train", "model=yolo11n-seg.yaml", f"data={data}", "imgsz=64", "epochs=1", "device=cpu",
                 f"project={tmp_path / 'cli'}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "box rows" in err[0] and "polygon" in err[0], err
    with pytest.raises(DatasetError, match="box rows") as e:
        FastSegmentationTrainer(overrides=dict(model="yolo11n-seg.yaml", data=data, project=str(tmp_path / "api"),
                                               **TINY))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "cli").exists() and not (tmp_path / "api").exists()


@pytest.mark.slow
def test_a_segment_model_trains_through_the_cli_and_the_api_and_writes_ultralytics_files(segment_dataset, tmp_path):
    """Two epochs through ``yolofeed train`` and through ``YOLO(...).train(trainer=FastSegmentationTrainer)``: each
    writes results.csv with stock's segment columns (a stock run's), and a best.pt and last.pt that Ultralytics'
    ``YOLO(best.pt).val()`` reads as a segment model."""
    from ultralytics import YOLO
    from ultralytics.models.yolo.segment import SegmentationTrainer

    from yolofeed.cli import main
    from yolofeed.train import FastSegmentationTrainer

    data = str(segment_dataset / "data.yaml")
    YOLO("yolo11n-seg.yaml").train(trainer=SegmentationTrainer, data=data, project=str(tmp_path), name="stock",
                                   epochs=1, **TINY)
    stock = _columns(tmp_path / "stock")
    assert "train/seg_loss" in stock and "metrics/mAP50-95(M)" in stock
    seen = []
    api = YOLO("yolo11n-seg.yaml")
    api.add_callback("on_train_batch_end", lambda t: seen.append(t.batch_images))
    api.train(trainer=FastSegmentationTrainer, data=data, project=str(tmp_path), name="api", epochs=2, **TINY)
    assert seen and all(n > 0 for n in seen)
    assert main(["train", "model=yolo11n-seg.yaml", f"data={data}", "epochs=2", "imgsz=64", "batch=4", "device=cpu",
                 "plots=False", f"project={tmp_path}", "name=cli"]) == 0
    for run in ("api", "cli"):
        assert _columns(tmp_path / run) == stock
        with open(tmp_path / run / "results.csv") as f:
            assert len(f.read().strip().splitlines()) == 3  # the header and two epochs
        assert (tmp_path / run / "weights" / "last.pt").is_file()
        best = YOLO(str(tmp_path / run / "weights" / "best.pt"))
        assert best.task == "segment"
        metrics = best.val(data=data, imgsz=64, device="cpu", plots=False, verbose=False)
        assert metrics.seg is not None  # yolo val reads yolofeed's best.pt as a segment model


@pytest.mark.slow
def test_bench_compares_a_segment_model_with_stock(segment_dataset, tmp_path):
    import json

    from ultralytics.models.yolo.segment import SegmentationTrainer

    from yolofeed.bench.modes import trainer_class
    from yolofeed.cli import main
    from yolofeed.train import FastSegmentationTrainer

    assert trainer_class("stock", task="segment") is SegmentationTrainer
    assert issubclass(trainer_class("yolofeed", task="segment"), FastSegmentationTrainer)
    assert main(["bench", "model=yolo11n-seg.yaml", f"data={segment_dataset / 'data.yaml'}", "modes=yolofeed,stock",
                 "steps=4", "warmup=2", "window=2", "imgsz=64", "batch=4", "device=cpu", f"out={tmp_path / 'b'}"]) == 0
    results = json.loads((tmp_path / "b" / "bench.json").read_text())["results"]
    assert [r["mode"] for r in results] == ["yolofeed", "stock"] and all(r["images_per_s"] > 0 for r in results)


def test_dropped_rasteriser_events_are_read_once_an_epoch_warned_and_given_room(segment_dataset, tmp_path,
                                                                                monkeypatch, caplog):
    """Too few event slots for the polygons: the batches still train (no check per step, nothing read), the epoch's
    end reads the sum once, warns in one line and doubles the rasteriser's slots, with a new augmenter."""
    from yolofeed.kernels import polyfill
    from yolofeed.train import FastSegmentationTrainer

    monkeypatch.setattr(polyfill, "default_events", lambda points, height, ratio: 3)  # far too few
    trainer = FastSegmentationTrainer.with_options(augment_ahead=False)(overrides=dict(
        model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name="r", epochs=1,
        **TINY))
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
    try:
        for _, raw in zip(range(2), loader):
            trainer.preprocess_batch(raw)
    finally:
        loader.close()
    dropped = trainer._dropped
    assert isinstance(dropped, torch.Tensor) and dropped.dim() == 0 and int(dropped) > 0
    trainer.epoch, trainer.epochs = 0, 3
    caplog.clear()
    with caplog.at_level("WARNING"):
        trainer._check_masks()
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 1 and "\n" not in lines[0] and "2x its default slots" in lines[0]
    assert trainer.mask_room == 2 and trainer._augment is None and trainer._dropped is None
    assert trainer._new_augment().room == 2
    assert options.read(Path(trainer.save_dir) / options.FILE)["mask_room"] == 2  # a resume keeps the room
    trainer._dropped, trainer.epoch = torch.tensor(5), trainer.epochs - 1  # the last epoch: no next one to promise
    caplog.clear()
    with caplog.at_level("WARNING"):
        trainer._check_masks()
    line = next(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "next epoch" not in line and "mask_room=4" in line


def test_the_capacity_is_learnt_from_the_first_epochs_batches(segment_dataset, tmp_path, monkeypatch, caplog):
    """After an epoch without an overflow the rasteriser's capacity is learnt (``MaskedAugment.learnt`` of the most
    instances a batch held, read once at the epoch's end) where it is below the capacity in use, the augmenter made
    again with it; its masks equal those of every slot. Once: not again after a later epoch, and a learnt capacity
    that falls short goes back to the label bound for good, the room left as it is."""
    from yolofeed.augment import masks
    from yolofeed.train import FastSegmentationTrainer

    monkeypatch.setattr(masks, "FEW_DRAWS", 1)  # the tiny set's batches of 4 use a capacity too,
    monkeypatch.setattr(masks, "mask_capacity", lambda *a, **k: 1024)  # a label bound as a large set's
    trainer = FastSegmentationTrainer.with_options(augment_ahead=False, partner_pool=0)(overrides=dict(
        model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name="l", epochs=5,
        **TINY))
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
    try:
        sources = [raw["source"] for _, raw in zip(range(3), loader)]
    finally:
        loader.close()
    held = [int(trainer._augment_source(s).valid.sum()) for s in sources]
    bound = trainer._masked.bound(trainer.batch_size)
    assert isinstance(trainer._most, torch.Tensor) and int(trainer._most) == max(held) and bound == 1024
    trainer.epoch = 0
    trainer._check_masks()
    learnt = trainer._masked.learnt(max(held))
    assert learnt < bound and trainer._capacity == learnt and trainer._augment is None and learnt % 128 == 0
    aug = trainer._new_augment()
    assert aug.capacity == learnt
    every = masks.MaskedAugment(aug.hyp, aug.mask_ratio, aug.overlap)
    p = aug.sample(4, torch.Generator().manual_seed(2))
    got, want = aug.apply(sources[0], p), every.apply(sources[0], p)
    assert torch.equal(got.masks.masks, want.masks.masks) and int(got.masks.overflow) == int(got.masks.past) == 0
    trainer._augmenter()
    trainer._augment_source(sources[1])
    trainer._most = torch.tensor(10 * max(held))  # a second epoch's larger batches: not learnt again
    trainer.epoch = 1
    trainer._check_masks()
    assert trainer._capacity == learnt and trainer._augment is not None
    trainer._augment_source(sources[2])
    trainer._past = torch.tensor(3)  # the learnt capacity fell short
    with caplog.at_level("WARNING"):
        trainer._check_masks()
    assert trainer._capacity is None and trainer.mask_room == 1 and "3 instances beyond" in caplog.text
    trainer._augment_source(sources[0])
    trainer.epoch = 3
    trainer._check_masks()
    assert trainer._capacity is None  # not learnt again


def test_the_capacity_is_learnt_whatever_the_epochs_last_batch(segment_dataset, tmp_path, monkeypatch):
    """The learnt capacity is compared with the full batch's label bound, not the last batch's (an epoch's last batch
    is often smaller, or below FEW_DRAWS): learnt in either order of the batches."""
    from yolofeed.augment import masks
    from yolofeed.train import FastSegmentationTrainer

    monkeypatch.setattr(masks, "mask_capacity", lambda batch, *a, **k: 256 * batch)  # a large set's bound
    for order in ((4, 2), (2, 4)):
        trainer = FastSegmentationTrainer.with_options(augment_ahead=False, partner_pool=0)(overrides=dict(
            model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name="o",
            epochs=3, **TINY))
        monkeypatch.setattr(masks, "FEW_DRAWS", 16)  # the batch of 4 (16 source images) uses it, that of 2 not
        source = _first_raw(trainer)["source"]
        for n in order:
            trainer._augment_source(type(source)(*(None if t is None else t[:n] for t in (
                source.images, source.hw, source.cls, source.boxes, source.valid, source.keypoints, source.corners,
                source.polygons, source.polygon_lengths))))
        trainer.epoch = 0
        trainer._check_masks()
        assert trainer._capacity is not None and trainer._capacity < 1024 and trainer._augment is None, order


def test_small_batches_rasterise_every_slot(segment_dataset, tmp_path):
    """Few source images a batch (batch x tiles below FEW_DRAWS): one crowded image drawn again and again is beyond
    any bound from the label counts, so every slot is rasterised; nothing is past a capacity."""
    from yolofeed.train import FastSegmentationTrainer

    trainer = FastSegmentationTrainer.with_options(augment_ahead=False, partner_pool=0)(overrides=dict(
        model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name="f", epochs=2,
        **TINY))
    source = _first_raw(trainer)["source"]
    out = trainer._augment_source(source)
    assert trainer._masked.labels is not None and trainer._masked.bound(4) is None and int(out.masks.past) == 0


def test_an_overflow_that_cannot_be_recorded_is_warned_and_training_goes_on(segment_dataset, tmp_path, monkeypatch,
                                                                            caplog):
    """The room doubled after an overflow is recorded for a resume; a run folder that cannot take it (read-only, a
    full disk) is one more warning, not the end of the run. At mask_room's most the room stays, and the warning says
    what would help."""
    from yolofeed.train import FastSegmentationTrainer

    trainer = FastSegmentationTrainer.with_options(augment_ahead=False)(overrides=dict(
        model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name="w", epochs=3,
        **TINY))

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(options, "record", refuse)
    trainer._dropped, trainer.epoch = torch.tensor(7), 0
    with caplog.at_level("WARNING"):
        trainer._check_masks()
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert trainer.mask_room == 2 and len(lines) == 2 and "7 polygons" in lines[0]
    assert "could not record mask_room=2" in lines[1] and "Permission denied" in lines[1]
    trainer.mask_room, trainer._dropped = options.MASK_ROOM_MOST, torch.tensor(3)
    caplog.clear()
    with caplog.at_level("WARNING"):
        trainer._check_masks()
    line = next(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert trainer.mask_room == options.MASK_ROOM_MOST and "already at its most" in line and "simplify" in line


def test_mask_room_is_bounded():
    for bad in (0, options.MASK_ROOM_MOST + 1, 2 ** 40):
        with pytest.raises(ConfigError, match=f"mask_room={bad}: expected a whole number from 1 to 64"):
            options.check({"mask_room": bad})
    options.check({"mask_room": options.MASK_ROOM_MOST})


def _agree(rank: int, port: int, counts: list[int], out) -> None:
    import torch.distributed as dist

    from yolofeed.train.tasks import ranks_agree

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out.put((rank, ranks_agree(torch.tensor(counts)).tolist()))
    finally:
        dist.destroy_process_group()


def test_ranks_agree_on_the_masks_epoch_counts():
    """Under DDP every rank takes the same decision at an epoch's end: the events dropped and the instances past the
    capacity on any rank (summed) and the most a batch held on any rank, so that a room doubled on rank 1 is rank 0's
    to record too."""
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_agree, args=(r, port, counts, out))
             for r, counts in enumerate(([0, 2, 900], [5, 0, 1200]))]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    assert got == {0: [5, 2, 1200], 1: [5, 2, 1200]}


def test_a_resumed_run_draws_on_from_its_start_epoch_not_epoch_ones_draws(segment_dataset, tmp_path):
    """The augmentation's generator state is not in the checkpoint: a run resumed at epoch e seeds it from the seed, the
    rank and e, not the seed alone (which would replay epoch 1's draws); a fresh run seeds as before."""
    from yolofeed.train import FastSegmentationTrainer

    trainer = FastSegmentationTrainer.with_options(augment_ahead=False, partner_pool=0)(overrides=dict(
        model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name="s", epochs=3,
        **TINY))
    trainer._augmenter()
    assert trainer._generator.initial_seed() == trainer.args.seed
    trainer._augment, trainer._generator, trainer.start_epoch = None, None, 2
    trainer._augmenter()
    assert trainer._generator.initial_seed() == trainer.args.seed + 2 * 1_000_003


def test_learnt_capacity_is_a_margin_over_the_most_in_whole_chunks():
    from yolofeed.augment.masks import learnt_capacity

    assert learnt_capacity(0) == 128 and learnt_capacity(100) == 256 and learnt_capacity(1931) == 2944
    assert learnt_capacity(85) == 128 and learnt_capacity(86) == 256  # 1.5 x 85 + 1 = 128.5


def test_a_new_augmenter_continues_the_draws(segment_dataset, tmp_path):
    """An augmenter made again (close_mosaic, more mask room, a new loader) draws on from the same generator: its
    first batch is not the first augmenter's first batch again, and equals what the first augmenter would have
    drawn next."""
    from yolofeed.train import FastSegmentationTrainer

    trainer = FastSegmentationTrainer.with_options(augment_ahead=False, partner_pool=0)(overrides=dict(
        model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name="g", epochs=1,
        **TINY))
    source = _first_raw(trainer)["source"]
    first = trainer._augment_source(source).img.clone()
    state = trainer._generator.get_state()
    second = trainer._augment_source(source).img.clone()
    trainer._augment = None
    trainer._generator.set_state(state)
    again = trainer._augment_source(source).img
    assert not torch.equal(first, second) and torch.equal(again, second)


def test_the_training_masks_rasterise_the_instances_not_the_padding(segment_dataset, tmp_path, monkeypatch):
    """Once the training loader exists the augmenter rasterises a bound of the instances a batch can hold (from the
    training images' label counts), not every padded slot; those batches equal the ones that fill every slot, and a
    capacity below a batch's instances is counted as past it (the epoch end then gives it room)."""
    from yolofeed.augment import masks
    from yolofeed.train import FastSegmentationTrainer

    monkeypatch.setattr(masks, "FEW_DRAWS", 1)  # the tiny set's batches of 4 use a capacity too
    trainer = FastSegmentationTrainer.with_options(augment_ahead=False)(overrides=dict(
        model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name="c", epochs=1,
        **TINY))
    assert trainer._new_augment().labels is None  # no loader yet: every slot
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
    try:
        counts = loader.prefetcher.labels.count
        aug = trainer._new_augment()
        assert aug.labels == pytest.approx((counts.mean(), counts.std(), counts.max()))
        source = next(iter(loader))["source"]
    finally:
        loader.close()
    every = masks.MaskedAugment(aug.hyp, aug.mask_ratio, aug.overlap)
    p = aug.sample(4, torch.Generator().manual_seed(1))
    got, want = aug.apply(source, p), every.apply(source, p)
    assert int(want.valid.sum()) > 0 and torch.equal(got.masks.masks, want.masks.masks)
    assert torch.equal(got.cls, want.cls) and int(got.masks.overflow) == 0
    monkeypatch.setattr(masks, "mask_capacity", lambda *a, **k: 1)
    short = aug.apply(source, p).masks
    assert int(short.past) == int(want.valid.sum()) - 1 and int(short.overflow) == 0


def _segment_source(segment_root, tmp_path, device: str, n: int = 8):
    from yolofeed.loader import TrainLoader
    from yolofeed.pack import open_or_build

    pack = open_or_build(segment_root / "data.yaml", "train", 96, out=tmp_path / "packs", rebuild="auto",
                         progress=False, task="segment")
    loader = TrainLoader(pack, n, device, seed=3)
    try:
        return next(iter(loader))["source"]
    finally:
        loader.close()


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", (True, False))
def test_graphed_masked_augmentation_equals_masks_made_after_it_without_host_sync(segment_root, tmp_path, overlap):
    """Under GraphedAugment the masks are made inside the augmentation's graph: the same batch as the graphed plain
    augmentation (the same draws) with ``with_masks`` applied after it, eagerly; its Ultralytics batch (the count
    known) is made without a host sync, and a second replay does not change the first batch's copy."""
    from helpers import no_host_sync
    from yolofeed.augment import AugmentHyp, GpuAugment
    from yolofeed.augment.graphs import GraphedAugment
    from yolofeed.augment.masks import MaskedAugment, with_masks

    source = _segment_source(segment_root, tmp_path, "cuda")
    hyp = AugmentHyp(imgsz=96, degrees=5.0, mixup=0.3)
    plain = GraphedAugment(GpuAugment(hyp), seed=7)(source)
    ref = with_masks(plain, 4, overlap).to_ultralytics()
    graphed = GraphedAugment(MaskedAugment(hyp, 4, overlap), seed=7)
    out = graphed(source)
    total = int(out.valid.sum())
    with no_host_sync():
        got = out.to_ultralytics(total=total)
    for key in ("cls", "bboxes", "batch_idx", "masks", "sem_masks"):
        assert torch.equal(got[key], ref[key]), key
    kept = got["masks"].clone()
    graphed(source)  # the next replay overwrites the graph's memory, not the batch handed out
    assert torch.equal(got["masks"], kept) and int(out.masks.overflow) == 0


@pytest.mark.gpu
def test_a_segment_model_trains_on_cuda_with_the_graphed_paths(segment_dataset, tmp_path):
    """Two epochs on one GPU with every default on: the augmentation graphed and one batch ahead, the step's forward
    and backward replayed as a CUDA graph (nbs = batch: no accumulation), validations beside; the masks' overflow is
    read at each epoch's end; the run writes stock's files with finite segment losses."""
    from ultralytics import YOLO

    from yolofeed import ultralytics_seam as seam
    from yolofeed.train import FastSegmentationTrainer

    model = YOLO("yolo11n-seg.yaml")
    seen = {}  # at the run's end, before the trainer lets go of its graph (test_notebook.py)
    model.add_callback("on_train_end", lambda t: seen.update(graph=seam.unwrap_model(t.model).__dict__.get("_graph")))
    model.train(trainer=FastSegmentationTrainer, data=str(segment_dataset / "data.yaml"), project=str(tmp_path),
                name="gpu", epochs=2, imgsz=64, batch=4, nbs=4, device=0, workers=0, plots=False, verbose=False)
    trainer = model.trainer
    graph = seen["graph"]
    assert graph is not None and graph.flat is not None and not graph.failed  # the graphed step served
    assert trainer._dropped is None and trainer.mask_room == 1  # read at the epochs' ends, nothing dropped
    with open(tmp_path / "gpu" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(np.isfinite(float(r["train/seg_loss"])) for r in rows)


def test_a_polygon_longer_than_ultralytics_1000_points_is_named_with_its_cost(segment_dataset, tmp_path, caplog):
    """Every training batch is padded to the pack's longest polygon (static shapes): one outline of 1,500 points in
    one image makes every step's polygon and mask work and memory 1.5x. The run names that file and the fix once,
    rather than train slower silently; a pack of short polygons says nothing."""
    from yolofeed.train import FastSegmentationTrainer

    def warnings_of(name):
        t = FastSegmentationTrainer.with_options(augment_ahead=False)(overrides=dict(
            model="yolo11n-seg.yaml", data=str(segment_dataset / "data.yaml"), project=str(tmp_path), name=name,
            epochs=1, **TINY))
        caplog.clear()
        with caplog.at_level("WARNING"):
            t.get_dataloader(t.data["train"], batch_size=4, rank=-1, mode="train").close()
        return [r.getMessage() for r in caplog.records if "has a polygon of" in r.getMessage()]

    assert warnings_of("short") == []
    label = sorted((segment_dataset / "labels" / "train").glob("*.txt"))[2]
    a = np.linspace(0, 2 * np.pi, 1500, endpoint=False)
    ring = " ".join(f"{0.5 + 0.2 * np.cos(t):.5f} {0.5 + 0.2 * np.sin(t):.5f}" for t in a)
    label.write_text(label.read_text() + f"1 {ring}\n")
    said = warnings_of("long")
    assert len(said) == 1 and label.stem in said[0] and "1,500 points" in said[0] and "1.5x" in said[0], said
    assert "memory" in said[0], said



def test_a_segment_run_takes_the_sync_free_segment_loss_with_its_counts(segment_dataset, tmp_path, monkeypatch):
    """FastSegmentationTrainer (sync_free_loss, the default) swaps in SyncFreeSegmentLoss; after the first two
    batches every loss call has the counts AugmentAhead read a step early, its mask loss runs on them, and every
    epoch's check finds them right."""
    from ultralytics import YOLO

    from yolofeed.train import FastSegmentationTrainer
    from yolofeed.train import loss as sfl

    calls = {"counted": 0, "measured": 0}
    own = sfl.SyncFreeSegmentLoss._segmentation_loss
    checks = []
    check = sfl.check_counts

    def spy(self, *a, **k):
        calls["counted"] += 1
        return own(self, *a, **k)

    monkeypatch.setattr(sfl.SyncFreeSegmentLoss, "_segmentation_loss", spy)
    monkeypatch.setattr(sfl, "check_counts", lambda model: checks.append(check(model)) or checks[-1])
    model = YOLO("yolo11n-seg.yaml")
    losses = []  # at the run's end, before the trainer unsets the loss (test_notebook.py)
    model.add_callback("on_train_end", lambda t: losses.extend(type(x) for x in sfl.detection_losses(t.model)))
    model.train(trainer=FastSegmentationTrainer, data=str(segment_dataset / "data.yaml"), project=str(tmp_path),
                name="s", epochs=2, val=False, **TINY)
    assert losses == [sfl.SyncFreeSegmentLoss]
    assert calls["counted"] >= 2 and checks == [True, True]
