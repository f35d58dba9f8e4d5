"""Training variants side by side in one process: Ultralytics' step or loss against yolofeed's sync-free ones.

Usage: python -m tools.device.step_ab DATA_YAML MODEL VARIANT[,VARIANT...] [--batch 128] [--imgsz 640] [--steps 100]
        [--optimizer auto]

VARIANT: a ``yolofeed bench`` mode (``ceiling``, ``yolofeed``, ...), alone or with a suffix: ``_stock_step``
(Ultralytics' optimiser step, which reads the loss items on the host after the backward pass), ``_stock_loss``
(Ultralytics' detection loss, 16 host syncs a step), ``_sync_free_loss`` (yolofeed's, the default) or
``_stock_musgd`` (Ultralytics' MuSGD as it is, not stepped as FastMuSGD: with ``--optimizer MuSGD``); then
optionally changes to the code, one or more in a row:
- ``_no_nvjpeg``: a jpeg pack's loader without nvJPEG's decode (blank images of the right sizes, resized and
  written as usual);
- ``_no_place``: nvJPEG's decode without the resize and write;
- ``_no_decode``: neither (the files are read and the side stream synced; no kernel runs);
- ``_pageable_files``: nvJPEG reads each file from its own pageable tensor, not from the loader's pinned buffer;
- ``_indexed_place``: one indexed write per group of images, not a copy per image;
- ``_torch_place``: the resize and write in torch (a copy per image, a resize per group), not one Triton kernel;
- ``_place_on_train``: the resize and write in the training thread, on the training stream, as each batch is
  delivered (serial with the step, not beside it);
- ``_uncached``: every pack the loader reads is dropped from memory each second (its map paged out, its cached
  pages dropped), so that each epoch reads it from storage, as a pack larger than the memory allowed is read; the
  line after says how many bytes the process read from storage meanwhile;
- ``_warm_full_only``: the warm-up meets the full batch size only (the last batch's cuDNN set-up comes with it);
- ``_train_priority``: the training thread's work on a stream of the highest priority, so that the loader's
  kernels cannot hold SMs it waits for;
- ``_blocking_sync``: host waits on CUDA sleep instead of spinning a core.
Each line also names the threads that used the most CPU during the variant's run, and the caching allocator's
cudaMalloc/cudaFree calls.
Each variant runs in turn, ``--steps`` measured steps after a 30-step warm-up (the bench's settings): one line
each, and ``$OUT/step_ab_<model>.json``. Run the variants in both orders to see the drift between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import tempfile
import threading
import time

import numpy as np
import torch

from yolofeed.bench.modes import trainer_class as mode_class
from yolofeed.monitor.profile import profile

SUFFIXES = {"_stock_step": {"sync_free_step": False}, "_stock_loss": {"sync_free_loss": False},
            "_sync_free_loss": {"sync_free_loss": True}, "_stock_musgd": {"fast_musgd": False}}


@contextlib.contextmanager
def _no_nvjpeg():
    """A jpeg pack's loader without nvJPEG: blank images of each file's decoded size stand in for the decode, then are
    resized and written as decoded ones are. The side stream's sync before the decode stays; the 128 host copies of
    the files that the decode reads go with it."""
    from yolofeed.pack.codecs import jpeg

    def decode(self, pack, indices, out, staging=None):
        idx = np.asarray(indices, np.int64)
        if out.device.type == "cuda":
            torch.cuda.current_stream(out.device).synchronize()  # as jpeg._decode_jpeg does
        images = {k: torch.empty((3, h0, w0), dtype=torch.uint8, device=out.device)
                  for k, (h0, w0) in enumerate(pack.ori_shapes[idx].tolist())}
        jpeg.place(images, [tuple(hw) for hw in pack.shapes[idx].tolist()], out)

    with _swap(jpeg.Jpeg, "decode", decode):
        yield


@contextlib.contextmanager
def _no_decode():
    """A jpeg pack's loader reads the batch's files and syncs its stream as nvJPEG's decode does, and launches nothing
    (stale images stay)."""
    from yolofeed.pack.codecs import jpeg

    def decode(self, pack, indices, out, staging=None):
        for i in indices:  # the copies the unstaged decode makes, dropped
            torch.from_numpy(np.array(pack.encoded(int(i)), dtype=np.uint8))
        if out.device.type == "cuda":
            torch.cuda.current_stream(out.device).synchronize()

    with _swap(jpeg.Jpeg, "decode", decode):
        yield


@contextlib.contextmanager
def _pageable_files():
    """nvJPEG reads each file from its own pageable tensor, as before the loader staged them in one pinned buffer."""
    from yolofeed.pack.codecs import jpeg

    with _swap(jpeg.Jpeg, "staging_bytes", lambda self, pack, batch: 0):
        yield


def _place_index(images, hw, out):
    """The resize-and-write as one indexed write per group (the row indices in one pinned copy a batch)."""
    import torch.nn.functional as F

    groups: dict = {}
    for k, im in images.items():
        groups.setdefault((tuple(im.shape[1:]), hw[k]), []).append(k)
    rows = [k for ks in groups.values() if len(ks) > 1 for k in ks]
    index = (torch.tensor(rows, dtype=torch.int64, pin_memory=out.device.type == "cuda").to(out.device,
                                                                                             non_blocking=True)
             if rows else None)
    start = 0
    for (src, (h, w)), ks in groups.items():
        x = torch.stack([images[k] for k in ks]) if len(ks) > 1 else images[ks[0]][None]
        if src != (h, w):
            x = F.interpolate(x.float(), size=(h, w), mode="bilinear", align_corners=False, antialias=False)
            x = x.round_().clamp_(0, 255).to(torch.uint8)
        x = x.permute(0, 2, 3, 1)
        if len(ks) == 1:
            out[ks[0], :h, :w] = x[0]
        else:
            out[index[start:start + len(ks)], :h, :w] = x
            start += len(ks)


@contextlib.contextmanager
def _indexed_place():
    """The jpeg loader writes each group of images with one indexed write (``_place_index``), not a copy each."""
    from yolofeed.pack.codecs import jpeg

    with _swap(jpeg, "place", _place_index):
        yield


@contextlib.contextmanager
def _torch_place():
    """The jpeg loader resizes and writes with torch ops (a copy per image, a resize per group of sizes), not with
    ``place_triton``'s one kernel."""
    from yolofeed.pack.codecs import jpeg

    with _swap(jpeg, "triton_kernels", lambda: None):
        yield


