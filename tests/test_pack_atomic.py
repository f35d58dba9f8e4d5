"""A pack build killed at any moment leaves nothing a reader accepts, and the next run recovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from yolofeed import synth
from yolofeed.config import SynthConfig
from yolofeed.errors import PackError
from yolofeed.pack import Pack, open_or_build
from yolofeed.pack.build import store_dir


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("killme")
    synth.run(SynthConfig(out=str(root), n_train=240, n_val=0, imgsz=320, seed=1, workers=2))
    return root


def _start(yaml_file: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "yolofeed", "pack", f"data={yaml_file}", "imgsz=320", "splits=train",
           "workers=1", "rebuild=always"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _kill_after(proc: subprocess.Popen, folder: Path, delay: float, timeout: float = 120) -> bool:
    """SIGKILL the build ``delay`` seconds after its temporary file appears; False if it was gone first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        if any(folder.glob(".train.yfpack.tmp-*")):
            time.sleep(delay)
            alive = proc.poll() is None
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return alive
        time.sleep(0.0005)
    proc.kill()
    proc.wait()
    return False


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.6, 0.9])
def test_killed_build_is_never_accepted(big, fraction):
    yaml_file = big / "data.yaml"
    folder = store_dir(yaml_file, 320, "raw")
    t0 = time.perf_counter()
    ref = open_or_build(yaml_file, "train", 320, rebuild="always", progress=False, workers=1)
    seconds = time.perf_counter() - t0  # what the subprocess's build will take, start-up aside
    ref_images = [ref.image(i).copy() for i in (0, len(ref) // 2, len(ref) - 1)]
    ref.path.unlink()

    killed = _kill_after(_start(yaml_file), folder, fraction * seconds)
    final = folder / "train.yfpack"
    if fraction <= 0.3:  # later moments may land after the build on a fast run: either outcome is checked below
        assert killed and not final.exists(), "the build finished before it could be killed"
    if final.exists():  # killed after publishing: then it must be the whole pack
        assert len(Pack.open(final)) == len(ref)
        final.unlink()
    for f in folder.glob(".train.yfpack.tmp-*"):  # even opened by name, a temp file is refused unless it is whole
        try:  # (killed between writing the trailer and the rename, it is a finished pack under a temp name)
            whole = Pack.open(f)
        except PackError:
            continue
        assert len(whole) == len(ref)
        np.testing.assert_array_equal(whole.image(len(ref) - 1), ref_images[-1])
    with pytest.raises(PackError, match="does not exist"):
        open_or_build(yaml_file, "train", 320, rebuild="never")

    # the next run rebuilds, cleans up, and gives the same content
    pack = open_or_build(yaml_file, "train", 320, rebuild="auto", progress=False, workers=2)
    assert not list(folder.glob(".train.yfpack.tmp-*"))
    assert len(pack) == len(ref)
    for k, i in enumerate((0, len(ref) // 2, len(ref) - 1)):
        np.testing.assert_array_equal(pack.image(i), ref_images[k])


@pytest.mark.slow
def test_kill_at_random_moments_never_publishes_a_bad_pack(big):
    """Whatever the moment, the published name holds either nothing or a complete, valid pack."""
    yaml_file = big / "data.yaml"
    folder = store_dir(yaml_file, 320, "raw")
    ref = open_or_build(yaml_file, "train", 320, rebuild="auto", progress=False)
    n = len(ref)
    rng = np.random.default_rng(0)
    for delay in rng.uniform(1.0, 4.0, size=3):  # interpreter start-up is ~2 s of this
        (folder / "train.yfpack").unlink(missing_ok=True)
        proc = _start(yaml_file)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        final = folder / "train.yfpack"
        if final.exists():
            assert len(Pack.open(final)) == n
        for f in folder.glob(".train.yfpack.tmp-*"):
            with pytest.raises(PackError):
                Pack.open(f)
    assert len(open_or_build(yaml_file, "train", 320, rebuild="auto", progress=False)) == n
    assert os.listdir(folder)  # sanity: the folder still exists
