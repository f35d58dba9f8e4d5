"""The jpeg format (pack/codecs/jpeg.py). Build: JPEGs kept byte for byte, others re-encoded, an image too wide
for JPEG pointed to a raw pack. Device decode (torchvision; nvJPEG on CUDA): the cv2 path's pixels within a
level, any grouping, odd files.

On the CPU torchvision decodes with libjpeg-turbo, as OpenCV does: unresized images are identical
and the only difference is the resize (float bilinear vs OpenCV's 11-bit fixed point), measured at
most 1 level (mean 0.04-0.13 per image over the synthetic packs at imgsz 64, 97, 160 and 200).
On CUDA nvJPEG's IDCT and chroma upsampling differ from libjpeg-turbo too: a looser bound (``gpu``).
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import yolofeed.pack.codecs.jpeg as decode
from helpers import add_bad_samples
from yolofeed.cli import main
from yolofeed.errors import ConfigError, PackError
from yolofeed.loader import TrainLoader
from yolofeed.loader.prefetch import Prefetcher
from yolofeed.pack import Pack, open_or_build
from yolofeed.pack.codecs.jpeg import decode_into
from yolofeed.pack.paths import store_dir


def _build(root: Path, split="train", imgsz=160, storage="raw", workers=2, **kw) -> Pack:
    return open_or_build(root / "data.yaml", split, imgsz, storage, rebuild="auto", workers=workers,
                         progress=False, **kw)


def test_jpeg_storage_keeps_the_bytes(dataset):
    add_bad_samples(dataset)
    raw = _build(dataset)
    jpg = _build(dataset, storage="jpeg")
    assert jpg.im_files == raw.im_files and jpg.path.stat().st_size < raw.path.stat().st_size / 3
    import cv2

    for i, f in enumerate(jpg.im_files):
        dec = cv2.imdecode(jpg.encoded(i), cv2.IMREAD_COLOR)
        assert dec is not None and dec.shape[:2] == tuple(jpg.ori_shapes[i])
        assert tuple(jpg.shapes[i]) == tuple(raw.shapes[i])
        np.testing.assert_array_equal(jpg.labels(i), raw.labels(i))
        if Path(f).name.startswith("train_"):
            assert bytes(jpg.encoded(i)) == Path(f).read_bytes()  # JPEGs kept byte for byte
    reencoded = {Path(f).name for f, n in jpg.header["notes"] if "re-encoded" in n}
    assert {"rotated.jpg", "plain.png", "trailing.jpg"} <= reencoded
    from yolofeed.pack.codecs.jpeg import gather_encoded

    starts, sizes = gather_encoded(jpg, [2, 0], buf := np.zeros(10**6, np.uint8))
    assert bytes(buf[starts[1]:starts[1] + sizes[1]]) == bytes(jpg.encoded(0))
    with pytest.raises(PackError, match="format=raw"):
        jpg.image(0)


def test_an_image_too_wide_for_a_jpeg_pack_points_to_a_raw_pack(dataset, capsys):
    """A PNG 70,000 px wide (Ultralytics trains on it) was skipped from a jpeg pack as "could not re-encode the image
    as JPEG", with no way out; JPEG's sides end at 65,500 px. Now the reason says so and names format=raw, which
    keeps it."""
    import cv2

    img, lab = dataset / "images" / "train", dataset / "labels" / "train"
    cv2.imwrite(str(img / "panorama.png"), np.full((20, 70_000, 3), 127, np.uint8))
    (lab / "panorama.txt").write_text("0 0.5 0.5 0.1 0.5\n")
    base = ["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "workers=1", "splits=train"]
    assert main(base + ["format=jpeg"]) == 0
    reason = dict(Pack.open(store_dir(dataset / "data.yaml", 64, "jpeg") / "train.yfpack").header["skipped"])
    why = reason[str(img / "panorama.png")]
    assert "70000x20 px" in why and "65,500 px" in why and "format=raw" in why, why
    assert main(base + ["format=raw"]) == 0
    assert str(img / "panorama.png") in Pack.open(store_dir(dataset / "data.yaml", 64, "raw") / "train.yfpack").im_files


# -- device decode -----------------------------------------------------------------------------------------------------
IMGSZ = 160  # synth_root holds 160x120, 120x160, 160x160, 160x90 (kept), 200x150 (shrunk), 128x96 (enlarged)


CPU_MAX, CPU_MEAN = 1, 0.25  # torchvision CPU vs cv2, measured: max 1 level, mean <= 0.13


# nvJPEG vs libjpeg-turbo: different IDCT and chroma upsampling (see module doc). Measured on the H200 on these
# synthetic images (sharp colour edges; BENCHMARKS.md, "Raw and jpeg packs"): decode alone, mean 2.45 levels,
# 99.9th percentile 55, max 138; through the loader (decode + resize vs the raw pack), mean 2.87 and
# p99.9 62. A wrong decode (stale or overwritten memory, a colour swap) moves the mean by tens of levels.
GPU_MEAN, GPU_P999 = 3.0, 64


@pytest.fixture(autouse=True)
def _fresh_refusals(monkeypatch):
    monkeypatch.setattr(decode, "_REFUSED", set())  # each test sees its own warnings


def _cv2(pack, indices) -> torch.Tensor:
    out = np.zeros((len(indices), pack.imgsz, pack.imgsz, 3), np.uint8)
    pack.codec.gather(pack, np.asarray(indices), out)  # decode="cv2": OpenCV on the host
    return torch.from_numpy(out)


def _diffs(a: torch.Tensor, b: torch.Tensor, shapes) -> np.ndarray:
    """Absolute differences inside each image's (h, w)."""
    d = (a.cpu().to(torch.int16) - b.cpu().to(torch.int16)).abs().numpy()
    return np.concatenate([d[k, :h, :w].ravel() for k, (h, w) in enumerate(shapes.tolist())])


