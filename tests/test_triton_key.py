"""Triton's cache key computed ahead (kernels/triton_key.py), and the trainer starting it on CUDA only."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from yolofeed.errors import DatasetError
from yolofeed.kernels import triton_key
from yolofeed.train import plans, trainer


def _no_thread_error(monkeypatch) -> list:
    errors = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    return errors


def test_the_key_is_cached_for_the_first_launch(monkeypatch):
    cache = pytest.importorskip("triton.runtime.cache")
    errors = _no_thread_error(monkeypatch)
    cache.triton_key.cache_clear()
    thread = triton_key.start()
    assert thread.daemon  # nothing waits for it, an exit neither
    thread.join(60)
    assert not thread.is_alive() and errors == []
    assert cache.triton_key.cache_info().currsize == 1  # the first launch finds it: no second hashing
    key = cache.triton_key()
    assert cache.triton_key.cache_info().hits >= 1 and isinstance(key, str) and key


@pytest.mark.parametrize("failure", ["no triton", "the key fails"])
def test_a_key_it_cannot_compute_is_left_to_the_first_launch(monkeypatch, failure):
    errors = _no_thread_error(monkeypatch)
    if failure == "no triton":
        monkeypatch.setitem(sys.modules, "triton.runtime.cache", None)  # import raises ImportError
    else:
        cache = pytest.importorskip("triton.runtime.cache")

        def unreadable():
            raise OSError("libtriton.so: permission denied")

        monkeypatch.setattr(cache, "triton_key", unreadable)
    thread = triton_key.start()
    thread.join(60)
    assert not thread.is_alive() and errors == []  # nothing said, nothing raised: the launch computes its own


@pytest.mark.parametrize("cuda", [True, False])
def test_the_trainer_starts_it_on_cuda_only(monkeypatch, tmp_path, cuda):
    started = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(triton_key, "start", lambda: started.append(1))
    monkeypatch.setattr(plans, "start", lambda *a: None)  # the early plans' thread: its own tests
    with pytest.raises(DatasetError):  # the constructor stops at the data yaml's check, after the thread started
        trainer.FastDetectionTrainer(overrides={"model": "yolo11n.yaml", "data": str(tmp_path / "none.yaml"),
                                                "project": str(tmp_path)})
    assert started == ([1] if cuda else [])
