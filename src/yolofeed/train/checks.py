"""What a run checks of its data before it trains, and what it says of the pack it trains from.

The checks run before Ultralytics makes the run folder or builds the model (``check_data_yaml``, ``check_task_data``,
``check_run_folder``; ``first_polygon_labels`` for ``copy_paste``): a mistake costs one line, not a traceback after
minutes of set-up. They read the yaml and at most ``SAMPLED_LABELS`` label files; the pack's build reads them all.
The warnings say, once a run, where the pack a run trains from differs from what ``yolo train`` would train on.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from pathlib import Path
from typing import Any

import numpy as np

from yolofeed.augment.geometry.polygons import POINTS as POLYGON_POINTS
from yolofeed.errors import ConfigError, DatasetError, describe
from yolofeed.loader.train import subset
from yolofeed.pack.source import check_data_path, check_downloaded, load_data_yaml, missing_split
from yolofeed.train import keys
from yolofeed.ultralytics_seam import LOGGER, RUN_FILES, check_det_dataset


def warn_single_cls_gap(pack: Any) -> None:
    """Say which images ``yolo train single_cls=True`` would use and the pack left out.

    Under ``single_cls`` Ultralytics' label check skips the class range (``verify_image_label``: ``max_cls = 0``),
    so it keeps images whose class ids exceed ``nc``; a pack is built once for every run and skips them. Such
    labels are a mistake in the dataset either way: say so, with the fix, rather than train on fewer images silently.
    """
    out_of_range = [f for f, reason in pack.header.get("skipped", []) if "but the data yaml has nc=" in reason]
    if out_of_range:
        LOGGER.warning(f"yolofeed: single_cls=True: {len(out_of_range)} {pack.split} images use class ids beyond the "
                       f"data yaml's nc; yolo train would train on them under single_cls, the pack left them out "
                       f"(first: {out_of_range[0]}; all: {pack.path.with_name(pack.split + '.report.txt')})"
                       + ("; one with box rows would also make yolo train drop every polygon of these labels, whose "
                          "boxes it would then move as boxes" if pack.polygon_lengths is not None else "")
                       + ". Fix their labels or the yaml's names, then the pack rebuilds")


def warn_mixed_rows(pack: Any, fraction: float | int) -> None:
    """Ultralytics' warning, in its words, where the detection images a run uses hold polygon and box rows mixed: its
    dataset then drops every polygon (``YOLODataset.get_labels``, after ``fraction=`` cut the files) and says so each
    run; the pack dropped them when it was built. With the whole split, its counts (``polygon_rows``, recorded since
    packs carry it); with a share, which rows it holds is not recorded: said without them."""
    box_images = pack.header.get("box_row_images")
    if not box_images:
        return
    tail = ("To resolve this only boxes will be used and all segments will be removed. To avoid this please supply "
            "either a detect or segment dataset, not a detect-segment mixed dataset.")
    polygons = pack.header.get("polygon_rows")
    if fraction == 1.0:
        counts = ("" if polygons is None else
                  f", but got len(segments) = {polygons}, len(boxes) = {pack.header['counts']['boxes']}")
        LOGGER.warning(f"yolofeed: {pack.split}: Box and segment counts should be equal{counts}. {tail}")
        return
    used = subset(pack, fraction)
    boxes_only = np.isin(used, box_images)
    if boxes_only.any() and (pack.index["label_count"][used][~boxes_only] > 0).any():
        LOGGER.warning(f"yolofeed: {pack.split}, fraction={fraction}: Box and segment counts should be equal in the "
                       f"images this run uses. {tail}")


def warn_polygons_in_share(pack: Any, fraction: float | int) -> None:
    """Say where a ``fraction=`` share of a detection split holds only polygon rows and the pack no polygons.

    Ultralytics cuts the split's files before its label rule, so on a split of polygon and box rows mixed its share
    can be all polygons, whose boxes it then makes of the moved polygons; the pack, built once for every share, kept
    none (some of its images hold box rows: ``box_row_images``), and here the boxes are moved as boxes."""
    box_images = pack.header.get("box_row_images")
    if fraction == 1.0 or pack.polygon_lengths is not None or not box_images:
        return
    used = subset(pack, fraction)
    if len(used) and not np.isin(used, box_images).any() and pack.index["label_count"][used].any():
        LOGGER.warning(f"yolofeed: fraction={fraction}: the {pack.split} images this run uses have polygon rows only, "
                       f"so yolo train would make their augmented boxes of the moved polygons; the pack of the whole "
                       f"split keeps no polygons ({len(box_images)} of its images have box rows), so here the boxes "
                       "move as boxes. Train on a split of polygon rows only for stock's boxes")


def warn_long_polygons(pack: Any, labels: Any) -> None:
    """Say which polygon makes every training batch wider than Ultralytics' 1,000 points, and what it costs.

    Ultralytics resamples an image's polygons to 1,000 points, or one more than its longest where that is longer, for
    that image alone. The training batches here have one static shape (CUDA graphs replay it): every polygon slot of
    every batch is padded to the pack's longest polygon, so resampling, warping, the boxes and the masks (work and
    memory per slot and point) cost that many times more on every step, not only where that image is drawn (one
    5,000-point polygon in 25 images: 4.6x the step time on the CPU). Said once, with the file and the fix, rather
    than slow silently.
    """
    width = labels.polygon_width
    if width <= POLYGON_POINTS:
        return
    row = int(np.argmax(labels.polygons[2]))
    image = int(np.searchsorted(np.cumsum(labels.count), row, side="right"))  # the image owning label row ``row``
    LOGGER.warning(f"yolofeed: {pack.im_files[image]} has a polygon of {width:,} points: every training batch pads "
                   f"its polygons to {width + 1:,} points (Ultralytics' 1,000 for the other images), so the polygon "
                   f"work and memory of each step (its masks' too, where made) are about "
                   f"{(width + 1) / POLYGON_POINTS:.1f}x; simplify that outline to 1,000 points or fewer (e.g. "
                   "cv2.approxPolyDP) for the usual speed and memory")


def check_data_yaml(data: Any, split: str) -> dict[str, Any]:
    """Ultralytics' ``check_det_dataset``, its complaint as one ``DatasetError`` line that keeps its reason.

    Raises:
        DatasetError: the yaml is missing, broken, lacks train/val/names, or the split's images are missing.
    """
    check_data_path(data)  # a dict fails deep inside Ultralytics' trainer
    check_downloaded(data)  # where check_det_dataset would download the set: what is missing, in one line
    try:
        return check_det_dataset(data, autodownload=False, split=split)  # nothing may download at run time
    except Exception as e:  # get_dataset turns any of them into "Dataset '...' error": user input, not a bug
        reason = " ".join(str(e).replace(" ❌", "").replace("❌", "").split())
        if f"'{split}:'" in reason:  # Ultralytics says "images not found" where the yaml has no such entry
            with contextlib.suppress(Exception):
                d = load_data_yaml(data)
                if not d.get(split):
                    reason = missing_split(d, split)
        raise DatasetError(f"data={data}: {reason}") from None


def check_resumed_classes(checkpoint: str, data: dict[str, Any]) -> None:
    """Refuse a resume whose data yaml (``check_data_yaml``'s ``data``) has another number of classes than the
    checkpoint's model: Ultralytics would rebuild the model's head for the new count and go on, its labels of the
    classes beyond it dropped, no longer the run that was stopped. Reads the checkpoint once more.

    Raises:
        DatasetError: naming both counts and the two ways on.
    """
    from yolofeed.train.checkpoints import model_classes

    trained, nc = model_classes(checkpoint), data.get("nc")
    if trained is None or nc is None or trained == nc:
        return
    yaml = data.get("yaml_file", "the data yaml")
    raise DatasetError(f"data={yaml} has {nc} classes, and resume={checkpoint} trained a model of {trained}: a resume "
                       "goes on with the classes it trained; give it the data it trained on, or start a new run from "
                       f"its weights: yolofeed train model={checkpoint} data={yaml}")


SAMPLED_LABELS = 200  # label files check_task_data reads at most, looking for the first with rows


def check_task_data(model: str, task: str, data: str) -> None:
    """Refuse in one line a dataset the model's task cannot train on, where Ultralytics' own trainer (the stock side
    of doctor, bench and parity) would stop in a traceback: a pose model needs the yaml's ``kpt_shape``; an
    oriented-box or segmentation model, rows of points, not of boxes (Ultralytics requires as many segments as boxes).
    The first label file with rows among the train split's first ``SAMPLED_LABELS`` decides; none: no verdict.

    Raises:
        DatasetError: naming the model, the file and what its task needs.
    """
    from yolofeed.pack.source import split_source

    src = split_source(data, "train", task)  # pose: the yaml's kpt_shape, as yolofeed train checks it
    if task not in ("obb", "segment"):
        return
    for label_file, rows in _first_label_rows(src.label_files):
        if all(len(r) == 5 for r in rows):
            needs = ("the 4 corners of each rotated box (class x1 y1 ... x4 y4)" if task == "obb"
                     else "a polygon for each object (class x1 y1 x2 y2 x3 y3 ...)")
            raise DatasetError(f"model={model} is {keys.a_kind(task)} model and {label_file} holds box rows "
                               f"(class x y w h): Ultralytics trains it on {needs}; give such a dataset, or a "
                               "detection model")
        return


def check_run_folder(save_dir: Path) -> None:
    """Refuse, before Ultralytics makes it, a run folder that cannot be made: its nearest existing folder is a file,
    or not writable by this user (a read-only mount, no permission); and one already there (a resume, ``exist_ok``)
    holding what Ultralytics cannot write as it means to (``_check_planted_names``).

    Raises:
        ConfigError: naming the folder, why, and the fix.
    """
    _check_planted_names(Path(save_dir))
    folder = Path(save_dir)
    while not os.path.lexists(folder) and folder.parent != folder:
        folder = folder.parent
    if folder.is_dir():
        if os.access(folder, os.W_OK | os.X_OK):
            return
        why = f"{folder} cannot be written by this user (a read-only disk or no permission)"
    else:
        why = f"{folder} is not a folder"
    raise ConfigError(f"the run folder {save_dir} cannot be made: {why}; pass project= (and name=) a folder "
                      "you can write")


def _check_planted_names(save_dir: Path) -> None:
    """Refuse, in a run folder already there, what Ultralytics would write wrongly: a symbolic link at a name it writes
    (``RUN_FILES``), written through to the link's target outside the run; a FIFO, device or socket there, on which
    its write (results.csv's row at an epoch's end) would block or go elsewhere; and a ``weights`` that is not a
    folder, where its ``mkdir`` fails in a traceback. What is planted is the user's: nothing is removed."""
    if not save_dir.is_dir():
        return
    try:
        entries = sorted(os.scandir(save_dir), key=lambda e: e.name)
    except OSError:
        return  # an unreadable folder: the writability check speaks for it
    for e in entries:
        written = any(fnmatch.fnmatchcase(e.name, pattern) for pattern in RUN_FILES)
        if written and e.is_symlink():
            raise ConfigError(f"the run folder {save_dir} holds a symbolic link at {e.name} (to "
                              f"{os.readlink(e.path)}), which Ultralytics would write through: remove the link, or "
                              "train into another folder (name=, project=)")
        odd = written and not e.is_file(follow_symlinks=False)  # a FIFO, a device, a folder: no name it writes
        if odd or (e.name == "weights" and not os.path.isdir(e.path)):  # isdir: False for a link loop too
            raise ConfigError(f"the run folder {save_dir} holds {describe(e.path)} at {e.name}, where Ultralytics "
                              f"writes {'its checkpoints folder' if e.name == 'weights' else 'a file'}: move it "
                              "away, or train into another folder (name=, project=)")


def first_polygon_labels(data: str) -> str | None:
    """The first label file of polygon rows among the train split's first ``SAMPLED_LABELS``; None where none is."""
    from yolofeed.pack.source import split_source

    for label_file, rows in _first_label_rows(split_source(data, "train", "detect").label_files):
        if any(len(r) > 6 for r in rows):  # verify_image_label's test for segment rows
            return label_file
    return None


def _first_label_rows(label_files: list[str]):
    """Each readable label file with rows among the first ``SAMPLED_LABELS``, and its rows split (a look before the
    pack is built: the pack's check reports unreadable files, file by file)."""
    for label_file in label_files[:SAMPLED_LABELS]:
        try:
            rows = [r.split() for r in Path(label_file).read_text(encoding="utf-8-sig").splitlines() if r.strip()]
        except (OSError, UnicodeDecodeError):
            continue
        if rows:
            yield label_file, rows
