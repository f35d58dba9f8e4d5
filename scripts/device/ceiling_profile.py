"""Where the host time of a ceiling step goes (issue 4: the ceiling keeps the GPU busy only ~60 % here).

Usage: python3 scripts/device/ceiling_profile.py DATA_YAML [MODEL]   -> top functions by own time
"""

import cProfile
import io
import os
import pstats
import sys
import tempfile

from yolofeed.doctor.profile import profile

data, model = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "yolo11n.yaml"
with tempfile.TemporaryDirectory() as tmp:
    args = {"model": model, "data": data, "imgsz": 640, "batch": 128, "project": tmp}
    profile("ceiling", args, steps=10, warmup=10, window=5, accounting=False)  # warm: compile, cudnn autotune
    pr = cProfile.Profile()
    pr.enable()
    p = profile("ceiling", args, steps=30, warmup=5, window=5, accounting=False)
    pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35)
text = f"ceiling under cProfile: {p.images_per_s} img/s\n" + s.getvalue()
print(text[:9000])
with open(os.path.join(os.environ.get("OUT", "/tmp"), "ceiling_profile.txt"), "w") as f:
    f.write(text)
