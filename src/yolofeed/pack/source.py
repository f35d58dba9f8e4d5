"""Which files make up a split: the data yaml, image lists and label paths, exactly as Ultralytics reads them.

Mirrors ``ultralytics.data.utils.check_det_dataset`` (path resolution, nc/names) and
``BaseDataset.get_img_files`` (folders, ``.txt`` lists, lists of both) without their side effects:
no downloads, no font checks, no rewriting of user files. ``tests/pack/test_source.py`` holds the two
side by side. A split is read for a task: ``detect``, or ``pose`` with the yaml's ``kpt_shape`` (``kpt_shape_of``).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from yolofeed.errors import DatasetError
from yolofeed.pack.layout import TASKS
from yolofeed.pack.paths import yaml_place
from yolofeed.ultralytics_seam import (
    DATASET_KEY_TYPES,
    DATASETS_DIR,
    IMG_FORMATS,
    YAML,
    check_class_names,
    find_dataset_yaml,
    img2label_paths,
)

SPLIT_KEYS = ("train", "val", "test", "minival")


@dataclass(frozen=True)
class SplitSource:
    """The files of one split and what identifies them.

    Attributes:
        split: "train", "val", ...
        yaml_file: the data yaml the split came from (absolute).
        paths: the split's entries after resolution (folders, list files or images).
        im_files: image files, sorted as Ultralytics sorts them.
        label_files: the label path Ultralytics derives for each image.
        nc: number of classes; labels with a class >= nc are rejected.
        task: "detect", "pose" or "obb" (``TASKS``): which of Ultralytics' label rules apply.
        kpt_shape: the yaml's (keypoints, dims per keypoint), or None. Pose rows are class, box and then these; a
            detection split of such a yaml drops them from rows that have exactly that many columns.
    """

    split: str
    yaml_file: str
    paths: tuple[str, ...]
    im_files: tuple[str, ...]
    label_files: tuple[str, ...]
    nc: int
    names: tuple[str, ...]
    task: str = "detect"
    kpt_shape: tuple[int, int] | None = None

    def stats(self) -> np.ndarray:
        """(2N, 2) int64 [size, mtime in ns] of every image and then every label file (-1, -1: missing): the
        fingerprint's inputs, which a pack records (``layout.source_sections``) to say later what changed."""
        out = np.full((len(self.im_files) + len(self.label_files), 2), -1, np.int64)
        for i, p in enumerate((*self.im_files, *self.label_files)):
            try:
                st = os.stat(p)
            except OSError:
                continue
            out[i] = st.st_size, st.st_mtime_ns
        return out

    def fingerprint(self, stats: np.ndarray | None = None) -> str:
        """A hash of every image and label path with its size and mtime, nc, and kpt_shape where the yaml has one.

        Same inputs as Ultralytics' ``get_hash`` for its label cache (``YOLODataset.get_cache_hash``): an edited,
        added, removed or touched file changes it, and so does another kpt_shape (the task, its other input, is the
        pack header's ``task``). A yaml without kpt_shape hashes as it did before keypoints were read.

        Args:
            stats: ``stats()``, where the caller has it (one stat of every file, not two).
        """
        h = hashlib.sha256(f"nc={self.nc}\0".encode())
        if self.kpt_shape is not None:
            h.update(f"kpt_shape={self.kpt_shape[0]},{self.kpt_shape[1]}\0".encode())
        for p, (size, mtime) in zip((*self.im_files, *self.label_files),
                                    (self.stats() if stats is None else stats).tolist()):  # ints: half the time
            h.update(os.fsencode(p) + b"\0")
            h.update(f"{size}:{mtime}\0".encode() if size >= 0 else b"missing\0")
        return h.hexdigest()


# why data= may not be a list, and what to do instead (the CLI, the trainer and keys.py say it)
DATA_LIST = ("yolofeed trains on one dataset a run: run it once per data yaml, or from Python "
             "YOLO(model).train(trainer=FastDetectionTrainer, data=[...]), Ultralytics' MultiTrainer, which fine-tunes "
             "on each in turn with yolofeed's trainer")


