"""The geometric ops, one per file; they move pixels, so each is a step of the one warp pass.

``mosaic`` places tiles on a canvas, ``perspective`` maps the canvas to the output by one (R, 3, 3) matrix,
``flip`` reflects the output; each moves the boxes and keypoints the same way. The pass itself is ``augment.warp``.
"""

from yolofeed.augment.geometry.flip import FlipParams, RandomFlip, flip_axis, flip_boxes, flip_keypoints
from yolofeed.augment.geometry.mosaic import (
    Layout,
    Mosaic,
    MosaicParams,
    mosaic_boxes,
    mosaic_keypoints,
    mosaic_layout,
    sample_mosaic,
    xywhn_to_xyxy,
)
from yolofeed.augment.geometry.perspective import (
    PerspectiveParams,
    RandomPerspective,
    box_candidates,
    perspective_matrix,
    sample_perspective,
    transform_boxes,
    warp_boxes,
    warp_keypoints,
)

__all__ = ["FlipParams", "Layout", "Mosaic", "MosaicParams", "PerspectiveParams", "RandomFlip", "RandomPerspective",
           "box_candidates", "flip_axis", "flip_boxes", "flip_keypoints", "mosaic_boxes", "mosaic_keypoints",
           "mosaic_layout", "perspective_matrix", "sample_mosaic", "sample_perspective", "transform_boxes",
           "warp_boxes", "warp_keypoints", "xywhn_to_xyxy"]
