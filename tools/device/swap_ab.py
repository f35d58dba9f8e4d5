"""The ceiling without and with some of the graphed step's swaps (train/graphed.py), in turn: A (without), B (with), A.

    python -m tools.device.swap_ab off=swap_layout out=$OUT/layout_ab -- model=yolo11n.yaml modes=ceiling ...
    python -m tools.device.swap_ab off=swap_convs knobs=_UNROLL=1 out=$OUT/cast_ab -- model=yolo11n.yaml ...

``off`` names swaps the trainer makes, comma-separated (``swap_layout``: the head's upsamples in half precision and
its outputs cells-major; ``swap_convs``: the weights cast at once; ``swap_halves``: C2f/C3k2's cv1 output as two
dense halves; ``install``: the graphed step as a whole, its graph, fused op and every swap, as
``graphed_step=False``): side A's processes start with a ``sitecustomize``
on PYTHONPATH that makes them do nothing, B's with none. ``knobs=_UNROLL=1,...`` sets the fused batch norm + SiLU's
launch knobs (kernels/bn_silu.py) on side A as well: B is the library as it is, its code the same on both sides.

``off=bce_sum``, ``off=half_input``, ``off=grid_candidates`` and ``off=foreground_norm`` switch off a step option of the
library's own on side A (``SWITCHES``: the loss's classification term as one fused pass each way, kernels/bce_sum.py;
the step's input image made in float16 in one kernel, train/step.py; the assigner's candidate mask made level by level
from a bool ``mask_gt``, and its normalisation made on each anchor's own box, train/loss/detect.py).
``off=install,bce_sum,half_input,grid_candidates,foreground_norm`` is the step without any of yolofeed's own step
levers (the sync-free step and loss stay on both sides).

``off=short_batches`` makes the epoch's short batches' cuDNN set-up in the warm-up, before the first epoch, and
forwards them in the training thread (``short_batches.BESIDE``; with ``whole_run=``: the set-up and the first epoch,
side by side). ``off=unplanned`` runs them with cuDNN's plans, made beside the first epoch in the worker thread
(``short_batches.UNPLANNED``), where the library runs their convolutions as GEMMs in the training thread.

``also=grid_candidates,foreground_norm`` adds a side C with only those off, and ``order=ACBA`` runs the sides in that
order: the step before every lever, before some, as it is, and before every lever again, in one call.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tools.device.bn_silu_ab import aba

OFF = {"swap_layout", "swap_convs", "swap_halves", "install", "bce_sum", "half_input", "grid_candidates",
       "foreground_norm", "short_batches", "unplanned"}
SWITCHES = {  # name: (module, what side A sets, its value)
    "bce_sum": ("yolofeed.kernels.bce_sum", "ENABLED", "False"),
    "half_input": ("yolofeed.train.step", "SyncFreeStep.step_input_dtype", "lambda self: None"),  # Ultralytics' image
    "grid_candidates": ("yolofeed.train.loss.detect", "GRID_CANDIDATES", "False"),
    "foreground_norm": ("yolofeed.train.loss.detect", "FOREGROUND_NORM", "False"),
    "short_batches": ("yolofeed.train.short_batches", "BESIDE", "False"),  # their set-up in the warm-up
    "unplanned": ("yolofeed.train.short_batches", "UNPLANNED", "False"),  # their cuDNN set-up beside the first epoch
}
KNOBS = {"_GROUPS", "_TILE", "_WARPS", "_UNROLL", "_STAGES", "_FLAT_TILE", "_FLAT_WARPS"}
# A sitecustomize that fails only prints "Error in sitecustomize" and the run goes on as the other side: side A's
# writes failed.txt beside itself instead, which ``aba`` reports.
SITE = """try:
{lines}except Exception as e:
    import pathlib
    pathlib.Path(__file__).with_name("failed.txt").write_text(repr(e))
"""


def main(argv: list[str]) -> None:
    cut = argv.index("--")
    args = dict(a.split("=", 1) for a in argv[:cut])
    off = args.get("off", "").split(",")
    if not set(off) <= OFF or off == [""]:
        raise SystemExit(f"swap_ab: off= of {', '.join(sorted(OFF))}")
    knobs = dict(k.split("=") for k in args["knobs"].split(",")) if args.get("knobs") else {}
    if not set(knobs) <= KNOBS:
        raise SystemExit(f"swap_ab: knobs= of {', '.join(sorted(KNOBS))}")
    also = [name for name in args.get("also", "").split(",") if name]
    if not set(also) <= OFF:
        raise SystemExit(f"swap_ab: also= of {', '.join(sorted(OFF))}")
    order = args.get("order", "ACBA" if also else "ABA")
    if not order or set(order) - {"A", "B", "C"} or ("C" in order) != bool(also):
        raise SystemExit("swap_ab: order= of the letters A, B (and C, with also=)")
    root = Path(tempfile.mkdtemp())
    sides = {}
    for side, names in (("A", off), ("B", []), ("C", also)):
        if side == "C" and not also:
            continue
        name = "+".join(names + ([f"{k}={v}" for k, v in knobs.items()] if side == "A" else []))
        code = SITE.format(lines="".join(_site_lines(names, knobs if side == "A" else {}))) if names else ""
        (root / side).mkdir()
        (root / side / "sitecustomize.py").write_text(code)
        sides[side] = (f"without {name}" if names else "the library", root / side)
    aba(sides, argv[cut + 1:], Path(args.get("out", f"/tmp/{off[0]}_ab")), order)


def _site_lines(off: list[str], knobs: dict[str, str]) -> list[str]:
    """A side's sitecustomize lines: the swaps and switches of ``off`` undone, the fused op's ``knobs`` set."""
    lines = ["    import yolofeed.train.graphed as _graphed\n",
             *(f"    _graphed.{name} = lambda model: None\n" for name in off if name not in SWITCHES)]
    for name in off:
        if name in SWITCHES:
            module, attr, value = SWITCHES[name]
            lines += [f"    import {module} as _{name}\n", f"    _{name}.{attr} = {value}\n"]
    if knobs:
        lines += ["    import yolofeed.kernels.bn_silu as _op\n",
                  *(f"    _op.{k} = {int(v)}\n" for k, v in knobs.items())]
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
