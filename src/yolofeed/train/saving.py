"""Each epoch's checkpoint saved beside the next epoch's training (``save_beside``, off by default).

Ultralytics' ``save_model`` runs between two epochs, in the training thread: it checks that the EMA is finite (a host
sync a tensor), copies it in half precision, copies the optimiser's state, serialises both (``torch.save``: each tensor
copied to the host, Python's pickling) and writes last.pt and best.pt (here each to a temporary file, fsynced and
renamed: train/checkpoints.py). No step is queued meanwhile and the GPU idles: 0.4-0.7 s an epoch for yolo11n at
batch 128 on an H200, a tenth of its 4.3 s of training (BENCHMARKS.md, "The whole run").

Off by default: side by side on an H100 the training thread's time in ``save_model`` fell from 0.26-0.45 s an epoch to
0.07-0.13 s, and the epochs' training slowed by as much (BENCHMARKS.md, "The whole run"): the pickling held the
interpreter at the default switch interval. Under the short interval ``_save`` holds it is not measured
(``python -m tools.reproduce save-ab``).

``SavesBeside`` runs Ultralytics' own ``save_model`` in a worker thread of its own, on a view of the trainer frozen at
the epoch's end (``seam.save_view``: results.csv read then too). The training thread only copies the EMA and the
optimiser's state on the GPU (an epoch validated beside the next, ``val_overlap``, hands over the copies its snapshot
holds), checks that the EMA is finite (one host sync) and queues the save. On CUDA the save runs on a stream of its own,
after an event the copies end at, and its reads to the host sync that stream only. The files and their bytes are
stock's; what changes is when they are on the disk. The pickling holds the interpreter, which the training thread
needs at each torch call: the switch interval is short meanwhile (``processes.switched_often``).

Wherever something may read them, the training first waits for the save (``wait_for_saves``):

* at the next epoch's end (``on_train_epoch_end``), before Ultralytics' NaN recovery (which may reload last.pt), the
  next results.csv row and the next save: the save had the whole epoch;
* after a validation made in place, whose epoch end may have queued the epoch before's (``val_overlap``);
* before a CUDA graph capture in the training thread (the trainer's ``_settle_overlapped``): a capture in the global
  mode fails where another thread allocates meanwhile;
* before ``final_eval``, which strips and validates the files, and when the run stops (an error, Ctrl-C): the
  checkpoint in flight is finished, so the run resumes from it.

A save that fails (a full disk, a folder made read-only: train/checkpoints.py's line naming the file and the fix) is
raised in the training thread at the first of these, or at the next batch's end: where stock stops at its save, this
run stops a batch later, the previous checkpoint whole. One the thread could not make (out of GPU memory beside the
training, the thread not started) is made in the training thread from the same copies, with one line. The save is
made in place, as stock makes it, where a callback at an epoch's end may read the files (``seam.epoch_readers``, as
for ``val_overlap``: a logger uploading best.pt), where the EMA is not finite (Ultralytics' save then copies the
model's values into the live EMA), where the GPU has too little free memory for the copies, and with
``save_beside=False``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from yolofeed import processes
from yolofeed.errors import first_line
from yolofeed.train.overlap import all_finite, tensor_bytes
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
    stream reached ``ready`` (the copies made); everything it queued done before the view is let go.

    The serialisation is Python's pickling, which holds the interpreter: the training thread gives it up at each torch
    call and, at the default switch interval, waits up to 5 ms to get it back, a call at a time (a whole run on an
    H100: its epochs' training 0.2 s slower, what the save took off them). ``processes.switched_often`` meanwhile."""
    stream = thread.stream
    with processes.switched_often():
        if stream is None or ready is None:
            save_model(view)
            return
        stream.wait_event(ready)
        try:
            with torch.cuda.stream(stream):
                save_model(view)
        finally:
            stream.synchronize()


class _Saving:
    """A save queued in the save thread: its future, and what redoes it in place (Ultralytics' ``save_model`` and the
    view it was given) where the thread could not make it for want of GPU memory or of a thread."""

    def __init__(self, future: Future, save_model: Callable[[Any], Any], view: Any):
        self.future, self.save_model, self.view = future, save_model, view


