"""The geometric ops, one per file; they move pixels, so each is a step of the one warp pass.

``mosaic`` places tiles on a canvas, ``copy_paste`` pastes mirrored copies of the canvas's own objects onto it,
``perspective`` maps the canvas to the output by one (R, 3, 3) matrix, ``flip`` reflects the output; each moves the
boxes, keypoints and OBB segments the same way (``obb``: Ultralytics' resample and clip of oriented boxes,
``rboxes``: their minimum-area rectangles; ``polygons``: segmentation polygons resampled as Ultralytics resamples
them). The pass itself is ``augment.warp``.
"""

from yolofeed.augment.geometry.flip import (
    FlipParams,
    RandomFlip,
    flip_axis,
    flip_boxes,
    flip_keypoints,
    flip_segments,
)
from yolofeed.augment.geometry.mosaic import (
    Layout,
    Mosaic,
    MosaicParams,
    mosaic_boxes,
    mosaic_keypoints,
    mosaic_layout,
    mosaic_segments,
    sample_mosaic,
    tile_boxes,
    xywhn_to_xyxy,
)
from yolofeed.augment.geometry.obb import clip_obb, obb_rboxes, resample_corners
from yolofeed.augment.geometry.perspective import (
    PerspectiveParams,
    RandomPerspective,
    box_candidates,
    perspective_matrix,
    sample_perspective,
    transform_boxes,
    warp_boxes,
    warp_keypoints,
    warp_segments,
)
from yolofeed.augment.geometry.polygons import resample_polygons

__all__ = ["FlipParams", "Layout", "Mosaic", "MosaicParams", "PerspectiveParams", "RandomFlip", "RandomPerspective",
           "box_candidates", "clip_obb", "flip_axis", "flip_boxes", "flip_keypoints", "flip_segments", "mosaic_boxes",
           "mosaic_keypoints", "mosaic_layout", "mosaic_segments", "obb_rboxes", "perspective_matrix",
           "resample_corners", "resample_polygons", "sample_mosaic", "sample_perspective", "tile_boxes",
           "transform_boxes", "warp_boxes",
           "warp_keypoints", "warp_segments", "xywhn_to_xyxy"]
