"""A run's life: its states, and the transitions that move it, each with what it writes.

```
due ─prepare─▶ prepared ─started─▶ started ─note─▶ running ─end─▶ ended (ok, FAILED, incomplete)
 │                 │                                  │
 │                 ├─cancel─▶ cancelled (no row)       └─end─▶ ended (interrupted)
 │                 └─skip─▶ (no row: a missed or overlapping cron occurrence)
 └─begin─▶ running (a run by hand, or an event's: never prepared ahead)
```

Every transition is a function here. It moves the run's row (`RunRow.state`, a
`vocab.RunState`) and writes into the unit of work it is handed (`unit.Writes`, committed
as one transaction by its caller) exactly what is listed below; the registry in memory
(the heap, the entry put back on a cancel) and the program are the firing stage's and the
timer's (`anyrtd/firing.py`, `anyrtd/timer.py`).

What each transition writes:

- `prepare` (due → prepared): the run row, `started_at` the time it is to start. Nothing
  else: the entry's re-arm and a `once`'s consumption wait for the start.
- `skip` (due or prepared → no run: a missed or overlapping cron occurrence, or one that
  already ran): the prepared row deleted, the entry's row (re-armed past it).
- `cancel` (prepared → cancelled: its trigger changed, the daemon stops, the wall clock
  stepped back, its commit failed): the row deleted, the entry's row as put back.
- `started` (prepared → started): nothing durable; the firing stage wrote the run id to
  the start journal just before the program started.
- `note` (started → running): the run row (the real `started_at`), the entry's row (a cron
  re-armed, a `once` consumed), a `once`'s consumption as a trigger write (`lastRunAt` the
  time it was to start).
- `begin` (due → running, a run by hand or an event's, never prepared): the run row; a
  chain's run (`answer`) has the id `chain.chained_run_id` gives and names its upstream.
- `end` (running → ended): the run row with its outcome, the `agent_runs` record, the
  rollup and the breaker as a trigger write, the entry's row.
- `end` with the outcome `interrupted` (running → ended `interrupted`, a run a crash left
  in flight): as `end`; no breaker count.

What a restart does with a run found in each state (`judge` tells by the evidence what
each open run is, `settle_at_open` settles it, then the firing stage closes, records or runs
again what is left: docs/reliability.md, "What a crash leaves"):

- due (no row): fires it; a `once` late, a cron re-armed from now (a past occurrence is
  missed).
- no evidence its program started (a command: no start mark of its supervisor, no process
  of it, no process group kept; an in-process program: a prepared run whose id is not in
  the start journal): it never started. Prepared, it is discarded (`discard`: the row
  deleted, the entry put back; a `once` fires late, a cron at the occurrence if still
  ahead); running (a command run by hand or an event's that was never spawned), it is
  closed as `interrupted`, saying it never started.
- a command's end noted by its supervisor: it gets `note`'s writes (a `once` consumed),
  then is closed with its real status and end time (`ended_by_marks`).
- a command with evidence of its spawn, and no end: it may have run, so it gets `note`'s
  writes, then is closed as `interrupted` after what is left of its group is stopped.
- an in-process program that may have started (in the journal, or running): a program that
  declares its effects idempotent by the run id is run again with the same run id
  (`RERUN`); any other is closed as `interrupted` (never run twice), its record saying it
  was interrupted before it could be confirmed started when it was only in the journal.
- ended: nothing; its record and rollup wait in the outbox until the server takes them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from anyrtd.chain import Answer
from anyrtd.logs import iso_time
from anyrtd.model import TriggerDef
from anyrtd.program import RunOutcome
from anyrtd.registry import Entry
from anyrtd.rows import EntryRow, RunRow
from anyrtd.runner.marks import Ended
from anyrtd.runner.run import EX_TEMPFAIL
from anyrtd.runs import SERVER_UNAVAILABLE, RollupWrite, duration_ms, rollup
from anyrtd.unit import Writes
from anyrtd.vocab import Kind, LastStatus, RollupField, RunState, RunStatus

log = logging.getLogger("anyrtd.lifecycle")

INTERRUPTED_ERROR = "the daemon stopped while the run was in flight"
"""The error an interrupted run's record carries."""
UNCONFIRMED_ERROR = (
    "the daemon stopped as the program was starting, before it could be confirmed started: "
    "it may not have run, and it is not run again (its program does not declare its effects "
    "idempotent: at most once)"
)
"""The error of an in-process run a crash left between its start journal line and its note."""
NEVER_STARTED_ERROR = (
    "the daemon stopped before the command was started: it never ran (no start mark of its "
    "supervisor, no process of it)"
)
"""The error of a command run, begun durably, that a crash left unspawned."""
OUTPUT_LOST = (
    "anyrtd: the daemon stopped while this run was in flight; its exit status and end time "
    "are the command's own, noted by its supervisor; its output was not kept\n"
)
"""The output of a run closed from its supervisor's end mark."""


