"""A run in an interpreter that lives on (a notebook): what a yolofeed run leaves behind for what comes after it.

Ultralytics' ``Model.train`` keeps the trainer (``model.trainer``), and a model made from a ``.pt`` shares the trainer's
model; a notebook keeps both for as long as it runs. What the trainer holds beyond stock's is let go once the run ends
or stops: the packs (their files and maps), the loaders' buffers, the partner pool, the augmentation, the step's graph,
the loss's classes.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import types
from pathlib import Path

import pytest

TINY = dict(epochs=1, imgsz=64, batch=8, device="cpu", workers=0, plots=False, verbose=False, exist_ok=True)


def _open_packs() -> list[str]:
    """The pack files this process holds open or mapped (/proc/self: Linux)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    held += [line.split(None, 5)[-1] for line in Path("/proc/self/maps").read_text().splitlines()
             if len(line.split(None, 5)) == 6]
    return sorted({p for p in held if ".yfpack" in p})


def _classes_in(path: Path, obj: object = None) -> set[str]:
    """The modules of the classes a checkpoint (``path``), or ``obj`` pickled, names (the metadata Ultralytics adds,
    git's last commit message among it, may name yolofeed in words)."""
    import torch

    seen = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add(module)
            return super().find_class(module, name)

    if obj is not None:
        Recording(io.BytesIO(pickle.dumps(obj))).load()
    else:
        torch.load(path, weights_only=False, pickle_module=types.SimpleNamespace(
            Unpickler=Recording, load=pickle.load, __name__="pickle"))
    return seen


class Stop(KeyboardInterrupt):
    """The notebook's stop button, pressed in a callback."""


def _stop_at_second_batch(trainer) -> None:
    if getattr(trainer, "batch_i_seen", 0) >= 1:
        raise Stop
    trainer.batch_i_seen = 1


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self")
def test_a_finished_run_lets_go_of_its_packs_buffers_pool_and_graphs(dataset, tmp_path):
    """After ``model.train(...)`` the YOLO object keeps the trainer: its loaders hold no pack and no buffer, the
    trainer no partner pool or augmentation, its model no graph and no yolofeed loss; no pack file stays open or mapped
    (a pack deleted or rebuilt later frees its disk space). A released loader, and its dataset's labels, say so when
    read again."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer
    from yolofeed.loader.prefetch import LoaderError

    model = YOLO("yolo11n.yaml")
    model.train(trainer=FastDetectionTrainer, data=str(dataset / "data.yaml"), project=str(tmp_path), name="a",
                **TINY)
    t = model.trainer
    for loader in (t.train_loader, t.test_loader):
        assert loader.prefetcher.pack is None and loader.prefetcher.slots == [] and loader.dataset.pack is None
        assert len(loader.dataset.im_files) == len(loader.dataset) > 0  # what stays: the names and the count
    assert t._pool is None and t._augment is None and t._warm is None
    assert getattr(t.model, "criterion", None) is None and "_graph" not in t.model.__dict__
    gc.collect()
    assert _open_packs() == []
    with pytest.raises(LoaderError, match="let go of its pack when its run ended"):
        next(iter(t.train_loader))
    with pytest.raises(LoaderError, match="let go of with its pack when its run ended"):
        t.train_loader.dataset.labels  # noqa: B018


def test_a_stopped_run_of_a_pt_model_leaves_a_model_that_pickles_without_yolofeed(dataset, tmp_path):
    """``YOLO("x.pt").train(...)`` stopped by Ctrl-C (a notebook's stop button): the YOLO object keeps the trainer's
    model, and ``model.save()`` pickles it. It holds no yolofeed class: its loss is unset, as before a first loss call,
    and Ultralytics makes it again: the file loads where yolofeed is not installed. A run after it in the same
    interpreter trains."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    first = YOLO("yolo11n.yaml")
    first.train(trainer=FastDetectionTrainer, data=str(dataset / "data.yaml"), project=str(tmp_path), name="a",
                **TINY)
    model = YOLO(str(tmp_path / "a" / "weights" / "last.pt"))
    model.add_callback("on_train_batch_end", _stop_at_second_batch)
    with pytest.raises(Stop):
        model.train(trainer=FastDetectionTrainer, data=str(dataset / "data.yaml"), project=str(tmp_path), name="b",
                    **TINY)
    assert model.model is model.trainer.model  # Ultralytics' own sharing, for a model made from a .pt
    assert not [m for m in _classes_in(tmp_path / "none", model.model) if m.startswith("yolofeed")]
    model.save(tmp_path / "saved.pt")
    assert not [m for m in _classes_in(tmp_path / "saved.pt") if m.startswith("yolofeed")]
    model.callbacks["on_train_batch_end"].remove(_stop_at_second_batch)
    model.train(trainer=FastDetectionTrainer, data=str(dataset / "data.yaml"), project=str(tmp_path), name="c",
                **TINY)
    assert (tmp_path / "c" / "weights" / "best.pt").is_file()
