"""The seam to Ultralytics: one module imports it, the version and every attribute relied on are checked at import,
and every copied (or relied on) method still reads as it did when it was copied.

The recorded sources are ``TESTED``'s (``tests/data/ultralytics-<TESTED>/``) and those of the older releases a pinned
method reads otherwise in (``Reviewed``, in ``tests/data/ultralytics-<its first release>/``): each release of
``SUPPORTED`` must read as the one recorded for it, and a hash is accepted only for the releases it is recorded for.
To try another release, install it apart (``pip install --no-deps --target DIR ultralytics==X``) and run this file
with ``PYTHONPATH=DIR`` and ``YOLOFEED_UNTESTED_ULTRALYTICS=1``: each method that reads otherwise fails with its diff.
Widen ``SUPPORTED`` only where each diff is reviewed: irrelevant to what yolofeed relies on, or served by a variant the
seam chooses by release (``make test-releases`` then runs the new end). After moving ``TESTED`` to a new release and
porting the copies, record its sources again with ``python tests/test_seam.py record`` and put the printed hashes into
``ultralytics_seam.COPIED``/``RELIED_ON`` (the old ones, with their releases and reasons, into ``others``).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from yolofeed import ultralytics_seam as seam
from yolofeed.errors import UltralyticsError, UltralyticsVersionError, YolofeedError

SRC = Path(__file__).resolve().parents[1] / "src" / "yolofeed"
DATA = Path(__file__).resolve().parent / "data"
RECORDED = DATA / f"ultralytics-{seam.TESTED}"
PINNED = seam.COPIED + seam.RELIED_ON


def recorded(pinned: seam.Pinned, version: seam.Release = seam.RELEASE) -> tuple[str, Path]:
    """The release whose recorded source a release of the range must read as, and that file."""
    reviewed = pinned.reviewed(version)
    first = seam.TESTED if reviewed is None else reviewed.releases[0]
    return first, (RECORDED if reviewed is None else DATA / f"ultralytics-{first}") / f"{pinned.ultralytics}.txt"


def _imports_of(path: Path) -> set[str]:
    """Top-level package names a file imports, anywhere in it (inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_seam_imports_ultralytics():
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if "ultralytics" in _imports_of(p))
    # the seam's modules; the pins (pins.py, copied.py, relied_on.py) and source.py read it as text and by name
    outside = [u for u in users if not u.startswith("ultralytics_seam/")]
    as_text = {f"ultralytics_seam/{name}.py" for name in ("pins", "copied", "relied_on", "source")}
    assert users and not outside and not as_text & set(users), users


def drift(pinned: seam.Pinned, text: str | None = None) -> str | None:
    """A unified diff from the source of ``pinned`` recorded for the installed release (or ``text``) to the installed
    one; None when they agree."""
    first, path = recorded(pinned)
    text = path.read_text() if text is None else text
    installed = seam.normalised_source(seam.resolve(pinned.ultralytics))
    if installed == text:
        return None
    return "".join(difflib.unified_diff(text.splitlines(True), installed.splitlines(True),
                                        f"{pinned.ultralytics} (recorded: Ultralytics {first})",
                                        f"{pinned.ultralytics} (installed: Ultralytics {seam.VERSION})"))


@pytest.mark.parametrize("pinned", PINNED, ids=[".".join(p.ultralytics.rsplit(".", 2)[-2:]) for p in PINNED])
def test_copied_and_relied_on_methods_have_not_drifted(pinned):
    if pinned.since and seam.RELEASE < seam.parse_version(pinned.since):  # the feature relying on it is off here
        # every feature that starts at this release is off (several may share it)
        if pinned.since == seam.VAL_METRICS_SINCE:  # Ultralytics' own update_metrics runs
            from types import SimpleNamespace

            plain = seam.DetectionValidator.__new__(seam.DetectionValidator)
            plain.args = SimpleNamespace(plots=False, save_json=False, save_txt=False)
            assert seam.batched_metrics_serve(plain) is None
        if pinned.since == seam.GRAPH_LAYOUT_SINCE:  # the graph captures Ultralytics' upsamples and head as they are
            from yolofeed.train import graphed

            model = seam.DetectionModel("yolo11n.yaml", nc=8, verbose=False)
            graphed.swap_layout(model)
            assert not any(isinstance(m, graphed._SWAPPED) for m in model.modules())
        if pinned.since == seam.POSE_SINCE:
            with pytest.raises(UltralyticsError, match=f"Ultralytics {pinned.since} on"):
                seam.check_task("pose")
        if pinned.since == seam.VAL_OVERLAP_SINCE:  # every epoch is validated in place
            assert not seam.overlap_serves()
        if pinned.since == seam.NMS_SINCE:  # Ultralytics' own NMS runs
            from yolofeed.train import val_nms

            assert not val_nms.serves(0.001, 0.7, multi_label=True)
        return
    first, path = recorded(pinned)
    assert seam.source_hash(path.read_text()) == pinned.sha256_for(seam.RELEASE), (
        f"the source recorded for {first} and the seam's hash disagree")
    diff = drift(pinned)
    if diff is not None:
        what = f"yolofeed's copy {pinned.ours}" if pinned.ours else "what yolofeed assumes of it"
        reviewed = pinned.reviewed(seam.RELEASE)
        seen = f"; reviewed for {'-'.join(reviewed.releases)}: {reviewed.why}" if reviewed else ""
        pytest.fail(f"{pinned.ultralytics} reads otherwise than recorded for Ultralytics {seam.VERSION} ({what}: "
                    f"{pinned.why}{seen}); port the change, then record the sources again (this file's "
                    f"docstring):\n{diff}")


