"""Firing: prepare a durable run, start its program, record its outcome.

The states a run passes through, and what each transition writes, are
`anyrtd/lifecycle.py`'s; this stage drives them. A batch is prepared in a fire's own unit
of work (`Unit.fire`) and committed before any of its programs starts; a crash never fires
a `once` twice, and a run a crash left open is settled at the next start
(`lifecycle.settle_at_open`, `close_interrupted`). A fire whose preparation cannot be
committed (the disk is full) did not happen: the entries it touched are put back as they
were, and it is tried again (`retry_wait_s` spaces the tries) until the mirror takes it:
late, not lost. A batch may be prepared ahead of its due time (`prepare_batch` with a due
time after now; the timer, `anyrtd/timer.py`, decides when and starts it at its due time).
The record's `startedAt` is the moment the program really started, noted by the runner;
the fire lag is measured to it. The outcome goes to the mirror, and the run record and the
trigger's rollup to the outbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import operator
import os
import time
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Protocol

from anyrtd import lifecycle
from anyrtd.chain import Answer, UpstreamRun
from anyrtd.clock import Clock
from anyrtd.events import ChatMessage
from anyrtd.heap import gc_paused
from anyrtd.logs import iso_time
from anyrtd.metrics import Stats
from anyrtd.mirror_guard import MirrorFault
from anyrtd.model import TriggerDef
from anyrtd.program import RunOutcome
from anyrtd.records import RecordCache
from anyrtd.registry import Entry, Registry
from anyrtd.rows import EntryRow, RunRow
from anyrtd.runner import Launch, Runner
from anyrtd.runner.process import kill_group, leftover_group, process_start, run_groups
from anyrtd.runs import BREAKER_STATUSES
from anyrtd.unit import CommitFailed, Unit, Writes
from anyrtd.vocab import Kind, RunState, Verdict

log = logging.getLogger("anyrtd.firing")

CLOCK_STEP_TOLERANCE_S = 1.0
"""How far the wall clock may fall behind the monotonic clock between two looks before the
recurring entries are re-armed from the new wall time (docs/schedule.md).
Chosen (832789d): a design bound, well above the loop's own lateness; not measured."""

MISSED_AFTER_S = 5.0
"""How late (one default tick) a cron occurrence may be when the timer, held up meanwhile
(the daemon stopped, its machine paused, its loop blocked), gets to it and still fire;
later than that it is a missed occurrence, skipped and logged: a missed occurrence does not
exist (seeds). A `once` fires late whatever the delay, and so does an occurrence the timer
was not held up for (a wall clock stepped forward, a fire that could not be made durable
tried again): docs/schedule.md."""

MAX_MANUAL_RUNS = 16
"""How many manual runs (`POST /triggers/:id/run`) may be in flight at once on one daemon;
one more is refused with `TooManyRuns` (the control API's 429, docs/control-api.md).
Chosen (c94be9f): a design cap (docs/control-api.md); not measured."""


RETRY_FIRST_S = 1.0
RETRY_MAX_S = 10.0
"""A fire that could not be made durable is tried again after 1 s, then after twice the
wait each time, at most every 10 s, until the mirror takes it.
Chosen (b59cc30): a design backoff, not measured."""


class NotDurable(Exception):
    """A run not started: its preparation could not be written to the mirror."""

    def __init__(self, trigger_id: str, cause: CommitFailed) -> None:
        super().__init__(
            f"trigger {trigger_id!r} was not started: its run could not be written to the "
            f"mirror ({cause}); nothing was recorded, free space for the state directory "
            "and run it again"
        )


class CannotRun(Exception):
    """A manual run refused: it could only fail on this device (docs/control-api.md)."""

    def __init__(self, trigger_id: str, why: str) -> None:
        super().__init__(
            f"trigger {trigger_id!r} cannot be run by hand on this device, it could only "
            f"fail: {why}"
        )


class TooManyRuns(Exception):
    """A manual run refused: `MAX_MANUAL_RUNS` are in flight already."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"{limit} manual runs are already in flight on this daemon (the most it starts "
            "at once): wait for one to end, then run it again"
        )
        self.limit = limit


START_JOURNAL_FILE = "anyrtd.starts"
"""The start journal's file, beside the mirror."""


class NotesSkips(Protocol):
    """What takes note of the occurrences skipped after a stall: the missed watch's
    `Skips` (anyrtd/missed.py), which lists them as missed ones."""

    def note(self, trigger_id: str, due: float, until: float) -> None: ...


