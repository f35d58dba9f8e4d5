"""Triton helpers that more than one kernel uses: ``round_even``, half to even as ``torch.round`` and OpenCV's
``v_round`` round (the warp's and the place's last step).

A module apart, so that no kernel imports another kernel for them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_even(x):
    r = tl.floor(x + 0.5)  # x + 0.5 may round up (x just below a half): the tie test below rounds the same way
    tie = (r - x) == 0.5
    odd = (r.to(tl.int32) & 1) == 1
    return tl.where(tie & odd, r - 1.0, r)
