"""A profile under Ultralytics' DDP launch: each rank profiles itself, rank 0 gathers the ranks' profiles into the run
folder (``report_and_exit``), and the launching process reads (``read_rank_reports``) and combines them
(``combine_ranks``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from yolofeed.errors import UltralyticsError
from yolofeed.measure.result import Profile
from yolofeed.monitor import efficiency
from yolofeed.ultralytics_seam import FIX, RANGE

RANKS_REPORT = "yolofeed_profile_ranks.json"  # in the run folder: how DDP rank 0 hands the ranks' profiles over


def report_and_exit(own: Profile, trainer: Any, token: str) -> None:
    """In a DDP rank at the profile's last step: gather every rank's profile to rank 0, which writes them to
    ``RANKS_REPORT`` in the run folder with the launcher's ``token``; then every rank leaves with status 0.

    Every rank calls this at the same step (DDP keeps them in step). Leaving by ``os._exit`` skips Ultralytics'
    end of training (validation, saving, plots), which a profile does not want, and which an exception would
    turn into a failed launch.
    """
    dist = torch.distributed
    gathered: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, own.to_dict())
    if dist.get_rank() == 0:
        path = Path(trainer.save_dir) / RANKS_REPORT
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"token": token, "ranks": gathered}))
        os.replace(tmp, path)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def read_rank_reports(save_dir: Any, token: str, mode: str) -> list[Profile]:
    """The ranks' profiles that rank 0 wrote for this launch (``token``), one per GPU.

    Raises:
        UltralyticsError: no report for this launch (the ranks' loop ended before the profile's steps).
    """
    path = Path(save_dir) / RANKS_REPORT
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        report = {}
    if report.get("token") != token or not report.get("ranks"):
        raise UltralyticsError(f"{mode}: the DDP ranks ended their training loop before the profile's steps, so no "
                               f"profile is in {path} (a time= limit, or an Ultralytics outside {RANGE}: {FIX})")
    return [Profile(**r) for r in report["ranks"]]


def combine_ranks(ranks: list[Profile]) -> Profile:
    """One profile for a DDP run: images/s summed over the GPUs, the slowest rank's steps and first epoch.

    The machine's figures (cores busy, iowait, disk, RAM) are rank 0's sampler's, which sees the whole machine; the
    cores of the training processes are summed over the ranks; GPU figures are the ranks' mean, each rank's kept in
    ``ranks``.
    """
    r0 = ranks[0]

    def mean(key: str) -> float | None:
        vals = [getattr(r, key) for r in ranks if getattr(r, key) is not None]
        return round(sum(vals) / len(vals), 2) if vals else None

    firsts = [r.first_epoch_s for r in ranks]
    out = Profile(**r0.to_dict())
    out.images_per_s = round(sum(r.images_per_s for r in ranks), 1)  # each rank steps through its own images
    out.step_ms = max(r.step_ms for r in ranks)
    out.mean_step_ms = max(r.mean_step_ms for r in ranks)
    out.data_wait_fraction = round(sum(r.data_wait_fraction for r in ranks) / len(ranks), 4)
    out.windows = [round(sum(w), 1) for w in zip(*(r.windows for r in ranks))]
    out.gpu_util, out.gpu_clock_mhz, out.gpu_power_w = mean("gpu_util"), mean("gpu_clock_mhz"), mean("gpu_power_w")
    out.gpu_mem_peak_gb = max((r.gpu_mem_peak_gb for r in ranks if r.gpu_mem_peak_gb is not None), default=None)
    out.own_cores_busy = round(sum(r.own_cores_busy for r in ranks), 2)
    out.batch = sum(r.batch for r in ranks)
    out.device = ",".join(r.device for r in ranks)
    out.first_step_s = max((r.first_step_s for r in ranks if r.first_step_s is not None), default=None)
    out.first_epoch_s = None if None in firsts else max(firsts)
    out.first_epoch_images_per_s = None if out.first_epoch_s is None else round(r0.n_train / out.first_epoch_s, 1)
    out.train_tflops, out.mfu = efficiency.achieved(out.images_per_s, r0.forward_gflops, r0.peak_tflops, len(ranks))
    out.ranks = [{"device": r.device, "images_per_s": r.images_per_s, "step_ms": r.step_ms,
                  "data_wait_fraction": r.data_wait_fraction, "gpu_util": r.gpu_util,
                  "own_cores_busy": r.own_cores_busy, "first_epoch_s": r.first_epoch_s} for r in ranks]
    return out
