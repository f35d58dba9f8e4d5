"""What one DDP gradient all-reduce costs here: the link's measured bandwidth against a model's gradient bytes.

DDP sums every gradient over the ranks each step (in buckets, overlapped with the backward pass where it can
be). This starts one process per GPU (NCCL; on a machine without GPUs, ``--cpu`` processes with gloo), times
``all_reduce`` of float32 tensors from 1 MB up, and reports for each size the algorithm bandwidth (bytes / time)
and the bus bandwidth (NCCL's convention: x 2(N-1)/N, comparable across N). With ``--model`` it also counts the
model's trainable parameters and predicts one step's all-reduce time from the measured rate at that size: the
input of the scaling model in ``docs/scaling.md``.

Usage: python -m tools.device.allreduce_bw [--gpus N | --cpu N] [--max-mb 256] [--iters 20] [--model yolo11n.yaml]
Writes ``$OUT/allreduce_bw.json`` (default /tmp) and prints one line per size.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MB = 1 << 20


def sizes(max_mb: float) -> list[int]:
    """Tensor sizes in bytes: 1 MB, 2 MB, 4 MB ... up to ``max_mb`` (a multiple of 4 bytes: float32)."""
    out, mb = [], 1.0
    while mb <= max_mb:
        out.append(int(mb * MB) // 4 * 4)
        mb *= 2
    return out or [int(max_mb * MB) // 4 * 4]


def bus_factor(world: int) -> float:
    """NCCL's bus-bandwidth factor for all-reduce: each byte crosses 2(N-1)/N links."""
    return 2 * (world - 1) / world


def gradient_bytes(model_yaml: str) -> int:
    """float32 bytes of a model's trainable parameters: what DDP all-reduces each step (AMP keeps fp32 grads)."""
    from yolofeed.ultralytics_seam import YOLO

    model = YOLO(model_yaml).model
    return 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)


def _rank(rank: int, world: int, port: int, cuda: bool, byte_sizes: list[int], iters: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        for nbytes in byte_sizes:
            x = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
            for _ in range(3):  # warm-up: NCCL sets up its channels on the first calls
                dist.all_reduce(x)
            if cuda:
                torch.cuda.synchronize(dev)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            if cuda:
                torch.cuda.synchronize(dev)
            seconds = (time.perf_counter() - t0) / iters
            slowest = torch.tensor([seconds], dtype=torch.float64, device=dev)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if rank == 0:
                out[nbytes] = slowest.item()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(world: int, cuda: bool, byte_sizes: list[int], iters: int) -> dict[int, float]:
    """Seconds per all-reduce for each size, the slowest rank's, over ``world`` processes."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(world, free_port(), cuda, byte_sizes, iters, out), nprocs=world, join=True)
        return dict(out)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=None, help="processes, one per GPU (default: every visible GPU)")
    ap.add_argument("--cpu", type=int, default=None, help="N processes on the CPU with gloo instead (a smoke run)")
    ap.add_argument("--max-mb", type=float, default=256.0, help="largest tensor, MB")
    ap.add_argument("--iters", type=int, default=20, help="timed all-reduces a size")
    ap.add_argument("--model", default=None, help="a model yaml: predict its gradient all-reduce per step")
    a = ap.parse_args(argv)
    cuda = a.cpu is None
    world = a.cpu if not cuda else (a.gpus or torch.cuda.device_count())
    if cuda and (not torch.cuda.is_available() or world < 2 or world > torch.cuda.device_count()):
        raise SystemExit(f"allreduce_bw: needs 2 or more CUDA GPUs (torch sees {torch.cuda.device_count()}); "
                         "--cpu 2 runs it on the CPU with gloo")
    if world < 2:
        raise SystemExit("allreduce_bw: an all-reduce needs 2 or more processes")
    byte_sizes = sizes(a.max_mb)
    grads = gradient_bytes(a.model) if a.model else None
    if grads:
        byte_sizes = sorted(set(byte_sizes) | {grads // 4 * 4})
    seconds = measure(world, cuda, byte_sizes, a.iters)
    rows = []
    for nbytes in byte_sizes:
        alg = nbytes / seconds[nbytes] / 1e9
        rows.append({"bytes": nbytes, "ms": round(1000 * seconds[nbytes], 3), "algbw_gb_s": round(alg, 2),
                     "busbw_gb_s": round(alg * bus_factor(world), 2)})
        print(f"{nbytes / MB:9.2f} MB  {1000 * seconds[nbytes]:9.3f} ms  algbw {alg:8.2f} GB/s  "
              f"busbw {alg * bus_factor(world):8.2f} GB/s", flush=True)
    res = {"world": world, "backend": "nccl" if cuda else "gloo", "iters": a.iters, "sizes": rows}
    if grads:
        res.update(model=a.model, gradient_bytes=grads, allreduce_ms=round(1000 * seconds[grads // 4 * 4], 3))
        print(f"{a.model}: {grads / MB:.1f} MB of float32 gradients: {res['allreduce_ms']:.2f} ms an all-reduce "
              f"over {world} {'GPUs' if cuda else 'processes'}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "allreduce_bw.json"), "w") as f:
        json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
