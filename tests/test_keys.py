"""Every ``yolo train`` key: the table in ``yolofeed.train.keys`` covers them all, each refusal stops a run before
anything is built, and the keys yolofeed passes on or applies itself leave the trainer in the state stock leaves it.

The comparison shares two set-ups (stock ``DetectionTrainer`` and ``FastDetectionTrainer`` with the same
non-default keys, built up to the first step by ``_setup_train``: model, loaders, optimizer, scheduler, class
weights, validator) instead of one training run per key; ``test_train_cli.py`` trains for real.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from yolofeed import ultralytics_seam as seam
from yolofeed.errors import ConfigError
from yolofeed.train import keys

EVEN = list(range(0, 80, 2))

# Non-default values for the set-up comparison. Every stock/yolofeed row of the table is either here, or in
# ELSEWHERE with the test that shows it (test_every_row_has_evidence checks this).
SETUP = dict(
    epochs=3, time=None, patience=5, batch=8, imgsz=100, save=True, save_period=1, cache=False, workers=0,
    exist_ok=True, pretrained=False, optimizer="SGD", verbose=False, seed=3, deterministic=False, single_cls=False,
    cos_lr=True, close_mosaic=2, amp=False, fraction=[20, 0.75], profile=False, freeze=[0, 1], multi_scale=0.25,
    compile=False, channels_last=False, val=True, split="val", classes=EVEN, lr0=0.02, lrf=0.1, momentum=0.9,
    weight_decay=0.001, warmup_epochs=0.5, warmup_momentum=0.7, warmup_bias_lr=0.05, nbs=32, box=5.0, cls=1.0,
    dfl=2.0, cls_pw=0.5, hsv_h=0.02, hsv_s=0.6, hsv_v=0.3, degrees=5.0, translate=0.2, scale=0.4, shear=2.0,
    perspective=0.0001, flipud=0.1, fliplr=0.3, bgr=0.1, mosaic=0.8, mixup=0.1, cutmix=0.1, conf=0.01, iou=0.6,
    max_det=100, save_json=False, save_txt=False, save_conf=False, visualize=False, augment=False,
    agnostic_nms=True, nms=seam.DEFAULT_CFG_DICT["nms"], dnn=False, show_labels=False, show_conf=False, plots=False,
    dis=5.0, quantize=None,
)  # nms at its default: None from 8.4.142, False before (a bool key then)
ELSEWHERE = {
    "angle": "test_loss.py::test_the_obb_loss_and_its_gradients_equal_ultralytics: its term times hyp.angle (stock's)",
    "cls_remap": ("test_yolofeed_overrides_only_the_data_path_of_the_trainer: get_model and set_model_names_for_load, "
                  "which read it as pretrained weights load, are stock's"),
    "task": ("test_every_refusal_stops_the_run_before_anything_is_built (a classification model); "
             "test_train_pose.py, test_train_obb.py, test_train_segment.py"),
    "overlap_mask": "test_train_segment.py: training and validation batches equal Format's, overlap on and off",
    "mask_ratio": "test_train_segment.py: the masks' size; other ratios than 1-32 refused",
    "mode": "always train",
    "model": "both set-ups build yolo11n.yaml; test_model_task_is_read_from_the_yaml",
    "data": "both set-ups use the synthetic data yaml; a list is refused",
    "cfg": "test_a_cfg_yaml_goes_through_the_table",
    "device": "the CPU in every CPU test, CUDA in the gpu tests; test_devices_are_checked_in_one_line",
    "project": "the set-ups' run folders", "name": "the set-ups' run folders", "save_dir": "the run folders",
    "single_cls": "test_single_cls_trains_a_step_with_class_0 and test_loader's label tests",
    "resume": "test_train_cli.py::test_resume_forms and test_train.py::test_cli_resumes_a_killed_run",
    "distill_model": "refused", "augmentations": "refused",
    "copy_paste": "test_copy_paste.py (the op against Ultralytics'), test_train_segment.py::test_copy_paste_trains_"
                  "a_segment_batch_with_its_copies, test_copy_paste_is_refused_where_there_are_no_polygons, "
                  "test_augment_obb.py::test_copy_paste_gives_ultralytics_oriented_boxes_and_pixels",
    "copy_paste_mode": "test_train_segment.py::test_copy_paste_mixup_mode_and_odd_mask_ratios_are_refused_in_one_line",
    "rect": "refused when True",
    **{k: "test_train_pose.py::test_the_keypoint_loss_gains_reach_ultralytics_pose_loss_unchanged"
       for k in ("pose", "kobj", "rle")},
    "end2end": "8.4.138-141's name of nms (in SETUP, left at its default), the validator's NMS-free switch",
}


def _base(root: Path, project: Path, name: str) -> dict:
    return dict(model="yolo11n.yaml", data=str(root / "data.yaml"), device="cpu", project=str(project), name=name)


@pytest.fixture(scope="module")
def setups(synth_root, tmp_path_factory):
    """Stock and yolofeed trainers with SETUP's keys, set up to their first step (about a second each)."""
    from ultralytics.models.yolo.detect import DetectionTrainer

    from yolofeed import FastDetectionTrainer

    project = tmp_path_factory.mktemp("setups")
    out = {}
    for name, cls in (("stock", DetectionTrainer), ("ours", FastDetectionTrainer)):
        t = cls(overrides={**_base(synth_root, project, name), **SETUP})
        t._setup_train()
        out[name] = t
    yield out["stock"], out["ours"]
    out["ours"].train_loader.close()


