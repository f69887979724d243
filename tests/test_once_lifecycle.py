"""The `once` lifecycle at its edges (issue 12, items 4-6): a manual run leaves the shot armed,
a rewrite without `lastRunAt` re-arms it, `edit --at` arms a fired one again; and two small
things of the schedule: the mirror's `scheduled_next` after a restart, the overlap log line.

The lifecycle tests run a real devserver and real `anyrtd serve` and `anyrtd` processes; the
schedule ones the in-process fleet harness (a fake clock) on a real devserver.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import pytest
import support
from conftest import DevserverProcess, anyrtd_command
from control_support import TICK, ServeProcess
from fleet import T0, Node
from support import wait_until

from anyrtd.apply import Apply
from anyrtd.client import Upsert
from anyrtd.metrics import Stats
from anyrtd.model import TriggerDef, parse_record
from anyrtd.reconcile import Adopt, Context, EntryView, Refresh, reconcile
from anyrtd.records import RecordCache
from anyrtd.registry import Entry, Registry, new_row, next_fire
from anyrtd.rows import RunRow
from anyrtd.runs import rollup
from anyrtd.unit import Unit
from anyrtd.vocab import Kind, RunStatus, Verdict

T = TypeVar("T")
MARK = ('[programs."test:mark@v1"]', 'argv = ["/bin/sh", "-c", "echo fired"]')
ROLLUP = ("lastRunAt", "lastStatus", "lastDurationMs", "runCount", "consecutiveFailures")


class World(support.World):
    """The server as a user sees it: write and read trigger records and run records."""

    def unset(self, rid: str, fields: dict[str, Any], unset: list[str]) -> None:
        """A field-level write that also removes fields (`$unset`)."""
        self.call(lambda c, p: c.upsert(p.triggers, [Upsert(rid, fields, unset)]))

    def replace(self, rid: str, record: dict[str, Any]) -> None:
        """Write the whole record (a `$set` of the root), as a user rewriting it would."""
        self.call(lambda c, p: c.replace(p.triggers, rid, record))

    def runs(self, trigger_id: str) -> list[dict[str, Any]]:
        """The trigger's `agent_runs` that have ended, oldest first."""
        runs = self.call(lambda c, p: c.query_all(p.runs, filter={"triggerId": trigger_id}))
        return sorted((r for r in runs if r.get("endedAt")), key=lambda r: r["startedAt"])

    def fires(self, trigger_id: str) -> list[dict[str, Any]]:
        """The trigger's scheduled runs (not the manual ones), oldest first."""
        return [r for r in self.runs(trigger_id) if r["scheduledAt"] is not None]

    def settled(self, rid: str, fires: int) -> dict[str, Any] | None:
        """Return the record once the trigger has fired `fires` times and the rollup of the
        last one is written (consumed: `lastRunAt` set, disabled), else None."""
        done = self.fires(rid)
        record = self.record(rid)
        if len(done) != fires or record.get("lastRunRef") != done[-1]["runId"]:
            return None
        return record if record.get("lastRunAt") and record.get("enabled") is False else None


@pytest.fixture
def world(devserver: DevserverProcess) -> World:
    """The shared `world`, with the waits of this module."""
    return World(devserver.url)


@pytest.fixture
def serve(serve_on: Callable[..., ServeProcess]) -> ServeProcess:
    return serve_on(MARK)