def check_data_path(data: Any) -> None:
    """Refuse a ``data=`` that is no path: Ultralytics' trainer reads the yaml from a path (a dict fails deep inside
    it, a TypeError).

    Raises:
        DatasetError: naming what was given and how to pass it.
    """
    if isinstance(data, (list, tuple)):
        raise DatasetError(f"data={data}: {DATA_LIST}")
    if isinstance(data, Mapping):
        raise DatasetError("data= takes the path of a data yaml, not a dict: write the dict to a .yaml file "
                           "(yaml.safe_dump) and pass that file's path")
    if not isinstance(data, (str, os.PathLike)):
        raise DatasetError(f"data= takes the path of a data yaml; got {data!r}: pass data=path/to/data.yaml")
    suffix = Path(data).suffix.lower()
    if suffix == ".ndjson":  # Ultralytics' trainer converts it, fetching its images; its assertion said only that
        raise DatasetError(f"data={data}: an NDJSON dataset (an Ultralytics Platform export), which yolofeed does not "
                           "convert: convert it once with Ultralytics, which fetches its images (python -c \"from "
                           "ultralytics.data.converter import convert_ndjson_to_yolo as c; "
                           f"print(c('{data}'))\"), and pass the data.yaml it prints")
    if suffix == ".txt":  # "Not a YAML file", from Ultralytics' reader, in yolo train too
        raise DatasetError(f"data={data}: a .txt list of images belongs in a data yaml (train: {Path(data).name}, "
                           "or val:); pass a data yaml with path:, train:, val: and names:")


