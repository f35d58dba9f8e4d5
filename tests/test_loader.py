"""The loader: every sample once per epoch, reproducible order, DDP shards, and batches equal to Ultralytics'."""

from __future__ import annotations

import copy
import itertools
import queue
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import WhenWaiting, add_bad_samples, copy_dataset
from yolofeed.errors import ConfigError
from yolofeed.loader import EpochSampler, TrainLoader, ValLoader
from yolofeed.loader.dataset import PackDataset, source_positions
from yolofeed.loader.labels import LabelView
from yolofeed.loader.prefetch import LoaderError
from yolofeed.loader.sampler import fraction_subset
from yolofeed.pack import open_or_build

EVEN = list(range(0, 80, 2))  # a classes= that keeps about half the synthetic boxes


@pytest.mark.parametrize("n, ws, b", list(itertools.product([1, 7, 16, 33, 64], [1, 2, 3, 8], [1, 4, 16])))
def test_every_sample_once_equal_batches_per_rank(n, ws, b):
    if n < ws:
        with pytest.raises(ConfigError, match="cannot be shared"):
            EpochSampler(np.arange(n), b, world_size=ws)
        return
    seen, counts = [], set()
    for rank in range(ws):
        s = EpochSampler(np.arange(n), b, seed=3, rank=rank, world_size=ws)
        s.set_epoch(5)
        batches = s.batches()
        counts.add(len(batches))
        assert len(batches) == s.num_batches()
        assert all(1 <= len(x) <= b + 1 for x in batches)
        seen += [int(i) for x in batches for i in x]
    assert sorted(seen) == list(range(n))  # each exactly once, across ranks
    assert len(counts) == 1  # DDP: every rank steps the same number of times


def test_shuffle_is_seeded_per_epoch():
    def order(seed, epoch):
        s = EpochSampler(np.arange(50), 8, seed=seed)
        s.set_epoch(epoch)
        return np.concatenate(s.batches()).tolist()

    assert order(0, 1) == order(0, 1)
    assert order(0, 1) != order(0, 2) and order(0, 1) != order(1, 1)
    assert sorted(order(0, 1)) == list(range(50))


def test_drop_last_drops_the_same_on_every_rank():
    for ws in (1, 2, 3):
        lens = {len(EpochSampler(np.arange(37), 5, rank=r, world_size=ws, drop_last=True).batches()) for r in range(ws)}
        assert len(lens) == 1
        for r in range(ws):
            sampler = EpochSampler(np.arange(37), 5, rank=r, world_size=ws, drop_last=True)
            assert all(len(x) == 5 for x in sampler.batches())


def test_fraction_counts_files_as_ultralytics_does(synth_root, tmp_path):
    root = copy_dataset(synth_root, tmp_path / "f")
    add_bad_samples(root)
    pack = open_or_build(root / "data.yaml", "train", 64, rebuild="auto", progress=False)
    tried = pack.header["counts"]["tried"]
    for fraction in (0.5, 0.25, 10):
        count = fraction if isinstance(fraction, int) else max(1, round(tried * fraction))
        everything = sorted(pack.im_files + [f for f, _ in pack.header["skipped"]])
        expect = [f for f in everything[:count] if f in set(pack.im_files)]
        got = [pack.im_files[i] for i in fraction_subset(tried, source_positions(pack), fraction)]
        assert got == expect
    with pytest.raises(ConfigError):
        fraction_subset(tried, source_positions(pack), 0)


def _epoch(loader):
    """Each batch's contents; images only inside each image's (h, w): the rest of a slot is never read."""
    out = []
    for b in loader:
        s = b["source"]
        pixels = [s.images[k, :h, :w].clone() for k, (h, w) in enumerate(s.hw.tolist())]
        out.append((b["indices"].copy(), *pixels, s.cls.clone(), s.boxes.clone(), s.valid.clone(), s.hw.clone()))
    return out


def test_sync_and_async_yield_identical_batches(pack):
    pack64 = pack(64)
    a = _epoch(TrainLoader(pack64, 5, "cpu", seed=1, sync=True))
    b = _epoch(TrainLoader(pack64, 5, "cpu", seed=1, sync=False))
    assert len(a) == len(b) == 5
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            assert np.array_equal(u, v) if isinstance(u, np.ndarray) else torch.equal(u, v)


def test_batches_hold_the_pack_samples(pack):
    pack64 = pack(64)
    loader = TrainLoader(pack64, 7, "cpu", seed=2)
    seen = []
    for b in loader:
        src = b["source"]
        for k, i in enumerate(b["indices"]):
            h, w = pack64.shapes[i]
            assert torch.equal(src.images[k, :h, :w], torch.from_numpy(np.array(pack64.image(i))))
            lb = pack64.labels(i)
            n = len(lb)
            assert int(src.valid[k].sum()) == n and not src.valid[k, n:].any()
            assert torch.equal(src.cls[k, :n], torch.from_numpy(lb[:, 0].copy()))
            assert torch.equal(src.boxes[k, :n], torch.from_numpy(lb[:, 1:].copy()))
            assert b["im_file"][k] == pack64.im_files[i]
        seen += b["indices"].tolist()
    assert sorted(seen) == list(range(len(pack64)))
    second = [i for b in loader for i in b["indices"].tolist()]
    assert sorted(second) == sorted(seen) and second != seen  # the next iteration is the next epoch


