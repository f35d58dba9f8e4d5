"""The sync-free step (train/step.py): loss items one step late, without a host sync, and an exact epoch mean."""

from __future__ import annotations

import copy
import csv

import pytest
import torch

from helpers import no_host_sync
from yolofeed.train.step import HostLossItems


class FakeLoss:
    """A criterion whose items are the call count: (box, cls) = (n, 10 n)."""

    def __init__(self):
        self.n = 0
        self.updated = False

    def update(self):
        self.updated = True

    def __call__(self, preds, batch):
        self.n += 1
        items = {"box": torch.tensor(float(self.n)), "cls": torch.tensor(10.0 * self.n)}
        return sum(items.values()) * 2, items


def test_items_come_one_step_late_the_loss_does_not():
    crit = HostLossItems(FakeLoss())
    seen = []
    for _ in range(4):
        loss, items = crit(None, {})
        seen.append((float(loss), float(items["box"]), float(items["cls"])))
    # the loss is this step's (for the backward pass); the items are the previous step's, the first step's own
    assert seen == [(22.0, 1.0, 10.0), (44.0, 1.0, 10.0), (66.0, 2.0, 20.0), (88.0, 3.0, 30.0)]


def test_epoch_mean_is_exact_and_resets():
    crit = HostLossItems(FakeLoss())
    assert crit.epoch_mean() is None
    for _ in range(4):
        crit(None, {})
    mean = crit.epoch_mean()
    assert list(mean) == ["box", "cls"] and float(mean["box"]) == 2.5 and float(mean["cls"]) == 25.0
    crit.reset()
    crit(None, {})
    assert float(crit.epoch_mean()["box"]) == 5.0


def test_proxy_passes_the_criterions_attributes_and_copies():
    crit = HostLossItems(FakeLoss())
    crit.update()  # YOLO26's end-to-end loss is updated at each epoch's end through the proxy
    assert crit.criterion.updated and hasattr(crit, "update") and not hasattr(crit, "nothing_like_this")
    twin = copy.deepcopy(crit)
    assert twin.criterion is not crit.criterion and twin.n == 0


def test_a_step_in_flight_is_never_copied_or_pickled():
    """Ultralytics deep-copies the model with its criterion (the EMA; the NaN recovery's reload): a CUDA event in
    flight cannot be copied, and made that recovery crash. A lock stands in for the event here."""
    import pickle
    import threading

    crit = HostLossItems(FakeLoss())
    crit(None, {})
    crit._pending = (*crit._pending[:2], threading.Lock())  # what a CUDA step leaves: an uncopyable event
    twin = copy.deepcopy(crit)
    assert twin._pending is None and twin.epoch_mean() is None and twin.criterion is not crit.criterion
    back = pickle.loads(pickle.dumps(crit))
    assert back._pending is None and back.criterion.n == 1


@pytest.mark.slow
def test_results_csv_has_the_exact_epoch_mean_loss(synth_root, tmp_path):
    """results.csv's train losses are the epoch's mean of every step's items, as stock Ultralytics writes them."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    steps: list[dict[str, float]] = []

    class Recording(FastDetectionTrainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.add_callback("on_train_batch_end", self.record)

        def record(self, trainer):
            names, host, _ = trainer.model.criterion._pending  # this step's items, the bar sees them a step later
            steps.append(dict(zip(names, host.tolist())))

    YOLO("yolo11n.yaml").train(trainer=Recording, data=str(synth_root / "data.yaml"), project=str(tmp_path),
                               name="r", epochs=1, imgsz=64, batch=8, device="cpu", workers=0, plots=False,
                               verbose=False, val=False)
    with open(tmp_path / "r" / "results.csv") as f:
        row = next(csv.DictReader(f))
    for name in ("box_loss", "cls_loss", "dfl_loss"):
        expected = sum(s[name] for s in steps) / len(steps)
        assert float(row[f"train/{name}"]) == pytest.approx(expected, abs=1e-5)


@pytest.mark.slow
def test_after_an_epoch_the_items_are_its_exact_mean_on_the_losss_device(synth_root, tmp_path):
    """Ultralytics' validator sums its losses in ``zeros_like(trainer.loss_items)``: after the epoch they must be
    device tensors again (the one-step-late host copies broke validation on CUDA), and the epoch's mean."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    seen = []

    class Recording(FastDetectionTrainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.add_callback("on_train_epoch_end", self.record)  # after yolofeed's own (inserted first)

        def record(self, trainer):
            mean = trainer.model.criterion.epoch_mean()
            seen.append(trainer.loss_items is trainer.tloss and all(
                torch.equal(trainer.loss_items[k], v) and trainer.loss_items[k].device == v.device
                for k, v in mean.items()))

    YOLO("yolo11n.yaml").train(trainer=Recording, data=str(synth_root / "data.yaml"), project=str(tmp_path),
                               name="r", epochs=1, imgsz=64, batch=8, device="cpu", workers=0, plots=False,
                               verbose=False, val=False)
    assert seen == [True]


@pytest.mark.gpu
def test_cuda_training_validates_every_epoch(synth_root, tmp_path):
    """End to end on CUDA with validation (its loss on the EMA) and the defaults: sync-free step and loss."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    YOLO("yolo11n.yaml").train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"), project=str(tmp_path),
                               name="r", epochs=2, close_mosaic=1, imgsz=64, batch=8, device=0, workers=0, plots=False,
                               verbose=False)
    with open(tmp_path / "r" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    assert all(float(r["val/box_loss"]) > 0 and float(r["train/box_loss"]) > 0 for r in rows)


@pytest.mark.gpu
def test_cuda_training_recovers_from_a_nan_loss(synth_root, tmp_path):
    """Ultralytics' NaN recovery reloads last.pt and deep-copies the model, criterion included."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    def poison(trainer):  # the last step of the second epoch reports a NaN loss, once
        if trainer.epoch == 1 and not getattr(trainer, "_poisoned", False):
            trainer._poisoned = True
            trainer.loss = torch.tensor(float("nan"), device=trainer.device)

    attempts = []  # Ultralytics resets its count after the next clean epoch: read it as each epoch starts
    model = YOLO("yolo11n.yaml")
    model.add_callback("on_train_epoch_end", poison)
    model.add_callback("on_train_epoch_start", lambda t: attempts.append(t.nan_recovery_attempts))
    model.train(trainer=FastDetectionTrainer, data=str(synth_root / "data.yaml"), project=str(tmp_path), name="r",
                epochs=3, close_mosaic=1, imgsz=64, batch=8, device=0, workers=0, plots=False, verbose=False)
    assert attempts == [0, 0, 1, 0] and (tmp_path / "r" / "weights" / "last.pt").exists()


@pytest.mark.gpu
def test_items_reach_the_host_without_a_sync():
    """On CUDA only the run's first call waits (for its own items); later calls read last step's copy."""
    dev = torch.device("cuda")

    class GpuLoss(FakeLoss):
        def __call__(self, preds, batch):
            self.n += 1
            items = {"box": torch.full((), float(self.n), device=dev), "cls": torch.full((), 10.0 * self.n, device=dev)}
            return (items["box"] + items["cls"]) * 2, items

    crit = HostLossItems(GpuLoss())
    crit(None, {})  # the first step: one sync, by design
    with no_host_sync():
        loss, items = crit(None, {})
    assert items["box"].device.type == "cpu" and float(items["box"]) == 1.0  # the first step's, already here
    assert float(loss) == 44.0