def anyrtd(serve: ServeProcess, *args: str) -> str:
    """Run the `anyrtd` command against the test's daemon and server; return its stdout."""
    env = {
        **os.environ,
        "ANYRTD_CONFIG": str(serve.config),
        "ANYRTD_SERVER": serve.server_url,
        "ANYRTD_LISTEN": serve.listen,
        "ANYRTD_STATE_DIR": str(serve.state),
    }
    done = subprocess.run(
        [*anyrtd_command(), *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    return done.stdout


def view(serve: ServeProcess, rid: str) -> dict[str, Any]:
    with serve.http() as client:
        resp = client.get(f"/triggers/{rid}")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def wait_state(serve: ServeProcess, rid: str, state: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        body = view(serve, rid)
        return body if body["adopted"] and body["state"] == state else None

    return wait_until(check, timeout=30, what=f"{rid} {state} on anyrtd serve")


def wait_ticks(serve: ServeProcess, n: int) -> None:
    """Wait until the daemon has run `n` more ticks."""

    def last_tick() -> float:
        with serve.http() as client:
            at: float = client.get("/healthz").json()["lastTickAt"]
        return at

    start = last_tick()
    wait_until(lambda: last_tick() >= start + n * TICK, timeout=30, what=f"{n} more ticks")


# --- item 4: a manual run does not consume a pending once ------------------------------------


def test_a_manual_run_of_a_pending_once_leaves_it_to_fire_at_its_at_after_a_restart(
    world: World, serve: ServeProcess
) -> None:
    at = round(time.time() + 15)
    world.put("dentist", kind="once", spec={"at": at}, program="test:mark@v1", owner="")
    assert wait_state(serve, "dentist", "scheduled")["nextFire"] == at
    out = anyrtd(serve, "triggers", "run", "dentist")
    wait_until(lambda: len(world.runs("dentist")) == 1, timeout=30, what="the manual run")
    [manual] = world.runs("dentist")
    assert f"started run {manual['runId']} of dentist" in out
    assert manual["scheduledAt"] is None and manual["status"] == "ok"
    # The rollup is written, all but the field that means "consumed".
    record = wait_until(
        lambda: (r := world.record("dentist")).get("runCount") == 1 and r,
        timeout=30,
        what="the rollup of the manual run",
    )
    assert record["lastStatus"] == "ok" and record["lastRunRef"] == manual["runId"]
    assert "lastRunAt" not in record and record.get("enabled", True) is True
    # A restart rebuilds the entry from the record: the shot is still armed at `at`.
    serve.stop()
    serve.start()
    fired = wait_until(lambda: world.fires("dentist"), timeout=60, what="the fire at `at`")
    assert [r["scheduledAt"] for r in fired] == [at]
    record = wait_until(lambda: world.settled("dentist", 1), timeout=30, what="the consumed once")
    assert record["lastRunAt"] >= at
    wait_ticks(serve, 5)
    assert len(world.runs("dentist")) == 2


def test_post_run_of_a_pending_once_does_not_consume_it(world: World, serve: ServeProcess) -> None:
    at = round(time.time() + 3600)
    world.put("later", kind="once", spec={"at": at}, program="test:mark@v1", owner="")
    wait_state(serve, "later", "scheduled")
    with serve.http() as client:
        assert client.post("/triggers/later/run").status_code == 202
    wait_until(
        lambda: world.record("later").get("runCount") == 1, timeout=30, what="the manual run"
    )
    assert "lastRunAt" not in world.record("later")
    serve.stop()
    serve.start()
    body = wait_state(serve, "later", "scheduled")
    assert body["nextFire"] == at and body["lastRunAt"] is None and body["runCount"] == 1


# --- item 5: a rewrite without lastRunAt re-arms the shot --------------------------------------


def test_a_once_written_again_without_last_run_at_fires_again_also_across_restarts(
    world: World, serve: ServeProcess
) -> None:
    at = round(time.time() - 5)
    definition = {
        "name": "Tea",
        "kind": "once",
        "spec": {"at": at},
        "program": "test:mark@v1",
        "enabled": True,
    }
    world.replace("tea", {**definition, "owner": ""})
    record = wait_until(lambda: world.settled("tea", 1), timeout=30, what="the first fire")
    owner = record["owner"]
    assert owner and len(world.fires("tea")) == 1

    # The same record written again, `at` unchanged: it fires once more.
    world.replace("tea", {**definition, "owner": owner})
    wait_until(lambda: world.settled("tea", 2), timeout=30, what="the rewrite's fire")
    # `$unset lastRunAt` with `enabled: true`: once more.
    world.unset("tea", {"enabled": True}, ["lastRunAt"])
    wait_until(lambda: world.settled("tea", 3), timeout=30, what="the unset's fire")

    # Rewritten while the daemon is stopped: the restart fires it, once.
    serve.stop()
    world.replace("tea", {**definition, "owner": owner})
    serve.start()
    wait_until(lambda: world.settled("tea", 4), timeout=30, what="the fire after the restart")
    # A restart alone does not: the record says it has run.
    serve.stop()
    serve.start()
    wait_ticks(serve, 10)
    assert [r["scheduledAt"] for r in world.fires("tea")] == [at] * 4
    assert view(serve, "tea")["state"] == "consumed"


def _once(rid: str, **fields: Any) -> TriggerDef:
    record = {"id": rid, "kind": "once", "spec": {"at": T0 - 60}, "program": "a:b@v1"}
    parsed = parse_record({**record, "owner": "me", "enabled": True, **fields})
    assert isinstance(parsed, TriggerDef)
    return parsed


def test_every_device_reads_a_once_s_consumed_state_off_its_record() -> None:
    """The device that fired a once and one adopting its record decide alike."""
    ctx = Context(peer_id="me", active=True, now=T0)
    fired = _once("t", lastRunAt=T0 - 30, enabled=False)
    holder = new_row(fired, T0 - 30, claimed=False)
    assert holder.consumed
    view = EntryView(holder.fingerprint, holder.enabled, holder.marker, None, holder.consumed)
    for record, armed in ((_once("t"), True), (fired, False)):
        plan = reconcile(["t"], {"t": record}, {"t": view}, ctx)
        rebuilt = any(isinstance(a, Refresh) for a in plan)
        assert rebuilt is armed, plan
        [fresh] = reconcile(["t"], {"t": record}, {}, ctx)
        assert isinstance(fresh, Adopt)
        entry = Entry(record, new_row(record, T0, claimed=False))
        assert (next_fire(entry, T0) is not None) is armed


# --- item 6: `triggers edit --at` arms a fired once again --------------------------------------


def test_edit_at_on_a_fired_once_arms_it_again(world: World, serve: ServeProcess) -> None:
    first = round(time.time() - 5)
    world.put("call", kind="once", spec={"at": first}, program="test:mark@v1", owner="")
    wait_until(lambda: world.settled("call", 1), timeout=30, what="the first fire")
    second = round(time.time() + 2)
    out = anyrtd(serve, "triggers", "edit", "call", "--at", str(second), "--yes")
    assert "-lastRunAt" in out and "enabled" in out
    record = world.record("call")
    assert record["enabled"] is True and "lastRunAt" not in record
    wait_until(lambda: world.settled("call", 2), timeout=30, what="the fire at the new `at`")
    # The control API's PATCH of a new `at` does the same.
    third = round(time.time() + 2)
    with serve.http() as client:
        resp = client.patch("/triggers/call", json={"spec": {"at": third}})
    assert resp.status_code == 200, resp.text
    wait_until(lambda: world.settled("call", 3), timeout=30, what="the fire after the PATCH")
    # And so does `triggers apply` of a file with a new `at` (and no `enabled`).
    fourth = round(time.time() + 2)
    plan = serve.tmp / "call.json"
    once = {"id": "call", "kind": "once", "spec": {"at": fourth}, "program": "test:mark@v1"}
    plan.write_text(json.dumps([once]))
    anyrtd(serve, "triggers", "apply", "-f", str(plan), "--yes")
    wait_until(lambda: world.settled("call", 4), timeout=30, what="the fire after the apply")
    assert [r["scheduledAt"] for r in world.fires("call")] == [first, second, third, fourth]


def test_edit_at_that_sets_enabled_false_leaves_a_fired_once_off(
    world: World, serve: ServeProcess
) -> None:
    world.put("off", kind="once", spec={"at": time.time() - 5}, program="test:mark@v1", owner="")
    wait_until(lambda: world.settled("off", 1), timeout=30, what="the first fire")
    anyrtd(serve, "triggers", "edit", "off", "--at", "+1h", "--set", "enabled=false", "--yes")
    record = world.record("off")
    assert record["enabled"] is False and "lastRunAt" not in record


# --- item 12: the schedule's small ones --------------------------------------------------------


def scheduled_next(node: Node, rid: str) -> float | None:
    with sqlite3.connect(f"file:{node.config.mirror_path}?mode=ro", uri=True) as db:
        row = db.execute("SELECT next_fire FROM scheduled_next WHERE trigger_id = ?", (rid,))
        found = row.fetchone()
    return None if found is None else float(found[0])


async def test_scheduled_next_skips_occurrences_missed_while_stopped(h: Node) -> None:
    await h.put("t", owner=h.me, kind="cron", spec={"cron": "*/10 * * * *"}, program="test:ok@v1")
    await h.step(1)
    assert scheduled_next(h, "t") == T0 + 600
    await h.stop()
    h.clock.advance(1500)  # 08:25: the 08:10 and 08:20 occurrences were missed
    await h.restart()
    assert scheduled_next(h, "t") == T0 + 1800


async def test_the_overlap_skip_line_prints_an_iso_time_with_its_zone(
    h: Node, caplog: pytest.LogCaptureFixture
) -> None:
    await h.put("slow", owner=h.me, kind="cron", spec={"cron": "* * * * *"}, program="test:ok@v1")
    await h.step(1)
    h.programs.release.clear()
    h.clock.advance(60)
    assert len(await h.daemon.fire_due(h.clock.now())) == 1
    h.clock.advance(60)
    with caplog.at_level(logging.INFO, logger="anyrtd"):
        assert await h.daemon.fire_due(h.clock.now()) == []
    h.programs.release.set()
    await h.settle()
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped")]
    stamp = re.search(r"skipped slow at (\S+):", line)
    assert stamp is not None, line
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", stamp.group(1))
    assert abs(_epoch(stamp.group(1)) - (T0 + 120)) < 1


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_restart_holds_a_consumption_the_server_took_but_did_not_show_back() -> None:
    """A crash after the outbox sent a once's consumption and before the record came back
    leaves the mirror a record without `lastRunAt`: that is not a rewrite, and no re-arm."""
    records = RecordCache()
    stale = {
        "id": "t",
        "_v": 3,
        "kind": "once",
        "spec": {"at": T0 - 60},
        "program": "a:b@v1",
        "owner": "me",
        "enabled": True,
    }
    records.load(json.dumps(stale))
    parsed = records.parsed["t"]
    assert isinstance(parsed, TriggerDef)
    row = new_row(parsed, T0 - 60, claimed=False)
    row.consumed, row.enabled = True, False
    registry = Registry()
    unit = Unit(records, on_outbox=lambda: None)
    stage = Apply(registry=registry, records=records, unit=unit, stats=Stats(), confirm_after=0)
    stage.restore([row], T0)

    def armed() -> float | None:
        stage.reconcile(["t"], T0, Verdict.ACTIVE, "me")
        entry = registry.get("t")
        assert entry is not None
        assert entry.row.consumed is (entry.row.next_fire is None)
        return entry.row.next_fire

    assert armed() is None
    # The server shows the consumption back: still consumed, now as the server says.
    records.put({**stale, "_v": 4, "enabled": False, "lastRunAt": T0 - 59})
    assert armed() is None
    assert records.parsed["t"].rollup.last_run_at == T0 - 59  # type: ignore[union-attr]
    # A rewrite after that, without lastRunAt, re-arms the shot.
    records.put({**stale, "_v": 5})
    assert armed() == T0 - 60


def test_the_rollup_of_a_once_never_writes_last_run_at() -> None:
    """A once's `lastRunAt` is written when it fires, not by a run's rollup: a manual run
    leaves a pending shot armed, and a run ending after a new `at` leaves the new shot."""
    for kind, scheduled, written in (
        (Kind.ONCE, None, False),
        (Kind.ONCE, T0, False),
        (Kind.CRON, None, True),
        (Kind.CRON, T0, True),
    ):
        row = RunRow(
            run_id="r", trigger_id="t", program="a:b@v1", device="me",
            scheduled_at=scheduled, started_at=T0 + 1,
        )  # fmt: skip
        row.status, row.duration_ms = RunStatus.OK, 5
        write = rollup(row, failures=0, run_count=0, limit=3, armed=True, kind=kind)
        assert ("lastRunAt" in write.fields) is written, (kind, scheduled)
        assert write.fields["runCount"] == 1 and write.fields["lastRunRef"] == "r"
