"""Combine parity.json files of the same comparison (different seeds) into one verdict.

Usage: python3 scripts/device/parity_merge.py A/parity.json B/parity.json ...
The runs must share model, data, epochs, imgsz and batch (checked); the verdict is computed over all of them.
"""

import json
import sys
from pathlib import Path

from yolofeed.bench.parity import Job, summarise, table

reports = [json.loads(Path(p).read_text()) for p in sys.argv[1:]]
keys = ("model", "epochs", "imgsz", "batch")
for r in reports[1:]:
    if any(r["config"][k] != reports[0]["config"][k] for k in keys):
        raise SystemExit(f"not the same comparison: {[{k: x['config'][k] for k in keys} for x in reports]}")
jobs = []
for r in reports:
    for x in r["runs"]:
        j = Job(x["side"], x["seed"], f"{x['side']}-seed{x['seed']}", Path(x["log"]), returncode=x["returncode"],
                wall_s=x["wall_s"], curves=x["curves"])
        jobs.append(j)
seen = [(j.side, j.seed) for j in jobs]
if len(seen) != len(set(seen)):
    raise SystemExit("a (side, seed) run appears twice")
s = summarise(jobs)
print(table(jobs, s))
print(s.verdict)
print("loss bands overlap:", {k: round(v, 2) for k, v in s.overlap.items()})