def _decode(pack, indices, device="cpu", fill=7) -> torch.Tensor:
    out = torch.full((len(indices), pack.imgsz, pack.imgsz, 3), fill, dtype=torch.uint8, device=device)
    decode_into([pack.encoded(i) for i in indices], pack.shapes[indices], out)
    return out


def test_decode_equals_cv2_within_a_level_and_writes_only_the_image(pack):
    jpg = pack(IMGSZ, "jpeg")
    idx = np.arange(len(jpg))
    resized = (jpg.ori_shapes != jpg.shapes).any(1)
    up = resized & (jpg.ori_shapes[:, 0] < jpg.shapes[:, 0])
    assert up.any() and (resized & ~up).any() and (~resized).any()  # enlarged, shrunk and kept images
    ours, ref = _decode(jpg, idx), _cv2(jpg, idx)
    d = _diffs(ours, ref, jpg.shapes)
    assert d.max() <= CPU_MAX and d.mean() < CPU_MEAN
    kept = np.flatnonzero(~resized)
    assert _diffs(ours[kept], ref[kept], jpg.shapes[kept]).max() == 0  # the same libjpeg-turbo decode
    for k, (h, w) in enumerate(jpg.shapes.tolist()):
        assert (ours[k, h:] == 7).all() and (ours[k, :, w:] == 7).all()


def test_grouped_batch_equals_images_one_at_a_time(pack):
    jpg = pack(IMGSZ, "jpeg")
    idx = np.random.default_rng(0).permutation(len(jpg))[:13]  # mixed shapes, groups out of order
    batch = _decode(jpg, idx)
    for k, i in enumerate(idx):
        assert torch.equal(batch[k], _decode(jpg, [i])[0])


def _epoch(loader):
    out = []
    for b in loader:
        s = b["source"]
        out.append((b["indices"].copy(), s.images.clone(), s.hw.clone(), s.cls.clone(), s.boxes.clone(),
                    s.valid.clone()))
    return out


def test_prefetcher_torchvision_equals_cv2_labels_and_pixels_within_a_level(pack):
    jpg = pack(IMGSZ, "jpeg")
    a = _epoch(TrainLoader(jpg, 5, "cpu", seed=1, sync=True, decode="torchvision"))
    b = _epoch(TrainLoader(jpg, 5, "cpu", seed=1, sync=True, decode="cv2"))
    assert len(a) == len(b) == 5
    for x, y in zip(a, b):
        assert np.array_equal(x[0], y[0])
        for u, v in zip(x[2:], y[2:]):
            assert torch.equal(u, v)
        d = _diffs(x[1], y[1], x[2])
        assert d.max() <= CPU_MAX and d.mean() < CPU_MEAN


