"""The fault suite's start-window sweep (bench/faults/startwin.py), four rounds (300 in the
long mode): kill -9 in the milliseconds after a batch of `once` comes due and as their
programs end loses no `once`, runs none twice, and records each ended run as it ended."""

from __future__ import annotations

import sys
from pathlib import Path

# `bench` is a folder of the repository, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults.suite import run_family


def test_kill_9_in_the_start_window_loses_no_once_and_forgets_no_outcome(
    tmp_path: Path,
) -> None:
    result = run_family("startwin", tmp_path, rounds=4)
    assert result.error is None, result.report()
    assert result.ok, result.report()
    assert sum(result.figures["kills"].values()) >= 2
