"""Where the GPU idles during training steps (issue 4: even the data-free ceiling reads 84-91 % on NVML).

Usage: python3 scripts/device/gpu_gaps.py DATA_YAML [MODE] [MODEL]
    MODE: ceiling (default), yolofeed or stock; MODEL: yolo11n.yaml (default). Batch 128, imgsz 640
    (GAPS_BATCH, GAPS_IMGSZ change them: a CPU smoke run finds no kernels and reports no gaps).
    Writes $OUT/gpu_gaps_<mode>.txt (and prints it); GAPS_TRACE=path also keeps the chrome trace there.

Trains MODE for 40 warm-up steps, then records 10 steps with torch.profiler (CPU ops, CUDA runtime,
kernels) and lists the GPU's idle gaps: stretches longer than 50 us in which no kernel, copy or memset
runs on any stream. Each gap is charged to the CUDA runtime call the training loop was in when the GPU
ran dry (a sync such as cudaStreamSynchronize or a device-to-host copy drains the queue) and to the
innermost host op that ended the gap by launching the next work, and both to their Python lines (the
profiler's stacks). The profiler slows the host, so the idle share reads higher than NVML's; the
ranking is what counts.
"""

from __future__ import annotations

import bisect
import collections
import gzip
import json
import os
import shutil
import sys
import tempfile

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def busy_intervals(events: list[dict]) -> list[tuple[float, float]]:
    """The union of the GPU's kernel, copy and memset intervals (us), sorted and merged."""
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") in GPU_CATS)
    merged: list[list[float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


class Spans:
    """Host events of one kind, sorted by start, answering "what was running at time t" quickly."""

    def __init__(self, events: list[dict]):
        self.events = sorted(events, key=lambda e: e["ts"])
        self.starts = [e["ts"] for e in self.events]

    def at(self, t: float, scan: int = 20000) -> str:
        """The innermost event spanning ``t`` ('-' if none): of nested spans, the one that started last.

        Scans back from the last event that started by ``t``, past the short ones already over.
        """
        k = bisect.bisect_right(self.starts, t)
        for e in reversed(self.events[max(0, k - scan):k]):
            if e["ts"] + e.get("dur", 0) >= t:
                return e["name"]
        return "-"


def main_thread(events: list[dict]) -> object:
    """The thread that ran the most CPU ops: the training loop (the loader's thread only copies)."""
    return collections.Counter(e.get("tid") for e in events if e.get("cat") == "cpu_op").most_common(1)[0][0]


def gaps(events: list[dict], min_us: float = 50.0) -> dict:
    """Idle gaps of the GPU and what the training loop's thread was doing at their start and end.

    Returns:
        ``window_us`` (first kernel to last), ``idle_us``, ``n`` (gaps), and Counters of idle us by what was
        running: ``drained_in`` (the CUDA runtime call at the gap's start, e.g. a sync), ``drained_at`` (the
        Python line then, with the profiler's stacks), ``ended_by`` (the innermost op at the gap's end, which
        launched the next work) and ``ended_at`` (its Python line).
    """
    busy = busy_intervals(events)
    if not busy:
        return {"window_us": 0.0, "idle_us": 0.0, "n": 0, "drained_in": collections.Counter(),
                "drained_at": collections.Counter(), "ended_by": collections.Counter(),
                "ended_at": collections.Counter()}
    tid = main_thread(events)
    mine = [e for e in events if e.get("tid") == tid]
    runtime = Spans([e for e in mine if e.get("cat") in {"cuda_runtime", "cuda_driver"}])
    ops = Spans([e for e in mine if e.get("cat") == "cpu_op"])
    python = Spans([e for e in mine if e.get("cat") == "python_function"])
    out = {k: collections.Counter() for k in ("drained_in", "drained_at", "ended_by", "ended_at")}
    idle, n = 0.0, 0
    for (_, b), (a2, _) in zip(busy, busy[1:]):
        g = a2 - b
        if g < min_us:
            continue
        idle, n = idle + g, n + 1
        out["drained_in"][runtime.at(b)] += g
        out["drained_at"][python.at(b)] += g
        out["ended_by"][ops.at(a2 - 1)] += g
        out["ended_at"][python.at(a2 - 1)] += g
    return {"window_us": busy[-1][1] - busy[0][0], "idle_us": idle, "n": n, **out}


def report(result: dict, steps: int, title: str) -> str:
    w, idle = result["window_us"], result["idle_us"]
    lines = [title, f"{steps} steps, {w / 1e3:.1f} ms from the first kernel to the last; GPU idle {idle / 1e3:.1f} ms "
             f"({100 * idle / max(w, 1):.1f} %) in {result['n']} gaps over 50 us ({idle / 1e3 / steps:.2f} ms a step)"]
    for key, what in (("drained_in", "the CUDA runtime call the host was in when the GPU ran dry"),
                      ("drained_at", "the Python line the host was on when the GPU ran dry"),
                      ("ended_by", "the host op that launched the work ending the gap"),
                      ("ended_at", "the Python line that launched it")):
        lines.append(f"\nidle ms a step, by {what}:")
        for name, us in result[key].most_common(15):
            lines.append(f"  {us / 1e3 / steps:8.2f}  {name}")
    return "\n".join(lines)


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from yolofeed.doctor.profile import trainer_class

    data = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "ceiling"
    model = sys.argv[3] if len(sys.argv) > 3 else "yolo11n.yaml"
    warmup, steps = 40, 10
    batch, imgsz = int(os.environ.get("GAPS_BATCH", 128)), int(os.environ.get("GAPS_IMGSZ", 640))
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    out = os.environ.get("OUT", "/tmp")
    state = {"n": 0, "prof": None}

    class Enough(Exception):
        pass

    def on_train_start(trainer):
        trainer.epochs = 10**6  # as doctor/profile.py: the step count ends the run, never the epoch count

    def on_batch_end(trainer):
        state["n"] += 1
        if state["n"] == warmup:
            if cuda:
                torch.cuda.synchronize()
            state["prof"] = profile(activities=activities, with_stack=True)  # stacks: the Python lines
            state["prof"].__enter__()
        elif state["n"] == warmup + steps:
            if cuda:
                torch.cuda.synchronize()
            state["prof"].__exit__(None, None, None)
            raise Enough

    with tempfile.TemporaryDirectory() as tmp:
        args = {"model": model, "data": data, "imgsz": imgsz, "batch": batch, "workers": 16, "project": tmp,
                "name": mode, "val": False, "plots": False, "save": False, "close_mosaic": 0, "verbose": False,
                "exist_ok": True}
        trainer = trainer_class(mode)(overrides=args)
        trainer.add_callback("on_train_start", on_train_start)
        trainer.add_callback("on_train_batch_end", on_batch_end)
        try:
            trainer.train()
        except Enough:
            pass
        for name in ("train_loader", "test_loader"):
            if hasattr(getattr(trainer, name, None), "close"):
                getattr(trainer, name).close()
        trace = os.path.join(tmp, "trace.json")
        state["prof"].export_chrome_trace(trace)
        with open(trace) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        if os.environ.get("GAPS_TRACE"):
            with open(trace, "rb") as src, gzip.open(os.environ["GAPS_TRACE"], "wb") as dst:
                shutil.copyfileobj(src, dst)
    text = report(gaps(events), steps, f"{mode}, {model}, batch {batch}, imgsz {imgsz}, under torch.profiler")
    print(text)
    with open(os.path.join(out, f"gpu_gaps_{mode}.txt"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
