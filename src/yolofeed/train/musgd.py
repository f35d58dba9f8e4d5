"""Ultralytics' MuSGD with its whole update one CUDA graph replay.

Ultralytics picks MuSGD (``ultralytics/optim/muon.py``) for any run past 10,000 iterations. Its step costs little
arithmetic (a few GFLOP of bf16 Newton-Schulz for yolo11n) but much host time, and the GPU waits for all of it:

* MuSGD does not declare ``_step_supports_amp_scaling``, so ``GradScaler.step`` reads ``found_inf`` back to the host
  before calling it: the host waits for the backward pass to finish, and the GPU then idles while the host launches
  the step, one kernel at a time;
* the step's Python works per parameter (state look-ups, layouts, buckets) and per bucket (each Newton-Schulz is
  about 20 small launches), several hundred launches a step.

``FastMuSGD`` is the same optimiser: a subclass of Ultralytics' ``MuSGD`` with its parameter groups and state, so its
``state_dict`` is stock's and a checkpoint resumes under either. Only the launch changes:

* the gradients are copied into one flat buffer (one multi-tensor copy); the rest of the update is one CUDA graph,
  captured at the second step, replayed after. Python runs per step only to gather the gradients and check that
  the graph still fits them (the same parameters with gradients, in the same storage);
* ``lr`` and ``momentum``, which Ultralytics' warm-up moves every step and its scheduler every epoch, live in a small
  device tensor the graph reads: copied from pinned memory when they change, never captured as constants;
* GradScaler hands ``found_inf`` (and, if the gradients are still scaled, ``grad_scale``) over on the device: a step
  with a non-finite gradient leaves every parameter and buffer bit for bit as it was, as stock's skipped step does,
  with no host read.

The arithmetic is stock's, in stock's order (``muon_update`` and ``FastMuSGD._update`` are copies, pinned in
``ultralytics_seam.COPIED``; the Newton-Schulz is stock's own function), but for one thing: stock adds a product with
a Python scalar in one rounding (``_foreach_add_(x, y, alpha=s)``, a fused multiply-add); with the scalar on the device
it is a multiply, then an add: two roundings. Where the scalars are powers of two the results agree bit for bit;
with Ultralytics' hyper-parameters they differ by float32 roundings, whose effect tests/test_musgd.py bounds.

Anything the plan cannot take (a parameter that gained or lost its gradient, a storage replaced, a non-float32
parameter, a failed capture) takes stock's own step, or this module's eager update, with one log line saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from yolofeed.errors import first_line
from yolofeed.ultralytics_seam import MuSGD, zeropower_via_newtonschulz5

log = logging.getLogger(__name__)

# The device scalars of a parameter group, one row per group: stock's Python scalars, computed as stock does.
NLR_MUON, NLR, BETA, ONE_MINUS_BETA, DECAY = range(5)
SKIPPED = (0.0, 0.0, 1.0, 0.0, 0.0)  # the row a skipped step uses: no update, momentum kept, nothing added
UPLOADS = 4  # pinned slots for the scalars: one is rewritten only once the copy from it 4 changes ago has run


def muon_update(grad: list[torch.Tensor], momentum: list[torch.Tensor], beta: torch.Tensor,
                one_minus_beta: torch.Tensor, nesterov: bool = True) -> list[torch.Tensor]:
    """Ultralytics' ``muon_update`` with ``beta`` and ``1 - beta`` as device scalars (0-d tensors).

    Stock's ``_foreach_add_(m, g, alpha=1 - beta)`` (one rounding) is ``m + g * (1 - beta)`` here (two). The buckets,
    the zero padding and the batched Newton-Schulz are stock's, line for line: the same matrices reach the same
    kernels.

    Shape:
        grad, momentum: one tensor per parameter (2-d matrices and 4-d convolution filters); returns the updates,
        each of its gradient's shape.
    """
    grads, momentums = grad, momentum
    torch._foreach_mul_(momentums, beta)
    torch._foreach_add_(momentums, torch._foreach_mul(grads, one_minus_beta))
    if nesterov:
        updates = list(torch._foreach_mul(momentums, beta))
        torch._foreach_add_(updates, torch._foreach_mul(grads, one_minus_beta))
    else:
        updates = list(momentums)
    buckets = {}  # group matrices by (columns, scale) for batched orthogonalization
    for i, u in enumerate(updates):
        dense = u.is_contiguous()
        nhwc = not dense and u.ndim == 4 and u.is_contiguous(memory_format=torch.channels_last)
        m = u.permute(0, 2, 3, 1).flatten(1) if nhwc else (u.flatten(1) if u.ndim > 2 else u.contiguous())
        scale = max(1, grads[i].size(-2) / grads[i].size(-1)) ** 0.5
        buckets.setdefault((m.size(1), scale, m.device, m.dtype), []).append(
            (i, m, u.stride() if dense or nhwc else None))
    groups = []  # split each bucket until its row counts span at most 16x, bounding the padding below
    for key, items in buckets.items():
        items.sort(key=lambda t: -t[1].size(0))
        start = 0
        for j in range(1, len(items) + 1):
            if j == len(items) or items[start][1].size(0) > 16 * items[j][1].size(0):
                groups.append((key, items[start:j]))
                start = j
    for (cols, scale, device, dtype), items in groups:
        X = torch.zeros(len(items), items[0][1].size(0), cols, device=device, dtype=dtype)
        torch._foreach_add_([X[j, : m.size(0)] for j, (_, m, _) in enumerate(items)], [m for _, m, _ in items])
        X = zeropower_via_newtonschulz5(X).contiguous().to(grads[items[0][0]].dtype).mul_(scale)
        for j, (i, m, stride) in enumerate(items):
            x = X[j, : m.size(0)]
            updates[i] = x.as_strided(grads[i].shape, stride) if stride else x.reshape(grads[i].shape)
    return updates


@dataclass
class _Group:
    """One parameter group as the plan steps it: its parameters that have gradients, and their state."""

    row: int  # its row of the scalars
    params: list[torch.Tensor]
    grads: list[torch.Tensor]  # views of the plan's flat gradient buffer
    momentum: list[torch.Tensor]  # state "momentum_buffer"
    sgd: list[torch.Tensor]  # state "momentum_buffer_SGD" (Muon groups), else empty
    use_muon: bool
    nesterov: bool
    decay: bool  # weight_decay != 0 (stock skips the add otherwise)


@dataclass
class _Plan:
    """What one graph steps: the groups, the flat buffers it reads, and how to tell it still fits."""

    groups: list[_Group]
    flat: torch.Tensor  # every gradient, float32, one after another
    grads: list[torch.Tensor]  # the flat buffer's views, in ``with_grad`` order
    with_grad: list[torch.Tensor]  # the parameters stepped, in param_groups order
    has_grad: tuple[bool, ...]  # for every parameter of param_groups, in order: whether it had a gradient
    storage: tuple[int, ...]  # data_ptr of every parameter and state buffer stepped
    structure: tuple  # (use_muon, nesterov, decay) of every group
    scalars: torch.Tensor  # (groups, 5) float32 on the device: stock's Python scalars (NLR_MUON ...)
    skipped: torch.Tensor  # (5,) the row of a skipped step (SKIPPED)
    found_inf: torch.Tensor  # 0-d float32: > 0 skips the step
    inv_scale: torch.Tensor  # 0-d float32: the gradients' unscale (1 once GradScaler unscaled them)
    host: torch.Tensor  # (UPLOADS, groups, 5) pinned on CUDA: the scalars' upload slots
    uploads: list = field(default_factory=lambda: [None] * UPLOADS)  # the CUDA event of each slot's last copy
    slot: int = 0
    last: tuple | None = None  # the scalars last uploaded
    steps: int = 0  # updates made with this plan
    graph: Any = None  # torch.cuda.CUDAGraph once captured; False: capture failed, stay eager
    stream: Any = None  # the side stream of the warm-up and the capture


class FastMuSGD(MuSGD):
    """Ultralytics' ``MuSGD`` stepped as one CUDA graph; ``adopt`` turns a stock instance into one in place.

    ``step`` takes ``found_inf`` and ``grad_scale`` from ``GradScaler`` on the device (``_step_supports_amp_scaling``),
    so ``scaler.step`` never reads the host.
    """

    _step_supports_amp_scaling = True

    # called before each capture (the trainer's: it waits for a validation running beside the training, where a
    # device-wide sync would invalidate the capture)
    before_capture: Callable[[], None] | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        self._plan: _Plan | None = None
        self._said: set[str] = set()
        super().__init__(*args, **kwargs)

    @classmethod
    def adopt(cls, optimizer: Any) -> Any:
        """Make a stock ``MuSGD`` a ``FastMuSGD`` in place (its groups and state kept); anything else is returned as
        it is (a subclass of MuSGD may step differently)."""
        if type(optimizer) is not MuSGD:
            return optimizer
        optimizer.__class__ = cls
        optimizer._plan, optimizer._said = None, set()
        return optimizer

    # -- what resets the plan -----------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict) -> None:
        """Stock's, then a new plan: the state buffers are new tensors (a resume, Ultralytics' NaN recovery)."""
        super().load_state_dict(state_dict)
        self._plan = None

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._plan = None

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "muon": self.muon, "sgd": self.sgd}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._plan, self._said = None, set()

    # -- the step ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """One MuSGD update of every parameter with a gradient; skipped on the device when ``found_inf`` > 0.

        Returns:
            The closure's loss, if a closure was given.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)  # set by GradScaler.step around this call
        grad_scale = getattr(self, "grad_scale", None)
        everything = [p for group in self.param_groups for p in group["params"]]
        grads = [p.grad for p in everything]
        plan = self._plan
        if plan is None or not self._fits(plan, everything, grads):
            plan = self._plan = self._make_plan(everything, grads)
        if plan is None:
            self._stock_step(found_inf, grad_scale)
            return loss
        torch._foreach_copy_(plan.grads, [g for g in grads if g is not None])
        _set(plan.found_inf, found_inf, 0.0)
        _set(plan.inv_scale, None if grad_scale is None else grad_scale.double().reciprocal().float(), 1.0)
        self._upload(plan)
        self._run(plan)
        return loss

    def _stock_step(self, found_inf: torch.Tensor | None, grad_scale: torch.Tensor | None) -> None:
        """Ultralytics' own step, with GradScaler's skip and unscale done as ``GradScaler.step`` does them for an
        optimiser without ``_step_supports_amp_scaling``. Reads ``found_inf`` on the host: a sync, on this path only."""
        if found_inf is not None and found_inf.item():
            return
        if grad_scale is not None:
            grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
            torch._foreach_mul_(grads, grad_scale.double().reciprocal().float())
        super().step()

    def _say(self, key: str, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info("yolofeed: MuSGD %s", text)

    # -- the plan ---------------------------------------------------------------------------------------------
    def _fits(self, plan: _Plan, everything: list[torch.Tensor], grads: list) -> bool:
        """Whether the plan still steps these parameters: the same ones have gradients, nothing moved storage, and
        every group has the structure it was planned with. Python per parameter: identity checks only."""
        if tuple(g is not None for g in grads) != plan.has_grad or _structure(self) != plan.structure:
            return False
        return _storage(self, plan.with_grad) == plan.storage

    def _make_plan(self, everything: list[torch.Tensor], grads: list) -> _Plan | None:
        """The groups and flat buffers for these gradients, or None (said once) where stock's step must run."""
        with_grad = [p for p, g in zip(everything, grads) if g is not None]
        if not with_grad:
            return None
        device = with_grad[0].device
        unfit = next((p for p, g in zip(everything, grads) if g is not None and (
            p.dtype != torch.float32 or g.dtype != torch.float32 or g.shape != p.shape or g.is_sparse
            or p.device != device or g.device != device)), None)
        if unfit is not None:
            self._say("unfit", f"steps as Ultralytics' own: a parameter of {tuple(unfit.shape)} is {unfit.dtype} on "
                               f"{unfit.device}, the graph takes float32 parameters and dense gradients on one device")
            return None
        flat = torch.zeros(sum(p.numel() for p in with_grad), dtype=torch.float32, device=device)
        views, offset = {}, 0  # by id: a tensor's == compares values
        for p in with_grad:  # in the parameter's own layout (channels-last on CUDA under Ultralytics' default), so
            # that the gradients' copy and every multi-tensor op stay on the dense fast path
            dense = p.is_contiguous() or (p.ndim == 4 and p.is_contiguous(memory_format=torch.channels_last))
            views[id(p)] = (flat.as_strided(p.shape, p.stride(), offset) if dense
                            else flat[offset: offset + p.numel()].view(p.shape))
            offset += p.numel()
        groups = []
        for row, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if id(p) in views]
            for p in params:  # stock makes the buffers at a parameter's first step
                if len(self.state[p]) == 0:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                    if group["use_muon"]:
                        self.state[p]["momentum_buffer_SGD"] = torch.zeros_like(p)
            groups.append(_Group(
                row, params, [views[id(p)] for p in params], [self.state[p]["momentum_buffer"] for p in params],
                [self.state[p]["momentum_buffer_SGD"] for p in params] if group["use_muon"] else [],
                bool(group["use_muon"]), bool(group["nesterov"]), group["weight_decay"] != 0))
        n = len(self.param_groups)
        cuda = device.type == "cuda"
        plan = _Plan(
            groups=groups, flat=flat, grads=[views[id(p)] for p in with_grad], with_grad=with_grad,
            has_grad=tuple(g is not None for g in grads), storage=_storage(self, with_grad), structure=_structure(self),
            scalars=torch.zeros(n, 5, dtype=torch.float32, device=device),
            skipped=_skipped_row(device),
            found_inf=torch.zeros((), dtype=torch.float32, device=device),
            inv_scale=torch.ones((), dtype=torch.float32, device=device),
            host=torch.zeros(UPLOADS, n, 5, dtype=torch.float32, pin_memory=cuda))
        if self._plan is not None:
            self._say("replanned", "graph made again: the parameters with gradients, their storage or a group's "
                                   "structure changed")
        return plan

    def _upload(self, plan: _Plan) -> None:
        """Stock's Python scalars, computed as stock computes them, onto the device when they changed (every step of
        Ultralytics' warm-up, once an epoch after). The pinned slot is reused only after its last copy ran."""
        rows = tuple(_scalars(group, self.muon, self.sgd) for group in self.param_groups)
        if rows == plan.last:
            return
        plan.last = rows
        slot = plan.slot
        plan.slot = (slot + 1) % UPLOADS
        if plan.uploads[slot] is not None:
            plan.uploads[slot].synchronize()  # a copy UPLOADS changes ago: long done
        plan.host[slot].copy_(torch.tensor(rows, dtype=torch.float64))  # float64 -> float32 as stock's kernels cast
        plan.scalars.copy_(plan.host[slot], non_blocking=True)
        if plan.host.is_pinned():
            plan.uploads[slot] = torch.cuda.Event()
            plan.uploads[slot].record()

    def _run(self, plan: _Plan) -> None:
        """The update: eager on the CPU and at a plan's first CUDA step (on the side stream the graph is captured on:
        the warm-up), captured at its second and replayed from then on."""
        if plan.flat.device.type != "cuda" or plan.graph is False:
            self._update(plan)
        elif plan.graph is not None:
            plan.graph.replay()
        elif plan.steps == 0:
            plan.stream = torch.cuda.Stream(plan.flat.device)
            plan.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(plan.stream):
                self._update(plan)
            torch.cuda.current_stream().wait_stream(plan.stream)
        else:
            self._capture(plan)
        plan.steps += 1

    def _capture(self, plan: _Plan) -> None:
        """Capture the update and replay it; on any failure (out of memory, an op that cannot be captured) say so
        once and stay eager. Capturing runs no kernel, so the failed step is made eagerly."""
        if self.before_capture is not None:
            self.before_capture()
        graph = torch.cuda.CUDAGraph()
        try:
            plan.stream.wait_stream(torch.cuda.current_stream())
            # thread_local: the validation thread's set-up (train/validation.py) and the loader thread may run and
            # allocate meanwhile; in the default global mode either would invalidate the capture
            with torch.cuda.graph(graph, stream=plan.stream, capture_error_mode="thread_local"):
                self._update(plan)
        except Exception as e:  # noqa: BLE001 - any capture failure falls back; the message keeps its type
            torch.cuda.synchronize()
            plan.graph = False
            self._say("capture", f"stays eager: its CUDA graph could not be captured ({first_line(e)})")
            self._update(plan)
            return
        plan.graph = graph
        graph.replay()

    def _update(self, plan: _Plan) -> None:
        """Ultralytics' ``MuSGD.step`` over the plan's buffers, with its scalars read from the device; a step with
        ``found_inf`` > 0 uses ``SKIPPED``'s scalars and zeroed gradients, which leave everything unchanged.

        No host sync and no allocation outside the graph's pool: this is what is captured.
        """
        skip = plan.found_inf > 0
        plan.flat.mul_(plan.inv_scale)
        plan.flat.masked_fill_(skip, 0.0)  # an inf or NaN times 0 is NaN: zero them instead
        scalars = torch.where(skip, plan.skipped, plan.scalars)
        for group in plan.groups:
            if not group.params:
                continue
            s = scalars[group.row]
            params = group.params
            if group.use_muon:
                updates = muon_update(group.grads, group.momentum, s[BETA], s[ONE_MINUS_BETA], group.nesterov)
                torch._foreach_add_(params, torch._foreach_mul(updates, s[NLR_MUON]))
                buffers = group.sgd
            else:
                buffers = group.momentum
            # SGD update
            grads = group.grads
            if group.decay:
                grads = torch._foreach_add(grads, torch._foreach_mul(params, s[DECAY]))
            torch._foreach_mul_(buffers, s[BETA])
            torch._foreach_add_(buffers, grads)
            updates = torch._foreach_add(grads, torch._foreach_mul(buffers, s[BETA])) if group.nesterov else buffers
            torch._foreach_add_(params, torch._foreach_mul(updates, s[NLR]))