def load_data_yaml(data: str | os.PathLike) -> dict[str, Any]:
    """Read an Ultralytics data yaml and resolve its paths as ``check_det_dataset`` does.

    ``data`` is a path, or the name of a dataset yaml Ultralytics ships (``coco8.yaml``), found as ``yolo train``
    finds it. Nothing is downloaded (``check_downloaded``).

    Raises:
        DatasetError: the file is missing or not a mapping, ``train``/``val`` or ``names``/``nc``
            are missing or inconsistent; the images of a dataset Ultralytics would download are not here.
    """
    check_data_path(data)
    found = find_dataset_yaml(Path(data).expanduser())
    file = Path(found) if found else Path(data).expanduser()
    if not file.is_file():
        raise DatasetError(f"data yaml '{data}' not found: neither a file nor a dataset yaml Ultralytics ships (such "
                           "as coco8.yaml). Pass data=path/to/data.yaml (or run 'yolofeed synth' to make a dataset "
                           "to try).")
    if file.suffix.lower() == ".zip":  # yolo train and yolofeed train unzip it there (check_det_dataset)
        raise DatasetError(f"data={data}: a zipped dataset, which yolofeed pack does not unzip: unzip it and pass its "
                           f"data.yaml (yolofeed train data={data} unzips it into Ultralytics' datasets folder, "
                           f"{DATASETS_DIR}, as yolo train does)")
    if file.suffix.lower() not in (".yaml", ".yml"):
        raise DatasetError(f"data='{data}' is not a .yaml file: yolofeed packs Ultralytics detection data yamls.")
    try:
        d = YAML.load(file, append_filename=True)
    except ValueError as e:
        raise DatasetError(f"{file}: not a valid YAML mapping ({e}). Fix the file's syntax.") from None
    except OSError as e:  # another user's file, mode 000
        raise DatasetError(f"{file}: cannot read it ({e.strerror or e}); make it readable by this user "
                           "(chmod a+r), or pass a data yaml of your own") from None
    if not isinstance(d, dict) or not d:
        raise DatasetError(f"{file}: empty or not a mapping. A data yaml needs train:, val: and names:.")
    if "val" not in d and "validation" in d:
        d["val"] = d.pop("validation")
    for key, types in DATASET_KEY_TYPES.items():  # check_det_dataset's own check, in its words
        value = d.get(key)
        wrong = value is not None and not isinstance(value, types)
        if key in SPLIT_KEYS and isinstance(value, list) and not wrong:
            wrong = not all(isinstance(x, str) for x in value)  # each entry a path too (Ultralytics: a TypeError later)
        if wrong:
            expected = " or ".join(t.__name__ for t in types)
            got = (type(value).__name__ if not isinstance(value, list) else
                   f"a list with a {next(type(x).__name__ for x in value if not isinstance(x, str))} entry")
            raise DatasetError(f"{file}: '{key}' must be {expected}, not {got} (it is {value!r})"
                               + (": a split names a folder of images, a .txt list of image paths, or a list of those"
                                  if key in SPLIT_KEYS else ""))
    for k in ("train", "val"):
        if k not in d:
            raise DatasetError(f"{file}: '{k}:' key missing. 'train' and 'val' are required in all data yamls.")
    names, nc = d.get("names"), d.get("nc")
    if names is None and nc is None:
        raise DatasetError(f"{file}: needs 'names:' (a list or an index->name mapping) or 'nc:'.")
    if nc is not None:
        try:
            if float(nc) != int(float(nc)):
                raise ValueError
            nc = int(float(nc))
        except (TypeError, ValueError):
            raise DatasetError(f"{file}: 'nc: {d['nc']}' must be an integer.") from None
    if names is not None:
        if isinstance(names, dict):  # Ultralytics' rule: the indices 0 to n - 1, each once, in any order
            try:
                names = check_class_names(names)
            except (KeyError, TypeError, ValueError) as e:
                said = e.args[0] if isinstance(e, KeyError) and e.args else str(e)  # a KeyError's str() quotes it
                raise DatasetError(f"{file}: names: {said.rstrip('.')}. Number the classes 0 to n - 1 (or list them: "
                                   "names: [a, b, ...])") from None
            if sorted(names) != list(range(len(names))):  # {-1: a, 0: b} passes Ultralytics' check (its max is 0)
                raise DatasetError(f"{file}: names: {len(names)}-class dataset requires class indices 0-"
                                   f"{len(names) - 1}, but it has {sorted(names)}. Number the classes 0 to n - 1 "
                                   "(or list them: names: [a, b, ...])")
            names = [names[i] for i in range(len(names))]
        names = list(names)
        if nc is not None and len(names) != nc:
            raise DatasetError(f"{file}: 'names' has {len(names)} entries but 'nc: {nc}'. Make them match.")
        nc = len(names)
    else:
        names = [f"class_{i}" for i in range(nc)]
    if nc < 1:  # refused here rather than built and then refused as a damaged pack
        given = f"'nc: {d['nc']}'" if d.get("nc") is not None else "an empty 'names:'"
        raise DatasetError(f"{file}: {given}: 0-class dataset, at least one class name is required in your dataset "
                           "YAML (Ultralytics' words: it refuses such a set too). List the classes in names:")
    d["nc"], d["names"] = nc, [str(n) for n in names]
    if d.get("channels", 3) != 3:
        raise DatasetError(f"{file}: channels={d['channels']}; yolofeed packs 3-channel (RGB) datasets only: train "
                           "this one with yolo train")
    _resolve_paths(d)
    d["yaml_file"] = str(yaml_place(file))  # a linked yaml: its own folder's packs (paths.yaml_place)
    _refuse_undownloaded(d, data)
    return d


