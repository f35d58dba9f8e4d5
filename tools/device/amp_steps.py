"""Train a few epochs and record every optimiser step: loss, gradient norm and AMP's loss scale.

For a run that stops learning: a ``GradScaler`` scale that keeps halving means steps skipped for inf/NaN
gradients (under AMP the optimiser step is skipped and the scale halved). Ultralytics 8.4.190's
``optimizer_step``, with the norm and scale recorded: it reads them on the host, so it syncs every step (a
diagnostic, not a way to train fast).

Usage: python -m tools.device.amp_steps NAME SIDE SEED DATA_YAML OUT [key=value ...]
    SIDE: stock | yolofeed. Keys ``sync_free_loss``, ``sync_free_step``, ``augment_ahead`` and ``partner_pool`` go
    to yolofeed's trainer, ``stop_after`` (epochs, default 5) here, the rest to Ultralytics (defaults: yolo26n.yaml,
    imgsz 320, batch 64, device 0, 3 workers, no validation). Writes OUT/NAME.json after every epoch: per epoch
    the training losses; per step [epoch, gradient norm, scale before, scale after, loss].
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TRAINER_OPTIONS = ("sync_free_loss", "sync_free_step", "augment_ahead", "partner_pool")


def instrumented(base: type, steps: list) -> type:
    """``base`` with an ``optimizer_step`` that appends [epoch, norm, scale before, scale after, loss] to ``steps``."""
    import torch

    class Instrumented(base):
        def optimizer_step(self):
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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 5 or argv[0] in ("-h", "--help") or argv[1] not in ("stock", "yolofeed") \
            or any("=" not in a for a in argv[5:]):
        raise SystemExit(__doc__)
    from ultralytics import YOLO
    from ultralytics.models.yolo.detect import DetectionTrainer

    from yolofeed.cli import smart_value

    name, side, seed, data, out = argv[0], argv[1], int(argv[2]), argv[3], Path(argv[4])
    kv = {k: smart_value(v) for k, v in (a.split("=", 1) for a in argv[5:])}
    options = {k: kv.pop(k) for k in TRAINER_OPTIONS if k in kv}
    stop = int(kv.pop("stop_after", 5))
    steps: list = []
    epochs: list = []
    base = DetectionTrainer
    if side == "yolofeed":
        from yolofeed.train.trainer import FastDetectionTrainer

        base = FastDetectionTrainer.with_options(**options)

    def epoch_end(t) -> None:
        epochs.append({k: float(v) for k, v in t.label_loss_items(t.tloss, prefix="train").items()})
        if t.epoch + 1 >= stop:
            t.stop = True
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.json").write_text(json.dumps({"name": name, "side": side, "seed": seed, "options": options,
                                                      "args": kv, "epochs": epochs, "steps": steps}))

    model = YOLO(kv.pop("model", "yolo26n.yaml"))
    model.add_callback("on_train_epoch_end", epoch_end)
    args = dict(data=data, epochs=30, imgsz=320, batch=64, seed=seed, device=0, workers=3, plots=False, val=False,
                project=str(out / "runs"), name=name, exist_ok=True, verbose=False)
    model.train(trainer=instrumented(base, steps), **(args | kv))


if __name__ == "__main__":
    main()
