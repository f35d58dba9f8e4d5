"""The final validation's figures: its metric figures handed elsewhere to draw, its image grids drawn from the images
they show. Ultralytics' functions that draw them (``FIGURES``, ``GRIDS``), routed for the calling thread.

A validation with plots on draws, after its batches, each curve of ``ap_per_class`` (precision-recall, F1, precision,
recall: four a kind of box or mask) and the confusion matrix twice, one figure after another in the validating thread:
about 5 s of matplotlib on an H100 machine's cores for 80 classes (BENCHMARKS.md, "The whole run"). Within
``final_figures(draw)`` each such call of this thread is offered to ``draw`` (``train/plots.py``'s children)
instead: the same function, the same arguments, drawn in another process. Ultralytics finds the functions where it
always did (``ap_per_class`` looks up the module's names; ``finalize_metrics`` calls the class's method): their
stand-ins call the originals for any other thread or call, so nothing else changes. Nothing between those calls and
``on_val_end`` reads the files (``BaseValidator.__call__``, RELIED_ON): the caller waits for them there.

Its first three batches are drawn as image grids (``plot_images``, in a thread each: the labels and the predictions),
each of at most ``max_subplots`` (16) images; but it converts the whole batch it is given to float32 on the host
first, and multiplies it by 255: for a batch of 256 at 640, 630 MB copied from the GPU and 1.26 GB written, twice a
batch, beside the validation. Within ``final_figures`` the grids of this thread get the first ``max_subplots`` images
only: the same grid (its images, boxes, masks and keypoints are those of the first ``max_subplots``), a sixteenth of
the copy.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

from yolofeed.ultralytics_seam.names import _detect_train_module, _detect_val_module, _metrics_module, _obb_val_module
from yolofeed.ultralytics_seam.source import threaded_function

# (owner's name in ultralytics.utils.metrics or "", function's name): each draws one figure to a file, takes its
# callback as the keyword on_plot and calls it once the file is written, with the path and the figure's data
FIGURES: tuple[tuple[str, str], ...] = (("", "plot_pr_curve"), ("", "plot_mc_curve"), ("ConfusionMatrix", "plot"))
MODULE = "ultralytics.utils.metrics"
# the validators' modules whose plot_val_samples / plot_predictions call plot_images by this name, its images as the
# keyword images or in the keyword labels' "img" (segment and pose validate with detect's)
GRIDS: tuple[Any, ...] = (_detect_val_module, _obb_val_module)

# draw(qualname, args, kwargs) -> whether it took the call (it then calls on_plot as the original would, later)
Draw = Callable[[str, tuple, dict], bool]

_route = threading.local()
_installed = threading.Lock()


def final_figures(draw: Draw | None) -> contextlib.AbstractContextManager[None]:
    """Within it, this thread's calls of ``FIGURES`` go to ``draw`` first (where given), and its image grids get only
    the images they show (see the module's doc)."""
    _install()
    return _routing(draw)


@contextlib.contextmanager
def _routing(draw: Draw | None) -> Iterator[None]:
    before = getattr(_route, "draw", None), getattr(_route, "grids", False)
    _route.draw, _route.grids = draw, True
    try:
        yield
    finally:
        _route.draw, _route.grids = before


def _install() -> None:
    """Put a stand-in before each of ``FIGURES`` and each of ``GRIDS``' ``plot_images``, once a process."""
    with _installed:
        for owner_name, name in FIGURES:
            owner = getattr(_metrics_module, owner_name) if owner_name else _metrics_module
            original = getattr(owner, name)
            if getattr(original, "_yolofeed_routed", False):
                continue
            setattr(owner, name, _stand_in(original, f"{owner_name}.{name}" if owner_name else name))
        for module in GRIDS:
            if not getattr(module.plot_images, "_yolofeed_routed", False):
                module.plot_images = _grid_stand_in(module.plot_images)


def _stand_in(original: Callable[..., Any], qualname: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def figure(*args: Any, **kwargs: Any) -> Any:
        draw = getattr(_route, "draw", None)
        if draw is not None and draw(qualname, args, kwargs):
            return None  # what each returns (their TryExcept's None on a failure, or nothing)
        return original(*args, **kwargs)

    figure._yolofeed_routed = True  # type: ignore[attr-defined]
    return figure


def train_grid_shown() -> int | None:
    """How many of a batch's images the trainers' train_batch grids show (``DetectionTrainer.plot_training_samples``
    draws with its module's ``plot_images`` at its default ``max_subplots``; RELIED_ON), or None where that cannot be
    read: then the grid gets the whole batch, as stock's does."""
    return _images_shown(_detect_train_module.plot_images)


def _images_shown(plot_images: Callable[..., Any]) -> int | None:
    """``plot_images``' default ``max_subplots`` (the first images of a batch it draws), or None: not a plain function
    (a partial, a callable object), or a release that draws otherwise."""
    try:  # plot_images is Ultralytics' @threaded wrapper (RELIED_ON: its function's rules)
        parameter = inspect.signature(threaded_function(plot_images)).parameters.get("max_subplots")
    except (TypeError, ValueError):
        return None
    return parameter.default if parameter is not None and isinstance(parameter.default, int) else None


def _grid_stand_in(original: Callable[..., Any]) -> Callable[..., Any]:
    shown = _images_shown(original)
    if shown is None:  # drawn as it draws
        return original

    @functools.wraps(original)
    def plot_images(*args: Any, **kwargs: Any) -> Any:
        if getattr(_route, "grids", False):
            n = kwargs.get("max_subplots", shown)
            labels = kwargs.get("labels")
            if isinstance(labels, dict) and labels.get("img") is not None:  # it draws labels["img"] then
                kwargs["labels"] = {**labels, "img": labels["img"][:n]}
            elif kwargs.get("images") is not None:
                kwargs["images"] = kwargs["images"][:n]
        return original(*args, **kwargs)

    plot_images._yolofeed_routed = True  # type: ignore[attr-defined]
    return plot_images


def figure_function(qualname: str) -> Callable[..., Any]:
    """The function ``qualname`` (one of ``FIGURES``, as ``draw`` gets it) names, without its stand-in."""
    owner_name, _, name = qualname.rpartition(".")
    fn = getattr(getattr(_metrics_module, owner_name) if owner_name else _metrics_module, name)
    return fn.__wrapped__ if getattr(fn, "_yolofeed_routed", False) else fn
