"""Does a validation beside the training invalidate a CUDA graph captured in the training thread when it syncs only its
own stream, as yolofeed's validation does? A pytest plugin for ``val_overlap``'s GPU test:

    python -m pytest -q -m gpu tests/test_val_overlap.py -k on_a_gpu -p tools.device.capture_beside

It takes out the trainer's wait before a capture (``FastTrainer._settle_overlapped`` does nothing) and makes a
device-wide ``torch.cuda.synchronize`` called in the validation thread a sync of that thread's stream (the test's
validator syncs the whole device before it validates a second time). The test captures the augmentation's graph again
as mosaic closes, beside epoch 1's validation. It passing says the harness's device-wide sync alone invalidated that
capture, and the wait guards against a user's validator or callback doing the same; it failing says yolofeed's own
validation needs the wait.
"""

from __future__ import annotations

import threading

import torch

from yolofeed.train.trainer import FastTrainer

VALIDATION_THREAD = "yolofeed-validation"  # train/validation.py's thread name


def pytest_configure(config) -> None:
    device_sync = torch.cuda.synchronize

    def synchronize(device=None) -> None:
        if threading.current_thread().name == VALIDATION_THREAD:
            torch.cuda.current_stream(device).synchronize()
        else:
            device_sync(device)

    torch.cuda.synchronize = synchronize
    FastTrainer._settle_overlapped = lambda self: None
    print("capture_beside: no wait before a capture; the validation thread's device syncs are stream syncs")
