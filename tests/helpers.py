"""Test helpers: Ultralytics' own view of a dataset, a zoo of bad samples, batches for the augmentation, a
guard against host syncs, real tmpfs mounts, a disk with the free space a test says, and packs taken apart and
crafted. Shared by test modules, which never import one another."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from yolofeed.pack.disk import Disk
from yolofeed.pack.layout import MAGIC, TRAILER

GOOD_LABEL = "3 0.5 0.5 0.25 0.25\n"


class FakeClock:
    """A clock tests move by hand: timing logic is tested without timing anything."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def ultralytics_dataset(yaml_file: Path, split: str, imgsz: int, classes=None, single_cls: bool = False):
    """Ultralytics' YOLODataset for a split, without augmentation: its labels and load_image are the reference."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    data = check_det_dataset(str(yaml_file), autodownload=False)
    return YOLODataset(img_path=data[split], imgsz=imgsz, augment=False, data=data, hyp=get_cfg(),
                       batch_size=4, rect=False, classes=classes, single_cls=single_cls)


# The OpenCV release whose warpAffine/warpPerspective arithmetic ``kernels.warp`` reproduces bit for bit (its float
# path: float32 coordinates, fused lerps, round half to even); the test extra pins it. Other releases round otherwise
# (``kernels.warp`` says by how much), within these bounds.
WARP_EXACT_OPENCV = "5.0."
WARP_LEVELS = {"5": 1, "4": 4}  # OpenCV major release -> the most levels a value may differ by


def assert_warp_equal(ours: np.ndarray, theirs: np.ndarray) -> None:
    """An image warped by yolofeed equals OpenCV's: exactly under ``WARP_EXACT_OPENCV``, else within its release's
    bound."""
    if cv2.__version__.startswith(WARP_EXACT_OPENCV):
        np.testing.assert_array_equal(ours, theirs)  # exact, seams and borders included
    else:
        most = WARP_LEVELS.get(cv2.__version__.split(".")[0], 0)
        diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
        assert diff.max() <= most, f"OpenCV {cv2.__version__}: warps differ by {diff.max()} levels (at most {most})"


# tmpfs folders mounted by tests that mean one (``tmpfs``); elsewhere the build is told it writes to a disk (conftest)
TMPFS_MOUNTS: list[Path] = []


class OnDisk(Disk):
    """The real file system, where only the tmpfs a test mounts (``tmpfs``) is one: builds take the same write path
    wherever pytest's temporary folder lies (a tmpfs on some systems). Tests' failing disks subclass it."""

    def in_memory(self, folder: Path) -> bool:
        return any(Path(os.path.realpath(folder)).is_relative_to(m) for m in TMPFS_MOUNTS) and super().in_memory(folder)


class Free(OnDisk):
    """A disk that says ``nbytes`` are free, whatever it has."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def free(self, folder: Path) -> int:
        return self.nbytes


def pack_parts(path: Path) -> tuple[bytearray, dict, int]:
    """A pack file's bytes, its header and the header's offset."""
    data = bytearray(path.read_bytes())
    _, _, off, n = TRAILER.unpack(bytes(data[-TRAILER.size:]))
    return data, json.loads(bytes(data[off:off + n])), off


def craft_pack(path: Path, out: Path, sections: dict[str, bytes] | None = None, header: dict | None = None,
               blob: bytes | None = None) -> None:
    """Write a copy of a pack with sections replaced (same sizes) and every checksum made right again:
    what a writer bug or a foreign tool would produce, which checksums alone cannot catch."""
    data, h, off = pack_parts(path)
    for name, content in (sections or {}).items():
        s_off, s_len = h["sections"][name]
        assert len(content) == s_len
        data[s_off:s_off + s_len] = content
        h["checksums"][name] = zlib.crc32(content)
    h = header(h) if callable(header) else h
    blob = json.dumps(h).encode() if blob is None else blob
    out.write_bytes(bytes(data[:off]) + blob + TRAILER.pack(MAGIC, zlib.crc32(blob), off, len(blob)))


