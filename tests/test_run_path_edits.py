"""Edits of a trigger while it runs or between its fires, on a real `anyrtd serve` (issue 23,
items 1 and 14)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import pytest
from control_support import ServeProcess
from support import World, wait_until

pytestmark = pytest.mark.process

PY = sys.executable
SLEEPY = (
    '[programs."test:sleepy@v1"]',
    f'argv = ["{PY}", "-c", "import time; time.sleep(1.5)"]',
    '[programs."test:quick@v1"]',
    f'argv = ["{PY}", "-c", "pass"]',
)


@pytest.fixture
def served(serve_on: Callable[..., ServeProcess]) -> ServeProcess:
    return serve_on(SLEEPY)


def test_a_cron_edited_while_it_runs_fires_again_after_that_run(
    served: ServeProcess, world: World
) -> None:
    world.put(
        "x",
        name="x",
        kind="cron",
        spec={"every_s": 2},
        program="test:sleepy@v1",
        owner="",
        enabled=True,
    )
    wait_until(lambda: served.trigger("x")["running"] == 1, timeout=30, what="a run of x")
    world.put("x", name="x edited")  # a refresh rebuilds the entry while the run is in flight
    wait_until(lambda: served.trigger("x")["name"] == "x edited", timeout=20, what="the edit")
    edited_runs = {r["runId"] for r in served.runs("x")}

    def a_later_run_ended() -> bool:
        later = [r for r in served.runs("x") if r["runId"] not in edited_runs]
        return any(r["status"] == "ok" for r in later)

    wait_until(a_later_run_ended, timeout=30, what="a run of x started after the edit")
    wait_until(lambda: served.trigger("x")["running"] in (0, 1), timeout=5, what="x's count")


def test_an_every_s_trigger_edited_more_often_than_its_period_still_fires(
    served: ServeProcess, world: World
) -> None:
    world.put(
        "pulse",
        name="pulse",
        kind="cron",
        spec={"every_s": 3},
        program="test:quick@v1",
        owner="",
        enabled=True,
    )
    wait_until(lambda: served.trigger("pulse")["nextFire"], timeout=30, what="pulse armed")
    first = served.trigger("pulse")["nextFire"]
    # Edits about 1 s apart for two periods, none of them of the schedule: each rebuilds the
    # entry, and none may push the next fire out again.
    n = 0
    while time.time() < first + 3.5:
        version = served.trigger("pulse")["version"]
        world.put("pulse", args={"n": n})
        n += 1
        wait_until(
            lambda v=version: served.trigger("pulse")["version"] != v, timeout=10, what="an edit"
        )
        pause_until = time.time() + 1.0
        wait_until(lambda t=pause_until: time.time() >= t, timeout=5, what="the next edit's time")
    assert n >= 3
    fired = served.runs("pulse")
    assert fired, "pulse never fired while it was edited more often than its period"
    assert min(r["scheduledAt"] for r in fired) == pytest.approx(first, abs=0.01)
