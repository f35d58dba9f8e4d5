"""Run a module as if Triton were not installed: what a user without Triton gets (the torch reference kernels).

``import triton`` raises ImportError in this process, so yolofeed's warp and compose fall back to their torch
references (``kernels/warp.py``, ``kernels/compose.py``), on the GPU as elsewhere.

Usage: python -m tools.device.no_triton MODULE [ARGS...]
e.g.   python -m tools.device.no_triton yolofeed bench model=yolo11n.yaml modes=yolofeed data=...
"""

from __future__ import annotations

import runpy
import sys


def hide_triton() -> None:
    """Make every later ``import triton`` (and ``triton.*``) raise ImportError in this process."""
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        del sys.modules[name]
    sys.modules["triton"] = None  # the import system raises ImportError for a None entry


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    hide_triton()
    sys.argv = argv  # the module sees its own arguments, as under python -m
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
