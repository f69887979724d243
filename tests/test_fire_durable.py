"""A fire whose preparation could not be made durable did not happen (issue 15, item 2).

One piece at a time: the firing stage on a registry, a record cache and a unit of work whose
mirror refuses the commit as SQLite does when the disk is full; the programs are noted by a
stand-in runner. The real full disk is in tests/test_fire_disk_full.py.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import pytest
from support import ReadyByStart
from test_control_port import FakePort

from anyrtd.clock import FakeClock
from anyrtd.control.api import make_app
from anyrtd.events import ChatMessage
from anyrtd.firing import Firing, NotDurable
from anyrtd.metrics import Stats
from anyrtd.missed import Skips
from anyrtd.model import TriggerDef
from anyrtd.program import RunOutcome
from anyrtd.records import RecordCache
from anyrtd.registry import Entry, Registry, new_row
from anyrtd.rows import Batch, RunRow
from anyrtd.timer import Timer
from anyrtd.unit import CommitFailed, Unit
from anyrtd.vocab import RollupField, RunStatus, Verdict

T0 = 1_800_000_000.0
PEER = "peer-a"
ONCE = {"id": "shot", "_v": 1, "name": "shot", "kind": "once", "spec": {"at": T0 - 1}}
CRON = {"id": "tick", "_v": 1, "name": "tick", "kind": "cron", "spec": {"every_s": 60}}
EVENT = {
    "id": "hear",
    "_v": 1,
    "name": "hear",
    "kind": "event",
    "spec": {"dataset": "chat_messages", "objectId": "general"},
}


def full_disk() -> sqlite3.OperationalError:
    """The error SQLite raises on a commit when the disk is full (SQLITE_FULL)."""
    error = sqlite3.OperationalError("database or disk is full")
    error.sqlite_errorcode = 13
    return error


class Mirror:
    """A stand-in for the mirror's worker: notes each committed batch, or fails as a full
    disk does while `full`."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.full = False

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        if self.full:
            raise full_disk()
        return fn(self)

    def commit(self, batch: Batch, now: float) -> None:
        self.batches.append(batch)


class Runner(ReadyByStart):
    """A stand-in runner: notes every run it is asked to start; each ends at once."""

    kill_grace_s = 0.1

    def __init__(self) -> None:
        self.started: list[RunRow] = []

    def start(
        self,
        row: RunRow,
        args: Mapping[str, Any],
        *,
        on_start: Callable[[float], None] | None = None,
        on_spawn: Callable[[int], Awaitable[None]] | None = None,
    ) -> Coroutine[Any, Any, RunOutcome]:
        self.started.append(row)
        if on_start is not None:
            on_start(T0)

        async def ended() -> RunOutcome:
            return RunOutcome(RunStatus.OK, None, None, T0, T0, 0)

        return ended()


class Stage:
    def __init__(self) -> None:
        self.clock = FakeClock(T0)
        self.records = RecordCache()
        self.registry = Registry()
        self.mirror = Mirror()
        self.unit = Unit(self.records, on_outbox=lambda: None)
        self.unit.db = self.mirror  # type: ignore[assignment]
        self.runner = Runner()
        self.stats = Stats()
        self.firing = Firing(
            registry=self.registry,
            records=self.records,
            unit=self.unit,
            runner=self.runner,  # type: ignore[arg-type]
            stats=self.stats,
            clock=self.clock,
            skips=Skips(),
        )
        self.timer = Timer(self.registry, self.firing, self.clock, lambda: (PEER, Verdict.ACTIVE))
        for record in (ONCE, CRON, EVENT):
            self.records.put({**record, "program": "x:y@v1", "owner": PEER, "enabled": True})
            defn = self.records.parsed[str(record["id"])]
            assert isinstance(defn, TriggerDef)
            entry = Entry(defn, new_row(defn, T0 - 120, claimed=False))
            self.registry.put(entry)
            self.registry.arm(entry, T0 - 120)

    def entry(self, tid: str) -> Entry:
        entry = self.registry.get(tid)
        assert entry is not None
        return entry

    def record(self, tid: str) -> TriggerDef:
        defn = self.records.parsed[tid]
        assert isinstance(defn, TriggerDef)
        return defn

    async def fire(self) -> list[str]:
        return await self.timer.fire_now(self.clock.now())


