"""Prepare ahead, start on time (issue 13, item 2), one piece at a time.

The timer, the firing stage and the apply stage on a real SQLite mirror, a fake clock and a
stand-in runner that notes when each program was started. The crashes of a real
`anyrtd serve` are in tests/test_fire_ahead_crash.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import pytest
from support import ReadyByStart

from anyrtd import lifecycle
from anyrtd.apply import Apply
from anyrtd.clock import FakeClock, SystemClock
from anyrtd.firing import START_JOURNAL_FILE, Firing, Prepared, StartJournal
from anyrtd.metrics import Stats
from anyrtd.mirror import AsyncMirror, Mirror
from anyrtd.missed import Skips
from anyrtd.model import TriggerDef
from anyrtd.program import RunOutcome
from anyrtd.records import RecordCache
from anyrtd.registry import Entry, Registry, new_row
from anyrtd.rows import RunRow
from anyrtd.timer import (
    LEAD_MAX_PER_RUN_S,
    LEAD_MAX_S,
    LEAD_MIN_S,
    PRECISE_S,
    Lead,
    Timer,
)
from anyrtd.unit import Unit
from anyrtd.vocab import RunState, RunStatus, Verdict

T0 = 1_800_000_000.0
PEER = "peer-a"
AT = T0 + 10.0


def record(rid: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": rid,
        "_v": 1,
        "name": rid,
        "program": "x:y@v1",
        "owner": PEER,
        "enabled": True,
        **fields,
    }


ONCE = record("shot", kind="once", spec={"at": AT})
CRON = record("tick", kind="cron", spec={"every_s": 60})


class Runner(ReadyByStart):
    """A stand-in runner: notes each run's start (on the fake clock); each ends when told."""

    kill_grace_s = 0.1

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.started: dict[str, float] = {}
        self.on_each_start: Callable[[], None] = lambda: None
        """Called as each program starts, after `on_start`."""

    def start(
        self,
        row: RunRow,
        args: Mapping[str, Any],
        *,
        on_start: Callable[[float], None] | None = None,
        on_spawn: Callable[[int], Awaitable[None]] | None = None,
    ) -> Coroutine[Any, Any, RunOutcome]:
        at = self.clock.now()
        self.started[row.trigger_id or ""] = at
        if on_start is not None:
            on_start(at)
        self.on_each_start()

        async def ended() -> RunOutcome:
            return RunOutcome(RunStatus.OK, None, None, at, at, 0)

        return ended()


class Stage:
    def __init__(self, db: AsyncMirror) -> None:
        self.db = db
        self.clock = FakeClock(T0)
        self.records = RecordCache()
        self.registry = Registry()
        self.unit = Unit(self.records, on_outbox=lambda: None)
        self.unit.db = db
        self.runner = Runner(self.clock)
        self.firing = Firing(
            registry=self.registry,
            records=self.records,
            unit=self.unit,
            runner=self.runner,  # type: ignore[arg-type]
            stats=Stats(),
            clock=self.clock,
            skips=Skips(),
        )
        self.timer = Timer(self.registry, self.firing, self.clock, lambda: (PEER, Verdict.ACTIVE))
        self.apply = Apply(
            registry=self.registry,
            records=self.records,
            unit=self.unit,
            stats=Stats(),
            confirm_after=0.0,
            cancel=self.timer.cancel,
        )

    def adopt(self, *records: dict[str, Any]) -> None:
        for rec in records:
            self.records.put(rec)
            defn = self.records.parsed[rec["id"]]
            assert isinstance(defn, TriggerDef)
            entry = Entry(defn, new_row(defn, T0 - 50, claimed=False))
            self.registry.put(entry)
            self.registry.arm(entry, T0 - 50)
            self.unit.save(entry.row)  # as the apply stage adopts it

    async def prepare_ahead(self) -> None:
        """Prepare the batch due at AT half a second ahead of it, as the timer does."""
        self.clock.set(AT - 0.5)
        await self.timer.prepare(AT, self.clock.now())

    async def open_journal(self) -> StartJournal:
        """Open the start journal as the daemon's open does (nothing left to settle)."""
        assert await self.timer.settle_open([], [], {}, T0) == []
        assert self.firing.journal is not None
        return self.firing.journal

    def entry(self, tid: str) -> Entry:
        entry = self.registry.get(tid)
        assert entry is not None
        return entry

    def sql(self, query: str) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.db.mirror.path)
        try:
            return conn.execute(query).fetchall()
        finally:
            conn.close()

    def outbox(self) -> list[tuple[str, dict[str, Any]]]:
        """Every write in the outbox: record id and fields."""
        rows = self.sql("SELECT record_id, fields FROM outbox ORDER BY seq")
        return [(rid, json.loads(fields)) for rid, fields in rows]

    async def sendable(self) -> list[tuple[str, dict[str, Any]]]:
        items = await self.db.call(lambda m: m.outbox_pending(500))
        return [(i.id, dict(i.fields)) for i in items]


