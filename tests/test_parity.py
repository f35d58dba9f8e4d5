"""``yolofeed parity``: its statistics against hand-computed cases, its verdicts, and a tiny run end to end."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from yolofeed.bench import stats
from yolofeed.bench.parity import MAP, MAP50, Job, devices_of, slots, summarise, table
from yolofeed.errors import ConfigError


# 1e7: z + (z^3 + z) / 4df, the t quantile at large df
@pytest.mark.parametrize("df, q975", [(1, 12.7062047362), (3, 3.1824463053), (6, 2.4469118511),
                                      (10, 2.2281388520), (30, 2.0422724563), (1e7, 1.95996422)])
def test_t_quantiles_match_the_tables(df, q975):
    assert stats.t_ppf(0.975, df) == pytest.approx(q975, abs=2e-7)
    assert stats.t_ppf(0.025, df) == pytest.approx(-q975, abs=2e-7)
    assert stats.t_cdf(q975, df) == pytest.approx(0.975, abs=1e-9)


@pytest.mark.parametrize("df", [2.5, 4.41, 7.3])
def test_t_quantile_for_fractional_df_matches_numerical_integration(df):
    """Welch's df is fractional: check against the t density integrated numerically."""
    x = np.linspace(0, 80, 2_000_001)
    pdf = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi) * (1 + x * x / df) ** (
        -(df + 1) / 2)
    cdf = 0.5 + np.concatenate([[0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2 * np.diff(x))])
    assert stats.t_ppf(0.975, df) == pytest.approx(float(np.interp(0.975, cdf, x)), abs=1e-6)


def test_welch_by_hand():
    # means 2.5 and 5; variances 5/3 and 20/3; se^2 = 25/12; df = (25/12)^2 / ((5/12)^2/3 + (5/3)^2/3) = 75/17;
    # t(0.975, 75/17) = 2.677175 (integrated above): half-width 2.677175 * sqrt(25/12) = 3.864167
    d = stats.welch([1, 2, 3, 4], [2, 4, 6, 8])
    assert d.diff == 2.5 and d.df == pytest.approx(75 / 17)
    assert (d.low, d.high) == pytest.approx((2.5 - 3.864167, 2.5 + 3.864167), abs=1e-5)
    same = stats.welch([3.0, 3.0], [4.0, 4.0])  # no spread on either side: no interval (it was 1.0 … 1.0)
    assert same.diff == 1.0 and math.isnan(same.low) and math.isnan(same.high)
    one = stats.welch([1.0], [2.0, 3.0])
    assert one.diff == 1.5 and math.isnan(one.low) and math.isnan(one.high)


def test_bands_overlap():
    a = np.array([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])  # mean 2, sd 1.414
    b = np.array([[3.4, 2.0, 3.5], [3.4, 2.0, 3.5]])  # sd 0: 1.4 apart (within 1.414), equal, 1.5 apart
    assert stats.bands_overlap(a, b).tolist() == [True, True, False]


def _job(side: str, seed: int, final: float, loss: list[float] | None = None) -> Job:
    j = Job(side, seed, f"{side}-seed{seed}", Path(f"/logs/{side}-{seed}.log"), returncode=0)
    j.curves = {MAP: [final / 200, final / 100], MAP50: [0.5, final / 80],
                "train/box_loss": loss or [2.0, 1.0]}
    return j


def test_a_pose_comparison_is_made_on_the_keypoints_metric():
    """A pose run's results.csv has box and keypoint metrics: the verdict is on mAP50-95(P), whatever the boxes say."""
    jobs = []
    for side, finals in (("stock", [40.0, 40.4, 39.8, 40.2]), ("yolofeed", [40.1, 40.5, 39.9, 40.3])):
        for seed, v in enumerate(finals):
            j = _job(side, seed, 90.0 if side == "stock" else 10.0)  # the boxes: far apart
            j.curves |= {"metrics/mAP50-95(P)": [v / 200, v / 100], "metrics/mAP50(P)": [0.5, v / 80]}
            jobs.append(j)
    s = summarise(jobs)
    assert s.verdict.startswith("no difference detected: +0.10 mAP50-95(P) points"), s.verdict
    assert "mAP50-95(P)" in table(jobs, s).splitlines()[0]


