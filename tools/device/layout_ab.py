"""The ceiling without and with the graphed step's layout swaps (train/graphed.py: the head's upsamples in half
precision, the Detect head's outputs cells-major), in turn: A (without), B (with), A.

    python -m tools.device.layout_ab out=$OUT/layout_ab -- model=yolo11n.yaml modes=ceiling steps=60 warmup=30 ...

Side A's processes start with a ``sitecustomize`` on PYTHONPATH that makes ``graphed.swap_layout`` do nothing; B's
with an empty one. The library's code is the same on both sides.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tools.device.bn_silu_ab import aba

OFF = """import yolofeed.train.graphed as _graphed
_graphed.swap_layout = lambda model: None
"""


def main(argv: list[str]) -> None:
    cut = argv.index("--")
    args = dict(a.split("=", 1) for a in argv[:cut])
    root = Path(tempfile.mkdtemp())
    sides = {}
    for side, what, code in (("A", "layout swaps off", OFF), ("B", "layout swaps on", "")):
        (root / side).mkdir()
        (root / side / "sitecustomize.py").write_text(code)
        sides[side] = (what, root / side)
    aba(sides, argv[cut + 1:], Path(args.get("out", "/tmp/layout_ab")))


if __name__ == "__main__":
    main(sys.argv[1:])
