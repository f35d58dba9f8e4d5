"""Issue 4 accuracy parity: both sides' final and best mAP50-95 and wall times, side by side.

Usage: python3 scripts/device/parity_summary.py PROJECT
"""

import csv
import json
import sys
from pathlib import Path

project = Path(sys.argv[1])
rows = {}
for side in ("stock", "yolofeed"):
    with open(project / side / "results.csv") as f:
        res = [{k.strip(): v for k, v in r.items()} for r in csv.DictReader(f)]
    maps = [float(r["metrics/mAP50-95(B)"]) for r in res]
    wall = json.loads((project / side / "wall.json").read_text())["wall_s"]
    rows[side] = {"epochs": len(res), "final_map50_95": maps[-1], "best_map50_95": max(maps),
                  "final_map50": float(res[-1]["metrics/mAP50(B)"]), "wall_s": wall}
for side, r in rows.items():
    print(f"{side:<9} epochs {r['epochs']:>3}  mAP50-95 final {100 * r['final_map50_95']:.2f}  best "
          f"{100 * r['best_map50_95']:.2f}  mAP50 {100 * r['final_map50']:.2f}  wall {r['wall_s']:.0f} s")
gap = 100 * (rows["yolofeed"]["final_map50_95"] - rows["stock"]["final_map50_95"])
print(f"yolofeed - stock: {gap:+.2f} mAP50-95 points (target: within 1)")
(project / "parity.json").write_text(json.dumps({**rows, "gap_points": gap}, indent=1))
