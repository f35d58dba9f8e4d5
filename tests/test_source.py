"""Finding a split's files: the same answer as Ultralytics, for every way a data yaml names them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ultralytics.data.base import BaseDataset
from ultralytics.data.utils import check_det_dataset, img2label_paths

from yolofeed.errors import DatasetError
from yolofeed.pack.source import list_images, load_data_yaml, split_source


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


def test_fingerprint_follows_files(dataset):
    f = dataset / "data.yaml"
    a = split_source(f, "train").fingerprint()
    assert split_source(f, "train").fingerprint() == a
    lb = next((dataset / "labels" / "train").glob("*.txt"))
    lb.write_text(lb.read_text() + "0 0.5 0.5 0.1 0.1\n")
    assert split_source(f, "train").fingerprint() != a
