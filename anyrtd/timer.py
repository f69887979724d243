"""The timer: prepares each due batch ahead of its due time and starts it on time.

The timer wakes a lead ahead of the next due time (the lead grows with the batch's size and
the measured time of a prepare and its commit, within bounds), makes the batch durable in
one transaction (`Firing.prepare_batch`: its runs `prepared`, `anyrtd/lifecycle.py`),
sleeps until the due time and then starts every program of the batch with no disk or
network work before the starts. The starts are noted in the mirror afterwards
(`lifecycle.note`: the runs `running` with their real `startedAt`, the cron re-arms, a
`once`'s consumption queued for the server), in the next commit or at most `NOTE_WAIT_S`
later. A batch already late when the timer comes to it takes the same path and starts as
soon as its commit returns.

Just before each program of such a batch starts, its run id is written to the start
journal beside the mirror (`firing.StartJournal`): a restart after a crash tells by it a
prepared run that may have started (closed as interrupted: a `once` never runs twice) from
one that never did.

A prepared run is cancelled (`lifecycle.cancel`) when its trigger is edited, disabled,
repinned or deleted before its due time (`cancel`, from the apply stage), and when the
daemon stops. A run still prepared when the daemon died never started: the next start
discards it (`settle_open`), and its occurrence fires normally if still ahead, is a missed
cron occurrence, or, for a `once`, fires late.

A fire whose preparation could not be committed (the disk is full) is tried again after
the wait `Firing.retry_wait_s` gives, not at once: late, not lost, and no hot loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from anyrtd import lifecycle
from anyrtd.clock import Clock, SystemClock, rise_at_once
from anyrtd.firing import Firing, Prepared
from anyrtd.heap import gc_paused
from anyrtd.logs import iso_time
from anyrtd.registry import Registry
from anyrtd.rows import EntryRow, RunRow
from anyrtd.runner.process import run_groups
from anyrtd.unit import CommitFailed, Unit
from anyrtd.vocab import Kind, Verdict

log = logging.getLogger("anyrtd.timer")

IDLE_WAKE_S = 60.0
"""The longest the timer sleeps without looking (the wall clock may have stepped).
Chosen (b59cc30): a design bound on how long a stepped wall clock goes unseen; not measured."""
LEAD_MIN_S = 0.05
LEAD_MAX_S = 2.0
LEAD_MAX_PER_RUN_S = 0.001
"""A batch is prepared at least 50 ms and at most 2 s ahead of its due time, plus 1 ms a run:
a large batch's prepare and commit fit its lead (10,000 runs took 1.3 s on the reference
machine and 2.0 s under a profiler, docs/benchmarks.md, where 2 s was the cap).
Chosen (b7db026, issue 13; the per-run part issue 22): a design margin, about seven times
the measured 0.13 ms a run."""
LEAD_SMALL_BATCH = 10
"""A batch of at most this many runs tells a commit's fixed cost (its fsync); a larger one the
cost per run (`Lead.note`)."""
CLEAR_STALL_S = 0.02
"""About how long the event loop is held by the longest stretches of work besides the
timer's (a tick, a drain's encoding, a feed page's decoding): `Timer.clear_of`.
Chosen (44d8f25): docs/benchmarks.md, "The fire path's last cuts": encoding a second's run
records or decoding the page that shows them back took milliseconds."""
CLEAR_WAIT_MAX_S = 0.25
"""The longest such work waits for a start to pass.
Chosen (bc53436, 44d8f25): docs/benchmarks.md, "The fire path's last cuts": a second's run records
or a feed page held the loop for milliseconds over a start."""
NOTE_WAIT_S = 0.2
"""How long the notes of started batches wait before their own commit: another commit (the
runs' ends, the next prepare) usually carries them first, and the batches started meanwhile
share one. The start journal covers the wait.
Chosen (bfe63d5): docs/benchmarks.md, "The fire path's last cuts": one commit for the notes instead
of one per batch."""
LEAD_FACTOR = 3.0
"""The lead is this many times the batch's expected prepare and commit time (a margin for
a busy machine), plus `LEAD_MIN_S`.
Chosen (b7db026): a design margin with `LEAD_MAX_S`, not measured separately."""

PRECISE_S = 0.0015
"""The last stretch before a prepared batch's due time is slept in the loop's thread
(`time.sleep`), not in the event loop's poll, which rounds its timeout up to whole
milliseconds and so woke the timer 0-1 ms late: `spread-10k` start lag p50 from about
1.5 ms to 0.8 ms (docs/benchmarks.md). The loop is held that long at most, just before a
start, when nothing else should run anyway. Only on the real clock."""


def precise_sleep(seconds: float, sleep: Callable[[float], None] | None = None) -> bool:
    """Sleep `seconds` (at most `PRECISE_S`) in this thread; return whether it slept.

    A clock stepped between the look and the sleep cannot make it long: it is cut to
    `PRECISE_S`. A real step of the wall clock does not reach `time.sleep`, which counts to
    a deadline on the monotonic clock; a faked one can: under libfaketime with an offset
    (and the monotonic clock left alone), every `time.sleep` fails with `OSError: [Errno
    22]`, the deadline it is handed having been shifted. Such a sleep is taken again with a
    relative timeout (`select`); if that fails too, it returns False and the timer looks
    again at its next step instead of failing its loop."""
    seconds = min(max(0.0, seconds), PRECISE_S)
    try:
        (sleep or time.sleep)(seconds)
    except OSError:
        try:
            select.select([], [], [], seconds)
        except (OSError, ValueError) as exc:
            log.debug("the timer's last stretch before a start could not be slept: %s", exc)
            return False
    return True


STEP_WORK_S = 1.0
"""The longest a step's own work (a prepare and its commit, a start) is expected to take:
beyond it, the timer counts itself held up (`Timer.held_up`).
Chosen (fb6e731): a design bound, so a stop mid-step is noticed; not measured."""

Identity = Callable[[], tuple[str | None, str]]
"""This device's peer id and verdict, read when a batch is prepared or started."""


