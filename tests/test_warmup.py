"""The warm-up before the first epoch: every batch size an epoch trains, and nothing of the training touched."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from yolofeed.augment import AugmentHyp, GpuAugment
from yolofeed.errors import ConfigError
from yolofeed.loader.sampler import EpochSampler
from yolofeed.train import trainer as trainer_module
from yolofeed.train.warmup import batch_sizes, warm_model, warm_up

# a fake trainer's early plans' thread (train/plans.py): none
NO_PLANS = {"_plans": None, "_plans_serve": lambda: None, "_close_plans": lambda: None,
            "_in_plans_thread": lambda fn, *a, **k: fn(*a, **k)}


@pytest.mark.parametrize("n, batch, rank, world, want", [
    (10000, 128, 0, 1, [128, 16]),  # the 10k-image benchmark: 78 full batches and one of 16
    (256, 128, 0, 1, [128]),  # no partial batch: one size
    (10001, 128, 0, 2, [128, 9]),  # DDP: rank 0's shard holds the odd sample, in its last batch
    (10001, 128, 1, 2, [128, 8]),
    (5, 128, 0, 1, [5]),  # a dataset smaller than the batch: one batch, of its size
    (257, 128, 0, 2, [129]),  # rank 0: 129 images, one batch: the odd sample joins the last batch (B + 1)
])
def test_batch_sizes_are_the_epochs_own_full_batch_first(n, batch, rank, world, want):
    sampler = EpochSampler(np.arange(n), batch, rank=rank, world_size=world)
    assert batch_sizes(sampler) == want
    assert set(want) == {len(b) for b in sampler.batches()}


@pytest.fixture(scope="module")
def model():
    from ultralytics.nn.tasks import DetectionModel

    return DetectionModel("yolo11n.yaml", nc=80, verbose=False).train()


def _state(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def test_warm_model_leaves_the_trained_model_as_it_was(model):
    before = _state(model)
    warm_model(model, [4, 2], 64, torch.device("cpu"), amp=False)
    after = _state(model)
    assert before.keys() == after.keys()
    for k in before:  # weights, batch-norm running statistics and their counters
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=0, msg=k)
    assert all(p.grad is None for p in model.parameters()) and model.training


def test_warm_up_draws_nothing_from_the_random_streams(model):
    sampler = EpochSampler(np.arange(10), 4)
    augment = GpuAugment(AugmentHyp.from_args(imgsz=64))
    torch.manual_seed(3)
    np.random.seed(3)
    t, n = torch.get_rng_state(), np.random.get_state()
    parts, after = {}, []
    seconds = warm_up(model, sampler, augment, 3, torch.device("cpu"), amp=False, after_full=lambda: after.append(1),
                      parts=parts)
    assert seconds > 0 and after == [1]
    # the sizes 4 and 2: each part timed, in order, within the whole
    assert list(parts) == ["full_batch_s", "after_full_s", "other_sizes_s", "augmentation_s"]
    assert all(t >= 0 for t in parts.values()) and sum(parts.values()) <= seconds
    assert torch.equal(torch.get_rng_state(), t)
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), n))


@pytest.mark.parametrize("device, enabled, called", [("cuda", True, True), ("cpu", True, False),
                                                     ("cuda", False, False)])
def test_the_trainer_warms_up_before_the_first_epoch_on_cuda_only(model, monkeypatch, device, enabled, called):
    """And on every device, the first epoch's batches start loading first (the epoch a resume starts at)."""
    seen, primed = [], []
    monkeypatch.setattr(trainer_module, "warm_up", lambda *a, **k: seen.append((*a, list(primed))) or 1.0)
    sampler = EpochSampler(np.arange(10000), 128)
    loader = SimpleNamespace(sampler=sampler, prime=lambda: primed.append(sampler.epoch))
    hyp = AugmentHyp.from_args(imgsz=640)
    fake = SimpleNamespace(warm_up=enabled, device=torch.device(device), _warm=(loader, 7), model=model, hyp=hyp,
                           amp=True, args=SimpleNamespace(amp=True), start_epoch=3,
                           _new_augment=lambda: GpuAugment(hyp),  # the task's augmentation (detection's here)
                           _set_up_beside=lambda: None, **NO_PLANS, _short_batches_beside=lambda *a: False,
                           _validations_due=False)
    trainer_module.FastDetectionTrainer._warm_up(fake)
    assert primed == [3]
    assert bool(seen) == called
    if called:
        m, s, augment, width, dev, amp, primed_before = seen[0]
        assert m is model and s is sampler and width == 7 and dev.type == "cuda" and amp is True
        assert primed_before == [3]  # the loading overlaps the warm-up
        assert augment.hyp.imgsz == 640
    assert "warm_up" in trainer_module.FastDetectionTrainer.with_options(warm_up=False).__dict__


