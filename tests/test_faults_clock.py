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
    # the second round stops the daemon right after the step back and starts it again
    result = run_steps(tmp_path, monkeypatch, (-7200.0, 0.0), 2, TWO_RECURRING)
    assert result.ok, result.report()


def test_a_thirty_second_step_back_keeps_every_once_single_and_every_trigger_firing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_steps(tmp_path, monkeypatch, (-7200.0, 0.0, -30.0, 0.0), 1, clock.RECURRING)
    # By design (docs/schedule.md, "When the wall clock steps back"): after a step back past
    # the tolerance the occurrences between the new time and the last one fired come round
    # again (a figure). Every other promise holds here; "no occurrence twice in a row" is
    # reported, not asserted: the full suite's run at f21a168 counted 2 (under study,
    # docs/reliability.md).
    held = [c for c in result.checks if c.name != "occurrence fired twice in a row"]
    assert len(held) == len(result.checks) - 1, result.report()
    assert all(c.ok for c in held), result.report()


@pytest.mark.parametrize(
    ("runs", "count"),
    [
        pytest.param([("a", 10, 1), ("a", 20, 2), ("a", 10, 3)], 0, id="again, not in a row"),
        pytest.param([("a", 10, 1), ("a", 10, 2)], 1, id="the last one fired, again"),
        pytest.param([("a", 10, 2), ("b", 10, 1), ("a", 10, 3)], 1, id="per trigger"),
        pytest.param([("a", 20, 2), ("a", 20, 1)], 1, id="in the order they started"),
    ],
)
def test_twice_in_a_row_is_counted_per_trigger_in_start_order(
    runs: list[tuple[str, float, float]], count: int
) -> None:
    records = [{"triggerId": t, "scheduledAt": at, "startedAt": s} for t, at, s in runs]
    assert clock.twice_in_a_row(records) == count
