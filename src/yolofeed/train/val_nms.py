"""Ultralytics' NMS for a detection validation, each image's candidates found a group of images at a time.

``non_max_suppression`` works image by image: for each, a boolean index of the anchors above the threshold, their
boxes converted, the (anchor, class) pairs above it (``torch.where``), their rows concatenated, then the class offset
and torchvision's NMS: about 15 aten ops and four host syncs an image. In a validation beside the training that host
work holds the interpreter the training thread needs to launch its steps (BENCHMARKS.md, "The whole run": two-thirds
of the validation thread's interpreter time was there).

Here a group of images' candidates come from one ``nonzero`` of the anchors kept (Ultralytics' own mask), one box
conversion, one ``torch.where`` over their scores and one concatenation: the same rows, element for element (the
same operations on the same values), in the same order (image, then anchor, then class, as each image's loop makes
them), and each image's count of them from one ``bincount``. Each image then takes its rows through Ultralytics' own
steps: the ``max_nms`` cut, the class offset, the same NMS call, the ``max_det`` cut, the time limit. The output is
Ultralytics' bit for bit (tested against it), but where the time limit is reached: a group's rows are made before its
first image's NMS, so the image the limit falls at may differ with the clock, as Ultralytics' own does from run to
run. A group holds images whose kept anchors times the classes come to at
most ``ROWS`` (an untrained model's scores pass 0.001 nearly everywhere: 0.67 M pairs an image of 8,400 anchors and 80
classes), so its memory is bounded as an image's is in Ultralytics' loop; a trained model's batch is one or two
groups: a few host syncs, where Ultralytics makes about four an image.

It serves the validator's call only (``multi_label``, boxes, no ``classes`` filter, no indices asked, not end-to-end,
a release from ``seam.NMS_SINCE``); any other goes to Ultralytics' function.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from yolofeed.ultralytics_seam import LOGGER, NMS_SINCE, TorchNMS, non_max_suppression, since, xywh2xyxy

# (anchor, class) pairs a group of images may hold at most: their rows are 48 MB of float32 (6 values a row, more with
# extra channels), about twice that at the group's peak (the indices, the boxes)
ROWS = 1 << 21


def serves(conf_thres: float, iou_thres: float, classes: Any = None, multi_label: bool = False,
           rotated: bool = False, end2end: bool = False, return_idxs: bool = False) -> bool:
    """Whether ``batched_nms`` takes a call with these arguments (the rest go to Ultralytics' function)."""
    return (multi_label and classes is None and not rotated and not end2end and not return_idxs
            and 0 <= conf_thres <= 1 and 0 <= iou_thres <= 1 and since(NMS_SINCE))


def batched_nms(prediction: Any, conf_thres: float = 0.25, iou_thres: float = 0.45, classes: Any = None,
                agnostic: bool = False, multi_label: bool = False, max_det: int = 300, nc: int = 0,
                max_time_img: float = 0.05, max_nms: int = 30000, max_wh: int = 7680, rotated: bool = False,
                end2end: bool = False, return_idxs: bool = False) -> list[torch.Tensor]:
    """Ultralytics' ``non_max_suppression`` (COPIED), with its arguments and results; see the module's doc."""
    args = (prediction, conf_thres, iou_thres)
    kwargs = {"classes": classes, "agnostic": agnostic, "multi_label": multi_label, "max_det": max_det, "nc": nc,
              "max_time_img": max_time_img, "max_nms": max_nms, "max_wh": max_wh, "rotated": rotated,
              "end2end": end2end, "return_idxs": return_idxs}  # by name: older releases take labels= among them
    if not serves(conf_thres, iou_thres, classes, multi_label, rotated, end2end, return_idxs):
        return non_max_suppression(*args, **kwargs)
    if isinstance(prediction, (list, tuple)):  # model in validation mode, output = (inference_out, loss_out)
        prediction = prediction[0]
    if prediction.shape[-1] == 6:  # end-to-end model (BNC)
        return non_max_suppression(*args, **kwargs)
    bs = prediction.shape[0]  # batch size (BCN, i.e. 1,84,6300)
    nc = nc or (prediction.shape[1] - 4)  # number of classes
    extra = prediction.shape[1] - nc - 4  # number of extra info
    mi = 4 + nc  # mask start index
    if nc <= 1:  # multi_label &= nc > 1: the best-class branch
        return non_max_suppression(*args, **kwargs)
    xc = prediction[:, 4:mi].amax(1) > conf_thres  # candidates
    time_limit = 2.0 + max_time_img * bs  # seconds to quit after
    prediction = prediction.transpose(-1, -2)  # shape(1,84,6300) to shape(1,6300,84)
    t = time.time()
    output = [torch.zeros((0, 6 + extra), device=prediction.device)] * bs
    use_torchvision = prediction.device.type != "xpu" and "torchvision" in sys.modules
    first = 0
    for group in _groups(xc.sum(1).tolist(), max(1, ROWS // nc)):  # one host sync for the batch
        last = first + len(group)
        if not sum(group):  # no anchor kept in these images: Ultralytics' loop skips each
            first = last
            continue
        rows, counts = _rows(prediction[first:last], xc[first:last], conf_thres, nc, extra)
        for xi, x in zip(range(first, last), rows.split(counts)):
            n = x.shape[0]  # number of boxes
            if not n:  # no boxes
                continue
            if n > max_nms:  # excess boxes
                x = x[x[:, 4].argsort(descending=True)[:max_nms]]  # sort by confidence and remove excess boxes
            c = x[:, 5:6] * (0 if agnostic else max_wh)  # classes
            scores = x[:, 4]  # scores
            boxes = x[:, :4] + c  # boxes (offset by class)
            if use_torchvision:
                import torchvision  # scope as slow import

                i = torchvision.ops.nms(boxes, scores, iou_thres)
            else:
                i = TorchNMS.nms(boxes, scores, iou_thres)
            output[xi] = x[i[:max_det]]  # limit detections
            if (time.time() - t) > time_limit:
                LOGGER.warning(f"NMS time limit {time_limit:.3f}s exceeded")
                return output  # time limit exceeded
        first = last
    return output


def _groups(counts: list[int], most: int) -> list[list[int]]:
    """Consecutive images, their counts grouped so that each group's add up to at most ``most`` (one image at
    least)."""
    groups: list[list[int]] = []
    total = most + 1
    for n in counts:
        if total + n > most:
            groups.append([])
            total = 0
        groups[-1].append(n)
        total += n
    return groups


def _rows(pred: torch.Tensor, xc: torch.Tensor, conf_thres: float, nc: int, extra: int
          ) -> tuple[torch.Tensor, list[int]]:
    """The candidate rows of a group of images (``pred``: images, anchors, channels; ``xc``: the anchors kept), image
    after image, each made as Ultralytics' loop makes an image's: the anchors kept, their boxes in xyxy, then each
    (anchor, class) above the threshold as a row of the box, the score, the class index as float and the extra
    channels; and each image's count of rows."""
    image, anchor = xc.nonzero(as_tuple=True)
    x = pred[image, anchor]
    x[:, :4] = xywh2xyxy(x[:, :4])
    box, cls, mask = x.split((4, nc, extra), 1)
    i, j = torch.where(cls > conf_thres)
    x = torch.cat((box[i], x[i, 4 + j, None], j[:, None].float(), mask[i]), 1)
    return x, torch.bincount(image[i], minlength=len(pred)).tolist()
