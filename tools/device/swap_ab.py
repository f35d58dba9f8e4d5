"""The ceiling without and with one of the graphed step's swaps (train/graphed.py), in turn: A (without), B (with), A.

    python -m tools.device.swap_ab off=swap_layout out=$OUT/layout_ab -- model=yolo11n.yaml modes=ceiling ...
    python -m tools.device.swap_ab on=swap_convs out=$OUT/cast_ab -- model=yolo11n.yaml modes=ceiling ...

``off`` names a swap the trainer makes (``swap_layout``: the head's upsamples in half precision and its outputs
cells-major): side A's processes start with a ``sitecustomize`` on PYTHONPATH that makes it do nothing, B's with an
empty one. ``on`` names one it does not make (``swap_convs``: the weights cast at once): A's start with an empty
``sitecustomize``, B's with one that makes ``swap`` make it too. ``knobs=_UNROLL=2,...`` sets the fused batch norm +
SiLU's launch knobs (kernels/bn_silu.py) on side B as well. The library's code is the same on both sides.

    python -m tools.device.swap_ab on=swap_convs knobs=_UNROLL=2 out=$OUT/cast_ab -- model=yolo11n.yaml ...
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tools.device.bn_silu_ab import aba

OFF = {"swap_layout"}
ON = {"swap_convs"}
KNOBS = {"_GROUPS", "_TILE", "_WARPS", "_UNROLL", "_STAGES", "_FLAT_TILE", "_FLAT_WARPS"}
# A sitecustomize that fails only prints "Error in sitecustomize" and the run goes on as the other side: each writes
# failed.txt beside itself instead, which ``aba`` reports.
NO_OP = """try:
    import yolofeed.train.graphed as _graphed
    _graphed.{name} = lambda model: None
except Exception as e:
    import pathlib
    pathlib.Path(__file__).with_name("failed.txt").write_text(repr(e))
"""
TOO = """try:
    import yolofeed.train.graphed as _graphed
    _swap = _graphed.swap

    def _swap_too(model):
        _swap(model)
        _graphed.{name}(model)

    _graphed.swap = _swap_too
except Exception as e:
    import pathlib
    pathlib.Path(__file__).with_name("failed.txt").write_text(repr(e))
"""


def main(argv: list[str]) -> None:
    cut = argv.index("--")
    args = dict(a.split("=", 1) for a in argv[:cut])
    if args.get("off") in OFF:
        name = args["off"]
        code = {"A": NO_OP.format(name=name), "B": ""}
    elif args.get("on") in ON:
        name = args["on"]
        code = {"A": "", "B": TOO.format(name=name)}
    else:
        raise SystemExit(f"swap_ab: off= one of {', '.join(sorted(OFF))}, or on= one of {', '.join(sorted(ON))}")
    if args.get("knobs"):
        knobs = dict(k.split("=") for k in args["knobs"].split(","))
        if not set(knobs) <= KNOBS:
            raise SystemExit(f"swap_ab: knobs= of {', '.join(sorted(KNOBS))}")
        code["B"] += "import yolofeed.kernels.bn_silu as _op\n" + "".join(
            f"_op.{k} = {int(v)}\n" for k, v in knobs.items())
        name += "+" + args["knobs"]
    root = Path(tempfile.mkdtemp())
    sides = {}
    for side, what in (("A", f"without {name}"), ("B", f"with {name}")):
        (root / side).mkdir()
        (root / side / "sitecustomize.py").write_text(code[side])
        sides[side] = (what, root / side)
    aba(sides, argv[cut + 1:], Path(args.get("out", f"/tmp/{name}_ab")))


if __name__ == "__main__":
    main(sys.argv[1:])
