"""Stage 1: files -> one memory-mappable store per split.

``source`` finds the samples as Ultralytics does, ``verify`` checks and decodes one sample with
Ultralytics' rules, ``store`` is the on-disk format and its reader, ``build`` writes stores in
parallel and atomically.
"""

from yolofeed.pack.build import open_or_build
from yolofeed.pack.store import Pack

__all__ = ["Pack", "open_or_build"]