@contextlib.contextmanager
def tmpfs(folder: Path, size: str):
    """A real tmpfs of ``size`` mounted at ``folder`` (made here), where mounting is allowed (root); skips elsewhere."""
    folder.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                                        str(folder)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root); the simulated disk-full tests cover the logic")
    TMPFS_MOUNTS.append(folder.resolve())
    try:
        yield folder
    finally:
        TMPFS_MOUNTS.remove(folder.resolve())
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def copy_dataset(src: Path, dst: Path) -> Path:
    """Copy a dataset folder, rewriting its data.yaml to point at the copy."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("yolofeed-packs", "*.cache"))
    text = (dst / "data.yaml").read_text().replace(str(src), str(dst))
    (dst / "data.yaml").write_text(text)
    return dst


def _jpeg(h=60, w=80, seed=0, **save) -> bytes:
    import io

    rng = np.random.default_rng(seed)
    im = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def _png(arr: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", arr)
    assert ok
    return buf.tobytes()


def _jpeg2000() -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(21).integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(buf, "JPEG2000")
    return buf.getvalue()


def _rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[274] = 6  # rotate 90 degrees clockwise to view
    return _jpeg(40, 90, seed=5, exif=exif.tobytes())


# name -> (image bytes, label text or None for no label file, kept by Ultralytics? (a bool, or a function of the
# installed release's LabelRules where the releases of the range differ), words the reason must contain)
BAD_CASES: dict[str, tuple[bytes, str | None, bool, str]] = {
    "garbage.jpg": (b"hello world" * 100, GOOD_LABEL, False, "not"),
    "empty.jpg": (b"", GOOD_LABEL, False, "empty file (0 bytes)"),
    "half.jpg": (_jpeg(seed=1)[:900], GOOD_LABEL, False, "truncated"),
    "trailing.jpg": (_jpeg(seed=2) + b"trailing junk", GOOD_LABEL, True, ""),
    "rotated.jpg": (_rotated_jpeg(), GOOD_LABEL, True, ""),
    "tiny.png": (_png(np.zeros((8, 8, 3), np.uint8)), GOOD_LABEL, False, "10 px"),
    "plain.png": (_png(np.random.default_rng(3).integers(0, 255, (50, 70, 3), dtype=np.uint8)), GOOD_LABEL, True, ""),
    "gray.png": (_png(np.random.default_rng(4).integers(0, 255, (50, 70), dtype=np.uint8)), GOOD_LABEL, True, ""),
    "deep.png": (_png(np.random.default_rng(6).integers(0, 65535, (50, 70, 3), dtype=np.uint16)), GOOD_LABEL, True,
                 ""),
    "bitmap.bmp": (cv2.imencode(".bmp", np.full((30, 40, 3), 90, np.uint8))[1].tobytes(), GOOD_LABEL, True, ""),
    "cls_range.jpg": (_jpeg(seed=7), "85 0.5 0.5 0.2 0.2\n", False,
                      "nc=80 (classes 0-79); fix the label, or add the class to the yaml's names"),
    "pixels.jpg": (_jpeg(seed=8), "1 320 240 50 50\n", False, "normalised"),
    "negative.jpg": (_jpeg(seed=9), "1 -0.2 0.5 0.1 0.1\n", False, "negative values (-0.2); fix those rows"),
    "nan.jpg": (_jpeg(seed=10), "1 nan 0.5 0.1 0.1\n", False, "NaN"),
    "inf.jpg": (_jpeg(seed=10), "1 0.5 inf 0.1 0.1\n", False, "infinite"),
    "cols.jpg": (_jpeg(seed=11), "1 0.5 0.5 0.1\n", False, "columns"),
    "text.jpg": (_jpeg(seed=12), "person 0.5 0.5 0.1 0.1\n", False, "'person', which is not a number"),
    "frac.jpg": (_jpeg(seed=13), "1.5 0.5 0.5 0.1 0.1\n", lambda r: not r.integer_classes,
                 "non-integer class ids (1.5)"),
    "ragged.jpg": (_jpeg(seed=14), "1 0.5 0.5 0.1 0.1\n2 0.5 0.5 0.1\n", False,
                   "row 2 ('2 0.5 0.5 0.1') has 4 values"),
    "mixed.jpg": (_jpeg(seed=15), "2 0.1 0.1 0.4 0.1 0.4 0.5 0.1 0.5\n1 0.5 0.5 0.1 0.1\n", False, "mixes"),
    "dupes.jpg": (_jpeg(seed=16), "5 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n5 0.5 0.5 0.2 0.2\n", True, ""),
    "segment.jpg": (_jpeg(seed=17), "2 0.1 0.1 0.4 0.1 0.4 0.5 0.1 0.5\n", True, ""),
    "empty_label.jpg": (_jpeg(seed=18), "", True, ""),
    "no_label.jpg": (_jpeg(seed=19), None, True, ""),
    "bom_label.jpg": (_jpeg(seed=20), "\ufeff4 0.5 0.5 0.3 0.3\n", lambda r: r.encoding == "utf-8-sig",
                      "which is not a number"),
    "blank_line.jpg": (_jpeg(seed=22), "1 0.5 0.5 0.1 0.1\n \n2 0.3 0.3 0.1 0.1\n", lambda r: r.blank_lines,
                       "row 2 is blank"),
    "thin.jpg": (_jpeg(seed=23), "1 0.5 0.5 -0.005 0.1\n", lambda r: not r.negative_sizes, "negative"),
    "picture.jp2": (_jpeg2000(), GOOD_LABEL, lambda r: r.jpeg2000, "format"),
}


def kept(name: str, rules=None) -> bool:
    """Whether Ultralytics keeps a case of BAD_CASES, under ``rules`` (default: the installed release's)."""
    from yolofeed.ultralytics_seam import LABEL_RULES

    keep = BAD_CASES[name][2]
    return keep(rules or LABEL_RULES) if callable(keep) else keep


def add_bad_samples(root: Path, split: str = "train") -> dict[str, str]:
    """Write every case of BAD_CASES into a dataset split; returns name -> image path."""
    paths = {}
    for name, (data, label, _, _) in BAD_CASES.items():
        img = root / "images" / split / name
        img.write_bytes(data)
        lb = root / "labels" / split / (img.stem + ".txt")
        if label is not None:
            lb.write_text(label, encoding="utf-8")
        paths[name] = str(img)
    return paths


def source_batch(pack, indices, device="cpu"):
    """A yolofeed SourceBatch of pack samples (what the loader will deliver), for augmentation tests."""
    import torch

    from yolofeed.schema import SourceBatch

    n, s = len(indices), pack.imgsz
    images = torch.zeros((n, s, s, 3), dtype=torch.uint8)
    hw = torch.from_numpy(pack.codec.gather(pack, np.asarray(indices, np.int64), images))
    labels = [np.array(pack.labels(i)) for i in indices]
    width = max(1, max(len(lb) for lb in labels))
    cls, boxes = torch.zeros(n, width), torch.zeros(n, width, 4)
    valid = torch.zeros(n, width, dtype=torch.bool)
    for k, lb in enumerate(labels):
        cls[k, :len(lb)], boxes[k, :len(lb)] = torch.from_numpy(lb[:, 0]), torch.from_numpy(lb[:, 1:])
        valid[k, :len(lb)] = True
    return SourceBatch(images.to(device), hw.to(device), cls.to(device), boxes.to(device), valid.to(device))


def random_augmented(b: int, k: int, p: float, seed: int, device: str = "cpu"):
    """An ``AugmentedBatch`` of b blank 128-px images with k box slots each, a slot valid with probability p.

    Shape:
        img: (b, 3, 128, 128) uint8; cls: (b, k); boxes: (b, k, 4) xyxy pixels; valid: (b, k) bool.
    """
    import torch

    from yolofeed.schema import AugmentedBatch

    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(b, k, 2, generator=g) * 100
    boxes = torch.cat([xy, xy + torch.rand(b, k, 2, generator=g) * 28], -1)
    valid = torch.rand(b, k, generator=g) < p
    cls = torch.randint(0, 80, (b, k), generator=g).float()
    out = AugmentedBatch(torch.zeros(b, 3, 128, 128, dtype=torch.uint8), cls, boxes, valid)
    return AugmentedBatch(*(t.to(device) for t in (out.img, out.cls, out.boxes, out.valid)))


def to_device(obj, device):
    """A tensor, or a dataclass of tensors (augmentation parameters), on ``device``; anything else as is."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj):
        return type(obj)(**{f.name: to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj)})
    return obj


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Inside the block, any CUDA call that waits for the GPU raises (``torch.cuda.set_sync_debug_mode("error")``).

    The work queued before the block is finished first, so that nothing launched earlier is charged to it.
    """
    import torch

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def compare_with_reference(pack, device: str, configs: list[dict], n: int = 8) -> list[tuple[int, float]]:
    """The augmentation's kernels on ``device`` against the CPU torch reference, given the same draws.

    On a CPU ``device`` the Triton kernels run anyway (under Triton's interpreter: the caller sets
    ``TRITON_INTERPRET=1``). Boxes and validity must agree; pixels are compared by the caller.

    Returns:
        Per config: (largest absolute pixel difference, fraction of pixels identical).
    """
    import torch

    from yolofeed.augment import AugmentHyp, GpuAugment, pipeline

    batch = source_batch(pack, list(range(n)))
    results = []
    for kw in configs:
        aug = GpuAugment(AugmentHyp(imgsz=pack.imgsz, **kw))
        params = aug.sample(n, torch.Generator().manual_seed(5))
        ref = aug.apply(batch, params)
        dev_batch = type(batch)(*(t.to(device) for t in (batch.images, batch.hw, batch.cls, batch.boxes, batch.valid)))
        dev_params = to_device(params, device)
        if device == "cpu":  # force the Triton path on CPU tensors (interpreter)
            from yolofeed.kernels import compose_triton, warp_triton
            from yolofeed.kernels.warp import BORDER

            orig_w, orig_c = pipeline.warp, pipeline.compose
            pipeline.warp = lambda *a, paste=None: warp_triton.warp(*a, BORDER, paste=paste)
            pipeline.compose = compose_triton.compose
            try:
                got = aug.apply(dev_batch, dev_params)
            finally:
                pipeline.warp, pipeline.compose = orig_w, orig_c
        else:
            got = aug.apply(dev_batch, dev_params)
        d = (got.img.cpu().int() - ref.img.int()).abs()
        assert torch.equal(got.valid.cpu(), ref.valid)
        torch.testing.assert_close(got.boxes.cpu()[ref.valid], ref.boxes[ref.valid], atol=1e-3, rtol=0)
        results.append((int(d.max()), float((d == 0).float().mean())))
    return results


@contextlib.contextmanager
def world_readable_dir() -> Iterator[Path]:
    """A folder under ``/tmp`` that every user may read (pytest's own folders are 0700, closed to another user)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="yolofeed-shared-"))
    try:
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


NOBODY = 65534


def as_another_user(fn, *args):
    """``fn(*args)`` in a forked child running as user nobody, where this process is root (root reads and writes
    files of mode 000, so only another user meets a real permission error); as this user elsewhere, where a mode
    000 file refuses its owner too. Returns ``fn``'s result; its exception comes back as ``(type name, message)``."""
    import multiprocessing as mp
    import os

    def child(conn):
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            conn.send(("ok", fn(*args)))
        except BaseException as e:  # sent back whole: the test reads it
            conn.send(("error", (type(e).__name__, str(e))))
        finally:
            conn.close()

    ours, theirs = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=child, args=(theirs,))
    proc.start()
    theirs.close()
    if not ours.poll(120):
        proc.kill()
        pytest.fail("the other user's process gave no answer within 120 s (a hang)")
    kind, value = ours.recv()
    proc.join(30)
    return value if kind == "ok" else ("raised", *value)