@pytest.fixture
async def stage(mirror: AsyncMirror) -> AsyncIterator[Stage]:
    stage = Stage(mirror)
    try:
        yield stage
    finally:
        await stage.firing.wait_idle()


async def test_a_batch_is_durable_before_its_due_time_and_starts_with_no_write_before(
    stage: Stage,
) -> None:
    stage.adopt(ONCE)
    await stage.prepare_ahead()

    # Durable: the run is prepared for its due time, and that is all that is written: the
    # once is consumed (in the mirror and for the server) when its start is noted.
    assert stage.sql("SELECT trigger_id, state, started_at FROM runs") == [
        ("shot", RunState.PREPARED, AT)
    ]
    assert stage.sql("SELECT consumed FROM entries") == [(0,)]
    assert await stage.db.call(lambda m: m.runs()) == []  # not started: not listed yet
    assert stage.outbox() == []
    assert stage.runner.started == {}
    defn = stage.records.parsed["shot"]
    assert isinstance(defn, TriggerDef) and defn.rollup.last_run_at is None
    assert not stage.entry("shot").row.consumed

    # At the due time: started, and only then noted (startedAt the real start).
    stage.clock.set(AT + 0.002)
    [run_id] = await stage.timer.fire_now(stage.clock.now())
    assert stage.runner.started == {"shot": AT + 0.002}
    await stage.firing.wait_idle()
    await stage.unit.commit(stage.clock.now())
    assert stage.sql(f"SELECT state, started_at FROM runs WHERE run_id = '{run_id}'") == [
        (RunState.ENDED, AT + 0.002)
    ]
    assert stage.sql("SELECT consumed FROM entries WHERE trigger_id = 'shot'") == [(1,)]
    defn = stage.records.parsed["shot"]
    assert isinstance(defn, TriggerDef) and defn.rollup.last_run_at == AT
    assert stage.entry("shot").row.consumed
    assert ("shot", {"enabled": False, "lastRunAt": AT}) in await stage.sendable()
    assert await stage.timer.fire_now(stage.clock.now()) == []


@pytest.mark.parametrize("change", ["disable", "edit", "delete", "repin"])
async def test_a_change_before_the_due_time_cancels_the_prepared_run(
    stage: Stage, change: str
) -> None:
    stage.adopt(ONCE, CRON)
    cron_due = stage.entry("tick").row.next_fire
    assert cron_due is not None
    await stage.prepare_ahead()
    assert len(stage.sql("SELECT run_id FROM runs")) == 2

    if change == "disable":
        new = {**ONCE, "_v": 2, "enabled": False}
    elif change == "edit":
        new = {**ONCE, "_v": 2, "spec": {"at": AT + 3600}}
    elif change == "repin":
        new = {**ONCE, "_v": 2, "owner": "peer-b"}
    if change == "delete":
        stage.records.drop("shot")
    else:
        stage.records.put(new)
    stage.apply.reconcile(["shot"], stage.clock.now(), Verdict.ACTIVE, PEER)
    await stage.unit.commit(stage.clock.now())

    # The once's run is gone (nothing of it was for the server); the cron's prepared run
    # stays.
    assert stage.sql("SELECT trigger_id FROM runs") == [("tick",)]
    assert stage.outbox() == []
    stage.clock.set(AT)
    started = await stage.timer.fire_now(AT)
    assert list(stage.runner.started) == ["tick"] and len(started) == 1
    if change == "edit":
        assert stage.entry("shot").row.next_fire == AT + 3600
        assert not stage.entry("shot").row.consumed
    else:
        assert stage.registry.get("shot") is None or not stage.entry("shot").row.enabled