def test_torchvision_decode_sync_and_async_yield_identical_batches(pack):
    jpg = pack(IMGSZ, "jpeg")
    a = _epoch(TrainLoader(jpg, 5, "cpu", seed=2, sync=True, decode="torchvision"))
    b = _epoch(TrainLoader(jpg, 5, "cpu", seed=2, sync=False, decode="torchvision"))
    for x, y in zip(a, b):
        assert np.array_equal(x[0], y[0])
        pixels = [(x[1][k, :h, :w], y[1][k, :h, :w]) for k, (h, w) in enumerate(x[2].tolist())]
        assert all(torch.equal(u, v) for u, v in pixels)
        assert all(torch.equal(u, v) for u, v in zip(x[2:], y[2:]))


def test_device_decode_allocates_no_host_image_buffer(pack):
    jpg = pack(IMGSZ, "jpeg")
    p = Prefetcher(jpg, "cpu", 4, decode="torchvision")
    assert p.slots[0].host.images.numel() == 0 and p.slots[0].dev.images.shape == (4, IMGSZ, IMGSZ, 3)
    assert Prefetcher(jpg, "cpu", 4).slots[0].host.images.shape == (4, IMGSZ, IMGSZ, 3)  # auto: cv2 on the CPU


def test_staged_decode_equals_decode_from_the_map_and_the_largest_files_fit(pack):
    """The loader stages a batch's files in one reused host buffer: same pixels, whatever the buffer held before."""
    jpg = pack(IMGSZ, "jpeg")
    b = 5
    largest = np.argsort(jpg.index["nbytes"])[-b:]
    p = Prefetcher(jpg, "cpu", b, decode="torchvision")
    assert p.staging.numel() == int(jpg.index["nbytes"][largest].sum())
    p.staging.fill_(0xAB)
    for idx in (largest, np.arange(b)[::-1], largest[:2]):  # the buffer is reused: no batch sees an older one
        staged = torch.full((b, IMGSZ, IMGSZ, 3), 7, dtype=torch.uint8)
        jpg.codec.decode(jpg, idx, staged, p.staging)
        assert torch.equal(staged[:len(idx)], _decode(jpg, idx))
        assert torch.equal(staged[len(idx):], torch.full_like(staged[len(idx):], 7))
    assert Prefetcher(jpg, "cpu", b, decode="cv2").staging is None  # decoded on the host: nothing staged
    repeated = np.repeat(largest[-1:], b)  # the largest file b times (a padded batch): more than the buffer holds
    assert jpg.index["nbytes"][repeated].sum() > p.staging.numel()
    staged = torch.full((b, IMGSZ, IMGSZ, 3), 7, dtype=torch.uint8)
    jpg.codec.decode(jpg, repeated, staged, p.staging)
    assert torch.equal(staged, _decode(jpg, repeated))


@pytest.mark.parametrize("sync", [True, False])
def test_loader_stages_every_batch_in_its_buffer(pack, monkeypatch, sync):
    """The loader hands its staging buffer to the decode: each batch's files are gathered into it, not copied apart."""
    from yolofeed.pack.codecs import jpeg

    jpg = pack(IMGSZ, "jpeg")
    staged = []
    real = jpeg.gather_encoded

    def spy(pack, indices, out):
        staged.append((np.array(indices), out))
        return real(pack, indices, out)

    monkeypatch.setattr(jpeg, "gather_encoded", spy)
    p = Prefetcher(jpg, "cpu", 4, sync=sync, decode="torchvision")
    batches = [np.array([0, 5, 9, 2]), np.array([7, 1, 3])]
    got = [b.source.images.clone() for b in p.iterate(batches)]
    assert [list(i) for i, _ in staged] == [list(b) for b in batches]
    assert all(out is p.staging for _, out in staged)
    for images, idx in zip(got, batches):
        ref = _decode(jpg, idx)
        assert all(torch.equal(images[k, :h, :w], ref[k, :h, :w]) for k, (h, w) in enumerate(jpg.shapes[idx].tolist()))