def test_the_trainer_warms_up_under_the_steps_autocast_and_skips_a_warm_up_that_fails(model, monkeypatch, caplog):
    seen = []
    sampler = EpochSampler(np.arange(100), 16)

    def fake(amp_key):
        loader = SimpleNamespace(sampler=sampler, prime=lambda: None)
        hyp = AugmentHyp.from_args(imgsz=64)
        return SimpleNamespace(warm_up=True, device=torch.device("cuda"), _warm=(loader, 3), model=model, hyp=hyp,
                               amp=True, args=SimpleNamespace(amp=amp_key), start_epoch=0,
                               _new_augment=lambda: GpuAugment(hyp), _set_up_beside=lambda: None, **NO_PLANS,
                               _short_batches_beside=lambda *a: False, _validations_due=False)

    monkeypatch.setattr(trainer_module, "warm_up", lambda *a, **k: seen.append(a[-1]) or 1.0)
    trainer_module.FastDetectionTrainer._warm_up(fake("bf16"))  # amp=bf16: Ultralytics autocasts to bfloat16
    trainer_module.FastDetectionTrainer._warm_up(fake(True))
    assert seen == [torch.bfloat16, True]

    def out_of_memory(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trainer_module, "warm_up", out_of_memory)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    with caplog.at_level(logging.WARNING):
        trainer_module.FastDetectionTrainer._warm_up(fake(True))  # training goes on
    assert "skipped the warm-up before the first epoch (OutOfMemoryError: CUDA out of memory" in caplog.text

    def one_value(*a, **k):  # a batch of 1 at a size whose last feature map is 1x1: stock fails on it in the epoch too
        raise ValueError("Expected more than 1 value per channel when training, got input size [1, 256, 1, 1]")

    monkeypatch.setattr(trainer_module, "warm_up", one_value)
    with caplog.at_level(logging.WARNING):
        trainer_module.FastDetectionTrainer._warm_up(fake(True))
    assert "skipped the warm-up before the first epoch (ValueError: Expected more than 1 value" in caplog.text

    def silent(*a, **k):
        raise RuntimeError()  # no message at all

    monkeypatch.setattr(trainer_module, "warm_up", silent)
    with caplog.at_level(logging.WARNING):
        trainer_module.FastDetectionTrainer._warm_up(fake(True))
    assert "skipped the warm-up before the first epoch (RuntimeError: )" in caplog.text


def test_after_the_full_batchs_pass_the_hook_runs_then_the_other_sizes(model, monkeypatch):
    """``after_full`` (the trainer's capture ahead and the validations' set-up) comes once the full batch's plans are
    made, before the last batch's, so the set-up runs beside them; once, and with one size too."""
    import yolofeed.train.warmup as warmup

    order = []
    monkeypatch.setattr(warmup, "warm_model", lambda m, sizes, *a: order.append(list(sizes)))
    monkeypatch.setattr(warmup, "warm_augmentation", lambda *a, **k: order.append("augmentation"))
    augment = GpuAugment(AugmentHyp.from_args(imgsz=64))
    cpu = torch.device("cpu")
    warm_up(model, EpochSampler(np.arange(10), 4), augment, 3, cpu, amp=False, after_full=lambda: order.append("hook"))
    assert order == [[4], "hook", [2], "augmentation"]
    order.clear()
    warm_up(model, EpochSampler(np.arange(8), 4), augment, 3, cpu, amp=False, after_full=lambda: order.append("hook"))
    assert order == [[4], "hook", "augmentation"]


def test_the_validations_set_up_starts_in_the_warm_up_only_where_the_step_was_captured_ahead(monkeypatch):
    """``_set_up_beside``: with the step's graph made (or none to make) the validations' thread starts and their
    set-up is queued now; with a graph still to capture in the first epoch (in the global mode, which another
    thread's allocation would break) they wait for it, as before."""
    calls = []

    def fake(graph):
        t = SimpleNamespace(graphed_step=False, model=SimpleNamespace(_graph=graph) if graph else SimpleNamespace(),
                            _capture_ahead=lambda: calls.append("capture"),
                            _start_validation_thread=lambda: calls.append("thread"), _validations=None)
        t._warm_validations = lambda: calls.append("set-up")
        return t

    monkeypatch.setattr(trainer_module, "unwrap_model", lambda m: m)
    for graph, want in ((None, ["capture", "thread"]),  # no graph (graphed_step off): nothing to wait for
                        (SimpleNamespace(flat=object(), failed=False), ["capture", "thread"]),  # captured ahead
                        (SimpleNamespace(flat=None, failed=True), ["capture", "thread"]),  # failed: the step is eager
                        (SimpleNamespace(flat=None, failed=False), ["capture"])):  # to capture in the first epoch
        calls.clear()
        t = fake(graph)
        trainer_module.FastDetectionTrainer._set_up_beside(t)
        assert calls == want, graph
        t._validations = object()
        calls.clear()
        t._validations_due = False
        trainer_module.FastDetectionTrainer._set_up_beside(t)
        assert t._validations_due == ("thread" in want)  # a thread running: its set-up is due at the warm-up's end
        assert "set-up" not in calls  # not queued before the short batches' thread exists