def test_jpeg_pack_batches_equal_raw_pack_batches(pack):
    pack64 = pack(64)
    jpg = pack(64, "jpeg")
    for a, b in zip(TrainLoader(pack64, 6, "cpu", seed=4, sync=True), TrainLoader(jpg, 6, "cpu", seed=4, sync=True)):
        assert np.array_equal(a["indices"], b["indices"])
        for k, i in enumerate(a["indices"]):
            h, w = pack64.shapes[i]
            assert torch.equal(a["source"].images[k, :h, :w], b["source"].images[k, :h, :w])


def test_loader_errors_reach_the_training_thread(pack, monkeypatch):
    pack64 = pack(64)
    import yolofeed.loader.prefetch as prefetch

    def broken(*a, **k):
        raise OSError("disk went away")

    monkeypatch.setattr(prefetch, "gather", broken)
    with pytest.raises(prefetch.LoaderError, match=r"batch 1 of \d+ .*train.yfpack: OSError: disk went away") as e:
        list(TrainLoader(pack64, 4, "cpu"))
    assert isinstance(e.value.__cause__, OSError)  # the thread's own traceback travels with it


def test_a_pack_another_program_writes_into_while_it_is_read_is_refused_with_its_rebuild(pack, tmp_path):
    """Its index overwritten in place during the training (the file's size kept: no SIGBUS guard sees it): the offsets
    read then no longer fit, and the loader says the file changed since it was opened, with the command that rebuilds
    it (a ``PackError``, the CLI's one line), where it said ``LoaderError`` with a traceback. A failure while the file
    is as it was opened stays a ``LoaderError``."""
    import os
    import shutil

    from yolofeed.errors import PackError
    from yolofeed.pack import Pack

    copy = tmp_path / "train.yfpack"
    shutil.copyfile(pack(64).path, copy)
    os.utime(copy, ns=(10**18, 10**18))  # a modification time any write moves, however coarse the clock
    opened = Pack.open(copy)
    loader = TrainLoader(opened, 4, "cpu")  # the run's loader, made before the damage
    assert not opened.changed()
    off, nbytes = opened.header["sections"]["index"]
    with open(copy, "r+b") as f:  # another program: every byte of the index section set to 0xFF
        f.seek(off)
        f.write(b"\xff" * nbytes)
    assert opened.changed()
    with pytest.raises(PackError, match=r"batch 1 of \d+ .*train.yfpack: the file changed since it was opened "
                                        r"\(another program wrote into it\).*rebuild it with: yolofeed pack") as e:
        list(loader)
    assert e.value.__cause__ is not None  # the thread's own failure travels with it


def test_a_validation_loaders_failure_says_it_was_the_validations(pack, monkeypatch):
    import yolofeed.loader.prefetch as prefetch

    def broken(*a, **k):
        raise OSError("disk went away")

    monkeypatch.setattr(prefetch, "gather", broken)
    with pytest.raises(prefetch.LoaderError, match=r"batch 1 of \d+ of the validation, reading .*val.yfpack: OSError"):
        list(ValLoader(pack(64, split="val"), 4, "cpu"))


def test_stopping_mid_epoch_stops_the_thread(pack):
    pack64 = pack(64)
    loader = TrainLoader(pack64, 2, "cpu")
    it = iter(loader)
    next(it)
    it.close()
    assert loader.prefetcher._thread is None
    assert len(list(loader)) == len(loader)  # and the next epoch runs normally