def test_the_table_covers_every_ultralytics_key():
    from ultralytics.cfg import DEFAULT_CFG_DICT

    assert set(DEFAULT_CFG_DICT) - set(keys.RULES) == set(), "decide these keys' rows in yolofeed/train/keys.py"
    assert set(keys.RULES) - set(DEFAULT_CFG_DICT) <= set(keys.EXTRA_KEYS) | set(keys.OLDER_KEYS)
    assert set(keys.OLDER_KEYS) <= set(keys.DEPRECATED_KEYS)
    assert all(r.kind in (keys.STOCK, keys.OURS, keys.REPLACED, keys.UNUSED) and r.note for r in keys.RULES.values())
    assert all(bool(r.refuse) == bool(r.reason) == bool(r.refused) for r in keys.RULES.values())


def test_every_row_has_evidence():
    """A stock or yolofeed row is set to a non-default value in the compared set-ups, or shown elsewhere."""
    from ultralytics.cfg import DEFAULT_CFG_DICT

    rows = {k for k, r in keys.RULES.items() if r.kind in (keys.STOCK, keys.OURS)}
    assert rows - set(SETUP) - set(ELSEWHERE) == set()
    unchanged = {k for k, v in SETUP.items() if DEFAULT_CFG_DICT.get(k) == v}
    # left at their default on purpose: the CPU or the comparison needs them so, or the default is the tested case
    assert unchanged <= {"time", "save", "cache", "single_cls", "profile", "compile", "val", "split", "save_json",
                         "save_txt", "save_conf", "visualize", "augment", "nms", "dnn", "quantize", "plots"}


def test_the_docs_are_the_table():
    if seam.VERSION != seam.TESTED:
        pytest.skip(f"docs/train-keys.md shows the defaults of {seam.TESTED}, not of {seam.VERSION}")
    docs = Path(__file__).parents[1] / "docs" / "train-keys.md"
    assert docs.read_text() == keys.markdown(), "regenerate it: see the command at the top of docs/train-keys.md"


def test_deprecated_names_are_ultralytics_own():
    """Each old name yolofeed lets through is one Ultralytics still maps or drops itself (else it would raise)."""
    from ultralytics.cfg import DEFAULT_CFG_DICT, check_dict_alignment

    for name in keys.DEPRECATED_KEYS:
        check_dict_alignment(DEFAULT_CFG_DICT, {name: True})
    with pytest.raises(SyntaxError):
        check_dict_alignment(DEFAULT_CFG_DICT, {"no_such_key": True})


