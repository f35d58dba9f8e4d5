"""Faults around a pack, tried as a hostile user would: damaged files, a full disk, a read-only dataset,
labels edited behind the fingerprint's back, no labels at all, a platform without the POSIX calls.

Each fault ends in a pack that is right, or in one message that names the file, what is wrong and
what to do; never in a hang, a traceback for the user's mistake, or wrong pixels or labels used
silently. RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from helpers import OnDisk, as_another_user, cli_lines, copy_dataset, tmpfs, world_readable_dir
from yolofeed.cli import build_config, main
from yolofeed.errors import DatasetError, PackError, PackSpaceError, StalePackError
from yolofeed.pack import Pack, build, command, disk, open_or_build, paths, rebuild, source, space
from yolofeed.pack.layout import INDEX_DTYPE, MAGIC, TRAILER, align
from yolofeed.pack.paths import store_dir
from yolofeed.pack.rebuild import ensure_split
from yolofeed.pack.summary import BuildResult, summary


class Free(OnDisk):
    """A disk that says ``nbytes`` are free, whatever it has."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def free(self, folder: Path) -> int:
        return self.nbytes


def _build(root: Path, imgsz: int = 64, workers: int = 1, **kw) -> Pack:
    return open_or_build(root / "data.yaml", "train", imgsz, rebuild="auto", workers=workers, progress=False, **kw)


def _no_temp_files(folder: Path) -> bool:
    return not list(folder.glob(".*.tmp-*"))


# -- damaged packs ------------------------------------------------------------------------------------------
def test_flipped_payload_bytes_are_found_by_verify_and_rebuilt(dataset, capsys):
    """The issue's case: 57,600 bytes of one image flipped. The pack still opens (payloads are checked by
    verify=True and at the end of each build, not at every open), verify names the image, and the
    CLI's default rebuild=auto replaces the pack."""
    pack = _build(dataset, imgsz=160)
    ref = pack.image(5).copy()
    r = pack.index[5]
    n = min(57_600, int(r["nbytes"]))
    data = bytearray(pack.path.read_bytes())
    off = int(r["offset"])
    data[off:off + n] = bytes(255 - b for b in data[off:off + n])
    pack.path.write_bytes(bytes(data))
    damaged = Pack.open(pack.path)
    assert damaged.damaged().tolist() == [5]
    name = Path(pack.im_files[5]).name
    with pytest.raises(PackError, match=rf"is damaged: the stored pixels of 1 image\(s\) fail their checksum "
                                        rf"\(.*{name}\); rebuild it with: yolofeed pack data=.* imgsz=160"):
        open_or_build(dataset / "data.yaml", "train", 160, rebuild="never", verify=True)
    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=160", "splits=train", "verify=True"]) == 0
    assert "built in" in capsys.readouterr().out
    fresh = Pack.open(pack.path)
    assert not len(fresh.damaged())
    np.testing.assert_array_equal(fresh.image(5), ref)
    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=160", "splits=train", "verify=True"]) == 0
    assert "up to date" in capsys.readouterr().out


def _parts(path: Path) -> tuple[bytearray, dict, int]:
    data = bytearray(path.read_bytes())
    _, _, off, n = TRAILER.unpack(bytes(data[-TRAILER.size:]))
    return data, json.loads(bytes(data[off:off + n])), off


def _craft(path: Path, out: Path, sections: dict[str, bytes] | None = None, header: dict | None = None,
           blob: bytes | None = None) -> None:
    """Write a copy of a pack with sections replaced (same sizes) and every checksum made right again:
    what a writer bug or a foreign tool would produce, which checksums alone cannot catch."""
    data, h, off = _parts(path)
    for name, content in (sections or {}).items():
        s_off, s_len = h["sections"][name]
        assert len(content) == s_len
        data[s_off:s_off + s_len] = content
        h["checksums"][name] = zlib.crc32(content)
    h = header(h) if callable(header) else h
    blob = json.dumps(h).encode() if blob is None else blob
    out.write_bytes(bytes(data[:off]) + blob + TRAILER.pack(MAGIC, zlib.crc32(blob), off, len(blob)))


def test_a_new_section_leaves_the_others_as_they_are(dataset, tmp_path):
    """A new label kind is one more named section: written after the others, which keep their bytes, a pack with it
    opens and reads as before, and its checksum is checked although this yolofeed does not read it."""
    pack = _build(dataset)
    data, h, off = _parts(pack.path)
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


