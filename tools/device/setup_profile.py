"""Where a whole run's set-up and first epochs go, thread by thread: a sampling profile of every Python thread.

Trains ``trainer`` (yolofeed's, or ``stock``: Ultralytics' own) as ``yolofeed bench whole_run=E`` does (its
``whole_run``, Ultralytics' defaults but those given), while a thread of this tool reads every other thread's stack
each ``interval`` seconds (``sys._current_frames``). Each sample is put in a phase by the run's marks: ``build`` (the
trainer's constructor), ``setup_train`` (to the first epoch's start), ``epoch1``, ``epoch2``, ... and ``end`` (the last
epoch's end to the end). Prints, per phase and thread, the seconds seen (samples x interval) and the functions with
the most seconds on the stack (inclusive) and at its top (where the thread was: waiting in a lock, a torch call,
Python). Writes into the folder ``out``: ``<trainer>_profile.txt`` (that printout) and ``<trainer>_samples.json.gz``
(every sample with its time and thread, the marks, the stacks: a timeline to read afterwards).

    python -m tools.device.setup_profile data=DATA.yaml [trainer=yolofeed|stock] [epochs=2] [interval=0.005]
        [top=25] out=DIR [any Ultralytics key=value, e.g. batch=128 imgsz=640 workers=16]

The sampler holds the interpreter while it reads the stacks (some tens of microseconds a sample with a few threads):
the profiled run is a little slower than a bench's. A tick waits for the GIL, so each sample counts the seconds since
the tick before: a thread's "seen" seconds in a phase come near the phase's wall. Not a timing for BENCHMARKS.md: where
the time goes.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

WAITS = {"wait", "acquire", "sleep", "get", "join", "_wait_for_tstate_lock", "select", "poll", "result"}


def _frame_key(frame) -> str:
    code = frame.f_code
    parts = Path(code.co_filename).parts
    where = "/".join(parts[-2:]) if len(parts) >= 2 else code.co_filename
    return f"{code.co_name} ({where}:{code.co_firstlineno})"


class Sampler:
    """Every other thread's stack about each ``interval`` seconds. ``samples``: (time, thread name, stack id, seconds
    since the tick before): a tick waits for the GIL, so it stands for the time since the last, not for ``interval``.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.samples: list[tuple[float, str, int, float]] = []
        self.stacks: dict[tuple[str, ...], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="setup-profile-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        own = threading.get_ident()
        names: dict[int, str] = {}
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            t = time.perf_counter()
            weight, last = t - last, t
            frames = sys._current_frames()
            if set(frames) != set(names):  # a thread came or went (an ident may be reused by a new thread)
                names = {th.ident: th.name for th in threading.enumerate()}
            for ident, frame in frames.items():
                if ident == own:
                    continue
                stack = []
                while frame is not None:
                    stack.append(_frame_key(frame))
                    frame = frame.f_back
                key = tuple(reversed(stack))
                sid = self.stacks.setdefault(key, len(self.stacks))
                self.samples.append((t, names.get(ident, str(ident)), sid, weight))


def phase_of(t: float, marks: list[tuple[float, str]]) -> str | None:
    """The phase a time falls in.

    Args:
        t: a time on ``time.perf_counter``'s clock.
        marks: (time, phase name) in time order, each phase's start.

    Returns:
        the name of the last mark at or before ``t``; None before the first.
    """
    name = None
    for at, label in marks:
        if t >= at:
            name = label
    return name


def report(sampler: Sampler, marks: list[tuple[float, str]], top: int) -> str:
    """The printout: per phase and thread, the seconds seen and the functions that took them.

    Args:
        sampler: a sampler stopped after the run.
        marks: (time, phase name) in time order (``phase_of``).
        top: the functions listed per phase and thread (on the stack; half as many at its top).
    """
    by_id = {sid: key for key, sid in sampler.stacks.items()}
    inclusive: dict[tuple[str, str], Counter] = defaultdict(Counter)
    leaf: dict[tuple[str, str], Counter] = defaultdict(Counter)
    seen: Counter = Counter()
    for t, thread, sid, weight in sampler.samples:
        phase = phase_of(t, marks)
        if phase is None:
            continue
        stack = by_id[sid]
        seen[(phase, thread)] += weight
        for frame in set(stack):
            inclusive[(phase, thread)][frame] += weight
        if stack:
            leaf[(phase, thread)][stack[-1]] += weight
    lines = ["marks (seconds from the first): " + ", ".join(f"{label} {at - marks[0][0]:.2f}" for at, label in marks)]
    for phase in dict.fromkeys(label for _, label in marks):
        threads = sorted((th for (ph, th) in seen if ph == phase), key=lambda th: -seen[(phase, th)])
        for thread in threads:
            key = (phase, thread)
            waiting = sum(w for f, w in leaf[key].items() if f.split(" ", 1)[0] in WAITS)
            lines.append(f"\n== {phase} / {thread}: {seen[key]:.2f} s seen, {waiting:.2f} s waiting at the top")
            if seen[key] < 0.05:
                continue
            lines.append("  inclusive (less the frames on every sample's stack):")
            lines += [f"    {w:7.2f} s  {f}" for f, w in inclusive[key].most_common()
                      if w < 0.98 * seen[key]][:top]
            lines.append("  at the top:")
            lines += [f"    {w:7.2f} s  {f}" for f, w in leaf[key].most_common(top // 2)]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    args = dict(a.split("=", 1) for a in argv)
    out = Path(args.pop("out", "."))
    out.mkdir(parents=True, exist_ok=True)
    project = args.pop("project", "/tmp/setup_profile_runs")  # the run's files: not in out, which comes back
    which = args.pop("trainer", "yolofeed")
    epochs = int(args.pop("epochs", 2))
    interval = float(args.pop("interval", 0.005))
    top = int(args.pop("top", 25))
    from ultralytics.models.yolo.detect import DetectionTrainer

    from yolofeed import FastDetectionTrainer
    from yolofeed.bench.whole import whole_run
    from yolofeed.ultralytics_seam import smart_value

    base = DetectionTrainer if which == "stock" else FastDetectionTrainer
    marks: list[tuple[float, str]] = []

    class Marked(base):
        def __init__(self, *a, **k):
            marks.append((time.perf_counter(), "build"))
            super().__init__(*a, **k)
            marks.append((time.perf_counter(), "setup_train"))
            self.add_callback("on_train_epoch_start",
                              lambda t: marks.append((time.perf_counter(), f"epoch{t.epoch + 1}")))

        def final_eval(self, *a, **k):
            marks.append((time.perf_counter(), "end"))
            return super().final_eval(*a, **k)

    Marked.__name__ = base.__name__
    train_args = {"model": "yolo11n.yaml", "project": project, **{k: smart_value(v) for k, v in args.items()}}
    sampler = Sampler(interval)
    sampler.start()
    try:
        result = whole_run(which, Marked, train_args, epochs)
    finally:
        sampler.stop()
    marks.sort()
    text = report(sampler, marks, top)
    head = (f"{which}: wall {result['wall_s']} s, set-up {result['setup_s']} s, end {result['final_s']} s, epochs "
            + ", ".join(f"{r.get('epoch_s', 0):.2f}" for r in result["epochs"]) + f"; parts {result['parts']}")
    (out / f"{which}_profile.txt").write_text(head + "\n" + text + "\n")
    t0 = marks[0][0]
    with gzip.open(out / f"{which}_samples.json.gz", "wt") as f:  # every sample, for a timeline read afterwards
        json.dump({"marks": [(round(at - t0, 4), label) for at, label in marks],
                   "stacks": [list(k) for k, _ in sorted(sampler.stacks.items(), key=lambda kv: kv[1])],
                   "samples": [(round(t - t0, 4), th, sid, round(w, 4)) for t, th, sid, w in sampler.samples]}, f)
    print(head)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
