"""kill -9 of a real `anyrtd serve` at each step of a fire prepared ahead (issue 13, item 2).

- After the batch's commit and before its due time: the run never started; the next start
  discards it, and the `once` fires late, once, with no `interrupted` record (a cron's
  occurrence is a missed one).
- After the due time, the program running: the run is recorded `interrupted` at the next
  start, the `once` stays consumed and never fires again.

The daemon is stopped (SIGSTOP) the moment its mirror shows the prepared run, and killed
if that was before the due time; a moment missed under load is tried again with a new
trigger, not asserted on.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import support
from conftest import DevserverProcess
from control_support import ServeProcess
from support import wait_until

PROGRAMS = (
    '[programs."test:mark@v1"]',
    'argv = ["/bin/sh", "-c", "echo \\"$ANYRTD_TRIGGER_ID\\" >> \\"$FIRED\\""]',
    '[programs."test:long@v1"]',
    'argv = ["/bin/sh", "-c", "echo \\"$ANYRTD_TRIGGER_ID\\" >> \\"$FIRED\\"; exec sleep 60"]',
)
ATTEMPTS = 5


@pytest.fixture
def fired(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "fired"
    monkeypatch.setenv("FIRED", str(path))
    return path


@pytest.fixture
def serve(serve_on: Callable[..., ServeProcess], fired: Path) -> ServeProcess:
    return serve_on(PROGRAMS)


def fires_of(fired: Path, tid: str) -> int:
    return fired.read_text().split().count(tid) if fired.exists() else 0


def mirror_rows(serve: ServeProcess, query: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{serve.state / 'anyrtd.sqlite3'}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute(query, args).fetchall()
    finally:
        conn.close()


def armed(serve: ServeProcess, tid: str) -> bool:
    with serve.http() as client:
        body = client.get(f"/triggers/{tid}").json()
    return bool(body.get("adopted")) and body.get("state") == "scheduled"


def kill_while_prepared(serve: ServeProcess, tid: str, due: float) -> bool:
    """Freeze the daemon the moment its mirror shows the prepared run of `tid`; kill it and
    return True if that was before `due`, else let it go on and return False."""
    assert serve.proc is not None
    query = "SELECT run_id FROM runs WHERE trigger_id = ? AND state = 'prepared'"
    deadline = due + 5
    while time.time() < deadline:
        try:
            found = mirror_rows(serve, query, tid)
        except sqlite3.OperationalError:  # the writer holds the lock a moment
            found = []
        if found:
            serve.proc.send_signal(signal.SIGSTOP)
            if time.time() < due:
                serve.proc.kill()
                serve.proc.wait(timeout=30)
                serve.proc = None
                return True
            serve.proc.send_signal(signal.SIGCONT)
            return False
        time.sleep(0.002)
    raise AssertionError(f"{tid} was never prepared ahead of {due}")


def test_kill_after_the_prepare_and_before_the_due_time_fires_the_once_late_once(
    serve: ServeProcess, devserver: DevserverProcess, fired: Path
) -> None:
    world = support.World(devserver.url)
    for attempt in range(ATTEMPTS):
        tid, at = f"shot-{attempt}", round(time.time() + 4)
        world.put(tid, kind="once", spec={"at": at}, program="test:mark@v1", owner="")
        wait_until(lambda tid=tid: armed(serve, tid), timeout=30, what=f"{tid} armed")
        if kill_while_prepared(serve, tid, at):
            break
        wait_until(lambda tid=tid: fires_of(fired, tid) == 1, timeout=30, what="the missed one")
    else:
        pytest.fail(f"the moment between prepare and due time was missed {ATTEMPTS} times")
    assert fires_of(fired, tid) == 0
    wait_until(lambda: time.time() > at + 0.5, timeout=30, what="the due time to pass")
    assert "lastRunAt" not in world.record(tid)

    serve.start()
    wait_until(lambda: fires_of(fired, tid) == 1, timeout=30, what="the once to fire late")
    done = wait_until(
        lambda: [r for r in support.server_runs(devserver.url, tid) if r.get("endedAt")],
        timeout=30,
        what="its run record",
    )
    assert [(r["scheduledAt"], r["status"]) for r in done] == [(at, "ok")]
    assert done[0]["startedAt"] > at + 0.5  # late, and said so
    wait_until(lambda: world.record(tid).get("lastRunAt"), timeout=30, what="the consumption")
    log = serve.log.read_text()
    assert "and never started (the daemon stopped before its due time): discarded" in log
    assert mirror_rows(serve, "SELECT count(*) FROM runs WHERE status = 'running'") == [(0,)]
    wait_until(lambda: armed(serve, "chat-watch") or True, timeout=5)
    assert fires_of(fired, tid) == 1
    assert len(support.server_runs(devserver.url, tid)) == 1


def test_kill_after_the_due_time_records_the_run_interrupted_and_never_fires_it_again(
    serve: ServeProcess, devserver: DevserverProcess, fired: Path
) -> None:
    world = support.World(devserver.url)
    tid, at = "long-shot", round(time.time() + 3)
    world.put(tid, kind="once", spec={"at": at}, program="test:long@v1", owner="")
    wait_until(lambda: armed(serve, tid), timeout=30, what=f"{tid} armed")
    wait_until(lambda: fires_of(fired, tid) == 1, timeout=30, what="the program to start")
    started = "SELECT run_id FROM runs WHERE trigger_id = ? AND state != 'prepared'"
    wait_until(lambda: mirror_rows(serve, started, tid), timeout=30, what="the start noted")
    assert serve.proc is not None
    serve.proc.kill()
    serve.proc.wait(timeout=30)
    serve.proc = None

    serve.start()
    done = wait_until(
        lambda: [r for r in support.server_runs(devserver.url, tid) if r.get("endedAt")],
        timeout=60,
        what="the interrupted run's record",
    )
    assert [(r["scheduledAt"], r["status"]) for r in done] == [(at, "interrupted")]
    record = wait_until(
        lambda: (r := world.record(tid)).get("lastRunAt") and r, timeout=30, what="consumed"
    )
    assert record.get("enabled") is False
    assert "discarded" not in serve.log.read_text()
    with serve.http() as client:
        assert client.get(f"/triggers/{tid}").json()["state"] != "scheduled"
    assert fires_of(fired, tid) == 1
    assert len(support.server_runs(devserver.url, tid)) == 1


def test_kill_before_the_due_time_of_a_cron_occurrence_makes_it_a_missed_one(
    serve: ServeProcess, devserver: DevserverProcess, fired: Path
) -> None:
    world = support.World(devserver.url)
    for attempt in range(ATTEMPTS):
        tid = f"every-{attempt}"
        world.put(tid, kind="cron", spec={"every_s": 3}, program="test:mark@v1", owner="")
        wait_until(lambda tid=tid: armed(serve, tid), timeout=30, what=f"{tid} armed")
        with serve.http() as client:
            due = float(client.get(f"/triggers/{tid}").json()["nextFire"])
        if kill_while_prepared(serve, tid, due):
            break
        world.put(tid, enabled=False)
    else:
        pytest.fail(f"the moment between prepare and due time was missed {ATTEMPTS} times")
    wait_until(lambda: time.time() > due + 0.5, timeout=30, what="the due time to pass")
    serve.start()
    later = wait_until(
        lambda: [r for r in support.server_runs(devserver.url, tid) if r.get("endedAt")],
        timeout=30,
        what="a later occurrence",
    )
    assert all(r["scheduledAt"] > due for r in later)  # the occurrence at `due` was missed
    assert all(r["status"] == "ok" for r in later)
