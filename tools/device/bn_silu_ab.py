"""The ceiling under two launch configurations of the fused batch norm + SiLU, in turn: A, B, A.

    python -m tools.device.bn_silu_ab tune=$OUT/bn_silu_tune/yolo11n.json a=4096:4:512/4096:4 out=$OUT/bn_ab -- \\
        model=yolo11n.yaml modes=ceiling steps=60 warmup=30 ...

``a`` is STATS/FLAT (``tools/device/bn_silu_tune.py`` says what they are); B is ``b=`` or the fastest of the tune's
report. Every bench after ``--`` runs with one of them set in each of its processes, through a ``sitecustomize``
on ``PYTHONPATH``: the library's code is the same on both sides, only the knobs differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.device.bn_silu_tune import stats_knobs

SITE = """import yolofeed.kernels.bn_silu as _op
_op._TILE, _op._WARPS, _op._GROUPS, _op._UNROLL, _op._STAGES = {stats}
_op._FLAT_TILE, _op._FLAT_WARPS = {flat}
"""


def _site(config: str, root: Path) -> Path:
    stats, flat = config.split("/")
    d = root / config.replace(":", "_").replace("/", "-")
    d.mkdir(parents=True, exist_ok=True)
    (d / "sitecustomize.py").write_text(SITE.format(stats=stats_knobs(stats),
                                                     flat=tuple(int(v) for v in flat.split(":"))))
    return d


def main(argv: list[str]) -> None:
    cut = argv.index("--")
    args = dict(a.split("=", 1) for a in argv[:cut])
    bench = argv[cut + 1:]
    out = Path(args.get("out", "/tmp/bn_ab"))
    if "b" in args:
        b = args["b"]
    else:
        from tools.device.bn_silu_tune import best

        b = "/".join(best(json.loads(Path(args["tune"]).read_text())))
    configs = {"A": args.get("a", "4096:4:512/4096:4"), "B": b}
    root = Path(tempfile.mkdtemp())
    aba({side: (c, _site(c, root)) for side, c in configs.items()}, bench, out)


# a steady bench's figures, and a whole run's (``whole_run=``: its wall, set-up, end and parts, each epoch's seconds)
RATES = ("images_per_s", "step_ms", "phases_ms", "wall_s", "setup_s", "final_s", "parts")


def aba(sides: dict[str, tuple[str, Path]], bench: list[str], out: Path, order: str = "ABA") -> None:
    """``yolofeed bench`` with ``bench``'s arguments once a letter of ``order`` (A, B, A), each side (name: (what it
    sets, a folder holding its sitecustomize.py)) first on PYTHONPATH. Prints each run's rates; writes
    ``out/ab.json``."""
    rows = []
    for i, side in enumerate(order):
        config, site = sides[side]
        env = os.environ | {"PYTHONPATH": f"{site}:{os.environ.get('PYTHONPATH', '')}"}
        dest = out / f"{i}_{side}"
        r = subprocess.run([sys.executable, "-m", "yolofeed", "bench", *bench, f"out={dest}"], env=env,
                           capture_output=True, text=True)
        rates = {}
        try:
            report = json.loads((dest / "bench.json").read_text())
            rates = {m["mode"]: {k: m[k] for k in RATES if k in m}
                     | ({"epochs_s": [e.get("epoch_s") for e in m["epochs"]]} if "epochs" in m else {})
                     for m in report["results"]}
        except (OSError, ValueError, KeyError):
            pass
        rows.append({"side": side, "config": config, "rc": r.returncode, "rates": rates,
                     "tail": r.stdout[-1500:] + r.stderr[-1500:]})
        failed = site / "failed.txt"
        if failed.exists():
            rows[-1]["rc"] = rows[-1]["rc"] or -1
            print(f"{side}: its sitecustomize failed ({failed.read_text()}): the run is not this side's", flush=True)
        print(side, config, json.dumps(rates)[:400], flush=True)
        if r.returncode:
            print(rows[-1]["tail"], flush=True)
        # after each run: a section's time limit that cuts the last one keeps the others
        out.mkdir(parents=True, exist_ok=True)
        (out / "ab.json").write_text(json.dumps({"configs": {k: v[0] for k, v in sides.items()}, "runs": rows},
                                                indent=1))

if __name__ == "__main__":
    main(sys.argv[1:])
