"""The doctor: each planted bottleneck gets its verdict; the report renders; the command runs on the CPU."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from dataclasses import replace

import pytest

from helpers import FakeClock
from yolofeed.doctor.rules import Facts, diagnose

# a healthy GPU run: fed, busy, big steps; each case below changes what makes its cause true
FED = Facts(images_per_s=1500, step_ms=85, data_wait=0.01, preprocess_share=0.03, gpu_util=92, cores=16,
            machine_cores_busy=2.0, own_cores_busy=1.8, iowait=0.0, disk_read_mb_s=0, workers=8, batch=128, amp=True,
            n_train=10000, n_val=500, val_images_per_s=3000)

CASES = {
    "gpu_bound": {},
    "cpu_augmentation": dict(data_wait=0.55, gpu_util=38, own_cores_busy=15.2, machine_cores_busy=15.5),
    "too_few_workers": dict(data_wait=0.60, gpu_util=30, workers=2, own_cores_busy=2.9, machine_cores_busy=3.0),
    # measured on the H200 machine (tools/device/doctor_plant.sh; BENCHMARKS.md, the doctor's planted cases):
    # workers=1, batch 64
    "too_few_workers_h200": dict(data_wait=0.92, gpu_util=5.8, workers=1, own_cores_busy=1.17,
                                 machine_cores_busy=1.19, batch=64, images_per_s=66.4, step_ms=970,
                                 yolofeed_images_per_s=918),
    "disk_io": dict(data_wait=0.45, gpu_util=45, iowait=0.35, disk_read_mb_s=180, own_cores_busy=4,
                    machine_cores_busy=4),
    "cpu_contention": dict(data_wait=0.40, gpu_util=50, own_cores_busy=8, machine_cores_busy=15.8),
    "host_to_device": dict(preprocess_share=0.30, gpu_util=70, data_wait=0.02),
    "small_batch": dict(batch=4, step_ms=22, gpu_util=35, data_wait=0.03),
    # measured on the H200 machine (the same planted cases), yolo11n, 640 px:
    # mixup + cutmix + degrees on 16 workers, batch 128: the loader kept up, a saturated CPU starved the loop
    "cpu_augmentation_h200": dict(data_wait=0.0065, gpu_util=45.4, workers=16, own_cores_busy=15.9,
                                  machine_cores_busy=15.92, images_per_s=689.5, step_ms=174.6,
                                  yolofeed_images_per_s=1463),
    # ... 12 CPU-hog processes beside a stock run with 16 workers:
    "cpu_contention_h200": dict(data_wait=0.0112, gpu_util=42.8, workers=16, own_cores_busy=8.65,
                                machine_cores_busy=15.98, images_per_s=814.2, step_ms=154.8,
                                yolofeed_images_per_s=1490),
    # ... batch 4, 8 workers, in a run with 62 ms steps of host overhead, GPU 16 % busy
    "small_batch_h200": dict(data_wait=0.0044, gpu_util=15.9, workers=8, batch=4, own_cores_busy=2.08,
                             machine_cores_busy=2.02, images_per_s=65.7, step_ms=61.5),
    # ... the images evicted from the page cache, reads capped at 10 MB/s (cgroup io.max), batch 32, 16 workers
    # (the warm-up covering the workers' queue of 64 batches)
    "disk_io_h200": dict(data_wait=0.679, gpu_util=7.9, workers=16, batch=32, own_cores_busy=2.08,
                         machine_cores_busy=2.01, iowait=0.82, disk_read_mb_s=10.4, images_per_s=214.9, step_ms=67.2),
    "optimizer": dict(optimizer_share=0.40, gpu_util=40, optimizer="SGD"),
    # yolofeed's breakdown in `yolofeed bench` on the H200, yolo11n at batch 16: optimizer=auto chose MuSGD
    # (over 10,000 iterations), whose step took 44 % of each step (38 of 87 ms in the phase means); data wait 2 %,
    # GPU 22 %. Without this rule the small-batch rule would have named the batch.
    "optimizer_h200": dict(data_wait=0.0203, gpu_util=22.3, batch=16, step_ms=84.07, optimizer_share=0.436,
                           optimizer="MuSGD", images_per_s=189.8, own_cores_busy=1.05, machine_cores_busy=1.07),
    # `yolofeed bench` on the H200, yolo11n-seg at batch 128 (BENCHMARKS.md, "Segmentation", fb1f6fa): stock's loss
    # phase 167 of 466 ms (phases' sum), the GPU 34 % busy, no data wait; yolofeed 765 img/s
    "loss_h200": dict(data_wait=0.0015, gpu_util=33.6, batch=128, step_ms=351.4, loss_share=166.84 / 465.85,
                      task="segment", images_per_s=344.6, yolofeed_images_per_s=764.8, own_cores_busy=7.53,
                      machine_cores_busy=7.55, workers=16),
    # ... yolo11x, batch 32, 16 workers (4 cores of leftover hogs beside it, which the GPU-bound run did not feel)
    "gpu_bound_h200": dict(data_wait=0.0036, gpu_util=88.2, workers=16, batch=32, own_cores_busy=4.94,
                           machine_cores_busy=9.0, images_per_s=237.7, step_ms=133.8),
}


@pytest.mark.parametrize("cause", list(CASES))
def test_each_planted_bottleneck_is_named(cause):
    verdicts = diagnose(replace(FED, **CASES[cause]))
    assert verdicts[0].rule == cause.removesuffix("_h200") and verdicts[0].bottleneck
    assert re.search(r"\d", verdicts[0].evidence), "the evidence carries numbers"
    assert verdicts[0].advice


def test_slow_logging_callbacks_are_a_finding():
    slow = {"wandb.integration.ultralytics.on_batch_end": 9.0, "ultralytics.utils.callbacks.hub.on_fit_epoch_end": 0.4}
    v = {x.rule: x for x in diagnose(replace(FED, callbacks_ms=slow))}
    assert "logging" in v and not v["logging"].bottleneck and "wandb" in v["logging"].evidence
    assert "logging" not in {x.rule for x in diagnose(replace(FED, callbacks_ms={"x.cheap": 0.5}))}


def test_callback_clock_times_each_callback_and_skips_its_own():
    from yolofeed.monitor.callbacks import CallbackClock

    clock = FakeClock()
    own = lambda trainer: None  # noqa: E731

    def logger_batch_end(trainer):
        clock.t += 0.004

    callbacks = {"on_train_batch_end": [own, logger_batch_end], "on_train_epoch_end": [logger_batch_end]}
    cc = CallbackClock(clock)
    cc.wrap(callbacks, skip=[own])
    assert callbacks["on_train_batch_end"][0] is own
    for fn in callbacks["on_train_batch_end"]:  # before start(): not counted
        fn(None)
    cc.start()
    for _ in range(10):
        for fn in callbacks["on_train_batch_end"]:
            fn(None)
    ms = cc.ms_per_step(10)
    here = f"{__name__}.test_callback_clock_times_each_callback_and_skips_its_own.<locals>"
    assert list(ms) == [f"{here}.logger_batch_end"]
    assert abs(ms[next(iter(ms))] - 4.0) < 1e-9


def test_findings_that_hold_alongside():
    v = diagnose(replace(FED, val_images_per_s=100, amp=False))  # 500 val images at 100/s vs 7 s of training
    assert [x.rule for x in v] == ["gpu_bound", "validation", "amp_off"]
    assert not v[1].bottleneck and "val_period=N" in v[1].advice[0] and "val_overlap=True" in v[1].advice[1]
    assert "val=False" in v[1].advice[2]
    # measured on the H200 machine: 2,000 val images at 112 img/s beside 4,000 train at 572 img/s
    h200 = replace(FED, n_train=4000, n_val=2000, val_images_per_s=112.2, images_per_s=571.6)
    assert "validation" in [x.rule for x in diagnose(h200)]
    assert "validation" not in [x.rule for x in diagnose(replace(h200, n_val=100))]  # 0.9 s against 7 s: 13 %
    assert "takes 5.0 s against 6.7 s of training per epoch" in v[1].evidence
    tiny = diagnose(replace(FED, n_train=16, n_val=8, images_per_s=40, val_images_per_s=20))  # was "0 s against 0 s"
    said = next(x for x in tiny if x.rule == "validation").evidence
    assert "takes 400 ms against 400 ms of training per epoch" in said


def test_cpu_only_run_says_so():
    v = diagnose(replace(FED, gpu_util=None, data_wait=0.3, own_cores_busy=1.0, machine_cores_busy=1.0, cores=2))
    assert v[0].rule == "cpu_only_compute" and "CPU-only" in v[0].title


def test_advice_names_the_measured_yolofeed_gain():
    v = diagnose(replace(FED, **CASES["cpu_augmentation"], images_per_s=600, yolofeed_images_per_s=1550))
    assert any("1,550 img/s with yolofeed" in a and "2.6x" in a for a in v[0].advice)


def _profile(mode: str, wait: float) -> dict:
    t = [0.1 * k for k in range(30)]
    return {"mode": mode, "images_per_s": 600.0, "step_ms": 200.0, "data_wait_fraction": wait, "gpu_util": 40.0,
            "own_cores_busy": 15.0, "cpu_cores_busy": 15.5, "cores": 16, "mean_step_ms": 213.3,
            "phases_ms": {"data_wait": 200 * wait, "preprocess": 5, "forward": 40, "loss": 10, "backward": 60,
                          "optimizer": 5},
            "timeline": {"t": t, "gpu_util": [40.0] * 30, "cpu_cores_busy": [15.5] * 30, "own_cores_busy": [15.0] * 30,
                         "disk_read_mb_s": [0.0] * 30, "step_t": t[::3], "step_wait_fraction": [wait] * 10}}


def test_report_is_self_contained(tmp_path):
    from PIL import Image

    from yolofeed.doctor import report

    html = report.write(tmp_path, {"summary": "test run"}, [_profile("stock", 0.5), _profile("yolofeed", 0.01)],
                        diagnose(replace(FED, **CASES["cpu_augmentation"])))
    text = html.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(images) == 2 and "http" not in text.replace("http-equiv", "")  # nothing fetched: opens offline
    for b64 in images:
        im = Image.open(io.BytesIO(base64.b64decode(b64)))
        assert im.size[0] > 400 and im.size[1] > 100
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["verdicts"][0]["rule"] == "cpu_augmentation" and len(data["profiles"]) == 2


def test_report_says_when_where_and_with_what_it_ran(tmp_path):
    """A report sent to a colleague carries its date, versions, host, GPU and command line (HTML and JSON), and
    the mean step beside the median, named as such."""
    from yolofeed.doctor import report
    from yolofeed.monitor.system import environment

    env = environment()
    command = "yolofeed doctor data=d.yaml batch=64 workers=4"
    html = report.write(tmp_path, {"summary": "test run", "command": command}, [_profile("stock", 0.5)],
                        diagnose(replace(FED, **CASES["cpu_augmentation"])), env).read_text()
    for value in (env["date"], env["ultralytics"], env["torch"], env["cpu"], str(env["cores"]), command):
        assert str(value) in html, value
    assert "Date (UTC)" in html and "NVIDIA driver" in html and "GPU" in html
    assert "mean step, ms" in html and "median step, ms" in html
    row = re.search(r"<tr><td>stock</td>(.*?)</tr>", html).group(1)
    assert re.findall(r"<td>([^<]*)</td>", row)[1:3] == ["213.3", "200.0"]  # mean, then median
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["environment"] == json.loads(json.dumps(env)) and data["config"]["command"] == command


def test_the_command_line_is_rebuilt_from_the_config():
    from yolofeed.cli import build_config
    from yolofeed.doctor.report import command_line

    cfg = build_config("doctor", ["data=my data.yaml", "batch=64", "amp=False", "out=runs/doctor"])
    assert command_line("doctor", cfg) == "yolofeed doctor 'data=my data.yaml' batch=64 amp=False"


def test_a_slower_yolofeed_is_said_plainly():
    """On the CPU yolofeed can be slower than stock: the report must say so, not advise yolofeed anyway."""
    cpu = replace(FED, gpu_util=None, data_wait=0.1, own_cores_busy=1.0, machine_cores_busy=1.0, cores=2,
                  images_per_s=54, yolofeed_images_per_s=42)
    v = {x.rule: x for x in diagnose(cpu)}
    assert "yolofeed_slower" in v and not v["yolofeed_slower"].bottleneck
    assert "slower than stock" in v["yolofeed_slower"].title and "42 img/s" in v["yolofeed_slower"].evidence
    assert any("stock Ultralytics" in a for a in v["yolofeed_slower"].advice)
    gpu = replace(FED, **CASES["cpu_augmentation"], images_per_s=600, yolofeed_images_per_s=500)
    v = diagnose(gpu)
    assert "yolofeed_slower" in [x.rule for x in v]
    assert not any("yolofeed train" in a and "x)" in a for a in v[0].advice)  # no "(0.8x)" gain offered
    assert any("was slower" in a for a in v[0].advice)
    assert "yolofeed_slower" not in [x.rule for x in diagnose(replace(cpu, yolofeed_images_per_s=60))]
    assert "yolofeed_slower" not in [x.rule for x in diagnose(replace(cpu, yolofeed_images_per_s=None))]


def _fake_profile(mode: str):
    """What ``profile`` returns, without training: the doctor's own logic around it is under test."""
    from yolofeed.measure.result import Profile

    p = _profile(mode, 0.3 if mode == "stock" else 0.01)
    keys = {f for f in Profile.__dataclass_fields__}
    base = dict(device="cpu", windows=[600.0], steps=5, warmup=2, gpu_util=None, gpu_clock_mhz=None, gpu_power_w=None,
                iowait=0.0, disk_read_mb_s=0.0, gpu_mem_peak_gb=None, batch=4, workers=0, n_train=24, n_val=8)
    return Profile(**{**base, **{k: v for k, v in p.items() if k in keys and k != "gpu_util"}})


