"""The fault suite's server outage (bench/faults/outage.py), once and short: the devserver
away while `anyrtd serve` is restarted inside the outage (SIGTERM and kill -9), `once`
records due during it; afterwards no run is lost, none recorded twice, every `once` once."""

from __future__ import annotations

import sys
from pathlib import Path

# `bench` is a folder of the repository, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults.suite import run_family


def test_an_outage_with_restarts_inside_it_loses_no_run_and_doubles_none(
    tmp_path: Path,
) -> None:
    result = run_family("outage", tmp_path, rounds=1)
    assert result.ok, result.report()
    assert result.figures["restarts_inside"] == {"SIGTERM": 2, "kill -9": 1}