class Settle(StrEnum):
    """What a restart does with a run a crash left open, by the evidence (`judge`)."""

    DISCARD = "discard"
    """Never started, still prepared: deleted, its entry put back (a `once` fires late)."""
    NEVER = "never"
    """Never started, but begun durably (by hand, an event's): closed `interrupted`."""
    ENDED = "ended"
    """A command whose supervisor noted its end: closed with its real status."""
    CLOSE = "close"
    """May have run: closed `interrupted` (a `once` never runs twice)."""
    UNCONFIRMED = "unconfirmed"
    """An in-process start not confirmed: closed `interrupted`, saying so."""
    RERUN = "rerun"
    """An in-process program idempotent by the run id: run again with the same run id."""


def judge(
    row: RunRow,
    *,
    command: bool,
    idempotent: bool,
    journaled: bool,
    spawned: bool,
    ended: bool,
) -> Settle:
    """Return what a restart does with the open run `row` (pure). `command`: its program is
    a command here; `idempotent`: an in-process program that declares its effects idempotent
    by the run id, on a trigger that is not an event's; `journaled`: its id is in the start
    journal; `spawned`: a command's evidence of a spawn (its start mark, a process of it,
    its process group kept); `ended`: its supervisor's end mark."""
    if ended:
        return Settle.ENDED
    prepared = row.state in (RunState.PREPARED, RunState.STARTED)
    if command:
        if spawned or journaled:
            return Settle.CLOSE
        return Settle.DISCARD if prepared else Settle.NEVER
    if row.state == RunState.PREPARED and not (journaled or spawned):
        return Settle.DISCARD
    if idempotent:
        return Settle.RERUN
    return Settle.UNCONFIRMED if prepared else Settle.CLOSE


def new_run_id() -> str:
    """Return a fresh run id."""
    return uuid.uuid4().hex


def consumption(at: float) -> dict[str, Any]:
    """Return the trigger fields that consume a `once` fired at `at`."""
    return {"enabled": False, RollupField.LAST_RUN_AT: at}


def prepare(w: Writes, entry: Entry, due: float, start_at: float, device: str) -> RunRow:
    """due → prepared: the run of `entry`'s occurrence `due`, to start at `start_at` (its
    due time, or now for an occurrence already late). Writes the run row only."""
    return _new_run(w, entry, due, start_at, device, RunState.PREPARED)


def begin(
    w: Writes,
    entry: Entry,
    due: float | None,
    now: float,
    device: str,
    answer: Answer | None = None,
) -> RunRow:
    """due → running, for a run never prepared ahead (by hand: `due` None; an event's: the
    message's time or the upstream run's end). Writes the run row; a chain's run (`answer`)
    takes its id and its upstream from it."""
    return _new_run(w, entry, due, now, device, RunState.RUNNING, answer)


def _new_run(
    w: Writes,
    entry: Entry,
    due: float | None,
    start_at: float,
    device: str,
    state: RunState,
    answer: Answer | None = None,
) -> RunRow:
    """Write and return the row of a new run of `entry` in `state`."""
    defn = entry.defn
    row = RunRow(
        run_id=new_run_id() if answer is None else answer.run_id,
        trigger_id=defn.id,
        program=defn.program,
        device=device,
        scheduled_at=due,
        started_at=start_at,
        state=state,
        upstream_run_id=None if answer is None else answer.upstream_run_id,
        chain_depth=0 if answer is None else answer.depth,
    )
    w.save_run(row)
    return row


def skip(w: Writes, entry: Entry, row: RunRow | None) -> None:
    """An occurrence that does not run (missed, the previous run still running, already
    run): its prepared row, if any, deleted; the entry's row (re-armed past it) written."""
    if row is not None:
        row.state = RunState.CANCELLED
        w.drop_run(row.run_id)
    w.save(entry.row)