@contextlib.contextmanager
def _place_on_train():
    """The jpeg loader decodes on its side stream as usual, but the resize and write run in the training thread, on
    the training stream, when the batch is delivered: serial with the step instead of beside it."""
    from yolofeed.loader.prefetch import Prefetcher
    from yolofeed.pack.codecs import jpeg

    real_place, real_deliver, pending = jpeg.place, Prefetcher._deliver, {}

    def stash(images, hw, out):  # the loader thread: keep the decoded images for the training thread
        pending[out.data_ptr()] = (images, hw, out)

    def deliver(self, k, indices):
        batch = real_deliver(self, k, indices)  # the training stream waits for the slot's decode here
        job = pending.pop(self.slots[k].dev.images.data_ptr(), None)
        if job is not None:
            images, hw, out = job
            if out.device.type == "cuda":  # made on the side stream, read on this one: not to be reused before
                for im in images.values():
                    im.record_stream(torch.cuda.current_stream(out.device))
            real_place(images, hw, out)
        return batch

    with _swap(jpeg, "place", stash), _swap(Prefetcher, "_deliver", deliver):
        yield


MADV_PAGEOUT = 21  # Linux 5.4+: reclaim these pages now (Python's mmap module names it only where it was built to)


def read_bytes() -> int:
    """Bytes this process has read from storage so far (``/proc/self/io``, Linux); 0 where there is no such file."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration):
        return 0


def page_out(pack) -> None:
    """Drop ``pack``'s pages from memory: this process's map of it paged out, then what the page cache still holds
    (written first: a pack just built may still have dirty pages, which cannot be dropped). Pages that another map
    of the same file holds (another ``Pack`` of it still alive, here or in another process) stay: see
    ``resident``."""
    os.fsync(pack._file.fd)
    arr = pack.buffer  # the whole file, mapped from a page boundary (Pack.open)
    libc = ctypes.CDLL(None, use_errno=True)
    # a kernel before 5.4 refuses the advice (EINVAL): then only the pages no map holds are dropped below
    libc.madvise(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(arr.nbytes), MADV_PAGEOUT)
    os.posix_fadvise(pack._file.fd, 0, 0, os.POSIX_FADV_DONTNEED)


def resident(pack) -> float:
    """The fraction of ``pack``'s file that is in memory (``mincore`` over its map); -1 where that cannot be
    read."""
    arr = pack.buffer
    page = os.sysconf("SC_PAGE_SIZE")
    vec = (ctypes.c_ubyte * ((arr.nbytes + page - 1) // page))()
    libc = ctypes.CDLL(None, use_errno=True)
    if not len(vec) or libc.mincore(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(arr.nbytes), vec) != 0:
        return -1.0
    return float((np.frombuffer(vec, np.uint8) & 1).mean())


@contextlib.contextmanager
def _uncached(every: float = 1.0):
    """Every pack a loader opens during the variant is dropped from memory every ``every`` seconds (``page_out``): each
    epoch reads it from storage, where the page cache would otherwise keep it. Prints the bytes read meanwhile: a
    batch whose pages go after the loader asked for them (``will_need``) and before it read them is read twice, so
    this errs on the side of more reading than a pack too large for memory would need."""
    from yolofeed.loader.prefetch import Prefetcher

    real_init, packs, stop = Prefetcher.__init__, [], threading.Event()
    gc.collect()  # an earlier variant's packs, held by reference cycles, would keep their maps and so the pages

    def init(self, pack, *a, **k):
        real_init(self, pack, *a, **k)
        page_out(pack)
        if (left := resident(pack)) > 0.05:  # another map of the file holds its pages: epochs would read memory
            print(f"step_ab: _uncached: {left:.0%} of {pack.path} stays in memory after its page-out (another map "
                  "of it is alive); this variant's reads are not all from storage", flush=True)
        packs.append(pack)

    def drop():
        while not stop.wait(every):
            for pack in list(packs):
                page_out(pack)

    before, t0 = read_bytes(), time.perf_counter()
    thread = threading.Thread(target=drop, daemon=True, name="step_ab-page-out")
    thread.start()
    try:
        with _swap(Prefetcher, "__init__", init):
            yield
    finally:
        stop.set()
        thread.join()
        gb, s = (read_bytes() - before) / 1e9, time.perf_counter() - t0
        print(f"step_ab: _uncached: {gb:.2f} GB read from storage in {s:.0f} s ({gb / max(s, 1e-9):.2f} GB/s), "
              f"packs {', '.join(sorted({str(p.path) for p in packs}))}", flush=True)


@contextlib.contextmanager
def _warm_full_only():
    """The warm-up meets the full batch size only: the epoch's last, smaller batch pays its cuDNN set-up when it
    comes, as stock's does."""
    from yolofeed.train import trainer, warmup

    real = warmup.batch_sizes

    def full_only(sampler):
        return real(sampler)[:1]  # the full batch comes first

    with _swap(warmup, "batch_sizes", full_only), _swap(trainer, "batch_sizes", full_only):
        yield


