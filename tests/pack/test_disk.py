"""The file operations a build makes (pack/disk.py): the sweep of what dead builds left removes only yolofeed's own
temporary files; with the POSIX-only calls hidden (fcntl, posix_fallocate, pwrite, fdatasync, as on Windows) every
module imports and the pack built is the same. RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from helpers import VICTIM
from helpers import build_out as _build_out
from helpers import planted_folder as _folder
from yolofeed.pack import Pack, open_or_build
from yolofeed.pack.layout import PREAMBLE
from yolofeed.pack.paths import store_dir


def _build(root: Path, imgsz: int = 64, workers: int = 1, **kw) -> Pack:
    return open_or_build(root / "data.yaml", "train", imgsz, rebuild="auto", workers=workers, progress=False, **kw)


def test_only_yolofeeds_own_temporary_files_are_swept(dataset, tmp_path, caplog):
    """The sweep deleted every ``.*.tmp-*`` file of the folder (out= may be any folder). Now only a regular file
    named as a build names its temporary files and starting as yolofeed writes them (or empty): a dead build's pack or
    report."""
    yaml_file, out = dataset / "data.yaml", tmp_path / "packs"
    folder = _folder(yaml_file, out)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    theirs = {
        ".notes.tmp-1": VICTIM,  # an editor's, a sync tool's
        ".train.yfpack.tmp-1-deadbeef": VICTIM,  # named as ours, not ours
        ".train.report.txt.tmp-1-deadbeef": VICTIM,
    }
    for name, data in theirs.items():
        (folder / name).write_bytes(data)
    (folder / ".train.yfpack.tmp-2-deadbeef").symlink_to(victim)  # a link named as ours: not followed, not deleted
    (folder / ".val.yfpack.tmp-3-deadbeef").mkdir()
    dead = {".train.yfpack.tmp-4-0123abcd": PREAMBLE + b"\0" * 1000,  # what a killed build leaves
            ".train.report.txt.tmp-4-0123abcd": b"# train.yfpack: 1 skipped, 0 notes. file<TAB>status<TAB>reason\nx\n",
            ".val.yfpack.tmp-5-0123abcd": b"",  # killed between creating it and writing its preamble
            ".val.report.txt.tmp-5-0123abcd": b""}
    for name, data in dead.items():
        (folder / name).write_bytes(data)
    with caplog.at_level(logging.INFO):
        _build_out(yaml_file, out)
    for name, data in theirs.items():
        assert (folder / name).read_bytes() == data, name
    assert (folder / ".train.yfpack.tmp-2-deadbeef").is_symlink() and victim.read_bytes() == VICTIM
    assert (folder / ".val.yfpack.tmp-3-deadbeef").is_dir()
    assert not any((folder / name).exists() for name in dead)
    assert "removed .train.yfpack.tmp-4-0123abcd" in caplog.text
    assert f"left {folder / '.train.yfpack.tmp-1-deadbeef'} alone (a regular file)" in caplog.text
    with caplog.at_level(logging.INFO):  # the val split's build in the same folder: said once a process
        open_or_build(yaml_file, "val", 64, "raw", out=out, rebuild="auto", workers=1, progress=False)
    assert caplog.text.count(f"left {folder / '.train.yfpack.tmp-1-deadbeef'} alone") == 1


# -- no POSIX: fcntl, posix_fallocate, pwrite and fdatasync hidden, as on Windows --------------------------------------
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
