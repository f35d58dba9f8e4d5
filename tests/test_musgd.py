"""FastMuSGD against Ultralytics' MuSGD: the same update, the same state, a skipped step that changes nothing.

The optimisers are built by Ultralytics' own ``build_optimizer`` (its eight groups: Muon matrices, weights, biases and
batch-norm weights, each with the head's ``cv3`` at three times the learning rate) over a narrow yolo11n's parameters,
and fed the same gradients.
"""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import pytest
import torch

from yolofeed import ultralytics_seam as seam
from yolofeed.train.musgd import FastMuSGD
from yolofeed.ultralytics_seam import DetectionModel, DetectionTrainer, MuSGD

# Under a release whose muon_update is not the copy's (8.4.138), yolofeed's trainers keep Ultralytics' own MuSGD:
# FastMuSGD is not compared with it there
SERVED = seam.copy_serves("ultralytics.optim.muon.muon_update")
FAST = FastMuSGD if SERVED else MuSGD  # what yolofeed's trainers step with
copies = pytest.mark.skipif(not SERVED, reason=f"Ultralytics {seam.VERSION}'s muon_update is not FastMuSGD's copy")


@pytest.fixture(scope="module")
def model():
    """yolo11n's layers at a sixteenth of its width (an eighth of its parameters): every kind of parameter and all
    eight of Ultralytics' groups, at a cost 2 CPU cores bear (bf16 Newton-Schulz on the CPU is slow)."""
    from ultralytics.nn.tasks import yaml_model_load

    cfg = {**yaml_model_load("yolo11n.yaml"), "scale": "n", "scales": {"n": [0.5, 0.0625, 1024]}}
    torch.manual_seed(0)
    return DetectionModel(cfg, nc=8, verbose=False)


@pytest.fixture(scope="module")
def full_model():
    """yolo11n itself, for the CUDA tests: the matrix shapes the graph groups in training."""
    torch.manual_seed(0)
    return DetectionModel("yolo11n.yaml", nc=8, verbose=False)


def build(model, fast: bool, lr=0.01, momentum=0.9, decay=5e-4, powers_of_two: bool = False):
    """Ultralytics' MuSGD for ``model`` (a copy), made a FastMuSGD when ``fast``. ``powers_of_two``: every scalar a
    power of two (each group's lr 0.25, muon 0.5, momentum 0.5, decay 0.5), where multiply-then-add is exact."""
    model = copy.deepcopy(model)
    opt = DetectionTrainer.build_optimizer(SimpleNamespace(), model, "MuSGD", lr, momentum, decay)
    assert type(opt) is MuSGD and len(opt.param_groups) == 8
    if powers_of_two:
        opt.muon = 0.5
        for g in opt.param_groups:
            g["lr"], g["momentum"] = 0.25, 0.5
            g["weight_decay"] = 0.5 if g["weight_decay"] else 0.0
    return model, (FastMuSGD.adopt(opt) if fast else opt)


def gradients(model, seed: int, scale: float = 1.0) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = (torch.randn(p.shape, generator=g) * scale).to(p.device, p.dtype)


def steps(model, opt, n: int, warm_up: bool = False, first_seed: int = 0) -> None:
    """``n`` steps; ``warm_up``: lr and momentum moved before each, as Ultralytics' warm-up moves them."""
    for k in range(n):
        if warm_up:
            for g in opt.param_groups:
                g["lr"], g["momentum"] = 0.01 * (k + 1) / n, 0.8 + 0.1 * k / n
        gradients(model, first_seed + k)
        opt.step()


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def same_state(oa, ob) -> bool:
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    return sa.keys() == sb.keys() and all(sa[k].keys() == sb[k].keys() and all(
        torch.equal(sa[k][n], sb[k][n]) for n in sa[k]) for k in sa)


@copies
def test_powers_of_two_give_stocks_bits(model):
    """Where every scalar is a power of two, a product with it is exact, so the one difference from stock (a multiply
    then an add where stock fuses them) vanishes: the parameters and every buffer agree bit for bit."""
    (a, oa), (b, ob) = build(model, False, powers_of_two=True), build(model, True, powers_of_two=True)
    steps(a, oa, 4)
    steps(b, ob, 4)
    assert not same(a, model) and same(a, b) and same_state(oa, ob)
    assert ob._plan is not None  # the planned path stepped, not stock's fallback


