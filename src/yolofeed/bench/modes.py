"""The modes ``yolofeed bench`` compares, and the trainer class each one trains with."""

from __future__ import annotations

MODES = ("stock", "yolofeed", "yolofeed_jpeg", "yolofeed_inline", "yolofeed_nopool", "ceiling", "ceiling_stock")


def trainer_class(mode: str) -> type:
    """The trainer of a mode: stock Ultralytics, yolofeed (raw or jpeg pack, inline augmentation, no partner pool),
    or the ceiling.

    Raises:
        ValueError: not one of ``MODES``.
    """
    if mode == "stock":
        from yolofeed.ultralytics_seam import DetectionTrainer

        return DetectionTrainer
    if mode.startswith("yolofeed") and mode in MODES:
        from yolofeed.pack import codecs
        from yolofeed.train import FastDetectionTrainer

        if mode == "yolofeed_jpeg":  # the same trainer on a jpeg pack, decoded on the GPU
            return FastDetectionTrainer.with_options(pack_format="jpeg")
        # the raw pack, whatever pack_format=auto would pick for the data here: the modes name their format
        raw = FastDetectionTrainer.with_options(pack_format=codecs.DEFAULT)
        if mode == "yolofeed_inline":  # augmented in preprocess_batch, not one batch ahead: the sync it saves
            return raw.with_options(augment_ahead=False)
        if mode == "yolofeed_nopool":  # partners from the batch itself: what the partner pool costs or saves
            return raw.with_options(partner_pool=0)
        return raw
    if mode in ("ceiling", "ceiling_stock"):  # ceiling_stock: Ultralytics' own step and loss, not the sync-free ones
        from yolofeed.bench.ceiling import CeilingTrainer

        return CeilingTrainer if mode == "ceiling" else type("CeilingTrainer", (CeilingTrainer,),
                                                             {"sync_free_step": False, "sync_free_loss": False,
                                                              "fast_musgd": False})
    raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
