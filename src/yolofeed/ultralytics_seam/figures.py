"""The final validation's metric figures, handed elsewhere to draw: Ultralytics' functions that draw them
(``FIGURES``, RELIED_ON), routed for the calling thread.

A validation with plots on draws, after its batches, each curve of ``ap_per_class`` (precision-recall, F1, precision,
recall: four a kind of box or mask) and the confusion matrix twice, one figure after another in the validating thread:
about 5 s of matplotlib on an H100 machine's cores for 80 classes (BENCHMARKS.md, "The whole run"). Within
``figures_drawn_by(draw)`` each such call of this thread is offered to ``draw`` (``train/plots.py``'s children)
instead: the same function, the same arguments, drawn in another process. Ultralytics finds the functions where it
always did (``ap_per_class`` looks up the module's names; ``finalize_metrics`` calls the class's method): their
stand-ins call the originals for any other thread or call, so nothing else changes. Nothing between those calls and
``on_val_end`` reads the files (``BaseValidator.__call__``, RELIED_ON): the caller waits for them there.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from yolofeed.ultralytics_seam.names import _metrics_module

# (owner's name in ultralytics.utils.metrics or "", function's name): each draws one figure to a file, takes its
# callback as the keyword on_plot and calls it once the file is written, with the path and the figure's data
FIGURES: tuple[tuple[str, str], ...] = (("", "plot_pr_curve"), ("", "plot_mc_curve"), ("ConfusionMatrix", "plot"))
MODULE = "ultralytics.utils.metrics"

# draw(qualname, args, kwargs) -> whether it took the call (it then calls on_plot as the original would, later)
Draw = Callable[[str, tuple, dict], bool]

_route = threading.local()
_installed = threading.Lock()


def figures_drawn_by(draw: Draw) -> contextlib.AbstractContextManager[None]:
    """Within it, this thread's calls of ``FIGURES`` go to ``draw`` first (see the module's doc)."""
    _install()
    return _routing(draw)


@contextlib.contextmanager
def _routing(draw: Draw) -> Iterator[None]:
    before, _route.draw = getattr(_route, "draw", None), draw
    try:
        yield
    finally:
        _route.draw = before


def _install() -> None:
    """Put a stand-in before each of ``FIGURES``, once a process."""
    with _installed:
        for owner_name, name in FIGURES:
            owner = getattr(_metrics_module, owner_name) if owner_name else _metrics_module
            original = getattr(owner, name)
            if getattr(original, "_yolofeed_routed", False):
                continue
            setattr(owner, name, _stand_in(original, f"{owner_name}.{name}" if owner_name else name))


def _stand_in(original: Callable[..., Any], qualname: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def figure(*args: Any, **kwargs: Any) -> Any:
        draw = getattr(_route, "draw", None)
        if draw is not None and draw(qualname, args, kwargs):
            return None  # what each returns (their TryExcept's None on a failure, or nothing)
        return original(*args, **kwargs)

    figure._yolofeed_routed = True  # type: ignore[attr-defined]
    return figure


def figure_function(qualname: str) -> Callable[..., Any]:
    """The function ``qualname`` (one of ``FIGURES``, as ``draw`` gets it) names, without its stand-in."""
    owner_name, _, name = qualname.rpartition(".")
    fn = getattr(getattr(_metrics_module, owner_name) if owner_name else _metrics_module, name)
    return fn.__wrapped__ if getattr(fn, "_yolofeed_routed", False) else fn