class StartJournal:
    """The ids of the runs prepared ahead whose programs began to start, one per line.

    A run prepared ahead is durable before its due time but its start is noted in the
    mirror only after it (nothing durable is written between the due time and the start).
    So each id is appended here just before its program starts (the in-process call, or
    the command's spawn), with no fsync: a killed process's write stays in the page cache.
    After a crash, a run still marked prepared whose id is here may have started (closed as
    interrupted: a `once` never runs twice); one whose id is not never did (discarded: a
    `once` fires late). Only a power loss in the instant after a start can lose a line;
    that run is then taken for one that never started (docs/schedule.md). Emptied once
    every start written is noted in the mirror.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.written = 0
        """How many ids were written since the journal was last emptied."""
        self._fd: int | None = None

    def read(self) -> set[str]:
        """Return the run ids written (none when the file is missing or unreadable)."""
        try:
            return set(self.path.read_text(encoding="ascii", errors="replace").split())
        except OSError:
            return set()

    def note(self, run_id: str) -> None:
        """Write that the program of run `run_id` starts now."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(self._fd, f"{run_id}\n".encode("ascii"))
        self.written += 1

    def empty(self) -> None:
        """Forget every id written (their starts are noted in the mirror)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.ftruncate(self._fd, 0)
        self.written = 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Firing:
    """Starts runs of registry entries and records how they end."""

    def __init__(
        self,
        *,
        registry: Registry,
        records: RecordCache,
        unit: Unit,
        runner: Runner,
        stats: Stats,
        clock: Clock,
        skips: NotesSkips,
        by_hand: Callable[[str], str | None] = lambda _program: None,
    ) -> None:
        self.registry = registry
        self.records = records
        self.unit = unit
        self.runner = runner
        self.stats = stats
        self.clock = clock
        self.skips = skips
        """The stretches skipped after a stall, for the missed watch (docs/notices.md)."""
        self.by_hand = by_hand
        """Why a run by hand of a program could only fail here (`Runner.by_hand`), or None."""
        self.in_flight: set[asyncio.Task[None]] = set()
        """The tasks of the runs started and not yet recorded."""
        self.manual_runs = 0
        """Manual runs in flight, or being prepared (at most `MAX_MANUAL_RUNS`)."""
        self._clock_mark: tuple[float, float] | None = None
        """(wall, monotonic) at the last look, to notice a wall clock stepped back."""
        self._retry_at: float | None = None
        """Monotonic time before which a fire that failed to commit is not tried again."""
        self._retry_s = 0.0
        self.last_commit_s = 0.0
        """How long the last commit of a fire's preparation took."""
        self.journal: StartJournal | None = None
        """Beside the mirror, once it is open (`open_journal`)."""
        self._note_at_start: dict[str, tuple[Entry, float]] = {}
        """The runs of a batch noted before their program began (a command spawns in its
        run's task, after the batch's note), by run id, with their entry and due time: each
        is noted at its own start (`_started`), or at its end if it never started."""

    async def settle(self, grace_s: float, hurry: asyncio.Event) -> set[asyncio.Task[Any]]:
        """Wait up to `grace_s` for the runs in flight, or until `hurry` is set; return the
        runs still in flight."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        pending: set[asyncio.Task[Any]] = set(self.in_flight)
        cut = asyncio.create_task(hurry.wait())
        try:
            while pending and not hurry.is_set() and (left := deadline - loop.time()) > 0:
                _, pending = await asyncio.wait(
                    pending | {cut}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(cut)
        finally:
            cut.cancel()
        return pending

    async def wait_idle(self) -> None:
        """Return once no run is in flight (runs started meanwhile are waited for too)."""
        while self.in_flight:
            await asyncio.wait(set(self.in_flight))

    # firing

    def clock_step(self) -> float:
        """Return how far the wall clock stepped back since the last look (its advance
        against the monotonic clock's), when by more than the tolerance; else 0.0. The timer
        then cancels the runs it prepared under the later clock and calls `pull_back`."""
        wall, mono = self.clock.now(), self.clock.monotonic()
        mark, self._clock_mark = self._clock_mark, (wall, mono)
        if mark is None:
            return 0.0
        step = (mono - mark[1]) - (wall - mark[0])
        return step if step > CLOCK_STEP_TOLERANCE_S else 0.0

    def pull_back(self, step: float) -> None:
        """Re-arm every recurring entry from now: the wall clock stepped back by `step`."""
        assert self._clock_mark is not None, "pull_back comes after clock_step"
        wall = self._clock_mark[0]
        moved = [e for e in self.registry.entries.values() if self.registry.pull_back(e, wall)]
        for entry in moved:
            self.unit.save(entry.row)
        log.warning(
            "the wall clock stepped back %.1f s: %d recurring triggers re-armed from %s",
            step,
            len(moved),
            iso_time(wall),
        )

    def open_journal(self) -> StartJournal | None:
        """Open the start journal beside the mirror, once the mirror is open; return it."""
        if self.journal is None and (db := self.unit.db) is not None:
            self.journal = StartJournal(db.mirror.path.parent / START_JOURNAL_FILE)
        return self.journal

    def close_journal(self) -> None:
        """Close the start journal (the daemon stops)."""
        if self.journal is not None:
            self.journal.close()

    def take_back(self, batch: Prepared, trigger_id: str) -> Launch | None:
        """Cancel the prepared run of `trigger_id` in `batch`, which never started (its
        trigger changed, or the timer cancels the batch): its entry put back as it was before
        the prepare, its row deleted (`lifecycle.cancel`), its fire uncounted. Return it
        (None: the batch has no run of that trigger)."""
        launch = batch.launches.pop(trigger_id, None)
        if launch is None:
            return None
        entry = batch.take_back_one(trigger_id, self.registry)
        if entry is not None:
            lifecycle.cancel(self.unit, entry, launch.row)
        self.stats.fires -= 1
        return launch

    async def prepare_batch(
        self, due: float, now: float, device: str | None, verdict: str, held_up: float = 0.0
    ) -> Prepared | None:
        """Prepare every entry due at or before `due`, make its run ready to start
        (`Runner.ready`), and commit the batch in one transaction; return it (None: nothing
        due, or the commit failed and the batch was taken back). Its runs are `prepared`, to
        start at `due` (or `now` for a batch already late); nothing else is written until
        their starts are noted (`Timer.start`, `note_started`). `held_up`: as `prepare` takes
        it.

        The garbage collector waits while a batch is prepared: a full collection in the
        middle of a burst would hold up every program after it.
        """
        popped = self.registry.pop_due(due)
        if not popped:
            return None
        batch = Prepared.of(due, [entry for entry, _ in popped], self.registry)
        fire = self.unit.fire()
        with gc_paused():
            for entry, at in popped:
                row = self.prepare(
                    fire, entry, at, now, device, verdict, ahead=True, held_up=held_up
                )
                if row is not None:
                    batch.launches[entry.id] = self._launch(row, dict(entry.defn.args))
        if not await self._made_durable(fire, now, batch):
            return None
        return batch

    def start_batch(
        self, batch: Prepared, tids: list[str]
    ) -> list[Coroutine[Any, Any, RunOutcome]]:
        """Start the programs of the runs of `batch` for `tids` (`Runner.go`), before
        anything else is done for any of them; in-process programs all begin at the loop's
        next turn (no disk or network work comes between), each run's id written to the
        start journal just before its program starts (`_started`). Return each run's rest,
        for `started` to follow once the programs had their turn. The caller keeps the
        garbage collector paused until that turn (`anyrtd/heap.py`)."""
        go, launches = self.runner.go, batch.launches
        runs = [go(launches[tid]) for tid in tids]
        began = self.registry.began
        for tid in tids:
            began(tid)
        return runs

    async def started(
        self, batch: Prepared, tids: list[str], runs: list[Coroutine[Any, Any, RunOutcome]]
    ) -> None:
        """Let the programs of a batch just started take their turn, then follow each run
        to its end in a task of its own, and log them."""
        launches = batch.launches
        try:
            await asyncio.sleep(0)  # the programs' turn comes first
        finally:
            for tid, ended in zip(tids, runs, strict=True):
                self._track(tid, launches[tid].row, ended)
            for tid in tids:
                self._log_firing(tid, launches[tid].row)

    def retry_wait_s(self) -> float:
        """Return how long the timer waits before it tries again a fire whose commit failed
        (0.0: no wait; none once the mirror was written again meanwhile)."""
        if self._retry_at is None:
            return 0.0
        if self.unit.failing is None:
            self._retry_at = None
            return 0.0
        return max(0.0, self._retry_at - self.clock.monotonic())

    async def _made_durable(self, fire: Writes, now: float, batch: Prepared) -> bool:
        """Commit a fire's preparation; on failure take it back and space the next try."""
        began = time.perf_counter()
        try:
            await self.unit.commit_fire(fire, now)
        except CommitFailed:
            self._take_back_all(batch)
            self._retry_s = min(RETRY_MAX_S, self._retry_s * 2 or RETRY_FIRST_S)
            self._retry_at = self.clock.monotonic() + self._retry_s
            log.debug(
                "%d fires wait for the mirror: tried again in %g s",
                len(batch.entries),
                self._retry_s,
            )
            return False
        self._retry_at, self._retry_s = None, 0.0
        self.last_commit_s = time.perf_counter() - began
        return True

    async def run_now(self, trigger_id: str, device: str | None, verdict: str) -> str | None:
        """Run a registry entry now, outside its schedule; return the run id. Raise
        `CannotRun` when the run could only fail here (its program runs only on an event,
        or is not installed), `TooManyRuns` when `MAX_MANUAL_RUNS` manual runs are in
        flight already, and `NotDurable` when the run could not be written to the mirror."""
        entry = self.registry.get(trigger_id)
        if entry is None:
            return None
        if (why := self.refusal(entry)) is not None:
            raise CannotRun(trigger_id, why)
        if self.manual_runs >= MAX_MANUAL_RUNS:
            raise TooManyRuns(MAX_MANUAL_RUNS)
        self.manual_runs += 1  # the slot is taken from here: the commit below awaits
        task: asyncio.Task[None] | None = None
        try:
            now = self.clock.now()
            batch = Prepared.of(now, [entry], self.registry)
            fire = self.unit.fire()
            row = self.prepare(fire, entry, None, now, device, verdict)
            if row is None:
                return None
            batch.launches[entry.id] = launch = self._launch(row, dict(entry.defn.args))
            try:
                await self.unit.commit_fire(fire, now)
            except CommitFailed as exc:
                self._take_back_all(batch)
                raise NotDurable(trigger_id, exc) from exc
            task = self.spawn(entry.id, launch)
            return row.run_id
        finally:
            if task is None:
                self.manual_runs -= 1
            else:
                task.add_done_callback(self._manual_ended)

    def refusal(self, entry: Entry) -> str | None:
        """Return why a run by hand of `entry` could only fail here, or None."""
        return self.by_hand(entry.defn.program)

    def _manual_ended(self, _task: asyncio.Task[None]) -> None:
        self.manual_runs -= 1

    async def fire_event(
        self, entry: Entry, message: ChatMessage, now: float, device: str | None, verdict: str
    ) -> asyncio.Task[None] | None:
        """Start the run of an event trigger for `message`; return its task (None: not
        started, also when its run could not be written to the mirror)."""
        # The run serves the message: its scheduledAt is the message's createdAt.
        at = message.created_at if message.created_at is not None else now
        batch = Prepared.of(at, [entry], self.registry)
        fire = self.unit.fire()
        row = self.prepare(fire, entry, at, now, device, verdict)
        if row is None:
            return None
        args = dict(entry.defn.args)
        args["event"] = message.payload()
        batch.launches[entry.id] = launch = self._launch(row, args)
        try:
            await self.unit.commit_fire(fire, now)
        except CommitFailed:
            self._take_back_all(batch)
            log.warning(
                "not firing %s for a chat message: its run could not be written to the mirror",
                entry.id,
                extra={"trigger": entry.id},
            )
            return None
        return self.spawn(entry.id, launch)

    async def fire_chain(
        self,
        entry: Entry,
        upstream: UpstreamRun,
        answer: Answer,
        event: dict[str, Any],
        now: float,
        device: str | None,
        verdict: str,
    ) -> asyncio.Task[None] | None:
        """Start the run of a chain answering `upstream` (its id and depth in `answer`), with
        `event` in its args; return its task (None: not started, also when its run could not
        be written to the mirror)."""
        # The run serves the upstream run: its scheduledAt is when that run ended.
        at = upstream.ended_at if upstream.ended_at is not None else now
        batch = Prepared.of(at, [entry], self.registry)
        fire = self.unit.fire()
        row = self.prepare(fire, entry, at, now, device, verdict, answer=answer)
        if row is None:
            return None
        args = dict(entry.defn.args)
        args["event"] = event
        batch.launches[entry.id] = launch = self._launch(row, args)
        try:
            await self.unit.commit_fire(fire, now)
        except CommitFailed:
            self._take_back_all(batch)
            log.warning(
                "not firing %s for run %s: its run could not be written to the mirror",
                entry.id,
                upstream.run_id,
                extra={"trigger": entry.id},
            )
            return None
        return self.spawn(entry.id, launch)

    def prepare(
        self,
        w: Writes,
        entry: Entry,
        due: float | None,
        now: float,
        device: str | None,
        verdict: str,
        *,
        ahead: bool = False,
        held_up: float = 0.0,
        answer: Answer | None = None,
    ) -> RunRow | None:
        """Make the run of `entry` due at `due` (None: by hand) in the fire's unit of work
        `w`, and re-arm a cron in the registry; return its row, or None when it does not run.

        `ahead`: prepared in a batch (`prepare_batch`), the run is `prepared`
        (`lifecycle.prepare`) and waits for its start, at its due time or at once when
        late; a cron's overlap is then judged when it starts, and the entry's re-arm and a
        `once`'s consumption are written when the start is noted (`note_started`). Else the
        run is `running` at once (`lifecycle.begin`: by hand, or an event's).

        `held_up`: how long the timer was held up before it came to this (the daemon was
        stopped): a cron occurrence that passed more than `MISSED_AFTER_S` ago meanwhile
        is a missed one, not fired.

        `answer`: the run is a chain's, answering an upstream run (`fire_chain`).
        """
        defn = entry.defn
        assert device is not None
        if due is not None:
            if verdict == Verdict.PRUNED:
                log.info(
                    "not firing %s: this device is pruned", defn.id, extra={"trigger": defn.id}
                )
                entry.row.next_fire = None
                return None
            if defn.kind == Kind.CRON:
                self.registry.arm(entry, max(now, due))
                if self.missed(entry, due, min(now - due, held_up)):
                    lifecycle.skip(w, entry, None)
                    return None
                if entry.running and not ahead:
                    self.overlap_skipped(entry, due)
                    lifecycle.skip(w, entry, None)
                    return None
                if self.registry.refire(defn.id, due):
                    log.info(
                        "not firing %s at %s again: that occurrence already ran "
                        "(the wall clock stepped back)",
                        defn.id,
                        iso_time(due),
                        extra={"trigger": defn.id},
                    )
                    lifecycle.skip(w, entry, None)
                    return None
            elif defn.kind == Kind.ONCE:
                # Not due again; consumed when its start is noted (a cancel before it puts
                # the entry back, a crash before it is told by the start journal).
                entry.row.next_fire = None
        self.stats.fires += 1
        if ahead and due is not None:
            row = lifecycle.prepare(w, entry, due, max(due, now), device)
        else:
            row = lifecycle.begin(w, entry, due, now, device, answer)
        return row

    def missed(self, entry: Entry, due: float, late: float) -> bool:
        """Return whether the cron occurrence `due` of `entry`, come to `late` seconds after
        its time while the timer was held up, is a missed one (later than `MISSED_AFTER_S`),
        and log it."""
        if late <= MISSED_AFTER_S:
            return False
        self.stats.missed_skips += 1
        self.skips.note(entry.id, due, self.clock.now())
        log.info(
            "skipped %s at %s: missed by %.1f s (the daemon was stopped or its machine "
            "paused); a missed occurrence does not fire late",
            entry.id,
            iso_time(due),
            late,
            extra={"trigger": entry.id},
        )
        return True

    def overlap_skipped(self, entry: Entry, due: float) -> None:
        """Count and log a cron occurrence skipped: the previous run still runs."""
        self.stats.overlap_skips += 1
        self.stats.overlap_by_trigger[entry.id] += 1
        log.info(
            "skipped %s at %s: the previous run is still running",
            entry.id,
            iso_time(due),
            extra={"trigger": entry.id},
        )

    def note_started(
        self, batch: Prepared, started: list[str], skipped: list[str], gone: list[str]
    ) -> None:
        """Note in the step's unit of work the runs of a prepared batch that `started`
        (`lifecycle.note`), skip those that did not run (`lifecycle.skip`: missed, the
        previous run still running, or this device pruned meanwhile) and delete the rows of
        those whose entry was evicted meanwhile (`gone`), all by trigger id. A run whose
        program has not begun yet (a command, spawned in its run's task after this) is noted
        when it begins (`_started`), or when it ends if it never does: until then nothing
        durable says it started, so a kill meanwhile finds it prepared and its `once` not
        consumed."""
        entries, launches, due = batch.entries, batch.launches, batch.due
        for tid in started:
            row = launches[tid].row
            if row.state == RunState.PREPARED:  # not begun yet: noted when it begins
                self._note_at_start[row.run_id] = (entries[tid], due)
            else:
                lifecycle.note(self.unit, entries[tid], row, due)
        for tid in skipped:
            lifecycle.skip(self.unit, entries[tid], launches[tid].row)
        for tid in gone:
            self.unit.drop_run(launches[tid].row.run_id)
        self.stats.fires -= len(skipped) + len(gone)

    def spawn(self, trigger_id: str, launch: Launch) -> asyncio.Task[None]:
        """Start the program of a run of `trigger_id` made durable at once (by hand, or an
        event's); return its task."""
        ended = self.runner.go(launch)
        self.registry.began(trigger_id)
        task = self._track(trigger_id, launch.row, ended)
        self._log_firing(trigger_id, launch.row)
        return task

    def _launch(self, row: RunRow, args: dict[str, Any]) -> Launch:
        """Make the run of `row` ready to start with `args` (`Runner.ready`): its start noted
        by `_started` (with the start journal for a prepared run of an in-process program,
        or of any program when commands run without their supervisor), a command's process
        group kept by `_keep_group`, which notes a command's start once it is spawned."""
        command = self._is_command(row.program)
        marked = command and self.runner.marks is not None
        journal = self.journal if row.state == RunState.PREPARED and not marked else None
        return self.runner.ready(
            row,
            args,
            on_start=functools.partial(self._started, row, journal, command),
            on_spawn=functools.partial(self._keep_group, row),
        )

    def _is_command(self, spec: str) -> bool:
        """Return whether `spec` names a command program here."""
        try:
            program = self.runner.resolve(spec)
        except Exception:  # the runner reports it when the run starts
            return False
        return program is not None and program.command is not None

    def _take_back_all(self, batch: Prepared) -> None:
        """Put back every entry a fire whose commit failed took, and uncount its runs."""
        batch.take_back_all(self.registry)
        self.stats.fires -= len(batch.launches)
        batch.launches.clear()

    def _log_firing(self, trigger_id: str, row: RunRow) -> None:
        log.info(
            "firing %s (%s)%s",
            trigger_id,
            row.program,
            "" if row.scheduled_at is not None else " by hand",
            extra={"trigger": trigger_id, "run": row.run_id},
        )

    def _track(
        self, trigger_id: str, row: RunRow, ended: Coroutine[Any, Any, RunOutcome]
    ) -> asyncio.Task[None]:
        """Await a started run to its end in a task of its own, then record it (the caller
        counted it as begun: `Registry.began`)."""
        task = asyncio.create_task(self._run(trigger_id, row, ended), name=f"run-{row.run_id}")
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)
        return task

    async def _run(
        self, trigger_id: str, row: RunRow, ended: Coroutine[Any, Any, RunOutcome]
    ) -> None:
        try:
            outcome = await ended
        finally:
            self.registry.ended(trigger_id)
        if (late := self._note_at_start.pop(row.run_id, None)) is not None:
            lifecycle.note(self.unit, late[0], row, late[1])  # it never began: noted now
        self.record_outcome(row, outcome, entry=self.registry.get(trigger_id))
        unrecorded = ""
        try:
            await self.unit.commit(self.clock.now())
        except CommitFailed:  # kept for the next commit that works
            pass
        except MirrorFault:  # `anyrtd serve` stops on it and says why, once: only this run's end
            unrecorded = "; not recorded: the mirror cannot be used (the daemon stops)"
        else:
            if (marks := self.runner.marks) is not None and row.process_group is not None:
                marks.clear(row.run_id)  # its outcome is in the mirror now
        log.log(
            logging.WARNING if outcome.status in BREAKER_STATUSES or unrecorded else logging.INFO,
            "run %s of %s ended %s%s%s",
            row.run_id,
            row.trigger_id,
            outcome.status,
            f" ({outcome.error_type}: {outcome.error})" if outcome.error_type else "",
            unrecorded,
            extra={"trigger": row.trigger_id, "run": row.run_id},
        )

    def _started(self, row: RunRow, journal: StartJournal | None, command: bool, at: float) -> None:
        """Note the moment a run's program really starts (the runner calls it just before
        the in-process call, or the command's spawn): for a prepared run of an in-process
        program its id in the start journal, then its `startedAt`, its note when its batch
        was noted before it began (an in-process program: a command's note waits for its
        spawn, `_keep_group`), and its fire lag. Written one by one: an id in the journal is
        taken for a run that may have started, so none is written before its own start (a
        batch's ids written at once lost the `once`s of the programs not yet started when a
        kill came)."""
        if journal is not None:
            try:
                journal.note(row.run_id)
            except OSError as exc:  # it starts anyway: a crash now may take it for unstarted
                log.warning(
                    "cannot write the start journal %s: %s",
                    journal.path,
                    exc,
                    extra={"trigger": row.trigger_id, "run": row.run_id},
                )
        lifecycle.started(row, at)
        if not command and (late := self._note_at_start.pop(row.run_id, None)) is not None:
            lifecycle.note(self.unit, late[0], row, late[1])
        if row.scheduled_at is not None:
            self.stats.fire_lag.observe(max(0.0, at - row.scheduled_at))

    async def _keep_group(self, row: RunRow, pgid: int) -> None:
        """Note a command's start once it is spawned (when its batch was noted before it
        began: nothing durable says a command started before its spawn, so a kill before it
        finds it prepared and without a start mark, never started), and keep its process
        group in its run's row, for a restart after a crash."""
        if (late := self._note_at_start.pop(row.run_id, None)) is not None:
            lifecycle.note(self.unit, late[0], row, late[1])
        row.process_group = pgid
        row.process_start = process_start(pgid)
        self.unit.save_run(row)
        try:
            await self.unit.commit(self.clock.now())
        except CommitFailed:  # the unit said why; the next commit that works writes the row
            pass
        except Exception as exc:  # the run goes on; the next commit writes the row
            log.warning(
                "run %s: cannot keep its process group %d in the mirror yet: %s",
                row.run_id,
                pgid,
                exc,
                extra={"trigger": row.trigger_id, "run": row.run_id},
            )

    # ending

    async def close_interrupted(
        self, rows: Iterable[RunRow | tuple[RunRow, lifecycle.Settle]], now: float
    ) -> list[RunRow]:
        """Close the runs a crash left open, each as its verdict says (`lifecycle.judge`; a
        bare row: `CLOSE`), first stopping what is left of their commands' process groups
        (SIGTERM, then SIGKILL after the grace): a command whose supervisor noted its end
        with its real status and end time, any other as `interrupted`, its error saying
        whether it may have run, was not confirmed started or never started. Return the
        runs to run again (`RERUN`: `rerun`)."""
        judged = [r if isinstance(r, tuple) else (r, lifecycle.Settle.CLOSE) for r in rows]
        again = [row for row, how in judged if how == lifecycle.Settle.RERUN]
        judged = [(row, how) for row, how in judged if how != lifecycle.Settle.RERUN]
        closing = [row for row, _ in judged]
        # A run whose group was not kept yet, or kept without its start time (the command
        # had exited before it was read), is found by the run id in its environment.
        unsure = [r.run_id for r in closing if r.process_group is None or r.process_start is None]
        unkept = run_groups(unsure) if unsure else {}
        notes = await asyncio.gather(
            *(self._stop_leftover(row, unkept.get(row.run_id, set())) for row in closing)
        )
        marks = self.runner.marks
        for (row, how), note in zip(judged, notes, strict=True):
            found = marks.read(row.run_id) if marks is not None else None
            extra = {"trigger": row.trigger_id, "run": row.run_id}
            ended = found.ended if found is not None else None
            if ended is not None and (how == lifecycle.Settle.ENDED or not note):
                # Its end was noted before anything here stopped it (the group was empty).
                assert found is not None
                outcome = lifecycle.ended_by_marks(row, ended, found.started_at)
                log.warning(
                    "run %s of %s ended while the daemon was stopped: recorded %s from its "
                    "supervisor's end mark",
                    row.run_id,
                    row.trigger_id,
                    outcome.status,
                    extra=extra,
                )
            else:
                error = _CLOSE_ERRORS.get(how, lifecycle.INTERRUPTED_ERROR)
                outcome = lifecycle.interrupted(row, now, note, error)
                log.warning(
                    "run %s of %s was left open by a crash: closed as interrupted (%s)",
                    row.run_id,
                    row.trigger_id,
                    _CLOSE_WHY.get(how, "it may have run"),
                    extra=extra,
                )
            entry = self.registry.get(row.trigger_id) if row.trigger_id is not None else None
            self.record_outcome(row, outcome, entry=entry)
        return again

    def rerun(self, rows: Iterable[RunRow], now: float) -> list[asyncio.Task[None]]:
        """Run again, with the same run id, the runs a crash left ambiguous whose program
        declares its effects idempotent by the run id (`lifecycle.Settle.RERUN`): each is
        `running` in the step's unit of work (a crash before its end runs it again), then
        started at once. One whose trigger or program is gone is closed as `interrupted`.
        Return their tasks."""
        tasks = []
        for row in rows:
            tid = row.trigger_id
            entry = self.registry.get(tid) if tid is not None else None
            defn = entry.defn if entry is not None else None
            if defn is None and tid is not None:
                parsed = self.records.parsed.get(tid)
                defn = parsed if isinstance(parsed, TriggerDef) else None
            program = self.runner.resolve(row.program)
            if defn is None or tid is None or program is None or not program.idempotent:
                self.record_outcome(
                    row,
                    lifecycle.interrupted(row, now, error=lifecycle.UNCONFIRMED_ERROR),
                    entry=entry,
                )
                continue
            lifecycle.resume(self.unit, row)
            log.warning(
                "run %s of %s was left open by a crash: run again with the same run id "
                "(%s declares its effects idempotent by the run id)",
                row.run_id,
                tid,
                row.program,
                extra={"trigger": tid, "run": row.run_id},
            )
            self.stats.fires += 1
            tasks.append(self.spawn(tid, self._launch(row, dict(defn.args))))
        return tasks

    async def _stop_leftover(self, row: RunRow, found: set[int]) -> str:
        """Stop the process groups a crash left running for `row` (its kept group when its
        start time was kept too, else those `found` by its run id); return a note for its
        output."""
        extra = {"trigger": row.trigger_id, "run": row.run_id}
        groups = sorted(found)
        if (pgid := row.process_group) is not None and row.process_start is not None:
            groups = [pgid] if leftover_group(pgid, row.process_start) else []
        grace = self.runner.kill_grace_s
        counts = await asyncio.gather(*(kill_group(g, grace) for g in groups))
        stopped = ", ".join(
            f"process group {g}, {n} process(es)" for g, n in zip(groups, counts, strict=True) if n
        )
        if not stopped:
            return ""
        log.warning(
            "run %s of %s: its program was still running after the crash (%s): stopped it "
            "(SIGTERM, then SIGKILL after %g s)",
            row.run_id,
            row.trigger_id,
            stopped,
            grace,
            extra=extra,
        )
        return (
            "anyrtd: the program was still running when the daemon started again; it was "
            f"stopped ({stopped})\n"
        )

    def record_outcome(self, row: RunRow, outcome: RunOutcome, entry: Entry | None) -> None:
        """Close a run (`lifecycle.end`) in the step's unit of work: its summary in the
        mirror, its record and the rollup in the outbox."""
        defn = entry.defn if entry is not None else None
        if defn is None and row.trigger_id is not None:
            parsed = self.records.parsed.get(row.trigger_id)
            defn = parsed if isinstance(parsed, TriggerDef) else None
        write = lifecycle.end(self.unit, row, outcome, entry, defn)
        self.stats.runs_finished[outcome.status] += 1
        if write is not None and write.tripped and entry is not None:
            log.error(
                "%s auto-disabled after %d consecutive failures",
                row.trigger_id,
                write.failures,
                extra={"trigger": row.trigger_id, "run": row.run_id},
            )


