"""What a Python-busy thread beside costs a thread of many short torch calls, on the CPU.

``python -m tools.gil_convoy [--calls 20000]``

Every torch call from Python gives up the GIL while it runs, and takes it back after; the training thread makes about
a thousand such calls a step (the loss, the optimiser, the EMA, the augmentation's launches). A thread beside that
holds the GIL in long C calls (pickling a checkpoint, say) takes it at each of them, and the training thread waits for
it to come back: at the interpreter's switch interval at best, after the whole C call at worst. This times
``--calls`` calls of ``torch.add`` on two 8-element tensors alone, then beside a thread that pickles a large dict in a
loop, at the default switch interval (5 ms) and at ``processes.SWITCH_S``'s; and a pure-Python loop the same way.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import threading
import time

import torch

from yolofeed.processes import SWITCH_S


def _torch_calls(n: int) -> float:
    a, b = torch.ones(8), torch.ones(8)
    t = time.perf_counter()
    for _ in range(n):
        torch.add(a, b)
    return time.perf_counter() - t


def _python(n: int) -> float:
    t, x = time.perf_counter(), 0
    for i in range(20 * n):
        x += i
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    args = p.parse_args(argv)
    obj = {f"k{i}": [list(range(20)), {"a": i}] for i in range(20000)}
    stop = threading.Event()

    def pickling() -> None:
        while not stop.is_set():
            pickle.dumps(obj)

    rows, before = [], sys.getswitchinterval()
    try:
        for interval in (0.005, SWITCH_S):
            sys.setswitchinterval(interval)
            alone = _torch_calls(args.calls), _python(args.calls)
            stop.clear()
            thread = threading.Thread(target=pickling, daemon=True)
            thread.start()
            time.sleep(0.1)
            beside = _torch_calls(args.calls), _python(args.calls)
            stop.set()
            thread.join()
            rows.append({"switch_ms": 1e3 * interval, "torch_alone_s": alone[0], "torch_beside_s": beside[0],
                         "python_alone_s": alone[1], "python_beside_s": beside[1]})
            print(f"switch interval {1e3 * interval:g} ms: {args.calls} torch calls {alone[0]:.3f} s alone, "
                  f"{beside[0]:.3f} s beside a pickling thread ({beside[0] / alone[0]:.0f}x); pure Python "
                  f"{alone[1]:.3f} -> {beside[1]:.3f} s ({beside[1] / alone[1]:.1f}x)", flush=True)
    finally:
        sys.setswitchinterval(before)
    return rows


if __name__ == "__main__":
    main()