def cancel(w: Writes, entry: Entry, row: RunRow) -> None:
    """prepared → cancelled: its trigger changed, the daemon stops, or the wall clock
    stepped back. The run row deleted; the entry's row written as the caller put it back
    (before the prepare). A prepare whose commit failed wrote nothing: it is not cancelled,
    its entries are only put back in memory (`firing.Prepared`)."""
    assert row.state == RunState.PREPARED, f"only a prepared run is cancelled, not {row.state}"
    row.state = RunState.CANCELLED
    w.drop_run(row.run_id)
    w.save(entry.row)


def started(row: RunRow, at: float) -> None:
    """prepared → started (or a run begun: its real start): the moment its program started.
    Nothing durable: the start journal, written just before, covers a crash until `note`."""
    row.started_at = at
    if row.state == RunState.PREPARED:
        row.state = RunState.STARTED


def resume(w: Writes, row: RunRow) -> None:
    """started or running → running, at a restart: a run of a program idempotent by the run
    id that a crash left ambiguous, run again with the same run id. Writes the run row
    (its entry's writes were `settle_at_open`'s)."""
    row.state = RunState.RUNNING
    w.save_run(row)


def note(w: Writes, entry: Entry, row: RunRow, due: float) -> None:
    """started → running: the start noted. Writes the run row, the entry's row (a cron
    re-armed, a `once` consumed) and a `once`'s consumption at `due`, the time its batch was
    to start (its due time, or the prepare's for a batch already late: docs/schedule.md),
    laid over the record cache.
    A run whose program already ended (a quick one, in the turn after its start) stays
    `ended`: only the entry's writes are its note's."""
    if row.state != RunState.ENDED:
        row.state = RunState.RUNNING
    w.save_run(row)
    if entry.defn.kind == Kind.ONCE:
        _consume(w, entry.row, due)
    w.save(entry.row)


def _consume(w: Writes, entry: EntryRow, at: float) -> None:
    """Consume a `once` that started at `at`: its entry's row, and its consumption as a
    trigger write laid over the record cache (the caller writes the row)."""
    entry.consumed, entry.enabled, entry.next_fire = True, False, None
    w.write_trigger(entry.trigger_id, consumption(at))


def end(
    w: Writes,
    row: RunRow,
    outcome: RunOutcome,
    entry: Entry | None,
    defn: TriggerDef | None,
) -> RollupWrite | None:
    """running → ended: the outcome in the run row, the `agent_runs` record, and (for a
    trigger's run) the rollup and the breaker, in its entry's row when it has one and as a
    trigger write. Return the rollup written (None: a run of no trigger)."""
    row.status = outcome.status
    row.started_at = outcome.started_at
    row.ended_at = outcome.ended_at
    row.duration_ms = outcome.duration_ms
    row.error_type = outcome.error_type
    row.error = outcome.error
    row.result = dict(outcome.result)
    row.output = outcome.output
    row.output_dropped = outcome.output_dropped
    row.state = RunState.ENDED
    w.save_run(row)
    w.send_run(row)
    if row.trigger_id is None:
        return None
    if entry is not None:
        before = (entry.row.consecutive_failures, entry.row.run_count)
    elif defn is not None:
        before = (defn.rollup.consecutive_failures, defn.rollup.run_count)
    else:
        before = (0, 0)
    limit = defn.max_consecutive_failures if defn is not None else 0
    armed = entry is not None and entry.row.enabled
    write = rollup(
        row,
        failures=before[0],
        run_count=before[1],
        limit=limit,
        armed=armed,
        kind=defn.kind if defn is not None else None,
        tripped_before=_tripped(entry, before[0], limit, defn),
    )
    if entry is not None:
        entry.row.consecutive_failures = write.failures
        entry.row.run_count = write.run_count
        if write.tripped:
            entry.row.enabled = False
            entry.row.next_fire = None
        w.save(entry.row)
    w.write_trigger(row.trigger_id, write.fields)
    return write


def _tripped(entry: Entry | None, failures: int, limit: int, defn: TriggerDef | None) -> bool:
    """Return whether the breaker has already switched off the trigger a run ends on: it is
    off, and its count reached the limit (only a trip turns an armed trigger off there) or
    its record says so."""
    if limit <= 0 or defn is None:
        return False
    off = not entry.row.enabled if entry is not None else not defn.enabled
    return off and (failures >= limit or defn.rollup.last_status == LastStatus.AUTO_DISABLED)


def interrupted(
    row: RunRow, now: float, note_line: str = "", error: str = INTERRUPTED_ERROR
) -> RunOutcome:
    """Return the outcome of a run a crash left in flight, for `end` (running → ended
    `interrupted`); `note_line` is added to its output, `error` says why."""
    return RunOutcome(
        status=RunStatus.INTERRUPTED,
        error_type=None,
        error=error,
        started_at=row.started_at,
        ended_at=max(now, row.started_at),
        duration_ms=duration_ms(row.started_at, now),
        result={},
        output=_with_line(row.output, note_line),
        output_dropped=row.output_dropped,
    )


