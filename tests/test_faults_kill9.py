"""The fault suite's kill -9 sweep (bench/faults/killnine.py), three rounds (500 in the long
mode): `anyrtd serve` SIGKILLed at random moments loses no run record, fires no occurrence
twice, runs every `once` exactly once, leaves a sound mirror and no process of an
interrupted run."""

from __future__ import annotations

import sys
from pathlib import Path

# `bench` is a folder of the repository, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults.suite import run_family


def test_kill_9_at_random_moments_loses_nothing_and_fires_nothing_twice(tmp_path: Path) -> None:
    result = run_family("kill9", tmp_path, rounds=3)
    assert result.error is None, result.report()
    assert result.ok, result.report()  # the never-started once included (fault D, fixed)
    assert sum(result.figures["exits"].values()) == 3  # killed, or exited by itself