@contextlib.contextmanager
def _epoch_alone():
    """Each epoch starts its loading when it is iterated, as before the loader ran across epochs: no next epoch's
    batches loaded while one ends, none primed during the warm-up."""
    from yolofeed.loader.train import TrainLoader

    init = TrainLoader.__init__

    def alone(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "across_epochs": False})

    with _swap(TrainLoader, "__init__", alone), _swap(TrainLoader, "prime", lambda self: None):
        yield


@contextlib.contextmanager
def _train_priority():
    """The training thread's current stream has CUDA's highest priority: its blocks go before the loader's side stream
    (CUDA only)."""
    if not torch.cuda.is_available():
        print("step_ab: _train_priority changes nothing without CUDA", flush=True)
        yield
        return
    with torch.cuda.stream(torch.cuda.Stream(priority=torch.cuda.Stream.priority_range()[1])):
        yield


@contextlib.contextmanager
def _no_place():
    """A jpeg pack's loader decodes with nvJPEG but neither resizes nor writes the images (stale ones stay)."""
    from yolofeed.pack.codecs import jpeg

    with _swap(jpeg, "place", lambda images, hw, out: None):
        yield


@contextlib.contextmanager
def _swap(owner: object, attr: str, value: object):
    old = getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        setattr(owner, attr, old)


