"""The files a build writes in a pack folder (pack/files.py), written so that nothing else there is harmed.

A temporary name planted ahead is passed over (``O_EXCL``); a pack's name is replaced only where what is there is a
pack yolofeed wrote (one from before the preamble too), and anything else under it is refused in one line and left
as it is. RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import os

import pytest

from helpers import VICTIM, cli_lines
from helpers import build_out as _build
from helpers import pack_args as _pack_args
from helpers import planted_folder as _folder
from yolofeed.errors import PackError
from yolofeed.pack.layout import PREAMBLE


def test_a_planted_temporary_name_is_passed_over(dataset, tmp_path, monkeypatch):
    """Someone who guesses the build's temporary name and plants a link there first: the build draws another name
    (O_EXCL never opens what is there), and the link's target is untouched."""
    import secrets

    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    folder = _folder(yaml_file, out)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    tokens = iter(["0badc0de", "0badc0de", "1234abcd"] + [None] * 10)
    real = secrets.token_hex
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(tokens) or real(n))
    planted = folder / f".train.yfpack.tmp-{os.getpid()}-0badc0de"
    planted.symlink_to(victim)
    assert len(_build(yaml_file, out)) == 24
    assert victim.read_bytes() == VICTIM and planted.is_symlink()


@pytest.mark.parametrize("planted", ["own file", "link to a pack"])
def test_a_pack_name_holding_what_yolofeed_did_not_write_is_never_replaced(dataset, tmp_path, planted):
    """A file of the user's own named train.yfpack was replaced by a rebuild=auto build (it is not a pack, so it was
    "rebuilt"); a link to a pack on another disk was replaced by a file here. Now: refused before the build, with
    one line, and left as it is."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    dest = _folder(yaml_file, out) / "train.yfpack"
    elsewhere = tmp_path / "other-disk"
    if planted == "own file":
        dest.write_bytes(VICTIM)
        before = VICTIM
    else:
        real = _build(yaml_file, elsewhere)
        before = real.path.read_bytes()
        dest.symlink_to(real.path)
        sorted((dataset / "labels" / "train").glob("*.txt"))[0].write_text("1 0.5 0.5 0.2 0.2\n")  # now stale
    words = "is a file yolofeed did not write" if planted == "own file" else "is a symbolic link to"
    rc, lines = cli_lines(_pack_args(yaml_file, out))
    assert rc == 1 and len(lines) == 1 and f"{dest} {words}" in lines[0] and "the train pack" in lines[0], lines
    with pytest.raises(PackError, match=words):
        _build(yaml_file, out)
    assert (dest.resolve().read_bytes() if planted == "link to a pack" else dest.read_bytes()) == before
    assert dest.is_symlink() == (planted == "link to a pack")
    assert not [p for p in dest.parent.iterdir() if ".tmp-" in p.name]


def test_a_pack_yolofeed_wrote_before_the_preamble_is_still_replaced(dataset, tmp_path):
    """Packs written before the preamble (payloads from byte 0) are known by their trailer: rebuilt as before."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    pack = _build(yaml_file, out)
    data = pack.path.read_bytes()
    assert data.startswith(PREAMBLE)
    old = bytearray(data)
    old[:len(PREAMBLE)] = bytes(len(PREAMBLE))  # as an older build left those bytes: no preamble, same trailer
    pack.path.write_bytes(bytes(old))
    assert _build(yaml_file, out, rebuild="always").path.read_bytes().startswith(PREAMBLE)