def test_verdicts():
    same = [_job("stock", s, v) for s, v in enumerate([40.0, 40.4, 39.8, 40.2])] + \
           [_job("yolofeed", s, v) for s, v in enumerate([40.1, 40.5, 39.9, 40.3])]
    s = summarise(same)
    # sd 0.258 a side, se 0.183, df 6, t 2.447: 0.10 +- 0.45
    assert s.verdict.startswith("no difference detected: +0.10 mAP50-95 points (95 % CI -0.35 … +0.55, 4 seeds each)")
    assert s.passed and s.verdict.endswith("parity holds")
    noisy = [_job("stock", s, v) for s, v in enumerate([40.0, 41.0, 39.0, 40.0])] + \
            [_job("yolofeed", s, v) for s, v in enumerate([40.2, 40.8, 39.4, 40.0])]
    s = summarise(noisy)  # the same mean difference, but seeds 0.8 points apart: too wide an interval to show it
    assert "(95 % CI -1.16 … +1.36, 4 seeds each); parity not shown (CI lower end <= -1.0)" in s.verdict
    assert s.overlap == {"train/box_loss": 1.0}
    worse = [_job("stock", s, v) for s, v in enumerate([40.0, 41.0, 40.5])] + \
            [_job("yolofeed", s, v) for s, v in enumerate([38.0, 38.5, 38.2])]
    s = summarise(worse)
    assert s.verdict.startswith("yolofeed trains worse: -2.27") and s.passed is False
    assert "|difference| > 0.5" in s.verdict and "CI lower end <= -1.0" in s.verdict
    better = [_job("stock", s, v) for s, v in enumerate([30.0, 30.2])] + \
             [_job("yolofeed", s, v) for s, v in enumerate([31.0, 31.2])]
    assert summarise(better).verdict.startswith("yolofeed trains better: +1.00")
    apart = [_job("stock", s, 40.0 + 0.2 * s, [2.0, 1.0 + 0.01 * s]) for s in range(2)] + \
            [_job("yolofeed", s, 40.0 + 0.2 * s, [2.5, 1.5 + 0.01 * s]) for s in range(2)]
    s = summarise(apart)
    assert s.overlap["train/box_loss"] == 0.0 and not s.passed and "train/box_loss bands overlap in 0 %" in s.verdict
    failed = Job("yolofeed", 1, "yolofeed-seed1", Path("/x.log"), returncode=1)
    s = summarise([_job("stock", 0, 40.0), _job("stock", 1, 41.0), _job("yolofeed", 0, 40.0), failed])
    assert s.passed is None and s.verdict.startswith("no verdict: 2 stock / 1 yolofeed seeds finished, and a verdict "
                                                     "needs at least 2 a side")


@pytest.mark.parametrize("case, stock, yolofeed, words", [
    ("nothing learnt", [0.0, 0.0, 0.0], [0.0, 0.0, 0.0],  # once for both sides, not a sentence each
     "every run of both sides ended at mAP50-95 0.00: nothing was learnt, so there is nothing to compare "
     "(train longer: epochs=, or check the data and the labels)"),
    ("one side learnt nothing", [0.0, 0.0], [1.0, 1.2], "every stock run ended at mAP50-95 0.00"),
    # near nothing: a CI of -0.03 … +0.03 round a mean of 0.01 said "parity holds"
    ("too little learnt", [0.01, 0.02], [0.01, 0.02], "the stock runs ended at a mean mAP50-95 of 0.01 points, "
                                                      "below 1: too little was learnt"),
    ("one side too little", [40.0, 41.0], [0.0, 1.2], "the yolofeed runs ended at a mean mAP50-95 of 0.60 points"),
    ("no spread", [40.0, 40.0], [40.1, 40.4], "the 2 stock runs all ended at exactly 40.00 mAP50-95 (sd 0)"),
    ("not a number", [40.0, float("nan")], [40.1, 40.4], "the final mAP50-95 of stock seed(s) 1 is not a number"),
    ("one side missing", [], [40.1, 40.4], "0 stock / 2 yolofeed seeds finished"),
])
def test_no_verdict_from_degenerate_values(case, stock, yolofeed, words):
    """Every mAP at 0 gave "+0.00 … +0.00; parity holds" (passed: true): a verdict from runs that learnt nothing."""
    s = summarise([_job("stock", k, v) for k, v in enumerate(stock)] +
                  [_job("yolofeed", k, v) for k, v in enumerate(yolofeed)])
    assert s.passed is None and s.verdict.startswith("no verdict: ") and words in s.verdict, s.verdict
    assert "nan" not in s.verdict and "parity holds" not in s.verdict and "CI" not in s.verdict
    assert s.verdict.count("nothing was learnt") <= 1 and s.verdict.count("train longer") <= 1


def test_a_run_that_ended_at_nan_is_named_with_how_to_train_it_again(tmp_path):
    """A finished run is kept by the same comparison run again (``finished_before``), so a NaN run would come back
    every time: the verdict names its folder and says to delete it."""
    out = tmp_path / "my parity"
    jobs = [_job("stock", 0, 40.0), _job("stock", 1, float("nan")),
            _job("yolofeed", 0, 40.1), _job("yolofeed", 1, 40.4)]
    for j in jobs:
        j.log = out / "logs" / f"{j.name}.log"  # where parity puts it
    s = summarise(jobs)
    folder = shlex.quote(str(out / "runs" / "stock-seed1"))
    assert s.passed is None and f"see results.csv in {folder}" in s.verdict
    assert f"the same comparison run again keeps it: delete {folder} to train again" in s.verdict