def test_a_drifted_method_fails_with_a_diff():
    """The drift check can fail: an edited recording gives a diff that shows the edited line on both sides."""
    pinned = seam.COPIED[0]
    text = recorded(pinned)[1].read_text().replace("loss[0] *= self.hyp.box", "loss[0] *= 2 * self.hyp.box")
    diff = drift(pinned, text)
    assert diff is not None and "-    loss[0] *= 2 * self.hyp.box" in diff and "+    loss[0] *= self.hyp.box" in diff


def test_each_reviewed_source_is_recorded_for_its_releases_only():
    """Every older source is recorded and hashes as listed; its releases lie in the range below TESTED, oldest first,
    apart; a hash is accepted for those releases alone (TESTED's for the rest)."""
    low, high = seam.SUPPORTED
    for pinned in PINNED:
        last = low[:2] + (low[2] - 1,)
        for r in pinned.others:
            first, end = seam.parse_version(r.releases[0]), seam.parse_version(r.releases[1])
            assert last < first <= end < seam.parse_version(seam.TESTED), (pinned.ultralytics, r.releases)
            path = DATA / f"ultralytics-{r.releases[0]}" / f"{pinned.ultralytics}.txt"
            assert seam.source_hash(path.read_text()) == r.sha256 != pinned.sha256, (pinned.ultralytics, r.releases)
            assert r.why and (not r.stock or pinned in seam.COPIED), (pinned.ultralytics, r.releases)
            assert pinned.sha256_for(first) == pinned.sha256_for(end) == r.sha256
            assert pinned.sha256_for(last) != r.sha256  # the release before reads otherwise
            last = end
        assert pinned.sha256_for(seam.parse_version(seam.TESTED)) == pinned.sha256
        assert pinned.sha256_for(high[:2] + (high[2] - 1,)) == pinned.sha256


def test_every_copy_overrides_the_method_it_copies():
    for pinned in seam.COPIED:
        if pinned.since and not seam.since(pinned.since):  # a feature refused under this release: not served
            continue
        ours = seam.resolve(pinned.ours)
        owner = seam.resolve(pinned.ours.rsplit(".", 1)[0])
        original = seam.resolve(pinned.ultralytics.rsplit(".", 1)[0])
        if inspect.ismodule(original):  # a function copied as a function
            assert inspect.isfunction(ours), pinned
        else:
            assert issubclass(owner, original) and callable(ours), pinned
        owner_name, name = pinned.ultralytics.rsplit(".", 2)[-2:]
        assert (owner_name, name) in {(o.__name__.rsplit(".", 1)[-1], n) for o, n, _ in seam.REQUIRED}, (
            f"{pinned.ultralytics} is not checked at import")