def _resolve_paths(d: dict[str, Any]) -> None:
    """The dataset root and each split's paths made absolute in ``d``, as ``check_det_dataset`` makes them."""
    path = Path(d.get("path") or Path(d["yaml_file"]).parent)  # dataset root
    if not path.exists() and not path.is_absolute():
        path = (DATASETS_DIR / path).resolve()  # Ultralytics' settings folder, as check_det_dataset does
    d["path"] = path
    for k in SPLIT_KEYS:
        if d.get(k):
            if isinstance(d[k], str):
                x = (path / d[k]).resolve()
                if not x.exists() and d[k].startswith("../"):
                    x = (path / d[k][3:]).resolve()
                d[k] = str(x)
            else:
                d[k] = [str((path / x).resolve()) for x in d[k]]


def _refuse_undownloaded(d: dict[str, Any], data: Any) -> None:
    """Refuse a dataset whose yaml says how to download it (``download:``) while its train or val images are not
    here: where ``check_det_dataset`` would download it, yolofeed says what is missing.

    Raises:
        DatasetError: naming the first missing path and the command that downloads the set with Ultralytics.
    """
    if not d.get("download"):
        return
    missing = [p for k in ("train", "val") for p in ([d[k]] if isinstance(d.get(k), str) else d.get(k) or [])
               if not Path(p).exists()]
    if not missing:
        return
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    call = f"check_det_dataset({json.dumps(str(data))})"
    fetch = shlex.join(["python", "-c", f"from ultralytics.data.utils import check_det_dataset; {call}"])
    raise DatasetError(f"data={data}: the images of {Path(d['yaml_file']).name} are not on this machine: {missing[0]} "
                       f"does not exist{more}. yolofeed does not download datasets (Ultralytics would, here, from the "
                       f"yaml's download: entry): download it once with Ultralytics, {fetch}, which puts it in "
                       f"{d['path']}; or pass data= the yaml of a copy you have")


def check_downloaded(data: Any) -> None:
    """``_refuse_undownloaded`` for ``data=`` before Ultralytics' ``check_det_dataset`` reads it (which would download
    the set); quiet about a yaml it cannot read or resolve: Ultralytics' own check says what is wrong with it.

    Raises:
        DatasetError: the images of a dataset Ultralytics would download are not here.
    """
    if not isinstance(data, (str, os.PathLike)) or (found := find_dataset_yaml(Path(data).expanduser())) is None:
        return
    try:
        d = YAML.load(found, append_filename=True)
        if not isinstance(d, dict):
            return
        _resolve_paths(d)
    except Exception:  # broken YAML, odd paths: said by check_det_dataset, in Ultralytics' words
        return
    _refuse_undownloaded(d, data)


def list_images(paths: list[str]) -> list[str]:
    """Image files under folders, in ``.txt`` lists (``./`` relative to the list) or given directly.

    Raises:
        DatasetError: a path does not exist or nothing in it is an image.
    """
    found: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += glob.glob(str(Path(glob.escape(p)) / "**" / "*.*"), recursive=True)
        elif p.is_file():  # a list of image paths, one a line (Ultralytics reads any file here as one)
            if p.suffix[1:].lower() in IMG_FORMATS:
                raise DatasetError(f"'{p}' is an image: a split names a folder of images or a .txt list of image "
                                   "paths, one a line (Ultralytics reads a file there as such a list); give its folder")
            try:
                with open(p, encoding="utf-8-sig") as t:
                    lines = t.read().strip().splitlines()
            except UnicodeDecodeError as e:
                raise DatasetError(f"'{p}' is not a list of image paths in UTF-8 text ({e.reason} at byte {e.start}; "
                                   "saved as UTF-16 or another encoding?): save it as UTF-8, one image path a "
                                   "line") from None
            except OSError as e:
                raise DatasetError(f"'{p}': cannot read this list of images ({e.strerror or e}); make it readable "
                                   "by this user") from None
            parent = str(p.parent) + os.sep
            found += [x.replace("./", parent, 1) if x.startswith("./") else x for x in lines]
        else:
            raise DatasetError(f"'{p}' does not exist. Check the data yaml's path: and split entries.")
    im_files = sorted(x.replace("/", os.sep) for x in found if x.rpartition(".")[-1].lower() in IMG_FORMATS)
    if not im_files:
        raise DatasetError(f"no images found in {', '.join(paths)}. "
                           f"Supported formats: {', '.join(sorted(IMG_FORMATS))}.")
    return im_files