def test_a_plot_of_one_epoch_shows_its_points(tmp_path, monkeypatch):
    """A line through one point draws nothing: a one-epoch comparison plotted blank."""
    import matplotlib.pyplot as plt

    from yolofeed.bench.parity import plot

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    jobs = [_job(side, k, 10.0 + k) for side in ("stock", "yolofeed") for k in range(2)]
    for j in jobs:
        j.curves = {k: v[-1:] for k, v in j.curves.items()}  # one epoch
    plot(jobs, tmp_path / "parity.png", "one epoch")
    lines = [line for ax in figures[0].axes for line in ax.lines]
    assert len(lines) == 4  # mAP and box loss, each side
    assert all(len(line.get_xdata()) == 1 and line.get_marker() not in (None, "", "None") for line in lines)


def test_the_title_names_the_training_keys_given():
    """A chart of a MuSGD comparison says MuSGD (the title named model, set, epochs, imgsz and batch only)."""
    from yolofeed.bench.parity import parity_title
    from yolofeed.config import ParityConfig

    title = parity_title(ParityConfig(data="/sets/steel/data.yaml", epochs=30, imgsz=320, batch=64,
                                      extra={"optimizer": "MuSGD", "cos_lr": True}))
    assert title == "yolo11n.yaml on data.yaml: 30 epochs, imgsz 320, batch 64, optimizer=MuSGD, cos_lr=True"


def test_devices_and_slots():
    assert devices_of("0,1") == ["0", "1"] and devices_of("cpu") == ["cpu"] and devices_of("cuda:1") == ["1"]
    with pytest.raises(ConfigError, match="device=gpu"):
        devices_of("gpu")
    places = slots(["0", "1"], 2, list(range(32)))
    assert [d for d, _ in places] == ["0", "0", "1", "1"]
    assert [c for _, c in places] == [list(range(k * 8, k * 8 + 8)) for k in range(4)]
    assert [c for _, c in slots(["cpu"], 3, [0, 1])] == [[0], [1], [0]]  # fewer cores than runs: shared


def _fake_runs(monkeypatch, trained: list[str], values: dict | None = None, short: tuple[str, ...] = ()):
    """parity's runs without training: each launch writes its run's results.csv (2 epochs, 1 for a name in ``short``:
    stopped early; its mAP from ``values`` by name, else by seed) and exits 0; the runs launched are appended to
    ``trained``."""
    from yolofeed.bench import parity

    monkeypatch.setattr(parity, "_prepare", lambda cfg: None)
    monkeypatch.setattr(parity.time, "sleep", lambda s: None)

    def launch(job, spec):
        trained.append(job.name)
        run = Path(spec["args"]["project"]) / job.name
        run.mkdir(parents=True, exist_ok=True)
        v = (values or {}).get(job.name, 0.30 + 0.01 * job.seed + (0.002 if job.side == "yolofeed" else 0))
        rows = f"1,1.0,0.2,{v / 2}\n" + ("" if job.name in short else f"2,0.9,0.4,{v}\n")
        (run / "results.csv").write_text(f"epoch,train/box_loss,{MAP50},{MAP}\n{rows}")
        job.log.parent.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(["true"])

    monkeypatch.setattr(parity, "_launch", launch)


def test_an_earlier_comparisons_finished_runs_are_kept_and_first_seed_adds_to_them(synth_root, tmp_path, monkeypatch,
                                                                                     capsys):
    """The same command again trains nothing; first_seed= adds seeds and the verdict covers them all; other settings
    keep nothing (said in one line); a run without all its epochs, or failed, is trained again (found by a first-hour
    tester: a Ctrl-C'd comparison started over, and first_seed=2 gave a verdict of seeds 2-3 alone)."""
    from yolofeed.bench.parity import run
    from yolofeed.config import ParityConfig

    trained: list[str] = []
    _fake_runs(monkeypatch, trained)
    cfg = ParityConfig(data=str(synth_root / "data.yaml"), epochs=2, seeds=2, imgsz=64, batch=8, device="cpu",
                       out=str(tmp_path))
    run(cfg)
    assert trained == ["stock-seed0", "yolofeed-seed0", "stock-seed1", "yolofeed-seed1"]
    trained.clear()
    s = run(cfg)
    assert trained == [] and "4 run(s) of an earlier comparison" in capsys.readouterr().out
    assert s.seeds == {"stock": [0, 1], "yolofeed": [0, 1]}
    s = run(ParityConfig(**{**cfg.__dict__, "first_seed": 2}))
    assert trained == ["stock-seed2", "yolofeed-seed2", "stock-seed3", "yolofeed-seed3"]
    assert s.seeds == {"stock": [0, 1, 2, 3], "yolofeed": [0, 1, 2, 3]} and "4 seeds each" in s.verdict
    report = json.loads((tmp_path / "parity.json").read_text())
    assert [(r["side"], r["seed"]) for r in report["runs"]][:2] == [("stock", 0), ("yolofeed", 0)]
    assert len(report["runs"]) == 8
    (tmp_path / "runs" / "yolofeed-seed1" / "results.csv").write_text(f"epoch,{MAP50},{MAP}\n1,0.2,0.15\n")  # cut
    trained.clear()
    run(ParityConfig(**{**cfg.__dict__, "seeds": 4}))
    assert trained == ["yolofeed-seed1"]
    trained.clear()
    capsys.readouterr()
    run(ParityConfig(**{**cfg.__dict__, "epochs": 3}))  # another setting: nothing kept
    assert len(trained) == 4 and "holds a comparison with other settings (epochs)" in capsys.readouterr().out