def test_every_ultralytics_method_yolofeed_overrides_is_checked_at_import():
    """A method renamed upstream would leave our override unused, silently: each must be in REQUIRED."""
    from yolofeed.bench.ceiling import CeilingTrainer
    from yolofeed.train import FastDetectionTrainer, loss, val_metrics

    required = {(o, n) for o, n, _ in seam.REQUIRED}
    for ours, theirs in ((FastDetectionTrainer, seam.DetectionTrainer), (CeilingTrainer, seam.DetectionTrainer),
                         (loss.SyncFreeAssigner, seam.TaskAlignedAssigner),
                         (loss.SyncFreeBboxLoss, seam.BboxLoss), (loss.SyncFreeDetectionLoss, seam.v8DetectionLoss),
                         (loss.SyncFreeRotatedAssigner, seam.RotatedTaskAlignedAssigner),
                         (loss.SyncFreeRotatedBboxLoss, seam.RotatedBboxLoss), (loss.SyncFreeOBBLoss, seam.v8OBBLoss),
                         (val_metrics.BatchedDetectionValidator, seam.DetectionValidator)):
        overridden = {n for k in ours.__mro__ if k.__module__.startswith("yolofeed") for n in vars(k)
                      if hasattr(theirs, n) and callable(getattr(theirs, n)) and not n.startswith("__")}
        assert overridden and {(theirs, n) for n in overridden} <= required, (ours, overridden)


def test_every_swapped_class_adds_methods_only():
    for theirs, ours, _ in seam.SWAPPED:
        theirs, ours = seam.resolve(theirs), seam.resolve(ours)
        assert issubclass(ours, theirs) and "__init__" not in vars(ours)


def test_another_ultralytics_version_is_one_line_naming_the_version_that_works():
    seam.check_version(seam.TESTED)
    seam.check_version(seam.TESTED + ".dev0")
    for other in ("8.4.191", "8.5.0", "8.3.200", "9.0.0"):
        with pytest.raises(UltralyticsVersionError) as e:
            seam.check_version(other)
        text = str(e.value)
        assert isinstance(e.value, ImportError) and isinstance(e.value, YolofeedError)
        assert "\n" not in text and other in text and seam.TESTED in text and f"ultralytics=={seam.TESTED}" in text
    with pytest.warns(UserWarning, match="8.5.0"):
        seam.check_version("8.5.0", allow_untested=True)


def test_the_range_is_every_release_from_the_lowest_to_the_tested_one():
    """8.4.138 to 8.4.190 (TESTED the newest): the boundaries in, their neighbours out, the refusal one line that names
    the range and the pip command."""
    assert seam.SUPPORTED == ((8, 4, 138), (8, 4, 191)) and seam.RANGE == "8.4.138 to 8.4.190"
    assert seam.parse_version(seam.TESTED) == (8, 4, 190) and seam.SUPPORTED[1] == (8, 4, 191)
    for inside in ("8.4.138", "8.4.164", "8.4.190", "8.4.138.post1"):
        seam.check_version(inside)
    for outside in ("8.4.137", "8.4.100", "8.4.191", "8.4.1380"):
        with pytest.raises(UltralyticsVersionError) as e:
            seam.check_version(outside)
        text = str(e.value)
        assert "\n" not in text and outside in text and "Ultralytics 8.4.138 to 8.4.190 only" in text, text
        assert text.endswith(": pip install ultralytics==8.4.190"), text


def test_the_range_is_named_in_pyproject_the_readme_and_the_makefile():
    """pyproject's requirement and README's line name the range; `make test-releases` runs its two ends and a middle."""
    root = Path(__file__).resolve().parents[1]
    assert seam.REQUIREMENT == "ultralytics>=8.4.138,<8.4.191"
    assert f'"{seam.REQUIREMENT}",' in (root / "pyproject.toml").read_text()
    assert f"Ultralytics {seam.RANGE}" in (root / "README.md").read_text()
    releases = re.search(r"^RELEASES\s*:=(.*)$", (root / "Makefile").read_text(), re.M).group(1).split()
    low, high = seam.SUPPORTED
    assert len(releases) == 3 and releases[0] == ".".join(map(str, low)) and releases[-1] == seam.TESTED, releases
    assert all(low <= seam.parse_version(v) < high for v in releases), releases
    assert "make test-releases" in (root / ".ci" / "run").read_text()


def test_the_installed_ultralytics_is_the_one_asked_for():
    """Under `make test-releases` (YOLOFEED_EXPECT_ULTRALYTICS=X): the release imported is X, from its own folder,
    not the venv's 8.4.190 found first by mistake."""
    import ultralytics

    expected = os.environ.get("YOLOFEED_EXPECT_ULTRALYTICS")
    print(f"ultralytics {ultralytics.__version__} from {Path(ultralytics.__file__).parent}")
    if not expected:
        pytest.skip("YOLOFEED_EXPECT_ULTRALYTICS is not set (make test-releases sets it)")
    assert seam.VERSION == ultralytics.__version__ == expected
    assert seam.resolve("ultralytics.data.base.BaseDataset").__module__ == "ultralytics.data.base"
    assert Path(inspect.getsourcefile(seam.DetectionTrainer)).is_relative_to(Path(ultralytics.__file__).parent)


