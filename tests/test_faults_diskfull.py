"""The fault suite's full disk (bench/faults/diskfull.py), two rounds: the state directory's
tmpfs fills just before and inside a `once`'s fire; the `once` still runs exactly once
when the disk has room, nothing stays `running`, and `/healthz` says the disk is full
while a write fails on it.
Needs root (to mount the tmpfs); skipped with the reason otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# `bench` is a folder of the repository, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults import diskfull
from bench.faults.suite import run_family


def test_a_disk_full_at_fire_time_loses_no_once_and_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the fault lands just before the fire is prepared, then while its program runs
    monkeypatch.setattr(diskfull, "SWEEP", (-0.05, 0.3))
    monkeypatch.setattr(diskfull, "SETTLE_S", 15.0)
    result = run_family("diskfull", tmp_path, rounds=2)
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.ok, result.report()