def test_only_this_comparisons_own_runs_are_kept(synth_root, tmp_path, monkeypatch, capsys):
    """After a review: a relative data= run from another folder, a results.csv another comparison overwrote (its
    report never written), another yolofeed or Ultralytics, are not kept; a run stopped early (patience=) is, and so
    is a comparison with a tuple among its training keys; a report listing a run twice counts it once."""
    import shutil

    from yolofeed.bench import parity
    from yolofeed.bench.parity import run
    from yolofeed.config import ParityConfig

    trained: list[str] = []
    _fake_runs(monkeypatch, trained, short=("stock-seed1",))
    other = tmp_path / "other"
    shutil.copytree(synth_root, other)
    out = tmp_path / "out"
    cfg = ParityConfig(data="data.yaml", epochs=2, seeds=2, imgsz=64, batch=8, device="cpu", out=str(out),
                       extra={"classes": (0, 1)})
    monkeypatch.chdir(synth_root)
    run(cfg)
    assert len(trained) == 4 and json.loads((out / "parity.json").read_text())["config"]["data"] == str(
        synth_root / "data.yaml")
    trained.clear()
    run(cfg)  # the early-stopped stock-seed1 and the tuple key: kept
    assert trained == []
    monkeypatch.chdir(other)  # data.yaml there is another dataset
    run(cfg)
    assert len(trained) == 4 and "other settings (data)" in capsys.readouterr().out
    monkeypatch.chdir(synth_root)
    run(cfg)  # back: the report is other's, so all 4 again
    trained.clear()
    (out / "runs" / "stock-seed0" / "results.csv").write_text(f"epoch,{MAP50},{MAP}\n1,0.1,0.05\n2,0.1,0.011\n")
    run(cfg)  # another comparison's rows in stock-seed0's folder, not what the report recorded for it
    assert trained == ["stock-seed0"]
    trained.clear()
    report = json.loads((out / "parity.json").read_text())
    report["runs"] = report["runs"] * 2
    (out / "parity.json").write_text(json.dumps(report))
    s = run(cfg)
    assert trained == [] and s.seeds == {"stock": [0, 1], "yolofeed": [0, 1]} and "2 seeds each" in s.verdict
    monkeypatch.setattr(parity, "versions", lambda: {"yolofeed": "99.0", "ultralytics": "8.4.190"})
    capsys.readouterr()
    run(cfg)
    assert len(trained) == 4 and "the yolofeed or Ultralytics version" in capsys.readouterr().out


def test_finished_runs_are_not_kept_from_a_damaged_report(tmp_path):
    from yolofeed.bench.parity import finished_before
    from yolofeed.config import ParityConfig

    cfg = ParityConfig(data=str(tmp_path / "d.yaml"), epochs=2, out=str(tmp_path))
    for text in ("{", "[]", '{"config": 1, "runs": []}', '{"config": {}, "runs": [{"ok": true}]}'):
        (tmp_path / "parity.json").write_text(text)
        assert finished_before(cfg, tmp_path, {}) == []