def cli_lines(argv: list[str]) -> tuple[int, list[str]]:
    """``yolofeed`` run in this process: its exit status and the non-empty lines it wrote to stderr."""
    import io
    import sys

    from yolofeed.cli import main

    err, real = io.StringIO(), sys.stderr
    sys.stderr = err
    try:
        rc = main(argv)
    finally:
        sys.stderr = real
    return rc, [x for x in err.getvalue().splitlines() if x.strip()]


def within(seconds: float, fn):
    """fn(), or a test failure if it has not returned after ``seconds`` (a hang)."""
    import threading

    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds} s: a hang"
    if "error" in out:
        raise out["error"]
    return out["value"]


# -- a train pack at 64 px under out=, and files planted where it goes (tests/pack: disk, files, lock, rebuild, report)
VICTIM = b"precious: not yolofeed's\n"  # a file yolofeed did not write: it must survive


def build_out(yaml_file, out, **kw):
    """The train pack at 64 px under ``out=``."""
    from yolofeed.pack import open_or_build

    kw = {"rebuild": "auto", "workers": 1, "progress": False, **kw}
    return open_or_build(yaml_file, "train", 64, "raw", out=out, **kw)


def pack_args(yaml_file, out) -> list[str]:
    """``yolofeed pack``'s arguments for the same pack."""
    return ["pack", f"data={yaml_file}", "imgsz=64", "format=raw", "splits=train", "workers=1", f"out={out}"]


