"""The fault suite's hostile programs (bench/faults/hostile.py), 150 of them (10,000 in the
long mode): children left behind, SIGTERM ignored past the budget, megabytes of output, odd
exits, a lone surrogate in the result; every run recorded, no process left, no zombie, no
descriptor gained."""

from __future__ import annotations

import sys
from pathlib import Path

# `bench` is a folder of the repository, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults.suite import run_family


def test_hostile_programs_leave_nothing_behind_and_every_run_is_recorded(
    tmp_path: Path,
) -> None:
    result = run_family("programs", tmp_path, rounds=150)
    assert result.ok, result.report()
    kinds = result.figures["per_kind"]
    assert {"forker", "deaf", "spew", "surrogate", "stopped"} <= set(kinds), kinds