def test_runs_on_files_changed_since_are_not_kept(synth_root, tmp_path, monkeypatch, capsys):
    """Labels fixed since, or an edited model yaml at the same path, train again: the report records the dataset's
    and the model's files (found by an adversarial tester: fixed labels kept the old runs, and their verdict)."""
    import shutil

    import ultralytics

    from yolofeed.bench.parity import run
    from yolofeed.config import ParityConfig

    trained: list[str] = []
    _fake_runs(monkeypatch, trained)
    data = tmp_path / "data"
    shutil.copytree(synth_root, data)
    (data / "data.yaml").write_text((data / "data.yaml").read_text().replace(str(synth_root), str(data)))
    model = tmp_path / "yolo11n.yaml"
    shutil.copy(Path(ultralytics.__file__).parent / "cfg" / "models" / "11" / "yolo11.yaml", model)
    cfg = ParityConfig(data=str(data / "data.yaml"), model=str(model), epochs=2, seeds=2, imgsz=64, batch=8,
                       device="cpu", out=str(tmp_path / "out"))
    run(cfg)
    trained.clear()
    run(cfg)
    assert trained == []
    label = sorted((data / "labels" / "train").glob("*.txt"))[0]
    label.write_text("0 0.5 0.5 0.9 0.9\n")  # a label fixed
    capsys.readouterr()
    run(cfg)
    assert len(trained) == 4 and "other settings (the dataset's files)" in capsys.readouterr().out
    trained.clear()
    model.write_text(model.read_text() + "\n# edited\n")
    run(cfg)
    assert len(trained) == 4 and "other settings (the model's files)" in capsys.readouterr().out
    # a cfg= file edited in place: its path, the key's value, is the same (found by an adversarial tester: the runs
    # of lr0=0.05 were kept as runs of lr0=0.01)
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("lr0: 0.05\n")
    with_hyp = replace(cfg, extra={"cfg": str(hyp)})
    run(with_hyp)
    trained.clear()
    run(with_hyp)
    assert trained == []
    hyp.write_text("lr0: 0.01\n")
    capsys.readouterr()
    run(with_hyp)
    assert len(trained) == 4 and "other settings (the keys' files)" in capsys.readouterr().out


def test_parity_writes_through_no_link_and_refuses_keys_that_move_its_runs(synth_root, tmp_path, monkeypatch):
    """A link planted at a run's log or folder name is refused before any run, the file it points to untouched; a
    file where the logs folder goes is named; exist_ok= and resume= are refused (exist_ok=False sent each run to
    <name>-2 while parity read <name>: an earlier comparison's results; found by an adversarial tester)."""
    from yolofeed.bench.parity import run
    from yolofeed.config import ParityConfig

    trained: list[str] = []
    _fake_runs(monkeypatch, trained)
    out = tmp_path / "out"
    cfg = ParityConfig(data=str(synth_root / "data.yaml"), epochs=2, seeds=2, imgsz=64, batch=8, device="cpu",
                       out=str(out))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "stock-seed0.log").symlink_to(victim)
    with pytest.raises(ConfigError, match=r"stock-seed0.log is a link \(to .*victim.txt\): yolofeed parity writes"):
        run(cfg)
    assert victim.read_text() == "precious" and trained == []
    (out / "logs" / "stock-seed0.log").unlink()
    (out / "runs").mkdir()
    (out / "runs" / "yolofeed-seed1").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"yolofeed-seed1 is a link"):
        run(cfg)
    (out / "runs" / "yolofeed-seed1").unlink()
    (out / "logs").rmdir()
    (out / "logs").write_text("")
    with pytest.raises(ConfigError, match=r"logs is a file where yolofeed parity keeps its runs' logs"):
        run(cfg)
    (out / "logs").unlink()
    for extra, words in (({"exist_ok": False}, "exist_ok= is set by yolofeed parity itself for each run$"),
                         ({"seed": 5}, "seed= is set by yolofeed parity itself for each run; use its own seeds= and "
                                       "first_seed="),
                         ({"resume": True}, "resume=True: yolofeed parity trains each run from scratch")):
        with pytest.raises(ConfigError, match=words):
            run(ParityConfig(**{**cfg.__dict__, "extra": extra}))
    assert trained == []
    run(ParityConfig(**{**cfg.__dict__, "extra": {"resume": False}}))  # what parity does anyway: taken
    assert len(trained) == 4


def test_a_report_that_is_no_file_or_holds_other_types_keeps_nothing_and_says_so(tmp_path, capsys):
    """A FIFO at parity.json blocked the comparison for good; a report whose runs are a number raised a TypeError
    (found by an adversarial tester). Each now keeps nothing, with one line."""
    import threading

    from yolofeed.bench.parity import finished_before
    from yolofeed.config import ParityConfig

    cfg = ParityConfig(data=str(tmp_path / "d.yaml"), epochs=2, out=str(tmp_path))
    os.mkfifo(tmp_path / "parity.json")
    got: list = []
    t = threading.Thread(target=lambda: got.append(finished_before(cfg, tmp_path, {})), daemon=True)
    t.start()
    t.join(10)
    assert got == [[]] and "is not a report this yolofeed can read" in capsys.readouterr().out
    (tmp_path / "parity.json").unlink()
    for runs in ("5", "null", '"x"'):
        (tmp_path / "parity.json").write_text(f'{{"config": {{}}, "runs": {runs}}}')
        assert finished_before(cfg, tmp_path, {}) == []
        assert "is not a report this yolofeed can read" in capsys.readouterr().out


