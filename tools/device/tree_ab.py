"""yolofeed as an earlier tree has it (A) against the library (B), in turn: A, B, A.

    git archive <commit> src | tar -x -C .base     # here, before the call; carry .base (git ignores it)
    python -m tools.device.tree_ab base=.base/src name=<commit> out=$OUT/ab -- model=yolo11n.yaml modes=yolofeed ...

Side A's processes find yolofeed in ``base`` (first on PYTHONPATH), side B's in the working tree: the same machine,
data and arguments, one call. ``order=ABAB`` runs more turns.
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
    order = args.get("order", "ABA")
    if not order or set(order) - {"A", "B"}:
        raise SystemExit("tree_ab: order= of the letters A and B")
    library = Path(tempfile.mkdtemp())  # an empty folder first on PYTHONPATH: the working tree's yolofeed
    sides = {"A": (f"the tree of {args.get('name', base)}", base.resolve()), "B": ("the library", library)}
    aba(sides, argv[cut + 1:], Path(args.get("out", "/tmp/tree_ab")), order)


if __name__ == "__main__":
    main(sys.argv[1:])