@contextlib.contextmanager
def _blocking_sync():
    """The CUDA context's host waits (stream and device syncs) sleep instead of spinning a core (CUDA only)."""
    if not torch.cuda.is_available():
        print("step_ab: _blocking_sync changes nothing without CUDA", flush=True)
        yield
        return
    torch.zeros(1, device="cuda")  # the primary context exists and is current on this thread
    drv = ctypes.CDLL("libcuda.so.1")  # cuCtxSetFlags: CUDA 12.1 drivers and later
    old, now = ctypes.c_uint(), ctypes.c_uint()
    sched, blocking = 0x7, 0x4  # CU_CTX_SCHED_MASK, CU_CTX_SCHED_BLOCKING_SYNC
    if (drv.cuCtxGetFlags(ctypes.byref(old)) or drv.cuCtxSetFlags(ctypes.c_uint(old.value & ~sched | blocking))
            or drv.cuCtxGetFlags(ctypes.byref(now)) or now.value & sched != blocking):
        raise RuntimeError(f"cuCtxSetFlags(CU_CTX_SCHED_BLOCKING_SYNC) did not take (flags {now.value:#x})")
    try:
        yield
    finally:
        if drv.cuCtxSetFlags(old):
            print(f"step_ab: could not restore the CUDA context's flags ({old.value:#x}); later variants sleep too",
                  flush=True)


# Suffixes that change the code or the CUDA context for the variant, not an option; undone after it. Several may
# follow one another (``yolofeed_jpeg_no_place_pageable_files``).
PATCHES = {"_no_nvjpeg": _no_nvjpeg, "_no_place": _no_place, "_no_decode": _no_decode,
           "_pageable_files": _pageable_files, "_indexed_place": _indexed_place, "_torch_place": _torch_place,
           "_place_on_train": _place_on_train, "_uncached": _uncached, "_warm_full_only": _warm_full_only,
           "_train_priority": _train_priority, "_blocking_sync": _blocking_sync, "_epoch_alone": _epoch_alone}
JPEG_ONLY = ("_no_nvjpeg", "_no_place", "_no_decode", "_pageable_files", "_indexed_place", "_torch_place",
             "_place_on_train")


def split_patches(variant: str) -> tuple[str, list[str]]:
    """``variant`` without its trailing ``PATCHES`` suffixes, and those suffixes in the order they are written."""
    patches = []
    while suffix := next((s for s in PATCHES if variant.endswith(s)), None):
        patches.insert(0, suffix)
        variant = variant.removesuffix(suffix)
    return variant, patches


def trainer_class(variant: str) -> type:
    """The trainer class of ``variant``: a bench mode, with the options its suffix names as class attributes.

    Raises:
        ValueError: an unknown mode, or a jpeg loader change on a mode without a jpeg pack.
    """
    variant, patches = split_patches(variant)
    for patch in patches:
        if patch in JPEG_ONLY and "jpeg" not in variant:
            raise ValueError(f"{variant}{patch}: {patch} changes the jpeg pack's loader; use it on yolofeed_jpeg")
    for suffix, options in SUFFIXES.items():
        if variant.endswith(suffix):
            cls = mode_class(variant.removesuffix(suffix))
            return type(cls.__name__, (cls,), options)
    return mode_class(variant)