def test_files_too_big_to_pin_are_decoded_unstaged(pack, monkeypatch):
    from yolofeed.pack.codecs import jpeg

    jpg = pack(IMGSZ, "jpeg")
    monkeypatch.setattr(jpeg, "STAGING_MAX", int(np.sort(jpg.index["nbytes"])[-3:].sum()) - 1)
    p = Prefetcher(jpg, "cpu", 3, decode="torchvision")
    assert p.staging is None  # the 3 largest files pass the cap: each is copied on its own
    out = torch.full((3, IMGSZ, IMGSZ, 3), 7, dtype=torch.uint8)
    jpg.codec.decode(jpg, np.arange(3), out, p.staging)
    assert torch.equal(out, _decode(jpg, np.arange(3)))


def test_unknown_decoder_is_a_config_error(pack):
    jpg = pack(IMGSZ, "jpeg")
    with pytest.raises(ConfigError, match="torchvision"):
        Prefetcher(jpg, "cpu", 4, decode="gpu")


def test_a_refused_file_falls_back_to_opencv_and_is_reported_once(pack, monkeypatch, caplog):
    """torchvision's CPU decoder reads CMYK (nvJPEG may not): a decoder that refuses one file stands in."""
    jpg = pack(IMGSZ, "jpeg")
    import torchvision.io

    bad = 3
    bad_bytes = torch.from_numpy(np.array(jpg.encoded(bad)))
    real = torchvision.io.decode_jpeg
    calls = []

    def refusing(data, **kw):
        calls.append(len(data))
        if any(len(t) == len(bad_bytes) and torch.equal(t, bad_bytes) for t in data):
            raise RuntimeError("nvjpegDecodeBatched failed: JPEG not supported")
        return real(data, **kw)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", refusing)
    idx = np.array([0, bad, 5, 9])
    with caplog.at_level(logging.WARNING, logger="yolofeed.pack.codecs.jpeg"):
        for _ in range(2):  # the second time the file goes straight to OpenCV: no batch-wide retry
            calls.clear()
            p = Prefetcher(jpg, "cpu", 4, sync=True, decode="torchvision")
            src = next(iter(p.iterate([idx]))).source
    assert calls == [3]
    h, w = jpg.shapes[bad]
    assert torch.equal(src.images[1, :h, :w], _cv2(jpg, [bad])[0, :h, :w])  # OpenCV's own pixels
    d = _diffs(src.images, _cv2(jpg, idx), jpg.shapes[idx])
    assert d.max() <= CPU_MAX
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and jpg.im_files[bad] in warnings[0].getMessage()


def _cmyk_jpeg(h=72, w=96) -> np.ndarray:
    rng = np.random.default_rng(1)
    im = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).convert("CMYK")
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90)
    return np.frombuffer(buf.getvalue(), np.uint8)


def _placements(device: str, seed: int = 0):
    """Decoded-like CHW images of every kind of size pair, some slots left out (refused files), and the torch path's
    result: slots out of order in a batch view of a larger buffer, padding 7."""
    g = torch.Generator().manual_seed(seed)
    pairs = {0: ((48, 64), (48, 64)), 2: ((60, 80), (48, 64)), 5: ((30, 40), (48, 64)), 1: ((64, 48), (64, 48)),
             4: ((50, 50), (64, 64)), 6: ((64, 36), (64, 36)), 3: ((81, 99), (52, 64)), 8: ((1, 1), (3, 5)),
             9: ((40, 64), (40, 30)), 10: ((20, 33), (48, 33))}  # 9, 10: one side kept, the other resized
    images = {k: torch.randint(0, 256, (3, *src), generator=g, dtype=torch.uint8).to(device)
              for k, (src, _) in pairs.items()}
    hw = [pairs.get(k, (None, (10, 10)))[1] for k in range(11)]  # 7: no image (a refused file), left as it was
    buf = torch.full((13, 64, 64, 3), 7, dtype=torch.uint8, device=device)
    ref = buf.clone()
    decode.place(images, hw, ref[:11])
    return images, hw, buf, ref, [k for k, (src, dst) in pairs.items() if src == dst]