def test_yolofeed_overrides_only_the_data_path_of_the_trainer():
    """Stock rows hold because yolofeed leaves the methods that read them alone. A new override here means
    re-checking the table."""
    from ultralytics.models.yolo.detect import DetectionTrainer

    from yolofeed import FastDetectionTrainer

    ours = {n for c in FastDetectionTrainer.__mro__ if c.__module__.startswith("yolofeed") for n, v in vars(c).items()
            if inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod))}
    stock = {n for c in DetectionTrainer.__mro__ for n in vars(c)}
    assert ours & stock == {"__init__", "check_resume", "get_dataloader", "preprocess_batch",
                            "_close_dataloader_mosaic", "_do_train", "build_optimizer", "validate", "save_model",
                            "final_eval", "get_validator", "plot_training_labels", "plot_metrics",
                            "plot_training_samples", "save_metrics", "run_callbacks",
                            "resume_training", "train"}  # the plots: stock's files,
    # drawn beside other work (the plots row), the train-batch plot handed stock's float32 image under half_input;
    # save_metrics and run_callbacks: stock's, an epoch validated beside the next (val_overlap) writing its row and
    # running on_model_save and on_fit_epoch_end at the next epoch's end (the same rows, files and stop: the save,
    # save_period, patience, val and plots rows); _do_train:
    # Ultralytics' loop, re-raised with the last.pt that resumes the run logged; build_optimizer: stock's, a MuSGD
    # adopted (the optimizer row); validate: stock's, skipped between val_period epochs (the val row); save_model
    # and final_eval: stock's checkpoints (the save and save_period rows), each file written atomically;
    # get_validator: stock's validator, its statistics gathered a batch at once (the same metrics: every val row);
    # resume_training: stock's, then results.csv's rows of the epochs trained again dropped (the resume row);
    # train: stock's, with the run folder held (a second training into it is refused)


# -- refusals -------------------------------------------------------------------------------------------
REFUSED = {  # one refused value per refusing row
    "task": {"model": "yolo11n-cls.yaml"}, "data": {"data": ["a.yaml", "b.yaml"]}, "device": {"device": "mps"},
    "rect": {"rect": True}, "quantize": {"quantize": 8}, "distill_model": {"distill_model": "teacher.pt"},
    "augmentations": {"augmentations": [{"transform": "Blur"}]},
    "classes": {"classes": "0,1"}, "imgsz": {"imgsz": "abc"}, "batch": {"batch": 1.5},
    "optimizer": {"optimizer": "bogus"},
}
# rows that refuse in some tasks' runs only: tested in those tasks' files
TASK_REFUSED = {
    "mask_ratio": "test_train_segment.py::test_copy_paste_mixup_mode_and_odd_mask_ratios_are_refused_in_one_line"}


def test_every_refusing_row_is_tested():
    assert set(REFUSED) == {k for k, r in keys.RULES.items() if r.refuse and not r.tasks}
    assert set(TASK_REFUSED) == {k for k, r in keys.RULES.items() if r.refuse and r.tasks}


def test_a_segmentation_key_is_not_refused_in_a_detection_run():
    """Ultralytics' detection training does not read mask_ratio: any value trains there (stock's too)."""
    keys.check({"model": "yolo11n.yaml", "mask_ratio": 3})
    with pytest.raises(ConfigError, match=r"^mask_ratio=3: yolofeed makes masks by a whole ratio"):
        keys.check({"model": "yolo11n-seg.yaml", "mask_ratio": 3})


