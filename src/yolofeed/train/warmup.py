"""The first epoch's one-off costs, paid before it starts: cuDNN's set-up for each batch size an epoch trains.

A model's first forward and backward pass at a batch size it has not met costs seconds in every process: cuDNN
chooses and builds a plan for each convolution, forward and both backward passes. For yolo11n on an H200 that is
4.3-6.6 s for the full batch and 3.1-4.3 s for each other size (BENCHMARKS.md, "First epoch"); with cuDNN off
there is no such cost. Stock Ultralytics pays it too: its first step, and the epoch's last, smaller batch at the
very end of the first epoch. With a 10k-image set at 640 an epoch trains in under 6 s, so these costs alone cut
the first epoch's rate to a third of the steady one.

``warm_up`` runs one forward and backward pass of a copy of the model for each batch size this rank's epoch will train
(the full batch, the last batch's, a DDP rank's batch + 1), in the training thread, under the step's autocast: PyTorch
keeps a forward's cuDNN plans per calling thread (the backward's are the autograd engine's device thread's, shared by
every thread: BENCHMARKS.md, "First epoch"). Where the step's graph serves the full batch, the other sizes go to
``beside`` instead, whose thread makes their set-up beside the first epoch and forwards those batches
(train/short_batches.py). The copy keeps the trained model, its gradients, batch-norm statistics
and random streams untouched, and takes no part in DDP. The cost moves from inside the first epoch to before it: the
first epoch then trains at the steady rate (the run as a whole saves only what the warm-up overlaps: 1-3 s). On a
10k-image set the time to the first step stays below stock's; at COCO's size with a jpeg pack it came 10 s after
stock's (BENCHMARKS.md, "COCO scale on one machine"), where stock meets the last batch's set-up only at the end of a
two-minute epoch (how much of that gap the warm-up makes is not measured).
It also compiles the augmentation's Triton kernels (a throwaway augmenter on a blank batch: the training
augmenter's draws and partner pool are untouched).
With ``multi_scale`` only the base size is warmed: every other scale pays its set-up when it first comes.

A warm-up that runs out of GPU memory, or that cuDNN cannot plan, is skipped with one line: the training's own
first step then meets the same limit, where Ultralytics handles it (it halves the batch on a first-epoch
out-of-memory error).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from yolofeed.augment import GpuAugment
from yolofeed.schema import SourceBatch


def batch_sizes(sampler: Any) -> list[int]:
    """The distinct batch sizes of one epoch of ``sampler`` (an ``EpochSampler``), the full batch first."""
    sizes = {len(b) for b in sampler.batches()}
    return sorted(sizes, key=lambda n: (n != sampler.batch_size, -n))


def _tensors(x: Any) -> list[torch.Tensor]:
    """The tensors of a model's output: the detection head returns a dict (boxes, scores, feats), lists, a tensor."""
    if isinstance(x, torch.Tensor):
        return [x]
    values = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else []
    return [t for v in values for t in _tensors(v)]


def warm_model(model: nn.Module, sizes: list[int], imgsz: int, device: torch.device,
               amp: bool | torch.dtype) -> None:
    """One forward and backward pass of a copy of ``model`` at each batch size, on blank images.

    The convolutions meet the shapes, dtypes and layout of a training step (contiguous NCHW float under the
    step's autocast), which is what cuDNN's plans depend on; the loss does not matter, so it is the outputs' sum.

    Args:
        amp: the step's autocast, as Ultralytics' ``autocast`` takes it: True (float16), False, or a dtype
            (``torch.bfloat16`` for ``amp=bf16``).
    """
    passes(training_copy(model), sizes, imgsz, device, amp)


