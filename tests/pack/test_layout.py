"""The pack file's layout (pack/layout.py): named sections, each with its own checksum, that a new label kind adds
to without touching the others; the header's format name; file names kept as the file system's bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from helpers import pack_parts
from yolofeed.cli import main
from yolofeed.errors import PackError
from yolofeed.pack import Pack, codecs, open_or_build
from yolofeed.pack.layout import MAGIC, TRAILER, align
from yolofeed.pack.paths import store_dir
from yolofeed.pack.report import read_report
from yolofeed.pack.source import split_source


def _build(root: Path, imgsz: int = 64, workers: int = 1, **kw) -> Pack:
    return open_or_build(root / "data.yaml", "train", imgsz, rebuild="auto", workers=workers, progress=False, **kw)


IMGSZ = 64


def test_a_new_section_leaves_the_others_as_they_are(dataset, tmp_path):
    """A new label kind is one more named section: written after the others, which keep their bytes, a pack with it
    opens and reads as before, and its checksum is checked although this yolofeed does not read it."""
    pack = _build(dataset)
    data, h, off = pack_parts(pack.path)
    extra = np.arange(len(pack) * 17 * 3, dtype=np.float32).tobytes()  # say, 17 keypoints (x, y, v) an image

    def with_extra(content: bytes) -> bytes:
        start = align(off)
        head = dict(h, sections={**h["sections"], "keypoints": [start, len(content)]},
                    checksums={**h["checksums"], "keypoints": zlib.crc32(extra)})
        blob = json.dumps(head).encode()
        body = bytes(data[:off]).ljust(start, b"\0") + content
        body = body.ljust(align(len(body)), b"\0")
        return body + blob + TRAILER.pack(MAGIC, zlib.crc32(blob), len(body), len(blob))

    f = tmp_path / "keypoints.yfpack"
    f.write_bytes(with_extra(extra))
    newer = Pack.open(f, fix="rebuild it with: yolofeed pack ...")
    assert newer.header["sections"]["keypoints"][1] == len(extra)
    for name in ("index", "labels", "files", "label_crc"):  # where they were, byte for byte
        assert newer.header["sections"][name] == h["sections"][name]
    assert newer.im_files == pack.im_files and len(newer.damaged()) == 0
    for i in range(len(pack)):
        np.testing.assert_array_equal(newer.image(i), pack.image(i))
        np.testing.assert_array_equal(newer.labels(i), pack.labels(i))
    damaged = bytearray(extra)
    damaged[5] ^= 0xFF
    f.write_bytes(with_extra(bytes(damaged)))
    with pytest.raises(PackError, match="is damaged: its keypoints section fails its checksum; rebuild it with"):
        Pack.open(f, fix="rebuild it with: yolofeed pack ...")


def test_a_header_naming_an_unknown_format_is_refused_in_one_line(pack, tmp_path):
    good = pack(IMGSZ)
    data = bytearray(good.path.read_bytes())
    _, _, off, n = TRAILER.unpack(bytes(data[-TRAILER.size:]))
    header = json.loads(bytes(data[off:off + n]))
    header["storage"] = "webp"  # a newer yolofeed's format, or a foreign tool's: checksums made right again
    blob = json.dumps(header).encode()
    foreign = tmp_path / "train.yfpack"
    foreign.write_bytes(bytes(data[:off]) + blob + TRAILER.pack(MAGIC, zlib.crc32(blob), off, len(blob)))
    with pytest.raises(PackError) as e:
        Pack.open(foreign)
    message = str(e.value)
    assert "\n" not in message and str(foreign) in message
    assert f"its storage format 'webp' is not one this yolofeed reads ({', '.join(codecs.names())})" in message
    assert "rebuild" in message and "yolofeed pack data=" in message


def test_file_names_that_are_not_utf8_round_trip(dataset, capsys):
    """Linux allows any bytes but '/' and NUL in a name, and Ultralytics trains on such files. The pack keeps
    each name byte for byte, the summary shows it escaped, the report holds its bytes; nothing raises after the
    build has decoded every image (it used to, when writing the file list)."""
    raw = os.fsdecode(b"caf\xe9-\xff")  # Python's name for these bytes: lone surrogates
    img, lab = dataset / "images" / "train", dataset / "labels" / "train"
    shutil.copy(img / "train_000003.jpg", img / f"{raw}.jpg")
    shutil.copy(lab / "train_000003.txt", lab / f"{raw}.txt")
    (img / f"{raw}-empty.jpg").write_bytes(b"")  # skipped: its name goes to the header, the report and the summary
    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "workers=1", "splits=train"]) == 0
    out = capsys.readouterr().out
    assert "caf\\xe9-\\xff-empty.jpg: empty file" in out

    pack = Pack.open(store_dir(dataset / "data.yaml", 64, "raw") / "train.yfpack")
    source = split_source(dataset / "data.yaml", "train").im_files
    assert pack.im_files == [f for f in source if not f.endswith("-empty.jpg")]
    k = pack.im_files.index(str(img / f"{raw}.jpg"))
    np.testing.assert_array_equal(pack.image(k), pack.image(pack.im_files.index(str(img / "train_000003.jpg"))))
    np.testing.assert_array_equal(pack.labels(k), np.loadtxt(lab / "train_000003.txt", ndmin=2, dtype=np.float32))
    assert [Path(f).name for f, _ in pack.header["skipped"]] == [f"{raw}-empty.jpg"]
    assert [Path(row[0]).name for row in read_report(pack.path)] == [f"{raw}-empty.jpg"]
