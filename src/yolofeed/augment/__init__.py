"""Stage 3: a GPU batch -> Ultralytics' augmented training batch (``v8_transforms``), batched.

Each augmentation is an op, one file in the folder of its kind (``geometry/``: mosaic, perspective, flips;
``mix/``: MixUp, CutMix; ``color/``: HSV, the BGR swap), holding its params, its draws and its hooks (``op.py``
says what an op is). ``pipeline`` lists the ops in Ultralytics' order and fuses them into two pixel passes, the
warp (``warp``) and compose (in ``yolofeed.kernels``). ``hyp`` reads Ultralytics' settings; ``partners`` and
``pool`` say which images partners are drawn from (Ultralytics' buffer); ``graphs`` replays the whole pipeline as
a CUDA graph; ``letterbox`` prepares validation batches.
"""

from yolofeed.augment.hyp import AugmentHyp
from yolofeed.augment.pipeline import AugmentParams, GpuAugment
from yolofeed.schema import AugmentedBatch, SourceBatch  # what augment takes and gives

__all__ = ["AugmentHyp", "AugmentParams", "AugmentedBatch", "GpuAugment", "SourceBatch"]
