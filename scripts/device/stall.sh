#!/usr/bin/env bash
# One yolo26n yolofeed seed never learned in parity (session p26, seed 1). Variants of that run side by side on
# nvidia-h200-x2 (5 a GPU, 3 cores each), 5 epochs each, every optimiser step recorded (scripts/device/stall.py).
source scripts/device/setup.sh
set +e
D=/tmp/parity
python3 -m yolofeed synth out=$D n_train=2000 n_val=200 imgsz=320 classes=8 boxes=20 min_box=8 seed=0 2>&1 | tail -1
python3 -m yolofeed pack data=$D/data.yaml imgsz=320 2>&1 | grep -v "img/s\]" | tail -2
python3 -c "from ultralytics.data.dataset import YOLODataset; from ultralytics.data.utils import check_det_dataset
from ultralytics.cfg import get_cfg; d = check_det_dataset('$D/data.yaml')
[YOLODataset(img_path=d[s], imgsz=320, augment=False, data=d, hyp=get_cfg()) for s in ('train', 'val')]" > /dev/null 2>&1
k=0
run() {  # NAME SIDE SEED [key=value ...]
  g=$((k % 2)); c=$((k * 3)); k=$((k + 1))
  CUDA_VISIBLE_DEVICES=$g taskset -c $c-$((c + 2)) timeout ${LIMIT:-300} python3 scripts/device/stall.py "$1" "$2" "$3" \
    $D/data.yaml $OUT "${@:4}" > $OUT/log_$1.txt 2>&1 &
}
run yf1 yolofeed 1
run yf1_again yolofeed 1
run yf1_stockloss yolofeed 1 sync_free_loss=False
run yf1_stockstep yolofeed 1 sync_free_loss=False sync_free_step=False
run yf1_nopool yolofeed 1 partner_pool=0
run yf1_fp32 yolofeed 1 amp=False
run stock1 stock 1
run yf3 yolofeed 3
run yf4 yolofeed 4
run yf5 yolofeed 5
wait
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*.json")):
    r = json.load(open(f))
    s = r["steps"]
    skipped = sum(1 for x in s if x[3] < x[2])
    first = s[:3]
    print(f"{r['name']:<14} steps {len(s):>4} skipped {skipped:>3} scale_end {s[-1][3] if s else None} "
          f"norm_first {[round(x[1], 2) for x in first]} "
          + " | ".join(f"e{i} box {e.get('train/box_loss', 0):.3f} cls {e.get('train/cls_loss', 0):.3f}"
                       for i, e in enumerate(r["epochs"])))
PY
for f in $OUT/log_*.txt; do grep -l "Traceback" $f && tail -5 $f; done
tar czf $OUT/stall.tgz -C $OUT $(cd $OUT && ls *.json log_*.txt) && rm -f $OUT/*.json $OUT/log_*.txt