@pytest.mark.parametrize("key, taken, refused", [
    # what Ultralytics' check_imgsz takes (ints, lists, their strings; rounded up to a stride after), and raises on
    ("imgsz", [640, "640", -64, 100, [64, 96], "[64, 96]", (64,), "640,480", [640.5]],
     ["abc", 640.5, [64, "a"], [], "[64, x]"]),
    # AutoBatch below 1 (a fraction, -1, any negative), a DataLoader's whole number above
    ("batch", [16, -1, -5, 0.5, 0], [1.5, 2.0, 1.0]),
    ("optimizer", ["auto", "AdamW", "adamw", "SGD", "MuSGD", "rmsprop", None], ["bogus", "Lion", "adam_w"]),
])
def test_values_yolo_train_fails_on_late_are_refused_up_front(key, taken, refused):
    """Values stock takes pass; values stock fails on after building the model and data (imgsz: check_imgsz's
    error; batch: the DataLoader's; optimizer: build_optimizer's NotImplementedError) are one line first."""
    for value in taken:
        keys.check({"model": "yolo11n.yaml", key: value})
    for value in refused:
        with pytest.raises(ConfigError) as e:
            keys.check({"model": "yolo11n.yaml", key: value})
        assert str(e.value).startswith(f"{key}={value}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("imgsz", [640, 100, -64, 0, True, "640", "640,480", "[64, 96]", [640.5], (64, 100), [33]])
@pytest.mark.parametrize("stride", [32, 64])
def test_the_side_trained_at_is_ultralytics_check_imgsz(imgsz, stride):
    """train_side (the pack's side, the augmentation's) is what _setup_train's check_imgsz makes of the value, from
    Python too (strings, floats in lists)."""
    from ultralytics.utils.checks import check_imgsz

    from yolofeed.ultralytics_seam import train_side

    assert train_side(imgsz, stride) == check_imgsz(imgsz, stride, floor=stride, max_dim=1)


def test_the_optimizer_refusal_names_every_optimizer_ultralytics_builds():
    from yolofeed.ultralytics_seam import OPTIMIZERS

    assert all(name in keys.RULES["optimizer"].reason for name in OPTIMIZERS)


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_every_refusal_stops_the_run_before_anything_is_built(synth_root, tmp_path, key):
    from yolofeed import FastDetectionTrainer

    args = {**_base(synth_root, tmp_path, "refused"), **REFUSED[key]}
    with pytest.raises(ConfigError) as e:
        FastDetectionTrainer(overrides=args)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{key}=") and len(message) > len(key) + 40  # and why
    assert not (tmp_path / "refused").exists()  # no run folder, no args.yaml: nothing was built


def test_copy_paste_in_a_detection_run_is_ultralytics_nothing_on_boxes_and_refused_on_polygons(
        synth_root, segment_dataset, tmp_path, monkeypatch):
    """Ultralytics' CopyPaste pastes nothing without segments: on box labels a detection batch with copy_paste (either
    mode) is the batch without it. On polygon labels it pastes them, which yolofeed builds for segment and OBB runs:
    refused in one line, before anything is built where the first label files show them, else when the pack does.
    Oriented boxes paste their outlines; a pose run has nothing to paste, as in Ultralytics."""
    from yolofeed import FastDetectionTrainer
    from yolofeed.train import checks

    batches = []
    for copy_paste, mode in ((0.0, "flip"), (0.5, "flip"), (0.5, "mixup")):
        t = FastDetectionTrainer.with_options(augment_ahead=False, partner_pool=0)(overrides={
            **_base(synth_root, tmp_path, f"boxes{copy_paste}{mode}"), "copy_paste": copy_paste,
            "copy_paste_mode": mode, "imgsz": 64, "batch": 4, "workers": 0, "plots": False})
        loader = t.get_dataloader(t.data["train"], batch_size=4, rank=-1, mode="train")
        try:
            batches.append(t.preprocess_batch(next(iter(loader))))
        finally:
            loader.close()
    for batch in batches[1:]:
        for key in ("img", "cls", "bboxes", "batch_idx"):
            assert torch.equal(batch[key], batches[0][key]), key

    polygons = {**_base(segment_dataset, tmp_path, "refused"), "copy_paste": 0.3}
    with pytest.raises(ConfigError, match=r"^copy_paste=0.3: Ultralytics pastes mirrored copies of the polygon rows "
                                          r"in .*labels.*\.txt in a detection run.*copy_paste=0"):
        FastDetectionTrainer(overrides=polygons)
    assert not (tmp_path / "refused").exists()
    monkeypatch.setattr(checks, "SAMPLED_LABELS", 0)  # the early look finds none: the pack decides
    t = FastDetectionTrainer(overrides={**polygons, "name": "late", "imgsz": 64, "workers": 0})
    with pytest.raises(ConfigError, match=r"^copy_paste=0.3: Ultralytics pastes mirrored copies of the polygon rows "
                                          r"in .*labels"):
        t.get_dataloader(t.data["train"], batch_size=4, rank=-1, mode="train")
    keys.check_copy_paste({"copy_paste": 0.5}, "obb")
    keys.check_copy_paste({"copy_paste": 0.5, "copy_paste_mode": "mixup"}, "pose")
    with pytest.raises(ConfigError, match="copy_paste_mode=mixup"):
        keys.check_copy_paste({"copy_paste": 0.5, "copy_paste_mode": "mixup"}, "segment")


@pytest.mark.parametrize("model, task", [("yolo11n.yaml", "detect"), ("yolov8n.yaml", "detect"),
                                         ("yolo26n.yaml", "detect"), ("yolo11n-seg.yaml", "segment"),
                                         ("yolo11n-pose.yaml", "pose"), ("yolo11n-obb.yaml", "obb"),
                                         ("yolo11n-cls.yaml", "classify"), ("custom-seg.pt", "segment")])
def test_model_task_is_read_from_the_yaml(model, task):
    assert keys.model_task(model, "detect") == task
    assert keys.model_task("yolo11n.yaml", "pose") == "pose"  # a task the model object already knows wins


def test_a_weights_files_task_is_what_it_holds_whatever_its_name(tmp_path):
    """A run's last.pt (resume=) or a renamed fine-tuned copy: the task from the checkpoint, not the file name; a file
    that does not read falls back to the name (its loader reports it)."""
    from ultralytics.nn.tasks import DetectionModel, PoseModel

    pose = PoseModel("yolo11n-pose.yaml", nc=2, data_kpt_shape=(5, 3), verbose=False)
    torch.save({"model": pose, "train_args": {"task": "pose"}}, tmp_path / "last.pt")
    torch.save({"ema": pose, "train_args": {}}, tmp_path / "mine.pt")  # no task recorded: the head says
    torch.save({"model": DetectionModel("yolo11n.yaml", verbose=False)}, tmp_path / "weights-pose.pt")
    (tmp_path / "bad-pose.pt").write_bytes(b"not a checkpoint")
    found = [keys.model_task(tmp_path / n, None) for n in ("last.pt", "mine.pt", "weights-pose.pt", "bad-pose.pt")]
    assert found == ["pose", "pose", "detect", "pose"]


def test_a_cfg_yaml_goes_through_the_table(synth_root, tmp_path):
    """cfg=custom.yaml: Ultralytics merges its keys before the trainer sees them, so they are checked too."""
    from ultralytics import YOLO

    from yolofeed import FastDetectionTrainer

    cfg = tmp_path / "custom.yaml"
    cfg.write_text("rect: True\nlr0: 0.02\n")
    short = dict(epochs=1, imgsz=32, fraction=2, val=False, plots=False)  # should the refusal fail: seconds, not hours
    with pytest.raises(ConfigError, match="rect=True"):
        YOLO("yolo11n.yaml").train(trainer=FastDetectionTrainer, cfg=str(cfg), **_base(synth_root, tmp_path, "cfg"),
                                   **short)


def test_devices_are_checked_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert keys.check_device("cpu") == "cpu" and keys.check_device(None) == ""
    for device, words in (("cuda", "no CUDA GPU"), ("0,1", "no CUDA GPU"), ("gpu", "expected cpu"),
                          ("mps", "CUDA GPUs and the CPU only"), ("npu:0", "CUDA GPUs and the CPU only")):
        with pytest.raises(ConfigError, match=words):
            keys.check_device(device)
    assert keys.check_device("mps", ours=False) == "mps"  # doctor yolofeed=False, bench modes=stock: stock's own
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert keys.check_device("cuda:1") == "1"
    with pytest.raises(ConfigError, match="2 CUDA GPU"):
        keys.check_device("0,2")


@pytest.mark.parametrize("overrides, words", [
    ({"epoch": 3}, ["'epoch'", "Did you mean 'epochs'"]),
    ({"pack_fromat": "jpeg"}, ["Did you mean 'pack_format'"]),
    ({"foo": 1}, ["'foo' is not a key"]),
    ({"epochs": "abc"}, ["epochs=abc", "int"]),
    ({"fraction": 0}, ["fraction=0"]),
    ({"lr0": None}, ["lr0=None"]),
])
def test_a_bad_key_or_type_is_one_line(overrides, words):
    with pytest.raises(ConfigError) as e:
        keys.check_overrides(overrides, own=["pack_format", "pack_dir"])
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value)
    keys.check_overrides({"half": True, "epochs": 3, "augmentations": None, "save_dir": "x"})  # all valid


