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

What a restart does with a run found in each state (`settle_at_open`, then the firing
stage's `close_interrupted`):

- due (no row): fires it; a `once` late, a cron re-armed from now (a past occurrence is
  missed).
- prepared, its id not in the start journal and no process of it: it never started, so it
  is discarded (`discard`: the row deleted, the entry put back; a `once` fires late, a cron
  at the occurrence if still ahead).
- prepared with its id in the start journal (or a process of it found), or started: it may
  have run, so it gets `note`'s writes (a `once` consumed: never run twice), then is
  closed as `interrupted`.
- running: closed as `interrupted`, after what is left of its process group is stopped.
- ended: nothing; its record and rollup wait in the outbox until the server takes them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from anyrtd.chain import Answer
from anyrtd.logs import iso_time
from anyrtd.model import TriggerDef
from anyrtd.program import RunOutcome
from anyrtd.registry import Entry
from anyrtd.rows import EntryRow, RunRow
from anyrtd.runs import RollupWrite, duration_ms, rollup
from anyrtd.unit import Writes
from anyrtd.vocab import Kind, LastStatus, RollupField, RunState, RunStatus

log = logging.getLogger("anyrtd.lifecycle")

INTERRUPTED_ERROR = "the daemon stopped while the run was in flight"
"""The error an interrupted run's record carries."""


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


def interrupted(row: RunRow, now: float, note_line: str = "") -> RunOutcome:
    """Return the outcome of a run a crash left in flight, for `end` (running → ended
    `interrupted`); `note_line` is added to its output."""
    return RunOutcome(
        status=RunStatus.INTERRUPTED,
        error_type=None,
        error=INTERRUPTED_ERROR,
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
    begun: set[str],
) -> list[RunRow]:
    """At a restart, before the registry is restored: settle the runs the mirror holds
    open. A prepared run whose id is not in `begun` (the start journal's ids, and those
    with a process) never started: discarded. One that may have started, and a started
    one, gets `note`'s writes on its entry's row (a `once` consumed, its consumption
    queued), so it never runs twice. Return the runs to close as interrupted (every open
    run but the discarded ones)."""
    by_id = {e.trigger_id: e for e in entries}
    left = []
    for row in rows:
        tid = row.trigger_id
        entry = by_id.get(tid) if tid is not None else None
        if row.state == RunState.PREPARED and row.run_id not in begun:
            discard(w, row, entry, last_fired)
            continue
        if row.state in (RunState.PREPARED, RunState.STARTED):
            row.state = RunState.STARTED
            if entry is not None and entry.kind == Kind.ONCE:
                _consume(w, entry, row.started_at)
                w.save(entry)
        left.append(row)
    return left


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
    "begin",
    "cancel",
    "consumption",
    "discard",
    "end",
    "interrupted",
    "new_run_id",
    "note",
    "prepare",
    "settle_at_open",
    "skip",
    "started",
]