def training_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in training mode: its own parameters, buffers and autograd nodes (DDP's hooks stay
    behind, as do the graphed step's graph and swaps: train/graphed.py)."""
    return copy.deepcopy(model).train()


def passes(twin: nn.Module, sizes: list[int], imgsz: int, device: torch.device, amp: bool | torch.dtype) -> None:
    """``warm_model``'s passes, on ``twin`` (``training_copy``'s), which they leave without gradients."""
    dtype = amp if isinstance(amp, torch.dtype) else torch.float16
    for n in sizes:
        x = torch.zeros(n, 3, imgsz, imgsz, device=device)
        with torch.autocast(device.type, dtype=dtype, enabled=bool(amp)):
            out = twin(x)
        sum(t.float().sum() for t in _tensors(out)).backward()
        twin.zero_grad(set_to_none=True)
        del x, out  # one size's activations at a time: the peak stays a training step's


def blank_source(n: int, imgsz: int, width: int, device: torch.device,
                 kpt_shape: tuple[int, int] | None = None, corners: bool = False) -> SourceBatch:
    """``n`` grey images of ``imgsz`` with one box each (and its keypoints, for ``kpt_shape``; its four corners, with
    ``corners``): a batch the augmentation accepts, whatever it draws."""
    width = max(1, width)  # a set without labels (or classes= keeping none) pads to one slot, as the loader does
    valid = torch.zeros(n, width, dtype=torch.bool, device=device)
    valid[:, 0] = True
    boxes = torch.tensor([0.5, 0.5, 0.5, 0.5], device=device).repeat(n, width, 1)  # normalised xywh
    keypoints = None if kpt_shape is None else torch.full((n, width, kpt_shape[0], 3), 0.5, device=device)
    square = torch.tensor([[0.25, 0.25], [0.75, 0.25], [0.75, 0.75], [0.25, 0.75]], device=device)  # the box's
    return SourceBatch(torch.full((n, imgsz, imgsz, 3), 114, dtype=torch.uint8, device=device),
                       torch.full((n, 2), imgsz, dtype=torch.int64, device=device),
                       torch.zeros(n, width, device=device), boxes, valid, keypoints=keypoints,
                       corners=square.repeat(n, width, 1, 1) if corners else None)


def warm_augmentation(augment: GpuAugment, n: int, width: int, device: torch.device, corners: bool = False) -> None:
    """Run a throwaway copy of the augmentation once on a blank batch (of OBBs, with ``corners``): its Triton kernels
    compile now."""
    gen = torch.Generator(device=device).manual_seed(0) if device.type == "cuda" else torch.Generator().manual_seed(0)
    augment(blank_source(n, augment.hyp.imgsz, width, device, augment.hyp.kpt_shape, corners), gen, None)


def warm_up(model: nn.Module, sampler: Any, augment: GpuAugment, width: int, device: torch.device,
            amp: bool | torch.dtype, corners: bool = False, after_full: Callable[[], None] | None = None,
            beside: Callable[[list[int]], bool] | None = None, parts: dict[str, float] | None = None,
            run: Callable[..., Any] | None = None) -> float:
    """Pay the first epoch's one-off costs now (see the module's doc); returns the seconds it took. ``corners``: the
    batches are OBBs'. ``after_full`` runs once the full batch's pass is made, before the other sizes' (the trainer
    captures the step's graph there, then sets up the validations beside the rest). ``beside``, where given, is
    offered the other sizes next, and returns whether it took them (their set-up then runs beside the first epoch:
    train/short_batches.py); else they are passed here. ``run``, where given, runs the full batch's pass (``run(fn,
    *args)``: in the thread that captures the step's graph, train/plans.py). ``parts``, where given, gets the
    seconds of each: ``full_batch_s``, ``after_full_s``, ``other_sizes_s``, ``augmentation_s`` (each part's GPU work
    waited for on the training thread's stream: the validations' set-up beside it is not).

    Raises:
        torch.cuda.OutOfMemoryError, RuntimeError: as the passes raise them (the trainer skips the warm-up).
    """
    t0 = time.perf_counter()
    sizes = batch_sizes(sampler)
    if not sizes:  # an epoch without batches (drop_last with fewer images than a batch): nothing to meet
        return 0.0
    rng = torch.get_rng_state(), np.random.get_state()  # a blank pass draws nothing, but be sure
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    mark = [t0]

    def done(part: str) -> None:
        if parts is not None:
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()
            now = time.perf_counter()
            parts[part] = now - mark[0]
            mark[0] = now

    (run or _call)(warm_model, model, sizes[:1], augment.hyp.imgsz, device, amp)
    done("full_batch_s")
    if after_full is not None:
        after_full()
        done("after_full_s")
    if len(sizes) > 1:
        if beside is None or not beside(sizes[1:]):
            warm_model(model, sizes[1:], augment.hyp.imgsz, device, amp)
        done("other_sizes_s")  # handed to ``beside``: the model's copy
    warm_augmentation(augment, sizes[0], width, device, corners)
    done("augmentation_s")
    torch.set_rng_state(rng[0])
    np.random.set_state(rng[1])
    if cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng, device)
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)
