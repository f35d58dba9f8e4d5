"""Finding a split's files: the same answer as Ultralytics, for every way a data yaml names them."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ultralytics.data.base import BaseDataset
from ultralytics.data.utils import check_det_dataset, img2label_paths

from yolofeed.errors import DatasetError
from yolofeed.pack.source import kpt_shape_of, list_images, load_data_yaml, split_source


def _ultralytics_files(paths):
    fake = SimpleNamespace(prefix="", fraction=1.0)  # get_img_files reads only these two attributes
    return BaseDataset.get_img_files(fake, paths)


def _write_yaml(root: Path, **entries) -> Path:
    f = root / "custom.yaml"
    f.write_text(yaml.safe_dump({"names": {0: "a", 1: "b"}, **entries}))
    return f


@pytest.mark.parametrize("layout", ["relative-dirs", "txt-lists", "list-of-both", "no-path-key"])
def test_split_files_equal_ultralytics(dataset, layout):
    imgs = sorted((dataset / "images" / "train").glob("*.jpg"))
    (dataset / "train.txt").write_text("\n".join(f"./images/train/{p.name}" for p in imgs[:10]))
    (dataset / "val.txt").write_text("\n".join(str(p) for p in imgs[10:14]))
    entries = {
        "relative-dirs": {"path": str(dataset), "train": "images/train", "val": "images/val"},
        "txt-lists": {"path": str(dataset), "train": "train.txt", "val": "val.txt"},
        "list-of-both": {"path": str(dataset), "train": ["train.txt", "images/val"], "val": "val.txt"},
        "no-path-key": {"train": "images/train", "val": "val.txt"},  # root = the yaml's folder
    }[layout]
    f = _write_yaml(dataset, **entries)
    theirs = check_det_dataset(str(f), autodownload=False)
    ours = load_data_yaml(f)
    for split in ("train", "val"):
        assert ours[split] == theirs[split]
        paths = theirs[split] if isinstance(theirs[split], list) else [theirs[split]]
        src = split_source(ours, split)
        assert list(src.im_files) == _ultralytics_files(paths)
        assert list(src.label_files) == img2label_paths(src.im_files)
    assert ours["nc"] == theirs["nc"] == 2


def test_nc_without_names_and_mismatch(dataset):
    f = dataset / "nc.yaml"
    f.write_text(yaml.safe_dump({"path": str(dataset), "train": "images/train", "val": "images/val", "nc": 3}))
    assert load_data_yaml(f)["names"] == ["class_0", "class_1", "class_2"]
    f.write_text(yaml.safe_dump({"path": str(dataset), "train": "images/train", "val": "images/val", "nc": 3,
                                 "names": ["a"]}))
    with pytest.raises(DatasetError, match="'names' has 1 entries but 'nc: 3'"):
        load_data_yaml(f)


@pytest.mark.parametrize("content, words", [
    ({"train": "images/train", "names": ["a"]}, "'val:' key missing"),
    ({"train": "images/train", "val": "images/val"}, "needs 'names:'"),
    ({"train": "images/train", "val": "images/val", "names": ["a"], "channels": 1}, "channels=1"),
])
def test_bad_yaml_is_explained(dataset, content, words):
    f = dataset / "bad.yaml"
    f.write_text(yaml.safe_dump(content))
    with pytest.raises(DatasetError, match=words):
        load_data_yaml(f)


@pytest.mark.parametrize("classes", [{"nc": 0}, {"names": []}, {"nc": -2}, {"nc": 0, "names": []}])
def test_a_data_yaml_with_no_class_is_refused_before_anything_is_built(dataset, capsys, classes):
    """``nc: 0`` was packed, then refused as a damaged pack (its header's nc must be positive), and the rebuild command
    that message gave failed the same way. Now one line up front, through the API and the CLI, and nothing made."""
    from yolofeed.cli import main
    from yolofeed.pack import open_or_build

    f = dataset / "none.yaml"
    f.write_text(yaml.safe_dump({"path": str(dataset), "train": "images/train", "val": "images/val", **classes}))
    given = f"'nc: {classes['nc']}'" if "nc" in classes else "an empty 'names:'"
    words = f"{f}: {given}: 0-class dataset, at least one class name is required in your dataset YAML"
    with pytest.raises(DatasetError, match=re.escape(words)):
        load_data_yaml(f)
    with pytest.raises(DatasetError, match=re.escape(words)):
        open_or_build(f, "train", 64, "raw", rebuild="auto", progress=False)
    assert main(["pack", f"data={f}", "imgsz=64", "format=raw"]) == 1
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and words in lines[0] and "names:" in lines[0], lines
    assert not (dataset / "yolofeed-packs").exists()


def _read_as_other_user(f: Path) -> str:
    try:
        load_data_yaml(f)
    except DatasetError as e:
        return str(e)
    return "read"


def test_a_data_yaml_this_user_may_not_read_is_one_line(synth_root):
    """Was a PermissionError traceback from the YAML reader (found while testing another user's packs)."""
    from helpers import as_another_user, copy_dataset, world_readable_dir

    with world_readable_dir() as shared:
        root = copy_dataset(synth_root, shared / "ds")
        (root / "data.yaml").chmod(0o600 if os.geteuid() == 0 else 0o000)
        root.chmod(0o755)
        message = as_another_user(_read_as_other_user, root / "data.yaml")
        assert message == f"{root / 'data.yaml'}: cannot read it (Permission denied); make it readable by this user " \
                          "(chmod a+r), or pass a data yaml of your own", message


def test_missing_paths_are_named(dataset, tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        load_data_yaml(tmp_path / "absent.yaml")
    f = _write_yaml(dataset, path=str(dataset), train="images/nowhere", val="images/val")
    with pytest.raises(DatasetError, match="images/nowhere' does not exist"):
        split_source(f, "train")
    empty = dataset / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="no images found"):
        list_images([str(empty)])


@pytest.mark.parametrize("entry, words", [
    (5, "'train' must be str or list, not int (it is 5)"),
    ({"dir": "images/train"}, "'train' must be str or list, not dict"),
])
def test_a_split_entry_of_another_type_is_refused_in_ultralytics_words(dataset, entry, words):
    """``train: 5`` was a TypeError traceback, ``train: {dir: ...}`` a path that does not exist; Ultralytics'
    check_det_dataset refuses both by type."""
    f = _write_yaml(dataset, path=str(dataset), train=entry, val="images/val")
    with pytest.raises(TypeError, match=re.escape(words.split(" (")[0])):
        check_det_dataset(str(f), autodownload=False)
    with pytest.raises(DatasetError, match=re.escape(f"{f}: {words}")):
        load_data_yaml(f)


@pytest.mark.parametrize("entries, words", [
    ({"train": ["images/train", None]}, "'train' must be str or list, not a list with a NoneType entry"),
    ({"train": [5]}, "'train' must be str or list, not a list with a int entry"),
    ({"val": None, "validation": 5}, "'val' must be str or list, not int"),  # Ultralytics' other name for val
    ({"names": "abc"}, "'names' must be list or dict, not str (it is 'abc')"),
])
def test_a_split_list_entry_or_a_key_of_another_type_is_one_line(dataset, entries, words):
    f = dataset / "typed.yaml"
    base = {"path": str(dataset), "train": "images/train", "val": "images/val", "names": ["a", "b"]}
    f.write_text(yaml.safe_dump({k: v for k, v in {**base, **entries}.items() if v is not None}))
    with pytest.raises(DatasetError) as e:
        load_data_yaml(f)
    said = str(e.value)
    assert said.startswith(f"{f}: {words}"), said
    assert ("a split names a folder" in said) == (not words.startswith("'names'")), said


def test_names_with_a_gap_in_their_indices_are_refused_as_ultralytics_refuses_them(dataset):
    """``names: {0: a, 2: b}`` was packed with nc 2, and class 2's rows skipped as 'add the class to the yaml's
    names'; Ultralytics refuses the yaml."""
    f = dataset / "gap.yaml"
    f.write_text(yaml.safe_dump({"path": str(dataset), "train": "images/train", "val": "images/val",
                                 "names": {0: "a", 2: "b"}}))
    with pytest.raises(KeyError, match="2-class dataset requires class indices 0-1"):
        check_det_dataset(str(f), autodownload=False)
    with pytest.raises(DatasetError, match=re.escape(f"{f}: names: 2-class dataset requires class indices 0-1, but "
                                                     "you have invalid class indices 0-2 defined in your dataset YAML. "
                                                     "Number the classes")):
        load_data_yaml(f)
    f.write_text("path: " + str(dataset) + "\ntrain: images/train\nval: images/val\nnames: {-1: a, 0: b}\n")
    with pytest.raises(DatasetError, match=re.escape("names: 2-class dataset requires class indices 0-1, but it has "
                                                     "[-1, 0]")):  # passes Ultralytics' own check (its max is 0)
        load_data_yaml(f)
    f.write_text("path: " + str(dataset) + "\ntrain: images/train\nval: images/val\nnames: {'1': b, '0': a}\n")
    theirs = check_det_dataset(str(f), autodownload=False)["names"]  # string keys, out of order: by index
    assert load_data_yaml(f)["names"] == [theirs[i] for i in range(2)] == ["a", "b"]


def test_a_split_list_that_is_not_utf8_text_or_an_image_is_one_line(dataset, capsys):
    """A train.txt saved as UTF-16, one with a latin-1 byte, and a split that names one image were each a
    UnicodeDecodeError traceback (Ultralytics: 'Error loading data from ...')."""
    from yolofeed.cli import main

    imgs = sorted((dataset / "images" / "train").glob("*.jpg"))
    (dataset / "u16.txt").write_text("\n".join(str(p) for p in imgs[:3]), encoding="utf-16")
    (dataset / "latin.txt").write_bytes("\n".join(str(p) for p in imgs[:3]).encode() + b"\n/caf\xe9.jpg")
    for entry, words in (("u16.txt", "is not a list of image paths in UTF-8 text (invalid start byte at byte 0"),
                         ("latin.txt", "is not a list of image paths in UTF-8 text"),
                         (str(imgs[0]), "is an image: a split names a folder of images or a .txt list")):
        f = _write_yaml(dataset, path=str(dataset), train=entry, val="images/val")
        with pytest.raises(DatasetError, match=re.escape(words)):
            split_source(f, "train")
        assert main(["pack", f"data={f}", "imgsz=64", "splits=train"]) == 1
        lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert len(lines) == 1 and words in lines[0] and str(f) in lines[0], lines


def test_fingerprint_follows_files(dataset):
    f = dataset / "data.yaml"
    a = split_source(f, "train").fingerprint()
    assert split_source(f, "train").fingerprint() == a
    lb = next((dataset / "labels" / "train").glob("*.txt"))
    lb.write_text(lb.read_text() + "0 0.5 0.5 0.1 0.1\n")
    assert split_source(f, "train").fingerprint() != a


def test_kpt_shape_is_refused_where_ultralytics_refuses_it_and_keys_the_fingerprint(pose_dataset, dataset):
    """task=pose needs kpt_shape [K > 0, 2 or 3] (YOLODataset refuses the same values, in the words quoted); a
    detection split of a pose yaml reads it too. Another kpt_shape is another fingerprint; a yaml without one hashes
    as before keypoints were read."""
    import hashlib

    from ultralytics.data.dataset import YOLODataset

    d = load_data_yaml(pose_dataset / "data.yaml")
    assert split_source(d, "train", "pose").kpt_shape == (5, 3) and split_source(d, "train", "pose").task == "pose"
    assert split_source(d, "train").kpt_shape == (5, 3) and split_source(d, "train").task == "detect"
    for bad in ([0, 3], [5, 4], [5, 1], None, [5], "5,3", [5.0, 3], [True, 3]):
        with pytest.raises(DatasetError, match=r"'kpt_shape' in data.yaml missing or incorrect.*'kpt_shape: \[17, 3"):
            kpt_shape_of({**d, "kpt_shape": bad}, "pose")
        if isinstance(bad, list) and all(type(x) is int for x in bad) and len(bad) == 2:
            with pytest.raises(ValueError, match="'kpt_shape' in data.yaml missing or incorrect"):
                YOLODataset(img_path=d["train"], data={**d, "kpt_shape": bad}, task="pose")
    with pytest.raises(DatasetError, match=r"'kpt_shape: \[5\]' must be \[number of keypoints, number of dims\]"):
        kpt_shape_of({**d, "kpt_shape": [5]})
    with pytest.raises(DatasetError, match="task=classify: yolofeed packs detect, pose, obb and segment datasets"):
        split_source(d, "train", "classify")
    plain = load_data_yaml(dataset / "data.yaml")
    with pytest.raises(DatasetError, match="missing or incorrect"):
        split_source(plain, "train", "pose")
    src = split_source(plain, "train")
    h = hashlib.sha256(f"nc={src.nc}\0".encode())  # the fingerprint packs were built with before keypoints
    for p in (*src.im_files, *src.label_files):
        st = os.stat(p)
        h.update(os.fsencode(p) + b"\0" + f"{st.st_size}:{st.st_mtime_ns}\0".encode())
    assert src.kpt_shape is None and src.fingerprint() == h.hexdigest()
    pose = split_source(d, "train", "pose")
    assert pose.fingerprint() != split_source({**d, "kpt_shape": [5, 2]}, "train", "pose").fingerprint()
    assert split_source(d, "train").fingerprint() == pose.fingerprint()  # the task is the header's, not the hash's


def test_a_split_the_yaml_lacks_names_the_splits_it_has(dataset, capsys):
    """``yolofeed pack splits=test`` and ``split_source`` say it as ``yolofeed train split=test`` does."""
    from yolofeed.cli import main

    said = ("no 'test:' entry (splits present: train, val): name one of them (yolofeed pack's splits=, a validation's "
            "split=), or add a 'test:' entry")
    with pytest.raises(DatasetError, match=re.escape(said)):
        split_source(dataset / "data.yaml", "test")
    assert main(["pack", f"data={dataset / 'data.yaml'}", "imgsz=64", "splits=test"]) == 1
    assert said in capsys.readouterr().err
