"""``pack_format=auto`` (pack/auto.py): the free space where the packs would go decides (the user's cache for a
read-only dataset), a pack built already is used, and the choice is said once.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers import OnDisk
from yolofeed.pack import codecs


def _auto_choice(yaml_file: Path) -> str:
    """What format=auto picks for a data yaml at imgsz 64, as a new process would."""
    from yolofeed.pack import auto

    auto.forget()
    try:
        return auto.resolve_format({"yaml_file": str(yaml_file)}, codecs.AUTO, 64)
    finally:
        auto.forget()


def test_auto_reads_the_free_space_where_the_packs_would_go(synth_root, tmp_path, monkeypatch):
    from yolofeed.pack import auto, disk

    shutil.copytree(synth_root, tmp_path / "d", ignore=shutil.ignore_patterns("yolofeed-packs"))
    seen = []

    class Small(OnDisk):
        def free(self, folder):
            seen.append(Path(folder))
            return 1000  # 1 kB free: no pack fits

    monkeypatch.setattr(auto, "memory_limit", lambda: 10**12)
    with disk.using(Small()):
        assert _auto_choice(tmp_path / "d" / "data.yaml") == codecs.COMPACT
    assert seen == [tmp_path / "d"]  # the packs' folder does not exist yet: the dataset's folder holds the space


def test_auto_reads_the_free_space_of_the_cache_where_the_dataset_is_read_only(synth_root, tmp_path, monkeypatch):
    """Beside a read-only dataset the packs go to the user cache: its free space decides, not the dataset's disk
    (a 2 MB cache under a read-only dataset on a large disk chose raw, then the val pack did not fit)."""
    from yolofeed.pack import auto, disk

    shutil.copytree(synth_root, tmp_path / "d", ignore=shutil.ignore_patterns("yolofeed-packs"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    beside = tmp_path / "d" / "yolofeed-packs"

    class ReadOnlyDataset(OnDisk):
        def writable(self, folder, create=True):
            return OSError(30, "Read-only file system") if folder.is_relative_to(beside) else super().writable(
                folder, create)

        def free(self, folder):
            return 1000 if Path(folder).is_relative_to(tmp_path / "cache") else 10**12

    monkeypatch.setattr(auto, "memory_limit", lambda: 10**12)
    with disk.using(ReadOnlyDataset()):
        assert _auto_choice(tmp_path / "d" / "data.yaml") == codecs.COMPACT


def test_auto_is_resolved_once_said_and_builds_that_format(synth_root, tmp_path, monkeypatch, caplog):
    import logging

    from yolofeed.pack import auto, rebuild

    def fresh(name: str) -> str:  # the dataset without the packs other tests built into the shared copy
        shutil.copytree(synth_root, tmp_path / name, ignore=shutil.ignore_patterns("yolofeed-packs"))
        return str(tmp_path / name / "data.yaml")

    auto.forget()
    monkeypatch.setattr(auto, "memory_limit", lambda: 10**12)
    yaml_file = fresh("big")
    with caplog.at_level(logging.INFO):
        p = rebuild.open_or_build(yaml_file, "train", 64, format=codecs.AUTO, rebuild="auto", progress=False)
        rebuild.open_or_build(yaml_file, "val", 64, format=codecs.AUTO, rebuild="auto", progress=False)
    assert p.format == codecs.DEFAULT and p.path.parent.name.endswith(f"-{codecs.DEFAULT}-64")
    assert sum(f"format {codecs.DEFAULT} ({codecs.AUTO})" in r.message for r in caplog.records) == 1  # said once
    # the packs of this tiny set take ~0.3 MB raw: 100 KB of memory is too little for them, so the compact format
    monkeypatch.setattr(auto, "memory_limit", lambda: 10**5)
    auto.forget()
    assert rebuild.open_or_build(fresh("small"), "train", 64, format=codecs.AUTO, rebuild="auto",
                                 progress=False).format == codecs.COMPACT
    # ... unless a pack is built already: a machine that would choose otherwise uses it, and builds nothing
    auto.forget()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        again = rebuild.open_or_build(yaml_file, "train", 64, format=codecs.AUTO, rebuild="never", progress=False)
    assert again.path == p.path and again.format == codecs.DEFAULT
    assert any("already built" in r.message and str(p.path) in r.message for r in caplog.records)
    auto.forget()


def test_a_pack_folder_this_user_may_not_enter_is_decided_afresh(synth_root, tmp_path, monkeypatch):
    """``Path.is_file`` raises on EACCES (a folder of mode 000, or another user's of mode 700): auto's look for a
    pack built already was a PermissionError traceback; it now decides afresh, and the build that follows says
    where the packs go (root here ignores modes: the refusal is simulated)."""
    shutil.copytree(synth_root, tmp_path / "d", ignore=shutil.ignore_patterns("yolofeed-packs"))
    real = Path.is_file

    def refused(self):
        if "yolofeed-packs" in self.parts:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "is_file", refused)
    assert _auto_choice(tmp_path / "d" / "data.yaml") in (codecs.DEFAULT, codecs.COMPACT)


def test_a_later_run_in_the_same_process_finds_the_packs_built_or_deleted_since(synth_root, tmp_path, monkeypatch,
                                                                                  caplog):
    """A notebook: a run's packs are built in the default format, then deleted and the dataset packed in the compact
    one by hand (``!yolofeed pack format=jpeg``); the next run in the same interpreter opens those, builds nothing,
    and says why."""
    import logging

    from yolofeed.pack import auto, rebuild

    shutil.copytree(synth_root, tmp_path / "d", ignore=shutil.ignore_patterns("yolofeed-packs"))
    yaml_file = str(tmp_path / "d" / "data.yaml")
    monkeypatch.setattr(auto, "memory_limit", lambda: 10**12)
    auto.forget()
    try:
        first = rebuild.open_or_build(yaml_file, "train", 64, format=codecs.AUTO, rebuild="auto", progress=False)
        assert first.format == codecs.DEFAULT
        shutil.rmtree(first.path.parent)
        rebuild.open_or_build(yaml_file, "train", 64, format=codecs.COMPACT, rebuild="auto", progress=False)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            again = rebuild.open_or_build(yaml_file, "train", 64, format=codecs.AUTO, rebuild="never", progress=False)
        assert again.format == codecs.COMPACT and not first.path.parent.exists()
        assert any(f"format {codecs.COMPACT} ({codecs.AUTO}): the {codecs.COMPACT} pack already built" in r.message
                   for r in caplog.records)
    finally:
        auto.forget()


def test_the_size_estimate_is_made_again_once_the_dataset_changed(dataset, monkeypatch):
    """The packs' estimated sizes are read once while the dataset stays as it is, and again once images are added to
    its train folder (a notebook's loop that grows the set between runs)."""
    from yolofeed.pack import auto
    from yolofeed.pack.source import load_data_yaml

    yaml_file = str(dataset / "data.yaml")
    d = load_data_yaml(yaml_file)
    train = Path(d["path"]) / d["train"]
    assert train.is_relative_to(dataset)  # the private copy's folder, not the session's dataset
    monkeypatch.setattr(auto, "memory_limit", lambda: 10**12)
    auto.forget()
    try:
        for _ in range(2):
            auto.auto_format(yaml_file, 64, None)
        assert auto._sizes.cache_info().misses == 1
        first = sorted(train.iterdir())[0]
        shutil.copy(first, train / f"added{first.suffix}")
        auto.auto_format(yaml_file, 64, None)
        assert auto._sizes.cache_info().misses == 2
    finally:
        auto.forget()
