"""The fault suite's clock steps (bench/faults/clock.py): `anyrtd serve` under libfaketime,
its wall clock stepped 2 h back (once across a restart) and forward again, then 30 s back.
Skipped, with the reason, where libfaketime is not installed (Debian: `faketime`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# `bench` is a folder of the repository, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults import clock
from bench.faults.common import Result
from bench.faults.suite import run_family

# each fires within 2 s of a step (cron5 takes up to 5 s)
TWO_RECURRING = {k: v for k, v in clock.RECURRING.items() if k != "cron5"}
NEVER_STARTED = "runs recorded whose program never started"


def run_steps(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    steps: tuple[float, ...],
    rounds: int,
    recurring: dict[str, Any],
) -> Result:
    monkeypatch.setattr(clock, "RECURRING", recurring)
    monkeypatch.setattr(clock, "STEPS", steps)
    result = run_family("clock", tmp_path, rounds=rounds)  # a second round restarts the daemon
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.error is None, result.report()
    return result


def test_two_hour_steps_keep_recurring_triggers_firing_and_fire_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_steps(tmp_path, monkeypatch, (-7200.0, 0.0), 2, TWO_RECURRING)
    assert all(c.ok for c in result.checks if c.name != NEVER_STARTED), result.report()
    if not result.ok:  # the restart right after the step back
        pytest.xfail(
            "found by issue 15's suite (docs/reliability.md, C): a stop just after a step "
            "back leaves prepared runs that never started, closed as interrupted at the next "
            "start: " + "; ".join(result.failures())
        )


@pytest.mark.xfail(
    strict=False,
    reason="found by issue 15's suite (docs/reliability.md, B): after a step back past the "
    "tolerance, an occurrence that already ran can fire again",
)
def test_a_thirty_second_step_back_fires_no_occurrence_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_steps(tmp_path, monkeypatch, (-7200.0, 0.0, -30.0, 0.0), 1, clock.RECURRING)
    assert result.ok, result.report()
