"""The sync-free detection loss (train/loss/): Ultralytics' loss and gradients, given counts known ahead."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import DetectionModel, SegmentationModel
from ultralytics.utils.tal import TaskAlignedAssigner

from helpers import no_host_sync
from yolofeed import ultralytics_seam as seam
from yolofeed.schema import AugmentedBatch
from yolofeed.train import loss as sfl
from yolofeed.train.loss import segment as segment_loss

COUNTS = [3, 0, 5, 1, 0, 2]  # boxes per image: two empty images, the largest not first


def _model(yaml: str, cls=DetectionModel) -> torch.nn.Module:
    m = cls(yaml, nc=4, verbose=False)
    m.args = get_cfg()  # the hyperparameters Ultralytics' loss reads (box, cls, dfl, epochs)
    return m


def _augmented(counts: list[int], size: int = 64, seed: int = 0, holes: bool = True) -> AugmentedBatch:
    """Padded boxes as the GPU augmentation leaves them: (B, K, 4) xyxy pixels, valid rows not packed first."""
    g = torch.Generator().manual_seed(seed)
    k = max(counts) + (2 if holes else 0)
    valid = torch.zeros(len(counts), k, dtype=torch.bool)
    for i, c in enumerate(counts):
        rows = torch.randperm(k, generator=g)[:c] if holes else torch.arange(c)
        valid[i, rows] = True
    xy = size * (0.1 + 0.6 * torch.rand(len(counts), k, 2, generator=g))
    wh = size * (0.02 + 0.3 * torch.rand(len(counts), k, 2, generator=g))  # some under a stride: enlarged
    boxes = torch.cat([xy, (xy + wh).clamp(max=size)], -1)
    return AugmentedBatch(img=torch.randint(0, 255, (len(counts), 3, size, size), dtype=torch.uint8, generator=g),
                          cls=torch.randint(0, 4, (len(counts), k), generator=g).float(), boxes=boxes, valid=valid)


def _ultralytics(aug: AugmentedBatch) -> dict:
    d = aug.to_ultralytics()
    d["img"] = d["img"].float() / 255
    return d


def _stock_candidates(model, batch, preds) -> list[int]:
    """The counts Ultralytics' own assigner gathers (one per detection loss), by spying on it."""
    seen = []
    own = TaskAlignedAssigner.get_box_metrics

    def spy(self, pd_scores, pd_bboxes, gt_labels, gt_bboxes, mask_gt, **extra):
        seen.append(int(mask_gt.bool().sum()))
        return own(self, pd_scores, pd_bboxes, gt_labels, gt_bboxes, mask_gt, **extra)

    TaskAlignedAssigner.get_box_metrics = spy
    try:
        copy.deepcopy(model).loss(batch, preds)
    finally:
        TaskAlignedAssigner.get_box_metrics = own
    return seen


@pytest.mark.parametrize("yaml", ["yolo11n.yaml", "yolo26n.yaml"])
def test_the_loss_and_its_gradients_equal_ultralytics(yaml):
    """Whole criterion, both families (YOLO26's E2E loss holds two detection losses): with the counts, the same
    loss (to the last bits of a longer sum) and the same gradients; without them, Ultralytics' path exactly."""
    torch.manual_seed(0)
    model = _model(yaml).train()
    aug = _augmented(COUNTS, seed=1)
    b = _ultralytics(aug)
    preds = model(b["img"])

    def run(batch):
        model.zero_grad()
        loss, items = model.loss(batch, preds)
        loss.sum().backward(retain_graph=True)
        return loss.detach().clone(), [p.grad.clone() for p in model.parameters() if p.grad is not None], items

    want = run(b)  # the criterion Ultralytics made, untouched
    stock = model.criterion
    swapped = sfl.install(model)
    assert model.criterion is stock and len(swapped) == (1 if yaml.startswith("yolo11") else 2)
    assert sfl.install(model) == swapped  # idempotent
    got = run(b)  # no counts in the batch: Ultralytics' own path, bit for bit
    assert torch.equal(got[0], want[0]) and all(torch.equal(x, y) for x, y in zip(got[1], want[1]))

    run({**b, sfl.MAX_BOXES: max(COUNTS)})  # the first call with counts caches the anchors
    candidates = sfl.early_candidates_for(swapped[0], aug)
    assert [candidates] * len(swapped) == _stock_candidates(model, b, preds)
    got = run({**b, sfl.MAX_BOXES: max(COUNTS), sfl.CANDIDATES: candidates})
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    assert len(got[1]) == len(want[1])
    for x, y in zip(got[1], want[1]):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-9)
    assert all(x.assigner.candidates is None and x.bbox_loss.bound is None for x in swapped)  # nothing left over
    assert sfl.check_counts(model)
    run({**b, sfl.MAX_BOXES: max(COUNTS), sfl.CANDIDATES: candidates - 1})  # a wrong count: caught at the check
    assert not sfl.check_counts(model)
    got = run({**b, sfl.MAX_BOXES: max(COUNTS), sfl.CANDIDATES: candidates - 1})  # then ignored
    assert torch.equal(got[0], want[0])


def test_candidates_need_the_anchors_and_count_padding_and_holes_alike():
    model = _model("yolo11n.yaml").train()
    (loss,) = sfl.install(model) or [None]
    aug = _augmented(COUNTS, seed=2)
    assert sfl.early_candidates_for(loss, aug) is None  # no loss call yet: no anchors, no count
    b = _ultralytics(aug)
    model.loss({**b, sfl.MAX_BOXES: max(COUNTS)}, model(b["img"]))
    packed = _augmented(COUNTS, seed=2, holes=False)
    assert sfl.early_candidates_for(loss, aug) > 0
    n = max(COUNTS)
    gt = sfl.padded_gt_from_ultralytics(b, n, loss)  # the ceiling's route, from Ultralytics' batch
    assert int(loss.early_candidates(gt)) == int(sfl.early_candidates_for(loss, aug))
    assert packed.valid.sum() == aug.valid.sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # float16: the anchors under AMP
