"""The pack's reader (pack/store.py): what ``Pack.open`` refuses, and how it says so.

Foreign, truncated, padded, damaged and crafted files (checksums made right again where only the content is
wrong, as a writer bug or a hostile user would leave them), packs of another format version, a path that is not a
regular file or one this user may not read: each ends in one message that names the file, what is wrong and the
command that rebuilds it, never a traceback. Payload checksums are read by ``verify=True``; read-ahead advice and
pickling by path. RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from helpers import as_another_user, cli_lines, copy_dataset, craft_pack, pack_parts, world_readable_dir
from yolofeed.cli import main
from yolofeed.errors import PackError, StalePackError
from yolofeed.pack import Pack, open_or_build, rebuild
from yolofeed.pack.layout import INDEX_DTYPE, MAGIC, TRAILER
from yolofeed.pack.paths import store_dir
from yolofeed.pack.rebuild import ensure_split
from yolofeed.pack.summary import BuildResult, summary


def _build160(root: Path, split="train", imgsz=160, storage="raw", workers=2, **kw) -> Pack:
    """A split's pack at 160 px, built by two workers (``_build``: the train split at 64 px, one worker)."""
    return open_or_build(root / "data.yaml", split, imgsz, storage, rebuild="auto", workers=workers,
                         progress=False, **kw)


def _build(root: Path, imgsz: int = 64, workers: int = 1, **kw) -> Pack:
    return open_or_build(root / "data.yaml", "train", imgsz, rebuild="auto", workers=workers, progress=False, **kw)


@pytest.mark.parametrize("storage", ["raw", "jpeg"])
def test_will_need_asks_for_exactly_each_payload(dataset, storage, monkeypatch):
    import pickle

    pack = _build160(dataset, storage=storage)
    calls = []
    real = os.posix_fadvise

    def recording(fd, offset, length, advice):  # the kernel's side cannot be seen from here: record what it is asked
        calls.append((fd, offset, length, advice))
        return real(fd, offset, length, advice)  # and still make the real call: it must be accepted

    monkeypatch.setattr(os, "posix_fadvise", recording)
    idx = [len(pack) - 1, 0, 7, 7]  # the last payload, which ends where the sections start, and a repeat
    pack.will_need(idx)
    assert [(off, n) for _, off, n, _ in calls] == [(int(pack.index[i]["offset"]), int(pack.index[i]["nbytes"]))
                                                    for i in idx]
    assert {advice for *_, advice in calls} == {os.POSIX_FADV_WILLNEED}
    assert os.path.samefile(f"/proc/self/fd/{calls[0][0]}", pack.path)  # the pack's own descriptor
    clone = pickle.loads(pickle.dumps(pack))  # an unpickled copy reopens the file: its descriptor stays open
    del pack
    calls.clear()
    clone.will_need([0])
    assert len(calls) == 1 and os.path.samefile(f"/proc/self/fd/{calls[0][0]}", clone.path)

    def failing(*a):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "posix_fadvise", failing)
    clone.will_need([0, 1])  # advice only: a failure turns it off, the gather goes on
    assert not clone._file.advise
    if storage == "raw":
        out = np.zeros((2, 160, 160, 3), np.uint8)
        hw = clone.codec.gather(clone, [0, 1], out)
        np.testing.assert_array_equal(out[0, :hw[0][0], :hw[0][1]], clone.image(0))