@copies
def test_channels_last_parameters_give_stocks_bits_too(model):
    """On CUDA Ultralytics trains in channels-last memory (its channels_last=None default): the convolution filters,
    their gradients and momentum buffers are NHWC, stock's muon_update takes its NHWC path, and so must ours."""
    nhwc = copy.deepcopy(model).to(memory_format=torch.channels_last)
    (a, oa), (b, ob) = build(nhwc, False, powers_of_two=True), build(nhwc, True, powers_of_two=True)
    for m, opt in ((a, oa), (b, ob)):
        for k in range(3):
            gradients(m, k)
            for p in m.parameters():
                if p.grad is not None and p.ndim == 4:
                    p.grad = p.grad.contiguous(memory_format=torch.channels_last)  # as autograd lays them out
            opt.step()
    assert not same(a, nhwc) and same(a, b) and same_state(oa, ob)
    conv = next(p for p in b.parameters() if p.ndim == 4 and p.shape[1] > 1)
    view = ob._plan.grads[[id(p) for p in ob._plan.with_grad].index(id(conv))]
    assert view.stride() == conv.stride() != conv.contiguous().stride()  # the flat buffer in the parameter's layout


@copies
def test_ultralytics_hyperparameters_differ_by_roundings_only(model):
    """With Ultralytics' own scalars (lr 0.01, 3x for the head, muon 0.2, momentum 0.9, decay) and a warm-up moving
    them every step, the update differs from stock's by float32 roundings, amplified at most by the bf16
    Newton-Schulz: far under 0.1 % of the update, everywhere."""
    (a, oa), (b, ob) = build(model, False), build(model, True)
    steps(a, oa, 6, warm_up=True)
    steps(b, ob, 6, warm_up=True)
    worst = 0.0
    for x0, x, y in zip(model.state_dict().values(), a.state_dict().values(), b.state_dict().values()):
        if x.dtype.is_floating_point and not torch.equal(x, x0):
            worst = max(worst, float((x - y).norm() / (x - x0).norm()))
    assert 0 <= worst < 1e-3, worst


@copies
def test_a_skipped_step_changes_nothing_and_the_next_is_stocks(model):
    """GradScaler on a non-finite gradient: stock's step is not called; ours is, with found_inf on the device, and
    must leave every parameter and buffer bit for bit as it was. The next steps then agree with stock's."""
    (a, oa), (b, ob) = build(model, False, powers_of_two=True), build(model, True, powers_of_two=True)
    for m, opt in ((a, oa), (b, ob)):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
        for k in range(4):
            scaler.scale(torch.zeros(()))  # what a backward of a scaled loss starts with: the scale made
            gradients(m, k, scale=scaler.get_scale())
            if k == 1:
                next(p for p in m.parameters() if p.ndim == 4).grad[0, 0, 0, 0] = float("inf")
                before = copy.deepcopy(m.state_dict()), copy.deepcopy(opt.state_dict())
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            if k == 1:
                assert all(torch.equal(x, y) for x, y in zip(before[0].values(), m.state_dict().values()))
                assert opt.state_dict()["state"].keys() == before[1]["state"].keys()
    assert not same(a, model) and same(a, b) and same_state(oa, ob)


@copies
def test_gradients_still_scaled_are_unscaled_on_the_device(model):
    """scaler.step without unscale_ first: GradScaler hands over grad_scale, and the step divides by it as
    GradScaler's own unscale does (a power-of-two scale: exact either way)."""
    (a, oa), (b, ob) = build(model, False, powers_of_two=True), build(model, True, powers_of_two=True)
    for m, opt in ((a, oa), (b, ob)):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**6)
        for k in range(3):
            scaler.scale(torch.zeros(()))
            gradients(m, k, scale=scaler.get_scale())
            scaler.step(opt)
            scaler.update()
    assert same(a, b) and same_state(oa, ob)