def test_the_python_api_takes_paths_and_names_a_wrong_type(synth_root, tmp_path, monkeypatch):
    """``Path``s for data=, model= and out= work as text does (out= a Path raised in the report's JSON after the
    runs); a key of another type is named in one line; extra=None is none."""
    import json

    from yolofeed.bench.parity import run
    from yolofeed.config import ParityConfig

    _fake_runs(monkeypatch, [])
    cfg = ParityConfig(data=synth_root / "data.yaml", epochs=2, seeds=2, imgsz=64, batch=8, device="cpu",
                       out=tmp_path / "out", extra=None)
    s = run(cfg)
    assert s.passed is not None and json.loads((tmp_path / "out" / "parity.json").read_text())["config"]["out"] == \
        str(tmp_path / "out")
    for key, value, words in (("epochs", "1", "epochs='1': expected a whole number"),
                              ("seeds", 2.5, "seeds=2.5: expected a whole number"),
                              ("extra", ["lr0"], "extra=['lr0']: expected a dict of training keys")):
        with pytest.raises(ConfigError, match=re.escape(words)):
            run(ParityConfig(**{**cfg.__dict__, key: value}))


def test_one_seed_a_side_is_said_up_front_and_the_numbers_name_their_key(synth_root, tmp_path, monkeypatch, capsys):
    from yolofeed.bench.parity import run
    from yolofeed.config import ParityConfig

    _fake_runs(monkeypatch, [])
    cfg = ParityConfig(data=str(synth_root / "data.yaml"), epochs=2, seeds=1, imgsz=64, batch=8, device="cpu",
                       out=str(tmp_path))
    s = run(cfg)
    said = capsys.readouterr().out
    assert said.index("1 seed a side gives no verdict") < said.index("no verdict:")  # before the runs
    assert f"out={tmp_path} first_seed=1" in said and s.passed is None
    for key, value, least in (("seeds", 0, 1), ("parallel", 0, 1), ("epochs", 0, 1), ("first_seed", -1, 0)):
        with pytest.raises(ConfigError, match=rf"^{key}={value}: expected at least {least} \(default"):
            run(ParityConfig(**{**cfg.__dict__, key: value}))


def _parity_cmd(synth_root: Path, out: Path, seeds: int, epochs: int = 1) -> list[str]:
    return [sys.executable, "-m", "yolofeed", "parity", "model=yolo11n.yaml", f"data={synth_root / 'data.yaml'}",
            f"epochs={epochs}", f"seeds={seeds}", "imgsz=64", "batch=8", "device=cpu", "parallel=2", f"out={out}",
            "workers=0"]


@pytest.mark.slow
def test_tiny_parity_end_to_end(synth_root, tmp_path):
    r = subprocess.run(_parity_cmd(synth_root, tmp_path, 2), env=os.environ | {"YOLO_OFFLINE": "1"},
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "parity.json").read_text())
    assert [(x["side"], x["seed"], x["ok"]) for x in report["runs"]] == [
        ("stock", 0, True), ("yolofeed", 0, True), ("stock", 1, True), ("yolofeed", 1, True)]
    assert report["seeds"] == {"stock": [0, 1], "yolofeed": [0, 1]}
    assert (tmp_path / "parity.png").stat().st_size > 10_000
    verdict = report["verdict"]
    assert verdict in r.stdout
    if all(v == 0 for side in report["final"].values() for v in side["map50_95"]):  # one epoch at 64 px: the usual
        assert report["passed"] is None and verdict.startswith("no verdict: every run of both sides ended at "
                                                                 "mAP50-95 0.00")
    else:
        assert verdict.split(":")[0] in ("no difference detected", "yolofeed trains worse", "yolofeed trains better",
                                         "no verdict")
    for x in report["runs"]:  # each run is a normal Ultralytics run folder
        assert (tmp_path / "runs" / f"{x['side']}-seed{x['seed']}" / "weights" / "last.pt").exists()


def _trainings(proc: subprocess.Popen, n: int = 2) -> list:
    """The processes of a parity's runs once ``n`` of them train (psutil.Process each; up to 300 s): its run
    processes and theirs, not the pack build's workers of its set-up (a signal sent then stopped the build, not the
    runs, and the test failed under load)."""
    import psutil

    def run(p: psutil.Process) -> bool:
        try:
            return "yolofeed.bench.parity" in p.cmdline()
        except psutil.Error:  # ended meanwhile
            return False

    parent = psutil.Process(proc.pid)
    t0 = time.monotonic()
    runs: list[psutil.Process] = []
    while time.monotonic() - t0 < 300 and len(runs) < n and proc.poll() is None:
        runs = [p for p in parent.children() if run(p)]
        time.sleep(0.2)
    assert len(runs) >= n, "the trainings never started"
    return runs + [c for p in runs for c in p.children(recursive=True)]


