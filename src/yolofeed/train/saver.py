"""Each checkpoint serialised in a process of its own (the trainer's ``save_process``; on CUDA by default): the
training thread hands over host copies of what Ultralytics' ``save_model`` reads, and the GPU goes on training.

Ultralytics' ``save_model`` holds the training thread for 0.25-0.55 s an epoch on an H100 machine (yolo11n with
AdamW's state; BENCHMARKS.md, "The whole run"), with nothing queued on the GPU meanwhile: a host sync a tensor for the
EMA's finite check, a Python deep copy of the EMA and of the optimiser's state, a host sync a tensor for each copy to
the host, and the pickling. Made in a thread beside the training, the pickling holds the interpreter, and the training
thread, which gives it up at every torch call, waits for it as long: a process of its own shares no interpreter.

Here the training thread makes (``Saver.save``):

* one finite check of the EMA (``all_finite``: one sync); where it fails, Ultralytics' own ``save_model`` runs in the
  training thread, which repairs the EMA from the model;
* one pickle of what ``save_model`` reads of the trainer (``seam.checkpoint_inputs``: the EMA model, the optimiser's
  and the scaler's state dicts, the epoch, fitness, metrics, arguments, results.csv's rows), each tensor left out
  (``_Pickler``), and the EMA's criterion, which ``save_model`` drops, sent as None;
* one device-to-host copy of those tensors a dtype, each tensor's bytes in their storage order, without a sync.

The checkpoint writer's thread (train/writes.py) then waits for the copy, hands it to the child and waits for its
reply: readers of last.pt, best.pt and epochN.pt wait for it as for a write. The child rebuilds the objects on the host
(each tensor with its own storage, shape and strides) and runs Ultralytics' own ``save_model`` on a stand-in trainer
(``seam.CheckpointStandIn``), which writes the files through train/checkpoints.py's atomic writes. The checkpoint is
stock's but for where ``torch.load`` puts its tensors when given no ``map_location``: on the host, where stock's go to
the training GPU; Ultralytics loads every checkpoint with ``map_location="cpu"``.

Where the child cannot take a checkpoint (it died, was stopped, or failed other than in a write), that checkpoint is
made in the writer's thread from the same host copies, and every later one by Ultralytics' ``save_model`` in the
training thread, with one line saying so. A failed write (a full disk) is the folder's, as a write's in
train/writes.py: raised at the next batch's end, the file it was to replace whole.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import select
import struct
import subprocess
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from yolofeed import processes
from yolofeed.errors import first_line
from yolofeed.limits import memory_available
from yolofeed.processes import DIE_WITH_PARENT
from yolofeed.train.checkpoints import AtomicPath
from yolofeed.train.overlap import all_finite
from yolofeed.train.writes import WRITES
from yolofeed.ultralytics_seam import LOGGER, CheckpointStandIn, checkpoint_files, checkpoint_inputs

POLL_S = 0.5  # how often a wait on the child looks whether it died or was stopped
CLOSE_WAIT_S = 10.0  # how long the run's end waits for the child to exit once its input is closed
CHILD_MEMORY = 1 << 30  # available host memory asked for the child (torch's 0.3 GB, a checkpoint's copies, room)
CHUNK = 1 << 20  # bytes a write to the child's pipe is given at once
FRAME = struct.Struct("<Q")  # a message's length, before it
SERVE = DIE_WITH_PARENT + "from yolofeed.train.saver import serve\nserve()\n"


class _NotPlain(Exception):
    """A tensor the host copy does not rebuild as it is (a subclass, sparse, with autograd history or attributes)."""


class _Gone(Exception):
    """The child cannot take the checkpoint: it ended, was stopped, or its pipe broke."""


@dataclass
class _Tensor:
    """How the child rebuilds one tensor: its group (a dtype's bytes), its elements' offset there, its layout."""

    group: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    parameter: bool
    requires_grad: bool


class _Pickler(pickle.Pickler):
    """Pickles an object with each tensor in it left out (recorded in ``tensors``, once however often it is referred
    to: the pickle's memo refers to it again) and the objects ``as_none`` pickled as None. ``reducer_override`` is
    not called for the plain containers and scalars, most of a model's objects: a third less time than
    ``persistent_id``, which is called for every object."""

    def __init__(self, file: io.BytesIO, as_none: list[Any]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []
        self._none = {id(o) for o in as_none}
        self._storages: set[int] = set()  # each tensor's storage: one it shares, or a part of one, is not sent

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if type(obj) not in (torch.Tensor, torch.nn.Parameter) or obj.layout != torch.strided or (
                    obj.grad_fn is not None or obj.is_quantized or obj.__dict__):
                raise _NotPlain(f"a tensor of type {type(obj).__name__}, layout {obj.layout}")
            storage = obj.untyped_storage()
            if obj.numel() and (obj.storage_offset() or storage.nbytes() != obj.numel() * obj.element_size()
                                or not _dense(obj) or storage.data_ptr() in self._storages):
                # torch.save writes the whole storage, as it is: the host copy sends the tensor's elements
                raise _NotPlain("a view of a storage, a tensor with gaps or overlaps, or a storage shared by two")
            self._storages.add(storage.data_ptr())
            self.tensors.append(obj)
            return _tensor, (len(self.tensors) - 1,)
        if id(obj) in self._none:
            return _none, ()
        return NotImplemented


def _tensor(index: int) -> Any:
    """A tensor's place in ``_Pickler``'s pickle; ``_Unpickler`` puts the tensor rebuilt there."""
    raise RuntimeError("yolofeed's checkpoint inputs are read by train/saver.py's rebuild")


def _none() -> None:
    """An object ``_Pickler`` sent as None."""


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: list[torch.Tensor]):
        super().__init__(file)
        self.tensors = tensors

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_tensor":
            return self.tensors.__getitem__
        return super().find_class(module, name)


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill a run of its storage without gaps or overlaps, in some order of its dimensions
    (contiguous, channels-last, a permutation of either)."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


@dataclass
class Job:
    """One checkpoint's inputs on their way to the host: the pickle without its tensors, how to rebuild each, and one
    buffer a (device, dtype) group (pinned host memory filled by a copy ``ready`` marks, on CUDA)."""

    payload: bytes
    tensors: list[_Tensor]
    groups: list[torch.Tensor]
    ready: torch.cuda.Event | None

    @classmethod
    def of(cls, inputs: dict[str, Any], as_none: list[Any]) -> Job:
        """``inputs`` pickled, their tensors copied to the host: queued on the current CUDA stream, not waited for."""
        buffer = io.BytesIO()
        pickler = _Pickler(buffer, as_none)
        pickler.dump(inputs)
        with torch.no_grad():  # views and copies of tensors that may require gradients, without autograd's record
            return cls._copied(buffer.getvalue(), pickler.tensors)

    @classmethod
    def _copied(cls, payload: bytes, pickled: list[torch.Tensor]) -> Job:
        keys: dict[tuple[torch.device, torch.dtype], int] = {}
        parts: list[list[torch.Tensor]] = []
        sizes: list[int] = []
        tensors = []
        for t in pickled:
            group = keys.setdefault((t.device, t.dtype), len(parts))
            if group == len(parts):
                parts.append([])
                sizes.append(0)
            flat = t.as_strided((t.numel(),), (1,))  # its storage, whole and dense (_Pickler): no copy
            tensors.append(_Tensor(group, sizes[group], tuple(t.shape), t.stride(), t.dtype,
                                   isinstance(t, torch.nn.Parameter), t.requires_grad))
            parts[group].append(flat)
            sizes[group] += flat.numel()
        if len({d for d, _ in keys if d.type == "cuda"}) > 1:
            raise _NotPlain("tensors on more than one GPU")  # one event marks the copies of one device's queue
        groups, ready = [], None
        for (device, dtype), views in zip(keys, parts):
            flat = torch.cat(views) if views else torch.empty(0, dtype=dtype, device=device)
            if device.type == "cuda":  # pinned: the copy runs on the GPU's queue, and the training thread goes on
                host = torch.empty(flat.numel(), dtype=dtype, pin_memory=True)
                host.copy_(flat, non_blocking=True)
                ready = torch.cuda.Event()
            else:  # torch.cat made it the tensors' own copy
                host = flat
            groups.append(host)
        if ready is not None:
            ready.record(torch.cuda.current_stream(next(d for d, _ in keys if d.type == "cuda")))
        return cls(payload, tensors, groups, ready)

    def frames(self) -> list[memoryview]:
        """What the child reads: the header's length and the header (the pickle and the layouts), then each group's
        bytes."""
        header = pickle.dumps((self.payload, self.tensors, [(g.dtype, g.numel()) for g in self.groups]),
                              protocol=pickle.HIGHEST_PROTOCOL)
        return [memoryview(FRAME.pack(len(header))), memoryview(header),
                *(memoryview(_bytes_of(g)) for g in self.groups)]


def _bytes_of(t: torch.Tensor) -> Any:
    """The bytes of a 1-D host tensor (any dtype; numpy has no bfloat16)."""
    return t.view(torch.uint8).numpy() if t.numel() else b""


def rebuild(payload: bytes, tensors: list[_Tensor], groups: list[torch.Tensor]) -> dict[str, Any]:
    """The inputs ``Job.of`` pickled, each tensor on the host with a storage of its own, its shape and strides."""
    built = []
    for spec in tensors:
        t = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype)
        n = t.numel()
        if n:
            t.as_strided((n,), (1,)).copy_(groups[spec.group][spec.offset:spec.offset + n])
        built.append(torch.nn.Parameter(t, requires_grad=spec.requires_grad) if spec.parameter
                     else t.requires_grad_(spec.requires_grad))
    return _Unpickler(io.BytesIO(payload), built).load()


def save_rebuilt(payload: bytes, tensors: list[_Tensor], groups: list[torch.Tensor],
                 path_class: type = AtomicPath) -> bool:
    """Ultralytics' ``save_model`` on the rebuilt inputs (``seam.CheckpointStandIn``), its files written atomically
    through ``path_class``."""
    return CheckpointStandIn(rebuild(payload, tensors, groups), path_class).save()


class Saver:
    """The child that serialises the run's checkpoints (see the module's doc); ``save`` hands it one."""

    def __init__(self, child: subprocess.Popen):
        self._child: subprocess.Popen | None = child
        self.gone: str | None = None  # why the child takes no more checkpoints, once it does not
        os.set_blocking(child.stdin.fileno(), False)  # a write never blocks on a child that does not read
        self._finalizer = weakref.finalize(self, _end, child, 0.0)

    @classmethod
    def start(cls) -> Saver | None:
        """The child started now (its imports run beside the training); None where none can start (no interpreter
        that takes ``-c``, less than ``CHILD_MEMORY`` available, no process to spare): Ultralytics' save_model then
        runs in the training thread, as stock's."""
        if getattr(sys, "frozen", False) or not sys.executable:
            return None
        try:
            if memory_available() < CHILD_MEMORY:
                return None
            path = os.pathsep.join(p for p in sys.path if p)  # the parent's own import path, not the working folder
            child = subprocess.Popen([sys.executable, "-c", SERVE, str(os.getpid())], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                                     start_new_session=True,
                                     # no GPU: the child holds no CUDA context of its own
                                     env={**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""})
        except Exception as e:  # no process or memory to spare: saved in the training thread, as stock
            LOGGER.debug(f"yolofeed: no checkpoint process ({first_line(e)})")
            return None
        return cls(child)

    def save(self, trainer: Any) -> bool:
        """Hand the trainer's checkpoint to the child (queued behind the folder's writes); False where the caller is
        to run Ultralytics' ``save_model`` itself: the child gone, an EMA not finite (save_model repairs it), inputs
        that do not pickle or hold tensors not rebuilt as they are."""
        if self.gone is not None:
            return False
        inputs, as_none = checkpoint_inputs(trainer)
        floats = [t for t in inputs["ema"].state_dict().values() if t.is_floating_point()]
        if floats and not all_finite(floats):
            return False
        try:
            job = Job.of(inputs, as_none)
        except Exception as e:  # an attribute that does not pickle, a tensor not rebuilt as it is, no memory
            LOGGER.debug(f"yolofeed: checkpoint saved in the training thread ({first_line(e)})")
            return False
        WRITES.run(checkpoint_files(inputs), lambda: self._hand_over(job))
        return True

    def _hand_over(self, job: Job) -> bool:
        """In the writer's thread: the copy waited for, the job to the child, its reply; where the child cannot take
        it, the checkpoint made here from the same copies."""
        if job.ready is not None:
            job.ready.synchronize()  # the GPU reached the copy: gives up the interpreter while it waits
        if self.gone is None:
            try:
                kind, value = self._exchange(job.frames())
            except _Gone as e:
                self._give_up(str(e))
            else:
                if kind == "saved":
                    return value
                if kind == "unwritten":  # a file could not be written (a full disk): the folder's failure, as a write's
                    raise value
                self._give_up(f"failed ({value})")
        return save_rebuilt(job.payload, job.tensors, job.groups)

    def _give_up(self, why: str) -> None:
        self.gone = why
        LOGGER.warning(f"yolofeed: the checkpoint process {why}; checkpoints are now serialised in the training "
                       "process, as Ultralytics does")
        child, self._child = self._child, None
        if child is not None:
            _end(child, 0.0)

    def _exchange(self, frames: list[memoryview]) -> tuple[str, Any]:
        """``frames`` written to the child, its reply read: ("saved", save_model's result), ("unwritten", a file's
        write error) or ("failed", another error). Waits as long as the child works; raises ``_Gone`` once it ended or
        is stopped, or on anything else that goes wrong here (the checkpoint is then made in this process)."""
        child = self._child
        if child is None:
            raise _Gone("ended")
        watch = _Watch(child)
        try:
            for view in frames:
                view = view.cast("B")
                while view.nbytes:
                    if not watch.ready(child.stdin.fileno(), select.POLLOUT):
                        continue
                    with contextlib.suppress(BlockingIOError):
                        view = view[os.write(child.stdin.fileno(), view[:CHUNK]):]
            size = FRAME.unpack(watch.read(FRAME.size))[0]
            return pickle.loads(watch.read(size))
        except _Gone:
            raise
        except Exception as e:  # a broken pipe, a reply cut short or not a reply
            raise _Gone(watch.ended() or f"stopped answering ({type(e).__name__}: {first_line(e)})") from None

    def close(self) -> None:
        """End the child (an empty header: it exits once its last checkpoint is written, as at its input's end, which a
        process forked meanwhile would keep open), not waited for: the caller has waited for the folder's writes, and
        the child's interpreter takes a while to end. A daemon thread reaps it (killed after ``CLOSE_WAIT_S``)."""
        child, self._child = self._child, None
        if child is not None:
            self._finalizer.detach()
            with contextlib.suppress(OSError, ValueError):
                os.set_blocking(child.stdin.fileno(), True)
                os.write(child.stdin.fileno(), FRAME.pack(0))
            processes.Daemon(_end, child, CLOSE_WAIT_S, name="yolofeed-checkpoints-end")


class _Watch:
    """Waits on the child's pipes (``poll``: any descriptor number) a ``POLL_S`` at a time, raising ``_Gone`` once it
    ended or stayed stopped (SIGSTOP, a debugger) for two looks in a row (a profiler's sampling stops it briefly)."""

    def __init__(self, child: subprocess.Popen):
        self.child = child
        self._stopped = 0

    def ready(self, fd: int, event: int) -> bool:
        poller = select.poll()
        poller.register(fd, event)
        if poller.poll(POLL_S * 1000):
            self._stopped = 0
            return True
        if (why := self.ended(0.0)) is not None:  # a look, not a wait: the reply may come meanwhile
            raise _Gone(why)
        self._stopped = self._stopped + 1 if processes.stopped(self.child.pid) else 0
        if self._stopped >= 2:
            self.child.kill()
            raise _Gone("was stopped (SIGSTOP or a debugger) and was ended")
        return False

    def read(self, n: int) -> bytes:
        """``n`` bytes from the child's reply pipe, waited for while it lives and runs."""
        fd, data = self.child.stdout.fileno(), bytearray()
        while len(data) < n:
            if not self.ready(fd, select.POLLIN):
                continue
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise _Gone(self.ended() or "closed its output")
            data += chunk
        return bytes(data)

    def ended(self, wait: float = 0.2) -> str | None:
        """How the child ended, or None; waited for ``wait`` seconds at most (after a pipe broke or closed: a killed
        child's pipe closes before it is reaped)."""
        code = self.child.poll()
        if code is None and wait > 0:
            try:
                code = self.child.wait(wait)
            except subprocess.TimeoutExpired:
                return None
        return None if code is None else f"ended (exit code {code})"


def _end(child: subprocess.Popen, wait: float) -> None:
    """The child's input closed, and it waited for ``wait`` seconds to exit, then killed; reaped."""
    for pipe in (child.stdin, child.stdout):
        with contextlib.suppress(OSError, ValueError):
            pipe.close()
    try:
        child.wait(wait)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


class _Unwritten(Exception):
    """In the child: a checkpoint file could not be written (``error``, the write's own)."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class _ChildPath(AtomicPath):
    """The child's checkpoint paths: a failure to make the folder or write a file is told apart from any other."""

    def write_bytes(self, data: Any) -> int:
        try:
            return super().write_bytes(data)
        except OSError as e:
            raise _Unwritten(e) from None

    def mkdir(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().mkdir(*args, **kwargs)
        except OSError as e:
            raise _Unwritten(e) from None


def serve() -> None:
    """The child's loop: each job read from stdin, saved (``save_rebuilt``), its reply written to the parent; ends at
    the end of its input. What it would print goes nowhere (its stdout is the parent's reply pipe)."""
    torch.set_num_threads(1)  # the host copies' rebuild and the pickling: a core beside the training's
    reply = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    while True:
        head = _read_exactly(0, FRAME.size)
        if head is None or FRAME.unpack(head)[0] == 0:  # the input's end, or the parent's close
            return
        payload, tensors, layout = pickle.loads(_read_exactly(0, FRAME.unpack(head)[0]) or b"")  # EOFError if cut
        groups = []
        for dtype, n in layout:
            data = _read_exactly(0, n * torch.empty(0, dtype=dtype).element_size())
            groups.append(torch.frombuffer(data, dtype=dtype) if n else torch.empty(0, dtype=dtype))
        try:
            message = ("saved", save_rebuilt(payload, tensors, groups, _ChildPath))
        except _Unwritten as e:
            message = ("unwritten", _picklable(e.error))
        except BaseException as e:
            message = ("failed", f"{type(e).__name__}: {first_line(e)}")
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        os.write(reply, FRAME.pack(len(data)) + data)


def _read_exactly(fd: int, n: int) -> bytearray | None:
    """``n`` bytes from ``fd``; None at its end before the first, and ``EOFError`` after it."""
    data = bytearray()
    while len(data) < n:
        chunk = os.read(fd, min(n - len(data), 1 << 24))
        if not chunk:
            if not data and n:
                return None
            raise EOFError("the parent's message was cut short")
        data += chunk
    return data


def _picklable(e: OSError) -> OSError:
    """``e`` where it pickles and unpickles (a write's ``WriteError`` does, its errno kept), else an OSError with its
    errno and line."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return OSError(e.errno, f"{type(e).__name__}: {first_line(e)}")