class Settles(Protocol):
    """What reconciles the entries due that a spread reconcile has not reached yet (the apply
    stage): the timer asks it before each batch is taken from the registry, so nothing fires
    from an entry the reconcile has not looked at since a start or a new verdict."""

    def settle_due(self, due: float) -> None: ...


@dataclass(slots=True)
class Lead:
    """How long a batch takes to prepare and commit, measured (moving averages)."""

    per_run_s: float = 0.0003
    commit_s: float = 0.01
    _seen: bool = field(default=False)

    def expect(self, runs: int) -> float:
        """Return how long a batch of `runs` is expected to take to prepare and commit."""
        return self.commit_s + self.per_run_s * runs

    def of(self, runs: int, wait_s: float = 0.0) -> float:
        """Return how far ahead of its due time a batch of `runs` is prepared, when its
        commit may first wait `wait_s` for the mirror's call in flight (`Unit.wait_s`)."""
        cap = LEAD_MAX_S + LEAD_MAX_PER_RUN_S * runs
        return min(cap, LEAD_MIN_S + wait_s + LEAD_FACTOR * self.expect(runs))

    def note(self, runs: int, prepare_s: float, commit_s: float) -> None:
        """Note how long a batch of `runs` took to prepare and to commit. A small batch tells
        the commit's fixed cost (its fsync, and the wait for a commit in flight); a larger
        one the cost per run, its commit beyond the fixed cost included (a commit of 10,000
        runs takes most of a second). Both rise at once to a batch that took longer, and
        fall back slowly: a start late is worse than a prepare early, and a commit slows
        for a while, not once (1.5 ms on an idle disk; 40-90 ms, then 0.35 s, while another
        process wrote 26 MB to the same disk in the records fault family)."""
        if runs <= LEAD_SMALL_BATCH:
            self.commit_s = rise_at_once(self.commit_s, commit_s) if self._seen else commit_s
            self._seen = True
            return
        per_run = (prepare_s + max(0.0, commit_s - self.commit_s)) / runs
        self.per_run_s = rise_at_once(self.per_run_s, per_run)