async def test_stopping_cancels_what_is_prepared_and_puts_the_entries_back(stage: Stage) -> None:
    stage.adopt(ONCE, CRON)
    cron_due = stage.entry("tick").row.next_fire
    await stage.prepare_ahead()
    stage.timer.cancel_all("the daemon stops")
    await stage.unit.commit(stage.clock.now())
    assert stage.sql("SELECT * FROM runs") == []
    assert stage.outbox() == []
    assert stage.sql("SELECT trigger_id, consumed, next_fire FROM entries ORDER BY 1") == [
        ("shot", 0, AT),
        ("tick", 0, cron_due),
    ]
    assert stage.firing.stats.fires == 0


async def test_runs_a_crash_left_prepared_are_discarded_and_the_once_fires_late(
    stage: Stage,
) -> None:
    stage.adopt(ONCE, CRON)
    cron_due = stage.entry("tick").row.next_fire
    assert cron_due is not None
    await stage.prepare_ahead()
    # The daemon dies here. The next start finds the prepared runs and discards them.
    fresh = Stage(stage.db)
    for rec in (ONCE, CRON):
        fresh.records.put(rec)
    snap = await stage.db.call(Mirror.snapshot)
    left = await stage.db.call(Mirror.open_runs)
    assert {(r.state, r.started_at) for r in left} == {(RunState.PREPARED, AT)}
    assert await fresh.timer.settle_open(left, snap.entries, snap.last_fired, AT) == []
    assert "tick" not in snap.last_fired
    now = AT + 5.0
    fresh.apply.restore(snap.entries, now, snap.last_fired)
    await fresh.unit.commit(now)
    assert stage.sql("SELECT * FROM runs") == []
    assert stage.outbox() == []
    # The once is due again (late); the cron's occurrence at AT is a missed one.
    assert fresh.entry("shot").row.next_fire == AT and not fresh.entry("shot").row.consumed
    assert (fresh.entry("tick").row.next_fire or 0) > now
    fresh.clock.set(now)
    assert len(await fresh.timer.fire_now(now)) == 1
    assert list(fresh.runner.started) == ["shot"]
    await fresh.firing.wait_idle()


@pytest.mark.parametrize("began", [False, True], ids=["before-its-start", "as-it-started"])
async def test_a_late_once_killed_between_its_commit_and_its_start_fires_late_not_lost(
    stage: Stage, began: bool
) -> None:
    """A batch already late (due before the timer came to it: a busy or starting daemon) is
    prepared and started like one prepared ahead, so a kill between its commit and its
    start is told apart by the start journal too: a once that never began fires again."""
    await stage.timer.settle_open([], [], {}, T0)
    stage.adopt(ONCE)
    late = AT + 30.0
    stage.clock.set(late)
    prepared = await stage.firing.prepare_batch(late, late, PEER, Verdict.ACTIVE)
    assert prepared is not None
    [launch] = prepared.launches.values()
    row = launch.row
    assert (row.state, row.started_at) == (RunState.PREPARED, late)
    assert stage.outbox() == []  # nothing tells the server the once was consumed
    if began:
        assert stage.firing.journal is not None
        stage.firing.journal.note(row.run_id)
    # The daemon dies here, before (or just as) the once's program starts.
    fresh = Stage(stage.db)
    fresh.records.put(ONCE)
    snap = await stage.db.call(Mirror.snapshot)
    left = await stage.db.call(Mirror.open_runs)
    rest = await fresh.timer.settle_open(left, snap.entries, snap.last_fired, late + 5)
    fresh.apply.restore(snap.entries, late + 5, snap.last_fired)
    await fresh.unit.commit(late + 5)
    if began:  # it may have run: interrupted, consumed, and the server told so
        assert [(r.run_id, how) for r, how in rest] == [(row.run_id, lifecycle.Settle.UNCONFIRMED)]
        assert fresh.entry("shot").row.consumed
        assert await fresh.sendable() == [("shot", {"enabled": False, "lastRunAt": late})]
        assert await fresh.timer.fire_now(late + 5) == []
    else:  # it never ran: it fires now, late, once
        assert rest == [] and stage.outbox() == []
        assert not fresh.entry("shot").row.consumed
        fresh.clock.set(late + 5)
        assert len(await fresh.timer.fire_now(late + 5)) == 1
        assert list(fresh.runner.started) == ["shot"]
    await fresh.firing.wait_idle()