def test_damage_to_header_index_or_labels_is_refused_with_the_rebuild_command(dataset, tmp_path):
    pack = _build(dataset)
    nc = pack.header["source"]["nc"]
    good, h, h_off = _parts(pack.path)
    lab_off = h["sections"]["labels"][0]
    idx_off = h["sections"]["index"][0]

    def flipped(at: int, n: int = 4) -> bytes:
        bad = bytearray(good)
        bad[at:at + n] = bytes(255 - b for b in bad[at:at + n])
        return bytes(bad)

    year = h_off + good[h_off:].index(b'"created": "') + len(b'"created": "')
    other_year = bytearray(good)
    other_year[year] = ord("3") if good[year] != ord("3") else ord("4")  # still valid JSON, another header
    damaged = {  # bytes changed on disk: the checksums see it
        "labels": (flipped(lab_off), "its labels section fails its checksum"),
        "index": (flipped(idx_off + 8), "its index section fails its checksum"),
        "header": (bytes(other_year), "its header fails its checksum"),
    }
    for name, (data, words) in damaged.items():
        f = tmp_path / f"{name}.yfpack"
        f.write_bytes(data)
        with pytest.raises(PackError, match=f"{f} is damaged: {words}; rebuild it with: yolofeed pack "
                                            f"data={dataset / 'data.yaml'} imgsz=64 format=raw out={tmp_path}"):
            Pack.open(f)
    f = tmp_path / "header-json.yfpack"
    f.write_bytes(flipped(h_off, 1))  # the header's first byte: no longer JSON, so no source to name
    with pytest.raises(PackError, match="is damaged: its header is not readable \\(checksum mismatch\\); rebuild"):
        Pack.open(f)

    labels = np.array(pack.label_table)
    labels[3, 0] = 200  # the class 200 with nc=80
    index = np.array(pack.index)
    index[2]["offset"] = 1 << 40
    crafted = {  # right checksums, wrong content: the value checks see it
        "class": ({"labels": labels.tobytes()}, None, f"classes \\[200.0\\] outside 0-{nc - 1} \\(nc={nc}\\)"),
        "offset": ({"index": index.astype(INDEX_DTYPE).tobytes()}, None, "points outside the payloads"),
        "no-split": (None, lambda x: {k: v for k, v in x.items() if k != "split"},
                     "header key 'split' is missing"),
        "no-source": (None, lambda x: {**x, "source": "?"}, "header key 'source' is missing or not a dict"),
        "bad-section": (None, lambda x: {**x, "sections": {**x["sections"], "labels": [h_off, 40]}},
                        "labels section .* out of bounds"),
    }
    for name, (sections, header, words) in crafted.items():
        f = tmp_path / f"{name}.yfpack"
        _craft(pack.path, f, sections, header)
        with pytest.raises(PackError, match=f"{words}.*rebuild it with"):
            Pack.open(f)
    f = tmp_path / "not-json.yfpack"
    _craft(pack.path, f, blob=b"[1, 2]")
    with pytest.raises(PackError, match="not JSON: a foreign file|header is not readable"):
        Pack.open(f)


@pytest.mark.parametrize("field,value", [("h", 65), ("w", 0), ("h0", 0)])
def test_a_jpeg_pack_whose_index_holds_an_impossible_size_is_refused(dataset, tmp_path, field, value):
    """Right checksums, an image too large for the batch slot (or empty): refused before the device decode sees it."""
    pack = _build(dataset, format="jpeg")
    index = np.array(pack.index)
    index[1][field] = value
    f = tmp_path / "crafted.yfpack"
    _craft(pack.path, f, {"index": index.astype(INDEX_DTYPE).tobytes()})
    with pytest.raises(PackError, match="an index record has a size that is not an image of this pack.*rebuild it"):
        Pack.open(f)


def test_a_malformed_header_is_rebuilt_not_a_key_error(dataset, caplog):
    pack = _build(dataset)
    _craft(pack.path, pack.path, header=lambda x: {k: v for k, v in x.items() if k != "split"})
    with pytest.raises(PackError, match="header key 'split' is missing"):
        open_or_build(dataset / "data.yaml", "train", 64, rebuild="never")
    with caplog.at_level(logging.INFO):
        r = ensure_split(dataset / "data.yaml", "train", 64, rebuild="auto", workers=1, progress=False)
    assert r.built and r.pack.split == "train" and "Rebuilding" in caplog.text


@pytest.mark.parametrize("case", ["nested", "not utf-8", "huge length", "nul in data", "offset near 2**64",
                                  "label start near 2**64", "imgsz 10**30", "created a dict"])