def _held_in_a_fill(loader, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make the loader thread's next fill wait for ``gate``; ``entered`` is set once it waits there."""
    entered, gate, fill = threading.Event(), threading.Event(), loader.prefetcher._fill

    def held(slot, indices):
        entered.set()
        gate.wait(30)
        fill(slot, indices)

    monkeypatch.setattr(loader.prefetcher, "_fill", held)
    return entered, gate


def test_a_stop_cut_short_by_ctrl_c_keeps_the_thread_for_the_next_to_wait_for(pack, monkeypatch):
    """A Ctrl-C while a stop waits for the loader thread (mid-fill) leaves the thread known, so that the trainer's
    teardown waits for it again: forgotten, the interpreter could exit while it fills a batch inside torch."""
    import os
    import signal

    loader = TrainLoader(pack(64), 2, "cpu")
    entered, gate = _held_in_a_fill(loader, monkeypatch)
    loader.prime()
    assert entered.wait(10)
    thread = loader.prefetcher._thread
    watcher = WhenWaiting("_stop_all", lambda: os.kill(os.getpid(), signal.SIGINT))
    try:
        with pytest.raises(KeyboardInterrupt):
            loader.close()
    finally:
        watcher.join()
    assert not watcher.missed and loader.prefetcher._thread is thread and thread.is_alive()
    gate.set()
    loader.close()
    assert loader.prefetcher._thread is None and not thread.is_alive()
    assert len(list(loader)) == len(loader)  # and the next epoch loads from a thread of its own


@pytest.mark.parametrize("loader_kind", ["train", "val"])
def test_a_close_while_another_thread_iterates_the_loader_ends_that_pass_and_nothing_else(pack, monkeypatch,
                                                                                         loader_kind):
    """The trainer's teardown closes the validation loader while the validation thread may be iterating it: the pass
    ends with the loader's error, both threads stop the same loader thread once, and neither fails otherwise (the two
    used to forget it twice: IndexError in either thread, the teardown cut short)."""
    for _ in range(6):
        loader = TrainLoader(pack(64), 2, "cpu") if loader_kind == "train" else ValLoader(pack(64), 2, "cpu")
        entered, gate = _held_in_a_fill(loader, monkeypatch)
        errors: list[BaseException] = []

        def iterate(loader=loader, errors=errors):
            try:
                list(loader)
            except BaseException as e:  # handed back to the test
                errors.append(e)

        it = threading.Thread(target=iterate)
        it.start()
        assert entered.wait(10)
        releaser = threading.Timer(0.05, gate.set)
        releaser.start()
        loader.close()
        it.join(10)
        releaser.join()
        assert not it.is_alive() and loader.prefetcher._thread is None
        assert len(errors) == 1 and isinstance(errors[0], LoaderError), errors
        assert "closed while this pass" in str(errors[0])


def test_a_stopped_run_whose_validation_waits_for_a_read_that_hangs_waits_for_the_loader_alone(pack, monkeypatch,
                                                                                              caplog):
    """The trainer's teardown after a stop, its validation thread iterating the validation loader whose read hangs:
    the loader's thread is told to stop first, so the validation ends at once and only the loader's thread is waited
    for (closed in turn, the teardown waited for each, twice the bound). The loader, let go of meanwhile (its pack
    released), ends quietly once the read returns: nothing raised in its thread."""
    import threading

    import torch

    import yolofeed.loader.prefetch as prefetch
    import yolofeed.train.validating as tr
    from yolofeed import FastDetectionTrainer
    from yolofeed.train.validation import ValidationThread

    monkeypatch.setattr(prefetch, "STOP_WAIT_S", 1.0)
    monkeypatch.setattr(tr, "CLOSE_WAIT_S", 1.0)  # as the defaults, equal: the validation must not wait for the loader
    loader = ValLoader(pack(64), 2, "cpu")
    entered, gate = _held_in_a_fill(loader, monkeypatch)
    t = FastDetectionTrainer.__new__(FastDetectionTrainer)
    t.train_loader, t.test_loader, t._results_plot, t.callbacks = None, loader, None, {}
    t._validations, t._overlapped, t._holding, t._final_warm = ValidationThread(torch.device("cpu")), None, False, None
    worker = t._validations
    before, raised = set(threading.enumerate()), []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    worker.submit(lambda: list(loader))  # the validation, waiting for its first batch
    assert entered.wait(10)
    try:
        with caplog.at_level("WARNING"):
            t._close_run(finished=False)
        assert worker._worker.ended.is_set() and "the validation thread did not stop" not in caplog.text
        assert "the loader thread did not stop within 1 s" in caplog.text
    finally:
        gate.set()
    for thread in set(threading.enumerate()) - before:
        thread.join(10)
    assert raised == []


def test_a_loader_thread_that_does_not_stop_in_time_is_left_with_one_line(pack, monkeypatch, caplog):
    import yolofeed.loader.prefetch as prefetch

    loader = TrainLoader(pack(64), 2, "cpu")
    entered, gate = _held_in_a_fill(loader, monkeypatch)
    loader.prime()
    assert entered.wait(10)
    monkeypatch.setattr(prefetch, "STOP_WAIT_S", 0.2)
    thread = loader.prefetcher._thread
    loader.close()
    assert loader.prefetcher._thread is None and "did not stop within 0.2 s" in caplog.text
    gate.set()
    thread.join(10)
    assert not thread.is_alive()


def _fills(loader, monkeypatch) -> list[np.ndarray]:
    """The index arrays the loader thread fills, in the order it fills them."""
    log, fill = [], loader.prefetcher._fill

    def logged(slot, indices):
        fill(slot, indices)
        log.append(np.asarray(indices).copy())

    monkeypatch.setattr(loader.prefetcher, "_fill", logged)
    return log


def _wait_for(done, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "the loader thread did not get there"
        time.sleep(0.01)


def _epoch_batches(loader, epoch: int) -> list[np.ndarray]:
    sampler = copy.copy(loader.sampler)
    sampler.set_epoch(epoch)
    return sampler.batches()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("storage", ["raw", "jpeg"])
def test_the_next_epochs_first_batches_load_while_an_epoch_ends(pack, monkeypatch, device, storage):
    """Each epoch yields what it yields alone, and the thread loads the next one's first batches, once each."""
    pack64 = pack(64, storage)
    ahead = TrainLoader(pack64, 5, device, seed=1)
    alone = TrainLoader(pack64, 5, device, seed=1, across_epochs=False)
    log, n = _fills(ahead, monkeypatch), len(ahead)
    for epoch in range(3):
        for x, y in zip(_epoch(ahead), _epoch(alone), strict=True):
            for u, v in zip(x, y, strict=True):
                assert np.array_equal(u, v) if isinstance(u, np.ndarray) else torch.equal(u, v)
        # before the next epoch is asked for, a slot's worth of its first batches are loaded
        _wait_for(lambda e=epoch: len(log) >= (e + 1) * n + 3)
        ahead.reset()  # Ultralytics' after close_mosaic: the batches loaded ahead stay
    want = [b for e in range(4) for b in _epoch_batches(ahead, e)][:3 * n + 3]
    assert len(log) == len(want) and all(np.array_equal(a, b) for a, b in zip(log, want))  # none loaded twice
    ahead.close()
    assert ahead.prefetcher._thread is None


def test_a_loader_dropped_while_it_loads_ahead_stops_its_thread(pack):
    """A user's loader, or a bench's, dropped after an epoch: its thread, waiting for an epoch that never comes, must
    not keep the slots' pinned and device buffers alive."""
    loader = TrainLoader(pack(64), 5, "cpu")
    list(loader)
    thread = loader.prefetcher._thread
    assert thread.is_alive()  # the next epoch's first batches loaded, waiting for it
    del loader  # if the thread is mid-fill, the last reference goes there, and it stops after that fill
    thread.join(timeout=30)
    assert not thread.is_alive()


def _next(it, seconds: float = 10.0):
    """next(it) in a helper thread: ("ok", batch), ("err", exception) or ("hang", None)."""
    box: queue.Queue = queue.Queue()

    def run():
        try:
            box.put(("ok", next(it)))
        except BaseException as e:  # handed back to the test
            box.put(("err", e))

    threading.Thread(target=run, daemon=True).start()
    try:
        return box.get(timeout=seconds)
    except queue.Empty:
        return "hang", None


@pytest.mark.parametrize("taken", ["one", "all"])
def test_a_stale_pass_dropped_after_a_new_one_started_leaves_the_new_one_running(pack, taken):
    """A pass dropped late (a reference kept, a cycle, a zip or islice that never asks past the n-th batch) stops its
    own thread, not the one a later pass of the same loader reads from."""
    loader = TrainLoader(pack(64), 5, "cpu", seed=1)
    n = len(loader)
    old = iter(loader)
    for _ in range(1 if taken == "one" else n):
        next(old)
    new = iter(loader)
    got = [_next(new)]
    del old  # its GeneratorExit runs now
    got += [_next(new) for _ in range(n - 1)]
    assert [state for state, _ in got] == ["ok"] * n
    loader.close()


def test_a_pass_closed_under_it_raises_instead_of_waiting_for_good(pack):
    loader = TrainLoader(pack(64), 5, "cpu", seed=1)
    it = iter(loader)
    next(it)
    loader.close()
    for _ in range(len(loader)):  # the batches the thread had loaded already, then the error
        state, e = _next(it)
        if state != "ok":
            break
    assert state == "err" and isinstance(e, LoaderError) and "closed while this pass was iterating" in str(e)
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    loader.close()  # after the last batch: the pass ends as any other
    state, e = _next(it)
    assert state == "err" and isinstance(e, StopIteration), e
    assert len(list(loader)) == len(loader)  # and the loader goes on


def test_the_next_epochs_batches_are_a_loader_alones_for_every_ddp_rank(pack):
    for rank in range(3):
        a = TrainLoader(pack(64), 3, "cpu", seed=2, rank=rank, world_size=3)
        b = TrainLoader(pack(64), 3, "cpu", seed=2, rank=rank, world_size=3, across_epochs=False)
        for _ in range(3):
            x, y = [t["indices"] for t in a], [t["indices"] for t in b]
            assert all(np.array_equal(u, v) for u, v in zip(x, y, strict=True))
        a.close()


def test_an_epoch_other_than_the_one_loaded_ahead_gets_its_own_batches(pack):
    """A resume, a NaN-recovery redo or set_epoch(other): the batches loaded ahead are dropped."""
    loader = TrainLoader(pack(64), 5, "cpu", seed=1)
    list(loader)  # epoch 0; epoch 1's first batches load
    for epoch in (7, 7, 0):  # another epoch, the same one again (a redo), and back
        loader.sampler.set_epoch(epoch)
        got = [b["indices"] for b in loader]
        assert len(got) == len(loader) and all(np.array_equal(a, b) for a, b in
                                               zip(got, _epoch_batches(loader, epoch)))


def test_prime_loads_an_epochs_first_batches_before_it_is_iterated(pack, monkeypatch):
    loader = TrainLoader(pack(64), 5, "cpu", seed=1)
    log, n = _fills(loader, monkeypatch), len(loader)
    loader.sampler.set_epoch(2)
    loader.prime()
    _wait_for(lambda: len(log) >= 3)
    want = _epoch_batches(loader, 2)
    assert all(np.array_equal(a, b) for a, b in zip(log, want[:3]))
    loader.prime()  # again: nothing reloads
    got = [b["indices"] for b in loader]
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(log[:n], want, strict=True))  # each batch loaded once
    loader.close()


def test_a_failure_loading_ahead_is_raised_in_the_epoch_it_belongs_to(pack, monkeypatch):
    import yolofeed.loader.prefetch as prefetch

    loader = TrainLoader(pack(64), 5, "cpu", seed=1)
    n, calls, gather = len(loader), itertools.count(), prefetch.gather

    def flaky(*a, **k):
        if next(calls) == n:  # the next epoch's first batch, loaded while this one ends
            raise OSError("disk went away")
        return gather(*a, **k)

    monkeypatch.setattr(prefetch, "gather", flaky)
    assert len(list(loader)) == n  # this epoch is whole
    with pytest.raises(prefetch.LoaderError, match=rf"batch 1 of {n} .*OSError: disk went away"):
        list(loader)
    assert loader.prefetcher._thread is None
    assert len(list(loader)) == n  # and the epoch after runs


@pytest.mark.parametrize("keys", [{}, {"fraction": [1.0, 0.75], "classes": EVEN, "single_cls": True},
                                  {"fraction": [1.0, 5], "classes": 3}])
def test_val_batches_equal_ultralytics_val_loader(synth_root, pack, keys):
    """Same order, shapes, pixels, labels and metadata: the validator computes the same metrics. With a val
    fraction (a share or a count, cut before the aspect-ratio sort), classes and single_cls too."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    imgsz, batch = 96, 3
    data = check_det_dataset(str(synth_root / "data.yaml"), autodownload=False)
    cfg = get_cfg(overrides={"imgsz": imgsz, "batch": batch, **keys})
    ds = build_yolo_dataset(cfg, data["val"], batch, data, mode="val", rect=True, stride=32)
    theirs = list(build_dataloader(ds, batch, 0, shuffle=False, rank=-1))
    val = pack(imgsz, split="val")
    fraction = keys.get("fraction", [1.0, 1.0])[1]
    ours = list(ValLoader(val, batch, "cpu", stride=32, fraction=fraction, classes=keys.get("classes"),
                          single_cls=keys.get("single_cls", False)))
    assert len(ours) == len(theirs) and sum(len(b["im_file"]) for b in ours) == len(ds)
    if keys:  # the keys changed something: fewer images, fewer boxes than those images hold, images left empty
        used = [val.im_files.index(f) for b in ours for f in b["im_file"]]
        assert len(ds) < len(val) and sum(len(b["cls"]) for b in ours) < sum(len(val.labels(i)) for i in used)
        if keys["classes"] == 3:  # most images hold no box of class 3: they stay, as background images
            assert any(not (b["batch_idx"] == k).any() for b in ours for k in range(len(b["im_file"])))
    for a, b in zip(ours, theirs):
        assert list(a["im_file"]) == list(b["im_file"])
        assert torch.equal(a["img"], b["img"])
        assert torch.equal(a["batch_idx"], b["batch_idx"]) and torch.equal(a["cls"], b["cls"])
        torch.testing.assert_close(a["bboxes"], b["bboxes"], atol=1e-6, rtol=0)
        assert [tuple(s) for s in a["ori_shape"]] == [tuple(s) for s in b["ori_shape"]]
        assert [tuple(s) for s in a["resized_shape"]] == [tuple(int(v) for v in s) for s in b["resized_shape"]]
        for (ga, pa), (gb, pb) in zip(a["ratio_pad"], b["ratio_pad"]):
            assert np.allclose(ga, gb) and tuple(pa) == tuple(pb)


@pytest.mark.parametrize("classes, single_cls", [(EVEN, False), (EVEN, True), (None, True), (7, False)])
def test_labels_are_filtered_and_merged_as_ultralytics_does(synth_root, pack, classes, single_cls):
    """classes= drops other classes' boxes (keeps the images, keeps the ids), single_cls= makes every id 0: the
    loader's labels, its batches and the dataset facade all equal Ultralytics' update_labels, image by image."""
    from helpers import ultralytics_dataset

    ref = ultralytics_dataset(synth_root / "data.yaml", "train", 64, classes=classes, single_cls=single_cls)
    train = pack(64)
    loader = TrainLoader(train, 5, "cpu", seed=1, sync=True, classes=classes, single_cls=single_cls)
    theirs = {lb["im_file"]: lb for lb in ref.labels}
    assert [lb["im_file"] for lb in loader.dataset.labels] == list(theirs)  # no image dropped
    for lb in loader.dataset.labels:
        np.testing.assert_array_equal(lb["cls"], theirs[lb["im_file"]]["cls"])
        np.testing.assert_allclose(lb["bboxes"], theirs[lb["im_file"]]["bboxes"], atol=1e-6)
    delivered = 0
    for b in loader:
        src = b["source"]
        for k, f in enumerate(b["im_file"]):
            lb = theirs[f]
            assert int(src.valid[k].sum()) == len(lb["cls"])
            np.testing.assert_array_equal(src.cls[k][src.valid[k]].numpy(), lb["cls"][:, 0])
            delivered += len(lb["cls"])
    assert delivered == sum(len(lb["cls"]) for lb in ref.labels)
    everything = sum(len(train.labels(i)) for i in range(len(train)))
    kept = set(np.concatenate([lb["cls"][:, 0] for lb in ref.labels]).tolist())
    if classes is not None:
        assert delivered < everything and kept <= ({0.0} if single_cls else {float(c) for c in np.atleast_1d(classes)})
    if single_cls:
        assert kept <= {0.0}


def test_classes_must_be_class_ids(pack):
    pack64 = pack(64)
    for bad in ("0,1", 1.5, [0, "a"], -1, True, []):
        with pytest.raises(ConfigError, match="class id"):
            TrainLoader(pack64, 4, "cpu", classes=bad)


# -- pose packs: keypoints beside the boxes ----------------------------------------------------------------------------
def _packs_of(root, out, default_task: str):
    """``make(imgsz, storage="raw", split="train", task=default_task)``: packs of the dataset at ``root``."""
    def make(imgsz: int = 64, storage: str = "raw", split: str = "train", task: str = default_task):
        return open_or_build(root / "data.yaml", split, imgsz, storage, out=out, rebuild="auto", progress=False,
                             workers=2, task=task)

    return make


@pytest.fixture(scope="module")
def pose_pack(pose_root, tmp_path_factory):
    """``pose_pack(imgsz, storage="raw", split="train", task="pose")``: packs of the session's pose dataset."""
    return _packs_of(pose_root, tmp_path_factory.mktemp("pose-packs"), "pose")


def _label_rows(pose_root, im_file: str) -> np.ndarray:
    split = "val" if "/val/" in im_file else "train"
    return np.loadtxt(pose_root / "labels" / split / f"{Path(im_file).stem}.txt", dtype=np.float32, ndmin=2)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("storage", ["raw", "jpeg"])
def test_pose_batches_carry_the_label_files_keypoints(pose_root, pose_pack, device, storage):
    """SourceBatch.keypoints: (N, L, K, 3) float32 on the batch's device, padded like the boxes and under the same
    valid mask; its valid rows are the label files' values (x, y, visibility), its padding zeros. A detection pack of
    the same yaml delivers None, and the same boxes."""
    pose, plain = pose_pack(64, storage), pose_pack(64, storage, task="detect")
    seen = 0
    for a, b in zip(TrainLoader(pose, 5, device, seed=3), TrainLoader(plain, 5, device, seed=3), strict=True):
        src, other = a["source"], b["source"]
        n, width = src.valid.shape
        assert src.keypoints.shape == (n, width, 5, 3) and src.keypoints.dtype == torch.float32
        assert src.keypoints.device.type == device and other.keypoints is None and other.kinds() == ()
        assert src.kinds() == ("keypoints",) and torch.equal(src.boxes, other.boxes)
        kp = src.keypoints.cpu()
        for k, f in enumerate(a["im_file"]):
            rows = _label_rows(pose_root, f)
            assert int(src.valid[k].sum()) == len(rows)
            assert torch.equal(kp[k, :len(rows)], torch.from_numpy(rows[:, 5:].reshape(-1, 5, 3)))
            assert not kp[k, len(rows):].any()
            seen += 1
    assert seen == len(pose)


def test_pose_batches_are_the_same_sync_and_async_and_cost_no_host_sync_on_the_gpu_path(pose_pack):
    """The thread's batches equal the caller's own (keypoints too); on CUDA, delivering them waits for nothing."""
    pose = pose_pack()
    a = [b["source"].keypoints.clone() for b in TrainLoader(pose, 4, "cpu", seed=1, sync=True)]
    b = [b["source"].keypoints.clone() for b in TrainLoader(pose, 4, "cpu", seed=1)]
    assert len(a) == len(b) == 4 and all(torch.equal(x, y) for x, y in zip(a, b))
    if torch.cuda.is_available():
        from helpers import no_host_sync

        loader = TrainLoader(pose, 4, "cuda", seed=1)
        it = iter(loader)
        first = next(it)["source"].keypoints
        with no_host_sync():
            rest = [b["source"].keypoints.sum() for b in it]
        assert torch.equal(first.cpu(), a[0]) and len(rest) == 3


@pytest.mark.parametrize("classes, single_cls", [(None, False), ([0, 2, 4], False), ([1, 3], True)])
def test_pose_labels_are_filtered_as_ultralytics_filters_them(pose_root, pose_pack, classes, single_cls):
    """classes= drops the keypoints of the boxes it drops (Ultralytics' update_labels masks both); the dataset facade
    gives Ultralytics' label dicts, keypoints included, image by image, and the batches carry the same points."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    root = copy_dataset(pose_root, Path(pose_pack().path).parent.parent / f"copy-{classes}-{single_cls}")
    data = check_det_dataset(str(root / "data.yaml"), autodownload=False)
    ref = YOLODataset(img_path=data["train"], imgsz=64, augment=False, data=data, hyp=get_cfg(), batch_size=4,
                      rect=False, task="pose", classes=classes, single_cls=single_cls)
    theirs = {Path(lb["im_file"]).name: lb for lb in ref.labels}
    loader = TrainLoader(pose_pack(), 4, "cpu", seed=2, sync=True, classes=classes, single_cls=single_cls)
    for lb in loader.dataset.labels:
        want = theirs[Path(lb["im_file"]).name]
        np.testing.assert_array_equal(lb["keypoints"], want["keypoints"])
        np.testing.assert_array_equal(lb["cls"], want["cls"])
    delivered = 0
    for b in loader:
        src = b["source"]
        for k, f in enumerate(b["im_file"]):
            want = theirs[Path(f).name]
            np.testing.assert_array_equal(src.keypoints[k][src.valid[k]].numpy(), want["keypoints"])
            delivered += len(want["cls"])
    assert delivered == sum(len(lb["cls"]) for lb in ref.labels)


def test_pose_val_batches_equal_ultralytics_pose_val_loader(pose_root, pose_pack):
    """The validator's keypoints: letterboxed as the boxes are, normalised by the batch shape, visibility as stored,
    equal to Ultralytics' pose val loader's (rect batches, task=pose); a detection pack's batch has none."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    imgsz, batch = 96, 4
    root = copy_dataset(pose_root, Path(pose_pack().path).parent.parent / "copy-val")
    data = check_det_dataset(str(root / "data.yaml"), autodownload=False)
    cfg = get_cfg(overrides={"imgsz": imgsz, "batch": batch, "task": "pose"})
    ds = build_yolo_dataset(cfg, data["val"], batch, data, mode="val", rect=True, stride=32)
    theirs = list(build_dataloader(ds, batch, 0, shuffle=False, rank=-1))
    ours = list(ValLoader(pose_pack(imgsz, split="val"), batch, "cpu", stride=32))
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs):
        assert [Path(f).name for f in a["im_file"]] == [Path(f).name for f in b["im_file"]]
        assert torch.equal(a["img"], b["img"]) and torch.equal(a["batch_idx"], b["batch_idx"])
        torch.testing.assert_close(a["bboxes"], b["bboxes"], atol=1e-6, rtol=0)
        assert a["keypoints"].shape == b["keypoints"].shape == (len(a["cls"]), 5, 3)
        torch.testing.assert_close(a["keypoints"], b["keypoints"], atol=1e-6, rtol=0)
    plain = next(iter(ValLoader(pose_pack(imgsz, split="val", task="detect"), batch, "cpu", stride=32)))
    assert "keypoints" not in plain


