"""Where the GPU idles during training steps, and what the training loop was doing then.

Usage: python -m tools.device.gpu_gaps DATA_YAML [MODE] [MODEL] [--batch 128] [--imgsz 640] [--warmup 40] [--steps 10]
        [--no-stack]
    MODE: a ``yolofeed bench`` mode (ceiling, the default; yolofeed; stock); MODEL: yolo11n.yaml by default.
    Writes $OUT/gpu_gaps_<mode>.txt (gpu_gaps_<mode>_no_stack.txt with --no-stack; and prints it); ``--trace PATH``
    also keeps the gzipped chrome trace.

Trains MODE for ``--warmup`` steps, then records ``--steps`` steps with torch.profiler (CPU ops, CUDA runtime,
kernels, Python stacks) and lists the GPU's idle gaps: stretches in which no kernel, copy or memset runs on
any stream (NVML's utilisation counts the same thing). Every gap, however short, is charged to

- the phase of the step the training loop was in when the GPU ran dry: the Python frame just under
  Ultralytics' ``_do_train`` (forward and loss, backward, optimizer_step, the progress bar...);
- the innermost Ultralytics or yolofeed line then, and the CUDA runtime call (a sync such as
  cudaStreamSynchronize or a device-to-host copy drains the queue);
- whether the host was late: the work that ended the gap was launched after the GPU ran dry (launch-bound
  host code), or early (the GPU waited on an event, e.g. the loader's copy stream).

Short gaps between small kernels add up when the host launches more slowly than the GPU runs them, so the
report sorts gaps by size too. The profiler's Python stacks slow the host (a yolo11n ceiling step on the H200:
~78 ms without, 133 ms with), so a fast step reads launch-bound throughout and its ranking says little; there
``syncs`` (which syncs, on which line) is the better guide, or ``--no-stack``: the host near its own speed, gaps
charged only to the CUDA call and to who waited (the phase and line read "-"). On the CPU there are no GPU events
and no gaps.
"""

from __future__ import annotations

import bisect
import collections
import gzip
import json
import os
import shutil
import tempfile

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
SIZES = (10.0, 50.0, 200.0, 1000.0)  # gap-size bins, us


def busy_intervals(events: list[dict]) -> list[tuple[float, float, dict]]:
    """The union of the GPU's kernel, copy and memset intervals (us), merged, each with the event that opened it."""
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0), e) for e in events if e.get("cat") in GPU_CATS)
    merged: list[list] = []
    for a, b, e in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b, e])
    return [(a, b, e) for a, b, e in merged]


class Nested:
    """One thread's properly nested host events (Python frames, ops or runtime calls), answering "what was running
    at time t" by bisection: the innermost span holding t is the last one started by t or one of its ancestors."""

    def __init__(self, events: list[dict]):
        self.events = sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0)))
        self.starts = [e["ts"] for e in self.events]
        self.parent = [-1] * len(self.events)
        stack: list[int] = []
        for i, e in enumerate(self.events):
            while stack and self._end(stack[-1]) < e["ts"]:
                stack.pop()
            self.parent[i] = stack[-1] if stack else -1
            stack.append(i)

    def _end(self, i: int) -> float:
        return self.events[i]["ts"] + self.events[i].get("dur", 0)

    def chain(self, t: float) -> list[str]:
        """The names of the spans holding ``t``, outermost first."""
        i = bisect.bisect_right(self.starts, t) - 1
        while i >= 0 and self._end(i) < t:
            i = self.parent[i]
        out = []
        while i >= 0:
            out.append(self.events[i]["name"])
            i = self.parent[i]
        return out[::-1]

    def at(self, t: float) -> str:
        c = self.chain(t)
        return c[-1] if c else "-"


def phase(chain: list[str]) -> str:
    """The frame just under the training loop (``_do_train``), or the loop itself, or '-' outside it."""
    for i, name in enumerate(chain):
        if name.endswith(": _do_train"):
            return chain[i + 1] if i + 1 < len(chain) else name
    return "-"


def own_line(chain: list[str]) -> str:
    """The innermost Ultralytics or yolofeed frame: the line a user of either would change."""
    for name in reversed(chain):
        if "ultralytics/" in name or "yolofeed/" in name:
            return name
    return chain[-1] if chain else "-"