@pytest.mark.slow
def test_place_kernel_equals_the_torch_ops_in_the_interpreter():
    """``place_triton`` under Triton's interpreter (a subprocess): the torch path's pixels, nothing written outside."""
    pytest.importorskip("triton")
    code = textwrap.dedent(f"""
        import sys, torch; sys.path[:0] = [{os.path.dirname(__file__)!r}, {str(Path(__file__).parents[1])!r}]
        from test_codecs_jpeg import _placements
        from yolofeed.kernels import place_triton
        images, hw, buf, ref, kept = _placements("cpu")
        place_triton.place(images, hw, buf[:11])
        d = (buf.int() - ref.int()).abs()
        print(int(d.max()), int((d > 0).sum()), int(d[kept].max()), int((buf[11:] != 7).sum()))
    """)
    env = os.environ | {"TRITON_INTERPRET": "1", "YOLO_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    worst, differ, worst_kept, outside = map(int, r.stdout.split()[-4:])
    # Both sides in float32 without fused multiply-adds here, but not in the same order of operations: a blend that
    # lands next to a half may round the other way (33 of the ~60,000 values). A rounding off by one in the kernel
    # (halves up, or floor) moves 256 or thousands.
    print(f"interpreter vs torch: {differ} values differ, by at most {worst}")
    assert worst <= 1 and differ <= 64 and worst_kept == 0 and outside == 0  # padding, refused slot: compared too


# -- CUDA: run on the device machine -----------------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_place_kernel_equals_the_torch_ops(pack, monkeypatch):
    """One kernel for the batch (CUDA) against the torch ops (a copy per image, a resize per group), on random
    images and on nvJPEG's decode of the pack: within a level where resized (fma), exact where kept."""
    assert decode.triton_kernels() is not None
    images, hw, buf, ref, kept = _placements("cuda")
    decode.place(images, hw, buf[:11])  # CUDA: the kernel
    d = (buf.int() - ref.int()).abs()
    assert d.max() <= 1 and d[kept].max() == 0 and (buf[11:] == 7).all()
    with pytest.raises(ValueError, match="do not fit a batch"):
        decode.place(images, hw, buf[:10])  # slot 10 is past the batch: refused, where the kernel would write on
    jpg = pack(IMGSZ, "jpeg")
    idx = np.arange(len(jpg))
    ours = _decode(jpg, idx, "cuda")
    monkeypatch.setattr(decode, "triton_kernels", lambda: None)
    torch_ops = _decode(jpg, idx, "cuda")
    d = (ours.int() - torch_ops.int()).abs()
    kept = torch.from_numpy((jpg.ori_shapes == jpg.shapes).all(1))
    assert d.max() <= 1 and d[kept].max() == 0


@pytest.mark.gpu
def test_cuda_decode_equals_cv2_within_three_levels(pack):
    """nvJPEG vs libjpeg-turbo: mean < 3 levels; the tail is at colour edges (chroma upsampling)."""
    jpg = pack(IMGSZ, "jpeg")
    idx = np.arange(len(jpg))
    ours = _decode(jpg, idx, "cuda")
    d = _diffs(ours, _cv2(jpg, idx), jpg.shapes)
    print(f"nvJPEG vs cv2: mean {d.mean():.3f}, p99.9 {np.percentile(d, 99.9):.1f}, max {d.max()}")
    assert d.mean() < GPU_MEAN
    assert np.percentile(d, 99.9) <= GPU_P999
    assert torch.equal(ours.cpu(), _decode(jpg, idx, "cuda").cpu())  # deterministic
    # a CMYK file in the batch: decoded by nvJPEG if it can, else by OpenCV; either way the right pixels
    enc = [jpg.encoded(0), _cmyk_jpeg()]
    out = torch.zeros((2, IMGSZ, IMGSZ, 3), dtype=torch.uint8, device="cuda")
    decode_into(enc, np.array([jpg.shapes[0], (120, 160)]), out)
    import cv2

    ref = cv2.cvtColor(cv2.resize(cv2.imdecode(enc[1], cv2.IMREAD_COLOR), (160, 120)), cv2.COLOR_BGR2RGB)
    assert np.abs(out[1, :120, :160].cpu().numpy().astype(int) - ref).mean() < GPU_MEAN


@pytest.mark.gpu
@pytest.mark.parametrize("side", [False, True])
def test_cuda_decode_never_overwrites_memory_the_stream_still_reads(pack, side):
    """pytorch/vision#9606: nvJPEG writes freed blocks that queued kernels still read, unless we drain first.

    Each round: tensors the size of the decoder's outputs hold known values; a long matmul chain is
    queued, then one sum per tensor; the tensors are freed while the sums are queued (their blocks go
    back to the allocator); then the decode runs. A decoder that wrote a recycled block before the sums
    ran changes a sum; the decode itself must equal the first round's.
    """
    jpg = pack(IMGSZ, "jpeg")
    dev = torch.device("cuda")
    idx = np.arange(len(jpg))
    sizes = [3 * int(h) * int(w) for h, w in jpg.ori_shapes]  # decoder outputs: (3, h0, w0) uint8
    stream = torch.cuda.Stream(dev) if side else torch.cuda.current_stream(dev)
    a = torch.randn(4096, 4096, device=dev) / 64
    first, wrong = None, 0
    with torch.cuda.stream(stream):
        for it in range(50):
            xs = [torch.full((n,), (it + k) % 250 + 1, dtype=torch.uint8, device=dev) for k, n in enumerate(sizes)]
            expect = torch.tensor([((it + k) % 250 + 1) * n for k, n in enumerate(sizes)])
            torch.cuda.synchronize(dev)
            b = a
            for _ in range(6):  # ~10 ms of queued work ahead of the sums
                b = b @ a
            sums = torch.stack([x.sum(dtype=torch.int64) for x in xs])
            del xs
            out = _decode(jpg, idx, dev, fill=0)
            wrong += int((sums.cpu() != expect).sum())
            first = out.cpu() if first is None else first
            assert torch.equal(out.cpu(), first), f"round {it}: the decode changed"
    assert wrong == 0, f"{wrong} sums changed: the decoder wrote memory queued kernels still read"


@pytest.mark.gpu
def test_cuda_loader_jpeg_batches_equal_raw_batches_within_tolerance(pack):
    jpg = pack(IMGSZ, "jpeg")
    raw = pack(IMGSZ)
    for sync in (True, False):
        a = TrainLoader(raw, 6, "cuda", seed=4, sync=sync)
        b = TrainLoader(jpg, 6, "cuda", seed=4, sync=sync)  # auto: torchvision (nvJPEG) on CUDA
        assert b.prefetcher.on_device and b.prefetcher.staging.is_pinned()  # nvJPEG's reads do not block
        for x, y in zip(a, b):
            assert np.array_equal(x["indices"], y["indices"])
            sx, sy = x["source"], y["source"]
            assert torch.equal(sx.hw, sy.hw) and torch.equal(sx.cls, sy.cls) and torch.equal(sx.valid, sy.valid)
            d = _diffs(sx.images, sy.images, sx.hw.cpu())
            print(f"nvJPEG through the loader vs the raw pack: mean {d.mean():.3f}, p99.9 {np.percentile(d, 99.9):.1f}")
            assert d.mean() < GPU_MEAN and np.percentile(d, 99.9) <= GPU_P999


# JPEG encodings a user's set may hold, each kept byte for byte in a jpeg pack: chroma 4:2:0, 4:4:0 and 4:1:1, Adobe's
# RGB (no colour transform), one grey channel, progressive; made of one picture with sharp colour edges and noise
ODD_JPEGS = ("ycc420", "cv440", "cv411", "adobe_rgb", "gray", "progressive")


@pytest.fixture(scope="module")
def odd_jpegs(tmp_path_factory) -> Pack:
    import cv2

    root = tmp_path_factory.mktemp("odd_jpegs")
    rng = np.random.default_rng(1)
    h, w = 180, 240
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h) + 60], -1)
    for _ in range(6):
        y0, x0 = rng.integers(0, h - 20), rng.integers(0, w - 20)
        rgb[y0:y0 + rng.integers(10, 90), x0:x0 + rng.integers(10, 120)] = rng.integers(0, 255, 3)
    rgb = np.clip(rgb + rng.normal(0, 6, rgb.shape), 0, 255).astype(np.uint8)
    picture = Image.fromarray(rgb)

    def pil(image, **kw) -> bytes:
        f = io.BytesIO()
        image.save(f, "JPEG", quality=90, **kw)
        return f.getvalue()

    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    encoded = {"ycc420": pil(picture), "adobe_rgb": pil(picture, keep_rgb=True), "gray": pil(picture.convert("L")),
               "progressive": pil(picture, progressive=True)}
    for name, factor in (("cv440", cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440),
                         ("cv411", cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411)):
        encoded[name] = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
                                                   factor])[1].tobytes()
    for folder in ("images", "labels"):
        (root / folder / "train").mkdir(parents=True)
    for name in ODD_JPEGS:
        (root / "images" / "train" / f"{name}.jpg").write_bytes(encoded[name])
        (root / "labels" / "train" / f"{name}.txt").write_text("0 0.5 0.5 0.3 0.3\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/train\nnames: [a]\n")
    return _build(root, imgsz=256, storage="jpeg", workers=1)