# -- OBB packs: four corners beside each box --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def obb_pack(obb_root, tmp_path_factory):
    """``obb_pack(imgsz, ...)``: packs of the session's OBB dataset."""
    return _packs_of(obb_root, tmp_path_factory.mktemp("obb-packs"), "obb")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_obb_batches_carry_the_label_files_corners(obb_root, obb_pack, device):
    """SourceBatch.corners: (N, L, 4, 2) float32, padded like the boxes and under the same valid mask; its valid rows
    are the label files' corners, its padding zeros; the boxes enclose them (segments2boxes). The dataset facade's
    label dicts carry them as Ultralytics' OBB labels do, as segments."""
    pack = obb_pack()
    seen = 0
    for a in TrainLoader(pack, 5, device, seed=3):
        src = a["source"]
        n, width = src.valid.shape
        assert src.corners.shape == (n, width, 4, 2) and src.corners.dtype == torch.float32
        assert src.corners.device.type == device and src.keypoints is None and src.kinds() == ("corners",)
        corners, boxes = src.corners.cpu(), src.boxes.cpu()
        for k, f in enumerate(a["im_file"]):
            split = "val" if "/val/" in f else "train"
            rows = np.loadtxt(obb_root / "labels" / split / f"{Path(f).stem}.txt", dtype=np.float32, ndmin=2)
            assert int(src.valid[k].sum()) == len(rows)
            assert torch.equal(corners[k, :len(rows)], torch.from_numpy(rows[:, 1:].reshape(-1, 4, 2)))
            assert not corners[k, len(rows):].any()
            lo, hi = corners[k, :len(rows)].amin(1), corners[k, :len(rows)].amax(1)
            torch.testing.assert_close(boxes[k, :len(rows)], torch.cat([(lo + hi) / 2, hi - lo], -1))
            seen += 1
    assert seen == len(pack)

    lv = LabelView.of(pack)
    for i, d in enumerate(PackDataset(pack).labels):
        assert np.array_equal(d["segments"], lv.corners[lv.start[i]:lv.start[i] + lv.count[i]])


