"""The raw format (pack/codecs/raw.py): a batch gathered into the caller's buffers, the rest of each left as it
was.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from yolofeed.pack import Pack, open_or_build


def _build(root: Path, split="train", imgsz=160, storage="raw", workers=2, **kw) -> Pack:
    return open_or_build(root / "data.yaml", split, imgsz, storage, rebuild="auto", workers=workers,
                         progress=False, **kw)


def test_gather_into_caller_buffers(dataset):
    pack = _build(dataset)
    idx = [5, 0, 17, 5]
    out = torch.full((6, 160, 160, 3), 7, dtype=torch.uint8)  # a pinned tensor in real use
    hw = pack.codec.gather(pack, idx, out)
    for k, i in enumerate(idx):
        h, w = hw[k]
        np.testing.assert_array_equal(out[k, :h, :w].numpy(), pack.image(i))
        assert (out[k, h:] == 7).all() and (out[k, :, w:] == 7).all()  # the rest is left as it was
    assert (out[4:] == 7).all()
    with pytest.raises(ValueError, match="cannot hold"):
        pack.codec.gather(pack, list(range(7)), out)