def test_every_rule_yolofeed_mirrors_names_its_code():
    """A relied-on method with ``ours`` is a rule yolofeed re-implements: its code must still be where it says."""
    mirrored = [p for p in seam.RELIED_ON if p.ours]
    assert {p.ultralytics.rsplit(".", 1)[-1] for p in mirrored} >= {"__init__", "load_image", "update_labels"}
    for pinned in seam.COPIED + tuple(mirrored):
        assert callable(seam.resolve(pinned.ours)), pinned.ours


def test_the_trainer_state_yolofeed_reads_is_assigned_by_ultralytics():
    assigned = seam.source.assigned_attributes(seam.DetectionTrainer)
    assert {"last", "best", "wdir", "start_epoch", "amp", "world_size", "stopper", "stop"} <= assigned
    assert {"save_dir", "epochs"} <= assigned and "possible_stop" in seam.source.assigned_attributes(seam.EarlyStopping)
    seam.check_trainer_state()

    class Trainer(dict):  # sets last and wdir, not best; dict's methods are not read (another package)
        def __init__(self):
            super().__init__()
            self.last, (self.wdir, self.epoch) = 1, (2, 3)
            self.epoch += 1

    assert seam.source.assigned_attributes(Trainer) == {"last", "wdir", "epoch"}
    with pytest.raises(UltralyticsVersionError, match=r"^Ultralytics \S+ has no Trainer\.best, which yolofeed strips"
                       ) as e:
        seam.check_trainer_state({"last": (Trainer, "x"), "best": (Trainer, "yolofeed strips it")})
    assert "\n" not in str(e.value) and str(e.value).endswith(seam.FIX) and seam.RANGE in str(e.value)


def test_the_trainer_state_is_read_through_the_seam():
    """Each reader returns the attribute; a missing one is one line naming it and what yolofeed does with it."""
    from types import SimpleNamespace

    import torch

    t = SimpleNamespace(last=Path("l.pt"), best=Path("b.pt"), wdir=Path("w"), start_epoch=3, amp=True, world_size=0,
                        stop=False, stopper=SimpleNamespace(possible_stop=False), args=SimpleNamespace(amp=True))
    assert (seam.checkpoint(t, "last"), seam.checkpoint(t, "best"), seam.weights_dir(t)) == (
        Path("l.pt"), Path("b.pt"), Path("w"))
    assert seam.start_epoch(t) == 3 and seam.world_size(t) == 0 and seam.step_autocast(t) is True
    t.args.amp = "bf16"
    assert seam.step_autocast(t) is torch.bfloat16
    assert not seam.may_stop(t)
    t.stopper.possible_stop = True
    assert seam.may_stop(t)
    t.stopper.possible_stop, t.stop = False, True
    assert seam.may_stop(t)
    with pytest.raises(ValueError, match="'last' or 'best'"):
        seam.checkpoint(t, "wdir")
    del t.start_epoch
    with pytest.raises(UltralyticsError, match=r"no trainer\.start_epoch, which yolofeed's warm-up") as e:
        seam.start_epoch(t)
    assert "\n" not in str(e.value) and seam.RANGE in str(e.value)
    del t.stopper.possible_stop
    with pytest.raises(UltralyticsError, match=r"no trainer\.stopper\.possible_stop, which yolofeed validates"):
        seam.may_stop(t)
    # the trainer's modules read none of them directly
    modules = ("trainer.py", "validating.py", "checks.py", "augmenting.py")
    text = "".join((SRC / "train" / f).read_text() for f in modules)
    direct = [n for n in seam.TRAINER_STATE if re.search(rf"\bself\.{n}\b", text)]
    assert direct == [], direct


def test_a_missing_attribute_is_one_line_naming_the_version_that_works():
    class Trainer:
        pass

    with pytest.raises(UltralyticsVersionError, match=r"Trainer\._close_dataloader_mosaic.*mosaic would stay on") as e:
        seam.check_required(((Trainer, "_close_dataloader_mosaic", "yolofeed overrides it (mosaic would stay on)"),))
    assert "\n" not in str(e.value) and f"ultralytics=={seam.TESTED}" in str(e.value)
    with pytest.raises(UltralyticsError, match="yaml_file"):
        seam.data_yaml(type("T", (), {"data": {}})())
    with pytest.raises(UltralyticsError, match="tloss"):
        seam.set_epoch_loss(Trainer(), {})