class SavesBeside:
    """Trainer mixin (before ``Validating`` in the bases): checkpoints saved beside the next epoch (the module's doc).

    ``_ending_snapshot`` is set by ``Validating`` while an epoch validated beside the next ends: its snapshot's EMA
    and state dicts are the epoch's own copies, which the save takes as they are.
    """

    save_beside: bool = False  # not measured a gain yet (the module's doc)
    _saver: SaveThread | None = None
    _saving: _Saving | None = None
    _ending_snapshot: Any = None

    def save_model(self):
        """Ultralytics' ``save_model``, run beside the next epoch (``_save_beside``), or here as stock runs it."""
        self.wait_for_saves()
        if self._save_beside():
            return True
        return super().save_model()

    def _save_beside(self) -> bool:
        """Queue this epoch's save in the save thread; False where it is made in place (the module's doc)."""
        if not self.save_beside or RANK not in (-1, 0) or epoch_readers(self):
            return False  # a callback at an epoch's end may read the files (a logger uploading best.pt): stock's
        ema = trainer_ema(self)
        if ema is None or not all_finite([v for v in ema.ema.state_dict().values() if v.is_floating_point()],
                                         self.device):
            return False
        snapshot = self._ending_snapshot
        model, states = ema.ema, checkpoint_states(self)
        cuda = self.device.type == "cuda"
        copies = COPIES if snapshot is None else COPIES - 1  # a snapshot's are made
        kept = tensor_bytes(model.state_dict().values()) + tensor_bytes(
            t for state in states[0].get("state", {}).values() for t in state.values())
        if cuda and torch.cuda.mem_get_info(self.device)[0] < copies * kept:
            return False
        if snapshot is None:  # the live EMA and optimiser, which the next epoch changes
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
        view = save_view(self, model, ema.updates, *states)
        self._saving = _Saving(self._saver.submit(_save, stock, view, ready, self._saver), stock, view)
        return True

    def wait_for_saves(self) -> None:
        """Wait for the checkpoint in flight, if any; its failure is raised here. A save the thread could not make
        (out of GPU memory, or the thread did not start) is made here from the same copies, with one line, and every
        later one in place."""
        saving = self._saving
        if saving is None:
            return
        try:
            processes.result(saving.future)
        except BaseException as e:
            if not saving.future.done():  # Ctrl-C in the wait: the save goes on, _close_saves waits for it
                raise
            self._saving = None
            thread_failed = self._saver is not None and e is self._saver.failed
            if not (isinstance(e, torch.OutOfMemoryError) or thread_failed):
                raise
            LOGGER.warning(f"yolofeed: the checkpoint could not be saved beside the training ({first_line(e)}); it "
                           "is saved now, and the next ones between the epochs, as stock saves them")
            self.save_beside = False
            saving.save_model(saving.view)
            return
        self._saving = None

    def _saved_yet(self) -> None:
        """After each training batch (``on_train_batch_end``): a save that ended is collected, its failure raised."""
        if self._saving is not None and self._saving.future.done():
            self.wait_for_saves()

    def _saved_by_epoch_end(self) -> None:
        """At each epoch's end (``on_train_epoch_end``): the save queued at the epoch before's end, done (it had the
        whole epoch). Ultralytics' NaN recovery may reload last.pt after it, and its next results.csv row and save
        follow; with ``val=False`` no validation comes between."""
        self.wait_for_saves()

    def validate(self):
        """Ultralytics' (and ``Validating``'s) validation; one made in place is followed by Ultralytics' NaN recovery,
        which may reload last.pt: a save queued meanwhile (an epoch ended late) is waited for."""
        result = super().validate()
        if not getattr(self, "_holding", False):
            self.wait_for_saves()
        return result

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
        elif saving is not None and not saving.future.cancelled() and saving.future.exception() is not None:
            LOGGER.warning(f"yolofeed: the last checkpoint was not saved: {first_line(saving.future.exception())}")