@copies
def test_state_dicts_are_stocks_both_ways(model):
    """A FastMuSGD checkpoint resumes a stock MuSGD and the other way round, and the runs go on identically."""
    (a, oa), (b, ob) = build(model, False, powers_of_two=True), build(model, True, powers_of_two=True)
    steps(a, oa, 2)
    steps(b, ob, 2)
    assert oa.state_dict()["param_groups"] == ob.state_dict()["param_groups"] and same_state(oa, ob)
    (a2, oa2), (b2, ob2) = build(model, True, powers_of_two=True), build(model, False, powers_of_two=True)
    a2.load_state_dict(a.state_dict())
    oa2.load_state_dict(copy.deepcopy(oa.state_dict()))  # stock's state into ours
    b2.load_state_dict(b.state_dict())
    ob2.load_state_dict(copy.deepcopy(ob.state_dict()))  # ours into stock's
    for m, opt in ((a, oa), (b, ob), (a2, oa2), (b2, ob2)):
        steps(m, opt, 2, first_seed=10)
    assert same(a, b) and same(a, a2) and same(b, b2) and same_state(oa, oa2) and same_state(ob, ob2)


@copies
def test_a_parameter_that_loses_its_gradient_is_skipped_as_stock_skips_it(model, caplog):
    (a, oa), (b, ob) = build(model, False, powers_of_two=True), build(model, True, powers_of_two=True)
    for m, opt in ((a, oa), (b, ob)):
        with caplog.at_level(logging.INFO, logger="yolofeed.train.musgd"):
            for k in range(4):
                gradients(m, k)
                if k >= 2:  # a frozen layer, a branch not taken
                    for p in list(m.parameters())[5:9]:
                        p.grad = None
                opt.step()
    assert same(a, b) and same_state(oa, ob)
    assert caplog.text.count("graph made again") == 1


@copies
def test_a_parameter_the_graph_cannot_take_steps_as_stock(model, caplog):
    (a, oa), (b, ob) = build(model, False, powers_of_two=True), build(model, True, powers_of_two=True)
    for m in (a, b):
        m.model[0].conv.double()
    with caplog.at_level(logging.INFO, logger="yolofeed.train.musgd"):
        for m, opt in ((a, oa), (b, ob)):
            steps(m, opt, 2)
    assert same(a, b) and same_state(oa, ob) and ob._plan is None
    shape = tuple(model.model[0].conv.weight.shape)
    assert caplog.text.count(f"steps as Ultralytics' own: a parameter of {shape} is torch.float64") == 1


def test_only_a_stock_musgd_is_adopted():
    class Other(MuSGD):
        pass

    p = torch.nn.Parameter(torch.zeros(4, 4))
    other, sgd = Other([p]), torch.optim.SGD([p], lr=0.1)
    assert FastMuSGD.adopt(other) is other and type(other) is Other
    assert FastMuSGD.adopt(sgd) is sgd and type(sgd) is torch.optim.SGD
    assert FastMuSGD._step_supports_amp_scaling and not getattr(MuSGD, "_step_supports_amp_scaling", False)


def test_the_trainer_steps_the_musgd_ultralytics_builds_as_fast_musgd(model):
    """Both of yolofeed's trainers adopt it; fast_musgd=False keeps Ultralytics' own, and no other optimiser changes.
    Under 8.4.138, whose muon_update is not the copy's, both keep Ultralytics' own."""
    from yolofeed.bench.modes import trainer_class
    from yolofeed.train import FastDetectionTrainer

    for cls, expected in ((FastDetectionTrainer, FAST), (trainer_class("ceiling"), FAST),
                          (trainer_class("ceiling_stock"), MuSGD),
                          (FastDetectionTrainer.with_options(fast_musgd=False), MuSGD)):
        trainer = cls.__new__(cls)  # build_optimizer reads nothing of the trainer for a named optimiser
        built = trainer.build_optimizer(copy.deepcopy(model), "MuSGD", 0.01, 0.9, 5e-4)
        assert type(built) is expected, cls
        if cls is FastDetectionTrainer and expected is FastMuSGD:  # its graph waits for a validation beside
            assert built.before_capture == trainer._settle_overlapped
        adamw = trainer.build_optimizer(copy.deepcopy(model), "AdamW", 0.001, 0.9, 5e-4)
        assert type(adamw) is torch.optim.AdamW