def test_a_crafted_header_is_damaged_with_the_rebuild_command(dataset, tmp_path, case):
    """Headers a foreign tool or an attacker could write, checksums made right: deep nesting raised RecursionError
    from json.loads, a NUL in the source path ValueError from the rebuild command's path, offsets near 2**64
    wrapped the bounds check round. Each is "damaged" with the rebuild command, under rebuild=never, and rebuilt by
    rebuild=auto."""
    pack = _build(dataset)
    f = tmp_path / "crafted.yfpack"
    index = np.array(pack.index)
    if case == "nested":
        _craft(pack.path, f, blob=b"[" * 200_000 + b"]" * 200_000)
    elif case == "not utf-8":
        _craft(pack.path, f, blob=b'{"format": "yolofeed-pack", "x": "\xff\xfe"}')
    elif case == "huge length":  # a trailer whose header length is the whole file: no header fits
        data = bytearray(pack.path.read_bytes())
        magic, crc, off, n = TRAILER.unpack(bytes(data[-TRAILER.size:]))
        data[-TRAILER.size:] = TRAILER.pack(magic, crc, 0, len(data) - TRAILER.size)
        f.write_bytes(bytes(data))
    elif case == "nul in data":
        _craft(pack.path, f, header=lambda h: {**h, "source": {**h["source"], "data": "/a\0b/data.yaml"}})
    elif case == "offset near 2**64":
        index[0]["offset"], index[0]["nbytes"] = 2**64 - 64, 128  # their sum wraps round to 64
        _craft(pack.path, f, {"index": index.astype(INDEX_DTYPE).tobytes()})
    elif case == "label start near 2**64":
        index[0]["label_start"] = 2**64 - 1
        _craft(pack.path, f, {"index": index.astype(INDEX_DTYPE).tobytes()})
    elif case == "imgsz 10**30":
        _craft(pack.path, f, header=lambda h: {**h, "imgsz": 10**30})
    else:
        _craft(pack.path, f, header=lambda h: {**h, "created": {"a": [1, {"b": None}]}})
    with pytest.raises(PackError, match=r"is damaged.*rebuild it with"):
        Pack.open(f, fix="rebuild it with: yolofeed pack ...")
    with pytest.raises(PackError, match=r"is damaged.*rebuild it with"):
        Pack.open(f)
    shutil.copy(f, pack.path)
    with pytest.raises(PackError, match=rf"{pack.path} is damaged.*rebuild it with: yolofeed pack data="):
        open_or_build(dataset / "data.yaml", "train", 64, rebuild="never")
    assert ensure_split(dataset / "data.yaml", "train", 64, rebuild="auto", workers=1, progress=False).built


def _mutations(header: dict, rng: np.random.Generator, n: int):
    """``n`` copies of a header, each with one value somewhere in it replaced by a hostile one."""
    junk = [None, True, -1, 0, 2**63, 2**64 + 5, 10**30, 1.5, float("nan"), float("inf"), "", "\0", "x" * 10_000,
            [], [1], [[[]]], {}, {"a": 1}, [2**64, -1], "raw", "../../etc", [0, 2**62]]

    def paths(obj, prefix=()):
        yield prefix
        items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
        for k, v in list(items)[:50]:
            yield from paths(v, (*prefix, k))

    where = [p for p in paths(header) if p]
    for _ in range(n):
        h = json.loads(json.dumps(header))
        path = where[rng.integers(len(where))]
        node = h
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = junk[rng.integers(len(junk))]
        yield path, h


def test_random_header_values_are_damaged_or_stale_never_a_traceback(dataset, tmp_path):
    """600 headers, each with one value (a key of any depth) replaced by a hostile one, checksums made right: each
    opens (a value nothing reads, such as a class name) and is then summarised and read as a reused pack is, or is
    refused with a PackError that ends in the rebuild command. Any other exception is a traceback a user would see
    (a skipped entry that is not a pair broke the summary)."""
    pack = _build(dataset)
    _, header, _ = _parts(pack.path)
    f = tmp_path / "fuzzed.yfpack"
    refused = 0
    for path, h in _mutations(header, np.random.default_rng(30), 600):
        _craft(pack.path, f, header=lambda _, h=h: h)
        try:
            fuzzed = Pack.open(f, fix="rebuild it with: yolofeed pack ...")
            summary(BuildResult(fuzzed, built=False))
            rebuild.no_labels(fuzzed)
            assert fuzzed.fix and fuzzed.im_files and fuzzed.image(0).size and len(fuzzed.labels(0)) >= 0
        except PackError as e:
            assert str(e).endswith("rebuild it with: yolofeed pack ...") and "\n" not in str(e), (path, str(e))
            refused += 1
        except Exception as e:  # noqa: BLE001 - the test's point: nothing but a PackError may escape
            pytest.fail(f"header value at {path} replaced: {type(e).__name__}: {e}")
    assert 100 < refused < 600  # the mutations reach both what is checked and what is not


