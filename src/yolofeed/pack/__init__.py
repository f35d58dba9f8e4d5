"""Stage 1: files -> one memory-mappable store per split.

``source`` finds the samples as Ultralytics does, ``verify`` checks one sample with Ultralytics' rules,
``codecs`` holds one module per format (how an image is stored, gathered on the host and decoded on the
device). ``layout`` is the pack file's sections and checksums, ``store`` its reader. ``build`` writes a pack
in parallel and atomically (``encode``: a worker's side; ``space``: its size against the free space; ``disk``:
its file operations, which tests replace; ``report``: the report file). ``paths`` says where packs live and
how one is rebuilt, ``rebuild`` when a pack is reused, refused or rebuilt, ``auto`` picks ``pack_format=auto``'s
format (against ``yolofeed.limits``' memory limit), ``summary`` and ``command`` are ``yolofeed pack``'s output.

``Pack`` and ``open_or_build`` are imported on first use, so ``yolofeed.pack.codecs`` (the format names,
for ``yolofeed help``) imports without loading OpenCV, Ultralytics or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from yolofeed.pack.rebuild import open_or_build
    from yolofeed.pack.store import Pack


def __getattr__(name: str) -> Any:
    if name == "Pack":
        from yolofeed.pack.store import Pack

        return Pack
    if name == "open_or_build":
        from yolofeed.pack.rebuild import open_or_build

        return open_or_build
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Pack", "open_or_build"]