def _scalars(group: dict, muon: float, sgd: float) -> tuple[float, ...]:
    """A group's row of stock's Python scalars, computed as ``MuSGD.step`` computes them."""
    lr, momentum = group["lr"], group["momentum"]
    if group["use_muon"]:
        return -(lr * muon), -(lr * sgd), momentum, 1 - momentum, group["weight_decay"]
    return 0.0, -lr, momentum, 1 - momentum, group["weight_decay"]


def _skipped_row(device: torch.device) -> torch.Tensor:
    """``SKIPPED`` on the device, written by kernels (a copy from the host would wait for the GPU)."""
    row = torch.zeros(len(SKIPPED), dtype=torch.float32, device=device)
    for i, v in enumerate(SKIPPED):
        if v:
            row[i] = v
    return row


def _structure(optimizer: MuSGD) -> tuple:
    return tuple((bool(g["use_muon"]), bool(g["nesterov"]), g["weight_decay"] != 0) for g in optimizer.param_groups)


def _storage(optimizer: MuSGD, params: list[torch.Tensor]) -> tuple[int, ...]:
    """Where every stepped parameter and its state buffers live; a missing buffer reads -1."""
    state = optimizer.state
    return tuple(x for p in params for x in (
        p.data_ptr(), *(state[p][k].data_ptr() if k in state[p] else -1
                        for k in ("momentum_buffer", "momentum_buffer_SGD"))))


def _set(target: torch.Tensor, value: torch.Tensor | None, default: float) -> None:
    """``target`` = ``value`` (a device tensor, no host read) or ``default``."""
    if value is None:
        target.fill_(default)
    else:
        target.copy_(value.reshape(()))