@contextlib.contextmanager
def patched(variant: str):
    """The changes ``variant``'s suffixes name (``PATCHES``), undone on leaving."""
    with contextlib.ExitStack() as stack:
        for patch in split_patches(variant)[1]:
            stack.enter_context(PATCHES[patch]())
        yield


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds each thread of this process has used so far, by thread id: (name, seconds). Linux only."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        out[int(tid)] = (names.get(int(tid), comm), (int(fields[11]) + int(fields[12])) / tick)
    return out


class ThreadCpu:
    """Every thread's CPU seconds, read every ``every`` s while in use: a thread that ends (a loader's, at the end
    of training) keeps its last reading. ``before`` and ``after`` are ``thread_cpu``-like dicts."""

    def __init__(self, every: float = 0.5):
        self.every, self.before, self.after = every, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-cpu", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._read()

    def _read(self) -> None:
        """One reading. A thread keeps the Python name it had: one that is starting or ending is already or
        still in /proc but not among Python's threads, which would name it by its process's name."""
        python = {t.native_id for t in threading.enumerate()}
        for tid, (name, cpu) in thread_cpu().items():
            self.after[tid] = (name if tid in python else self.after.get(tid, (name,))[0], cpu)

    def __enter__(self) -> ThreadCpu:
        self.before = thread_cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read()


def busiest(before: dict, after: dict, seconds: float, n: int = 6) -> str:
    """The ``n`` threads that used the most CPU between two ``thread_cpu`` readings, in cores over ``seconds``."""
    used = sorted(((cpu - before.get(tid, ("", 0.0))[1], name) for tid, (name, cpu) in after.items()), reverse=True)
    return ", ".join(f"{name} {cpu / max(seconds, 1e-9):.2f}" for cpu, name in used[:n] if cpu > 0)


def allocator_calls() -> dict[str, int]:
    """The caching allocator's cumulative cudaMalloc and cudaFree calls and retries (a cudaFree waits for the whole
    device); empty without CUDA."""
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("model", help="e.g. yolo11n.yaml")
    ap.add_argument("variants", help="comma-separated, e.g. yolofeed_stock_step,yolofeed")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--optimizer", default="auto", help="Ultralytics' optimizer= (auto: AdamW for these short runs)")
    a = ap.parse_args(argv)
    variants = a.variants.split(",")
    for v in variants:
        trainer_class(v)  # an unknown variant stops here, before any training
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in variants:
            args = {"model": a.model, "data": a.data, "imgsz": a.imgsz, "batch": a.batch, "workers": 16,
                    "project": tmp, "optimizer": a.optimizer}
            t0, mem0 = time.perf_counter(), allocator_calls()
            with patched(v), ThreadCpu() as cpu:
                p = profile(v, trainer_class(v), args, steps=a.steps, warmup=a.warmup)
            threads = busiest(cpu.before, cpu.after, time.perf_counter() - t0)
            mem = {k: n - mem0.get(k, 0) for k, n in allocator_calls().items()}
            rows.append({"variant": v, "images_per_s": p.images_per_s, "gpu_util": p.gpu_util,
                         "step_ms": p.step_ms, "optimizer": p.optimizer, "phases_ms": p.phases_ms,
                         "own_cores_busy": p.own_cores_busy, "thread_cores": threads, "allocator_calls": mem})
            print(f"STEP_AB {a.model} {v:<22} {p.images_per_s:8.0f} img/s  GPU {p.gpu_util or 0:5.1f} %  "
                  f"step {p.step_ms:6.1f} ms  {p.optimizer}  {p.phases_ms}\n  host cores {p.own_cores_busy}; busiest "
                  f"threads (cores, the whole run): {threads}\n  allocator calls (the whole run): {mem}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"step_ab_{a.model.removesuffix('.yaml')}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
