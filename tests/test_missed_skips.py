"""A cron occurrence the timer comes to more than `MISSED_AFTER_S` late because it was held
up (the daemon stopped) is a missed one; a `once` fires late (issue 23, item 10). On the
stage of tests/test_fire_ahead.py, the hold-up set as the timer measures it on the real
clock (`Timer.held_up`); the SIGSTOP of a real daemon is in tests/test_stall.py."""

from __future__ import annotations

import logging

import pytest
from test_fire_ahead import AT, CRON, ONCE, Stage, stage  # noqa: F401 - the fixture

from anyrtd.firing import MISSED_AFTER_S


async def test_a_prepared_batch_started_after_a_hold_up_skips_the_cron_and_fires_the_once(
    stage: Stage,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    stage.adopt(ONCE, CRON)
    stage.clock.set(AT - 0.5)
    await stage.timer.prepare(AT, stage.clock.now())
    late = MISSED_AFTER_S + 3
    stage.clock.set(AT + late)
    stage.timer.held_up = late + 0.5
    with caplog.at_level(logging.INFO, logger="anyrtd.firing"):
        started = await stage.timer.fire_now(stage.clock.now())
    assert list(stage.runner.started) == ["shot"] and len(started) == 1
    assert stage.entry("tick").row.next_fire == AT + 60  # re-armed forward, not fired late
    await stage.firing.wait_idle()
    await stage.unit.commit(stage.clock.now())
    assert stage.sql("SELECT trigger_id FROM runs") == [("shot",)]
    assert stage.firing.stats.missed_skips == 1
    [line] = [r.getMessage() for r in caplog.records if "missed" in r.getMessage()]
    assert line.startswith("skipped tick at ") and f"missed by {late + 0.0:.1f} s" in line


@pytest.mark.parametrize(
    ("late", "held_up", "fired"),
    [
        (MISSED_AFTER_S + 3, MISSED_AFTER_S + 3, ["shot"]),  # stopped: the cron is missed
        (MISSED_AFTER_S + 30, 0.0, ["shot", "tick"]),  # not held up (a clock step): late
        (MISSED_AFTER_S - 2, MISSED_AFTER_S + 3, ["shot", "tick"]),  # within the tolerance
    ],
)
async def test_what_fires_late_after_the_timer_was_held_up(
    stage: Stage,  # noqa: F811 - the fixture
    late: float,
    held_up: float,
    fired: list[str],
) -> None:
    stage.adopt(ONCE, CRON)
    stage.clock.set(AT + late)
    stage.timer.held_up = held_up
    await stage.timer.fire_now(stage.clock.now())
    assert sorted(stage.runner.started) == fired
    next_fire = stage.entry("tick").row.next_fire
    assert next_fire is not None and next_fire > stage.clock.now()
