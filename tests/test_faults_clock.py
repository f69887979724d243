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
    # again (a figure, not a check). No occurrence runs twice in a row.
    assert result.ok, result.report()


@pytest.mark.parametrize(
    ("noted", "count"),
    [
        pytest.param([("a", "10"), ("a", "20"), ("a", "10")], 0, id="again, not in a row"),
        pytest.param([("a", "10"), ("a", "10")], 1, id="the last one fired, again"),
        pytest.param([("a", "10"), ("b", "10"), ("a", "10")], 1, id="per trigger"),
        # A step back: the run of 30 started under the earlier clock sorts by its wall-clock
        # start between the two runs of 40, but started after them.
        pytest.param([("a", "30"), ("a", "40"), ("a", "30")], 0, id="in the order noted"),
    ],
)
def test_twice_in_a_row_is_counted_per_trigger_in_the_order_started(
    noted: list[tuple[str, str]], count: int
) -> None:
    runs = {f"run-{n}": (tid, at) for n, (tid, at) in enumerate(noted)}
    assert clock.twice_in_a_row(runs) == count
