"""A stall is not a catch-up and not a failure, on a real `anyrtd serve` stopped with
SIGSTOP and resumed with SIGCONT (issue 23, item 10)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from control_support import ServeProcess
from support import World, wait_until

from anyrtd.firing import MISSED_AFTER_S
from anyrtd.vocab import RunStatus

pytestmark = pytest.mark.process

PY = sys.executable
PROGRAMS = (
    "run_timeout_s = 3",
    '[programs."test:second@v1"]',
    f'argv = ["{PY}", "-c", "import time; time.sleep(1)"]',
    '[programs."test:quick@v1"]',
    f'argv = ["{PY}", "-c", "pass"]',
)


@pytest.fixture
def served(serve_on: Callable[..., ServeProcess]) -> ServeProcess:
    return serve_on(PROGRAMS)


def stopped_for(served: ServeProcess, seconds: float) -> None:
    """Stop the daemon (SIGSTOP) for `seconds`, then let it go on (SIGCONT)."""
    assert served.proc is not None
    os.kill(served.proc.pid, signal.SIGSTOP)
    try:
        until = time.monotonic() + seconds
        wait_until(lambda: time.monotonic() >= until, timeout=seconds + 5, what="the stop")
    finally:
        os.kill(served.proc.pid, signal.SIGCONT)


def test_a_run_that_ended_while_the_daemon_was_stopped_is_not_past_its_budget(
    served: ServeProcess, world: World
) -> None:
    world.put(
        "job",
        name="job",
        kind="cron",
        spec={"every_s": 3600},
        program="test:second@v1",
        owner="",
        enabled=True,
    )
    wait_until(lambda: served.trigger("job")["state"] == "scheduled", timeout=30, what="job")
    with served.http() as c:
        resp = c.post("/triggers/job/run")
    assert resp.status_code == 202, resp.text
    run_id = resp.json()["runId"]
    wait_until(lambda: served.trigger("job")["running"] == 1, timeout=10, what="the run")
    stopped_for(served, 5.0)  # the program ends meanwhile; the 3 s budget's time passes too

    def ended() -> dict[str, Any] | None:
        with served.http() as c:
            run: dict[str, Any] = c.get(f"/runs/{run_id}").json()
        return run if run["status"] != RunStatus.RUNNING else None

    run = wait_until(ended, timeout=30, what="the run to end")
    assert (run["status"], run["errorType"]) == (RunStatus.OK, None)
    assert served.trigger("job")["consecutiveFailures"] == 0


def test_a_cron_occurrence_passed_while_the_daemon_was_stopped_is_missed_and_a_once_late(
    served: ServeProcess, world: World
) -> None:
    world.put(
        "tick",
        name="tick",
        kind="cron",
        spec={"every_s": 20},
        program="test:quick@v1",
        owner="",
        enabled=True,
    )
    due = wait_until(lambda: served.trigger("tick")["nextFire"], timeout=30, what="tick armed")
    world.put(
        "shot",
        name="shot",
        kind="once",
        spec={"at": due + 1},
        program="test:quick@v1",
        owner="",
        enabled=True,
    )
    wait_until(lambda: served.trigger("shot")["nextFire"], timeout=30, what="shot armed")
    # Stopped before the cron's lead (at most 2 s) and until both are well past due.
    wait_until(lambda: time.time() >= due - 3.0, timeout=20, what="the time to stop")
    assert time.time() < due - 2.0, "too slow to stop the daemon before the cron's lead"
    stopped_for(served, (due + 1 + MISSED_AFTER_S + 2.0) - time.time())

    shot = wait_until(lambda: served.runs("shot"), timeout=20, what="the once to fire late")
    assert shot[0]["scheduledAt"] == pytest.approx(due + 1, abs=0.01)
    wait_until(lambda: served.trigger("tick")["nextFire"] > time.time(), timeout=10, what="re-arm")
    assert [r for r in served.runs("tick") if r["scheduledAt"] == pytest.approx(due)] == []
    log = served.log.read_text(errors="replace")
    assert "skipped tick at" in log and "missed by" in log