def test_start_notes_say_what_differs(monkeypatch):
    monkeypatch.setattr(keys, "triton_available", lambda: True)
    cpu = keys.start_notes({"workers": 0, "multi_scale": 0.0, "cache": False}, "cpu")
    assert len(cpu) == 1 and "slower than stock" in cpu[0] and "yolo train" in cpu[0] and "GPU" in cpu[0]
    gpu = keys.start_notes({"workers": 8, "multi_scale": 0.5, "cache": "ram"}, "cuda")
    assert [n.split(":")[1].split("=")[0].strip() for n in gpu] == ["multi_scale", "cache", "workers"]
    assert "Ultralytics' own path" in gpu[0]
    assert keys.start_notes({"workers": 8, "multi_scale": 0.0, "cache": False}, "cuda") == [gpu[2]]
    monkeypatch.setattr(keys, "triton_available", lambda: False)  # CUDA without Triton: said, with the cost
    slow = keys.start_notes({"workers": 0, "multi_scale": 0.0, "cache": False}, "cuda")
    assert len(slow) == 1 and "Triton is not installed" in slow[0] and "install" in slow[0]
    assert keys.start_notes({"workers": 0, "multi_scale": 0.0, "cache": False}, "cpu") == cpu  # the CPU needs none


@pytest.mark.parametrize("fraction", [0.25, 100, [0.5, 1.0]])
def test_a_fraction_says_the_whole_split_is_packed(fraction, monkeypatch):
    """``fraction=0.1`` packed the whole split and said nothing of it (a user sees a build of all the images)."""
    monkeypatch.setattr(keys, "triton_available", lambda: True)
    notes = keys.start_notes({"fraction": fraction}, "cuda")
    assert len(notes) == 1 and f"fraction={fraction}: the pack holds the whole split" in notes[0]
    assert "one pack serves every fraction" in notes[0]
    assert keys.start_notes({"fraction": 1.0}, "cuda") == keys.start_notes({"fraction": [1.0, 1]}, "cuda") == []


