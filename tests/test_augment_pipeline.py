"""The op list and its fusion plan (``augment/pipeline.py``) and what an op is (``augment/op.py``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from yolofeed.augment import AugmentHyp, AugmentParams, GpuAugment
from yolofeed.augment.op import GeometricOp, Op, PixelOp, WarpPlan, matmul3
from yolofeed.augment.pipeline import COMPOSE, OPS, WARP, fusion_plan
from yolofeed.schema import LABEL_KINDS


def test_the_plan_puts_each_op_in_its_pass_in_ultralytics_order():
    names = [op.name for op in OPS]
    assert names == ["mosaic", "copy_paste", "perspective", "mixup", "cutmix", "hsv", "flipud", "fliplr", "bgr"]
    assert all(isinstance(op, GeometricOp) for op in WARP) and all(isinstance(op, PixelOp) for op in COMPOSE)
    assert sorted(WARP + COMPOSE, key=OPS.index) == list(OPS)  # each op once, list order kept within a pass
    assert [op.name for op in WARP] == ["mosaic", "copy_paste", "perspective", "flipud", "fliplr"]


def test_the_params_have_one_field_per_op_in_draw_order():
    assert [f.name for f in dataclasses.fields(AugmentParams)] == ["size"] + [op.name for op in WARP + COMPOSE]
    p = GpuAugment(AugmentHyp(imgsz=64)).sample(3, torch.Generator().manual_seed(0))
    assert p.size == 3 and torch.equal(p.flips.ud, p.flipud) and torch.equal(p.flips.lr, p.fliplr)


def test_an_op_of_neither_kind_is_refused():
    class Loose(Op):
        name, Params = "loose", torch.Tensor

        def sample(self, draw, hyp, generator):
            return torch.zeros(draw.rows)

    with pytest.raises(TypeError, match="Loose"):
        fusion_plan((*OPS, Loose()))


def test_every_op_has_a_hook_for_every_label_kind():
    """Detection's boxes are moved by every op; the other kinds have their place, None until their task."""
    for op in OPS:
        assert callable(op.apply_boxes), op.name
        for kind in LABEL_KINDS:
            assert hasattr(op, f"apply_{kind}"), (op.name, kind)


def test_warp_steps_compose_as_a_product_and_flips_come_last():
    g = torch.Generator().manual_seed(0)
    A, B = (torch.eye(3).repeat(2, 1, 1) + 0.1 * torch.randn(2, 3, 3, generator=g) for _ in range(2))
    plan = WarpPlan(64, torch.full((2, 2), 64)).then(A, False).then(B, True)
    assert torch.equal(plan.matrix, matmul3(B, A)) and torch.equal(plan.step, B) and plan.projective
    flipped = dataclasses.replace(plan, lr=torch.tensor([True, False]))
    with pytest.raises(ValueError, match="after a flip"):
        flipped.then(A, False)