def main_thread(events: list[dict]) -> object:
    """The training loop's thread: the one running ``_do_train``; without Python stacks, the one that steps the
    optimiser (torch's ``Optimizer.step#...`` annotation: the autograd engine's thread can run more ops); else the
    one with the most CPU ops."""
    for e in events:
        if e.get("cat") == "python_function" and e["name"].endswith(": _do_train"):
            return e.get("tid")
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#"):
            return e.get("tid")
    return collections.Counter(e.get("tid") for e in events if e.get("cat") == "cpu_op").most_common(1)[0][0]


def gaps(events: list[dict], min_us: float = 0.0) -> dict:
    """Idle gaps of the GPU, charged to what the training loop was doing when the GPU ran dry.

    Returns ``window_us`` (first GPU event to last), ``idle_us``, ``n`` (gaps), Counters of idle us by ``phase``,
    ``line`` (innermost Ultralytics/yolofeed frame), ``runtime`` (CUDA call), ``late`` (host late / GPU waited),
    ``size`` (gap-size bin), and ``top``: the longest gaps with their phase, line and runtime call.
    """
    busy = busy_intervals(events)
    counters = ("phase", "line", "runtime", "late", "size")
    out: dict = {k: collections.Counter() for k in counters}
    out.update(window_us=0.0, idle_us=0.0, n=0, top=[])
    if not busy:
        return out
    tid = main_thread(events)
    mine = [e for e in events if e.get("tid") == tid]
    python = Nested([e for e in mine if e.get("cat") == "python_function"])
    runtime = Nested([e for e in mine if e.get("cat") in {"cuda_runtime", "cuda_driver"}])
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in {"cuda_runtime", "cuda_driver"} and "correlation" in e.get("args", {})}
    top = []
    for (_, b, _), (a2, _, nxt) in zip(busy, busy[1:]):
        g = a2 - b
        if g < min_us:
            continue
        out["idle_us"] += g
        out["n"] += 1
        chain = python.chain(b)
        where = {"phase": phase(chain), "line": own_line(chain), "runtime": runtime.at(b)}
        t_launch = launched.get(nxt.get("args", {}).get("correlation"))
        where["late"] = ("unknown launch" if t_launch is None else
                         "host late: next work launched after the GPU ran dry" if t_launch > b else
                         "GPU waited: next work was queued before (an event, another stream)")
        where["size"] = next((f"< {s:.0f} us" for s in SIZES if g < s), f">= {SIZES[-1]:.0f} us")
        for k in counters:
            out[k][where[k]] += g
        top.append((g, where["phase"], where["line"], where["runtime"], nxt.get("name", "")[:60]))
    out["window_us"] = busy[-1][1] - busy[0][0]
    out["top"] = sorted(top, reverse=True)[:12]
    return out


def _union_us(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) spans."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def threads(events: list[dict]) -> dict:
    """Who works when: each host thread's time in aten ops and in CUDA calls, and each stream's busy time.

    A launch-bound training thread loses time outside its ops (Python, or waiting for the GIL that another thread
    holds) or inside its CUDA calls (a driver lock another thread holds); its stream then idles between kernels
    even where another stream's kernels keep the GPU as a whole busy, which ``gaps`` cannot see.

    Returns ``window_us`` (first GPU event to last), ``main`` (the training loop's thread id), ``threads``: per thread
    id, ``ops_us`` (union of its aten ops, within the window), ``runtime`` (a Counter of CUDA call us by name);
    ``streams``: per stream id, ``busy_us`` (union of its kernels, copies and memsets) and ``kernels``.
    """
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    out: dict = {"window_us": 0.0, "main": None, "threads": {}, "streams": {}}
    if not gpu:
        return out
    t0, t1 = min(e["ts"] for e in gpu), max(e["ts"] + e.get("dur", 0) for e in gpu)
    out["window_us"] = t1 - t0
    out["main"] = main_thread(events)
    by_stream: dict = collections.defaultdict(list)
    for e in gpu:
        by_stream[e.get("args", {}).get("stream", "?")].append((e["ts"], e["ts"] + e.get("dur", 0)))
    out["streams"] = {k: {"busy_us": _union_us(v), "kernels": len(v)} for k, v in by_stream.items()}
    ops: dict = collections.defaultdict(list)
    runtime: dict = collections.defaultdict(collections.Counter)
    for e in events:
        if e.get("cat") == "cpu_op":  # clipped to the window: "outside ops" is the window's rest
            a, b = max(e["ts"], t0), min(e["ts"] + e.get("dur", 0), t1)
            if b > a:
                ops[e.get("tid")].append((a, b))
        elif e.get("cat") in {"cuda_runtime", "cuda_driver"}:
            runtime[e.get("tid")][e["name"]] += e.get("dur", 0)
    for tid in set(ops) | set(runtime):
        out["threads"][tid] = {"ops_us": _union_us(ops.get(tid, [])),
                               "runtime": runtime.get(tid, collections.Counter())}
    return out


