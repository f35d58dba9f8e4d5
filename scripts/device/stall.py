"""Why did one yolo26n seed never learn? Train a few epochs of one variant and record every optimiser step.

Usage: python3 scripts/device/stall.py NAME SIDE SEED DATA OUT [key=value ...]
SIDE: stock | yolofeed; keys sync_free_loss=, sync_free_step=, partner_pool= go to yolofeed's trainer, the rest
to Ultralytics. Writes OUT/NAME.json: per epoch the training losses; per step the loss, the gradient norm
after unscaling and GradScaler's scale before and after (a halving = a step skipped for inf/NaN gradients).
"""

import json
import sys
from pathlib import Path

import torch
from ultralytics import YOLO
from ultralytics.models.yolo.detect import DetectionTrainer

from yolofeed.cli import smart_value

name, side, seed, data, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
kv = {k: smart_value(v) for k, v in (a.split("=", 1) for a in sys.argv[6:])}
options = {k: kv.pop(k) for k in ("sync_free_loss", "sync_free_step", "partner_pool") if k in kv}
STOP = kv.pop("stop_after", 5)
steps, epochs = [], []


def instrumented(base):
    class Instrumented(base):
        def optimizer_step(self):  # Ultralytics 8.4.190's, with the norm and the scale recorded (syncs: a diagnostic)
            self.scaler.unscale_(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=10.0)
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()
            if self.ema:
                self.ema.update(self.model)
            steps.append([self.epoch, float(norm), before, self.scaler.get_scale(), float(self.loss.detach().sum())])
    return Instrumented


base = DetectionTrainer
if side == "yolofeed":
    from yolofeed.train.trainer import FastDetectionTrainer

    base = FastDetectionTrainer.with_options(**options)
trainer = instrumented(base)


def epoch_end(t):
    epochs.append({k: float(v) for k, v in t.label_loss_items(t.tloss, prefix="train").items()})
    if t.epoch + 1 >= STOP:
        t.stop = True
    (out / f"{name}.json").write_text(json.dumps({"name": name, "side": side, "seed": seed, "options": options,
                                                  "args": kv, "epochs": epochs, "steps": steps}))


model = YOLO(kv.pop("model", "yolo26n.yaml"))
model.add_callback("on_train_epoch_end", epoch_end)
args = dict(data=data, epochs=30, imgsz=320, batch=64, seed=seed, device=0, workers=3, plots=False, val=False,
            project="/tmp/stall", name=name, exist_ok=True, verbose=False)
model.train(trainer=trainer, **(args | kv))
