"""Combine the parity.json files of one comparison (different seeds) into one verdict.

Usage: python -m tools.parity_merge A/parity.json B/parity.json ... [--plot merged.png]

The runs must share model, epochs, imgsz and batch (checked), and no (side, seed) run may appear twice; the
verdict, the interval and the loss bands are computed over all of them, as ``yolofeed parity`` would have.
Runs on the CPU in a second.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from yolofeed.bench.parity import Job, Summary, plot, summarise, table

KEYS = ("model", "epochs", "imgsz", "batch")


def merge(paths: list[Path]) -> tuple[list[Job], Summary]:
    """Every run of ``paths`` and their joint summary; SystemExit when they are not the same comparison."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    for r in reports[1:]:
        if any(r["config"][k] != reports[0]["config"][k] for k in KEYS):
            raise SystemExit(f"not the same comparison: {[{k: x['config'][k] for k in KEYS} for x in reports]}")
    jobs = [Job(x["side"], x["seed"], f"{x['side']}-seed{x['seed']}", Path(x["log"]), returncode=x["returncode"],
                wall_s=x["wall_s"], curves=x["curves"]) for r in reports for x in r["runs"]]
    seen = [(j.side, j.seed) for j in jobs]
    if len(seen) != len(set(seen)):
        raise SystemExit("a (side, seed) run appears twice")
    return jobs, summarise(jobs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path, help="parity.json files written by yolofeed parity")
    ap.add_argument("--plot", type=Path, help="also plot every run's mAP50-95 and losses by epoch here (PNG)")
    a = ap.parse_args(argv)
    jobs, s = merge(a.reports)
    print(table(jobs, s))
    print(s.verdict)
    print("loss bands overlap:", {k: round(v, 2) for k, v in s.overlap.items()}, flush=True)
    if a.plot:
        first = json.loads(a.reports[0].read_text())
        a.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(jobs, a.plot, first.get("title", first["config"]["model"]))


if __name__ == "__main__":
    main()
