"""Manual runs ("run now") on a real `anyrtd serve`: what they count toward, and which are
refused because they can only fail (issue 23, items 2 and 3)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from control_support import ServeProcess
from support import World, wait_until

from anyrtd.cli import main
from anyrtd.rows import RunRow
from anyrtd.runs import rollup
from anyrtd.vocab import Kind, LastStatus, RunStatus

pytestmark = pytest.mark.process

PY = sys.executable
PROGRAMS = (
    '[programs."test:fails@v1"]',
    f'argv = ["{PY}", "-c", "raise SystemExit(3)"]',
)


@pytest.fixture
def served(serve_on: Callable[..., ServeProcess]) -> ServeProcess:
    return serve_on(PROGRAMS)


def run_now_to_its_end(served: ServeProcess, rid: str) -> dict[str, Any]:
    with served.http() as c:
        resp = c.post(f"/triggers/{rid}/run")
        assert resp.status_code == 202, resp.text
        run_id = resp.json()["runId"]

        def ended() -> dict[str, Any] | None:
            run: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            return run if run["status"] != RunStatus.RUNNING else None

        return wait_until(ended, timeout=30, what=f"the manual run {run_id} to end")


def test_failing_manual_runs_do_not_disable_a_pending_once(
    served: ServeProcess, world: World
) -> None:
    at = time.time() + 20
    world.put(
        "later",
        name="later",
        kind="once",
        spec={"at": at},
        program="test:fails@v1",
        owner="",
        enabled=True,
    )
    wait_until(lambda: served.trigger("later")["nextFire"] == at, timeout=20, what="later armed")
    for _ in range(3):
        assert run_now_to_its_end(served, "later")["status"] == RunStatus.FAILED
    shown = served.trigger("later")
    assert shown["enabled"] is True and shown["lastStatus"] != LastStatus.AUTO_DISABLED
    assert shown["consecutiveFailures"] == 0 and shown["nextFire"] == at
    assert world.record("later")["enabled"] is True

    def fired() -> list[dict[str, Any]]:
        with served.http() as c:
            runs: list[dict[str, Any]] = c.get("/runs", params={"trigger": "later"}).json()
        return [r for r in runs if r["scheduledAt"] is not None and r["status"] != "running"]

    shot = wait_until(fired, timeout=30, what="the once to fire at its at")
    assert shot[0]["scheduledAt"] == pytest.approx(at, abs=0.01)


def test_a_run_by_hand_that_could_only_fail_is_refused_and_not_offered(
    served: ServeProcess, world: World
) -> None:
    world.put(
        "elsewhere",
        name="elsewhere",
        kind="cron",
        spec={"every_s": 3600},
        program="nobody:missing@v1",
        owner="",
        enabled=True,
    )
    world.put(
        "fine",
        name="fine",
        kind="cron",
        spec={"every_s": 3600},
        program="test:fails@v1",
        owner="",
        enabled=True,
    )
    # chat-watch runs only on a chat message; a standing built-in whose program is not
    # installed here (extraction); a trigger whose program is not installed here.
    refused = ("chat-watch", "extraction", "elsewhere")
    for rid in (*refused, "fine"):
        wait_until(
            lambda rid=rid: (
                served.trigger(rid)["adopted"] and served.trigger(rid)["state"] != "claiming"
            ),
            timeout=30,
            what=f"{rid} adopted",
        )
    assert served.trigger("fine")["runNowRefused"] is None
    with served.http() as c:
        listed = {t["id"]: t for t in c.get("/triggers").json()}
        for rid in refused:
            assert served.trigger(rid)["runNowRefused"], rid
            assert listed[rid]["runNowRefused"] == served.trigger(rid)["runNowRefused"]
            resp = c.post(f"/triggers/{rid}/run")
            assert resp.status_code == 409, (rid, resp.text)
            error = resp.json()["error"]
            assert error["code"] == "cannot_run"
            assert f"trigger {rid!r} cannot be run by hand" in error["message"]
            assert "\n" not in error["message"]
        assert "runs only as the chat-watch record" in served.trigger("chat-watch")["runNowRefused"]
        assert "not installed" in served.trigger("elsewhere")["runNowRefused"]

    env = {
        "ANYRTD_CONFIG": str(served.config),
        "ANYRTD_SERVER": served.server_url,
        "ANYRTD_LISTEN": served.listen,
        "ANYRTD_STATE_DIR": str(served.state),
    }
    result = CliRunner().invoke(main, ["triggers", "run", "chat-watch"], env=env)
    assert result.exit_code == 1, result.output
    assert "cannot be run by hand" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output

    for rid in refused:
        assert served.trigger(rid)["consecutiveFailures"] == 0
        assert served.trigger(rid)["enabled"] is True
        with served.http() as c:
            assert c.get("/runs", params={"trigger": rid}).json() == [], rid


def row(scheduled_at: float | None, status: RunStatus) -> RunRow:
    return RunRow(
        run_id="r",
        trigger_id="t",
        program="p",
        device="d",
        scheduled_at=scheduled_at,
        started_at=100.0,
        status=status,
        ended_at=101.0,
        duration_ms=1000,
    )


@pytest.mark.parametrize(
    ("kind", "scheduled_at", "status", "failures", "tripped"),
    [
        (Kind.ONCE, None, RunStatus.FAILED, 2, False),  # by hand: not counted
        (Kind.ONCE, None, RunStatus.OK, 2, False),  # by hand: nor reset
        (Kind.ONCE, 100.0, RunStatus.FAILED, 3, True),  # its shot: counted
        (Kind.CRON, None, RunStatus.FAILED, 3, True),  # a cron by hand: counted
        (Kind.CRON, None, RunStatus.OK, 0, False),
        (Kind.EVENT, None, RunStatus.FAILED, 3, True),
    ],
)
def test_what_a_run_counts_toward_by_kind(
    kind: Kind, scheduled_at: float | None, status: RunStatus, failures: int, tripped: bool
) -> None:
    write = rollup(
        row(scheduled_at, status), failures=2, run_count=5, limit=3, armed=True, kind=kind
    )
    assert (write.failures, write.tripped) == (failures, tripped)
    assert write.run_count == 6
