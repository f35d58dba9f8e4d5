"""The profiling engine (measure/): a profile's warm-up, its first epoch, its steps, and DDP ranks."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys

import pytest

from yolofeed.measure.result import Profile


def test_warm_up_covers_the_batches_a_torch_loader_queues_before_the_first_step():
    """Ultralytics' workers fill workers x prefetch_factor batches while the trainer sets up; steps served from
    that queue say nothing of the loader, so the profile's warm-up must be at least that long."""
    import torch

    from yolofeed.measure.profile import queued_batches

    data = list(range(64))
    assert queued_batches(torch.utils.data.DataLoader(data, batch_size=4, num_workers=3, prefetch_factor=4)) == 12
    assert queued_batches(torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)) == 4  # torch's default: 2
    assert queued_batches(torch.utils.data.DataLoader(data, batch_size=4)) == 0  # no workers: nothing runs ahead

    class OwnLoader:  # yolofeed's loader: its lookahead is a batch or two, whatever it calls its threads
        num_workers, prefetch_factor = 16, 4

    assert queued_batches(OwnLoader()) == 0



@pytest.mark.slow
def test_profile_trains_on_to_the_end_of_the_first_epoch_and_measures_only_its_steps(synth_root, tmp_path):
    """first_epoch=True: steps that end inside the first epoch (12 steps of 2 here) train on to its end; the rate
    windows stay the requested steps, the progress bar grows to the epoch, and the epoch's rate is its images over
    its wall time."""
    from yolofeed.measure.profile import profile
    from yolofeed.measure.progress import Progress
    from yolofeed.ultralytics_seam import DetectionTrainer

    args = {"model": "yolo11n.yaml", "data": str(synth_root / "data.yaml"), "imgsz": 32, "batch": 2, "device": "cpu",
            "project": str(tmp_path), "workers": 0}
    bar = Progress(["stock"], steps=2, warmup=1, file=io.StringIO())
    p = profile("stock", DetectionTrainer, args, steps=2, warmup=1, window=1, progress=bar, first_epoch=True)
    assert p.steps == 2 and len(p.timeline["step_t"]) == 2 and len(p.windows) == 2
    assert bar.bar.total == bar.bar.n == 12  # the epoch's end ends the profile: the bar ends on its total
    # the rate comes from the unrounded seconds, the seconds are kept to 0.01 s (1 % and more of a short epoch)
    assert p.first_epoch_s > 0
    assert 24 / (p.first_epoch_s + 0.005) - 0.05 <= p.first_epoch_images_per_s <= 24 / (p.first_epoch_s - 0.005) + 0.05
    assert 0 < p.first_step_s
    assert len(p.first_epoch_step_ms) == 12 - 1 and all(ms > 0 for ms in p.first_epoch_step_ms)  # all but the 1st
    short = profile("stock", DetectionTrainer, args, steps=2, warmup=1, window=1)  # the default: no epoch's end
    assert short.first_epoch_s is None and short.first_epoch_images_per_s is None and short.first_step_s > 0