@pytest.mark.parametrize("what", ["folder", "link to /dev/zero", "fifo", "broken link", "link loop"])
def test_a_pack_path_that_is_not_a_regular_file_says_what_it_is(dataset, tmp_path, what):
    """All of these said "does not exist". Now: what it is and what to do, in one line; rebuild=auto refuses to replace
    it (it is not yolofeed's) rather than build for minutes and fail at the rename; a FIFO is never read (no hang)."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    dest = store_dir(yaml_file, 64, "raw", out) / "train.yfpack"
    dest.parent.mkdir(parents=True)
    words = {"folder": "is not a regular file but a folder", "fifo": "is not a regular file but a FIFO (named pipe)",
             "link to /dev/zero": "is not a regular file but a symbolic link to /dev/zero (a character device)",
             "broken link": f"is a symbolic link to {tmp_path / 'gone'} (which does not exist): point the link at a "
                            "pack or remove it",
             "link loop": "a link loop"}[what]
    if what == "folder":
        dest.mkdir()
    elif what == "fifo":
        os.mkfifo(dest)
    elif what == "link to /dev/zero":
        dest.symlink_to("/dev/zero")
    elif what == "broken link":
        dest.symlink_to(tmp_path / "gone")
    else:
        dest.symlink_to(dest)
    with pytest.raises(PackError, match=re.escape(f"{dest} ") + r".*" + re.escape(words)):
        Pack.open(dest)
    args = ["pack", f"data={yaml_file}", "imgsz=64", "format=raw", "splits=train", "workers=1", f"out={out}"]
    rc, lines = cli_lines([*args, "rebuild=never"])
    assert rc == 1 and len(lines) == 1 and words in lines[0] and "rebuild it with: yolofeed pack" in lines[0], lines
    rc, lines = cli_lines(args)  # rebuild=auto: not yolofeed's to replace
    assert rc == 1 and len(lines) == 1 and f"{dest} is " in lines[0] and "not a file yolofeed made" in lines[0], lines
    assert os.path.lexists(dest) and (what != "folder" or dest.is_dir())


def _open_as_other_user(path: Path, yaml_file: Path, out: Path) -> list:
    try:
        Pack.open(path)
    except PackError as e:
        api = str(e)
    return [api, cli_lines(["pack", f"data={yaml_file}", "imgsz=64", "format=raw", "splits=train", f"out={out}",
                            "rebuild=never"]), cli_lines(["pack", f"data={yaml_file}", "imgsz=64", "format=raw",
                                                          "splits=train", f"out={out}", "workers=1"])]


def test_a_pack_another_user_cannot_read_is_one_line(synth_root):
    """A pack of another user's, closed to this one (mode 0600; as root the test reads it as user nobody, since no
    mode stops root): was a PermissionError traceback from Pack.open. Now one line with the owner, the mode and what
    to do, from the API and the CLI, and rebuild=auto leaves the file alone (it cannot tell it is a pack)."""
    with world_readable_dir() as shared:
        root = copy_dataset(synth_root, shared / "ds")
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
        yaml_file, out = root / "data.yaml", shared / "packs"
        pack = open_or_build(yaml_file, "train", 64, "raw", out=out, rebuild="auto", workers=1, progress=False)
        for p in (out, pack.path.parent):
            p.chmod(0o1777)
        pack.path.chmod(0o600 if os.geteuid() == 0 else 0o000)
        result = as_another_user(_open_as_other_user, pack.path, yaml_file, out)
        api, (rc, lines), (rc_auto, lines_auto) = result
        words = f"cannot open {pack.path} (Permission denied; owned by "
        assert words in api and "yolofeed needs to read it (a pack)" in api and "out=" in api
        assert rc == 1 and len(lines) == 1 and words in lines[0], lines
        assert rc_auto == 1 and len(lines_auto) == 1 and words in lines_auto[0], lines_auto
        pack.path.chmod(0o644)
        assert len(Pack.open(pack.path)) == 24  # untouched


def test_a_pack_from_a_newer_yolofeed_is_named_before_it_is_rebuilt(dataset, caplog):
    """A pack of format 3 was rebuilt by rebuild=auto with an info line, "has pack format 3". Now it is said to be a
    newer yolofeed's: refused by rebuild=never, a warning before rebuild=auto replaces it."""
    from yolofeed.errors import NewerPackError

    pack = _build(dataset)
    _craft(pack.path, pack.path, header=lambda h: {**h, "format_version": 3, "yolofeed_version": "9.0.0"})
    words = rf"{pack.path} was built by a newer yolofeed \(9.0.0, pack format 3\); this yolofeed \(.*\) reads format 2"
    with pytest.raises(NewerPackError, match=words + ".*rebuild it with: yolofeed pack"):
        open_or_build(dataset / "data.yaml", "train", 64, rebuild="never")
    rc, lines = cli_lines(["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "splits=train", "rebuild=never"])
    assert rc == 1 and len(lines) == 1 and "built by a newer yolofeed (9.0.0, pack format 3)" in lines[0], lines
    with caplog.at_level(logging.INFO):
        assert ensure_split(dataset / "data.yaml", "train", 64, rebuild="auto", workers=1, progress=False).built
    newer = [r for r in caplog.records if "newer yolofeed" in r.getMessage()]
    assert newer and newer[0].levelno == logging.WARNING and "Rebuilding" in newer[0].getMessage()


def test_a_payload_that_does_not_land_stops_the_build(dataset, monkeypatch):
    """The end-of-build check: a worker's write that did not store what it encoded is caught, nothing published."""
    class Lost(OnDisk):
        def allocate(self, fd, nbytes):
            return False  # payloads through pwrite

        def write_payload(self, fd, data, offset):  # what lands is zeros
            super().write_payload(fd, bytes(len(data)), offset)

    with pytest.raises(PackError, match=r"image\(s\) read back from .* differ from what was written.*Nothing was "
                                        "published"), disk.using(Lost()):
        _build(dataset, workers=2)
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    assert not (folder / "train.yfpack").exists() and _no_temp_files(folder)


# -- disk space ---------------------------------------------------------------------------------------------
def test_too_little_space_is_refused_before_writing(dataset):
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    with disk.using(Free(10**5)), pytest.raises(
            PackSpaceError, match=rf"not enough free space for the train pack in {folder}: it needs "
                                  r"[\d.]+ [MK]B \([\d,]+ bytes\), 100 KB \(100,000 bytes\) are free\. Free "
                                  r"some space, or .*out=/path \(yolofeed pack\) or pack_dir=/path"):
        _build(dataset)
    assert not (folder / "train.yfpack").exists() and _no_temp_files(folder)


def test_a_pack_that_cannot_fit_is_refused_by_the_pre_run_check_too(dataset):
    """``check_split`` runs in a DDP launcher before any rank: the space error must come from there, with its type
    (the bench adds its jpeg hint to a PackSpaceError), and nothing may be created."""
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    with (disk.using(Free(10**5)),
          pytest.raises(PackSpaceError, match=f"not enough free space for the train pack in {folder}: ")):
        rebuild.check_split(dataset / "data.yaml", "train", 64, "raw", rebuild="auto")  # where the build would put it
    assert not folder.exists()
    rebuild.check_split(dataset / "data.yaml", "train", 64, "raw", rebuild="auto")  # room: nothing to say


def test_packs_that_fit_one_at_a_time_but_not_together_are_refused_before_the_first(dataset, tmp_path, capsys):
    """Room for the train pack and for the val pack, not for both: checked one at a time, the val pack failed for want
    of room after the train pack was written (and after the run folder and the model). Now ``yolofeed pack``, the
    trainer's pre-run check (through the CLI) and ``FastDetectionTrainer`` itself refuse it first, nothing written."""
    from yolofeed.pack.source import load_data_yaml, split_source
    from yolofeed.train import FastDetectionTrainer

    d = load_data_yaml(dataset / "data.yaml")
    need = {s: space.estimate_bytes(split_source(d, s), 64, "raw") for s in ("train", "val")}
    free = max(need.values()) + (min(need.values()) // 2)  # either alone fits, the two do not
    with disk.using(Free(free)):
        folder = store_dir(dataset / "data.yaml", 64, "raw")
        message = (rf"not enough free space for the train and val packs in {folder}: together they need [\d.]+ [MK]B "
                   rf"\({sum(need.values()):,} bytes: train [\d.]+ [MK]B, val [\d.]+ [MK]B\), [\d.]+ [MK]B \({free:,} "
                   r"bytes\) are free\. Free some space, or put the packs on a disk with room")
        with pytest.raises(PackSpaceError, match=message):
            rebuild.check_splits(dataset / "data.yaml", ("train", "val"), 64, "raw", rebuild="auto")
        rebuild.check_split(dataset / "data.yaml", "val", 64, "raw", rebuild="auto")  # alone it fits: nothing to say
        with pytest.raises(PackSpaceError, match=message):
            command.run(build_config("pack", [f"data={dataset / 'data.yaml'}", "imgsz=64", "format=raw", "workers=1"]))
        assert not folder.exists()  # no train pack written first
        runs = tmp_path / "runs"
        assert main(["train", "model=yolo11n.yaml", f"data={dataset / 'data.yaml'}", "imgsz=64", "pack_format=raw",
                     "device=cpu", f"project={runs}"]) == 1
        assert re.search(message, capsys.readouterr().err)
        with pytest.raises(PackSpaceError, match=message):
            FastDetectionTrainer.with_options(pack_format="raw")(overrides={"model": "yolo11n.yaml", "imgsz": 64,
                                                                "data": str(dataset / "data.yaml"), "device": "cpu",
                                                                "project": str(runs)})
    assert not runs.exists() and not folder.exists()


def test_no_room_even_for_the_lock_record_is_one_clear_error(dataset, monkeypatch):
    """A disk with no byte free takes the empty lock file but not its holder record: that used to escape as an
    OSError traceback from the lock, holding the lock; now one PackError, and the lock is free again."""
    from yolofeed.pack.lock import FolderLock

    def full(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(FolderLock, "_write_holder", full)
    folder = store_dir(dataset / "data.yaml", 64, "raw")
    with pytest.raises(PackError, match=rf"no space left in {folder}, not even for the build lock .*free some "
                                        r"space, or put the packs on a disk with room"):
        _build(dataset)
    monkeypatch.undo()
    lock = FolderLock(folder)
    assert lock.try_acquire()  # released: neither this thread's guard nor the record lock is left held
    lock.release()
    assert len(_build(dataset)) == 24


@pytest.mark.parametrize("imgsz", [32, 96])
def test_space_estimate_is_exact_for_small_splits(dataset, imgsz):
    """The up-front size (from image headers) against the pack actually built: above its payloads, below the
    upper bound, and not far above the real size, so a build that fits a tight disk is not refused (a fixed
    1 MB margin made the estimate of a 32-px pack ten times its size)."""
    src = source.split_source(dataset / "data.yaml", "train")
    planned = space.plan_space(src, dataset, imgsz, "raw")
    pack = _build(dataset, imgsz=imgsz)
    payloads = int(sum(align(int(n)) for n in pack.index["nbytes"]))
    assert payloads <= planned.estimate <= planned.bound
    assert planned.estimate <= 1.5 * pack.path.stat().st_size


class FillsUp(OnDisk):
    """A disk that fails with ENOSPC after ``writes`` payload writes in each process (a disk filling up), and
    reserves nothing."""

    def __init__(self, writes: int):
        self.writes = writes

    def allocate(self, fd, nbytes):
        raise OSError(errno.ENOSPC, "No space left on device")

    def write_payload(self, fd, data, offset):
        if self.writes <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.writes -= 1
        super().write_payload(fd, data, offset)


@pytest.mark.parametrize("workers", [1, 2])
def test_disk_full_mid_build_is_one_clear_error(dataset, workers):
    """Room for the estimate, not for the upper bound: no reservation, no mmap, and a write meets ENOSPC."""
    import psutil

    folder = store_dir(dataset / "data.yaml", 64, "raw")
    with disk.using(FillsUp(3)), pytest.raises(
            PackError, match=rf"the disk filled up while writing the train pack in {folder} \(No space "
                             r"left on device\): it needs about [\d.]+ [KMG]B, [\d.,]+ [KMG]B were free "
                             r"when the build started\. Nothing was published and the temporary file is "
                             r"removed\. .*"
                             r"pack_dir="):
        _build(dataset, workers=workers)
    assert not (folder / "train.yfpack").exists() and _no_temp_files(folder)
    assert not [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture()
def small_disk(tmp_path):
    """A real 1 MB filesystem (tmpfs), where mounting is allowed (root); skipped elsewhere."""
    with tmpfs(tmp_path / "small", "1m") as mnt:
        yield mnt


def test_a_pack_in_memory_is_written_through_the_map_without_a_reservation(dataset, tmp_path):
    """On a tmpfs the workers fault in what they write (populate advice) instead of the building process allocating
    the whole bound first: no posix_fallocate, no payload through pwrite, the same pixels as on disk."""
    if disk.MADV_POPULATE_WRITE is None:
        pytest.skip("Linux only")
    ref = _build(dataset, imgsz=160, workers=2)
    reserved = []

    class MapOnly(OnDisk):
        def allocate(self, fd, nbytes):
            reserved.append(nbytes)
            return True

        def write_payload(self, fd, data, offset):  # forked workers inherit it: a dead worker
            os._exit(3)

    with tmpfs(tmp_path / "shm", "64m") as mnt, disk.using(MapOnly()) as on:
        assert on.in_memory(mnt) and not on.in_memory(tmp_path)  # pytest's folder: a disk (conftest)
        pack = _build(dataset, imgsz=160, workers=2, out=mnt)
        assert pack.path.parent == mnt / "data-raw-160" and not reserved and len(pack) == len(ref)
        for i in range(len(ref)):
            np.testing.assert_array_equal(pack.image(i), ref.image(i))
        assert shutil.disk_usage(mnt).used < 2 * pack.path.stat().st_size  # only what was written is allocated


@pytest.mark.parametrize("workers", [1, 2])
def test_real_full_disk(dataset, small_disk, workers):
    """A real 1 MB tmpfs. First the up-front check refuses; then, with the check fooled, the real
    posix_fallocate and pwrite meet ENOSPC: one PackError, no SIGBUS (it would kill this process or a
    worker), the temporary file removed and the disk empty again."""
    with pytest.raises(PackError, match=f"not enough free space for the train pack in {small_disk}"):
        _build(dataset, imgsz=160, workers=workers, out=small_disk)
    reserved = []

    class Fooled(Free):  # the up-front check fooled; a reservation that would only be pretended
        def allocate(self, fd, nbytes):
            reserved.append(nbytes)
            return True

    with (disk.using(Fooled(10**12)),
          pytest.raises(PackError, match=f"the disk filled up while writing the train pack in {small_disk}")):
        _build(dataset, imgsz=160, workers=workers, out=small_disk)
    assert not reserved  # two workers: the populate advice met the full tmpfs, and pwrite reported it
    folder = store_dir(dataset / "data.yaml", 160, "raw", small_disk)
    assert _no_temp_files(folder) and not (folder / "train.yfpack").exists()
    usage = shutil.disk_usage(small_disk)
    assert usage.used < 64 * 1024, usage  # the tmpfs is empty again but for the lock file


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("advice", ["real", "refused", "absent"])
def test_a_full_tmpfs_never_kills_a_worker(dataset, small_disk, workers, advice):
    """Nothing reserved on a tmpfs: whatever the populate advice does (works, refused, missing from Python), a payload
    whose pages are not faulted in goes through pwrite, so a full tmpfs is the disk-full error, not a SIGBUS."""
    fooled = Free(10**12)  # the up-front check fooled
    if advice != "real":
        fooled.advice = 999 if advice == "refused" else None  # EINVAL / none
    with (disk.using(fooled),
          pytest.raises(PackError, match=f"the disk filled up while writing the train pack in {small_disk}")):
        _build(dataset, imgsz=160, workers=workers, out=small_disk)
    folder = store_dir(dataset / "data.yaml", 160, "raw", small_disk)
    assert _no_temp_files(folder) and not (folder / "train.yfpack").exists()


# -- a read-only dataset --------------------------------------------------------------------------------------
@pytest.fixture()
def read_only(dataset):
    """The dataset folder made read-only for real: a read-only bind mount as root, chmod otherwise."""
    if os.geteuid() == 0:
        ok = (subprocess.run(["mount", "--bind", str(dataset), str(dataset)], capture_output=True).returncode == 0
              and subprocess.run(["mount", "-o", "remount,bind,ro", str(dataset)], capture_output=True).returncode == 0)
        if not ok:
            subprocess.run(["umount", "-l", str(dataset)], capture_output=True)
            pytest.skip("root without mount: chmod would not stop root from writing")
        try:
            yield dataset
        finally:
            subprocess.run(["umount", "-l", str(dataset)], capture_output=True)
    else:
        os.chmod(dataset, 0o555)
        try:
            if os.access(dataset, os.W_OK):
                pytest.skip("chmod does not make this folder read-only here")
            yield dataset
        finally:
            os.chmod(dataset, 0o755)


def test_read_only_dataset_packs_go_to_the_user_cache(read_only, tmp_path, monkeypatch, caplog, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    yaml_file = read_only / "data.yaml"
    with caplog.at_level(logging.WARNING):
        pack = open_or_build(yaml_file, "train", 64, rebuild="auto", workers=2, progress=False)
    cache = tmp_path / "cache" / "yolofeed" / "packs"
    assert pack.path.is_relative_to(cache) and len(pack) == 24
    assert f"{read_only / 'yolofeed-packs'}" in caplog.text and "is not writable" in caplog.text
    assert f"goes to {pack.path.parent} instead" in caplog.text
    again = ensure_split(yaml_file, "train", 64, rebuild="never")  # found again, where it went
    assert not again.built and again.pack.path == pack.path
    assert main(["pack", f"data={yaml_file}", "imgsz=64", "splits=train"]) == 0
    assert f"-> {pack.path}" in capsys.readouterr().out
    with pytest.raises(PackError, match=f"cannot write packs to {read_only / 'mine' / 'data-raw-64'} .*pass a writable "
                                        "folder: out="):
        open_or_build(yaml_file, "train", 64, out=read_only / "mine", rebuild="auto")


def test_two_datasets_named_data_yaml_get_two_cache_folders(tmp_path):
    a = paths.pack_folders(tmp_path / "a" / "data.yaml", 640, "raw")
    b = paths.pack_folders(tmp_path / "b" / "data.yaml", 640, "raw")
    assert a[0] != b[0] and a[1] != b[1] and a[1].parent.parent == b[1].parent.parent == paths.cache_root()
    assert paths.pack_folders(tmp_path / "a" / "data.yaml", 640, "raw", out=tmp_path / "o") == [
        tmp_path / "o" / "data-raw-640"]  # out= gets the per-dataset folder too


# -- a label file edited behind the fingerprint's back ----------------------------------------------------------
def test_label_edited_to_the_same_size_and_time_needs_rebuild_check(dataset, caplog):
    from ultralytics.data.utils import get_hash

    yaml_file = dataset / "data.yaml"
    assert ensure_split(yaml_file, "train", 64, rebuild="auto", workers=1, progress=False).built
    src = source.split_source(yaml_file, "train")
    lb = Path(src.label_files[2])
    st, text = lb.stat(), lb.read_text()
    cls = int(text.split()[0])
    edited = f"{(cls + 1) % 10}{text[len(str(cls)):]}" if cls < 10 else f"{cls - 1}{text[len(str(cls)):]}"
    before = get_hash(list(src.label_files) + list(src.im_files))
    lb.write_text(edited)
    os.utime(lb, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert lb.stat().st_size == st.st_size and lb.read_text() != text
    # Ultralytics' label cache keeps its old labels here; so does the default rule, which is the same
    assert get_hash(list(src.label_files) + list(src.im_files)) == before
    assert not ensure_split(yaml_file, "train", 64, rebuild="auto", progress=False).built
    with pytest.raises(StalePackError, match=rf"1 label file\(s\) changed content .*{lb.name}.*rebuild it with"):
        rebuild._open_checked(store_dir(yaml_file, 64, "raw") / "train.yfpack", {}, "rebuild it with ...", src,
                              "check", False)
    with caplog.at_level(logging.INFO):
        r = ensure_split(yaml_file, "train", 64, rebuild="check", workers=1, progress=False)
    assert r.built and "changed content" in caplog.text
    i = r.pack.im_files.index(src.im_files[2])
    assert int(r.pack.labels(i)[:, 0].min()) != int(r.pack.labels(i)[:, 0].max()) or \
        sorted(r.pack.labels(i)[:, 0].tolist()) != sorted([cls] * len(r.pack.labels(i)))
    assert not ensure_split(yaml_file, "train", 64, rebuild="check", progress=False).built  # up to date now
    assert build_config("pack", ["data=x.yaml", "rebuild=check"]).rebuild == "check"
    assert build_config("train", ["data=x.yaml", "model=m.yaml", "pack_rebuild=check"]).pack_rebuild == "check"


# -- messages: skipped images on first use, no labels at all -----------------------------------------------------
def test_first_use_build_says_which_images_were_skipped_and_why(dataset, caplog):
    (dataset / "images" / "train" / "zero.jpg").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        _build(dataset)
    assert "zero.jpg: empty file (0 bytes)" in caplog.text and "HEIC" not in caplog.text
    assert "train.report.txt" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _build(dataset)  # reused: still said, in one line, as Ultralytics repeats its cache's warnings
    assert "1 image(s) were skipped when it was built (1x empty file (0 bytes)" in caplog.text
    assert "train.report.txt" in caplog.text


def test_no_labels_folder_warns_at_pack_time_and_training_refuses(dataset, tmp_path, caplog):
    from yolofeed import FastDetectionTrainer

    shutil.rmtree(dataset / "labels")
    with caplog.at_level(logging.WARNING):
        pack = open_or_build(dataset / "data.yaml", "val", 64, rebuild="auto", workers=1, progress=False)
    assert len(pack) == 8
    assert f"No labels found in {dataset / 'labels' / 'val'}" in caplog.text
    assert "training may not work correctly" in caplog.text
    trainer = FastDetectionTrainer(overrides=dict(model="yolo11n.yaml", data=str(dataset / "data.yaml"), imgsz=64,
                                                  device="cpu", project=str(tmp_path), name="nolabels", plots=False,
                                                  exist_ok=True))
    with pytest.raises(DatasetError, match=f"No labels found in {dataset / 'labels' / 'train'}.*Ultralytics refuses "
                                           "to train on such a split"):
        trainer.get_dataloader(trainer.data["train"], 4, -1, "train")


# -- no POSIX: fcntl, posix_fallocate, pwrite and fdatasync hidden, as on Windows -----------------------------
def _modules(pkgutil, package):
    return [m for m in pkgutil.walk_packages(package.__path__, "yolofeed.") if not m.name.endswith("__main__")]


def _build_without_posix(yaml_file: Path, out: Path, report: Path) -> None:
    """Child process: hide the POSIX-only calls, import yolofeed afresh, build with one and two workers."""
    import importlib
    import pkgutil
    import sys

    sys.modules["fcntl"] = None  # "import fcntl" now raises ImportError
    for name in ("posix_fallocate", "pwrite", "fdatasync"):
        if hasattr(os, name):
            delattr(os, name)
    for m in [m for m in sys.modules if m == "yolofeed" or m.startswith("yolofeed.")]:
        del sys.modules[m]
    import yolofeed

    failed = []
    for info in _modules(pkgutil, yolofeed):
        try:
            importlib.import_module(info.name)
        except ImportError as e:
            failed.append(f"{info.name}: {e}")
    from yolofeed.pack.lock import FolderLock
    from yolofeed.pack.rebuild import ensure_split

    mechanism = FolderLock(out).mechanism
    sizes = [ensure_split(yaml_file, "train", 64, out=out, rebuild="always", workers=w, progress=False,
                          sync=True).pack.path.stat().st_size for w in (1, 2)]
    report.write_text(json.dumps({"failed": failed, "mechanism": mechanism, "sizes": sizes}))


def test_no_posix_calls_needed(dataset, tmp_path):
    import importlib
    import multiprocessing as mp
    import pkgutil

    import yolofeed

    baseline = []  # modules that do not import here anyway (an optional GPU dependency): not our concern
    for info in _modules(pkgutil, yolofeed):
        with contextlib.suppress(ImportError):
            importlib.import_module(info.name)
            continue
        baseline.append(info.name)
    ref = _build(dataset)
    report = tmp_path / "report.json"
    child = mp.get_context("fork").Process(target=_build_without_posix,
                                           args=(dataset / "data.yaml", tmp_path / "out", report))
    child.start()
    child.join(120)
    assert child.exitcode == 0 and report.exists()
    r = json.loads(report.read_text())
    assert [f for f in r["failed"] if f.split(":")[0] not in baseline] == []
    assert r["mechanism"] == "file"
    pack = Pack.open(store_dir(dataset / "data.yaml", 64, "raw", tmp_path / "out") / "train.yfpack")
    assert pack.im_files == ref.im_files and not len(pack.damaged())
    for i in range(len(pack)):
        np.testing.assert_array_equal(pack.image(i), ref.image(i))


@pytest.mark.slow
def test_spawned_workers_build_the_same_pack(dataset, tmp_path, monkeypatch):
    """Workers started by spawn, as on macOS and Windows: same bytes, and they end with the build."""
    import multiprocessing as mp

    ref = _build(dataset)
    monkeypatch.setattr(build, "mp_context", lambda: mp.get_context("spawn"))
    pack = _build(dataset, workers=2, out=tmp_path / "spawned")
    for i in range(len(pack)):
        np.testing.assert_array_equal(pack.image(i), ref.image(i))