# -- the same state as stock ----------------------------------------------------------------------------
def test_same_arguments_optimizer_schedule_and_model_as_stock(setups):
    from ultralytics.utils.torch_utils import unwrap_model

    stock, ours = setups
    a, b = vars(stock.args), vars(ours.args)
    assert {k: v for k, v in a.items() if k not in ("name", "save_dir")} == \
        {k: v for k, v in b.items() if k not in ("name", "save_dir")}
    assert type(stock.optimizer) is type(ours.optimizer)
    for ga, gb in zip(stock.optimizer.param_groups, ours.optimizer.param_groups, strict=True):
        assert {k: v for k, v in ga.items() if k != "params"} == {k: v for k, v in gb.items() if k != "params"}
        assert [p.shape for p in ga["params"]] == [p.shape for p in gb["params"]]
    assert [stock.lf(x) for x in range(4)] == [ours.lf(x) for x in range(4)]  # cos_lr, lrf
    assert stock.scheduler.get_last_lr() == ours.scheduler.get_last_lr()
    assert (stock.accumulate, stock.epochs, stock.stopper.patience) == (ours.accumulate, ours.epochs, 5)
    frozen = [{n for n, p in t.model.named_parameters() if not p.requires_grad} for t in (stock, ours)]
    assert frozen[0] == frozen[1] and any(n.startswith("model.1.") for n in frozen[0])  # freeze=[0, 1]
    ma, mb = unwrap_model(stock.model), unwrap_model(ours.model)
    assert (ma.nc, ma.names) == (mb.nc, mb.names)
    assert torch.equal(ma.class_weights, mb.class_weights)  # cls_pw, counted from each loader's labels
    ha, hb = ma.init_criterion().hyp, mb.init_criterion().hyp
    assert (ha.box, ha.cls, ha.dfl) == (hb.box, hb.cls, hb.dfl) == (5.0, 1.0, 2.0)
    assert stock.validator.args.iou == ours.validator.args.iou == 0.6


def test_same_images_and_labels_as_stock(setups):
    """fraction (a count for train, a share for val), classes, imgsz rounding: the same samples and boxes."""
    stock, ours = setups
    for split in ("train_loader", "test_loader"):
        da, db = getattr(stock, split).dataset, getattr(ours, split).dataset
        assert list(da.im_files) == list(db.im_files)  # val: the same rect order
        for la, lb in zip(da.labels, db.labels, strict=True):
            np.testing.assert_array_equal(la["cls"], lb["cls"])
            np.testing.assert_allclose(la["bboxes"], lb["bboxes"], atol=1e-6)
    assert len(ours.train_loader.dataset) == 20 and len(ours.test_loader.dataset) == 6
    assert len(stock.train_loader) == len(ours.train_loader)
    kept = np.concatenate([lb["cls"][:, 0] for lb in ours.train_loader.dataset.labels])
    assert len(kept) and set(kept.tolist()) <= set(map(float, EVEN))


