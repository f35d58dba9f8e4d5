"""Issue 5: the accounting's cost. yolofeed training rate with and without phase marks + sampler, alternating.

Usage: python3 scripts/device/monitor_overhead.py DATA_YAML [MODEL] [BATCH]
"""

import json
import os
import statistics
import sys
import tempfile

from yolofeed.doctor.profile import profile

data, model = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "yolo11n.yaml"
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 128
rates = {True: [], False: []}
with tempfile.TemporaryDirectory() as tmp:
    for rep in range(3):  # alternate, so drift (clocks, page cache) hits both alike
        for acc in (False, True):
            p = profile("yolofeed", {"model": model, "data": data, "imgsz": 640, "batch": batch, "project": tmp},
                        steps=50, warmup=15, accounting=acc)
            rates[acc].append(p.images_per_s)
res = {"without": rates[False], "with": rates[True],
       "overhead_fraction": 1 - statistics.median(rates[True]) / statistics.median(rates[False])}
print(json.dumps(res, indent=1))
with open(os.path.join(os.environ.get("OUT", "/tmp"), "monitor_overhead.json"), "w") as f:
    json.dump(res, f, indent=1)