async def test_each_prepared_start_is_journaled_before_it_and_the_journal_emptied_once_noted(
    stage: Stage, tmp_path: Path
) -> None:
    journal = await stage.open_journal()
    assert journal.path == tmp_path / START_JOURNAL_FILE
    stage.adopt(ONCE)
    await stage.prepare_ahead()
    assert journal.read() == set()
    seen: list[set[str]] = []
    stage.runner.on_each_start = lambda: seen.append(journal.read())
    stage.clock.set(AT)
    [run_id] = await stage.timer.fire_now(AT)
    # The once's id was in the journal when its program started.
    assert run_id in seen[0]
    # Once the start is noted in the mirror, the journal is emptied.
    await stage.timer.wait_noted()
    [(state,)] = stage.sql(f"SELECT state FROM runs WHERE run_id = '{run_id}'")
    assert state in (RunState.RUNNING, RunState.ENDED)
    assert journal.read() == set() and journal.written == 0


async def test_starts_noted_after_the_mirror_closed_leave_the_journal_as_it_is(
    stage: Stage,
) -> None:
    """The mirror closed (the daemon stopping, or gone) between a start and its note: the
    note's commit writes nothing, so the journal keeps the id for the next start."""
    journal = await stage.open_journal()
    stage.adopt(ONCE)
    await stage.prepare_ahead()
    stage.clock.set(AT)
    [run_id] = await stage.timer.fire_now(AT)
    stage.unit.db = None
    await stage.timer.wait_noted()
    assert journal.read() == {run_id}
    stage.unit.db = stage.db
    [(state,)] = stage.sql(f"SELECT state FROM runs WHERE run_id = '{run_id}'")
    assert state == RunState.PREPARED  # what a restart settles by the journal


async def test_each_id_of_a_batch_is_journaled_just_before_its_own_start_not_before(
    stage: Stage,
) -> None:
    """An id in the journal is taken for a run that may have started, and a `once` that may
    have started never runs again: an id written before its program started would lose
    that `once` to a kill in between (the kill9 family found it when a batch's ids were
    written at once)."""
    journal = await stage.open_journal()
    shots = [record(f"shot{i}", kind="once", spec={"at": AT}) for i in range(3)]
    stage.adopt(*shots)
    await stage.prepare_ahead()
    seen: list[set[str]] = []
    stage.runner.on_each_start = lambda: seen.append(journal.read())
    stage.clock.set(AT)
    run_ids = await stage.timer.fire_now(AT)
    assert len(run_ids) == 3
    assert seen == [set(run_ids[: k + 1]) for k in range(3)]
    assert journal.written == 3
    await stage.timer.wait_noted()
    assert journal.read() == set()