def test_same_image_size_and_augmentation_settings_as_stock(setups):
    """imgsz=100 trains at 128 in both; the GPU augmentation reads the same keys as Ultralytics' transforms."""
    stock, ours = setups
    assert stock.args.imgsz == ours.args.imgsz == 128
    assert ours.hyp.imgsz == 128 and ours.train_loader.prefetcher.pack.imgsz == 128
    for k in ("hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective", "flipud",
              "fliplr", "bgr", "mosaic", "mixup", "cutmix", "close_mosaic"):
        assert getattr(ours.hyp, k) == getattr(stock.args, k) == SETUP[k], k
    assert ours.train_loader.sampler.seed == 3
    batch = ours.preprocess_batch(next(iter(ours.train_loader)))
    assert batch["img"].shape[0] == 8 and ours.batch_images == 8
    assert batch["img"].shape[-1] % 32 == 0 and 64 <= batch["img"].shape[-1] <= 160  # multi_scale=0.25 around 128


@pytest.mark.parametrize("imgsz", [100, 0, -5])
def test_image_size_rounds_up_as_stock(imgsz):
    from ultralytics.utils.checks import check_imgsz

    from yolofeed.ultralytics_seam import train_side

    assert train_side(imgsz) == check_imgsz(imgsz, stride=32, floor=32, max_dim=1)
    assert train_side([imgsz, 200]) == check_imgsz([imgsz, 200], stride=32, floor=32, max_dim=1)


def test_single_cls_trains_a_step_with_class_0(synth_root, tmp_path):
    """single_cls=True: nc 1, every class id 0 in training and validation batches, and the loss runs (it indexed
    the pack's class ids into one class before)."""
    from ultralytics.utils.torch_utils import unwrap_model

    from yolofeed import FastDetectionTrainer

    t = FastDetectionTrainer(overrides={**_base(synth_root, tmp_path, "sc"), "single_cls": True, "imgsz": 64,
                                        "batch": 8, "workers": 0, "plots": False, "verbose": False})
    t._setup_train()
    t.run_callbacks("on_train_start")  # installs yolofeed's step and sync-free loss, as training does
    try:
        model = unwrap_model(t.model)
        assert model.nc == 1 and t.data["names"] == {0: "item"}
        batch = t.preprocess_batch(next(iter(t.train_loader)))
        assert len(batch["cls"]) and (batch["cls"] == 0).all()
        loss, items = model.loss(batch)
        assert torch.isfinite(loss).all() and all(torch.isfinite(v) for v in items.values())
        val = next(iter(t.test_loader))
        assert len(val["cls"]) and (val["cls"] == 0).all()
    finally:
        t.train_loader.close()


def test_single_cls_says_which_images_stock_would_also_use(synth_root, tmp_path, caplog):
    """Stock skips its class-range check under single_cls and keeps a label with class 85 of 80; the pack
    skips it: the run says so, naming the file, instead of training on fewer images silently."""
    from helpers import copy_dataset, ultralytics_dataset
    from yolofeed import FastDetectionTrainer

    root = copy_dataset(synth_root, tmp_path / "ds")
    label = sorted((root / "labels" / "train").glob("*.txt"))[0]
    label.write_text("85 0.5 0.5 0.2 0.2\n")
    stock = ultralytics_dataset(root / "data.yaml", "train", 64, single_cls=True)
    t = FastDetectionTrainer(overrides={**_base(root, tmp_path, "gap"), "single_cls": True, "imgsz": 64,
                                        "workers": 0, "plots": False, "verbose": False})
    with caplog.at_level("WARNING"):
        loader = t.get_dataloader(t.data["train"], 8, -1, "train")
    loader.close()
    assert len(stock) == len(loader.dataset) + 1
    assert any(label.stem in r.getMessage() and "single_cls" in r.getMessage() for r in caplog.records)


def test_a_stride_64_model_rounds_to_64(synth_root, tmp_path):
    """P6 models round imgsz to 64, known only once the model is built: the augmentation and the pack follow."""
    from yolofeed import FastDetectionTrainer

    t = FastDetectionTrainer(overrides={**_base(synth_root, tmp_path, "p6"), "model": "yolov8n-p6.yaml",
                                        "imgsz": 140, "batch": 4, "workers": 0, "plots": False, "verbose": False})
    assert t.hyp.imgsz == 160  # before the model: the default stride's rounding
    t._setup_train()
    try:
        assert t.args.imgsz == t.hyp.imgsz == t.train_loader.prefetcher.pack.imgsz == 192
        assert t.preprocess_batch(next(iter(t.train_loader)))["img"].shape[-2:] == (192, 192)
    finally:
        t.train_loader.close()