def test_doctor_checks_out_before_profiling(synth_root, tmp_path, monkeypatch, capsys):
    """out= naming a file (or a folder under one) once cost minutes of profiling, then a NotADirectoryError with no
    verdict. Now: one line, naming the folder, before anything trains."""
    import yolofeed.doctor.run as doctor
    from yolofeed.cli import main

    monkeypatch.setattr(doctor, "profile", lambda *a, **k: pytest.fail("profiled before checking out="))
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "report.txt"
    blocker.write_text("not a folder")
    for out in (blocker, blocker / "sub"):  # model= and data= are checked first: they must be right
        assert main(["doctor", f"data={synth_root / 'data.yaml'}", f"out={out}"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"out={out}" in err[0] and "folder" in err[0], err


def test_the_verdict_is_printed_even_when_the_report_cannot_be_written(synth_root, tmp_path, monkeypatch, capsys):
    import errno

    import yolofeed.doctor.run as doctor
    from yolofeed.cli import main

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(doctor, "profile", lambda mode, *a, **k: _fake_profile(mode))
    monkeypatch.setattr(doctor.report, "write", full_disk)
    monkeypatch.chdir(tmp_path)
    assert main(["doctor", f"data={synth_root / 'data.yaml'}", f"out={tmp_path / 'doc'}", "device=cpu"]) == 1
    captured = capsys.readouterr()
    assert "VERDICT:" in captured.out and "report: not written" in captured.out
    errors = [line for line in captured.err.splitlines() if "error" in line]  # stderr also holds the step bar
    assert len(errors) == 1 and "No space left on device" in errors[0] and "verdict above" in errors[0]


@pytest.mark.parametrize("command", ["doctor", "bench", "parity"])
def test_a_key_yolofeed_refuses_is_one_line_before_stocks_runs(synth_root, tmp_path, monkeypatch, capsys, command):
    """``rect=True`` (which yolofeed train refuses) let parity train every stock run, then fail each yolofeed run with
    the reason in its log alone and exit 0; bench and doctor ran stock first (found by an adversarial run)."""
    import subprocess

    import yolofeed.bench.run as bench
    import yolofeed.doctor.run as doctor
    from yolofeed.cli import main

    monkeypatch.setattr(doctor, "profile", lambda *a, **k: pytest.fail("profiled before checking the keys"))
    monkeypatch.setattr(bench, "run_isolated", lambda *a, **k: pytest.fail("benched before checking the keys"))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a run started before checking the keys"))
    assert main([command, f"data={synth_root / 'data.yaml'}", f"out={tmp_path / 'o'}", "device=cpu",
                 "rect=True"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "rect=True: rectangular training batches are not supported" in err[0], err


@pytest.mark.parametrize("command, name", [("doctor", "report.html"), ("bench", "bench.json"), ("bench", "bench.png"),
                                           ("parity", "parity.json")])
def test_a_folder_where_a_report_goes_is_one_line_before_any_run(synth_root, tmp_path, monkeypatch, capsys, command,
                                                                 name):
    """A folder at parity.json's (or bench.json's) name was found after every run: the report and the figure lost,
    and the error named an internal temporary file (found by an adversarial run)."""
    import subprocess

    import yolofeed.bench.run as bench
    import yolofeed.doctor.run as doctor
    from yolofeed.cli import main

    monkeypatch.setattr(doctor, "profile", lambda *a, **k: pytest.fail("profiled before checking out="))
    monkeypatch.setattr(bench, "run_isolated", lambda *a, **k: pytest.fail("benched before checking out="))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a run started before checking out="))
    out = tmp_path / "o"
    (out / name).mkdir(parents=True)
    assert main([command, f"data={synth_root / 'data.yaml'}", f"out={out}", "device=cpu"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert err == [f"yolofeed {command}: error: out={out}: {out / name} is a folder where the report {name} goes; "
                   "move it away, or pass another out="]


@pytest.mark.parametrize("command", ["doctor", "bench", "parity"])
def test_out_a_link_loop_is_one_line_before_any_run(synth_root, tmp_path, monkeypatch, capsys, command):
    """``out=`` a loop of symbolic links was Python's RuntimeError "Symlink loop" with its traceback (found by a
    reviewer), in doctor, bench and parity, whose out= is made by the same check."""
    import yolofeed.doctor.run as doctor
    from yolofeed.cli import main

    monkeypatch.setattr(doctor, "profile", lambda *a, **k: pytest.fail("profiled before checking out="))
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert main([command, f"data={synth_root / 'data.yaml'}", f"out={tmp_path / 'a'}", "device=cpu"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and f"out={tmp_path / 'a'}: cannot resolve the path" in err[0], err
    assert "pass out= a folder that is not a link loop" in err[0]


@pytest.mark.parametrize("extra, timed", [([], True), (["val=False"], False), (["val=True"], True)])
def test_the_doctor_times_a_validation_only_where_the_run_validates(synth_root, tmp_path, monkeypatch, extra, timed):
    """With ``val=False`` the doctor timed a validation anyway, and its validation rule then advised ``val=False``,
    the run's own setting (found by a hostile pass): the pass is not timed, and the rule, which needs it, is silent."""
    import yolofeed.doctor.run as doctor
    from yolofeed.cli import main

    asked = []

    def profiled(mode, *a, time_validation=False, **k):
        asked.append((mode, time_validation))
        return _fake_profile(mode)

    monkeypatch.setattr(doctor, "profile", profiled)
    monkeypatch.chdir(tmp_path)
    assert main(["doctor", f"data={synth_root / 'data.yaml'}", f"out={tmp_path / 'doc'}", "device=cpu", *extra]) == 0
    assert asked == [("stock", timed), ("yolofeed", False)]


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="needs a chromium on PATH: apt-get install chromium (.ci/run does; see CONTRIBUTING.md)")
def test_report_renders_in_headless_chromium(tmp_path):
    """Open report.html in a real browser; the stacked bar's data-wait red must be on screen."""
    from PIL import Image

    from yolofeed.doctor import report

    html = report.write(tmp_path, {"summary": "test run"}, [_profile("stock", 0.5), _profile("yolofeed", 0.01)],
                        diagnose(replace(FED, **CASES["cpu_augmentation"])))
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                    "--window-size=1000,2600", f"--screenshot={shot}", html.as_uri()],
                   check=True, capture_output=True, timeout=120)
    import numpy as np

    px = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    red = int((np.abs(px - np.array([0xd6, 0x27, 0x28])).max(-1) < 8).sum())
    assert red > 500, "the step-breakdown plot is not on the rendered page"


@pytest.mark.slow
def test_doctor_runs_on_the_cpu(synth_root, tmp_path, capfd):
    from yolofeed.cli import main

    out = tmp_path / "doc"
    assert main(["doctor", f"data={synth_root / 'data.yaml'}", "imgsz=64", "batch=4", "steps=5", "warmup=2",
                 "device=cpu", f"out={out}"]) == 0
    captured = capfd.readouterr()
    text = captured.out
    assert "VERDICT:" in text and "report.html" in text
    # its own step bar over both modes (2 x (2 warm-up + 5 + 1)), not Ultralytics' bar of 10**6 epochs
    assert "1000000" not in captured.out + captured.err and "Starting training" not in captured.out
    assert "16/16" in captured.err and "stock (1/2)" in captured.err and "yolofeed (2/2)" in captured.err
    assert (out / "runs" / "stock" / "args.yaml").is_file()  # where out= says: TensorBoard hints point at it
    # CPU-only is the verdict, or (when other processes load this machine) a finding beside cpu_contention
    assert "CPU-only" in text or "used no GPU" in text
    assert {p.name for p in out.iterdir()} >= {"report.html", "report.json", "timeline.png", "breakdown.png"}
    stock = json.loads((out / "report.json").read_text())["profiles"][0]
    assert stock["warmup"] == 2  # Ultralytics trains on the CPU with workers=0: no queue to cover
    assert stock["optimizer"] == "AdamW"  # optimizer=auto for a short run (under 10,000 iterations)
    assert stock["ram_used_gb"] > 0 and 0 <= stock["busiest_core"] <= 1 and stock["cores"] >= 1
    assert stock["mean_step_ms"] >= stock["step_ms"] * 0.5 and stock["mean_step_ms"] > 0
    assert stock["train_tflops"] > 0 and stock["mfu"] is None  # efficiency beside utilisation; no GPU, no peak
    assert "training TFLOP/s" in (out / "report.html").read_text()
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["command"].startswith("yolofeed doctor data=") and report["environment"]["date"]
    stock_rate, yolofeed_rate = (p["images_per_s"] for p in report["profiles"])
    assert ("yolofeed was slower" in text) == (yolofeed_rate < stock_rate)


def test_optimizer_advice_names_musgd_only_when_it_ran():
    musgd = diagnose(replace(FED, **CASES["optimizer_h200"]))[0]
    sgd = diagnose(replace(FED, **CASES["optimizer"]))[0]
    assert "37 ms of the median 84 ms step (44 %)" in musgd.evidence and "MuSGD" in musgd.evidence
    assert any("optimizer=AdamW" in a for a in musgd.advice) and not any("MuSGD" in a for a in sgd.advice)
    # yolofeed's MuSGD first: the same optimiser, cheaper; another optimiser changes the training
    assert "one CUDA graph" in musgd.advice[0] and "optimizer=AdamW" in musgd.advice[1]



def test_loss_advice_names_the_tasks_own_loss():
    seg = diagnose(replace(FED, **CASES["loss_h200"]))[0]
    det = diagnose(replace(FED, **{**CASES["loss_h200"], "task": "detect"}))[0]
    assert "about 126 ms of the median 351 ms step (36 %)" in seg.evidence and "image by image" in seg.evidence
    assert "mask loss for groups of images" in seg.advice[0] and "2.2x" in seg.advice[0]
    assert "mask" not in det.evidence + det.advice[0] and "without host syncs" in det.advice[0]
    assert diagnose(replace(FED, **{**CASES["loss_h200"], "loss_share": 0.1}))[0].rule != "loss"


@pytest.mark.gpu
def test_the_environment_is_read_without_starting_cuda():
    """The doctor reads the GPUs before Ultralytics sets CUDA_VISIBLE_DEVICES for device=N: asking torch.cuda then
    would start CUDA on every GPU, and the run would train on GPU 0 whatever device= said."""
    import sys

    code = ("import torch\nfrom yolofeed.monitor.system import environment\ne = environment()\n"
            "assert e['gpus'] and e['driver'], e\nassert not torch.cuda.is_initialized()\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_workers_the_run_did_not_use_are_said_with_the_reason(synth_root, tmp_path, monkeypatch, capsys):
    """``doctor workers=2`` on the CPU printed "workers 0": Ultralytics trains there without workers, unsaid."""
    import yolofeed.doctor.run as doctor
    from yolofeed.cli import main

    monkeypatch.setattr(doctor, "profile", lambda mode, *a, **k: _fake_profile(mode))
    data = f"data={synth_root / 'data.yaml'}"  # checked before the (faked) profiles, as yolofeed train checks it
    assert main(["doctor", data, "workers=2", f"out={tmp_path / 'doc'}", "device=cpu"]) == 0
    out = capsys.readouterr().out
    assert "workers 0 (workers=2 asked; Ultralytics trains on the CPU without DataLoader workers)" in out, out
    assert main(["doctor", data, "workers=0", f"out={tmp_path / 'doc'}", "device=cpu"]) == 0
    assert ", workers 0, device cpu" in capsys.readouterr().out  # as asked: nothing to explain


def test_a_batch_larger_than_the_set_is_said_with_the_batch_trained(synth_root, tmp_path, monkeypatch, capsys):
    """Ultralytics' loader trains a set of 24 images at batch=32 a step of 24; the summary said "batch 32"."""
    import dataclasses

    import yolofeed.doctor.run as doctor
    from yolofeed.cli import main

    monkeypatch.setattr(doctor, "profile", lambda mode, *a, **k: dataclasses.replace(_fake_profile(mode), batch=32))
    assert main(["doctor", f"data={synth_root / 'data.yaml'}", f"out={tmp_path / 'doc'}", "device=cpu"]) == 0
    assert ", batch 32 (the set's 24 images a step), " in capsys.readouterr().out


def test_a_model_whose_task_the_data_cannot_train_is_one_line_in_doctor_bench_and_parity(synth_root, obb_root,
                                                                                        tmp_path, monkeypatch,
                                                                                        capsys):
    """Ultralytics' own trainer (each command's stock side) stopped in a traceback on a pose model without the yaml's
    kpt_shape, or an oriented-box model on box rows; yolofeed train refused both in one line. Now so do doctor, bench
    and parity, before anything trains. The doctor profiles an OBB model against Ultralytics' OBBTrainer."""
    import yolofeed.doctor.run as doctor
    from yolofeed.cli import main
    from yolofeed.ultralytics_seam import OBBTrainer

    monkeypatch.setattr(doctor, "profile", lambda *a, **k: pytest.fail("profiled a model its data cannot train"))
    detect = synth_root / "data.yaml"
    for command in ("doctor", "bench", "parity"):
        for model, words in (("yolo11n-pose.yaml", "'kpt_shape' in data.yaml missing"),
                             ("yolo11n-obb.yaml", r"is an oriented-box model and .* holds box rows \(class x y w h")):
            assert main([command, f"model={model}", f"data={detect}", f"out={tmp_path / command}"]) == 1
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and re.search(words, err[0]), (command, err)
    assert doctor.trainer_class("stock", "obb") is OBBTrainer
    from yolofeed.train.run import check_model_and_data

    check_model_and_data("yolo11n-obb.yaml", str(obb_root / "data.yaml"))  # its own kind of data: no complaint


@pytest.mark.parametrize("command", ["bench", "doctor"])
@pytest.mark.parametrize("extra, words", [
    ({"resume": True}, "resume=True: yolofeed {c} trains runs of its own from scratch; go on with a training of yours "
                       "with yolofeed train model=<run>/weights/last.pt resume"),
    ({"project": "/elsewhere", "name": "same"}, "project=/elsewhere, name=same: yolofeed {c} puts each mode's run in "
                                                "out=/runs/<mode> itself; choose the folder with out="),
    ({"exist_ok": False}, "exist_ok=False: yolofeed {c} puts each mode's run"),
])
def test_bench_and_doctor_refuse_keys_that_move_their_runs(synth_root, tmp_path, command, extra, words):
    """project=/name= sent both modes into one folder (the second overwrote the first's files, the report named
    out=/runs), resume= trained a stranger's newest last.pt (found by an adversarial tester): one line, nothing run."""
    from yolofeed.bench.run import run as bench
    from yolofeed.config import BenchConfig, DoctorConfig
    from yolofeed.doctor.run import run as doctor
    from yolofeed.errors import ConfigError

    config, run = (BenchConfig, bench) if command == "bench" else (DoctorConfig, doctor)
    cfg = config(model="yolo11n.yaml", data=str(synth_root / "data.yaml"), imgsz=64, batch=8, out=str(tmp_path / "o"),
                 extra={"device": "cpu", **extra})
    with pytest.raises(ConfigError, match="^" + re.escape(words.format(c=command))):
        run(cfg)
    assert not (tmp_path / "o").exists()


def test_resume_false_is_what_bench_and_doctor_do_anyway():
    from yolofeed.train.keys import refuse_run_folder_keys

    refuse_run_folder_keys({"resume": False, "device": "cpu"}, "yolofeed bench")  # taken: no error
