"""FastPoseTrainer on the CPU: a pose model trains from a pose pack, its batches carry keypoints to Ultralytics' pose
loss, and it writes what ``yolo train`` writes for pose; the trainer of one task refuses a model of another."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from yolofeed.errors import ConfigError

TINY = dict(epochs=1, imgsz=64, batch=8, device="cpu", workers=0, plots=False, verbose=False, exist_ok=True)


def _columns(run: Path) -> list[str]:
    with open(run / "results.csv") as f:
        return next(csv.reader(f))


@pytest.mark.slow
def test_a_pose_model_trains_from_a_pose_pack_and_writes_ultralytics_pose_files(pose_dataset, tmp_path):
    from ultralytics import YOLO
    from ultralytics.models.yolo.pose import PoseTrainer

    from yolofeed import FastPoseTrainer
    from yolofeed.pack import Pack

    seen = []

    def keypoints_reach_the_loss(trainer):  # the batch the step trains on (Ultralytics' batch, after preprocess)
        seen.append(trainer.batch_images)

    stock = YOLO("yolo11n-pose.yaml")
    stock.train(trainer=PoseTrainer, data=str(pose_dataset / "data.yaml"), project=str(tmp_path), name="stock", **TINY)
    ours = YOLO("yolo11n-pose.yaml")
    ours.add_callback("on_train_batch_end", keypoints_reach_the_loss)
    ours.train(trainer=FastPoseTrainer, data=str(pose_dataset / "data.yaml"), project=str(tmp_path), name="ours",
               **TINY)
    assert seen and all(n > 0 for n in seen)
    assert _columns(tmp_path / "ours") == _columns(tmp_path / "stock")  # the pose columns: pose_loss, kobj, (P) metrics
    assert "train/pose_loss" in _columns(tmp_path / "ours") and "metrics/mAP50-95(P)" in _columns(tmp_path / "ours")
    packs = list(pose_dataset.glob("yolofeed-packs/*-pose/train.yfpack"))
    assert len(packs) == 1 and Pack.open(packs[0]).header["task"] == "pose"
    best = YOLO(str(tmp_path / "ours" / "weights" / "best.pt"))
    assert best.task == "pose"
    metrics = best.val(data=str(pose_dataset / "data.yaml"), imgsz=64, device="cpu", plots=False, verbose=False)
    assert metrics.pose is not None  # yolo val reads yolofeed's best.pt as a pose model


def test_the_batches_carry_the_keypoints_ultralytics_pose_loss_reads(pose_dataset, tmp_path):
    """One augmented batch of FastPoseTrainer's loader, through Ultralytics' own pose loss: the keypoints are there,
    row-aligned with the boxes, normalised, and the loss is finite."""
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import PoseModel

    from yolofeed import FastPoseTrainer

    trainer = FastPoseTrainer(overrides=dict(model="yolo11n-pose.yaml", data=str(pose_dataset / "data.yaml"),
                                             project=str(tmp_path), name="r", **TINY))
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=8, rank=-1, mode="train")
    try:
        batch = trainer.preprocess_batch(next(iter(loader)))
    finally:
        loader.close()
    n = len(batch["cls"])
    assert n > 0 and batch["keypoints"].shape == (n, 5, 3) and len(batch["bboxes"]) == n
    xy = batch["keypoints"][..., :2]
    assert xy.min() >= 0 and xy.max() <= 1  # Format's normalised pixels
    model = PoseModel("yolo11n-pose.yaml", nc=trainer.data["nc"], data_kpt_shape=(5, 3), verbose=False)
    model.args = get_cfg()
    loss, items = model.loss(batch, model(batch["img"]))
    assert torch.isfinite(loss).all() and items["pose_loss"] > 0


def test_a_trainer_refuses_a_model_of_another_task_in_one_line(synth_root, tmp_path):
    from yolofeed import FastDetectionTrainer, FastPoseTrainer

    data = str(synth_root / "data.yaml")
    with pytest.raises(ConfigError, match="is a pose model: train it with yolofeed's FastPoseTrainer"):
        FastDetectionTrainer(overrides=dict(model="yolo11n-pose.yaml", data=data, project=str(tmp_path), **TINY))
    with pytest.raises(ConfigError, match="trains detection, segmentation, pose and oriented-box models"):
        FastPoseTrainer(overrides=dict(model="yolo11n-cls.yaml", data=data, project=str(tmp_path), **TINY))
    with pytest.raises(ConfigError, match="is a segmentation model: train it with yolofeed's FastSegmentationTrainer"):
        FastPoseTrainer(overrides=dict(model="yolo11n-seg.yaml", data=data, project=str(tmp_path), **TINY))
    with pytest.raises(ConfigError, match="is a detection model, and this run is task=pose: pick a pose model"):
        FastPoseTrainer(overrides=dict(model="yolo11n.yaml", data=data, project=str(tmp_path), **TINY))
    assert not list(tmp_path.iterdir())  # refused before the run folder


def test_the_keypoint_loss_gains_reach_ultralytics_pose_loss_unchanged(pose_dataset, tmp_path):
    """``pose``, ``kobj`` and ``rle`` are Ultralytics' (train/keys.py: stock): its pose loss, built as PoseTrainer
    builds it, reads the values given."""
    from yolofeed import FastPoseTrainer

    trainer = FastPoseTrainer(overrides=dict(model="yolo11n-pose.yaml", data=str(pose_dataset / "data.yaml"),
                                             project=str(tmp_path), name="r", pose=6.0, kobj=2.0, rle=0.5, **TINY))
    trainer.model = trainer.get_model(cfg="yolo11n-pose.yaml", verbose=False)
    trainer.set_model_attributes()
    hyp = trainer.model.init_criterion().hyp
    assert (hyp.pose, hyp.kobj, hyp.rle) == (6.0, 2.0, 0.5)


@pytest.mark.parametrize("command", ["doctor", "bench", "parity"])
def test_doctor_bench_and_parity_refuse_a_model_of_a_task_yolofeed_does_not_train(pose_dataset, tmp_path, capsys,
                                                                                  command):
    from yolofeed.cli import main

    assert main([command, "model=yolo11n-cls.yaml", f"data={pose_dataset / 'data.yaml'}", "device=cpu",
                 f"out={tmp_path / 'out'}"]) != 0
    assert ("is a classification model: yolofeed doctor, bench and parity take detection, pose, oriented-box and "
            "segmentation models" in capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bench_compares_a_pose_model_with_its_own_trainers(pose_dataset, tmp_path):
    """yolofeed's pose trainer and the pose ceiling (replayed batches with their keypoints) train a pose model's
    steps side by side; stock is Ultralytics' PoseTrainer (bench/modes.py)."""
    import json

    from ultralytics.models.yolo.pose import PoseTrainer

    from yolofeed.bench.ceiling import CeilingPoseTrainer
    from yolofeed.bench.modes import trainer_class
    from yolofeed.cli import main
    from yolofeed.train import FastPoseTrainer

    assert trainer_class("stock", task="pose") is PoseTrainer
    assert trainer_class("ceiling", task="pose") is CeilingPoseTrainer
    assert issubclass(trainer_class("yolofeed", task="pose"), FastPoseTrainer)
    assert main(["bench", "model=yolo11n-pose.yaml", f"data={pose_dataset / 'data.yaml'}", "modes=yolofeed,ceiling",
                 "steps=4", "warmup=2", "window=2", "imgsz=64", "batch=4", "device=cpu", f"out={tmp_path / 'b'}"]) == 0
    results = json.loads((tmp_path / "b" / "bench.json").read_text())["results"]
    assert [r["mode"] for r in results] == ["yolofeed", "ceiling"] and all(r["images_per_s"] > 0 for r in results)