def planted_folder(yaml_file, out):
    """The folder the train pack of ``out=`` goes to, made (so that files can be planted in it first)."""
    from yolofeed.pack.paths import store_dir

    folder = store_dir(yaml_file, 64, "raw", out)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _pose_trained() -> bool:
    from yolofeed import ultralytics_seam as seam

    return seam.RELEASE >= seam.parse_version(seam.POSE_SINCE)


POSE_TRAINED = _pose_trained()  # the installed Ultralytics is one whose pose rules yolofeed follows (seam.check_task)


class WhenWaiting:
    """A thread that runs ``then()`` once the main thread waits (an Event's or a lock's ``wait``) inside a call of
    ``name``; never earlier, since a signal sent before the test's ``pytest.raises`` would escape the test and stop the
    pytest session. ``missed`` says the wait was not seen within ``seconds`` (``then`` was not run): the test fails."""

    def __init__(self, name: str, then, seconds: float = 10.0):
        import threading

        self.missed = False
        self._thread = threading.Thread(target=self._watch, args=(name, then, seconds), daemon=True)
        self._thread.start()

    def _watch(self, name: str, then, seconds: float) -> None:
        import sys
        import threading
        import time

        main, deadline = threading.main_thread().ident, time.monotonic() + seconds
        while time.monotonic() < deadline:
            frame, names = sys._current_frames().get(main), []
            while frame is not None:
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            if name in names and names[0] == "wait":
                then()
                return
            time.sleep(0.01)
        self.missed = True

    def join(self, seconds: float = 15.0) -> None:
        self._thread.join(seconds)
