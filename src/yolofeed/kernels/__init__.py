"""The pixel kernels: each a torch reference and a Triton version that gives the same pixels.

``warp`` (mosaic placement, perspective and flips in one sampling pass) and ``warp_triton``;
``compose`` (MixUp, CutMix, HSV and the BGR swap in one elementwise pass, HSV from ``hsv``) and
``compose_triton``; ``place_triton``, the jpeg codec's resize-and-place (its torch path is
``pack.codecs.jpeg.place``). ``common_triton`` holds what several Triton kernels share. The stage that
runs a kernel picks the version (``augment.warp``, ``augment.pipeline.compose``, ``jpeg.place``); a kernel
imports torch and Triton only, so augment and pack both sit above it. Modules that import Triton end in
``_triton``: the rest import without it.

The training step's kernels follow the same pattern: ``bn_silu`` (batch norm + SiLU, forward and backward),
``channel_cat`` (channel concatenations of NHWC activations) and ``bce_sum`` (the detection loss's classification
term), each an autograd op over its ``_triton`` module.
"""