class Ahead:
    """The batches prepared ahead of their due time, by due time: the run of a trigger that
    changes before its due time is cancelled from them (`cancel`, from the apply stage), and
    work that holds the event loop waits for the next start to pass (`clear_of`, from the
    daemon's loops and the feed's reads)."""

    def __init__(self, registry: Registry, firing: Firing, clock: Clock) -> None:
        self.registry = registry
        self.firing = firing
        self.clock = clock
        self.batches: list[Prepared] = []

    async def clear_of(self, stall_s: float = CLEAR_STALL_S) -> None:
        """Return when `stall_s` of work on the event loop would not hold up a start: at
        once when the next due time is further away (or already passed), else just after
        it, waiting at most `CLEAR_WAIT_MAX_S` in all. The outbox's drain and a large feed
        page call it before the work that holds the loop for milliseconds."""
        waited = 0.0
        while waited < CLEAR_WAIT_MAX_S:
            due = self.registry.next_due()
            if self.batches:
                due = self.batches[0].due if due is None else min(due, self.batches[0].due)
            gap = None if due is None else due - self.clock.now()
            if gap is None or gap > stall_s or gap < -stall_s:
                return
            pause = min(CLEAR_WAIT_MAX_S - waited, max(0.0, gap) + LEAD_MIN_S / 10)
            await asyncio.sleep(pause)  # the start's turn comes first
            waited += pause

    def cancel(self, trigger_id: str, why: str = "its trigger changed") -> None:
        """Cancel the prepared run of `trigger_id`, if any (`Firing.take_back`): its row is
        deleted and its entry put back as it was before the prepare (the caller's change
        follows)."""
        for batch in self.batches:
            launch = self.firing.take_back(batch, trigger_id)
            if launch is None:
                continue
            log.info(
                "cancelled the run of %s prepared for %s: %s",
                trigger_id,
                iso_time(batch.due),
                why,
                extra={"trigger": trigger_id, "run": launch.row.run_id},
            )
            if not batch.launches:
                self.batches.remove(batch)
            return

    def cancel_all(self, why: str) -> None:
        """Cancel every prepared run (the daemon stops, or the wall clock stepped back)."""
        for batch in list(self.batches):
            for tid in list(batch.launches):
                self.cancel(tid, why)


