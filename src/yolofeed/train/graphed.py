"""The model's training forward and backward replayed as CUDA graphs, with batch norm and SiLU fused.

yolo11n's step at batch 128 launches about 2,000 kernels (forward, loss, backward), and the host takes about as long
to launch them as the GPU takes to run them (BENCHMARKS.md, "The step itself"). A kernel that makes the GPU's part
faster then makes the step no faster: the fused batch norm + SiLU (kernels/bn_silu.py) cuts the GPU's time and adds
host time. Replayed as a graph, the model's forward and its backward cost the host one launch each, so the GPU's
savings reach the step.

``install(trainer)`` (at ``on_train_start``, after the EMA copied the model, with ``graphed_step``, the default) does
five things to the training model:

* every Ultralytics ``Conv`` whose batch norm and activation are plain ``BatchNorm2d`` and ``SiLU`` becomes a
  ``FusedConv``: while a graph is being captured its batch norm and SiLU run as the one Triton op; otherwise (an eager
  step, validation, any other caller) exactly Ultralytics' ``Conv.forward``;
* two layout changes that keep every value: the head's nearest upsamples run in half precision, as the convolutions
  after them would cast them (``HalfUpsample``), and the Detect head's training outputs are laid out cells-major,
  as the loss reads them (``TokenMajorDetect``); both only while a graph is captured, otherwise Ultralytics' own;
  the capture also records the channel concatenations of NHWC activations as one Triton copy an input
  (kernels/channel_cat.py: ``torch.cat`` copies a channel slice one element a thread), the same values;
* Ultralytics' ``C2f`` and ``C3k2`` become ``HalvesC2f`` and ``HalvesC3k2``: while a graph is captured, their first
  Conv's output is written as the two dense halves their forward chunks it into (no copy of a channel slice
  forward, no join of the two gradients backward), the same values;
* every trained ``Conv2d`` becomes a ``CastConv2d``: inside the capture all their weights are cast for autocast in one
  launch, and their gradients cast back in one, where autocast casts each at its use (the same values); otherwise
  torch's ``Conv2d``;
* the model's class gains ``GraphedPredict``: ``predict`` in training mode, on a CUDA batch of the shape of the first
  full batch, replays the graph (``torch.cuda.make_graphed_callables``: the forward and the backward, each one graph;
  the loss stays eager); any other call is Ultralytics' ``predict``. The capture happens on the first such batch,
  or before the first epoch (``capture_ahead``, on a blank full batch): three warm-up passes and the capture, with
  every batch-norm buffer restored after them, so the model's statistics see each training batch once, as stock's
  do.

The swapped classes pickle and deep-copy as Ultralytics' own (``__reduce_ex__``): Ultralytics copies the training
model into a new EMA when it resumes or recovers from a NaN, and a checkpoint must load without yolofeed. The state
dict is untouched.

The graph's backward hands out its own gradient buffers, which autograd may keep as the parameters' ``.grad``: the
optimiser must drop the gradients between steps (``zero_grad(set_to_none=True)``, Ultralytics' default), not zero
them in place, or the next replay's gradient would be added to itself.

Where the graph cannot serve, the step stays eager and one line says why: another process group (DDP), a compiled
model, ``multi_scale`` (a size a batch), gradient accumulation (the graph's gradient buffers are reused by every
replay), no Triton, and a capture that
fails or runs out of memory (the model is restored and the capture is not tried again).
"""

from __future__ import annotations

import copyreg
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from yolofeed import ultralytics_seam as seam
from yolofeed.kernels import bn_silu as bn_silu_op
from yolofeed.kernels import channel_cat
from yolofeed.kernels.bn_silu import bn_silu, bn_silu_halves, fusable