async def test_the_batches_started_within_the_note_wait_are_noted_in_one_commit(
    stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = await stage.open_journal()
    later = record("later", kind="once", spec={"at": AT + 0.05})
    stage.adopt(ONCE, later)
    await stage.prepare_ahead()
    await stage.timer.prepare(AT + 0.05, stage.clock.now())
    release = asyncio.Event()
    started = stage.runner.start

    def held_start(row: RunRow, args: Mapping[str, Any], **calls: Any) -> Any:
        done = started(row, args, **calls)

        async def ended() -> RunOutcome:
            await release.wait()
            return await done

        return ended()

    monkeypatch.setattr(stage.runner, "start", held_start)
    commits: list[int] = []
    commit = stage.db.mirror.commit
    monkeypatch.setattr(
        stage.db.mirror, "commit", lambda batch, now: (commits.append(1), commit(batch, now))
    )
    stage.clock.set(AT)
    assert len(await stage.timer.fire_now(AT)) == 1
    stage.clock.set(AT + 0.05)
    assert len(await stage.timer.fire_now(AT + 0.05)) == 1
    assert journal.written == 2 and commits == []  # nothing written between the starts
    await stage.timer.wait_noted()
    assert len(commits) == 1  # both batches' notes in one transaction
    assert stage.sql("SELECT state FROM runs") == [(RunState.RUNNING,), (RunState.RUNNING,)]
    assert journal.read() == set()
    release.set()


async def test_a_prepared_run_in_the_start_journal_is_closed_as_interrupted_not_refired(
    stage: Stage,
) -> None:
    """Killed between a program's start and the note of it in the mirror: the run may have
    started, so the restart closes it as interrupted and the once stays consumed."""
    journal = await stage.open_journal()
    stage.adopt(ONCE)
    await stage.prepare_ahead()
    [(run_id,)] = stage.sql("SELECT run_id FROM runs")
    journal.note(run_id)  # its program starts; the process dies before the note commits
    fresh = Stage(stage.db)
    fresh.records.put(ONCE)
    snap = await stage.db.call(Mirror.snapshot)
    left = await stage.db.call(Mirror.open_runs)
    [(kept, how)] = await fresh.timer.settle_open(left, snap.entries, snap.last_fired, AT + 5)
    assert (kept.run_id, kept.state, kept.started_at) == (run_id, RunState.STARTED, AT)
    assert how == lifecycle.Settle.UNCONFIRMED  # a stand-in program: not idempotent
    await fresh.firing.close_interrupted([(kept, how)], AT + 5)
    fresh.apply.restore(snap.entries, AT + 5, snap.last_fired)
    await fresh.unit.commit(AT + 5)
    assert stage.sql("SELECT status FROM runs") == [(RunStatus.INTERRUPTED,)]
    assert fresh.entry("shot").row.consumed
    assert ("shot", {"enabled": False, "lastRunAt": AT}) in await fresh.sendable()
    assert await fresh.timer.fire_now(AT + 5) == []


async def test_a_cron_occurrence_still_ahead_at_the_restart_fires_at_its_time(
    stage: Stage,
) -> None:
    stage.adopt(CRON)
    due = stage.entry("tick").row.next_fire
    assert due is not None
    stage.clock.set(due - 0.5)
    await stage.timer.prepare(due, stage.clock.now())
    fresh = Stage(stage.db)
    fresh.records.put(CRON)
    snap = await stage.db.call(Mirror.snapshot)
    left = await stage.db.call(Mirror.open_runs)
    assert await fresh.timer.settle_open(left, snap.entries, snap.last_fired, AT) == []
    fresh.apply.restore(snap.entries, due - 0.2, snap.last_fired)
    assert fresh.entry("tick").row.next_fire == due


def test_the_lead_grows_with_the_batch_and_the_measured_time_within_bounds() -> None:
    lead = Lead()
    lead.note(100, prepare_s=0.05, commit_s=0.02)
    assert LEAD_MIN_S < lead.of(1) < lead.of(1000) <= LEAD_MAX_S
    lead.note(100, prepare_s=5.0, commit_s=1.0)
    assert lead.of(10_000) == LEAD_MAX_S + LEAD_MAX_PER_RUN_S * 10_000


def test_the_lead_of_a_large_batch_covers_its_measured_prepare_and_commit() -> None:
    """A burst of 10,000 that took 1.4 s to prepare and commit on a loaded machine gets a lead
    beyond 2 s the next time; small batches still get at most about 2 s."""
    lead = Lead()
    lead.note(1, prepare_s=0.0001, commit_s=0.01)  # a commit's fixed cost, its fsync
    lead.note(10_000, prepare_s=0.5, commit_s=0.9)
    assert lead.of(10_000) >= 1.4 * 2 and lead.of(10_000) > LEAD_MAX_S
    assert lead.expect(10_000) >= 1.4
    assert lead.of(10) <= LEAD_MAX_S + LEAD_MAX_PER_RUN_S * 10


def test_a_slower_commit_raises_the_lead_at_once_and_faster_ones_bring_it_back_slowly() -> None:
    lead = Lead()
    lead.note(1, prepare_s=0.0001, commit_s=0.002)
    calm = lead.of(1)
    lead.note(1, prepare_s=0.0001, commit_s=0.08)  # a commit waited behind a tick's
    assert lead.expect(1) >= 0.08 and lead.of(1) >= LEAD_MIN_S + 3 * 0.08
    lead.note(1, prepare_s=0.0001, commit_s=0.002)
    assert calm < lead.of(1) < LEAD_MIN_S + 3 * 0.08  # one fast commit: a fifth of the way
    for _ in range(40):
        lead.note(1, prepare_s=0.0001, commit_s=0.002)
    assert lead.of(1) == pytest.approx(calm, abs=0.001)


async def test_a_batch_is_prepared_earlier_by_the_wait_for_a_slow_mirror_call(
    stage: Stage,
) -> None:
    """A prepare's commit queues behind the mirror's call in flight (under a barrage of
    records, a tick's commit took up to 0.4 s): the batch is prepared earlier by the
    mirror's recent slowest call (`Unit.wait_s`), so that its commit is still done in time."""
    stage.adopt(CRON)
    due = stage.registry.next_due()
    assert due is not None
    assert stage.timer.lead.of(1, wait_s=0.3) == pytest.approx(stage.timer.lead.of(1) + 0.3)
    stage.db.slow_s = 0.0  # the mirror's calls so far (its opening) count for nothing here
    stage.clock.set(due - stage.timer.lead.of(1) - 0.2)
    with pytest.raises(TimeoutError):  # a lead away, not yet
        async with asyncio.timeout(0.1):
            await stage.timer.step()
    assert stage.timer.prepared == []
    stage.db.slow_s = 0.3
    assert stage.unit.wait_s() == 0.3
    await stage.timer.step()  # the lead and the wait away: now
    assert [batch.due for batch in stage.timer.prepared] == [due]


async def test_a_wall_clock_stepped_back_cancels_what_was_prepared_under_the_later_clock(
    stage: Stage,
) -> None:
    stage.adopt(CRON)
    due = stage.entry("tick").row.next_fire
    assert due is not None
    stage.clock.set(due - 0.5)
    stage.timer.watch_clock()
    await stage.timer.prepare(due, stage.clock.now())
    assert stage.timer.prepared
    stage.clock.set(due - 7200)  # two hours back
    assert stage.timer.watch_clock() > 7000
    assert stage.timer.prepared == []
    await stage.unit.commit(stage.clock.now())
    assert stage.sql("SELECT * FROM runs") == []
    # Re-armed from the new time, not left at the occurrence of the later clock.
    next_fire = stage.entry("tick").row.next_fire
    assert next_fire is not None and next_fire <= stage.clock.now() + 60


async def test_a_stop_during_the_prepare_commit_waits_for_it_and_cancels_what_it_made(
    stage: Stage,
) -> None:
    stage.adopt(ONCE)
    stage.clock.set(AT - 0.5)
    preparing = asyncio.create_task(stage.timer.prepare(AT, stage.clock.now()))
    await asyncio.sleep(0)  # the commit is in flight on the mirror's thread
    preparing.cancel()  # the daemon stops: its timer task is cancelled
    with contextlib.suppress(asyncio.CancelledError):
        await preparing
    await stage.timer.close("the daemon stops")
    await stage.unit.commit(stage.clock.now())
    assert stage.timer.prepared == []
    assert stage.sql("SELECT * FROM runs") == []
    assert stage.outbox() == []
    assert stage.sql("SELECT consumed, next_fire FROM entries") == [(0, AT)]


async def test_work_that_holds_the_loop_waits_for_a_start_due_within_it(stage: Stage) -> None:
    """The outbox's drain and a large feed page (`Timer.clear_of`) go at once when no start
    is due within their stall, and just after the start otherwise."""
    clock = SystemClock()
    timer = Timer(stage.registry, stage.firing, clock, lambda: (PEER, Verdict.ACTIVE))

    async def took(due_in: float, stall_s: float) -> float:
        timer.prepared[:] = [Prepared(clock.now() + due_in, {})]
        began = time.monotonic()
        await timer.clear_of(stall_s)
        return time.monotonic() - began

    assert await took(5.0, 0.02) < 0.2  # far ahead: at once (no sleep at all)
    assert await took(-5.0, 0.02) < 0.2  # long passed (a late batch): at once
    waited = await took(0.2, 0.3)  # within the stall: just after the start
    assert waited >= 0.2


async def test_a_prepare_held_up_by_a_batch_prepared_already_sleeps_until_its_start(
    stage: Stage,
) -> None:
    """The next batch's lead has come, but preparing it now would hold up the start of the
    batch prepared already: the timer sleeps until that start, rather than waking at once
    again and again until then."""
    stage.adopt(CRON)
    due = stage.registry.next_due()
    assert due is not None
    ready = due - 0.01
    stage.clock.set(ready - 1.0)
    stage.timer.lead.note(1, 0.0, 1.0)  # a commit takes 1 s: a lead of 2 s, expected 1 s
    stage.timer.prepared[:] = [Prepared(ready, {})]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await stage.timer.step()
    assert stage.timer.prepared[0].due == ready  # nothing else was prepared meanwhile
    stage.timer.prepared.clear()


async def test_a_batch_due_within_the_last_stretch_starts_at_its_due_time_never_before(
    stage: Stage,
) -> None:
    """On the real clock, the last `PRECISE_S` before a prepared batch's due time is slept
    in the thread, then the batch starts: at or after its due time, never before it. A
    batch further away is waited for in the loop, and not started early."""
    timer = Timer(stage.registry, stage.firing, SystemClock(), lambda: (PEER, Verdict.ACTIVE))
    started: list[tuple[float, float]] = []

    async def start(batch: Prepared) -> list[str]:
        started.append((batch.due, time.time()))
        timer.prepared.remove(batch)
        return []

    timer.start = start  # type: ignore[method-assign]
    for _ in range(20):
        timer.prepared[:] = [Prepared(time.time() + PRECISE_S / 2, {})]
        await timer.step()
    assert len(started) == 20 and all(at >= due for due, at in started)
    started.clear()
    timer.prepared[:] = [Prepared(time.time() + 0.2, {})]
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.1):
            await timer.step()
    assert started == []
    timer.prepared.clear()