@dataclasses.dataclass(slots=True)
class Prepared:
    """Runs of one due time made durable in one commit, before their start: by trigger id,
    each run's launch (its row and args, made ready: `Runner.ready`) and the entry it fires;
    and what the fire changed in those entries, to put back when the commit fails or a run
    is cancelled before its start. A run fired at once (by hand, an event's) is a batch of
    one."""

    due: float
    entries: dict[str, Entry]
    """Each entry the fire took from the registry (with or without a run), by trigger id."""
    launches: dict[str, Launch] = dataclasses.field(default_factory=dict)
    """The runs to start, by trigger id (a run cancelled meanwhile is taken out)."""
    _before: dict[str, tuple[tuple[Any, ...], float | None]] = dataclasses.field(
        default_factory=dict
    )
    """Each entry's row values before the fire (`_ENTRY_FIELDS` order) and its last fired
    occurrence, to put back."""

    @classmethod
    def of(cls, due: float, entries: list[Entry], registry: Registry) -> Prepared:
        """Return an empty batch for `due` that can put `entries` back as they are now."""
        last_fired = registry.last_fired
        return cls(
            due,
            {e.id: e for e in entries},
            _before={e.id: (_row_values(e.row), last_fired.get(e.id)) for e in entries},
        )

    def take_back_all(self, registry: Registry) -> None:
        """Put every entry back as it was, due at the time it was due."""
        for tid in list(self._before):
            self.take_back_one(tid, registry)

    def take_back_one(self, trigger_id: str, registry: Registry) -> Entry | None:
        """Put one entry back as it was (due again); return it."""
        before = self._before.pop(trigger_id, None)
        if before is None:
            return None
        entry = self.entries[trigger_id]
        values, at = before
        for f, value in zip(_ENTRY_FIELDS, values, strict=True):
            setattr(entry.row, f, value)
        if registry.get(entry.id) is entry:
            registry.schedule(entry)
        if at is None:
            registry.last_fired.pop(trigger_id, None)
        else:
            registry.last_fired[trigger_id] = at
        return entry


_CLOSE_ERRORS = {
    lifecycle.Settle.UNCONFIRMED: lifecycle.UNCONFIRMED_ERROR,
    lifecycle.Settle.NEVER: lifecycle.NEVER_STARTED_ERROR,
}
_CLOSE_WHY = {
    lifecycle.Settle.UNCONFIRMED: "its start was not confirmed; it is not run again",
    lifecycle.Settle.NEVER: "its command was never started",
    lifecycle.Settle.ENDED: "its end mark was not readable after its group was stopped",
}

_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(EntryRow))
_row_values = operator.attrgetter(*_ENTRY_FIELDS)
"""An entry row's values, in `_ENTRY_FIELDS` order (a copy costs about 6 µs, this 0.4)."""


__all__ = [
    "MAX_MANUAL_RUNS",
    "MISSED_AFTER_S",
    "START_JOURNAL_FILE",
    "CannotRun",
    "Firing",
    "NotDurable",
    "Prepared",
    "StartJournal",
    "TooManyRuns",
]