def settle_at_open(
    w: Writes,
    rows: Iterable[RunRow],
    entries: Iterable[EntryRow],
    last_fired: dict[str, float],
    how: Mapping[str, Settle],
) -> list[RunRow]:
    """At a restart, before the registry is restored: settle the runs the mirror holds
    open, each as `how` says (`judge`, by run id; a run it lacks is closed). A discarded
    run never started. Any other prepared or started one gets `note`'s writes on its entry's
    row (a `once` consumed, its consumption queued), so it never runs twice. Return the runs
    left to close, record or run again (every open run but the discarded ones)."""
    by_id = {e.trigger_id: e for e in entries}
    left = []
    for row in rows:
        tid = row.trigger_id
        entry = by_id.get(tid) if tid is not None else None
        verdict = how.get(row.run_id, Settle.CLOSE)
        if verdict == Settle.DISCARD and row.state == RunState.PREPARED:
            discard(w, row, entry, last_fired)
            continue
        if row.state in (RunState.PREPARED, RunState.STARTED) and verdict != Settle.NEVER:
            row.state = RunState.STARTED
            if entry is not None and entry.kind == Kind.ONCE:
                _consume(w, entry, row.started_at)
                w.save(entry)
        left.append(row)
    return left


def ended_by_marks(row: RunRow, ended: Ended, started_at: float | None) -> RunOutcome:
    """Return the outcome of a command whose end its supervisor noted while the daemon was
    away, for `end`: its real status and end time, its start as the supervisor noted it
    (else as the row has it), and a note that its output was lost."""
    start = started_at if started_at is not None else row.started_at
    end_at = max(ended.at, start)
    status, error_type, error = RunStatus.OK, None, None
    if ended.status != 0:
        status, error_type = RunStatus.FAILED, "ExitCode"
        error = f"command {row.program!r} exited with status {ended.status}"
        if ended.status > 128:
            error += f" (or was killed by signal {ended.status - 128})"
        if ended.status == EX_TEMPFAIL:
            error_type = SERVER_UNAVAILABLE
            error += ": the program could not reach the any server"
    return RunOutcome(
        status=status,
        error_type=error_type,
        error=error,
        started_at=start,
        ended_at=end_at,
        duration_ms=duration_ms(start, end_at),
        result={},
        output=_with_line(row.output, OUTPUT_LOST),
        output_dropped=row.output_dropped,
    )


def discard(w: Writes, row: RunRow, entry: EntryRow | None, last_fired: dict[str, float]) -> None:
    """prepared → cancelled at a restart: the run never started. Its row deleted; its
    entry's row put back as before the prepare (a `once` unconsumed, so it fires, late if
    its time passed; a cron at the occurrence, so it fires if still ahead, else is
    missed)."""
    tid = row.trigger_id
    row.state = RunState.CANCELLED
    w.drop_run(row.run_id)
    if entry is not None:
        if entry.kind == Kind.ONCE:
            entry.consumed, entry.enabled, entry.next_fire = False, True, None
        elif entry.kind == Kind.CRON:
            at, armed = row.scheduled_at, entry.next_fire
            if at is not None and armed is not None:
                entry.next_fire = min(armed, at)
        w.save(entry)
    if tid is not None and last_fired.get(tid) == row.scheduled_at:
        del last_fired[tid]
    log.warning(
        "run %s of %s was prepared for %s and never started (the daemon stopped before its "
        "due time): discarded",
        row.run_id,
        tid,
        iso_time(row.started_at),
        extra={"trigger": tid, "run": row.run_id},
    )


def _with_line(output: str, line: str) -> str:
    """Return `output` with `line` added on a line of its own."""
    if line and output and not output.endswith("\n"):
        return f"{output}\n{line}"
    return output + line


__all__ = [
    "INTERRUPTED_ERROR",
    "NEVER_STARTED_ERROR",
    "OUTPUT_LOST",
    "UNCONFIRMED_ERROR",
    "Settle",
    "begin",
    "cancel",
    "consumption",
    "discard",
    "end",
    "ended_by_marks",
    "interrupted",
    "judge",
    "new_run_id",
    "note",
    "prepare",
    "resume",
    "settle_at_open",
    "skip",
    "started",
]