WARMUP = 3  # make_graphed_callables' warm-up passes before the capture (its default)
# thread_local, as the augmentation's and FastMuSGD's captures: in the default global mode the loader thread (primed
# just before the warm-up: nvJPEG's allocations and stream synchronize) or the validation thread invalidates the
# capture, or gets a CUDA error of its own (cudaErrorStreamCaptureUnsupported). Older torch has no such argument.
_THREAD_LOCAL = ({"capture_error_mode": "thread_local"}
                 if "capture_error_mode" in inspect.signature(torch.cuda.make_graphed_callables).parameters else {})


class _StockPickle:
    """Copies and pickles as the Ultralytics class this one was swapped from (``_stock``), without ``_graph``, a cast
    weight left by a forward that failed, or ``fused`` set by a capture."""

    _stock: type

    def __reduce_ex__(self, protocol: Any) -> Any:
        state = dict(self.__dict__)
        state.pop("_graph", None)
        state.pop("_short", None)
        state.pop("_cast", None)
        state.pop("fused", None)  # a copy made inside a capture (the EMA's) is Ultralytics' layer, not fusing
        return copyreg._reconstructor, (self._stock, object, None), state  # __newobj__ insists on the own class


class FusedConv(_StockPickle, seam.Conv):
    """Ultralytics' ``Conv``; while ``fused`` (a graph capture), batch norm and SiLU as one Triton op."""

    _stock = seam.Conv
    fused = False  # set on the instance around a capture (``_fusing``)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused or not self.training:
            return super().forward(x)
        y = self.conv(x)
        bn = self.bn
        if not self._fuses(y):
            return self.act(bn(y))
        bn.num_batches_tracked.add_(1)  # as BatchNorm2d counts (its momentum is set: the count is not read)
        return bn_silu(y, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps)

    def forward_halves(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``forward(x).chunk(2, 1)`` (C2f's); while ``fused``, the two halves as dense tensors (``bn_silu_halves``)."""
        if not self.fused or not self.training:
            return super().forward(x).chunk(2, 1)
        y = self.conv(x)
        bn = self.bn
        if not (self._fuses(y) and y.shape[1] % 2 == 0):
            return self.act(bn(y)).chunk(2, 1)
        bn.num_batches_tracked.add_(1)
        return bn_silu_halves(y, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps,
                              y.shape[1] // 2)

    def _fuses(self, y: torch.Tensor) -> bool:
        return fusable(y) and self.bn.training and self.bn.momentum is not None


_C2F_FORWARD = seam.C2f.forward  # the pinned forward (ultralytics_seam checks its source), not one patched later


class _Halves:
    """C2f's forward; while ``fused`` (a graph capture), cv1's output as two dense halves (``forward_halves``).

    Stock's ``cv1(x).chunk(2, 1)`` gives two channel slices of one channels-last map: the first Bottleneck's
    convolution copies the second to dense rows before it reads it, and the chunk's backward joins the halves'
    gradients into one tensor, a copy each way of a map that is among the step's largest (yolo11n's first C3k2s run
    at 160 and 80 px). Here the fused op writes the halves dense and its backward reads their gradients where they
    are: the same values and the same gradients."""

    fused = False
    _stock: type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused or not self.training:
            return self._stock.forward(self, x)
        y = list(self.cv1.forward_halves(x))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class HalvesC2f(_Halves, _StockPickle, seam.C2f):
    """Ultralytics' ``C2f``; while ``fused``, ``_Halves``' forward."""

    _stock = seam.C2f


class HalvesC3k2(_Halves, _StockPickle, seam.C3k2):
    """Ultralytics' ``C3k2`` (C2f's forward, other blocks in ``m``); while ``fused``, ``_Halves``' forward."""

    _stock = seam.C3k2


class HalfUpsample(_StockPickle, nn.Upsample):
    """torch's ``Upsample``; while ``fused`` (a graph capture), nearest upsampling in its input's dtype.

    Autocast runs upsampling in float32 (ATen's float32 cast list): each of the head's upsamples casts a half map to
    float32 and writes its 4x larger output in float32, the Concat after it promotes the skip connection to float32,
    and the convolution after that casts the result back to half, and the same again for the gradients. Nearest
    upsampling only copies values, so the half result holds the float32 result's values, and its gradient (four
    gradients summed in float32, rounded once to half) is the float32 path's too. ``half_upsamples`` picks the upsamples
    whose output reaches one convolution's cast, through one Concat, each taking it once: there no gradient is summed
    in half that stock sums in float32, and the step stays the same arithmetic."""

    _stock = nn.Upsample
    fused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fused or not self.training:
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):  # the op in x's dtype, not autocast's float32
            return super().forward(x)


class TokenMajorDetect(_StockPickle, seam.Detect):
    """Ultralytics' ``Detect``; while ``fused`` (a graph capture), its training outputs laid out cells-major.

    Stock's ``forward_head`` views each level's channels-last head output as (batch, channels, cells) and concatenates
    along the cells, a transposing copy into a channels-major tensor, which the loss transposes back
    (``.permute(0, 2, 1).contiguous()``), and the backward transposes both again. Here each level is taken as
    (batch, cells, channels), a view of its channels-last map, concatenated along the cells and returned transposed:
    the same values at the same indices, and the loss's ``.contiguous()`` copies nothing (with the channels-last maps
    Ultralytics trains on CUDA; others are copied once, as stock's view-and-cat copies them)."""

    _stock = seam.Detect
    fused = False

    def forward_head(self, x: list[torch.Tensor], box_head: nn.Module | None = None,
                     cls_head: nn.Module | None = None) -> dict[str, torch.Tensor]:
        if not self.fused or not self.training or box_head is None or cls_head is None:
            return super().forward_head(x, box_head, cls_head)

        def cells_major(heads: nn.Module) -> torch.Tensor:
            maps = [heads[i](x[i]) for i in range(self.nl)]  # (batch, channels, h, w) each, channels-last
            rows = [m.permute(0, 2, 3, 1).reshape(m.shape[0], -1, m.shape[1]) for m in maps]
            return torch.cat(rows, 1).transpose(1, 2)

        return {"boxes": cells_major(box_head), "scores": cells_major(cls_head), "feats": x}


class CastConv2d(_StockPickle, nn.Conv2d):
    """torch's ``Conv2d``; in a forward that ``cast_for_autocast`` prepared, with the weight and bias it cast.

    Autocast casts each convolution's float32 weight to half where it is used, and the backward casts each weight's
    gradient back: about 90 kernels of a few microseconds each way in yolo11n's step, each too small to fill the GPU.
    ``cast_for_autocast`` casts every weight at once, one launch each way (``torch._foreach_copy_``): the same
    roundings, so the same values. The cast is taken once: a second call in the same forward casts as autocast does."""

    _stock = nn.Conv2d
    fused = False  # set around a capture as the other swaps' (the cast it takes is what ``_Flat`` hands it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cast = self.__dict__.pop("_cast", None)
        if cast is None:
            return super().forward(x)
        return self._conv_forward(x, *cast)


class _CastAll(torch.autograd.Function):
    """Tensors cast to ``dtype`` as ``.to(dtype)`` casts them, and their gradients cast back, each list in one
    ``_foreach_copy_``."""

    @staticmethod
    def forward(ctx: Any, dtype: torch.dtype, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.dtypes = [t.dtype for t in tensors]
        out = [torch.empty_like(t, dtype=dtype) for t in tensors]
        torch._foreach_copy_(out, list(tensors))
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out = [torch.empty_like(g, dtype=d) for g, d in zip(grads, ctx.dtypes)]
        torch._foreach_copy_(out, list(grads))
        return (None, *out)


def cast_for_autocast(convs: list[CastConv2d], dtype: torch.dtype) -> None:
    """Give each of ``convs`` (float32 weights) its weight and bias cast to autocast's ``dtype`` for its next
    forward, all in one cast. Under autocast a convolution then finds its weight in ``dtype`` and casts nothing."""
    tensors = [t for m in convs for t in (m.weight, m.bias) if t is not None]
    cast = iter(_CastAll.apply(dtype, *tensors))
    for m in convs:
        m._cast = (next(cast), next(cast) if m.bias is not None else None)


def castable_convs(model: nn.Module) -> list[nn.Module]:
    """The model's plain ``Conv2d``s whose float32 weight is trained (a frozen one, as Ultralytics' DFL, is cast
    where it is used)."""
    return [m for m in model.modules() if type(m) in (nn.Conv2d, CastConv2d) and m.weight.requires_grad
            and m.weight.dtype == torch.float32 and (m.bias is None or m.bias.dtype == torch.float32)]


def half_upsamples(model: nn.Module) -> list[nn.Upsample]:
    """The model's nearest ``Upsample`` layers whose output one Concat takes, once, whose output in turn one layer
    takes, once, that hands its input to one convolution alone (Ultralytics' Conv, or a C2f whose forward is C2f's
    and whose cv1 is a Conv): autocast casts it to half there, so a half Concat is the float32 one's values. Taken
    more than once, either one's gradient would be summed in half where stock sums it in float32 and rounds once:
    such a model, and a model of another shape, keeps its upsamples."""
    model = seam.unwrap_model(model)
    if not seam.since(seam.GRAPH_LAYOUT_SINCE) or not isinstance(getattr(model, "model", None), nn.Sequential):
        return []
    takers = seam.layer_inputs(model)
    layers = list(model.model)

    def one_convolution(t: nn.Module) -> bool:
        return type(t) in (seam.Conv, FusedConv) or (
            isinstance(t, seam.C2f) and type(t).forward in (seam.C2f.forward, _Halves.forward)
            and type(t.cv1) in (seam.Conv, FusedConv))

    def only_taker(i: int) -> nn.Module | None:
        return takers[i][0] if len(takers[i]) == 1 else None

    picked = []
    for i, m in enumerate(layers):
        concat = only_taker(i)
        if type(m) in (nn.Upsample, HalfUpsample) and m.mode == "nearest" and type(concat) is seam.Concat:
            taker = only_taker(concat.i)
            if taker is not None and one_convolution(taker):
                picked.append(m)
    return picked


def fusable_convs(model: nn.Module) -> list[nn.Module]:
    """The model's Convs that ``FusedConv`` takes: exactly Ultralytics' Conv, BatchNorm2d (affine, tracking) and
    SiLU."""
    return [m for m in model.modules()
            if type(m) in (seam.Conv, FusedConv) and type(m.act) is nn.SiLU and type(m.bn) is nn.BatchNorm2d
            and m.bn.affine and m.bn.track_running_stats]


# the swapped classes (``uninstall`` restores them); ``_Fusing`` sets their ``fused``
_SWAPPED = (FusedConv, HalfUpsample, TokenMajorDetect, CastConv2d, HalvesC2f, HalvesC3k2)


class _Fusing:
    """Inside the block, the model's swapped layers take their fast path (FusedConvs fuse: the warm-up passes compile
    the Triton kernels, the capture records them); after it, an eager call is Ultralytics' again."""

    def __init__(self, layers: list[nn.Module]):
        self.layers = layers

    def __enter__(self) -> None:
        for m in self.layers:
            m.fused = True

    def __exit__(self, *exc: Any) -> None:
        for m in self.layers:
            m.__dict__.pop("fused", None)


class _Flat(nn.Module):
    """The model's training predictions as a flat tuple of tensors (what a graphed callable returns)."""

    def __init__(self, model: nn.Module, autocast: dict):
        super().__init__()
        self.model = model
        self.autocast = autocast
        self.spec = None

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        convs = [m for m in self.model.modules() if type(m) is CastConv2d] if self.autocast["enabled"] else []
        with torch.autocast("cuda", **self.autocast, cache_enabled=False):  # a graph cannot keep autocast's cache
            try:
                if convs:
                    cast_for_autocast(convs, self.autocast["dtype"])
                preds = self.model._stock.predict(self.model, img)
            finally:
                for m in convs:
                    m.__dict__.pop("_cast", None)  # one a forward did not reach (a layer skipped, an error)
        flat, self.spec = pytree.tree_flatten(preds)
        return tuple(flat)


class _Graph:
    """The graphed forward and backward for one input shape, made on first use."""

    def __init__(self, model: nn.Module, autocast: dict, log: Any, before_capture: Callable[[], None] | None = None):
        self.model, self.autocast, self.log = model, autocast, log
        self.before_capture = before_capture  # the trainer's: waits for a validation running beside the training
        self.shape: tuple[int, ...] | None = None
        self.dtype: torch.dtype | None = None  # the input's: float32, or the autocast's with half_input
        self.flat: _Flat | None = None
        self.failed = False

    def takes(self, x: torch.Tensor) -> bool:
        if self.failed or not x.is_cuda or not torch.is_grad_enabled():
            return False
        return self.shape is None or (tuple(x.shape) == self.shape and x.dtype == self.dtype)

    def __call__(self, x: torch.Tensor) -> Any:
        if self.flat is None:
            self._capture(x)
            if self.flat is None:
                return None
        out = self.flat(x)
        return pytree.tree_unflatten(list(out), self.flat.spec)

    def _capture(self, x: torch.Tensor) -> None:
        if self.before_capture is not None:
            self.before_capture()
        model = self.model
        buffers = [b.detach().clone() for b in model.buffers()]
        flat = _Flat(model, self.autocast)
        swapped = [m for m in model.modules() if isinstance(m, _SWAPPED)]
        convs = [m for m in swapped if isinstance(m, FusedConv)]
        self.tickets = torch.zeros(bn_silu_op.TICKETS, device=x.device, dtype=torch.int32)
        bn_silu_op.own_tickets = self.tickets
        try:
            # the step's own autocast caches casts, which a capture cannot keep: this one is the step's, uncached
            with _Fusing(swapped), channel_cat.patched(), torch.autocast("cuda", **self.autocast,
                                                                          cache_enabled=False):
                torch.cuda.make_graphed_callables(flat, (x.detach().clone(),), num_warmup_iters=WARMUP,
                                                  allow_unused_input=True, **_THREAD_LOCAL)
        except Exception as e:  # OOM, an op that cannot be captured, what make_graphed_callables asserts
            # (hooks on the module, buffers that require grad, outputs that are not tensors)
            self.failed = True
            torch.cuda.empty_cache()
            self.log(f"yolofeed: the training step stays eager (its CUDA graph could not be made: "
                     f"{type(e).__name__}: {str(e).splitlines()[0][:200]})")
            return
        finally:
            bn_silu_op.own_tickets = None
            with torch.no_grad():
                for b, saved in zip(model.buffers(), buffers):
                    b.copy_(saved)  # the warm-up and capture passes moved the batch-norm statistics
        self.flat, self.shape, self.dtype = flat, tuple(x.shape), x.dtype
        n = sum(isinstance(m, HalfUpsample) for m in swapped) if self.autocast["enabled"] else 0
        halves = f", {n} upsample{'s' * (n != 1)} in half precision" if n else ""
        self.log(f"yolofeed: the training forward and backward replay as CUDA graphs at batch {x.shape[0]}, "
                 f"{x.shape[-1]} px ({len(convs)} batch norms + SiLU fused{halves}); other shapes run eager")


class GraphedPredict(_StockPickle):
    """Before the model's own class: ``predict`` in training mode replays ``_graph`` where it takes the batch, and
    runs a batch of another size in ``_short``'s thread where that takes it (train/short_batches.py)."""

    def predict(self, x: Any, profile: bool = False, augment: bool = False, embed: Any = None, **kwargs: Any) -> Any:
        graph = self.__dict__.get("_graph")
        if graph is not None and self.training and not (profile or augment or embed or kwargs):
            if graph.takes(x):
                out = graph(x)
                if out is not None:
                    return out
            short = self.__dict__.get("_short")
            if short is not None and short.takes(x):
                return short(self._stock.predict, self, x)
        return self._stock.predict(self, x, profile=profile, augment=augment, embed=embed, **kwargs)


_graphed_classes: dict[type, type] = {}


def _graphed_class(cls: type) -> type:
    """``cls`` with ``GraphedPredict`` before it (one class per model class, so that instances share it)."""
    if cls not in _graphed_classes:
        _graphed_classes[cls] = type(f"Graphed{cls.__name__}", (GraphedPredict, cls),
                                     {"_stock": cls, "__module__": __name__})
    return _graphed_classes[cls]


def why_not(trainer: Any) -> str | None:
    """Why the trainer's step cannot replay as a graph, or None."""
    if trainer.device.type != "cuda":
        return "not on CUDA"
    if seam.world_size(trainer) > 1:
        return "DDP: each rank's backward feeds its gradient all-reduce"
    if seam.compiled(trainer):
        return "compile=True: the model is already compiled"
    if (getattr(trainer.args, "multi_scale", 0) or 0) > 0:
        return (f"multi_scale={trainer.args.multi_scale}: each batch takes its own image size, and a graph replays "
                "one")
    if hasattr(trainer, "accumulate") and seam.batches_per_step(trainer) != 1:  # set with the loaders
        return (f"gradients accumulate over {seam.batches_per_step(trainer)} batches (batch {trainer.batch_size} < "
                f"nbs {trainer.args.nbs}), and a graph's gradient buffers are reused by every replay")
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed (the fused batch norm is a Triton kernel)"
    return None


def install(trainer: Any) -> bool:
    """Make ``swap``'s swaps in the training model and give it a graph (see the module's doc); returns whether the
    graph will be tried."""
    why = why_not(trainer)
    if why is not None:
        if trainer.device.type == "cuda":  # elsewhere there is nothing to graph: no line
            seam.LOGGER.info(f"yolofeed: the training step stays eager ({why})")
        return False
    model = seam.unwrap_model(trainer.model)
    if isinstance(model, GraphedPredict):
        return True
    swap(model)
    amp = seam.step_autocast(trainer)
    autocast = {"enabled": bool(amp), "dtype": amp if isinstance(amp, torch.dtype) else torch.float16}
    model.__dict__["_graph"] = _Graph(model, autocast, seam.LOGGER.info, getattr(trainer, "_settle_overlapped", None))
    return True


def swap(model: nn.Module) -> None:
    """Every swap ``install`` makes, without the graph: FusedConvs, the layout's, CastConv2ds and ``GraphedPredict``
    (with no ``_graph`` it predicts as Ultralytics)."""
    for m in fusable_convs(model):
        seam.swap_class(m, seam.Conv, FusedConv)
    swap_layout(model)
    swap_halves(model)
    swap_convs(model)
    model.__class__ = _graphed_class(type(model))


def swap_layout(model: nn.Module) -> None:
    """The head's upsamples that ``half_upsamples`` picks become ``HalfUpsample``s, and Ultralytics' own ``Detect``
    (not a subclass: each task's head adds outputs of its own layout) a ``TokenMajorDetect``: both only while a graph
    is captured, and from ``GRAPH_LAYOUT_SINCE`` on."""
    for m in half_upsamples(model):
        seam.swap_class(m, nn.Upsample, HalfUpsample)
    if seam.since(seam.GRAPH_LAYOUT_SINCE):
        for m in model.modules():
            seam.swap_class(m, seam.Detect, TokenMajorDetect)


def swap_halves(model: nn.Module) -> None:
    """Ultralytics' own ``C2f`` and ``C3k2`` whose cv1 is a ``FusedConv`` become ``HalvesC2f`` and ``HalvesC3k2``
    (their cv1's output as two dense halves while a graph is captured), from ``GRAPH_LAYOUT_SINCE`` on."""
    if not seam.since(seam.GRAPH_LAYOUT_SINCE):
        return
    for m in model.modules():
        if type(getattr(m, "cv1", None)) is FusedConv and type(m).forward is _C2F_FORWARD:
            seam.swap_class(m, seam.C2f, HalvesC2f) or seam.swap_class(m, seam.C3k2, HalvesC3k2)


def swap_convs(model: nn.Module) -> None:
    """The model's ``castable_convs`` become ``CastConv2d``s: their weights cast at once inside the capture."""
    for m in castable_convs(model):
        seam.swap_class(m, nn.Conv2d, CastConv2d)


def capture_ahead(model: nn.Module, batch: int, imgsz: int, device: torch.device,
                  dtype: torch.dtype = torch.float32) -> bool:
    """Make the graph now, on a blank batch of ``batch`` images of ``imgsz`` in ``dtype`` (the step input's:
    ``SyncFreeStep.step_input_dtype``, else float32; zeros: a capture's output is thrown away and every batch-norm
    buffer is restored after it), instead of in the first training step. Its three
    warm-up passes, the capture and the fused batch norm's Triton compiles (about 0.3-1 s at batch 128) then fall
    before the first epoch, as cuDNN's set-up does (train/warmup.py). No parameter's ``.grad`` is touched:
    ``make_graphed_callables``' passes take their gradients with ``torch.autograd.grad``. Returns whether the model
    now holds a graph for that shape (False: no graph installed, one made already, or the capture failed, which
    logs why and leaves the step eager)."""
    model = seam.unwrap_model(model)
    graph = model.__dict__.get("_graph")
    if graph is None or graph.flat is not None or graph.failed or device.type != "cuda":
        return False
    was = model.training
    model.train()  # the graph replays training-mode predictions: Ultralytics' epoch sets train() before each step
    try:
        with torch.enable_grad():
            blank = torch.zeros(batch, 3, imgsz, imgsz, device=device, dtype=dtype)
            graph._capture(blank)  # not a replay: it would move the batch-norm statistics
    finally:
        model.train(was)
    return graph.flat is not None


def drop_stale(trainer: Any, batch: int, batches: int) -> None:
    """After an out-of-memory retry rebuilt the train loader at ``batch``, ``batches`` an epoch
    (``BaseTrainer._build_train_pipeline``): a graph made for another batch never replays again, yet its private pool
    keeps that batch's activations. Drop it; where the graph still serves (``why_not``: the halved batch may now
    accumulate gradients) a fresh one captures at the new size on its first full batch, else the step stays eager."""
    model = seam.unwrap_model(trainer.model)
    graph = model.__dict__.get("_graph")
    if graph is None or graph.shape is None or graph.shape[0] == batch:
        return
    # BaseTrainer sets the new accumulate only after the loader is built: the reduced batch's, as it will compute it
    accumulate = seam.accumulate_for(trainer, batch, batches)
    why = why_not(trainer) or (f"gradients now accumulate over {accumulate} batches" if accumulate != 1 else None)
    short = model.__dict__.pop("_short", None)  # made for the old batch's short sizes
    if short is not None:
        short.close()
    if why is None:
        model.__dict__["_graph"] = _Graph(model, graph.autocast, graph.log, graph.before_capture)
    else:
        uninstall(model)
        seam.LOGGER.info(f"yolofeed: the training step stays eager after the batch was reduced ({why})")
    del graph
    gc.collect()
    torch.cuda.empty_cache()  # the old graph's pool goes back before the retry allocates


def uninstall(model: nn.Module) -> None:
    """The model as Ultralytics made it again (its classes, no graph, no short batches' thread)."""
    model = seam.unwrap_model(model)
    short = model.__dict__.pop("_short", None)
    if short is not None:
        short.close()
    if isinstance(model, GraphedPredict):
        model.__dict__.pop("_graph", None)
        model.__class__ = model._stock
    for m in model.modules():
        if type(m) in _SWAPPED:
            m.__class__ = m._stock