def test_a_first_epoch_cut_short_reports_the_measured_steps_without_first_epoch_figures(synth_root, tmp_path):
    """A time= limit that ends the first epoch after the measured steps: the steps are reported, and no first-epoch
    rate is made from part of an epoch."""
    from yolofeed.measure.profile import profile
    from yolofeed.ultralytics_seam import DetectionTrainer

    class TimesOut(DetectionTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback("on_train_batch_end", self.expire)
            self.seen = 0

        @staticmethod
        def expire(trainer):  # after 6 of the epoch's 12 steps, time= has run out (Ultralytics checks every step)
            trainer.seen += 1
            if trainer.seen == 6:
                trainer.train_time_start = -1e12

    args = {"model": "yolo11n.yaml", "data": str(synth_root / "data.yaml"), "imgsz": 32, "batch": 2, "device": "cpu",
            "project": str(tmp_path), "workers": 0, "time": 1.0, "nbs": 2}  # nbs=batch: time= is checked every step
    p = profile("stock", TimesOut, args, steps=2, warmup=1, window=1, first_epoch=True)
    assert p.steps == 2 and p.images_per_s > 0
    assert p.first_epoch_s is None and p.first_epoch_images_per_s is None and p.first_epoch_step_ms == []


@pytest.mark.slow
def test_profile_keeps_every_step_past_the_step_clocks_default(synth_root, tmp_path):
    """The step clock keeps its last 200 steps by default; a profile of more (warm-up + steps) must keep them
    all, or its rates, breakdown and timeline would start from the wrong step."""
    from yolofeed.measure.profile import profile
    from yolofeed.ultralytics_seam import DetectionTrainer

    args = {"model": "yolo11n.yaml", "data": str(synth_root / "data.yaml"), "imgsz": 32, "batch": 2, "device": "cpu",
            "project": str(tmp_path)}
    p = profile("stock", DetectionTrainer, args, steps=205, warmup=3, window=41)
    assert p.steps == 205 and len(p.timeline["step_t"]) == 205 and p.warmup == 3
    assert p.timeline["step_t"][0] > 0  # the first measured step ends after the clock starts


def _rank_profile(device: str, rate: float, first: float | None, util: float) -> Profile:
    base = dict(mode="yolofeed", device=device, images_per_s=rate, step_ms=1000 * 64 / rate, data_wait_fraction=0.02,
                windows=[rate, rate], steps=20, warmup=5, phases_ms={}, gpu_util=util, gpu_clock_mhz=1980.0,
                gpu_power_w=400.0, cpu_cores_busy=3.0, own_cores_busy=1.4, iowait=0.0, disk_read_mb_s=0.0,
                cores=32, gpu_mem_peak_gb=20.0, batch=64, workers=0, n_train=10_000, n_val=500,
                mean_step_ms=1000 * 64 / rate, first_step_s=5.0, first_epoch_s=first)
    return Profile(**base)


def test_ddp_ranks_combine_into_one_profile_and_keep_each_gpu():
    from yolofeed.measure.ranks import combine_ranks

    out = combine_ranks([_rank_profile("cuda:0", 800.0, 7.0, 90.0), _rank_profile("cuda:1", 760.0, 7.5, 86.0)])
    assert out.images_per_s == 1560.0 and out.step_ms == pytest.approx(1000 * 64 / 760)  # the slower rank's steps
    assert out.windows == [1560.0, 1560.0] and out.batch == 128 and out.device == "cuda:0,cuda:1"
    assert out.gpu_util == 88.0 and out.own_cores_busy == 2.8 and out.cpu_cores_busy == 3.0  # rank 0 sees the host
    assert out.first_epoch_s == 7.5 and out.first_epoch_images_per_s == round(10_000 / 7.5, 1)
    assert [r["images_per_s"] for r in out.ranks] == [800.0, 760.0] and out.ranks[1]["gpu_util"] == 86.0
    unfinished = combine_ranks([_rank_profile("cuda:0", 800.0, None, 90.0), _rank_profile("cuda:1", 760, 7.5, 86)])
    assert unfinished.first_epoch_s is None and unfinished.first_epoch_images_per_s is None


@pytest.mark.slow
def test_a_ddp_launch_profiles_in_its_ranks_and_hands_their_profiles_back(synth_root, tmp_path):
    """Ultralytics' DDP launch emulated on the CPU: the trainer's callbacks go through cloudpickle into a child
    process, which trains as a rank of a one-process gloo group; the profile's callbacks there report to the
    launcher through the run folder and leave with status 0; the launcher reads and combines the report."""
    cloudpickle = pytest.importorskip("cloudpickle")
    from yolofeed.measure.profile import profile
    from yolofeed.measure.ranks import RANKS_REPORT
    from yolofeed.ultralytics_seam import DetectionTrainer

    class Launcher(DetectionTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.ddp = True  # as with device=0,1: train() launches ranks and trains nothing here

        def train(self):
            blob = tmp_path / "ddp.pkl"
            blob.write_bytes(cloudpickle.dumps({"args": vars(self.args), "callbacks": self.callbacks}))
            rank = ("import os, cloudpickle, torch.distributed as dist\n"
                    "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'])\n"
                    "dist.init_process_group('gloo', rank=0, world_size=1)\n"
                    "from ultralytics.models.yolo.detect import DetectionTrainer\n"
                    f"state = cloudpickle.loads(open({str(blob)!r}, 'rb').read())\n"
                    "DetectionTrainer(overrides=state['args'], _callbacks=state['callbacks']).train()\n"
                    "raise SystemExit('the rank trained to the end: the profile never stopped it')\n")
            env = os.environ | {"PORT": str(_free_port()), "YOLO_OFFLINE": "1"}
            subprocess.run([sys.executable, "-c", rank], check=True, env=env, timeout=300)

    args = {"model": "yolo11n.yaml", "data": str(synth_root / "data.yaml"), "imgsz": 32, "batch": 4, "device": "cpu",
            "project": str(tmp_path), "workers": 0}
    p = profile("stock", Launcher, args, steps=2, warmup=1, window=1, first_epoch=True)
    assert p.steps == 2 and p.images_per_s > 0 and len(p.ranks) == 1 and p.ranks[0]["device"] == "cpu"
    assert p.first_epoch_s > 0 and p.first_step_s > 0 and p.n_train == 24
    assert (tmp_path / "stock" / RANKS_REPORT).is_file()


def _free_port() -> int:

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
