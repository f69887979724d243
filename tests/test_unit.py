"""The daemon's unit of work: one step's writes, the overlay, and the group commit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support import Traced

from anyrtd.mirror import AsyncMirror
from anyrtd.model import TriggerDef
from anyrtd.records import RecordCache
from anyrtd.rows import Batch, RunRow
from anyrtd.unit import CommitFailed, Unit
from anyrtd.vocab import RunStatus

NOW = 1_800_000_000.0
RECORD = {
    "id": "t",
    "_v": 3,
    "name": "t",
    "kind": "cron",
    "spec": {"cron": "0 9 * * *"},
    "program": "x:y@v1",
    "owner": "",
    "enabled": True,
}


class HeldMirror:
    """A stand-in for the mirror's worker that notes each transaction's batch; a commit can
    be held in flight, or made to fail once."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.entered = asyncio.Event()
        self.fail_next = False

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        self.entered.set()
        await self.hold.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("database is locked")
        return fn(self)

    def commit(self, batch: Batch, now: float) -> None:
        self.batches.append(batch)


def unit_with(db: Any) -> tuple[Unit, RecordCache, list[str]]:
    records = RecordCache()
    records.put(dict(RECORD))
    kicks: list[str] = []
    unit = Unit(records, on_outbox=lambda: kicks.append("kick"))
    unit.db = db
    return unit, records, kicks


async def test_a_trigger_write_is_laid_over_the_cache_at_once_and_queued_for_the_server(
    mirror: AsyncMirror,
) -> None:
    unit, records, kicks = unit_with(mirror)
    unit.write_trigger("t", {"owner": "peer-a"})
    parsed = records.parsed["t"]
    assert isinstance(parsed, TriggerDef) and parsed.owner == "peer-a"
    assert (records.raw("t") or {})["owner"] == ""  # the server's record is untouched
    assert kicks == []
    await unit.commit(NOW)
    pending = await mirror.call(lambda m: m.outbox_pending())
    assert [(i.dataset, i.id, dict(i.fields)) for i in pending] == [
        ("triggers", "t", {"owner": "peer-a"})
    ]
    assert kicks == ["kick"]
    assert not unit


async def test_a_run_is_kept_in_the_mirror_and_its_record_queued(mirror: AsyncMirror) -> None:
    unit, _, _ = unit_with(mirror)
    row = RunRow("r1", "t", "x:y@v1", "peer-a", NOW, NOW, status=RunStatus.OK, ended_at=NOW + 1)
    unit.save_run(row)
    unit.send_run(row)
    await unit.commit(NOW)
    kept = await mirror.call(lambda m: m.run("r1"))
    assert kept is not None and kept.status == RunStatus.OK
    pending = await mirror.call(lambda m: m.outbox_pending())
    assert [(i.dataset, i.id) for i in pending] == [("runs", "r1")]


async def test_a_run_saved_twice_in_one_commit_is_written_once_as_last_saved(
    mirror: AsyncMirror,
) -> None:
    unit, _, _ = unit_with(mirror)
    seen = Traced(mirror.mirror.engine)
    started = RunRow("r1", "t", "x:y@v1", "peer-a", NOW, NOW)
    unit.save_run(started)  # noted started
    unit.save_run(RunRow("r1", "t", "x:y@v1", "peer-a", NOW, NOW, status=RunStatus.OK))
    await unit.commit(NOW)
    kept = await mirror.call(lambda m: m.run("r1"))
    assert kept is not None and kept.status == RunStatus.OK
    [written] = seen.inserts("runs")  # one statement, with one row: the run's id once
    assert written.count("'r1'") == 1


async def test_an_empty_unit_commits_nothing() -> None:
    db = HeldMirror()
    unit, _, _ = unit_with(db)
    await unit.commit(NOW)
    assert db.batches == []


async def test_a_failed_commit_keeps_its_writes_ahead_of_those_queued_since() -> None:
    db = HeldMirror()
    unit, _, _ = unit_with(db)
    unit.evict("first")
    unit.meta({"cursor": "1"})
    db.fail_next = True
    with pytest.raises(CommitFailed, match="locked"):
        await unit.commit(NOW)
    assert unit  # nothing of it was written, so nothing of it was lost
    unit.evict("second")
    unit.meta({"cursor": "2"})
    await unit.commit(NOW)
    assert len(db.batches) == 1
    assert db.batches[0].evict == ["first", "second"]
    assert db.batches[0].meta == {"cursor": "2"}


async def test_commits_that_arrive_during_one_in_flight_are_written_together() -> None:
    db = HeldMirror()
    unit, _, _ = unit_with(db)
    db.hold.clear()
    unit.evict("a")
    first = asyncio.create_task(unit.commit(NOW))
    async with asyncio.timeout(5):
        await db.entered.wait()
    waiting = []
    for rid in ("b", "c", "d"):
        unit.evict(rid)
        waiting.append(asyncio.create_task(unit.commit(NOW)))
    db.hold.set()
    async with asyncio.timeout(5):
        await asyncio.gather(first, *waiting)
    assert [b.evict for b in db.batches] == [["a"], ["b", "c", "d"]]


async def test_a_commit_whose_writes_an_in_flight_commit_took_returns_once_that_is_durable() -> (
    None
):
    db = HeldMirror()
    unit, _, _ = unit_with(db)
    db.hold.clear()
    unit.evict("a")
    first = asyncio.create_task(unit.commit(NOW))
    await asyncio.sleep(0)  # the first commit holds the lock and lets this turn's writes join
    unit.evict("b")  # joins the first commit's transaction
    async with asyncio.timeout(5):
        await db.entered.wait()
    second = asyncio.create_task(unit.commit(NOW))  # nothing left pending of its own
    await asyncio.sleep(0.05)
    assert not second.done()  # its write is in the transaction still in flight
    db.hold.set()
    async with asyncio.timeout(5):
        await asyncio.gather(first, second)
    assert [b.evict for b in db.batches] == [["a", "b"]]


async def test_a_fires_unit_of_work_is_its_own_whatever_the_step_writes_meanwhile() -> None:
    """A fire's writes go into an object of their own (`Unit.fire`), so the step's writes
    made while the fire awaits (here, while its commit is in flight) can never land in it;
    a failed commit of the fire drops all of the fire and none of the step's."""
    db = HeldMirror()
    unit, records, _ = unit_with(db)
    fire = unit.fire()
    fire.write_trigger("t", {"enabled": False})
    fire.save_run(RunRow("r1", "t", "x:y@v1", "peer", NOW, NOW))
    db.hold.clear()
    db.fail_next = True
    commit = asyncio.create_task(unit.commit_fire(fire, NOW))
    await db.entered.wait()
    unit.meta({"cursor": "9"})  # the step writes while the fire's commit is in flight
    db.hold.set()
    with pytest.raises(CommitFailed):
        await commit
    assert unit.batch == Batch(meta={"cursor": "9"})  # the step's write, alone
    defn = records.parsed["t"]
    assert isinstance(defn, TriggerDef) and defn.enabled  # the fire's overlay rewound
    await unit.commit(NOW)
    assert [b.meta for b in db.batches] == [{"cursor": "9"}] and db.batches[0].runs == []
