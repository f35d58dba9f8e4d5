"""The Triton kernels equal the torch reference; the GPU path makes no host sync.

On CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess), whose
``fma`` is unfused: there a pixel may differ by one level. On CUDA (marked ``gpu``, run on the
device machine) they must be identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import compare_with_reference, no_host_sync, random_augmented, source_batch
from yolofeed.augment import AugmentHyp, GpuAugment

CONFIGS = [{}, {"perspective": 0.0008, "degrees": 10.0, "shear": 3.0}, {"mosaic_grid": 9, "mixup": 0.5, "cutmix": 0.5},
           {"mosaic": 0.5, "mixup": 1.0, "bgr": 0.5, "flipud": 0.5}]
# The features of CONFIGS but the 3x3 mosaic (the same kernel code, with 9 tiles where 4 take half the time), in
# two configurations: the Triton interpreter runs each kernel program in numpy, slowly.
INTERPRETED = [{"perspective": 0.0008, "degrees": 10.0, "shear": 3.0, "mixup": 0.5, "cutmix": 0.5, "bgr": 0.5,
                "flipud": 0.5}, {"mosaic": 0.5, "mixup": 1.0}]


@pytest.mark.slow
def test_triton_kernels_match_reference_in_the_interpreter(pack):
    pytest.importorskip("triton")
    code = textwrap.dedent(f"""
        import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
        from helpers import compare_with_reference
        from yolofeed.pack import Pack
        print(json.dumps(compare_with_reference(Pack.open({str(pack(64).path)!r}), "cpu", {INTERPRETED!r}, n=2)))
    """)
    env = os.environ | {"TRITON_INTERPRET": "1", "YOLO_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.strip().splitlines()[-1])
    # The interpreter's fma rounds twice: a warp coordinate or HSV value lands one step off in a
    # few pixels in 10,000, which moves a colour by a level or, through a hue step, by a few.
    for worst, same in results:
        assert worst <= 8 and same > 0.999, results


@pytest.mark.gpu
def test_cuda_pipeline_equals_reference_exactly(pack):
    for worst, same in compare_with_reference(pack(160), "cuda", CONFIGS, n=12):
        assert worst == 0, (worst, same)


@pytest.mark.gpu
def test_cuda_hot_path_makes_no_host_sync(pack):
    batch = source_batch(pack(160), list(range(16)), "cuda")
    aug = GpuAugment(AugmentHyp(imgsz=160, mixup=0.5, cutmix=0.5, degrees=5.0))
    g = torch.Generator(device="cuda").manual_seed(0)
    aug(batch, g)  # warm up: Triton compiles on first use
    with no_host_sync():
        out = aug(batch, g)
    assert out.img.shape == (16, 3, 160, 160)


@pytest.mark.gpu
def test_graphed_augment_replays_new_draws_reproducibly(pack):
    from yolofeed.augment.graphs import GraphedAugment

    p160 = pack(160)
    batch = source_batch(p160, list(range(16)), "cuda")
    aug = GpuAugment(AugmentHyp(imgsz=160, mixup=0.3, degrees=5.0))
    a, b = GraphedAugment(aug, seed=7), GraphedAugment(aug, seed=7)
    first = [x.img.clone() for x in (a(batch), b(batch))]
    second = a(batch).img.clone()
    assert torch.equal(first[0], first[1])  # same seed, same draws
    assert not torch.equal(first[0], second)  # each replay draws anew
    out = a(batch).to_ultralytics()
    assert out["bboxes"].shape[1] == 4 and (out["bboxes"] >= 0).all() and (out["bboxes"] <= 1).all()
    assert a.captured == 1
    narrow = source_batch(p160, list(range(8, 24)), "cuda")  # another label width in the same bucket
    a(narrow)
    assert a.captured == 1


@pytest.mark.gpu
def test_a_graphed_augment_calls_before_capture_before_each_capture_only(pack):
    """``before_capture`` (where the trainer waits for a validation running beside the training) runs before each
    new shape's capture, none underway then, and never before a replay."""
    from yolofeed.augment.graphs import GraphedAugment

    p160 = pack(160)
    calls = []
    aug = GpuAugment(AugmentHyp(imgsz=160, mixup=0.3))
    a = GraphedAugment(aug, seed=7, before_capture=lambda: calls.append(
        (a.captured, torch.cuda.is_current_stream_capturing())))
    full, short = (source_batch(p160, list(range(n)), "cuda") for n in (16, 8))
    for batch in (full, full, short, full, short):
        a(batch)
    assert calls == [(0, False), (1, False)] and a.captured == 2


@pytest.mark.gpu
def test_a_graphed_augment_given_an_earlier_ones_generator_draws_on(pack):
    """The trainer's augmenter made again (close_mosaic, more mask room) takes the old one's generator: its replays
    go on from where the old one's stopped (its capture's warm-up runs take some draws), never from the seed again."""
    from yolofeed.augment.graphs import GraphedAugment

    batch = source_batch(pack(160), list(range(16)), "cuda")
    aug = GpuAugment(AugmentHyp(imgsz=160, mixup=0.3, degrees=5.0))
    first = GraphedAugment(aug, seed=7)
    before = [first(batch).img.clone() for _ in range(2)]
    after = GraphedAugment(aug, generator=first.generator)
    assert after.generator is first.generator
    drawn = [after(batch).img.clone() for _ in range(2)]
    assert not any(torch.equal(d, b) for d in drawn for b in before) and not torch.equal(*drawn)


@pytest.mark.gpu
def test_graphed_augment_without_triton_equals_the_triton_path(pack, monkeypatch):
    """A CUDA user without Triton gets the torch reference kernels, captured in the same CUDA graph."""
    from yolofeed.augment import warp as warp_module
    from yolofeed.augment.graphs import GraphedAugment

    batch = source_batch(pack(160), list(range(16)), "cuda")
    aug = GpuAugment(AugmentHyp(imgsz=160, mixup=0.3, cutmix=0.3, degrees=5.0))
    with_triton = GraphedAugment(aug, seed=3)(batch).img.clone()
    monkeypatch.setattr(warp_module, "triton_kernels", lambda: None)
    monkeypatch.setitem(sys.modules, "yolofeed.kernels.compose_triton", None)  # its import raises ImportError
    without = GraphedAugment(aug, seed=3)(batch).img
    assert torch.equal(with_triton, without)


@pytest.mark.gpu
def test_flattening_with_a_known_count_makes_no_host_sync():
    for seed, (b, k, p) in enumerate([(16, 32, 0.3), (4, 7, 0.0), (1, 5, 1.0)]):
        out = random_augmented(b, k, p, seed, "cuda")
        ref = out.to_ultralytics()
        total = int(out.valid.sum())
        with no_host_sync():
            got = out.to_ultralytics(total=total)
        for key in ref:
            assert torch.equal(got[key], ref[key]), (b, k, p, key)