def test_a_pack_cut_shorter_under_a_reader_is_refused_before_the_next_batch(dataset, tmp_path):
    """Another program truncating the file in place: the next batch's ``will_need`` refuses it with the rebuild
    command, where reading the map past the new end would end the process with SIGBUS."""
    copy = copy_dataset(dataset, tmp_path / "copy")
    pack = _build(copy)
    pack.will_need([0, 1])  # whole: nothing said
    size = len(pack.buffer)
    os.truncate(pack.path, size // 2)
    with pytest.raises(PackError, match=rf"{re.escape(str(pack.path))} was cut to {size // 2:,} bytes while it was "
                                        rf"read \(it had {size:,} when opened\): another program truncated or "
                                        r"rewrote it in place; rebuild it with: yolofeed pack "):
        pack.will_need([0])


def test_pickles_by_path(dataset):
    import pickle

    pack = _build160(dataset)
    clone = pickle.loads(pickle.dumps(pack))
    assert len(pickle.dumps(pack)) < 1000
    np.testing.assert_array_equal(clone.image(3), pack.image(3))


# -- refused: foreign, truncated, of another version -------------------------------------------------------------------
def _rewrite_header(path: Path, crc: int | None = None, drop: tuple[str, ...] = (), **changes) -> None:
    """Rewrite a pack's header; ``crc``: the trailer's header checksum (None: the right one)."""
    data = bytearray(path.read_bytes())
    magic, _, off, n = TRAILER.unpack(bytes(data[-TRAILER.size:]))
    header = json.loads(bytes(data[off:off + n]))
    header.update(changes)
    for key in drop:
        del header[key]
    blob = json.dumps(header).encode()
    path.write_bytes(bytes(data[:off]) + blob + TRAILER.pack(MAGIC, zlib.crc32(blob) if crc is None else crc, off,
                                                             len(blob)))


def test_foreign_truncated_and_old_packs_are_refused(dataset, tmp_path):
    pack = _build160(dataset)
    good = pack.path.read_bytes()
    cases = {
        "foreign": os.urandom(5000),
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "cut-trailer": good[:-5],
        "padded": good + b"\0" * 64,
    }
    for name, data in cases.items():
        f = tmp_path / f"{name}.yfpack"
        f.write_bytes(data)
        with pytest.raises(PackError):
            Pack.open(f)
    old = tmp_path / "old.yfpack"
    old.write_bytes(good)
    _rewrite_header(old, format_version=0, yolofeed_version="0.0.1")
    with pytest.raises(StalePackError, match="format 0 .*reads format 2"):
        Pack.open(old)
    v1 = tmp_path / "v1.yfpack"  # format 1's trailer held b"\0\1\0\0" where the header's checksum now is
    v1.write_bytes(good)
    _rewrite_header(v1, crc=int.from_bytes(b"\x00\x01\x00\x00", "little"), format_version=1)
    with pytest.raises(StalePackError, match=f"format 1 .*reads format 2: rebuild it with: yolofeed pack "
                                             f"data={dataset / 'data.yaml'} imgsz=160 format=raw out={tmp_path}"):
        Pack.open(v1)
    assert len(Pack.open(pack.path)) == 24  # the good file still opens


# -- damaged packs -----------------------------------------------------------------------------------------------------
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


def test_damage_to_header_index_or_labels_is_refused_with_the_rebuild_command(dataset, tmp_path):
    pack = _build(dataset)
    nc = pack.header["source"]["nc"]
    good, h, h_off = pack_parts(pack.path)
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
        craft_pack(pack.path, f, sections, header)
        with pytest.raises(PackError, match=f"{words}.*rebuild it with"):
            Pack.open(f)
    f = tmp_path / "not-json.yfpack"
    craft_pack(pack.path, f, blob=b"[1, 2]")
    with pytest.raises(PackError, match="not JSON: a foreign file|header is not readable"):
        Pack.open(f)


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
        craft_pack(pack.path, f, blob=b"[" * 200_000 + b"]" * 200_000)
    elif case == "not utf-8":
        craft_pack(pack.path, f, blob=b'{"format": "yolofeed-pack", "x": "\xff\xfe"}')
    elif case == "huge length":  # a trailer whose header length is the whole file: no header fits
        data = bytearray(pack.path.read_bytes())
        magic, crc, off, n = TRAILER.unpack(bytes(data[-TRAILER.size:]))
        data[-TRAILER.size:] = TRAILER.pack(magic, crc, 0, len(data) - TRAILER.size)
        f.write_bytes(bytes(data))
    elif case == "nul in data":
        craft_pack(pack.path, f, header=lambda h: {**h, "source": {**h["source"], "data": "/a\0b/data.yaml"}})
    elif case == "offset near 2**64":
        index[0]["offset"], index[0]["nbytes"] = 2**64 - 64, 128  # their sum wraps round to 64
        craft_pack(pack.path, f, {"index": index.astype(INDEX_DTYPE).tobytes()})
    elif case == "label start near 2**64":
        index[0]["label_start"] = 2**64 - 1
        craft_pack(pack.path, f, {"index": index.astype(INDEX_DTYPE).tobytes()})
    elif case == "imgsz 10**30":
        craft_pack(pack.path, f, header=lambda h: {**h, "imgsz": 10**30})
    else:
        craft_pack(pack.path, f, header=lambda h: {**h, "created": {"a": [1, {"b": None}]}})
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
    _, header, _ = pack_parts(pack.path)
    f = tmp_path / "fuzzed.yfpack"
    refused = 0
    for path, h in _mutations(header, np.random.default_rng(30), 600):
        craft_pack(pack.path, f, header=lambda _, h=h: h)
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


# -- a pack path that is not a pack ------------------------------------------------------------------------------------
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


def test_the_names_before_the_codec_owned_its_gather_warn_and_work_as_the_new_ones(dataset):
    """Python code written against the earlier API (``Pack.storage``, ``Pack.gather``, ``Pack.gather_encoded``,
    ``storage=``) keeps working, with a DeprecationWarning naming the new one."""
    from yolofeed.pack.codecs.jpeg import gather_encoded

    pack = _build(dataset)
    with pytest.warns(DeprecationWarning, match="Pack.format"):
        assert pack.storage == pack.format == "raw"
    idx = np.array([2, 0, 1])
    new, old = np.zeros((3, 64, 64, 3), np.uint8), np.zeros((3, 64, 64, 3), np.uint8)
    hw = pack.codec.gather(pack, idx, new)
    with pytest.warns(DeprecationWarning, match="codec.gather"):
        assert (pack.gather(idx, old) == hw).all()
    assert (old == new).all() and new.any()
    a, b = np.zeros(3 * 64 * 64 * 3, np.uint8), np.zeros(3 * 64 * 64 * 3, np.uint8)
    starts, sizes = gather_encoded(pack, idx, a)
    with pytest.warns(DeprecationWarning, match="gather_encoded"):
        s2, n2 = pack.gather_encoded(idx, b)
    assert (starts == s2).all() and (sizes == n2).all() and (a == b).all()
    with pytest.warns(DeprecationWarning, match="use format="):
        again = open_or_build(dataset / "data.yaml", "train", 64, storage="raw", rebuild="auto", workers=1,
                              progress=False)
    assert again.path == pack.path

def _each_refused_as_damaged(pack: Pack, crafted: dict, fix: str, folder) -> None:
    """Each crafted copy of ``pack`` (name -> (sections, header rewrite, words)) is refused in one line saying it is
    damaged, with ``words``, ending with the command ``fix``."""
    for name, (sections, header, words) in crafted.items():
        f = folder / f"{name}.yfpack"
        craft_pack(pack.path, f, sections, header)
        with pytest.raises(PackError) as e:
            Pack.open(f)
        message = str(e.value)
        assert words in message and "\n" not in message and "damaged" in message, (name, message)
        assert message.endswith(fix), (name, message)


def test_a_damaged_or_crafted_corners_section_is_refused_with_the_obb_rebuild_command(obb_dataset, tmp_path):
    """A flipped byte of the corners section fails its CRC32; right checksums around wrong content (a NaN corner,
    corners off their box, a section one row short, an obb header without the section) are damage too; each is one
    line naming the command that rebuilds the obb pack. Another task's pack is not one of these."""
    pack = open_or_build(obb_dataset / "data.yaml", "train", 64, "raw", rebuild="auto", workers=1, progress=False,
                         task="obb")
    good, h, _ = pack_parts(pack.path)
    off, n = h["sections"]["corners"]
    fix = (f"rebuild it with: yolofeed pack data={obb_dataset / 'data.yaml'} imgsz=64 format=raw task=obb "
           f"out={tmp_path} rebuild=always")
    flipped = bytearray(good)
    flipped[off + 5] ^= 0xFF
    f = tmp_path / "flipped.yfpack"
    f.write_bytes(bytes(flipped))
    with pytest.raises(PackError) as e:
        Pack.open(f)
    assert str(e.value) == f"{f} is damaged: its corners section fails its checksum; {fix}"
    nan, off_box = np.array(pack.corner_table), np.array(pack.corner_table)
    nan[0, 1, 0], off_box[1, 2, 1] = np.nan, off_box[1, 2, 1] + 0.5
    crafted = {
        "nan": ({"corners": nan.tobytes()}, None, "the corners hold values that are not finite"),
        "off-box": ({"corners": off_box.tobytes()}, None, "the corners do not lie on their labels' boxes"),
        "short": (None, lambda x: {**x, "sections": {**x["sections"], "corners": [off, n - 32]}},
                  "corners section is not one row of 4 x 2 values per label"),
        "no-section": (None, lambda x: {**x, "sections": {k: v for k, v in x["sections"].items() if k != "corners"}},
                       "corners section None is malformed"),
    }
    _each_refused_as_damaged(pack, crafted, fix, tmp_path)
    with pytest.raises(StalePackError, match="it was built for task=obb, this run asks for task=detect"):
        Pack.open(pack.path, expect={"task": "detect"})


def test_a_damaged_or_crafted_polygon_section_is_refused_with_the_segment_rebuild_command(segment_dataset, tmp_path):
    """A flipped byte of either polygon section fails its CRC32; right checksums around wrong content (a NaN point, a
    point off its box, a polygon of 2 points, lengths that add up to more points than there are, a lengths section
    one row short) are damage too; each is one line naming the command that rebuilds the segment pack."""
    pack = open_or_build(segment_dataset / "data.yaml", "train", 64, "raw", rebuild="auto", workers=1, progress=False,
                         task="segment")
    good, h, _ = pack_parts(pack.path)
    fix = (f"rebuild it with: yolofeed pack data={segment_dataset / 'data.yaml'} imgsz=64 format=raw task=segment "
           f"out={tmp_path} rebuild=always")
    for name in ("polygon_lengths", "polygon_points"):
        off, n = h["sections"][name]
        flipped = bytearray(good)
        flipped[off + 1] ^= 0xFF
        f = tmp_path / f"flipped-{name}.yfpack"
        f.write_bytes(bytes(flipped))
        with pytest.raises(PackError) as e:
            Pack.open(f)
        assert str(e.value) == f"{f} is damaged: its {name} section fails its checksum; {fix}"
    points, lengths = np.array(pack.polygon_points), np.array(pack.polygon_lengths)
    nan, off_box = points.copy(), points.copy()
    nan[3, 0] = np.nan
    off_box[int(lengths[0]) + 1, 1] += 0.5  # a point of the second polygon, outside its box
    none, more = lengths.copy(), lengths.copy()
    none[0], none[1] = 0, none[1] + none[0]  # the same points, the first polygon none of them
    more[-1] += 1
    off, n = h["sections"]["polygon_lengths"]
    crafted = {
        "nan": ({"polygon_points": nan.tobytes()}, None, "the polygons hold values that are not finite"),
        "off-box": ({"polygon_points": off_box.tobytes()}, None, "the polygons do not lie on their labels' boxes"),
        "no-points": ({"polygon_lengths": none.tobytes()}, None, "a polygon has no points"),
        "too-many": ({"polygon_lengths": more.tobytes()}, None, "its polygon lengths do not add up to its points"),
        "short": (None, lambda x: {**x, "sections": {**x["sections"], "polygon_lengths": [off, n - 4]}},
                  "polygon sections are not one length per label and whole points"),
    }
    _each_refused_as_damaged(pack, crafted, fix, tmp_path)
    with pytest.raises(StalePackError, match="it was built for task=segment, this run asks for task=detect"):
        Pack.open(pack.path, expect={"task": "detect"})