class Timer:
    """One step of the timer loop at a time (`step`), woken early by `rearm`."""

    def __init__(
        self,
        registry: Registry,
        firing: Firing,
        clock: Clock,
        identity: Identity,
        *,
        unit: Unit | None = None,
        ahead: Ahead | None = None,
        settle: Settles | None = None,
    ) -> None:
        self.registry = registry
        self.firing = firing
        self.unit = firing.unit if unit is None else unit
        """The step's unit of work (the firing stage's, unless given)."""
        self.clock = clock
        self.identity = identity
        self.ahead = ahead or Ahead(registry, firing, clock)
        """The batches prepared ahead (the apply stage cancels a changed trigger's run)."""
        self.settle = settle
        self.rearm = asyncio.Event()
        """Set to make the sleeping timer look at the heap again (a tick, a write-through)."""
        self.lead = Lead()
        self._noter: asyncio.Task[None] | None = None
        self._note_due = False
        """A batch started since the noter last took the notes."""
        self._note_now = asyncio.Event()
        """Set to cut the noter's wait short (the daemon stops)."""
        self._starting = False
        self._preparing: asyncio.Future[None] | None = None
        self._precise_s = PRECISE_S if isinstance(clock, SystemClock) else 0.0
        self._watch_held_up = isinstance(clock, SystemClock)
        """On the real clock only: a test's fake clock moves by jumps that are no stop."""
        self._began = 0.0
        """When (monotonic) this step began."""
        self._next_step: float | None = None
        """When (monotonic) the next step should begin: the end of a step's work, or of
        its sleep."""
        self.held_up = 0.0
        """How far behind `_next_step` this step began: the daemon was stopped (SIGSTOP, a
        paused VM) or its loop blocked meanwhile. A cron occurrence that passed more than
        `MISSED_AFTER_S` ago during it is a missed one (`Firing.missed`)."""

    @property
    def prepared(self) -> list[Prepared]:
        """Batches prepared ahead, by due time."""
        return self.ahead.batches

    def watch_clock(self) -> float:
        """When the wall clock stepped back, cancel the runs prepared under the later clock,
        then re-arm the recurring entries from now; return the size of the step (0.0: none)."""
        if (step := self.firing.clock_step()) > 0.0:
            self.cancel_all("the wall clock stepped back")
            self.firing.pull_back(step)
        return step

    async def step(self) -> None:
        """Start a prepared batch whose due time came (within `PRECISE_S` of it, sleeping
        the rest in the thread), prepare the next one when it is a lead away, fire what is
        due late; else sleep until one of those (or `rearm`). Note first how long the
        timer was held up since the last step should have ended (`held_up`)."""
        if self._watch_held_up:
            self._began = mono = self.clock.monotonic()
            expected, self._next_step = self._next_step, None
            self.held_up = 0.0 if expected is None else max(0.0, mono - expected)
        try:
            await self._step()
        finally:
            if self._watch_held_up and self._next_step is None:
                # A step's work longer than `STEP_WORK_S` counts as held up too: the daemon
                # may have been stopped in the middle of it.
                self._next_step = min(self.clock.monotonic(), self._began + STEP_WORK_S)

    async def _step(self) -> None:
        self.watch_clock()
        now = self.clock.now()
        ready = self.prepared[0] if self.prepared else None
        if ready is not None and ready.due - now <= self._precise_s:
            if ready.due > now and not precise_sleep(ready.due - now):
                await asyncio.sleep(0)  # the sleep failed: the next step looks again
                return
            await self.start(ready)
            return
        due = self.registry.next_due()
        retry_wait = self.firing.retry_wait_s()
        wake = [] if ready is None else [ready.due - self._precise_s]
        if due is not None and retry_wait > 0.0:
            wake.append(now + retry_wait)
        elif due is not None and due <= now:
            await self.fire_now(now)
            return
        elif due is not None:
            runs = self.registry.count_due(due)
            at = due - self.lead.of(runs, self.unit.wait_s())
            if at > now:
                wake.append(at)
            # Not while the prepare would hold up the start of a batch prepared already: it
            # waits for that start (a wake already), rather than spinning until then.
            elif ready is None or now + self.lead.expect(runs) < ready.due:
                await self.prepare(due, now)
                return
        self.rearm.clear()
        timeout = min(IDLE_WAKE_S, max(0.0, min(wake, default=now + IDLE_WAKE_S) - now))
        if self._watch_held_up:  # from the step's start, when `now` was read
            self._next_step = self._began + timeout
        # `asyncio.timeout`, not `wait_for`, which in 3.11 makes a task of the wait each step.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.rearm.wait()

    async def clear_of(self, stall_s: float = CLEAR_STALL_S) -> None:
        """Return when `stall_s` of work would not hold up a start (`Ahead.clear_of`)."""
        await self.ahead.clear_of(stall_s)

    async def fire_now(self, now: float) -> list[str]:
        """Start the prepared batches whose due time came, then fire at once what else is
        due at or before `now` (late: prepared and started together); return the run ids."""
        started: list[str] = []
        while self.prepared and self.prepared[0].due <= now:
            started += await self.start(self.prepared[0])
        self.watch_clock()
        device, verdict = self.identity()
        if self.settle is not None:
            self.settle.settle_due(now)
        late = await self.firing.prepare_batch(now, now, device, verdict, self.held_up)
        if late is None or not late.launches:
            return started
        self.prepared.insert(0, late)
        return started + await self.start(late)

    async def prepare(self, due: float, now: float) -> None:
        """Prepare the batch due at `due` ahead of it, and keep it for its start.

        Shielded: a stop that comes during the commit waits for it (`close`), so what it
        made durable is known and cancelled rather than left to a restart."""
        self._preparing = asyncio.ensure_future(self._prepare(due, now))
        await asyncio.shield(self._preparing)

    async def close(self, why: str) -> None:
        """Wait for a prepare in flight, then cancel every prepared run (the daemon stops)."""
        if self._preparing is not None:
            with contextlib.suppress(Exception):
                await self._preparing
        if self._noter is not None:
            self._note_now.set()
            with contextlib.suppress(Exception):
                await self._noter
        self.cancel_all(why)
        self.firing.close_journal()

    async def _prepare(self, due: float, now: float) -> None:
        device, verdict = self.identity()
        began = time.perf_counter()
        if self.settle is not None:
            self.settle.settle_due(due)
        batch = await self.firing.prepare_batch(due, now, device, verdict)
        if batch is None or not batch.launches:
            return
        runs = len(batch.launches)
        took = time.perf_counter() - began
        self.lead.note(runs, took - self.firing.last_commit_s, self.firing.last_commit_s)
        if log.isEnabledFor(logging.DEBUG):  # its time's formatting is a local-time lookup
            log.debug(
                "prepared %d runs due at %s in %.1f ms (its commit %.1f ms), %.1f ms ahead of it",
                runs,
                iso_time(due),
                took * 1000,
                self.firing.last_commit_s * 1000,
                (due - self.clock.now()) * 1000,
            )
        self.prepared.append(batch)
        self.prepared.sort(key=lambda p: p.due)

    async def start(self, batch: Prepared) -> list[str]:
        """Start a prepared batch (its due time came); then note the starts in the mirror.
        Return the run ids started."""
        self.prepared.remove(batch)
        starts: list[str] = []
        skipped: list[str] = []
        gone: list[str] = []
        _, verdict = self.identity()
        late = min(self.clock.now() - batch.due, self.held_up)
        entries = batch.entries
        for tid, launch in batch.launches.items():
            entry, at = entries[tid], launch.row.scheduled_at or batch.due
            if self.registry.get(tid) is not entry:
                gone.append(tid)  # evicted meanwhile without a cancel: not ours to run
            elif verdict == Verdict.PRUNED or (
                entry.defn.kind == Kind.CRON and self.firing.missed(entry, at, late)
            ):
                skipped.append(tid)
            elif entry.defn.kind == Kind.CRON and entry.running:
                self.firing.overlap_skipped(entry, at)
                skipped.append(tid)
            else:
                starts.append(tid)
        self._starting = True  # from the starts (their journal lines) to their notes
        try:
            # The collector waits until every program has taken its first turn: the pass
            # over all the batch built when it comes back on would otherwise come first.
            with gc_paused():
                came, began = self.clock.now(), time.perf_counter()
                runs = self.firing.start_batch(batch, starts)
                if log.isEnabledFor(logging.DEBUG):  # nothing more before the programs' turn
                    log.debug(
                        "started %d runs due at %s: from %.1f ms after it, for %.1f ms",
                        len(starts),
                        iso_time(batch.due),
                        (came - batch.due) * 1000,
                        (time.perf_counter() - began) * 1000,
                    )
                await self.firing.started(batch, starts, runs)
            self.firing.note_started(batch, starts, skipped, gone)
        finally:
            self._starting = False
        self._note_due = True
        if self._noter is None or self._noter.done():
            self._noter = asyncio.create_task(self._note_starts(), name="anyrtd-fire-note")
        return [batch.launches[tid].row.run_id for tid in starts]

    async def wait_noted(self) -> None:
        """Return once the starts so far are noted in the mirror (or their commit failed)."""
        if self._noter is not None:
            await asyncio.shield(self._noter)

    async def _note_starts(self) -> None:
        """Commit the notes of the batches started (off the timer's path, `NOTE_WAIT_S`
        after a start, one commit for the batches started meanwhile, which wakes the drain for
        the writes the notes queued); again while batches start during it."""
        while self._note_due:
            self._note_due = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(NOTE_WAIT_S):
                    await self._note_now.wait()
            await self._note_once()

    async def _note_once(self) -> None:
        """Commit the notes pending. The start journal is emptied when every id in it
        belongs to a start this commit (or an earlier one) noted: none was written during
        the commit, no batch was between its starts and their notes when it began, and the
        mirror is open (a commit on a closed one writes nothing). The commit wakes the drain
        for the writes the notes queued (`Unit.commit`)."""
        journal = self.firing.journal
        written = None if journal is None or self._starting else journal.written
        try:
            await self.unit.commit(self.clock.now())
        except CommitFailed:  # kept for the next commit; the unit says why
            written = None
        if (
            journal is None
            or not written
            or written != journal.written
            or self._starting
            or self.unit.db is None
        ):
            return
        try:
            journal.empty()
        except OSError as exc:  # it only grows: a restart reads more lines
            log.warning("cannot empty the start journal %s: %s", journal.path, exc)

    def cancel(self, trigger_id: str, why: str = "its trigger changed") -> None:
        """Cancel the prepared run of `trigger_id`, if any (`Ahead.cancel`)."""
        self.ahead.cancel(trigger_id, why)

    def cancel_all(self, why: str) -> None:
        """Cancel every prepared run (the daemon stops, or the wall clock stepped back)."""
        self.ahead.cancel_all(why)

    async def settle_open(
        self,
        rows: Iterable[RunRow],
        entries: Iterable[EntryRow],
        last_fired: dict[str, float],
        now: float,
    ) -> list[tuple[RunRow, lifecycle.Settle]]:
        """Settle the runs a crash left open (`lifecycle.settle_at_open`) and commit; return
        the others with what to do with each (`lifecycle.judge`). What a run's program left
        is the evidence: a command's marks (its supervisor's start and end,
        `anyrtd.runner.marks`), a process of it (its group kept, or a process carrying its
        run id), an in-process program's line in the start journal. A run with no evidence
        of a start never started: discarded (a `once` fires late); one whose command's end
        was noted is closed with it; one that may have started is closed as interrupted, so
        a `once` never runs twice, or run again when its program is idempotent by the run
        id.

        Committed before the record cache is filled from the mirror, which lays the trigger
        writes in the outbox over the records: a `once` that may have started is consumed
        there by then.
        """
        rows, entries = list(rows), list(entries)
        journal = self.firing.open_journal()
        journaled = journal.read() if journal is not None else set()
        runner = self.firing.runner
        marks = runner.marks
        if marks is not None:
            marks.open()
        unkept = [r.run_id for r in rows if r.process_group is None]
        live = set(run_groups(unkept)) if unkept else set()
        kinds = {e.trigger_id: e.kind for e in entries}
        how: dict[str, lifecycle.Settle] = {}
        for row in rows:
            program = runner.resolve(row.program)
            found = marks.read(row.run_id) if marks is not None else None
            kind = kinds.get(row.trigger_id) if row.trigger_id is not None else None
            how[row.run_id] = lifecycle.judge(
                row,
                command=marks is not None and program is not None and program.command is not None,
                idempotent=program is not None
                and program.idempotent
                and kind in (Kind.CRON, Kind.ONCE),
                journaled=row.run_id in journaled,
                spawned=row.process_group is not None
                or row.run_id in live
                or (found is not None and found.started_at is not None),
                ended=found is not None and found.ended is not None,
            )
        left = lifecycle.settle_at_open(self.unit, rows, entries, last_fired, how)
        await self.unit.commit(now)
        return [(row, how[row.run_id]) for row in left]


__all__ = [
    "CLEAR_STALL_S",
    "LEAD_MAX_PER_RUN_S",
    "LEAD_MAX_S",
    "LEAD_MIN_S",
    "PRECISE_S",
    "Ahead",
    "Lead",
    "Prepared",
    "Settles",
    "Timer",
    "precise_sleep",
]
