"""Triton's cache key of its own install, computed ahead in a thread of its own (``start``).

Every kernel Triton compiles, or loads from its cache, is looked up by a key that includes ``triton_key()``
(``triton.runtime.cache``): a SHA-256 of Triton's compiler and language sources and of libtriton, hundreds of MB,
computed once a process at the first kernel launch. That costs 0.5-1 s, and on CUDA the first launch is in the
thread that captures the step's graph before the first epoch: the set-up's longest path (BENCHMARKS.md, "The whole
run", `setup-profile`). Its file reads and hashing give up the GIL (a Python loop beside it keeps 99 % of its pace), so
a thread started with the trainer's build computes it beside the build, and the first launch finds it cached
(``functools.lru_cache``). A Triton without it, or a failure in it, leaves it to the first launch, as before.
"""

from __future__ import annotations

import logging
import threading


def start() -> threading.Thread:
    """Compute ``triton_key()`` in a daemon thread (returned, started): nothing waits for it. Importing Triton happens
    there too."""
    thread = threading.Thread(target=_compute, name="yolofeed-triton-key", daemon=True)
    thread.start()
    return thread


def _compute() -> None:
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception as e:  # noqa: BLE001 - no Triton, another release's layout, an unreadable file: the first
        # launch computes the key itself (or raises its own error where it must)
        logging.getLogger(__name__).debug(f"yolofeed: Triton's cache key not computed ahead ({type(e).__name__}: {e})")