@copies
@pytest.mark.gpu
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])  # the latter: Ultralytics' on CUDA
def test_cuda_graph_replays_what_the_eager_update_makes_without_a_host_sync(full_model, layout):
    """On CUDA: the first step eager (the warm-up), the second captured, the rest replayed; each equals the eager
    update of the same plan bit for bit, and a replayed step with GradScaler waits for nothing on the host."""
    from helpers import no_host_sync

    (a, oa), (b, ob) = build(full_model, True), build(full_model, True)
    a.cuda().to(memory_format=layout), b.cuda().to(memory_format=layout)
    ob._plan = None
    for k in range(5):
        for m, opt in ((a, oa), (b, ob)):
            gradients(m, k)
            if opt is ob and ob._plan is not None:
                ob._plan.graph = False  # b stays eager throughout
            opt.step()
    assert oa._plan.graph not in (None, False) and ob._plan.graph is False
    assert same(a, b) and same_state(oa, ob)
    scaler = torch.amp.GradScaler("cuda")
    scaler.scale(torch.zeros((), device="cuda"))
    gradients(a, 9, scale=scaler.get_scale())
    scaler.unscale_(oa)
    with no_host_sync():
        scaler.step(oa)
        scaler.update()


class _Interrupted(Exception):
    pass


def _interrupt_after_the_first_save(trainer) -> None:
    raise _Interrupted  # last.pt of epoch 1 is on disk, with the optimiser's state: a run killed there


@pytest.mark.slow
@pytest.mark.parametrize("first, then", [("yolofeed", "stock"), ("stock", "yolofeed")])
def test_a_musgd_checkpoint_resumes_under_the_other_trainer(synth_root, tmp_path, first, then):
    """A yolofeed run's last.pt resumes under yolo train and the other way round: the optimiser state comes back
    whole into the other's optimiser, and the run ends."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    trainers = {"yolofeed": {"trainer": FastDetectionTrainer}, "stock": {}}
    args = dict(data=str(synth_root / "data.yaml"), epochs=2, imgsz=64, batch=8, device="cpu", workers=0,
                plots=False, verbose=False, optimizer="MuSGD", project=str(tmp_path), name="run", exist_ok=True)
    model = YOLO("yolo11n.yaml")
    model.add_callback("on_model_save", _interrupt_after_the_first_save)
    with pytest.raises(_Interrupted):
        model.train(**args, **trainers[first])
    last = tmp_path / "run" / "weights" / "last.pt"
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["epoch"] == 0 and saved["optimizer"]["state"]
    loaded = {}

    def keep_state(trainer) -> None:
        loaded["type"] = type(trainer.optimizer)
        loaded["state"] = copy.deepcopy(trainer.optimizer.state_dict())

    resumed = YOLO(str(last))
    resumed.add_callback("on_train_start", keep_state)
    resumed.train(resume=True, **trainers[then])
    assert loaded["type"] is (FAST if then == "yolofeed" else MuSGD)
    want, got = saved["optimizer"]["state"], loaded["state"]["state"]
    assert want.keys() == got.keys() and all(torch.equal(want[k][n].float(), got[k][n]) for k in want for n in want[k])
    with open(tmp_path / "run" / "results.csv") as f:
        assert len(f.read().strip().splitlines()) == 1 + 2  # epoch 1 from the first trainer, epoch 2 from the other


@copies
@pytest.mark.gpu
def test_before_capture_runs_before_the_capture_only(full_model):
    """``before_capture`` runs once, before the capture at the second step, none underway then; not before the first
    (eager) step nor a replay."""
    model, opt = build(full_model, True)
    model.cuda()
    calls = []
    opt.before_capture = lambda: calls.append(torch.cuda.is_current_stream_capturing())
    for k in range(4):
        gradients(model, k)
        opt.step()
    assert calls == [False] and opt._plan.graph not in (None, False)


@copies
@pytest.mark.gpu
def test_a_capture_that_fails_stays_eager_with_one_line(full_model, monkeypatch, caplog):
    """Out of memory (or any error) while capturing: the step is made eagerly, that once and from then on, said
    once; the parameters are what an eager FastMuSGD makes."""
    (a, oa), (b, ob) = build(full_model, True), build(full_model, True)
    a.cuda(), b.cuda()

    def no_graph(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (planted)")

    with caplog.at_level(logging.INFO, logger="yolofeed.train.musgd"):
        for k in range(4):
            for m, opt in ((a, oa), (b, ob)):
                gradients(m, k)
                if opt is ob and ob._plan is not None:
                    ob._plan.graph = False
                with monkeypatch.context() as patch:
                    if opt is oa:
                        patch.setattr(torch.cuda, "graph", no_graph)
                    opt.step()
    assert oa._plan.graph is False and same(a, b) and same_state(oa, ob)
    assert caplog.text.count("stays eager: its CUDA graph could not be captured (OutOfMemoryError") == 1