def test_the_cli_says_another_ultralytics_version_in_one_line(tmp_path):
    """What a user with the wrong Ultralytics sees: one line with the fix, before any work, no traceback."""
    data = tmp_path / "data.yaml"
    data.write_text("path: .\ntrain: images\nval: images\nnames: {0: a}\n")
    code = ("import sys, ultralytics\nultralytics.__version__ = '8.5.0'\nfrom yolofeed.cli import main\n"
            f"sys.exit(main(['pack', 'data={data}']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert len(err) == 1 and "8.5.0" in err[0] and f"pip install ultralytics=={seam.TESTED}" in err[0], err
    assert not (tmp_path / "yolofeed-packs").exists()


def test_our_loaders_have_what_ultralytics_reads(synth_root, tmp_path):
    from yolofeed.bench.ceiling import ReplayLoader
    from yolofeed.loader import TrainLoader, ValLoader
    from yolofeed.pack import open_or_build
    from yolofeed.train.ahead import AugmentAhead

    yaml = str(synth_root / "data.yaml")
    train = TrainLoader(open_or_build(yaml, "train", 64, out=tmp_path, rebuild="auto", progress=False), 4, "cpu")
    val = ValLoader(open_or_build(yaml, "val", 64, out=tmp_path, rebuild="auto", progress=False), 4, "cpu")
    try:
        for loader in (train, AugmentAhead(train, lambda s: s), ReplayLoader([], 3, train.dataset, 4)):
            missing = [k for k in seam.TRAIN_LOADER_ATTRIBUTES if not hasattr(loader, k)]
            assert not missing, (type(loader).__name__, missing)
            assert hasattr(loader.dataset, "labels") and hasattr(loader.sampler, "set_epoch") and len(loader.sampler)
        assert not [k for k in seam.VAL_LOADER_ATTRIBUTES if not hasattr(val, k)]
        assert hasattr(val.dataset, "labels") and len(val.dataset.im_files) == len(val.dataset) == 8
        assert list(val.sampler) == list(range(len(val.dataset)))  # save_json's image ids, as a sequential sampler
    finally:
        train.close()
        val.close()


def test_the_label_rules_are_those_of_the_installed_source():
    """Each rule of the installed release's LABEL_RULES, and each constant pack.verify takes from it, reads so in the
    installed verify_image_label and check_image; the rules of the other releases read otherwise."""
    rules = seam.LABEL_RULES
    labels = seam.normalised_source(seam.resolve("ultralytics.data.utils.verify_image_label"))
    image = seam.normalised_source(seam.resolve("ultralytics.data.utils.check_image"))
    found = {
        "encoding": "utf-8-sig" if "encoding='utf-8-sig'" in labels else "utf-8",
        "blank_lines": "splitlines() if x.strip()]" in labels,
        "polygon_duplicates": "c.tobytes() + s.tobytes()" in labels,
        "integer_classes": "(lb[:, 0] % 1 == 0).all()" in labels,
        "negative_sizes": "lb[:, 3:5].min() >= 0" in labels,
        "jpeg2000": "IMG_FORMATS | {'jpeg2000'}" in image,
        "pose_box_rows": "if nkpt and (not keypoint):" in labels,
    }
    assert found == {k: getattr(rules, k) for k in found}, (seam.VERSION, rules)
    assert "encoding='utf-8'" in labels or rules.encoding == "utf-8-sig"
    assert "if len(x)]" in labels or rules.blank_lines
    assert f"points.max() <= {rules.coord_max}" in labels and f">= -{rules.negative}" in labels
    assert f"(shape[0] > {rules.min_side - 1}) & (shape[1] > {rules.min_side - 1})" in image
    # the rule sets: oldest first, each from a release where verify_image_label or check_image changed
    eras = {r.releases[0] for p in seam.COPIED if p.ultralytics.startswith("ultralytics.data.utils.") for r in p.others}
    sets = seam.LABEL_RULE_SETS
    assert sets[0].since == "8.4.138" and sets[-1] == seam.label_rules(seam.parse_version(seam.TESTED))
    assert [seam.parse_version(r.since) for r in sets] == sorted(seam.parse_version(r.since) for r in sets)
    assert {r.since for r in sets[1:-1]} <= eras and len(set(sets)) == len(sets)
    assert seam.label_rules((8, 4, 163)) == sets[0] and seam.label_rules((8, 4, 181)).since == "8.4.165"


@pytest.mark.parametrize("since", [r.since for r in seam.LABEL_RULE_SETS])
def test_a_pack_records_its_label_rules_and_is_stale_under_others(since, synth_root, tmp_path, monkeypatch):
    """A pack says which release's label rules built it; another release's rules make it stale (rebuilt under auto);
    a pack of an older yolofeed, which names none, was built under 8.4.183's."""
    import yolofeed.pack.build as build
    import yolofeed.pack.rebuild as rebuild
    from yolofeed.errors import StalePackError
    from yolofeed.pack import Pack, open_or_build
    from yolofeed.pack.store import label_rules_of

    rules = next(r for r in seam.LABEL_RULE_SETS if r.since == since)
    yaml = synth_root / "data.yaml"
    for module in (build, rebuild):
        monkeypatch.setattr(module, "LABEL_RULES", rules)
    pack = open_or_build(yaml, "val", 64, out=tmp_path, rebuild="auto", progress=False)
    assert pack.header["label_rules"] == since and label_rules_of(pack.header) == rules
    assert label_rules_of({}).since == "8.4.183"
    other = seam.LABEL_RULE_SETS[0 if since != "8.4.138" else -1]
    for module in (build, rebuild):
        monkeypatch.setattr(module, "LABEL_RULES", other)
    with pytest.raises(StalePackError, match=f"rules of Ultralytics {since} on.*as {other.since} on does"):
        open_or_build(yaml, "val", 64, out=tmp_path, rebuild="never", progress=False)
    rebuilt = open_or_build(yaml, "val", 64, out=tmp_path, rebuild="auto", progress=False)
    assert rebuilt.header["label_rules"] == other.since
    assert isinstance(Pack.open(rebuilt.path), Pack)


def test_the_optimizer_names_are_those_build_optimizer_builds():
    """``seam.OPTIMIZERS`` (what keys.py refuses other names against) is the set the installed release's
    ``build_optimizer`` matches without case; a name outside it raises there, and one inside it does not."""
    import ast
    import re

    text = inspect.getsource(seam.DetectionTrainer.build_optimizer)
    found = re.search(r"optimizers = (\{[^}]*\})", text)
    assert found and ast.literal_eval(found.group(1)) == set(seam.OPTIMIZERS)
    assert "{x.lower(): x for x in optimizers}.get(str(name).lower()" in text


def test_the_run_files_are_names_the_installed_ultralytics_writes():
    """``seam.RUN_FILES`` (where a planted link is refused): each pattern's fixed part is in the source of the tested
    release, as the file name it writes (an older release of the range may not write one: its platform logger's id
    came later, and a name it never writes refuses nothing); the core names in every release."""
    import ultralytics

    root = Path(ultralytics.__file__).parent
    text = "\n".join(p.read_text(encoding="utf-8") for p in root.rglob("*.py"))
    if seam.RELEASE == seam.parse_version(seam.TESTED):
        for pattern in seam.RUN_FILES:
            for part in (p for p in pattern.split("*") if len(p) > 2):
                assert part in text, (pattern, part)
    for written in ('"args.yaml"', '"results.csv"', "train_batch{", "val_batch{", "_curve.png", "confusion_matrix"):
        assert written in text, written


def test_the_assigners_overlaps_are_the_installed_releases():
    """Before 8.4.180 get_box_metrics computed its overlaps inline (iou_calculation of the gathered boxes); from
    8.4.180 pair_overlaps does: seam.pair_overlaps takes the installed release's way, and both give the same values."""
    import torch

    g = torch.Generator().manual_seed(0)
    xy = torch.rand(2, 3, 2, generator=g) * 50
    gt = torch.cat([xy, xy + 5 + torch.rand(2, 3, 2, generator=g) * 20], -1)
    xy = torch.rand(2, 7, 2, generator=g) * 50
    pd = torch.cat([xy, xy + 5 + torch.rand(2, 7, 2, generator=g) * 20], -1)
    indices = tuple(torch.nonzero(torch.rand(2, 3, 7, generator=g) > 0.5).unbind(1))
    assigner = seam.TaskAlignedAssigner()
    inline = assigner.iou_calculation(gt[indices[:2]], pd[indices[0], indices[2]])
    torch.testing.assert_close(seam.pair_overlaps(assigner, indices, gt, pd), inline, rtol=0, atol=0)
    if hasattr(assigner, "pair_overlaps"):
        assert seam.since("8.4.180")
        torch.testing.assert_close(assigner.pair_overlaps(indices, gt, pd), inline, rtol=0, atol=0)
    else:
        assert not seam.since("8.4.180")


def test_where_releases_differ_the_seam_chooses_by_release(monkeypatch):
    """Ultralytics' own MuSGD under 8.4.138 (its update's arithmetic differs from the copy's); no multi-GPU run under
    8.4.138-139 (their DDP ranks lose yolofeed's trainer), refused in one line naming the fix; best.pt's FLOPs
    counted ahead where its load counts them on the device (from 8.4.142)."""
    muon = "ultralytics.optim.muon.muon_update"
    for version, serves, ddp in (((8, 4, 138), False, False), ((8, 4, 139), True, False), ((8, 4, 140), True, True),
                                 (seam.parse_version(seam.TESTED), True, True)):
        monkeypatch.setattr(seam.version, "RELEASE", version)  # the module since() and the rest read
        assert seam.copy_serves(muon) is serves
        assert all(seam.copy_serves(p.ultralytics) for p in seam.COPIED if p.ultralytics != muon)
        if ddp:
            seam.check_ddp()
        else:
            with pytest.raises(UltralyticsError, match="multi-GPU") as e:
                seam.check_ddp()
            assert "\n" not in str(e.value) and str(e.value).endswith(seam.FIX) and "device=0" in str(e.value)
    for version, on_device in (((8, 4, 138), False), ((8, 4, 141), False), ((8, 4, 142), True),
                               (seam.parse_version(seam.TESTED), True)):  # where best.pt's load counts its FLOPs
        monkeypatch.setattr(seam.version, "RELEASE", version)
        assert seam.flops_counted_on_device() is on_device


def test_the_loaders_fraction_and_the_accumulation_follow_the_release(monkeypatch):
    """``build_yolo_dataset`` takes the validation split's ``fraction`` entry for ``args.split`` from 8.4.159 (for its
    mode, "val", before); ``_build_train_pipeline`` caps ``accumulate`` at the run's batches from 8.4.177, unless
    ``time=`` is set. The loaders' stride is the model's largest, at least 32."""
    from types import SimpleNamespace

    import torch

    args = SimpleNamespace(fraction=[0.5, 0.25, 0.75], split="test", nbs=64, time=None)  # train, val, test
    trainer = SimpleNamespace(args=args, epochs=2)
    for version, val, capped in (((8, 4, 158), 0.25, 8), ((8, 4, 159), 0.75, 8), ((8, 4, 176), 0.75, 8),
                                 ((8, 4, 177), 0.75, 2), (seam.parse_version(seam.TESTED), 0.75, 2)):
        monkeypatch.setattr(seam.version, "RELEASE", version)  # the module since() and the rest read
        assert (seam.split_fraction(args, "train"), seam.split_fraction(args, "val")) == (0.5, val)
        assert seam.accumulate_for(trainer, 8, batches=1) == capped  # nbs / batch = 8; 1 batch x 2 epochs
        assert seam.accumulate_for(trainer, 64, batches=1) == 1
    args.time = 0.5  # a time limit: no cap
    assert seam.accumulate_for(trainer, 8, batches=1) == 8
    model = SimpleNamespace(stride=torch.tensor([8.0, 16.0, 64.0]))
    assert (seam.loader_stride(model), seam.loader_stride(SimpleNamespace(stride=torch.tensor([8.0]))),
            seam.loader_stride(None)) == (64, 32, 32)


def record(folder: Path = RECORDED) -> None:
    """Write the installed sources of every pinned method into ``folder`` and print their hashes."""
    folder.mkdir(parents=True, exist_ok=True)
    for pinned in PINNED:
        text = seam.normalised_source(seam.resolve(pinned.ultralytics))
        (folder / f"{pinned.ultralytics}.txt").write_text(text)
        print(f"{seam.source_hash(text)}  {pinned.ultralytics}")


if __name__ == "__main__" and sys.argv[1:] == ["record"]:
    record(Path(__file__).resolve().parent / "data" / f"ultralytics-{seam.VERSION}")


class _Net(__import__("torch").nn.Module):
    """A model the way the monitor sees one: layers in ``model``, the last one the head."""

    def __init__(self):
        import torch

        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.SiLU(), torch.nn.Conv2d(4, 2, 1))

    def forward(self, x):
        return self.model(x)