def test_counted_candidates_equal_the_assigners_mask_on_edges_and_tiny_boxes(dtype):
    """The grid count (searchsorted per level) equals the assigner's (box, anchor) mask summed, for boxes whose
    edges sit exactly on anchor centres or a hair off, boxes under stride_val (enlarged), boxes off the image."""
    model = _model("yolo11n.yaml")
    (loss,) = sfl.install(model)
    size = 128
    feats = [torch.empty(1, 1, size // s, size // s, dtype=dtype) for s in (8, 16, 32)]
    c = loss._constants(feats, dtype)
    centers = c.anchor_points * c.stride_tensor
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        b, k = 4, 9
        edges = 4.0 + 8.0 * torch.randint(0, 16, (b, k, 4), generator=g).float()  # on stride-8 centres
        jitter = torch.randint(-1, 2, (b, k, 4), generator=g).float() * torch.tensor(1e-3)
        noise = size * torch.rand(b, k, 4, generator=g) * 1.2 - 0.1 * size  # anywhere, off the image too
        pick = torch.rand(b, k, 1, generator=g)
        raw = torch.where(pick < 0.4, edges + jitter, torch.where(pick < 0.7, edges, noise))
        gt = torch.cat([torch.minimum(raw[..., :2], raw[..., 2:]), torch.maximum(raw[..., :2], raw[..., 2:])], -1)
        tiny = torch.rand(b, k, 1, generator=g) < 0.2
        gt = torch.where(tiny, torch.cat([gt[..., :2], gt[..., :2] + 3.0], -1), gt)  # sides under stride_val
        gt[torch.rand(b, k, generator=g) < 0.25] = 0.0  # padding rows
        mask_gt = gt.sum(2, keepdim=True).gt_(0.0)
        want = int((loss.assigner.select_candidates_in_gts(centers, gt.clone(), mask_gt) * mask_gt).bool().sum())
        assert int(loss.early_candidates(gt)) == want, trial


def _edge_boxes(g: torch.Generator, b: int, k: int, size: tuple[int, int]) -> torch.Tensor:
    """(b, k, 4) xyxy boxes whose edges sit on stride-8 anchor centres or a hair off, anywhere (off the image too),
    some with sides under stride_val, a quarter padding rows."""
    h, w = size
    edges = 4.0 + 8.0 * torch.randint(0, max(h, w) // 8, (b, k, 4), generator=g).float()
    jitter = torch.randint(-1, 2, (b, k, 4), generator=g).float() * torch.tensor(1e-3)
    noise = torch.rand(b, k, 4, generator=g) * torch.tensor([w, h, w, h]) * 1.2 - 0.1 * max(h, w)
    pick = torch.rand(b, k, 1, generator=g)
    raw = torch.where(pick < 0.4, edges + jitter, torch.where(pick < 0.7, edges, noise))
    gt = torch.cat([torch.minimum(raw[..., :2], raw[..., 2:]), torch.maximum(raw[..., :2], raw[..., 2:])], -1)
    tiny = torch.rand(b, k, 1, generator=g) < 0.2
    gt = torch.where(tiny, torch.cat([gt[..., :2], gt[..., :2] + 3.0], -1), gt)  # sides under stride_val
    gt[torch.rand(b, k, generator=g) < 0.25] = 0.0
    return gt


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # float16: the anchors under AMP
@pytest.mark.parametrize("hw", [(128, 128), (96, 160), (40, 72)])  # square, a rect batch's, a level of 2 x 3 at 32
def test_the_candidate_mask_made_level_by_level_is_ultralytics_bit_for_bit(dtype, hw):
    """With the levels given, the assigner's (box, anchor) candidate mask is made along each level's x and y; it
    equals Ultralytics' dense mask, element for element, on edges on anchor centres and a hair off, tiny boxes,
    boxes off the image and padding; levels that do not sum to the anchors leave Ultralytics' computation."""
    model = _model("yolo11n.yaml")
    (loss,) = sfl.install(model)
    feats = [torch.empty(1, 1, hw[0] // s, hw[1] // s, dtype=dtype) for s in (8, 16, 32)]
    c = loss._constants(feats, dtype)
    centers = c.anchor_points * c.stride_tensor
    assert c.levels == tuple((hw[0] // s, hw[1] // s) for s in (8, 16, 32))
    assigner = loss.assigner
    g = torch.Generator().manual_seed(0)
    for trial in range(30):
        gt = _edge_boxes(g, 3, 11, hw)
        mask_gt = gt.sum(2, keepdim=True).gt_(0.0)
        want = TaskAlignedAssigner.select_candidates_in_gts(assigner, centers, gt.clone(), mask_gt)
        assigner.levels = c.levels
        try:
            got = assigner.select_candidates_in_gts(centers, gt.clone(), mask_gt > 0)
            assert got.dtype == torch.bool and torch.equal(got, want), trial
            assigner.levels = ((1, 1),)  # not these anchors: Ultralytics' own comparisons
            assert torch.equal(assigner.select_candidates_in_gts(centers, gt.clone(), mask_gt), want), trial
        finally:
            assigner.levels = None


@pytest.mark.parametrize("topk, topk2", [(10, None), (7, 1)])  # YOLO26's one-to-many and one-to-one assigners
@pytest.mark.parametrize("oom", [False, True])
def test_the_assignment_with_the_grid_mask_and_the_foreground_norm_is_ultralytics(oom, topk, topk2, monkeypatch):
    """The whole assignment (labels, boxes, scores, foreground, box indices) with the level-by-level candidate mask, a
    bool ``mask_gt`` and the normalisation made on each anchor's own box equals Ultralytics' bit for bit: boxes that
    overlap (anchors claimed by several, resolved by the highest overlap), scores in float16 as under AMP; also in the
    OOM fallback, one image at a time."""
    model = _model("yolo11n.yaml")
    (loss,) = sfl.install(model)
    hw = (96, 128)
    feats = [torch.empty(1, 1, hw[0] // s, hw[1] // s) for s in (8, 16, 32)]
    c = loss._constants(feats, torch.float32)
    centers = c.anchor_points * c.stride_tensor
    b, k, a = 4, 12, centers.shape[0]
    stock = TaskAlignedAssigner(topk=topk, num_classes=4, alpha=0.5, beta=6.0, stride=[8, 16, 32], topk2=topk2)
    assigner = copy.deepcopy(stock)
    assigner.__class__ = sfl.SyncFreeAssigner
    if oom:  # the first, whole-batch attempt runs out of memory: the fallback assigns image by image
        own, calls = sfl.SyncFreeAssigner._forward, []

        def once(self, *args, **kwargs):
            calls.append(self.bs)
            if len(calls) == 1:
                raise RuntimeError("CUDA out of memory (a test)")
            return own(self, *args, **kwargs)

        monkeypatch.setattr(sfl.SyncFreeAssigner, "_forward", once)
    g = torch.Generator().manual_seed(3)
    contested = 0
    for trial in range(6):
        gt = _edge_boxes(g, b, k, hw)
        gt[:, :4] = gt[:, :1] + torch.rand(b, 4, 4, generator=g) * 6  # four boxes over one another in every image
        labels = torch.randint(0, 4, (b, k, 1), generator=g).float()
        scores = torch.rand(b, a, 4, generator=g).half()
        xy = centers.expand(b, a, 2)
        boxes = torch.cat([xy - 24 * torch.rand(b, a, 2, generator=g), xy + 24 * torch.rand(b, a, 2, generator=g)], -1)
        mask_gt = gt.sum(2, keepdim=True).gt_(0.0)
        want = stock(scores, boxes, centers, labels, gt, mask_gt)
        assigner.levels = c.levels
        got = assigner(scores, boxes, centers, labels, gt, mask_gt > 0)
        assert all(torch.equal(x, y) for x, y in zip(got, want)), trial
        assert want[3].any() and want[2].dtype == torch.float32, trial
        in_two = TaskAlignedAssigner.select_candidates_in_gts(stock, centers, gt.clone(), mask_gt).sum(1) > 1
        contested += int((in_two & want[3]).sum())
    assert contested > 0  # anchors inside several boxes were resolved and normalised
    assert not oom or calls[:1 + b] == [b] + [1] * b


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.3, 1.0])
def test_foreground_rows_are_nonzeros_then_padding_that_never_piles_on_one_anchor(fraction):
    """The real rows are ``nonzero``'s, in its order; the padding reads each anchor at most once more (repeated
    indices make the gathers' backward slow on CUDA), and a bound as large as the mask is allowed."""
    g = torch.Generator().manual_seed(1)
    fg_mask = torch.rand(6, 50, generator=g) < fraction
    real_n = int(fg_mask.sum())
    for bound in sorted({max(real_n, 1), min(real_n + 7, 300), 300}):  # the loss bounds it by B x anchors
        (img, anchor), real = sfl.foreground_rows(fg_mask, bound)
        assert img.shape == anchor.shape == (bound,) and real.shape == (bound, 1)
        assert int(real.sum()) == real_n and bool(real[:real_n].all())
        want = fg_mask.nonzero()
        assert torch.equal(torch.stack([img[:real_n], anchor[:real_n]], 1), want)
        flat = img * 50 + anchor
        assert int(flat.min()) >= 0 and int(flat.max()) < fg_mask.numel()
        assert int(torch.bincount(flat[real_n:], minlength=300).max()) <= 1


@pytest.mark.parametrize("reg_max", [16, 1])  # 16: DFL (yolo11n); 1: L1 on raw distances (YOLO26)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # float16: the loss's inputs under AMP
def test_padded_rows_never_make_a_gradient_non_finite(reg_max, dtype):
    """A background anchor's degenerate box (zero height: CIoU's aspect term overflows float16) is not Ultralytics'
    business; read by a padded row, it must not turn the gradients non-finite (weight 0 x inf = NaN), which made
    AMP skip step after step until YOLO26 stopped learning. The gradients equal Ultralytics'."""
    from ultralytics.utils.loss import BboxLoss

    from yolofeed.train.loss import SyncFreeBboxLoss

    g = torch.Generator().manual_seed(0)
    b, a = 2, 50
    boxes = torch.rand(b, a, 4, generator=g) * 5
    boxes[..., 2:] += boxes[..., :2] + 1
    boxes[1, 3, 3] = boxes[1, 3, 1]  # zero height, on image 1, which has no foreground
    width = 4 * reg_max if reg_max > 1 else 4
    target = torch.rand(b, a, 4, generator=g) * 5
    target[..., 2:] += target[..., :2] + 1
    scores = torch.rand(b, a, 8, generator=g)
    fg = torch.zeros(b, a, dtype=torch.bool)
    fg[0, :7] = True
    rest = (torch.rand(a, 2, generator=g) * 10, target, scores, scores[fg].sum(), fg, torch.tensor([320.0, 320.0]),
            torch.full((a, 1), 8.0))
    dist0 = torch.randn(b, a, width, generator=g)
    grads = []
    for loss in (BboxLoss(reg_max), BboxLoss(reg_max)):
        if not grads:
            loss.__class__, loss.bound = SyncFreeBboxLoss, b * a  # every anchor a row: padded rows on image 1
        pred, dist = boxes.to(dtype).requires_grad_(True), dist0.to(dtype).requires_grad_(True)
        iou, dfl = loss(dist, pred, *rest)
        (iou + dfl).backward()
        grads.append((pred.grad, dist.grad, iou.detach(), dfl.detach()))
    ours, theirs = grads
    assert all(x.isfinite().all() for x in ours[:2])
    for x, y in zip(ours, theirs):
        torch.testing.assert_close(x.float(), y.float(), rtol=1e-3, atol=1e-6)


def _pose_batch(counts: list[int], k: int, seed: int) -> dict:
    """An Ultralytics pose batch: boxes as ``_augmented``'s, each with ``k`` keypoints inside it (some unlabelled)."""
    g = torch.Generator().manual_seed(seed)
    b = _ultralytics(_augmented(counts, seed=seed))
    xywh = b["bboxes"]
    xy = xywh[:, None, :2] + (torch.rand(len(xywh), k, 2, generator=g) - 0.5) * xywh[:, None, 2:]
    vis = torch.randint(0, 3, (len(xywh), k, 1), generator=g).float()  # 0: absent, 1 covered, 2 visible
    b["keypoints"] = torch.cat([xy * (vis > 0), vis], -1)
    return b


@pytest.mark.parametrize("counts", [COUNTS, [0, 0, 0]])
def test_the_pose_loss_and_its_gradients_equal_ultralytics(counts):
    """SyncFreePoseLoss against v8PoseLoss: the five losses and every gradient, to the last bits of longer sums; a
    batch without boxes takes Ultralytics' path (no count), one whose boxes get no anchor has keypoint losses 0."""
    from ultralytics.nn.tasks import PoseModel

    if not seam.since(seam.POSE_SINCE):
        pytest.skip(f"pose is served from Ultralytics {seam.POSE_SINCE}")
    torch.manual_seed(0)
    model = PoseModel("yolo11n-pose.yaml", nc=4, data_kpt_shape=(5, 3), verbose=False).train()
    model.args = get_cfg()
    b = _pose_batch(counts, 5, seed=2)
    preds = model(b["img"])

    def run(batch):
        model.zero_grad()
        loss, _ = model.loss(batch, preds)
        loss.sum().backward(retain_graph=True)
        return loss.detach().clone(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    want = run(b)
    swapped = sfl.install(model)
    assert [type(x) for x in swapped] == [sfl.SyncFreePoseLoss]
    got = run({**b, sfl.MAX_BOXES: max(counts)})
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-7)
    assert len(got[1]) == len(want[1])
    for x, y in zip(got[1], want[1]):  # float32 sums in another order, through the backbone: relative to each tensor,
        # with a floor of float32's rounding on losses of order 10-100
        assert (x - y).abs().max() <= 1e-5 * y.abs().max() + 1e-6, ((x - y).abs().max(), y.abs().max())


def _sem_masks(b: dict, overlap: bool) -> torch.Tensor:
    """``Format``'s ``sem_masks`` of ``_segment_batch``'s masks: each pixel's class (0 where none covers it)."""
    masks, cls, image = b["masks"].long(), b["cls"].view(-1), b["batch_idx"].long()
    n = int(image.max()) + 1 if len(image) else len(masks)
    sem = torch.zeros(n if not overlap else len(masks), *masks.shape[-2:])
    for row, i in enumerate(image.tolist()):
        inside = masks[i] == (row - int((image < i).sum()) + 1) if overlap else masks[row].bool()
        sem[i][inside] = cls[row]
    return sem


def _segment_batch(counts: list[int], overlap: bool, seed: int, size: int = 64, ratio: int = 4) -> dict:
    """An Ultralytics segment batch: ``_augmented``'s boxes, each instance's mask its box at mask resolution (with
    overlap one index mask an image, later rows painted over earlier ones; without, one 0/1 mask a row)."""
    b = _ultralytics(_augmented(counts, size=size, seed=seed))
    h = size // ratio
    xyxy = torch.cat([b["bboxes"][:, :2] - b["bboxes"][:, 2:] / 2, b["bboxes"][:, :2] + b["bboxes"][:, 2:] / 2], 1) * h
    ys, xs = torch.arange(h)[:, None] + 0.5, torch.arange(h)[None] + 0.5
    inside = ((xs >= xyxy[:, 0, None, None]) & (xs <= xyxy[:, 2, None, None]) & (ys >= xyxy[:, 1, None, None])
              & (ys <= xyxy[:, 3, None, None]))  # (N, h, h)
    if not overlap:
        b["masks"] = inside.to(torch.uint8)
        return b
    masks = torch.zeros(len(counts), h, h, dtype=torch.uint8)
    rank = torch.zeros(len(counts), dtype=torch.long)
    for row, i in enumerate(b["batch_idx"].long().tolist()):
        rank[i] += 1
        masks[i][inside[row]] = int(rank[i])
    b["masks"] = masks
    return b


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("counts, chunk", [(COUNTS, None), (COUNTS, 16 * 16 * 40), (COUNTS, 1), ([0, 0, 0], None)])
def test_the_segment_loss_and_its_gradients_equal_ultralytics(overlap, counts, chunk, monkeypatch,
                                                              yaml="yolo11n-seg.yaml"):
    """SyncFreeSegmentLoss against v8SegmentationLoss, overlap_mask on and off: the mask loss to float32's rounding
    of a sum in another order (each row's term is Ultralytics'), the detection losses to the last bits of longer sums,
    every gradient; a batch without boxes takes Ultralytics' path. The batched mask loss in one group of images, in
    groups of at most 40 padded rows, and an image a group (``chunk``: ``MASK_CHUNK`` at the 16 x 16 masks). YOLO26's
    segment loss (SegmentLoss26, its own assigner, a semantic head) is left as Ultralytics' (the batch's counts are
    ignored): ``test_yolo26_segment_loss_stays_ultralytics``."""
    if not seam.since(seam.SEGMENT_LOSS_SINCE):
        pytest.skip(f"the sync-free segment loss serves from Ultralytics {seam.SEGMENT_LOSS_SINCE}")
    if chunk is not None:
        monkeypatch.setattr(sfl, "MASK_CHUNK", chunk)
    torch.manual_seed(0)
    model = _model(yaml, SegmentationModel).train()
    model.args.overlap_mask = overlap
    aug = _augmented(counts, seed=4)
    b = _segment_batch(counts, overlap, seed=4)
    b["sem_masks"] = _sem_masks(b, overlap)
    preds = model(b["img"])

    def run(batch):
        model.zero_grad()
        loss, items = model.loss(batch, preds)
        loss.sum().backward(retain_graph=True)
        return loss.detach().clone(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    want = run(b)
    swapped = sfl.install(model)
    if yaml.startswith("yolo26"):  # SegmentLoss26 with its own assigner (and a semantic head): Ultralytics' as it is
        assert swapped == [] and torch.equal(run({**b, sfl.MAX_BOXES: max(counts)})[0], want[0])
        return
    assert [type(x) for x in swapped] == [sfl.SyncFreeSegmentLoss] and swapped[0].overlap is overlap
    assert torch.equal(run(b)[0], want[0])  # no counts: Ultralytics' path
    if max(counts):
        run({**b, sfl.MAX_BOXES: max(counts)})  # caches the anchors
        counts_in = {sfl.MAX_BOXES: max(counts), sfl.CANDIDATES: sfl.early_candidates_for(swapped[0], aug)}
    else:
        counts_in = {sfl.MAX_BOXES: 0}
    got = run({**b, **counts_in})
    assert float(want[0][1]) > 0 or not max(counts)
    torch.testing.assert_close(got[0][1], want[0][1], rtol=1e-6, atol=0)  # the mask loss
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    assert len(got[1]) == len(want[1])
    for x, y in zip(got[1], want[1]):
        assert (x - y).abs().max() <= 1e-5 * y.abs().max() + 1e-6, ((x - y).abs().max(), y.abs().max())


def test_yolo26_segment_loss_stays_ultralytics(monkeypatch):
    test_the_segment_loss_and_its_gradients_equal_ultralytics(True, COUNTS, None, monkeypatch, "yolo26n-seg.yaml")


def test_the_mask_loss_groups_images_within_the_padded_budget():
    """Runs of consecutive images whose padded rows (images x most rows) stay within the budget, an image over it
    alone, images without a foreground skipped; every image with a foreground in exactly one run."""
    counts = [0, 3, 1, 0, 0, 5, 2, 2, 9, 0, 1]
    rows = segment_loss._ImageRows(torch.zeros(sum(counts), 2, dtype=torch.long), torch.tensor([counts]), counts, None,
                                   None)
    for budget in (1, 4, 6, 10, 100):
        groups = rows.groups(budget)
        covered = [i for a, z in groups for i in range(a, z)]
        assert sorted(covered) == covered and len(covered) == len(set(covered))  # in order, none twice
        assert {i for i, c in enumerate(counts) if c} <= set(covered)
        for a, z in groups:
            assert counts[a] and counts[z - 1] and (z - a == 1 or (z - a) * rows.most(a, z) <= budget)
    assert rows.groups(100) == [(1, 11)] and rows.groups(1) == [(i, i + 1) for i, c in enumerate(counts) if c]
    assert rows.empty_images == 4 and rows.fg_first.tolist() == [0, 0, 3, 4, 4, 4, 9, 11, 13, 22, 22]


def test_the_segment_loss_gathers_each_images_foreground_with_one_read_of_the_counts(monkeypatch):
    """The mask loss indexes with tensors and host integers: what Ultralytics gathers image by image by boolean indexing
    (about five syncs an image), and its guard ``if fg_mask.sum()``, come from one read of the counts, which sizes a
    ``nonzero_static``. Counted on the CPU by the calls that sync on a GPU: ``tolist`` once a step, ``nonzero`` and a
    tensor's truth never, whatever the batch size; a batch without a foreground reads the counts once too."""
    if not seam.since(seam.SEGMENT_LOSS_SINCE):
        pytest.skip(f"the sync-free segment loss serves from Ultralytics {seam.SEGMENT_LOSS_SINCE}")
    counts = [2, 1, 3, 0, 2, 1, 1, 2]
    model = _model("yolo11n-seg.yaml", SegmentationModel).train()
    sfl.install(model)
    b = _segment_batch(counts, True, seed=5)
    preds = model(b["img"])
    model.loss({**b, sfl.MAX_BOXES: max(counts)}, preds)
    calls = {"nonzero": 0, "tolist": 0, "bool_index": 0, "bool": 0}
    nonzero, tolist, getitem = torch.Tensor.nonzero, torch.Tensor.tolist, torch.Tensor.__getitem__
    truth = torch.Tensor.__bool__

    def count(name, fn):
        def wrapped(self, *a, **k):
            calls[name] += 1
            return fn(self, *a, **k)
        return wrapped

    def index(self, key):
        if isinstance(key, torch.Tensor) and key.dtype == torch.bool:
            calls["bool_index"] += 1
        return getitem(self, key)

    monkeypatch.setattr(torch.Tensor, "nonzero", count("nonzero", nonzero))
    monkeypatch.setattr(torch.Tensor, "tolist", count("tolist", tolist))
    monkeypatch.setattr(torch.Tensor, "__getitem__", index)
    monkeypatch.setattr(torch.Tensor, "__bool__", count("bool", truth))
    seg = model.criterion
    aug = _augmented(counts, seed=5)
    candidates = int(sfl.early_candidates_for(seg, aug))  # a host integer, as AugmentAhead hands it on
    model.loss({**b, sfl.MAX_BOXES: max(counts), sfl.CANDIDATES: candidates}, preds)
    assert calls == {"nonzero": 0, "tolist": 1, "bool_index": 0, "bool": 0}  # the whole loss, 6 images with instances
    calls.update(tolist=0)
    fg = torch.zeros(len(counts), 5, dtype=torch.bool)
    fg[0, 1] = fg[2, :3] = fg[7, 4] = True
    rows = segment_loss._image_rows(fg, b["batch_idx"], True)
    assert calls == {"nonzero": 0, "tolist": 1, "bool_index": 0, "bool": 0}
    assert torch.equal(rows.fg, fg.nonzero())  # nonzero's indices, in its order
    assert [rows.fg[rows.fg_edges[i]:rows.fg_edges[i + 1], 1].tolist() or None for i in range(len(counts))] == [
        [1], None, [0, 1, 2], None, None, None, None, [4]]
    assert isinstance(seg, sfl.SyncFreeSegmentLoss)


def test_install_leaves_a_classification_model_alone():
    from ultralytics.nn.tasks import ClassificationModel

    m = ClassificationModel("yolo11n-cls.yaml", nc=4, verbose=False)
    m.args = get_cfg()
    m.criterion = m.init_criterion()
    assert sfl.install(m) == []


@pytest.mark.gpu
@pytest.mark.parametrize("yaml", ["yolo11n.yaml", "yolo26n.yaml"])
def test_cuda_loss_with_counts_makes_no_host_sync(yaml):
    model = _model(yaml).cuda().train()
    aug = _augmented(COUNTS, seed=3)
    aug = AugmentedBatch(*(t.cuda() for t in (aug.img, aug.cls, aug.boxes, aug.valid)))
    b = _ultralytics(aug)
    b = {**b, "batch_idx": b["batch_idx"].cuda()}
    (first, *_) = sfl.install(model) or [None]
    sfl.install(model)
    with torch.autocast("cuda"):
        preds = model(b["img"])
        model.loss({**b, sfl.MAX_BOXES: max(COUNTS)}, preds)  # caches the anchors (and syncs, once)
        candidates = int(sfl.early_candidates_for(first, aug))
        want = model.loss(b, preds)[0]
        with no_host_sync():
            early = sfl.early_candidates_for(first, aug)
            got = model.loss({**b, sfl.MAX_BOXES: max(COUNTS), sfl.CANDIDATES: candidates}, preds)[0]
            got.sum().backward()
    assert int(early) == candidates
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_cuda_pose_loss_with_counts_makes_no_host_sync():
    from ultralytics.nn.tasks import PoseModel

    model = PoseModel("yolo11n-pose.yaml", nc=4, data_kpt_shape=(5, 3), verbose=False).cuda().train()
    model.args = get_cfg()
    b = {k: v.cuda() for k, v in _pose_batch(COUNTS, 5, seed=3).items()}
    from types import SimpleNamespace

    from yolofeed.train.step import counts_for_ultralytics_batch

    sfl.install(model)
    trainer = SimpleNamespace(sync_free_loss=True, args=SimpleNamespace(multi_scale=0), model=model)
    with torch.autocast("cuda"):
        preds = model(b["img"])
        want = model.loss(b, preds)[0]
        model.loss({**b, sfl.MAX_BOXES: max(COUNTS)}, preds)  # caches the anchors (and syncs, once)
        counts = counts_for_ultralytics_batch(trainer, b)
        assert set(counts) == {sfl.MAX_BOXES, sfl.CANDIDATES}
        with no_host_sync():
            got = model.loss({**b, **counts}, preds)[0]
            got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("sync_free_step", [True, False])  # the loss does not need the step's own change
def test_training_with_the_sync_free_loss_uses_the_counts_and_they_are_right(synth_root, tmp_path, monkeypatch,
                                                                             sync_free_step):
    """FastDetectionTrainer(sync_free_loss=True) on the CPU: after the first steps every loss call takes the
    counts AugmentAhead computed a step early, and every epoch's check finds them right."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    calls = {"counted": 0, "measured": 0}
    own = sfl.SyncFreeAssigner.get_box_metrics

    def spy(self, *a, **k):
        calls["counted" if self.candidates is not None else "measured"] += 1
        return own(self, *a, **k)

    checks = []
    check = sfl.check_counts
    monkeypatch.setattr(sfl.SyncFreeAssigner, "get_box_metrics", spy)
    monkeypatch.setattr(sfl, "check_counts", lambda model: checks.append(check(model)) or checks[-1])
    YOLO("yolo11n.yaml").train(trainer=FastDetectionTrainer.with_options(sync_free_loss=True,
                                                                         sync_free_step=sync_free_step),
                               data=str(synth_root / "data.yaml"), project=str(tmp_path), name="r", epochs=2,
                               imgsz=64, batch=8, device="cpu", workers=0, plots=False, verbose=False, val=False)
    # only the run's first two batches measure their count: the anchors come from the first loss call, and the
    # second batch is augmented (and counted) before it
    assert calls["measured"] == 2 and calls["counted"] >= 2
    assert checks == [True, True]


@pytest.mark.slow
def test_the_ceiling_with_the_sync_free_loss_counts_its_replayed_batches(synth_root, tmp_path, monkeypatch):
    """The bench's ceiling takes the same loss as yolofeed: only its first loss call measures the candidates
    (it makes the anchors the count needs), and each replayed batch is counted on the host once."""
    from ultralytics import YOLO

    from yolofeed.bench import ceiling
    from yolofeed.train import step

    calls = {"counted": 0, "measured": 0, "host_counts": 0}
    own, host_counts = sfl.SyncFreeAssigner.get_box_metrics, step.counts_for_ultralytics_batch

    def spy(self, *a, **k):
        calls["counted" if self.candidates is not None else "measured"] += 1
        return own(self, *a, **k)

    def spy_counts(*a):
        calls["host_counts"] += 1
        return host_counts(*a)

    monkeypatch.setattr(sfl.SyncFreeAssigner, "get_box_metrics", spy)
    monkeypatch.setattr(ceiling, "counts_for_ultralytics_batch", spy_counts)
    trainer = type("CeilingTrainer", (ceiling.CeilingTrainer,), {"sync_free_loss": True})
    YOLO("yolo11n.yaml").train(trainer=trainer,
                               data=str(synth_root / "data.yaml"), project=str(tmp_path), name="c", epochs=1,
                               imgsz=64, batch=4, device="cpu", workers=0, plots=False, verbose=False, val=False)
    assert calls["measured"] == 1 and calls["counted"] >= ceiling.REPLAYED  # every later step
    assert calls["host_counts"] == ceiling.REPLAYED + 1  # the first batch twice: before the anchors, and after


@pytest.mark.slow
def test_training_with_the_sync_free_loss_ends_with_the_same_weights(synth_root, tmp_path):
    """Two epochs on the CPU, seeded, with and without the sync-free loss: the same gradients step by step, so
    the same epoch losses in results.csv and the same weights at the end (to float32 rounding of sums taken
    in another order)."""
    import csv

    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    weights = {}
    for name, cls in (("stock_loss", FastDetectionTrainer.with_options(sync_free_loss=False)),
                      ("sync_free", FastDetectionTrainer.with_options(sync_free_loss=True))):
        YOLO("yolo11n.yaml").train(trainer=cls, data=str(synth_root / "data.yaml"), project=str(tmp_path), name=name,
                                   epochs=2, imgsz=64, batch=8, device="cpu", workers=0, plots=False, verbose=False,
                                   val=False, seed=0, deterministic=True)
        ckpt = torch.load(tmp_path / name / "weights" / "last.pt", weights_only=False)
        weights[name] = {k: v.float() for k, v in (ckpt["ema"] or ckpt["model"]).state_dict().items()}
        with open(tmp_path / name / "results.csv") as f:
            weights[name]["losses"] = torch.tensor([[float(r[f"train/{k}_loss"]) for k in ("box", "cls", "dfl")]
                                                    for r in csv.DictReader(f)])
    torch.testing.assert_close(weights["sync_free"].pop("losses"), weights["stock_loss"].pop("losses"), rtol=0,
                               atol=2e-5)  # results.csv keeps 5 decimals: the tolerance of its last one
    for k, v in weights["stock_loss"].items():
        torch.testing.assert_close(weights["sync_free"][k], v, rtol=1e-3, atol=1e-4, msg=k)


def test_pose_keypoint_decode_is_ultralytics():
    g = torch.Generator().manual_seed(0)
    anchors, kpts = torch.rand(30, 2, generator=g) * 20, torch.randn(2, 30, 5, 3, generator=g)
    assert torch.equal(sfl.SyncFreePoseLoss.kpts_decode(anchors, kpts), seam.v8PoseLoss.kpts_decode(anchors, kpts))


# -- OBB -------------------------------------------------------------------------------------------------------------
OBB_COUNTS = [3, 0, 5, 40, 0, 2]  # boxes per image before the tiny-box filter: two empty images, one crowded


def _obb_rows(counts: list[int], size: int, seed: int, tiny: float = 0.2) -> torch.Tensor:
    """(N, 7) batch index, class, normalised xywhr, sorted by image as Ultralytics collates them: about ``tiny`` of the
    boxes with a side under 2 px (the loss's filter drops them), a third axis-aligned (theta 0, edges on pixels)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i, c in enumerate(counts):
        xy = size * (0.15 + 0.7 * torch.rand(c, 2, generator=g))
        wh = size * (0.03 + 0.4 * torch.rand(c, 2, generator=g))
        side = torch.randint(0, 2, (c,), generator=g)
        small = torch.rand(c, generator=g) < tiny
        wh[small, side[small]] = 1.0 + torch.rand(int(small.sum()), generator=g)  # 1-2 px: dropped
        theta = torch.rand(c, 1, generator=g) * math.pi - math.pi / 4  # [-pi/4, 3pi/4), xyxyxyxy2xywhr's range
        straight = torch.rand(c, generator=g) < 1 / 3
        theta[straight] = 0.0
        xy[straight], wh[straight & ~small] = xy[straight].round(), wh[straight & ~small].round()
        cls = torch.randint(0, 4, (c, 1), generator=g).float()
        rows.append(torch.cat([torch.full((c, 1), float(i)), cls, xy / size, wh / size, theta], 1))
    return torch.cat(rows)


def _obb_batch(counts: list[int], size: int = 64, seed: int = 0, tiny: float = 0.2) -> dict:
    rows = _obb_rows(counts, size, seed, tiny)
    g = torch.Generator().manual_seed(seed)
    return {"img": torch.rand(len(counts), 3, size, size, generator=g), "batch_idx": rows[:, 0], "cls": rows[:, 1:2],
            "bboxes": rows[:, 2:]}


def _slots(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's boxes in per-image slots, as an augmented batch holds them: (B, K, 5) normalised xywhr, valid
    (B, K), a hole before each image's boxes (slots need not be packed first)."""
    idx = batch["batch_idx"].long()
    counts = torch.bincount(idx, minlength=len(batch["img"]))
    k = int(counts.max()) + 1
    within = torch.arange(len(idx)) - (counts.cumsum(0) - counts)[idx] + 1
    rboxes = torch.zeros(len(counts), k, 5)
    valid = torch.zeros(len(counts), k, dtype=torch.bool)
    rboxes[idx, within], valid[idx, within] = batch["bboxes"], True
    return rboxes, valid


def _obb_model(yaml: str) -> torch.nn.Module:
    from ultralytics.nn.tasks import OBBModel

    m = OBBModel(yaml, nc=4, verbose=False).train()
    m.args = get_cfg()
    return m


def _leaves(preds):
    """The head's outputs as leaves of their own: the gradients the loss gives the predictions."""
    if isinstance(preds, dict):
        return {k: _leaves(v) for k, v in preds.items()}
    if isinstance(preds, list):
        return [_leaves(v) for v in preds]
    return preds.detach().clone().requires_grad_(True)


def _predictions(preds) -> list[torch.Tensor]:
    """Every prediction tensor the loss differentiates (``feats`` give it only shapes)."""
    if isinstance(preds, dict):
        return [x for k in sorted(preds) if k != "feats" for x in _predictions(preds[k])]
    return [preds]


def _trainer(model):
    from types import SimpleNamespace

    return SimpleNamespace(sync_free_loss=True, args=SimpleNamespace(multi_scale=0), model=model)


@pytest.mark.parametrize("yaml", ["yolo11n-obb.yaml", "yolo26n-obb.yaml"])  # DFL; reg_max 1 and E2E (two losses)
@pytest.mark.parametrize("counts,tiny", [(OBB_COUNTS, 0.2), ([2, 0, 3], 1.0)])  # the second: every box dropped
def test_the_obb_loss_and_its_gradients_equal_ultralytics(yaml, counts, tiny):
    """SyncFreeOBBLoss against v8OBBLoss at random weights: the four losses and the gradients w.r.t. every prediction,
    to float32 rounding of longer sums; without counts Ultralytics' path bit for bit; the counts from the trainer's
    route (counts_for_ultralytics_batch), the candidates' equal to those Ultralytics' rotated assigner gathers; a
    wrong one caught by check_counts, then ignored."""
    from yolofeed.train.step import counts_for_ultralytics_batch

    torch.manual_seed(0)
    model = _obb_model(yaml)
    b = _obb_batch(counts, seed=1, tiny=tiny)
    w, h = b["bboxes"][:, 2] * 64, b["bboxes"][:, 3] * 64
    dropped = int(((w < 2) | (h < 2)).sum())
    assert dropped > 0 and (dropped == len(w) if tiny == 1.0 else dropped < len(w))
    preds = _leaves(model(b["img"]))

    def run(batch):
        loss, items = model.loss(batch, preds)
        return loss.detach().clone(), torch.autograd.grad(loss.sum(), _predictions(preds)), items

    want = run(b)  # the criterion Ultralytics made, untouched
    stock = model.criterion
    trainer = _trainer(model)
    assert counts_for_ultralytics_batch(trainer, b) is None  # no sync-free loss yet
    swapped = sfl.install(model)
    assert model.criterion is stock and sfl.install(model) == swapped
    assert [type(x) for x in swapped] == [sfl.SyncFreeOBBLoss] * (1 if yaml.startswith("yolo11") else 2)
    assert all(type(x.assigner) is sfl.SyncFreeRotatedAssigner and type(x.bbox_loss) is sfl.SyncFreeRotatedBboxLoss
               for x in swapped)
    got = run(b)  # no counts: Ultralytics' own path, bit for bit
    assert torch.equal(got[0], want[0]) and all(torch.equal(x, y) for x, y in zip(got[1], want[1]))

    def close(got):
        torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
        assert got[2].keys() == want[2].keys()
        for x, y in zip(got[1], want[1]):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-9)

    first = counts_for_ultralytics_batch(trainer, b)  # before the anchors: the most boxes only
    assert first == {sfl.MAX_BOXES: max(counts)}
    close(run({**b, **first}))  # the assigner measures its candidates; the rest without syncs
    both = counts_for_ultralytics_batch(trainer, b)
    assert set(both) == {sfl.MAX_BOXES, sfl.CANDIDATES}
    seen = _stock_candidates(model, b, preds)  # none where every box is dropped: Ultralytics' assigner returns early
    assert seen == ([both[sfl.CANDIDATES]] * len(swapped) if tiny < 1 else [])
    assert tiny < 1 or both[sfl.CANDIDATES] == 0
    rboxes, valid = _slots(b)  # the augmented route: the same boxes in slots, holes and dropped boxes as zeros
    assert int(sfl.early_rbox_candidates_for(swapped[0], rboxes, valid)) == both[sfl.CANDIDATES]
    assert sfl.early_candidates_for(swapped[0], _augmented(COUNTS)) is None  # a detection batch: no oriented boxes
    size = b["img"].shape[-1]  # 64: a power of 2, so pixels / size gives back the same bits
    aug = AugmentedBatch(img=b["img"], cls=torch.zeros(valid.shape), boxes=torch.zeros(*valid.shape, 4), valid=valid,
                         rboxes=torch.cat([rboxes[..., :4] * size, rboxes[..., 4:]], -1))
    assert int(sfl.early_candidates_for(swapped[0], aug)) == both[sfl.CANDIDATES]  # AugmentAhead's route
    close(run({**b, **both}))
    assert all(x.assigner.candidates is None and x.bbox_loss.bound is None for x in swapped)  # nothing left over
    assert sfl.check_counts(model)
    run({**b, **both, sfl.CANDIDATES: both[sfl.CANDIDATES] + 1})  # a wrong count: caught at the check
    assert not sfl.check_counts(model)
    got = run({**b, **both, sfl.CANDIDATES: both[sfl.CANDIDATES] + 1})  # then ignored
    assert torch.equal(got[0], want[0])


def test_padded_rboxes_are_ultralytics_filtered_rows_then_zeros():
    """The padding keeps every row: the boxes the tiny-box filter keeps, in order, then zeros, as Ultralytics'
    preprocess of the filtered rows (whose width is the most kept boxes in one image), zero columns after."""
    model = _obb_model("yolo11n-obb.yaml")
    (loss,) = sfl.install(model)
    b = _obb_batch(OBB_COUNTS, seed=3)
    model.loss({**b, sfl.MAX_BOXES: max(OBB_COUNTS)}, model(b["img"]))  # caches the constants
    c = loss.last_constants()
    targets = torch.cat([b["batch_idx"][:, None], b["cls"], b["bboxes"]], 1)
    rw, rh = targets[:, 4] * float(c.imgsz[1]), targets[:, 5] * float(c.imgsz[0])
    kept = targets[(rw >= 2) & (rh >= 2)]
    want = seam.v8OBBLoss.preprocess(loss, kept, len(OBB_COUNTS), scale_tensor=c.imgsz[[1, 0, 1, 0]])
    got = loss._pad_rboxes(targets, len(OBB_COUNTS), max(OBB_COUNTS), c)
    assert want.shape[1] < got.shape[1] == max(OBB_COUNTS)
    assert torch.equal(got[:, :want.shape[1]], want) and not got[:, want.shape[1]:].any()
    with pytest.raises(IndexError):  # a count too small is an error, never a silent drop
        loss._pad_rboxes(targets, len(OBB_COUNTS), want.shape[1] - 1, c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # float16: the anchors under AMP
@pytest.mark.parametrize("hw", [(128, 128), (96, 160)])  # square, and a rect batch's shape
def test_counted_rotated_candidates_equal_the_assigners_mask(dtype, hw):
    """The row-by-row count (a binary search per comparison) equals Ultralytics' rotated candidate mask summed, for
    axis-aligned boxes whose edges lie on anchor centres or a hair off, boxes a hair off axis, thin boxes along a row,
    any angle, sides under stride_val (raised), boxes off the image, padding rows; our copy of the test equals
    Ultralytics' bit for bit."""
    from ultralytics.utils.tal import RotatedTaskAlignedAssigner

    model = _obb_model("yolo11n-obb.yaml")
    (loss,) = sfl.install(model)
    feats = [torch.empty(1, 1, hw[0] // s, hw[1] // s, dtype=dtype) for s in (8, 16, 32)]
    c = loss._constants(feats, dtype)
    centers = c.anchor_points * c.stride_tensor
    stock = RotatedTaskAlignedAssigner.select_candidates_in_gts
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        b, k = 3, 12
        on = 4.0 + 8.0 * torch.randint(0, 20, (b, k, 4), generator=g).float()  # edges on stride-8 centres
        x0, x1 = torch.minimum(on[..., 0], on[..., 2]), torch.maximum(on[..., 0], on[..., 2]) + 8
        y0, y1 = torch.minimum(on[..., 1], on[..., 3]), torch.maximum(on[..., 1], on[..., 3]) + 8
        xywh = torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], -1)
        xywh = xywh + torch.randint(-1, 2, (b, k, 4), generator=g) * 1e-3 * (torch.rand(b, k, 1, generator=g) < 0.3)
        pick = torch.rand(b, k, generator=g)
        theta = torch.where(pick < 0.3, 0.0, torch.where(pick < 0.45, math.pi / 2, torch.rand(b, k, generator=g) *
                                                          math.pi - math.pi / 4))
        theta = torch.where((pick > 0.45) & (pick < 0.6), torch.randn(b, k, generator=g) * 1e-5, theta)  # a hair off
        gt = torch.cat([xywh, theta[..., None]], -1)
        thin = torch.rand(b, k, generator=g) < 0.1  # on a row of centres, raised to stride_val: edges on rows
        gt[thin] = torch.tensor([hw[1] / 2, 12.0, hw[1] * 0.8, 1e-3, 0.0])
        small = torch.rand(b, k, 1, generator=g) < 0.2
        gt[..., 2:4] = torch.where(small, gt[..., 2:4].clamp(max=5.0), gt[..., 2:4])  # under stride_val: raised
        off = torch.rand(b, k, 1, generator=g) < 0.1
        gt[..., :2] = torch.where(off, gt[..., :2] - 0.8 * max(hw), gt[..., :2])  # mostly off the image
        gt[torch.rand(b, k, generator=g) < 0.2] = 0.0  # padding rows
        mask_gt = gt.sum(2, keepdim=True).gt_(0.0)
        theirs = stock(loss.assigner, centers, gt.clone(), mask_gt)
        assert torch.equal(loss.assigner.select_candidates_in_gts(centers, gt.clone(), mask_gt), theirs), trial
        assert int(loss.early_candidates(gt)) == int((theirs * mask_gt).bool().sum()), trial


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotated_padded_rows_never_make_a_gradient_non_finite(dtype):
    """A background anchor's box or angle that is not finite is not Ultralytics' business (it never reads it); read
    by a padded row, or by the angle loss over every anchor, it must not reach the gradients. They equal
    Ultralytics'."""
    from ultralytics.utils.loss import RotatedBboxLoss

    g = torch.Generator().manual_seed(0)
    b, a = 2, 50
    boxes = torch.cat([torch.rand(b, a, 2, generator=g) * 20, 1 + torch.rand(b, a, 2, generator=g) * 5,
                       torch.rand(b, a, 1, generator=g)], -1)
    boxes[1, 3, 2:4] = float("inf")  # on image 1, which has no foreground
    boxes[1, 4, 4] = float("nan")
    target = torch.cat([torch.rand(b, a, 2, generator=g) * 20, 1 + torch.rand(b, a, 2, generator=g) * 5,
                        torch.rand(b, a, 1, generator=g)], -1)
    scores = torch.rand(b, a, 8, generator=g)
    fg = torch.zeros(b, a, dtype=torch.bool)
    fg[0, :7] = True
    scores = scores * fg[..., None]  # as the assigner leaves them: zero off the foreground
    anchors, stride = torch.rand(a, 2, generator=g) * 20, torch.full((a, 1), 8.0)
    tss = scores.sum()
    dist0 = torch.randn(b, a, 64, generator=g)
    grads = []
    for ours in (True, False):
        loss = RotatedBboxLoss(16)
        if ours:
            loss.__class__, loss.bound = sfl.SyncFreeRotatedBboxLoss, b * a  # every anchor a row: padding on image 1
        pred, dist = boxes.to(dtype).requires_grad_(True), dist0.to(dtype).requires_grad_(True)
        iou, dfl = loss(dist, pred, anchors, target, scores, tss, fg, torch.tensor([320.0, 320.0]), stride)
        if ours:
            angle = sfl.SyncFreeOBBLoss._angle_loss(pred, target, fg, scores, tss)
        else:
            angle = seam.v8OBBLoss.calculate_angle_loss(None, pred, target, fg, scores[fg].sum(-1), tss)
        (iou + dfl + angle).backward()
        grads.append((pred.grad, dist.grad, iou.detach(), dfl.detach(), angle.detach()))
    ours, theirs = grads
    assert all(x.isfinite().all() for x in ours[:2])
    for x, y in zip(ours, theirs):
        torch.testing.assert_close(x.float(), y.float(), rtol=1e-3, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("yaml", ["yolo11n-obb.yaml", "yolo26n-obb.yaml"])
def test_cuda_obb_loss_with_counts_makes_no_host_sync(yaml):
    from yolofeed.train.step import counts_for_ultralytics_batch

    model = _obb_model(yaml).cuda()
    b = _obb_batch(OBB_COUNTS, seed=3)
    rboxes, valid = (t.cuda() for t in _slots(b))
    b = {k: v.cuda() for k, v in b.items()}
    (first, *_) = sfl.install(model)
    with torch.autocast("cuda"):
        preds = model(b["img"])
        want = model.loss(b, preds)[0]
        model.loss({**b, sfl.MAX_BOXES: max(OBB_COUNTS)}, preds)  # caches the anchors (and syncs, once)
        counts = counts_for_ultralytics_batch(_trainer(model), b)
        assert set(counts) == {sfl.MAX_BOXES, sfl.CANDIDATES}
        with no_host_sync():
            early = sfl.early_rbox_candidates_for(first, rboxes, valid)
            got = model.loss({**b, **counts}, preds)[0]
            got.sum().backward()
    assert int(early) == counts[sfl.CANDIDATES]
    assert sfl.check_counts(model)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_cuda_segment_loss_with_counts_syncs_a_few_times_where_ultralytics_syncs_per_image():
    """On CUDA, counted by torch's sync debug mode: the sync-free segment loss reads the GPU once a step itself (the
    per-image counts), Ultralytics' about five times an image; the same loss. The bound of 3 leaves room for what
    torch's own calls in the step sync (the mode counts those too)."""
    import warnings

    if not seam.since(seam.SEGMENT_LOSS_SINCE):
        pytest.skip(f"the sync-free segment loss serves from Ultralytics {seam.SEGMENT_LOSS_SINCE}")
    counts = [2, 1, 3, 0, 2, 1, 1, 2]
    model = _model("yolo11n-seg.yaml", SegmentationModel).cuda().train()
    b = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in _segment_batch(counts, True, seed=6).items()}
    aug = _augmented(counts, seed=6)

    def syncs(batch):
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = model.loss(batch, preds)[0]
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return out, sum("synchronizing" in str(w.message) for w in seen)

    with torch.autocast("cuda"):
        preds = model(b["img"])
        want, stock = syncs(b)
        (loss,) = sfl.install(model)
        model.loss({**b, sfl.MAX_BOXES: max(counts)}, preds)  # caches the anchors
        candidates = sfl.early_candidates_for(loss, AugmentedBatch(*(t.cuda() for t in (
            aug.img, aug.cls, aug.boxes, aug.valid))))
        got, ours = syncs({**b, sfl.MAX_BOXES: max(counts), sfl.CANDIDATES: int(candidates)})
    assert ours <= 3 and stock > 10
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
