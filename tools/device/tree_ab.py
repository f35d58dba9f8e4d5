"""yolofeed as an earlier tree has it (A) against the library (B), in turn: A, B, A.

    git archive <commit> src | tar -x -C .base     # here, before the call; carry .base (git ignores it)
    python -m tools.device.tree_ab base=.base/src name=<commit> out=$OUT/ab -- model=yolo11n.yaml modes=yolofeed ...

Side A's processes find yolofeed in ``base`` (first on PYTHONPATH), side B's in the working tree: the same machine,
data and arguments, one call. ``order=ABAB`` runs more turns; ``base_c=`` (and ``name_c=``) names a third tree, side
C (``order=CABCAB``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tools.device.bn_silu_ab import aba


def main(argv: list[str]) -> None:
    cut = argv.index("--")
    args = dict(a.split("=", 1) for a in argv[:cut])
    base = Path(args.get("base", ""))
    if not (base / "yolofeed" / "__init__.py").is_file():
        raise SystemExit(f"tree_ab: base= a tree's src folder holding yolofeed/ (not {base}): "
                         "git archive <commit> src | tar -x -C .base")
    library = Path(tempfile.mkdtemp())  # an empty folder first on PYTHONPATH: the working tree's yolofeed
    sides = {"A": (f"the tree of {args.get('name', base)}", base.resolve()), "B": ("the library", library)}
    if "base_c" in args:
        third = Path(args["base_c"])
        if not (third / "yolofeed" / "__init__.py").is_file():
            raise SystemExit(f"tree_ab: base_c= a tree's src folder holding yolofeed/ (not {third})")
        sides["C"] = (f"the tree of {args.get('name_c', third)}", third.resolve())
    order = args.get("order", "ABA")
    if not order or set(order) - set(sides):
        raise SystemExit(f"tree_ab: order= of the letters {', '.join(sorted(sides))}")
    aba(sides, argv[cut + 1:], Path(args.get("out", "/tmp/tree_ab")), order)


if __name__ == "__main__":
    main(sys.argv[1:])