def threads_report(result: dict, steps: int) -> str:
    """``threads``' result as text, ms a step."""
    w = result["window_us"]
    if not w:
        return "no GPU work recorded"
    lines = [f"\nhost threads, ms a step of the {w / 1e3 / steps:.1f} ms window (in aten ops; CUDA calls by name):"]
    ranked = sorted(result["threads"].items(), key=lambda kv: -(kv[1]["ops_us"] + sum(kv[1]["runtime"].values())))
    for tid, t in ranked[:4]:
        who = "training loop" if tid == result["main"] else "other"
        calls = ", ".join(f"{n} {us / 1e3 / steps:.2f}" for n, us in t["runtime"].most_common(6))
        lines.append(f"  thread {tid} ({who}): ops {t['ops_us'] / 1e3 / steps:.2f}, outside ops "
                     f"{(w - t['ops_us']) / 1e3 / steps:.2f}; {calls}")
    lines.append("streams, ms a step busy (kernels, copies, memsets):")
    for k, st in sorted(result["streams"].items(), key=lambda kv: -kv[1]["busy_us"]):
        busy, items = st["busy_us"] / 1e3 / steps, st["kernels"] / steps
        lines.append(f"  stream {k}: busy {busy:.2f}, idle {w / 1e3 / steps - busy:.2f}, {items:.0f} items")
    return "\n".join(lines)


def report(result: dict, steps: int, title: str) -> str:
    """``gaps``' result as text: the idle share, idle ms a step by each counter, and the longest gaps."""
    w, idle = result["window_us"], result["idle_us"]
    lines = [title, f"{steps} steps, {w / 1e3:.1f} ms from the first GPU work to the last ({w / 1e3 / steps:.1f} ms a "
             f"step); GPU idle {idle / 1e3:.1f} ms ({100 * idle / max(w, 1):.1f} %) in {result['n']} gaps "
             f"({idle / 1e3 / steps:.2f} ms a step)"]
    for key, what in (("phase", "the step's phase when the GPU ran dry (frame under _do_train)"),
                      ("line", "the innermost Ultralytics/yolofeed line when the GPU ran dry"),
                      ("runtime", "the CUDA runtime call the training loop was in"),
                      ("late", "who waited"),
                      ("size", "gap size")):
        lines.append(f"\nidle ms a step, by {what}:")
        for name, us in result[key].most_common(15):
            lines.append(f"  {us / 1e3 / steps:8.2f}  {name}")
    lines.append("\nlongest gaps (us, phase, line, runtime call, the GPU work that ended it):")
    for g, *rest in result["top"]:
        lines.append(f"  {g:8.0f}  " + " | ".join(rest))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from tools.device.run_steps import profile_steps, run_steps
    from yolofeed.bench.modes import trainer_class

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("mode", nargs="?", default="ceiling")
    ap.add_argument("model", nargs="?", default="yolo11n.yaml")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--trace", help="also keep the profiler's chrome trace here (gzipped)")
    ap.add_argument("--no-stack", action="store_true",
                    help="no Python stacks: the host runs near its own speed, gaps are charged to runtime calls only")
    a = ap.parse_args(argv)
    cls = trainer_class(a.mode)
    on_batch_end, state = profile_steps(a.warmup, a.steps, with_stack=not a.no_stack)  # stacks: the Python lines
    with tempfile.TemporaryDirectory() as tmp:
        args = {"model": a.model, "data": a.data, "imgsz": a.imgsz, "batch": a.batch, "project": tmp, "name": a.mode}
        run_steps(cls, args, on_batch_end)
        trace = os.path.join(tmp, "trace.json")
        state["prof"].export_chrome_trace(trace)
        with open(trace) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        if a.trace:
            with open(trace, "rb") as src, gzip.open(a.trace, "wb") as dst:
                shutil.copyfileobj(src, dst)
    how = "without Python stacks" if a.no_stack else "with Python stacks"
    text = report(gaps(events), a.steps, f"{a.mode}, {a.model}, batch {a.batch}, imgsz {a.imgsz}, under torch.profiler "
                  f"{how}") + "\n" + threads_report(threads(events), a.steps)
    print(text)
    name = f"gpu_gaps_{a.mode}{'_no_stack' if a.no_stack else ''}.txt"
    with open(os.path.join(os.environ.get("OUT", "/tmp"), name), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
