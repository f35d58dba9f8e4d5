"""Where Ultralytics' ``save_model`` spends its time, part by part, on this machine's device (yolo11n, AdamW).

Runs Ultralytics' own ``BaseTrainer.save_model`` on a stand-in trainer (the EMA, an AdamW with state after one step,
the scaler, the arguments), then each of its parts alone, each timed with the device synchronised around it:
the EMA's finite check, the EMA's half copy, the optimiser's state copy, ``torch.save`` into memory, and the writes
(yolofeed's atomic write with and without the fsync, a plain write); then yolofeed's hand-over to its checkpoint
process (train/saver.py), the training thread's part and the whole.

    python -m tools.device.save_profile [folder]
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from copy import deepcopy
from pathlib import Path
from types import SimpleNamespace

import torch

os.environ.setdefault("YOLO_OFFLINE", "1")


def timed(fn, n: int = 5) -> tuple[float, object]:
    """The median seconds of ``n`` calls of ``fn`` (the device synchronised around each) and the last result."""
    out, times = None, []
    for _ in range(n):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2], out


def finite_at_once(module: torch.nn.Module) -> bool:
    """Whether every floating tensor of ``module``'s state is finite, in one sync: the norms of all at once (an
    infinite or NaN element makes its norm so; a finite norm that overflows only sends a caller to the exact check)."""
    floats = [v for v in module.state_dict().values() if v.is_floating_point()]
    return bool(torch.stack(torch._foreach_norm(floats)).isfinite().all())


def host_copies(module: torch.nn.Module, state: dict) -> tuple[torch.nn.Module, dict]:
    """``module`` and the optimiser's ``state`` dict with every tensor of theirs copied to the host: one concatenation
    and one device-to-host copy a dtype, then a host tensor of its own for each (no shared storage in a checkpoint)."""
    tensors = [t for t in module.state_dict(keep_vars=True).values()]
    tensors += [t for per in state["state"].values() for t in per.values() if isinstance(t, torch.Tensor)]
    host: dict[int, torch.Tensor] = {}
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        group = [t for t in tensors if t.dtype == dtype]
        flat = torch.cat([t.detach().reshape(-1) for t in group]).cpu()
        for t, h in zip(group, flat.split([t.numel() for t in group])):
            h = h.view(t.shape).clone()
            host[id(t)] = torch.nn.Parameter(h, t.requires_grad) if isinstance(t, torch.nn.Parameter) else h
    copied = deepcopy(module, {k: v for k, v in host.items()})
    return copied, {"state": {k: {n: host.get(id(t), t) for n, t in per.items()} for k, per in state["state"].items()},
                    "param_groups": deepcopy(state["param_groups"])}


def main(argv: list[str]) -> int:
    from ultralytics.cfg import get_cfg
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import ModelEMA, convert_optimizer_state_dict_to_fp16

    from yolofeed import atomic
    from yolofeed.train.checkpoints import AtomicPath

    folder = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="save-profile-"))
    folder.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = DetectionModel("yolo11n.yaml", nc=10, verbose=False).to(device)
    model.args = get_cfg()
    ema = ModelEMA(model)
    stand_in = SimpleNamespace(model=model, ema=ema, args=get_cfg(overrides={"optimizer": "AdamW"}))
    optimizer = BaseTrainer.build_optimizer(stand_in, model, name="AdamW", lr=0.001, momentum=0.9, decay=5e-4)
    for p in model.parameters():  # a step's gradients: the optimiser's state as a run's
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    ema.update(model)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    trainer = SimpleNamespace(
        ema=ema, model=model, optimizer=optimizer, scaler=scaler, args=stand_in.args, epoch=3, best_fitness=0.5,
        fitness=0.5, metrics={"metrics/mAP50-95(B)": 0.5}, stopper=SimpleNamespace(best_fitness=0.5, best_epoch=3),
        read_results_csv=lambda: {"epoch": [1, 2, 3]}, wdir=folder, last=AtomicPath(folder / "last.pt"),
        best=AtomicPath(folder / "best.pt"), save_period=-1)
    print(f"{device}: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters")

    rows = []
    s, _ = timed(lambda: BaseTrainer.save_model(trainer))
    rows.append(("Ultralytics' save_model, atomic writes with fsync, in this thread", s))
    size = (folder / "last.pt").stat().st_size
    trainer.last, trainer.best = folder / "plain-last.pt", folder / "plain-best.pt"
    s, _ = timed(lambda: BaseTrainer.save_model(trainer))
    rows.append(("Ultralytics' save_model, plain writes (as stock)", s))

    e = ema.ema
    s, _ = timed(lambda: all(torch.isfinite(v).all() for v in e.state_dict().values() if isinstance(v, torch.Tensor)))
    rows.append(("  EMA finite check (a sync a tensor)", s))

    def half_copy():
        c = deepcopy(e).half().to(memory_format=torch.contiguous_format)
        for v in c.state_dict().values():
            if v.is_floating_point():
                torch.nan_to_num_(v)
        return c
    s, half = timed(half_copy)
    rows.append(("  EMA deepcopy, half, nan_to_num", s))
    s, _ = timed(lambda: deepcopy(e))
    rows.append(("    of which deepcopy", s))
    s, opt = timed(lambda: convert_optimizer_state_dict_to_fp16(deepcopy(optimizer.state_dict())))
    rows.append(("  optimiser state_dict deepcopy, fp16", s))
    ckpt = {"ema": half, "optimizer": opt, "train_args": vars(trainer.args)}
    s, _ = timed(lambda: torch.save(ckpt, io.BytesIO()))
    rows.append(("  torch.save to memory (the D2H copies included)", s))
    cpu = {"ema": deepcopy(half).cpu(), "optimizer": deepcopy(opt), "train_args": vars(trainer.args)}
    cpu["optimizer"]["state"] = {k: {n: t.cpu() for n, t in v.items()} for k, v in opt["state"].items()}
    s, _ = timed(lambda: torch.save(cpu, io.BytesIO()))
    rows.append(("  torch.save to memory, tensors on the host already", s))
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    data = buf.getvalue()
    s, _ = timed(lambda: atomic.write_atomically(folder / "w.pt", data))
    rows.append(("  one file, atomic with fsync", s))
    s, _ = timed(lambda: (folder / "p.pt").write_bytes(data))
    rows.append(("  one file, plain write", s))
    fsync = atomic.os.fsync
    atomic.os.fsync = lambda fd: None
    try:
        s, _ = timed(lambda: atomic.write_atomically(folder / "w.pt", data))
    finally:
        atomic.os.fsync = fsync
    rows.append(("  one file, atomic without fsync", s))

    # the lever not yet built: save_model's own code run on host copies of the EMA and the optimiser's state, made by
    # one batched finite check and one device-to-host copy a dtype (the checkpoint then holds host tensors)
    s, _ = timed(lambda: finite_at_once(e))
    rows.append(("  EMA finite check, batched (one sync)", s))
    s, _ = timed(lambda: host_copies(e, optimizer.state_dict()))
    rows.append(("  host copies of the EMA and the optimiser state, batched", s))

    def on_host():
        host_ema, host_state = host_copies(e, optimizer.state_dict())
        host = SimpleNamespace(**{**vars(trainer), "ema": SimpleNamespace(ema=host_ema, updates=ema.updates),
                                  "optimizer": SimpleNamespace(state_dict=lambda: host_state)})
        finite_at_once(e)
        return BaseTrainer.save_model(host)
    s, _ = timed(on_host)
    rows.append(("Ultralytics' save_model on batched host copies, plain writes (the copies included)", s))

    # yolofeed's checkpoint process (train/saver.py): the training thread's part (the finite check, the pickle
    # without tensors, the host copies queued), then until the child wrote the files
    from yolofeed.train.saver import Saver
    from yolofeed.train.writes import WRITES

    saver = Saver.start()
    child_dir = folder / "child"
    trainer.wdir, trainer.last, trainer.best = child_dir, AtomicPath(child_dir / "last.pt"), AtomicPath(
        child_dir / "best.pt")
    assert saver is not None and saver.save(trainer)
    WRITES.wait(child_dir)  # the child's imports done, its first checkpoint written
    s, _ = timed(lambda: saver.save(trainer))
    rows.append(("yolofeed's hand-over to the checkpoint process (the training thread's part)", s))
    s, _ = timed(lambda: (saver.save(trainer), WRITES.wait(child_dir)))
    rows.append(("  and until the child wrote last.pt and best.pt", s))
    saver.close()

    print(f"checkpoint {size / 1e6:.1f} MB")
    for name, s in rows:
        print(f"{name:<68} {s * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