def test_obb_labels_are_filtered_with_their_corners(obb_pack):
    """classes= drops the corners of the boxes it drops, row for row."""
    pack = obb_pack()
    full, some = LabelView.of(pack), LabelView.of(pack, classes=[0, 1, 2])
    keep = np.isin(full.table[:, 0], [0, 1, 2])
    assert np.array_equal(some.corners, full.corners[keep]) and len(some.corners) == len(some.table)


def test_obb_val_batches_equal_ultralytics_obb_val_loader(obb_root, obb_pack):
    """The validator's oriented boxes: the corners resampled and letterboxed as the boxes are, then Format(return_obb)'s
    minimum-area rectangle normalised by the batch shape, equal to Ultralytics' OBB val loader's (rect batches,
    task=obb), value for value: a rhombus too, whose two rectangles of least area tie (cv2.minAreaRect picks one)."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    imgsz, batch = 96, 3
    root = copy_dataset(obb_root, Path(obb_pack().path).parent.parent / "copy-val")
    label = sorted((root / "labels" / "val").glob("*.txt"))[0]
    label.write_text(label.read_text() + "3 0.5 0.1 0.9 0.5 0.5 0.9 0.1 0.5\n")  # a rhombus in a 4:3 image
    data = check_det_dataset(str(root / "data.yaml"), autodownload=False)
    cfg = get_cfg(overrides={"imgsz": imgsz, "batch": batch, "task": "obb"})
    ds = build_yolo_dataset(cfg, data["val"], batch, data, mode="val", rect=True, stride=32)
    theirs = list(build_dataloader(ds, batch, 0, shuffle=False, rank=-1))
    pack = _packs_of(root, root.parent / "copy-val-packs", "obb")(imgsz, split="val")
    ours = list(ValLoader(pack, batch, "cpu", stride=32))
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs):
        assert [Path(f).name for f in a["im_file"]] == [Path(f).name for f in b["im_file"]]
        assert torch.equal(a["img"], b["img"]) and torch.equal(a["batch_idx"], b["batch_idx"])
        assert a["bboxes"].shape == b["bboxes"].shape == (len(a["cls"]), 5)
        assert torch.equal(a["bboxes"], b["bboxes"])


# -- segment packs: each box's polygon ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def segment_pack(segment_root, tmp_path_factory):
    """``segment_pack(imgsz, ...)``: packs of the session's segmentation dataset."""
    return _packs_of(segment_root, tmp_path_factory.mktemp("segment-packs"), "segment")