@pytest.mark.parametrize("compile_model", [False, True])
def test_step_phases_are_marked_in_order_and_a_compiled_graph_stays_whole(compile_model):
    """forward, loss, backward, optimizer in turn; under torch.compile no mark lands inside the compiled graph
    (a hook there splits it: a graph break) and the marks come from the outer module and the scaler."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    net = _Net()
    model = torch.compile(net, backend="eager") if compile_model else net
    marks: list[str] = []

    class Trainer:  # the method on the class, as Ultralytics' is
        def optimizer_step(self):
            marks.append("step")

    trainer = Trainer()
    trainer.model, trainer.scaler = model, torch.amp.GradScaler("cpu", enabled=False)

    def mark(phase: str) -> None:  # reads a clock, as the monitor's does: dynamo cannot trace it, a graph break
        time.perf_counter()
        marks.append(phase)

    undo = seam.mark_phases(trainer, mark)
    for _ in range(2):
        preds = trainer.model(torch.zeros(1, 3, 8, 8))
        loss = preds.sum()  # the criterion, outside the model when compiled (Ultralytics' compile path)
        trainer.scaler.scale(loss).backward()
        trainer.optimizer_step()
    want = ["forward", "loss", "backward", "optimizer", "step"]
    assert marks == want * 2
    assert not counters["graph_break"]
    assert seam.compiled(trainer) is compile_model
    undo()
    marks.clear()
    trainer.scaler.scale(trainer.model(torch.zeros(1, 3, 8, 8)).sum())
    trainer.optimizer_step()
    assert marks == ["step"]


def test_the_callbacks_that_read_each_epoch_as_it_ends_are_all_but_ultralytics_idle_ones_and_yolofeeds(monkeypatch):
    """val_overlap's default overlaps no epoch whose end a logger or a user's callback reads (``epoch_readers``).
    Ultralytics' empty defaults, its Platform's callbacks, which return at once without a session (checked here
    under the installed release), and Ray Tune's outside a trial are not readers; yolofeed's own are not either."""
    from types import SimpleNamespace

    from ultralytics.utils import callbacks as ultralytics_callbacks

    class FakeTrainer:  # add_integration_callbacks adds the Platform's to a "Trainer"
        pass

    trainer = FakeTrainer()
    trainer.callbacks = ultralytics_callbacks.get_default_callbacks()
    ultralytics_callbacks.add_integration_callbacks(trainer)
    platform = [fn for event in seam.LATE_EVENTS for fn in trainer.callbacks[event]
                if fn.__module__.endswith(".platform")]
    assert platform  # the release adds them to every trainer
    for fn in platform:
        assert fn(SimpleNamespace()) is None  # no trainer.platform: it returns before reading the trainer
    installed = {fn.__module__ for event in seam.LATE_EVENTS for fn in trainer.callbacks[event]}
    loggers = sorted(m for m in installed if m.rsplit(".", 1)[-1] not in ("base", "platform"))
    assert seam.epoch_readers(trainer) == list(dict.fromkeys(  # the loggers installed and enabled here, if any
        f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}" for event in seam.LATE_EVENTS
        for fn in trainer.callbacks[event] if fn.__module__ in loggers))

    def mine(t):  # a user's logger
        pass

    def logger(t):  # as an Ultralytics logger's (those stay out of a trainer under pytest)
        pass

    logger.__module__ = "ultralytics.utils.callbacks.wb"
    import functools

    # named once, a partial by its function; yolofeed's is not a reader
    trainer.callbacks["on_fit_epoch_end"] += [mine, functools.partial(mine), seam.could_stop]
    trainer.callbacks["on_model_save"] += [logger]
    assert seam.epoch_readers(trainer)[-2:] == ["test_seam.mine", "wb.logger"]
    from ultralytics.utils.callbacks import raytune  # Ray Tune's: a reader inside a Tune trial only

    logger.__module__ = raytune.__name__
    context = SimpleNamespace(get_trial_id=lambda: None)
    monkeypatch.setattr(raytune, "tune", SimpleNamespace(get_context=lambda: context))
    assert seam.epoch_readers(trainer)[-1:] == ["test_seam.mine"]
    context.get_trial_id = lambda: "trial_1"
    assert seam.epoch_readers(trainer)[-1:] == ["raytune.logger"]
    trainer.platform = {"console_logger": None}  # a run with a Platform session: its loggers read each epoch
    assert {"platform.on_fit_epoch_end", "platform.on_model_save"} <= set(seam.epoch_readers(trainer))
    with pytest.raises(UltralyticsError, match="trainer.callbacks"):
        seam.epoch_readers(SimpleNamespace())