async def test_a_fire_that_cannot_be_committed_leaves_no_trace_and_fires_late_once() -> None:
    stage = Stage()
    cron_due = stage.entry("tick").row.next_fire
    assert cron_due is not None and cron_due <= T0
    stage.unit.meta({"cursor": "7"})  # the step's own writes, pending before the fire
    stage.mirror.full = True

    assert await stage.fire() == []

    # Nothing started, nothing consumed, nothing re-armed, nothing counted.
    assert stage.runner.started == []
    once = stage.entry("shot").row
    assert (once.consumed, once.enabled, once.next_fire) == (False, True, T0 - 1)
    assert stage.entry("tick").row.next_fire == cron_due
    assert stage.record("shot").rollup.last_run_at is None and stage.record("shot").enabled
    assert stage.records.pending_owner(["shot", "tick"]) == set()
    assert stage.stats.fires == 0
    assert stage.registry.last_fired == {}
    # The fire's writes are out of the pending batch; the step's own stay, for the next commit.
    assert stage.unit.batch == Batch(meta={"cursor": "7"})
    # Both are still due, and the timer waits before it tries again (no hot loop).
    assert stage.registry.next_due() == min(cron_due, T0 - 1)
    assert stage.unit.failing is not None and stage.unit.failing.full
    assert stage.firing.retry_wait_s() == pytest.approx(1.0)

    # Still full: the next try backs off further.
    stage.clock.advance(1.0)
    assert await stage.fire() == []
    assert stage.firing.retry_wait_s() == pytest.approx(2.0)

    # Room again: both fire once, late, with the time they were due.
    stage.mirror.full = False
    stage.clock.advance(2.0)
    started = await stage.fire()
    assert len(started) == 2
    assert sorted((r.trigger_id, r.scheduled_at) for r in stage.runner.started) == sorted(
        [("shot", T0 - 1), ("tick", cron_due)]
    )
    batch = stage.mirror.batches[0]  # then the runs' ends
    assert batch.meta == {"cursor": "7"}
    assert sorted(r.trigger_id or "" for r in batch.runs) == ["shot", "tick"]
    # The prepare writes the runs only: the consumption leaves with the note of the start
    # (the start journal covers a crash before it).
    assert batch.outbox == []
    assert stage.entry("shot").row.consumed
    assert stage.unit.failing is None and stage.firing.retry_wait_s() == 0.0
    assert await stage.fire() == []  # fired exactly once
    await stage.firing.wait_idle()
    await stage.timer.wait_noted()
    consumed = [
        w.fields
        for b in stage.mirror.batches[1:]
        for w in b.outbox
        if w.id == "shot" and "enabled" in w.fields
    ]
    # At the time it was to start: fired late, when it was prepared.
    assert consumed == [{"enabled": False, RollupField.LAST_RUN_AT: T0 + 3.0}]


async def test_a_manual_run_that_cannot_be_committed_is_refused_and_leaves_no_trace() -> None:
    stage = Stage()
    stage.mirror.full = True
    with pytest.raises(NotDurable, match="could not be written to the mirror"):
        await stage.firing.run_now("tick", PEER, Verdict.ACTIVE)
    assert stage.runner.started == [] and stage.stats.fires == 0
    assert stage.firing.manual_runs == 0
    assert not stage.unit
    stage.mirror.full = False
    assert await stage.firing.run_now("tick", PEER, Verdict.ACTIVE) is not None
    assert len(stage.runner.started) == 1
    await stage.firing.wait_idle()


async def test_an_event_fire_that_cannot_be_committed_starts_nothing() -> None:
    stage = Stage()
    stage.mirror.full = True
    message = ChatMessage("bao", "general", "m1", "hi", None, None, T0, 1, {})
    entry = stage.entry("hear")
    assert await stage.firing.fire_event(entry, message, T0, PEER, Verdict.ACTIVE) is None
    assert stage.runner.started == [] and not stage.unit and stage.stats.fires == 0


async def test_a_commit_that_fails_raises_commit_failed_and_keeps_the_step_pending() -> None:
    stage = Stage()
    stage.unit.meta({"cursor": "1"})
    stage.mirror.full = True
    with pytest.raises(CommitFailed, match="disk is full"):
        await stage.unit.commit(T0)
    assert stage.unit and stage.unit.failing is not None
    assert "the disk is full" in stage.unit.failing.reason()
    stage.mirror.full = False
    await stage.unit.commit(T0 + 1)
    assert stage.unit.failing is None and len(stage.mirror.batches) == 1
    await asyncio.sleep(0)


class FullDiskPort(FakePort):
    """The control API's fake port, whose manual runs cannot be written to the mirror."""

    async def run_now(self, trigger_id: str) -> str | None:
        raise NotDurable(trigger_id, CommitFailed("database or disk is full"))


async def test_run_now_while_the_mirror_cannot_be_written_is_503_not_durable(
    aiohttp_client: Any,
) -> None:
    port = FullDiskPort()
    port.put("daily", adopt=True, kind="cron", spec={"cron": "0 9 * * *"}, program="x:y@v1")
    http = await aiohttp_client(make_app(port))
    resp = await http.post("/triggers/daily/run")
    assert resp.status == 503
    error = (await resp.json())["error"]
    assert error["code"] == "not_durable"
    assert "was not started" in error["message"] and "disk is full" in error["message"]