def test_warm_up_copes_with_no_labels_and_no_batches(model):
    augment = GpuAugment(AugmentHyp.from_args(imgsz=64))
    cpu = torch.device("cpu")
    assert warm_up(model, EpochSampler(np.arange(6), 4), augment, 0, cpu, amp=False) > 0  # width 0: no labels
    assert warm_up(model, EpochSampler(np.arange(3), 4, drop_last=True), augment, 2, cpu, amp=False) == 0.0


@pytest.mark.gpu
def test_cuda_warm_up_under_autocast_leaves_the_model_and_the_streams_as_they_were(model):
    dev = torch.device("cuda")
    m = model.to(dev)
    before = _state(m)
    cuda_rng = torch.cuda.get_rng_state(dev)
    warm_up(m, EpochSampler(np.arange(40), 16), GpuAugment(AugmentHyp.from_args(imgsz=128)), 5, dev, amp=True)
    for k, v in _state(m).items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=k)
    assert all(p.grad is None for p in m.parameters())
    assert torch.equal(torch.cuda.get_rng_state(dev), cuda_rng)
    model.to("cpu")


@pytest.mark.parametrize("value", ["False", "no", 0, None])
def test_with_options_refuses_a_bool_option_that_is_not_a_bool(value):
    """with_options(warm_up="False") used to warm up: a non-empty string is true."""
    with pytest.raises(ConfigError, match=f"warm_up={value!r}: expected True or False"):
        trainer_module.FastDetectionTrainer.with_options(warm_up=value)
    with pytest.raises(ConfigError, match="augment_ahead"):
        trainer_module.FastDetectionTrainer.with_options(augment_ahead=value)


def test_an_obb_run_warms_its_augmentation_on_a_blank_batch_of_oriented_boxes():
    from yolofeed.train.warmup import blank_source, warm_augmentation

    src = blank_source(4, 64, 3, torch.device("cpu"), corners=True)
    assert src.kinds() == ("corners",) and src.corners.shape == (4, 3, 4, 2)
    warm_augmentation(GpuAugment(AugmentHyp.from_args(imgsz=64)), 4, 3, torch.device("cpu"), corners=True)


def test_the_warm_up_line_names_the_sizes_set_up_beside_the_first_epoch(model, monkeypatch, caplog):
    """Where the short batches' thread took the other sizes (train/short_batches.py), the line says so."""
    sampler = EpochSampler(np.arange(10000), 128)
    loader = SimpleNamespace(sampler=sampler, prime=lambda: None)
    hyp = AugmentHyp.from_args(imgsz=640)
    fake = SimpleNamespace(warm_up=True, device=torch.device("cuda"), _warm=(loader, 7), model=model, hyp=hyp,
                           amp=True, args=SimpleNamespace(amp=True), start_epoch=0,
                           _new_augment=lambda: GpuAugment(hyp), _set_up_beside=lambda: None, **NO_PLANS,
                           _short_batches_beside=lambda *a: True, _validations_due=False)
    monkeypatch.setattr(trainer_module, "warm_up", lambda *a, **k: 2.0)
    for short, want in ((False, "cuDNN set up for batch sizes 128, 16 in 2.0 s before the first epoch (stock"),
                        (True, "cuDNN set up for batch size 128 in 2.0 s before the first epoch, for 16 beside it")):
        if short:
            model.__dict__["_short"] = object()
        caplog.clear()
        with caplog.at_level(logging.INFO):
            trainer_module.FastDetectionTrainer._warm_up(fake)
        model.__dict__.pop("_short", None)
        assert want in caplog.text


def test_the_validations_set_up_due_is_queued_at_the_warm_ups_end_and_not_after_a_failed_one(model, monkeypatch):
    """Queued once the short batches' thread exists (``_warm_validations`` waits for its set-up); a warm-up that
    failed leaves it to the first epoch's third batch (``_count_to_validation_warm_up``)."""
    sampler = EpochSampler(np.arange(100), 16)
    calls = []

    def fake():
        loader = SimpleNamespace(sampler=sampler, prime=lambda: None)
        hyp = AugmentHyp.from_args(imgsz=64)
        return SimpleNamespace(warm_up=True, device=torch.device("cuda"), _warm=(loader, 3), model=model, hyp=hyp,
                               amp=True, args=SimpleNamespace(amp=True), start_epoch=0,
                               _new_augment=lambda: GpuAugment(hyp), _set_up_beside=lambda: None, **NO_PLANS,
                               _short_batches_beside=lambda *a: False, _validations_due=True,
                               _warm_validations=lambda: calls.append("set-up"))

    def warmed(*a, **k):
        calls.append("warm-up")
        return 1.0

    monkeypatch.setattr(trainer_module, "warm_up", warmed)
    t = fake()
    trainer_module.FastDetectionTrainer._warm_up(t)
    assert calls == ["warm-up", "set-up"] and not t._validations_due

    def out_of_memory(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory.")

    monkeypatch.setattr(trainer_module, "warm_up", out_of_memory)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    calls.clear()
    trainer_module.FastDetectionTrainer._warm_up(fake())
    assert calls == []
