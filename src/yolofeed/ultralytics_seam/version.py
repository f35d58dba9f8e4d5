"""Which Ultralytics is installed, and whether yolofeed serves it: the releases its copies and pins were written for
(``TESTED``, ``SUPPORTED``), the check that runs when the seam is imported (``check_version``), and ``since``, the
seam's only test of a release. The other modules of the seam import from here."""

from __future__ import annotations

import os
import warnings

import ultralytics

from yolofeed.errors import UltralyticsVersionError
from yolofeed.ultralytics_seam.pins import Release
from yolofeed.ultralytics_seam.pins import release as parse_version

TESTED = "8.4.190"  # the Ultralytics the copies below were taken from, and the one `make test` runs
# [lowest, first unsupported): every 8.4 release of the three months to TESTED. Each method in
# COPIED and RELIED_ON reads in each of these releases as in TESTED or as one of its `others`, reviewed one by one:
# most differ where yolofeed does not look; where yolofeed's behaviour must differ, the seam chooses by release
# (`since`): the label rules (LABEL_RULES), the assigner's overlaps (pair_overlaps, 8.4.180), Ultralytics' own MuSGD
# under 8.4.138 (copy_serves), no multi-GPU under 8.4.138-139 (check_ddp). Each holds every attribute of REQUIRED and
# TRAINER_STATE. Below 8.4.138 nothing was reviewed, and a release after TESTED is refused until its sources are
# checked. `make test-releases` runs the seam tests and a training under the oldest, a middle and the newest of them.
SUPPORTED = ((8, 4, 138), (8, 4, 191))
RANGE = f"{'.'.join(map(str, SUPPORTED[0]))} to {TESTED}"  # for messages: "8.4.138 to 8.4.190"
REQUIREMENT = f"ultralytics>={'.'.join(map(str, SUPPORTED[0]))},<{'.'.join(map(str, SUPPORTED[1]))}"  # pyproject's
FIX = f"pip install ultralytics=={TESTED}"
UNTESTED_ENV = "YOLOFEED_UNTESTED_ULTRALYTICS"  # "1": another version only warns (for trying a new release)


def check_version(installed: str, allow_untested: bool = False) -> None:
    """Raise unless ``installed`` lies in ``SUPPORTED`` (only warn with ``allow_untested``).

    Raises:
        UltralyticsVersionError: one line: the installed version, the range that works, the fix.
    """
    low, high = SUPPORTED
    if low <= parse_version(installed) < high:
        return
    message = (f"Ultralytics {installed} is installed, but yolofeed works with Ultralytics {RANGE} only (it "
               f"overrides and copies parts of their trainer and loss): {FIX}")
    if not allow_untested:
        raise UltralyticsVersionError(message)
    warnings.warn(f"{message}. {UNTESTED_ENV}=1 is set: going on with an untested Ultralytics", stacklevel=2)


check_version(ultralytics.__version__, allow_untested=os.environ.get(UNTESTED_ENV) == "1")

VERSION: str = ultralytics.__version__
RELEASE: Release = parse_version(VERSION)


def since(first: str) -> bool:
    """Whether the installed Ultralytics is ``first`` or later (the seam's only test of a release: each use names
    what changed there)."""
    return RELEASE >= parse_version(first)