def kpt_shape_of(d: dict[str, Any], task: str = "detect") -> tuple[int, int] | None:
    """The data yaml's ``kpt_shape`` as (keypoints, dims), or None where it has none (and the task is not pose).

    Ultralytics' rule (``YOLODataset.__init__``): pose needs ``kpt_shape: [K, D]`` with K > 0 and D 2 (x, y) or 3
    (x, y, visibility); a detection split reads it, when given, only to drop keypoints from pose rows.

    Raises:
        DatasetError: ``task`` is not one of ``TASKS``; pose without a valid kpt_shape; a kpt_shape that is not two
            whole numbers.
    """
    if task not in TASKS:
        raise DatasetError(f"task={task}: yolofeed packs {', '.join(TASKS[:-1])} and {TASKS[-1]} datasets")
    shape = d.get("kpt_shape")
    whole = (isinstance(shape, (list, tuple)) and len(shape) == 2
             and all(isinstance(x, int) and not isinstance(x, bool) for x in shape))
    if task == "pose" and not (whole and shape[0] > 0 and shape[1] in (2, 3)):
        raise DatasetError(f"{d.get('yaml_file', 'the data yaml')}: 'kpt_shape' in data.yaml missing or incorrect "
                           f"(it is {shape!r}). Should be a list with [number of keypoints, number of dims (2 for x,y "
                           "or 3 for x,y,visible)], i.e. 'kpt_shape: [17, 3]' (Ultralytics' words: a pose dataset "
                           "needs it)")
    if shape is None:
        return None
    if not whole or min(shape) < 0:
        raise DatasetError(f"{d.get('yaml_file', 'the data yaml')}: 'kpt_shape: {shape!r}' must be [number of "
                           "keypoints, number of dims], e.g. [17, 3]; fix it or remove it (a detection dataset does "
                           "not need it)")
    return (shape[0], shape[1]) if shape[0] * shape[1] else None


def missing_split(d: dict[str, Any], split: str) -> str:
    """What to say of a data yaml (loaded) that has no ``split:`` entry: the splits it has, and the way on."""
    return (f"no '{split}:' entry (splits present: {', '.join(k for k in SPLIT_KEYS if d.get(k))}): name one of them "
            f"(yolofeed pack's splits=, a validation's split=), or add a '{split}:' entry to the yaml")


def split_source(data: str | os.PathLike | dict[str, Any], split: str, task: str = "detect") -> SplitSource:
    """The files of ``split`` in a data yaml (a path, or a dict already loaded by ``load_data_yaml``), for ``task``.

    Raises:
        DatasetError: as ``load_data_yaml``, ``list_images`` and ``kpt_shape_of``.
    """
    from yolofeed.ultralytics_seam import check_task

    check_task(task)  # pose: the installed release's pose rules must be the ones yolofeed follows
    d = data if isinstance(data, dict) else load_data_yaml(data)
    kpt_shape = kpt_shape_of(d, task)  # before listing the images: a pose yaml without kpt_shape is refused at once
    if not d.get(split):
        raise DatasetError(f"{d['yaml_file']}: {missing_split(d, split)}")
    paths = d[split] if isinstance(d[split], list) else [d[split]]
    try:
        im_files = list_images(paths)
    except DatasetError as e:  # which key of which yaml names the path
        raise DatasetError(f"{d['yaml_file']}: '{split}:' {e}") from None
    return SplitSource(split=split, yaml_file=d["yaml_file"], paths=tuple(paths), im_files=tuple(im_files),
                       label_files=tuple(img2label_paths(im_files)), nc=d["nc"], names=tuple(d["names"]), task=task,
                       kpt_shape=kpt_shape)