@pytest.mark.parametrize("begins", [True, False], ids=["then-begins", "never-begins"])
async def test_a_run_whose_program_begins_after_the_batch_is_noted_is_noted_when_it_begins(
    stage: Stage, monkeypatch: pytest.MonkeyPatch, begins: bool
) -> None:
    """A command is spawned in its run's own task, after the batch's note: until its program
    begins, nothing says it started (a kill then must find it prepared and never begun, its
    `once` not consumed); it is noted when it begins, or, if it never does (cannot be
    spawned), when it ends, so that its `once` is not fired again."""
    journal = await stage.open_journal()
    stage.adopt(ONCE)
    await stage.prepare_ahead()
    spawn = asyncio.Event()

    def go(launch: Any) -> Coroutine[Any, Any, RunOutcome]:
        async def command() -> RunOutcome:
            await spawn.wait()  # the spawn comes in the run's task, later
            if begins:
                launch.on_start(AT + 0.01)
            return RunOutcome(RunStatus.OK if begins else RunStatus.FAILED, None, None, AT, AT, 0)

        return command()

    monkeypatch.setattr(stage.runner, "go", go)
    stage.clock.set(AT)
    [run_id] = await stage.timer.fire_now(AT)
    await stage.timer.wait_noted()
    assert stage.sql(f"SELECT state FROM runs WHERE run_id = '{run_id}'") == [(RunState.PREPARED,)]
    assert stage.sql("SELECT consumed FROM entries WHERE trigger_id = 'shot'") == [(0,)]
    assert stage.outbox() == [] and journal.read() == set()
    spawn.set()
    await stage.firing.wait_idle()
    await stage.unit.commit(stage.clock.now())
    assert stage.sql(f"SELECT state FROM runs WHERE run_id = '{run_id}'") == [(RunState.ENDED,)]
    assert stage.sql("SELECT consumed FROM entries WHERE trigger_id = 'shot'") == [(1,)]
    assert ("shot", {"enabled": False, "lastRunAt": AT}) in stage.outbox()
    assert journal.read() == ({run_id} if begins else set())
