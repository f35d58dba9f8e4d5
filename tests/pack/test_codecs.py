"""The format seam (pack/codecs/__init__.py): the codec registry, a format added by a test alone (no other module
touched), the sizes every format's index must hold, and ``choose``, the rule ``pack_format=auto`` applies.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import craft_pack
from yolofeed.cli import build_config, help_text
from yolofeed.config import DEFAULT_PACK_FORMAT, PACK_FORMATS, fields_of
from yolofeed.errors import ConfigError, PackError
from yolofeed.loader import TrainLoader
from yolofeed.pack import Pack, codecs, open_or_build
from yolofeed.pack.layout import INDEX_DTYPE
from yolofeed.pack.verify import ImageInfo

IMGSZ = 64


def _build(root: Path, imgsz: int = 64, workers: int = 1, **kw) -> Pack:
    return open_or_build(root / "data.yaml", "train", imgsz, rebuild="auto", workers=workers, progress=False, **kw)


class Inverted(codecs.Codec):
    """A test-only format: raw pixels stored as 255 - value, inverted back on the "device" (or on the host).

    It uses only the codec interface and public helpers: if building, opening, verifying or loading needed a
    change anywhere else for a new format, this test could not pass without it.
    """

    name = "inverted"
    summary = "raw pixels, each value stored as 255 - value"

    def __init__(self, on_device: bool):
        self.on_device = on_device

    def encode(self, im_file: str, info: ImageInfo, imgsz: int, notes: list[str]):
        rgb, ori_hw, hw = codecs.get("raw").encode(im_file, info, imgsz, notes)
        notes.append("stored inverted")
        return 255 - rgb, ori_hw, hw

    def payload_estimate(self, im_file: str, imgsz: int) -> int:
        return codecs.get("raw").payload_estimate(im_file, imgsz)

    def gather(self, pack, indices, out):
        hw = codecs.get("raw").gather(pack, indices, out)
        buf = out.numpy() if hasattr(out, "numpy") else out
        for k, (h, w) in enumerate(hw.tolist()):
            np.subtract(255, buf[k, :h, :w], out=buf[k, :h, :w])
        return hw

    def decodes_on_device(self, device, decode):
        return self.on_device

    def decode(self, pack, indices, out, staging=None):
        for k, i in enumerate(indices.tolist()):
            h, w = (int(v) for v in pack.shapes[i])
            stored = torch.from_numpy(np.array(pack.encoded(i))).view(h, w, 3).to(out.device)
            out[k, :h, :w] = 255 - stored


@pytest.fixture(params=[True, False], ids=["device-decode", "host-gather"])
def inverted(request):
    codec = codecs.register(Inverted(on_device=request.param))
    yield codec
    codecs.unregister(codec.name)


def test_the_registry_names_every_format_once_default_first():
    names = codecs.names()
    assert names[0] == codecs.DEFAULT and DEFAULT_PACK_FORMAT == codecs.AUTO  # config.py keeps it without importing us
    assert codecs.choices() == (codecs.AUTO, *names) and codecs.COMPACT in names
    assert len(set(names)) == len(names) and set(codecs.BUILTIN) <= set(names)
    for name in names:
        assert codecs.get(name).name == name and codecs.summaries()[name]
    with pytest.raises(PackError, match=f"format=webp: expected one of {', '.join(names)}"):
        codecs.get("webp")
    assert codecs.find("webp") is None and codecs.find(3) is None
    with pytest.raises(ValueError, match="taken"):
        codecs.register(type(codecs.get(codecs.DEFAULT))())
    with pytest.raises(ValueError, match="not alphanumeric"):
        codecs.register(type("Slash", (codecs.Codec,), {"name": "a/b"})())
    with pytest.raises(ValueError, match="taken"):  # auto names the choice, not a format
        codecs.register(type("Auto", (codecs.Codec,), {"name": codecs.AUTO})())


@pytest.mark.parametrize("command, args", [
    ("pack", ["data=x.yaml"]),
    ("train", ["model=yolo11n.yaml", "data=x.yaml"]),
    ("parity", ["data=x.yaml"]),
])
def test_format_keys_accept_exactly_the_registry_and_list_it(command, args):
    name = next(f.name for f in fields_of(build_config(command, args).__class__)
                if f.metadata.get("choices") == PACK_FORMATS)
    for fmt in codecs.choices():  # auto, then every format
        assert getattr(build_config(command, [*args, f"{name}={fmt}"]), name) == fmt
    assert getattr(build_config(command, args), name) == codecs.AUTO  # the default
    with pytest.raises(ConfigError) as e:
        build_config(command, [*args, f"{name}=webp"])
    assert f"{name}=webp: expected one of {', '.join(codecs.choices())}" in str(e.value)
    line = next(x for x in help_text(command).splitlines() if x.strip().startswith(f"{name}="))
    for fmt, summary in codecs.summaries().items():
        assert f"{fmt}: {summary}" in line


def test_a_format_added_by_one_module_builds_opens_verifies_and_loads(synth_root, pack, inverted, tmp_path):
    raw = pack(IMGSZ)
    built = open_or_build(synth_root / "data.yaml", "train", IMGSZ, inverted.name, out=tmp_path, rebuild="auto",
                          progress=False, workers=1)
    assert built.codec is inverted and built.format == inverted.name
    again = open_or_build(synth_root / "data.yaml", "train", IMGSZ, inverted.name, out=tmp_path, rebuild="never",
                          verify=True)  # reopened by its header's name, every payload's checksum read back
    assert again.path == built.path and again.im_files == raw.im_files
    np.testing.assert_array_equal(again.shapes, raw.shapes)
    for i in range(len(raw)):  # the bytes are the test codec's, not raw's: its encode ran
        np.testing.assert_array_equal(255 - again.encoded(i), raw.encoded(i))
    assert all(note == "stored inverted" for _, note in again.header["notes"])
    with pytest.raises(PackError, match="not pixels"):
        again.image(0)
    for sync in (True, False):
        batches = zip(TrainLoader(raw, 5, "cpu", seed=2, sync=True), TrainLoader(again, 5, "cpu", seed=2, sync=sync))
        for a, b in batches:
            assert np.array_equal(a["indices"], b["indices"])
            for k, (h, w) in enumerate(raw.shapes[a["indices"]].tolist()):
                assert torch.equal(a["source"].images[k, :h, :w], b["source"].images[k, :h, :w])
            assert torch.equal(a["source"].boxes, b["source"].boxes)


def test_the_format_names_appear_only_in_the_codec_modules():
    """Every other module asks the registry: a literal format name elsewhere is a branch the seam missed."""
    src = Path(codecs.__file__).parents[2]
    # config.py: the default, kept equal to the registry's above; bench/modes.py: the yolofeed_jpeg mode measures
    # that one format by name, as a user would choose it
    allowed = {Path(codecs.__file__).parent, src / "config.py", src / "bench" / "modes.py"}
    found = []
    for path in src.rglob("*.py"):
        if path.parent in allowed or path in allowed:
            continue
        text = path.read_text()
        found += [f"{path.relative_to(src)}: {name!r}" for name in codecs.BUILTIN
                  if f'"{name}"' in text or f"'{name}'" in text]
    assert found == [], found


@pytest.mark.parametrize("field,value", [("h", 65), ("w", 0), ("h0", 0)])
def test_a_jpeg_pack_whose_index_holds_an_impossible_size_is_refused(dataset, tmp_path, field, value):
    """Right checksums, an image too large for the batch slot (or empty): refused before the device decode sees it."""
    pack = _build(dataset, format="jpeg")
    index = np.array(pack.index)
    index[1][field] = value
    f = tmp_path / "crafted.yfpack"
    craft_pack(pack.path, f, {"index": index.astype(INDEX_DTYPE).tobytes()})
    with pytest.raises(PackError, match="an index record has a size that is not an image of this pack.*rebuild it"):
        Pack.open(f)


def test_auto_picks_the_default_format_where_its_packs_fit_comfortably_in_memory():
    gb = 10**9
    name, why = codecs.choose(9 * gb, 125 * gb)
    assert name == codecs.DEFAULT and "9.0 GB" in why and "125 GB" in why
    name, why = codecs.choose(108 * gb, 125 * gb)  # COCO at 640 raw on the H200 machine
    assert name == codecs.COMPACT and "108.0 GB" in why and f"pack_format={codecs.DEFAULT}" in why
    assert f"format={codecs.DEFAULT} for yolofeed pack" in why  # that command's key
    assert codecs.choose(int(codecs.RAM_SHARE * 32 * gb), 32 * gb)[0] == codecs.DEFAULT  # the bound is inclusive
    assert "(3.0 MB)" in codecs.choose(3 * 10**6, 32 * gb)[1]  # a small set's size reads as such, not "0.0 GB"


def test_auto_keeps_the_default_format_where_the_compact_one_would_be_no_smaller():
    """Small images, or photos stored much larger than imgsz (re-encoded, a JPEG can outweigh the raw payload):
    the default format whatever the memory and the disk, since the compact one would not fit either."""
    mb = 10**6
    name, why = codecs.choose(49 * mb, 100 * mb, 53 * mb, "/small", compact_bytes=60 * mb)
    assert name == codecs.DEFAULT and "no smaller" in why and "60.0 MB against 49.0 MB" in why
    name, why = codecs.choose(49 * mb, 100 * mb, 53 * mb, "/small", compact_bytes=9 * mb)
    assert name == codecs.COMPACT and f"{codecs.COMPACT} packs would take 9.0 MB" in why  # the estimate, not 5-10x


def test_auto_picks_the_compact_format_where_the_default_would_not_fit_on_the_disk():
    gb = 10**9
    # COCO at 640 raw (~110 GB) on a machine with 256 GB of memory but 100 GB free where the packs go
    name, why = codecs.choose(110 * gb, 256 * gb, 100 * gb, "/data/yolofeed-packs")
    assert name == codecs.COMPACT and "110.0 GB" in why and "100.0 GB free in /data/yolofeed-packs" in why
    assert f"pack_format={codecs.DEFAULT}" in why
    assert codecs.choose(9 * gb, 125 * gb, 100 * gb)[0] == codecs.DEFAULT  # fits both
    assert codecs.choose(9 * gb, 125 * gb, None)[0] == codecs.DEFAULT  # free space unknown: memory decides
    assert codecs.choose(90 * gb, 256 * gb, 100 * gb)[0] == codecs.DEFAULT  # 90 % of the free space: still fits
    assert codecs.choose(91 * gb, 256 * gb, 100 * gb)[0] == codecs.COMPACT
    # 95 GB is not "more than the 100 GB free": the reason names the share that decided
    assert "95.0 GB, more than 90% of the 100.0 GB free" in codecs.choose(95 * gb, 256 * gb, 100 * gb)[1]