@pytest.mark.slow
def test_killing_parity_alone_stops_its_trainings(synth_root, tmp_path):
    """SIGKILL to the parity process only (as an OOM killer would): no training is left running."""
    import psutil

    proc = subprocess.Popen(_parity_cmd(synth_root, tmp_path, 2, epochs=50),
                            env=os.environ | {"YOLO_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    children = _trainings(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, [p.cmdline() for p in alive]


@pytest.mark.slow
def test_parity_stopped_by_sigterm_says_so_and_gives_no_verdict(synth_root, tmp_path):
    """SIGTERM to parity alone (a scheduler's stop) while its runs train: exit 143 and one line saying it was stopped,
    no verdict and no "+nan points" (it exited 130 as for Ctrl-C, and parity.json said "difference so far +nan
    points"); the runs are stopped."""
    import psutil

    proc = subprocess.Popen(_parity_cmd(synth_root, tmp_path, 2, epochs=50), env=os.environ | {"YOLO_OFFLINE": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children = _trainings(proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    lines = [x for x in err.splitlines() if x.startswith("yolofeed parity:")]
    assert len(lines) == 1 and "stopped by SIGTERM with 0 of 4 runs finished: no verdict" in lines[0], err[-2000:]
    assert "nan" not in out + lines[0] and "parity holds" not in out and "Traceback" not in err
    report = json.loads((tmp_path / "parity.json").read_text())
    assert report["passed"] is None and report["stopped"] == "SIGTERM" and "nan" not in report["verdict"]
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive


def test_a_mistyped_training_key_is_one_line_before_anything_runs(synth_root, tmp_path, capsys):
    from yolofeed.cli import main

    assert main(["parity", f"data={synth_root / 'data.yaml'}", "mosiac=0.5", f"out={tmp_path}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mosiac" in err[0] and "mosaic" in err[0]
    assert not (tmp_path / "parity.json").exists()


def test_a_comparison_whose_every_run_failed_is_an_error_naming_a_log(synth_root, tmp_path, monkeypatch, capsys):
    """It printed "0 seeds each finished" and exited 0."""
    import yolofeed.bench.parity as parity
    from yolofeed.cli import main

    class Failed:
        pid, returncode = 0, 1

        def poll(self):
            return 1

    monkeypatch.setattr(parity, "_prepare", lambda cfg: None)
    monkeypatch.setattr(parity, "_launch", lambda job, spec: Failed())
    monkeypatch.setattr(parity.time, "sleep", lambda s: None)
    assert main(["parity", f"data={synth_root / 'data.yaml'}", "seeds=2", "epochs=1", "device=cpu",
                 f"out={tmp_path}"]) == 1
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("yolofeed parity:")]
    assert err == [f"yolofeed parity: error: no run finished (the first failed with exit 1): its log says why, "
                   f"{tmp_path / 'logs' / 'stock-seed0.log'}"]


@pytest.mark.parametrize("fails", ["parity.json", "parity.png", "the last parity.json", "parity.json from the 4th"])
def test_a_full_out_disk_keeps_the_verdict_and_says_so_in_one_line(synth_root, tmp_path, monkeypatch, capsys, fails):
    """out= fills while the runs train: the comparison goes on, its table and verdict are printed, then one line
    names the file, the cause and what an earlier write left; nothing half-written is left. Was a traceback from
    the report's write and a 0-byte parity.json.tmp."""
    import errno

    import yolofeed.bench.parity as parity
    from yolofeed import atomic
    from yolofeed.cli import main

    class Done:
        pid, returncode = 0, 0

        def poll(self):
            return 0

    finals = iter([40.0, 41.0, 42.0, 40.5, 41.5, 43.0])

    def curves(folder):
        last = next(finals) / 100
        return {"metrics/mAP50-95(B)": [last / 2, last], "metrics/mAP50(B)": [last, last + 0.1],
                "train/box_loss": [2.0, 1.5]}

    real = atomic.create_temp
    tries = []

    def create_temp(path):  # the disk full as write_atomically meets it: at the temporary file
        tries.append(path.name)
        n = tries.count("parity.json")
        if fails == path.name or (fails == "the last parity.json" and n == 7) or (fails.endswith("4th") and n >= 4):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path)

    monkeypatch.setattr(parity, "_prepare", lambda cfg: None)
    monkeypatch.setattr(parity, "_launch", lambda job, spec: Done())
    monkeypatch.setattr(parity, "read_curves", curves)
    monkeypatch.setattr(parity.time, "sleep", lambda s: None)
    monkeypatch.setattr(atomic, "create_temp", create_temp)
    out = tmp_path / "p"
    assert main(["parity", f"data={synth_root / 'data.yaml'}", "seeds=3", "epochs=2", "device=cpu",
                 f"out={out}"]) == 1
    captured = capsys.readouterr()
    assert "report: not written (No space left on device)" in captured.out
    assert any(line.startswith(("no difference detected", "yolofeed trains")) for line in captured.out.splitlines())
    errors = [x for x in captured.err.splitlines() if x.startswith("yolofeed parity:")]
    assert len(errors) == 1 and f"out={out}" in errors[0] and "the verdict above stands" in errors[0], errors
    name = "parity.png" if fails == "parity.png" else "parity.json"
    assert f"{name} could not be written in {out}: the disk is full" in errors[0], errors
    # written after each run: the last write before the final one holds every run, the third only three
    assert ("holds the first 3 of 6 runs" in errors[0]) == fails.endswith("4th"), errors
    left = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != ".lock")  # the lock: its own tests
    assert left == ([] if fails == "parity.json" else ["parity.json"]), left
    if fails.endswith("4th"):
        assert sum(r["returncode"] is not None for r in json.loads((out / "parity.json").read_text())["runs"]) == 3


def test_parity_prepares_the_packs_and_label_caches_of_the_models_task(obb_dataset):
    """The packs its runs would otherwise race to build are those of the model's task (an OBB model's: -obb), and no
    detection pack of an OBB dataset, which no run reads, is built beside them."""
    from yolofeed.bench.parity import _prepare
    from yolofeed.config import ParityConfig

    _prepare(ParityConfig(data=str(obb_dataset / "data.yaml"), model="yolo11n-obb.yaml", imgsz=64, pack_format="raw"))
    assert sorted(p.name for p in (obb_dataset / "yolofeed-packs").iterdir()) == ["data-raw-64-obb"]
    assert sorted(p.name for p in (obb_dataset / "yolofeed-packs" / "data-raw-64-obb").glob("*.yfpack")) == [
        "train.yfpack", "val.yfpack"]


def test_out_a_file_or_a_folder_another_parity_holds_is_one_line_before_any_run(synth_root, tmp_path, capsys):
    """Both were a traceback (FileExistsError) or a silent mix: two comparisons in one out= wrote each other's
    results.csv rows, each reporting 2 epochs for epochs=1."""
    from yolofeed.cli import main
    from yolofeed.pack.lock import FolderLock

    args = ["parity", f"data={synth_root / 'data.yaml'}", "imgsz=64", "device=cpu", "epochs=1", "seeds=1"]
    (tmp_path / "a_file").write_text("x")
    assert main([*args, f"out={tmp_path / 'a_file'}"]) == 1
    err = capsys.readouterr().err
    assert f"out={tmp_path / 'a_file'}: cannot write in" in err and "pass out= a folder you can write in" in err
    held = FolderLock(tmp_path / "busy")
    assert held.try_acquire()  # another comparison's, as its process holds it
    try:
        assert main([*args, f"out={tmp_path / 'busy'}"]) == 1
    finally:
        held.release()
    err = capsys.readouterr().err
    assert f"out={tmp_path / 'busy'}: another yolofeed parity writes in {tmp_path / 'busy'} (" in err
    assert "wait for it to end, or choose another out=" in err and not (tmp_path / "busy" / "runs").exists()


def test_no_verdict_because_runs_failed_is_an_error(synth_root, tmp_path, monkeypatch, capsys):
    """Every yolofeed run failed: the table, then one error line naming the failed runs and the first's log, exit 1
    (it printed 'no verdict' and exited 0, as a comparison that had simply ended; found by an adversarial run). A run
    failed among enough finished ones still gives its verdict."""
    from yolofeed.bench import parity
    from yolofeed.cli import main

    trained: list[str] = []
    _fake_runs(monkeypatch, trained)
    launch = parity._launch

    def failing(job, spec):
        proc = launch(job, spec)
        return subprocess.Popen(["false"]) if job.side == "yolofeed" or job.name == "stock-seed2" else proc

    monkeypatch.setattr(parity, "_launch", failing)
    args = ["parity", f"data={synth_root / 'data.yaml'}", "epochs=2", "imgsz=64", "batch=8", "device=cpu"]
    assert main([*args, "seeds=2", f"out={tmp_path / 'a'}"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert err == [f"yolofeed parity: error: no verdict: 2 of 4 runs failed (yolofeed-seed0, yolofeed-seed1); the "
                   f"first's log says why: {tmp_path / 'a' / 'logs' / 'yolofeed-seed0.log'}"]
    monkeypatch.setattr(parity, "_launch", lambda job, spec: failing(job, spec) if job.side == "stock" else
                        launch(job, spec))
    assert main([*args, "seeds=3", f"out={tmp_path / 'b'}"]) == 0  # stock-seed2 failed: 2 a side still finished