def _polygons_written(root, im_file: str) -> list[np.ndarray]:
    split = "val" if "/val/" in im_file else "train"
    rows = (root / "labels" / split / f"{Path(im_file).stem}.txt").read_text().splitlines()
    return [np.array(r.split()[1:], np.float32).reshape(-1, 2) for r in rows]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_segment_batches_carry_the_label_files_polygons(segment_root, segment_pack, device):
    """SourceBatch.polygons: (N, L, P, 2) float32, P the pack's longest polygon, and polygon_lengths (N, L) int64,
    padded like the boxes and under the same valid mask; each valid slot holds its label file's polygon, then zeros;
    an empty slot is length 0 and zeros. The dataset facade's label dicts carry them as Ultralytics' segment labels
    do, as segments."""
    pack = segment_pack()
    longest = int(pack.polygon_lengths.max())
    seen = 0
    for a in TrainLoader(pack, 5, device, seed=3):
        src = a["source"]
        n, width = src.valid.shape
        assert src.polygons.shape == (n, width, longest, 2) and src.polygon_lengths.shape == (n, width)
        assert src.polygons.device.type == device and src.kinds() == ("polygons",)
        polygons, lengths = src.polygons.cpu(), src.polygon_lengths.cpu()
        for k, f in enumerate(a["im_file"]):
            written = _polygons_written(segment_root, f)
            assert int(src.valid[k].sum()) == len(written)
            assert lengths[k].tolist() == [len(p) for p in written] + [0] * (width - len(written))
            for j, p in enumerate(written):
                assert torch.equal(polygons[k, j, :len(p)], torch.from_numpy(p))
                assert not polygons[k, j, len(p):].any()
            assert not polygons[k, len(written):].any()
            seen += 1
    assert seen == len(pack)
    for i, d in enumerate(PackDataset(pack).labels):
        written = _polygons_written(segment_root, pack.im_files[i])
        assert len(d["segments"]) == len(written) and all(np.array_equal(a, b) for a, b in zip(d["segments"], written))


def test_segment_labels_are_filtered_with_their_polygons(segment_pack):
    """classes= drops the polygons of the boxes it drops, row for row, and the batches pad to what is left."""
    pack = segment_pack()
    full, some = LabelView.of(pack), LabelView.of(pack, classes=[0, 1, 2])
    keep = np.isin(full.table[:, 0], [0, 1, 2])
    for view, rows in ((full, np.arange(len(full.table))), (some, np.flatnonzero(keep))):
        points, starts, lengths = view.polygons
        assert len(lengths) == len(view.table) == len(rows)
        for j, r in enumerate(rows):  # each kept row's polygon is the pack's polygon of that row
            np.testing.assert_array_equal(points[starts[j]:starts[j] + lengths[j]],
                                          pack.polygon_points[pack.polygon_starts[r]:pack.polygon_starts[r + 1]])
    assert some.polygon_width == int(some.polygons[2].max()) <= full.polygon_width
