"""Each epoch's checkpoint saved beside the next epoch's training (``save_beside``, on by default).

Ultralytics' ``save_model`` runs between two epochs, in the training thread: it checks that the EMA is finite (a host
sync a tensor), copies it in half precision, copies the optimiser's state, serialises both (``torch.save``: each tensor
copied to the host, Python's pickling) and writes last.pt and best.pt (here each to a temporary file, fsynced and
renamed: train/checkpoints.py). No step is queued meanwhile and the GPU idles: 0.4-0.7 s an epoch for yolo11n at
batch 128 on an H200, a tenth of its 4.3 s of training (BENCHMARKS.md, "The whole run").

``SavesBeside`` runs Ultralytics' own ``save_model`` in a worker thread of its own, on a view of the trainer frozen at
the epoch's end (``seam.save_view``). The training thread only copies the EMA and the optimiser's state on the GPU (an
epoch validated beside the next, ``val_overlap``, hands over the copies its snapshot holds), checks that the EMA is
finite (one host sync) and queues the save. On CUDA the save runs on a stream of its own, after an event the copies end
at, and its reads to the host sync that stream only. The files and their bytes are stock's; what changes is when they
are on the disk.

Wherever something may read them, the training first waits for the save (``wait_for_saves``):

* before the next save (one is in flight at most), and at each validation's start, an epoch later;
* after a validation made in place: Ultralytics' NaN recovery, which follows it, may reload last.pt;
* before ``on_model_save`` where a callback other than Ultralytics' idle ones and yolofeed's runs there (a logger may
  upload the file);
* before a CUDA graph capture in the training thread (the trainer's ``_settle_overlapped``): a capture in the global
  mode fails where another thread allocates meanwhile;
* before ``final_eval``, which strips and validates the files, and when the run stops (an error, Ctrl-C): the
  checkpoint in flight is finished, so the run resumes from it.

A save that fails (a full disk, a folder made read-only: train/checkpoints.py's line naming the file and the fix) is
raised in the training thread at the first of these, or at the next batch's end: where stock stops at its save, this
run stops a batch later, the previous checkpoint whole. The save is made in place, as stock makes it, where the EMA is
not finite (Ultralytics' save then copies the model's values into the live EMA), where the GPU has too little free
memory for the copies, and with ``save_beside=False``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from yolofeed import processes
from yolofeed.errors import first_line
from yolofeed.train.validation import on_device
from yolofeed.ultralytics_seam import LOGGER, RANK, checkpoint_states, epoch_readers, save_view, trainer_ema

CLOSE_WAIT_S = 120.0  # how long a stopping run waits for the checkpoint in flight (a 110 MB file on a slow disk)
COPIES = 3  # the free GPU memory a save beside needs, in multiples of the EMA's and the optimiser's state: the
# training thread's copies, and Ultralytics' own in the thread (the half-precision EMA, the optimiser's state in half)


class SaveThread(processes.Worker):
    """The worker thread checkpoints are saved in (``processes.Worker``), on ``device``, with a CUDA stream of its own
    there."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream: torch.cuda.Stream | None = None
        super().__init__("yolofeed-checkpoints", first=self._on_device)

    def _on_device(self) -> None:
        if self.device.type == "cuda":
            on_device(self.device)()
            self.stream = torch.cuda.Stream(self.device)


def _save(save_model: Callable[[Any], Any], view: Any, ready: torch.cuda.Event | None, thread: SaveThread) -> None:
    """In the save thread: ``save_model`` (Ultralytics') on ``view``, on the thread's stream once the training's
    stream reached ``ready`` (the copies made); everything it queued done before the view is let go."""
    stream = thread.stream
    if stream is None or ready is None:
        save_model(view)
        return
    stream.wait_event(ready)
    try:
        with torch.cuda.stream(stream):
            save_model(view)
    finally:
        stream.synchronize()


def finite(model: torch.nn.Module) -> bool:
    """Whether every floating value of ``model``'s state dict is finite (one host sync)."""
    tensors = [v for v in model.state_dict().values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return not tensors or bool(torch.stack([t.isfinite().all() for t in tensors]).all())


def _bytes(state: Any) -> int:
    """The bytes of the tensors in a (nested) state dict or a model's state dict."""
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_bytes(v) for v in state)
    return 0