ENCODED_AS = {"ycc420": {"layers": [(1, 2, 2), (2, 1, 1), (3, 1, 1)]},  # Pillow's (id, h, v) sampling per component
              "cv440": {"layers": [(1, 1, 2), (2, 1, 1), (3, 1, 1)]},
              "cv411": {"layers": [(1, 4, 1), (2, 1, 1), (3, 1, 1)]},
              "adobe_rgb": {"adobe_transform": 0}, "gray": {"mode": "L"}, "progressive": {"progressive": 1}}


def test_odd_jpeg_encodings_are_kept_and_decode_as_cv2_decodes_them(odd_jpegs):
    """Each encoding as named, its bytes kept in the pack, and torchvision's decode within a level of OpenCV's and of
    Pillow's decode of the source, resized as Ultralytics resizes."""
    import cv2

    assert sorted(Path(f).stem for f in odd_jpegs.im_files) == sorted(ODD_JPEGS) and not odd_jpegs.header["notes"]
    for k, f in enumerate(odd_jpegs.im_files):
        source = Image.open(f)
        facts = {"layers": [tuple(layer[:3]) for layer in getattr(source, "layer", [])], "mode": source.mode,
                 **source.info}
        assert all(facts.get(key) == value for key, value in ENCODED_AS[Path(f).stem].items()), (f, facts)
        assert bytes(odd_jpegs.encoded(k)) == Path(f).read_bytes(), f
        ours = _decode(odd_jpegs, [k])
        d = _diffs(ours, _cv2(odd_jpegs, [k]), odd_jpegs.shapes[[k]])
        assert d.max() <= CPU_MAX and d.mean() < CPU_MEAN, (f, d.max(), d.mean())
        h, w = odd_jpegs.shapes[k].tolist()
        pillow = cv2.resize(np.asarray(source.convert("RGB")), (w, h), interpolation=cv2.INTER_LINEAR)
        assert np.abs(ours[0, :h, :w].numpy().astype(int) - pillow).mean() < CPU_MEAN, f


@pytest.mark.gpu
def test_cuda_decodes_odd_jpeg_encodings_as_cv2_does_within_its_bound(odd_jpegs):
    """nvJPEG (or the host fallback for a file it refuses) on each encoding, alone and in one batch: within the GPU
    bound of OpenCV's pixels, and a batch's images as each alone."""
    idx = np.arange(len(odd_jpegs))
    batch = _decode(odd_jpegs, idx, "cuda")
    for k in idx:
        alone = _decode(odd_jpegs, [k], "cuda")
        d = _diffs(alone, _cv2(odd_jpegs, [k]), odd_jpegs.shapes[[k]])
        print(f"{Path(odd_jpegs.im_files[k]).stem}: nvJPEG vs cv2 mean {d.mean():.3f}, p99.9 "
              f"{np.percentile(d, 99.9):.1f}, max {d.max()}")
        assert d.mean() < GPU_MEAN and np.percentile(d, 99.9) <= GPU_P999, odd_jpegs.im_files[k]
        assert torch.equal(batch[k:k + 1].cpu(), alone.cpu()), odd_jpegs.im_files[k]
