"""Stage 1: files -> one memory-mappable store per split.

``source`` finds the samples as Ultralytics does, ``verify`` checks and decodes one sample with
Ultralytics' rules, ``codecs`` holds one module per storage format (how an image is stored, gathered on
the host and decoded on the device), ``store`` is the on-disk format and its reader, ``build`` writes
stores in parallel and atomically.

``Pack`` and ``open_or_build`` are imported on first use, so ``yolofeed.pack.codecs`` (the format names,
for ``yolofeed help``) imports without loading OpenCV, Ultralytics or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from yolofeed.pack.build import open_or_build
    from yolofeed.pack.store import Pack


def __getattr__(name: str) -> Any:
    if name == "Pack":
        from yolofeed.pack.store import Pack

        return Pack
    if name == "open_or_build":
        from yolofeed.pack.build import open_or_build

        return open_or_build
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Pack", "open_or_build"]