class SavesBeside:
    """Trainer mixin (before ``Validating`` in the bases): checkpoints saved beside the next epoch (the module's doc).

    ``_ending_snapshot`` is set by ``Validating`` while an epoch validated beside the next ends: its snapshot's EMA
    and state dicts are the epoch's own copies, which the save takes as they are.
    """

    save_beside: bool = True
    _saver: SaveThread | None = None
    _saving: Future | None = None
    _ending_snapshot: Any = None

    def save_model(self):
        """Ultralytics' ``save_model``, run beside the next epoch (``_save_beside``), or here as stock runs it."""
        self.wait_for_saves()
        if self._save_beside():
            return True
        return super().save_model()

    def _save_beside(self) -> bool:
        """Queue this epoch's save in the save thread; False where it is made in place (the module's doc)."""
        if not self.save_beside or RANK not in (-1, 0):
            return False
        ema = trainer_ema(self)
        if ema is None or not finite(ema.ema):
            return False
        snapshot = self._ending_snapshot
        model, states = ema.ema, checkpoint_states(self)
        cuda = self.device.type == "cuda"
        if snapshot is None:  # the live EMA and optimiser, which the next epoch changes
            if cuda and torch.cuda.mem_get_info(self.device)[0] < COPIES * (_bytes(model) + _bytes(states)):
                return False
            try:
                model, states = copy.deepcopy(model), copy.deepcopy(states)
            except torch.OutOfMemoryError:
                return False
        if self._saver is None:
            self._saver = SaveThread(self.device)
        if not self._saver.alive:
            return False
        ready = None
        if cuda:
            ready = torch.cuda.Event()
            ready.record()  # on the training thread's stream, after the copies
        stock = super().save_model.__func__  # Ultralytics' BaseTrainer.save_model
        self._saving = self._saver.submit(_save, stock, save_view(self, model, ema.updates, *states), ready,
                                          self._saver)
        return True

    def wait_for_saves(self) -> None:
        """Wait for the checkpoint in flight, if any; its failure is raised here."""
        saving, self._saving = self._saving, None
        if saving is not None:
            processes.result(saving)

    def _saved_yet(self) -> None:
        """After each training batch (``on_train_batch_end``): a save that ended is collected, its failure raised."""
        if self._saving is not None and self._saving.done():
            self.wait_for_saves()

    def validate(self):
        """Ultralytics' (and ``Validating``'s) validation, after the save in flight; one made in place is followed by
        Ultralytics' NaN recovery, which may reload last.pt: the save queued meanwhile is waited for too."""
        self.wait_for_saves()
        result = super().validate()
        if not getattr(self, "_holding", False):
            self.wait_for_saves()
        return result

    def run_callbacks(self, event: str):
        """Ultralytics' callbacks; ``on_model_save``'s after the save, where one of them may read the file."""
        if event == "on_model_save" and self._saving is not None and epoch_readers(self, (event,)):
            self.wait_for_saves()
        super().run_callbacks(event)

    def _settle_overlapped(self) -> None:
        """Before a CUDA graph capture in the training thread: the save in flight ended (then ``Validating``'s)."""
        self.wait_for_saves()
        super()._settle_overlapped()

    def _close_saves(self, finished: bool) -> None:
        """The run ended or stopped: the checkpoint in flight written (waited for up to ``CLOSE_WAIT_S``) and the thread
        closed. A stopped run says a failed save in one line (its own error is the one raised)."""
        saver, saving = self._saver, self._saving
        self._saver = self._saving = None
        if saver is None:
            return
        if not saver.close(wait=CLOSE_WAIT_S):
            LOGGER.warning(f"yolofeed: the checkpoint thread did not end within {CLOSE_WAIT_S:g} s (a slow disk?); "
                           "going on without it: the last checkpoint may be the epoch before's")
            processes.left_running("the checkpoint thread")
        elif saving is not None and not saving.cancelled() and saving.exception() is not None:
            LOGGER.warning(f"yolofeed: the last checkpoint was not saved: {first_line(saving.exception())}")
