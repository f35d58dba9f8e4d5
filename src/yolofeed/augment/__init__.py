"""Stage 3: a GPU batch -> Ultralytics' augmented training batch (``v8_transforms``), batched.

``hyp`` reads Ultralytics' settings; ``geometry`` samples mosaic/perspective/flip parameters and moves
boxes; ``warp`` samples pixels through them in one pass; ``mix`` and ``color`` draw MixUp, CutMix and
HSV; ``pipeline`` puts them in Ultralytics' order; ``pool`` keeps the images partners are drawn from
(Ultralytics' buffer); ``graphs`` replays the whole pipeline as a CUDA graph; ``letterbox`` prepares
validation batches. The two pixel passes (warp, compose) are in ``yolofeed.kernels``.
"""

from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.pipeline import AugmentParams, GpuAugment
from yolofeed.schema import AugmentedBatch, SourceBatch  # what augment takes and gives

__all__ = ["AugmentHyp", "AugmentParams", "AugmentedBatch", "GpuAugment", "SourceBatch"]
