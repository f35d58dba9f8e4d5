"""The mixing ops, one per file: each blends one more augmented row into each sample, a term of the compose pass.

``mixup`` blends the whole image, ``cutmix`` pastes a rectangle; both take the partner's boxes (and keypoints, OBB
segments or segmentation polygons) they show. The partner is a fresh mosaic + perspective of one more image, as in
Ultralytics: the pipeline augments one extra row per sample for each mixing op that is on
(``Partners.mix_partner``), and ``partner`` names that row.
"""

from yolofeed.augment.mix.cutmix import (
    CutMix,
    CutMixParams,
    CutMixPlan,
    cutmix_areas,
    cutmix_keypoints,
    cutmix_polygons,
    cutmix_segments,
    ioa,
    plan_cutmix,
    sample_cutmix,
)
from yolofeed.augment.mix.mixup import MixUp, MixUpParams, sample_mixup

__all__ = ["CutMix", "CutMixParams", "CutMixPlan", "MixUp", "MixUpParams", "cutmix_areas", "cutmix_keypoints",
           "cutmix_polygons", "cutmix_segments", "ioa", "plan_cutmix", "sample_cutmix", "sample_mixup"]
