"""Where do the CUDA kernels and the CPU reference differ? Isolates warp and compose on identical inputs."""

import sys

import torch

sys.path.insert(0, "tests")
from helpers import source_batch  # noqa: E402
from yolofeed.augment import AugmentHyp, GpuAugment, color, compose_triton, geometry, warp_triton  # noqa: E402
from yolofeed.augment.pipeline import compose_reference  # noqa: E402
from yolofeed.augment.warp import warp_reference  # noqa: E402
from yolofeed.pack import open_or_build  # noqa: E402

pack = open_or_build(sys.argv[1], "train", 160, rebuild="auto", progress=False)
batch = source_batch(pack, list(range(12)))
for kw in ({}, {"perspective": 0.0008, "degrees": 10.0}):
    hyp = AugmentHyp(imgsz=160, **kw)
    aug = GpuAugment(hyp)
    p = aug.sample(12, torch.Generator().manual_seed(5))
    lay = geometry.mosaic_layout(p.mosaic, batch.hw, 160)
    M, _ = geometry.perspective_matrix(p.perspective, lay.canvas_hw, 160)
    persp = hyp.perspective != 0
    ref = warp_reference(batch.images, lay, M, p.flips, 160, persp)
    cu = lambda t: t.cuda()  # noqa: E731
    lay_c = geometry.Layout(*(cu(getattr(lay, f)) for f in ("src", "rect", "pad", "canvas_hw", "mosaic")))
    fl_c = geometry.FlipParams(cu(p.flips.ud), cu(p.flips.lr))
    got = warp_triton.warp(batch.images.cuda(), lay_c, M.cuda(), fl_c, 160, persp, 114).cpu()
    d = (got.int() - ref.int()).abs()
    print("warp", kw, "max", int(d.max()), "n diff", int((d > 0).sum()))
    for b, c, y, x in torch.nonzero(d)[:5].tolist():
        print("   at", b, c, y, x, "ref", int(ref[b, c, y, x]), "cuda", int(got[b, c, y, x]))
    luts = color.hsv_luts(p.hsv)
    cref = compose_reference(ref, None, None, luts, None)
    cgot = compose_triton.compose(ref.cuda(), None, None, luts.cuda(), None).cpu()
    d = (cgot.int() - cref.int()).abs()
    print("compose(hsv)", "max", int(d.max()), "n diff", int((d > 0).sum()))
    for b, c, y, x in torch.nonzero(d)[:5].tolist():
        print("   at", b, c, y, x, "in", ref[b, :, y, x].tolist(), "ref", cref[b, :, y, x].tolist(),
              "cuda", cgot[b, :, y, x].tolist(), "gains", p.hsv.gains[b].tolist())
