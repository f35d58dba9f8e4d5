"""Where the packs of a data yaml live (pack/paths.py): a folder per dataset, format and size, beside the yaml, under
``out=`` or, for a read-only dataset, in the user's cache. RELIABILITY.md lists these tests with their outcomes.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

import pytest

from helpers import cli_lines
from yolofeed.cli import main
from yolofeed.errors import PackError
from yolofeed.pack import open_or_build, paths
from yolofeed.pack.rebuild import ensure_split


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
    a_out = paths.pack_folders(tmp_path / "a" / "data.yaml", 640, "raw", out=tmp_path / "o")
    b_out = paths.pack_folders(tmp_path / "b" / "data.yaml", 640, "raw", out=tmp_path / "o")
    assert a_out[0] == b_out[0] == tmp_path / "o" / "data-raw-640"  # out= gets the per-dataset folder too
    assert a_out[1] != b_out[1] and a_out[1].parent == tmp_path / "o" and a_out[1].name.startswith("data-")


def test_datasets_sharing_one_linked_yaml_keep_their_packs_beside_their_own_images(dataset, tmp_path):
    """Two dataset folders whose data.yaml are links to one file (splits relative to each link's folder, as in stock):
    both keyed their packs by the file linked to, so each build found the other's pack stale and rebuilt it, at
    every switch (found by an exports tester). Now each folder's packs lie beside its link and are reused; a yaml read
    through a linked folder still finds the packs of the folder it lies in."""
    from helpers import copy_dataset

    shared = tmp_path / "configs" / "data.yaml"
    shared.parent.mkdir()
    import yaml

    names = yaml.safe_load((dataset / "data.yaml").read_text())["names"]
    shared.write_text(yaml.safe_dump({"train": "images/train", "val": "images/val", "names": names}))
    roots = [copy_dataset(dataset, tmp_path / name) for name in ("ds_a", "ds_b")]
    next((roots[1] / "images" / "train").iterdir()).unlink()  # the two sets differ
    for root in roots:
        (root / "data.yaml").unlink()
        (root / "data.yaml").symlink_to(os.path.relpath(shared, root))

    def build(root):
        return ensure_split(root / "data.yaml", "train", 64, "raw", workers=1, progress=False, rebuild="auto")

    first = [build(root) for root in roots]
    assert [r.pack.path.parent.parent for r in first] == [root / "yolofeed-packs" for root in roots]
    assert not any(build(root).built for root in roots + roots)  # each reused, in either order
    assert len(first[0].pack) == len(first[1].pack) + 1
    linked = tmp_path / "via-link"
    linked.symlink_to(roots[0], target_is_directory=True)
    assert ensure_split(linked / "data.yaml", "train", 64, "raw", workers=1, progress=False,
                        rebuild="never").pack.path == first[0].pack.path
    # one folder, a link switched between two versions of its yaml (v2 without an image): each version's packs kept
    versions = roots[0]
    (versions / "v1.yaml").write_text(shared.read_text())
    (versions / "v2.yaml").write_text(shared.read_text().replace("images/train", "images/train2"))
    shutil.copytree(versions / "images" / "train", versions / "images" / "train2")
    shutil.copytree(versions / "labels" / "train", versions / "labels" / "train2")
    next((versions / "images" / "train2").iterdir()).unlink()
    current = versions / "current.yaml"
    built = []
    for v in ("v1", "v2", "v1", "v2"):
        current.unlink(missing_ok=True)
        current.symlink_to(f"{v}.yaml")
        r = ensure_split(current, "train", 64, "raw", workers=1, progress=False, rebuild="auto")
        built.append((r.built, r.pack.path.parent.name))
    assert built == [(True, "v1-raw-64"), (True, "v2-raw-64"), (False, "v1-raw-64"), (False, "v2-raw-64")]


def test_two_datasets_named_data_yaml_in_one_pack_folder_keep_their_packs(dataset, tmp_path, caplog):
    """Two datasets' data.yaml under one out=: the second used to find the first's pack in <out>/data-raw-64, call it
    stale and rebuild over it, and each run of either rebuilt the other's. The second now builds in
    <out>/data-<hash of its path>-raw-64, and both are reused from then on, whatever rebuild= asks."""
    from helpers import copy_dataset

    a, b = dataset / "data.yaml", copy_dataset(dataset, tmp_path / "other") / "data.yaml"
    out = tmp_path / "shared"

    def build(y, **kw):
        return ensure_split(y, "train", 64, "raw", out=out, workers=1, progress=False, **kw)

    first = build(a, rebuild="auto")
    with caplog.at_level(logging.INFO):
        second = build(b, rebuild="auto")
    assert first.pack.path.parent == out / "data-raw-64" and second.built
    assert second.pack.path.parent == paths.pack_folders(b, 64, "raw", out)[1]
    assert f"{out / 'data-raw-64'} holds the packs of another data yaml named data.yaml" in caplog.text
    again = [build(a, rebuild="auto"), build(b, rebuild="auto"), build(b, rebuild="never"), build(a, rebuild="never")]
    assert not any(r.built for r in again)  # neither replaced the other's
    assert [r.pack.path for r in again] == [first.pack.path, second.pack.path, second.pack.path, first.pack.path]
    assert build(b, rebuild="always").pack.path == second.pack.path  # "always" rebuilds its own, not a's
    assert build(a, rebuild="auto").built is False
    fix = paths.fix_from_header(second.pack.path, second.pack.header)  # the command in its messages
    assert f"out={out}" in fix and f"data={b}" in fix
    # a third yaml of that name whose second folder is a link planted to the first's: neither is replaced
    c = copy_dataset(dataset, tmp_path / "third") / "data.yaml"
    hashed = paths.pack_folders(c, 64, "raw", out)[1]
    hashed.symlink_to(out / "data-raw-64", target_is_directory=True)
    before = first.pack.path.read_bytes()
    for rebuild in ("auto", "always"):
        with pytest.raises(PackError, match=r"hold another data yaml's packs .*yolofeed replaces none of them"):
            build(c, rebuild=rebuild)
    assert first.pack.path.read_bytes() == before
    # without out=, a dataset copied with its packs: the copy's folder holds the original's pack, rebuilt in place
    ensure_split(a, "train", 64, "raw", workers=1, progress=False, rebuild="auto")
    copied = copy_dataset(dataset, tmp_path / "moved")
    shutil.copytree(dataset / "yolofeed-packs", copied / "yolofeed-packs")
    own = ensure_split(copied / "data.yaml", "train", 64, "raw", workers=1, progress=False, rebuild="auto")
    assert own.built and own.pack.path == copied / "yolofeed-packs" / "data-raw-64" / "train.yfpack"


def test_two_datasets_and_two_sizes_in_one_pack_folder_keep_their_packs(dataset, tmp_path, caplog):
    """``out=``/``pack_dir=`` put every pack directly in the folder: a second dataset or imgsz replaced the first's
    pack, and each run rebuilt the other's. Now each gets <yaml stem>-<format>-<imgsz> there, as the default
    location always had; a pack left directly in out= by an older yolofeed is named, not used nor deleted."""
    from yolofeed.pack.rebuild import check_split, ensure_split

    a = dataset / "data.yaml"
    b = dataset / "coco.yaml"
    b.write_text(a.read_text())
    out = tmp_path / "shared"
    runs = [(a, 64), (a, 96), (b, 64)]

    def each(**kw):
        return [ensure_split(y, "train", s, "raw", out=out, workers=1, progress=False, **kw) for y, s in runs]

    first = each(rebuild="auto")
    assert all(r.built for r in first) and len({r.pack.path for r in first}) == 3
    assert [r.pack.path.parent for r in first] == [out / "data-raw-64", out / "data-raw-96", out / "coco-raw-64"]
    assert not any(r.built for r in each(rebuild="auto"))  # nothing rebuilt: no pack replaced another
    for y, s in runs:  # yolofeed train's own check (pack_dir= is out=) finds each
        check_split(y, "train", s, "raw", out, "never")
    rc, lines = cli_lines(["pack", f"data={b}", "imgsz=64", "format=raw", "splits=train", f"out={out}"])
    assert rc == 0 and not lines

    old = out / "train.yfpack"  # where an older yolofeed put the pack
    old.write_bytes(first[0].pack.path.read_bytes())
    with pytest.raises(PackError, match=rf"{out / 'data-raw-32' / 'train.yfpack'} does not exist \({old} is where "
                                        r"packs of out= went before .*delete it once nothing needs it\)"):
        ensure_split(a, "train", 32, "raw", out=out, rebuild="never")
    with caplog.at_level(logging.INFO):
        ensure_split(a, "train", 32, "raw", out=out, rebuild="auto", workers=1, progress=False)
    assert f"building the train pack in {out / 'data-raw-32'} ({old} is where packs of out= went" in caplog.text
    assert old.read_bytes() == first[0].pack.path.read_bytes()


def test_a_pose_pack_has_a_folder_of_its_own_and_its_rebuild_command_says_task_pose(tmp_path):
    """``-pose`` after the detection folder's name, beside the yaml, under out= and in the cache; the command read
    from a pose pack's header names task=pose (a detection pack's names no task, as before)."""
    from yolofeed.pack.paths import fix_from_header, pack_folders, rebuild_command, store_dir

    y = tmp_path / "data.yaml"
    y.write_text("")
    assert store_dir(y, 640, "raw", task="pose").name == "data-raw-640-pose"
    assert store_dir(y, 640, "raw").name == "data-raw-640"
    assert [f.name for f in pack_folders(y, 640, "jpeg", task="pose")] == ["data-jpeg-640-pose"] * 2
    assert pack_folders(y, 640, "raw", tmp_path / "out", task="pose")[0] == tmp_path / "out" / "data-raw-640-pose"
    assert rebuild_command(str(y), 640, "raw", task="pose").endswith("imgsz=640 format=raw task=pose rebuild=always")
    header = {"source": {"data": str(y)}, "imgsz": 640, "storage": "raw", "task": "pose"}
    assert fix_from_header(store_dir(y, 640, "raw", task="pose") / "train.yfpack", header) == (
        f"rebuild it with: {rebuild_command(str(y), 640, 'raw', task='pose')}")
    out = tmp_path / "out"
    assert f"task=pose out={out} " in fix_from_header(store_dir(y, 640, "raw", out, "pose") / "train.yfpack", header)
    assert "task=" not in fix_from_header(store_dir(y, 640, "raw") / "train.yfpack", {**header, "task": "detect"})


def test_rebuild_commands_name_out_as_an_absolute_path(tmp_path, monkeypatch):
    """A relative out= in a rebuild command built elsewhere when pasted in another folder (data= was absolute)."""
    monkeypatch.chdir(tmp_path)
    command = paths.rebuild_command(str(tmp_path / "data.yaml"), 64, "raw", "sp")
    assert f"out={tmp_path / 'sp'}" in command and "out=sp " not in command


def test_a_link_where_the_pack_folder_goes_is_said_to_be_one(dataset, tmp_path):
    """A dangling link at each folder out= could take was said as "cannot write packs to ... (File exists)": the line
    now says what is there (and the link's target is not made)."""
    yaml_file = dataset / "data.yaml"
    out = tmp_path / "out"
    out.mkdir()
    for folder in paths.pack_folders(yaml_file, 64, "raw", out=out):
        folder.symlink_to(tmp_path / f"gone-{folder.name}")
    first = paths.pack_folders(yaml_file, 64, "raw", out=out)[0]
    with pytest.raises(PackError) as e:
        open_or_build(yaml_file, "train", 64, out=out, rebuild="auto", progress=False)
    assert (f"cannot write packs to {first} (it is a symbolic link to {tmp_path / ('gone-' + first.name)} (which does "
            "not exist)); pass a writable folder") in str(e.value)
    assert not list(tmp_path.glob("gone-*"))
