"""``yolofeed train``'s speed: the epochs' training steps only (fake clock), on one process, and over DDP ranks
gathered with torch.distributed (two gloo processes on the CPU), then read back by the launcher."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import FakeClock
from yolofeed.monitor.throughput import REPORT, RunThroughput, reduce_over_ranks


def _epoch(speed: RunThroughput, clock: FakeClock, trainer, batches: list[int], wait: float = 0.1,
           step: float = 0.4) -> None:
    """One epoch through the callbacks: ``batches`` images per step, each step ``wait`` + ``step`` seconds."""
    speed.on_train_epoch_start(trainer)
    for n in batches:
        clock.t += wait + step
        trainer.batch_images = n
        speed.on_train_batch_end(trainer)
    speed.on_train_epoch_end(trainer)


def test_one_process_counts_its_epochs_training_steps(tmp_path):
    """Two epochs with a 30 s validation between them: the images of every step (the last batch's real count),
    over the epochs' own seconds; nothing is written for a launcher."""
    clock = FakeClock()
    speed = RunThroughput(clock=clock)
    trainer = SimpleNamespace(batch_images=0, device=torch.device("cpu"), save_dir=tmp_path)
    _epoch(speed, clock, trainer, [8, 8, 5])
    clock.t += 30.0  # validation and saving: not training
    _epoch(speed, clock, trainer, [8, 8, 5])
    speed.on_train_end(trainer)
    assert speed.images == 42 and speed.seconds == pytest.approx(6 * 0.5) and speed.rate == pytest.approx(14.0)
    assert not (tmp_path / REPORT).exists()
    (tmp_path / REPORT).write_text(json.dumps({"token": speed.token, "images": 1, "seconds": 1.0}))
    assert speed.learn_from_ranks(tmp_path) and speed.images == 42  # it trained: its own figures stand


def test_the_launcher_takes_only_the_report_of_its_own_ranks(tmp_path):
    launcher = RunThroughput()
    assert not launcher.learn_from_ranks(tmp_path)  # no report: the speed is unknown, not 0 img/s
    (tmp_path / REPORT).write_text(json.dumps({"token": "an earlier run", "images": 99, "seconds": 9.0}))
    assert not launcher.learn_from_ranks(tmp_path) and launcher.images == 0
    (tmp_path / REPORT).write_text('{"token": "')  # torn
    assert not launcher.learn_from_ranks(tmp_path)
    (tmp_path / REPORT).write_text(json.dumps({"token": launcher.token, "images": 4096, "seconds": 2.0}))
    assert launcher.learn_from_ranks(tmp_path) and launcher.rate == 2048.0


def test_outside_a_process_group_nothing_is_reduced():
    assert reduce_over_ranks(10, 2.5) == (10, 2.5)


def _rank(rank: int, world: int, rendezvous: str, launcher: bytes, out: str) -> None:
    """One DDP rank: a copy of the launcher's callbacks (as Ultralytics' cloudpickled state gives each rank), two
    epochs of 3 steps; rank 1 is slower and holds one image less (a last, partial batch)."""
    torch.distributed.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    try:
        speed = pickle.loads(launcher)
        clock = FakeClock()
        speed.clock.clock = clock
        trainer = SimpleNamespace(batch_images=0, device=torch.device("cpu"), save_dir=Path(out))
        for _ in range(2):
            _epoch(speed, clock, trainer, [8, 8, 8 - rank], step=0.4 + 0.1 * rank)
            clock.t += 30.0
        Path(out, f"rank{rank}.json").write_text(json.dumps([speed.images, speed.seconds]))
        if rank == 0:  # Ultralytics runs on_train_end on rank 0 only
            speed.on_train_end(trainer)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_ddp_ranks_sum_images_take_the_slowest_seconds_and_tell_the_launcher(tmp_path):
    launcher = RunThroughput()
    torch.multiprocessing.spawn(_rank, args=(2, f"file://{tmp_path / 'rendezvous'}", pickle.dumps(launcher),
                                             str(tmp_path)), nprocs=2, join=True)
    images, seconds = 2 * 24 + 2 * 23, 2 * 3 * (0.1 + 0.5)  # every rank's images; rank 1's (slower) seconds
    for rank in range(2):  # every rank holds the reduced figures
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == [images, pytest.approx(seconds)]
    assert launcher.learn_from_ranks(tmp_path)  # the launcher, outside the process group
    assert launcher.images == images and launcher.seconds == pytest.approx(seconds)
