"""The modes ``yolofeed bench`` compares, and the trainer class each one trains with."""

from __future__ import annotations

MODES = ("stock", "yolofeed", "yolofeed_jpeg", "yolofeed_inline", "yolofeed_nopool", "yolofeed_val_inline",
         "yolofeed_val_overlap", "yolofeed_val_waited", "ceiling", "ceiling_stock")
WHOLE_RUN_ONLY = ("yolofeed_val_inline", "yolofeed_val_overlap", "yolofeed_val_waited")  # they differ in validation
# SyncFreeStep's (train/step.py)
STEP_SWITCHES = ("sync_free_step", "sync_free_loss", "fast_musgd", "graphed_step", "half_input")


def trainer_class(mode: str, step: dict[str, bool] | None = None, task: str = "detect") -> type:
    """The trainer of a mode for the model's ``task`` (detect, segment, pose, obb): stock Ultralytics, yolofeed (raw or
    jpeg pack, inline augmentation, no partner pool, validations in the training thread or beside the next epoch),
    or the ceiling; ``step``
    sets the step's switches (``STEP_SWITCHES``) of the yolofeed modes and the ceiling (``ceiling_stock`` turns the
    first three off whatever it says; stock has none).

    Raises:
        ValueError: not one of ``MODES``.
    """
    if mode == "stock":
        from yolofeed.ultralytics_seam import DetectionTrainer, OBBTrainer, PoseTrainer, SegmentationTrainer

        return {"detect": DetectionTrainer, "pose": PoseTrainer, "obb": OBBTrainer,
                "segment": SegmentationTrainer}[task]
    step = dict(step or {})
    if set(step) - set(STEP_SWITCHES):
        raise ValueError(f"unknown step switches {sorted(set(step) - set(STEP_SWITCHES))}; expected "
                         f"{', '.join(STEP_SWITCHES)}")
    if mode.startswith("yolofeed") and mode in MODES:
        from yolofeed.pack import codecs
        from yolofeed.train.tasks import TRAINERS

        if mode == "yolofeed_jpeg":  # the same trainer on a jpeg pack, decoded on the GPU
            return TRAINERS[task].with_options(pack_format="jpeg", **step)
        # the raw pack, whatever pack_format=auto would pick for the data here: the modes name their format
        raw = TRAINERS[task].with_options(pack_format=codecs.DEFAULT, **step)
        if mode == "yolofeed_inline":  # augmented in preprocess_batch, not one batch ahead: the sync it saves
            return raw.with_options(augment_ahead=False)
        if mode == "yolofeed_nopool":  # partners from the batch itself: what the partner pool costs or saves
            return raw.with_options(partner_pool=0)
        if mode == "yolofeed_val_inline":  # validations in the training thread: what a whole run saves beside it
            return raw.with_options(validate_beside=False)
        if mode == "yolofeed_val_overlap":  # each epoch's validation beside the next epoch's training
            return raw.with_options(val_overlap=True)
        if mode == "yolofeed_val_waited":  # each waited for, in the validation thread: what the overlap saves
            return raw.with_options(val_overlap=False)
        return raw
    if mode in ("ceiling", "ceiling_stock"):  # ceiling_stock: Ultralytics' own step and loss, not the sync-free ones
        from yolofeed.bench.ceiling import CEILINGS

        if mode == "ceiling_stock":
            step.update(sync_free_step=False, sync_free_loss=False, fast_musgd=False, graphed_step=False,
                        half_input=False)
        ceiling = CEILINGS[task]
        return type(ceiling.__name__, (ceiling,), step) if step else ceiling
    raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
