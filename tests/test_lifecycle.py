"""A run's life (anyrtd/lifecycle.py): each transition, from each state it leaves, as a
table of what it writes; and what a restart does with a run found in each state.

The writes are read from the unit of work each transition is handed (`unit.Writes`): the
run rows saved (with the state they were saved in), the rows deleted, the entry rows, and
the writes for the server. A mirror test at the end runs a whole life through a real
SQLite mirror and reads the `state` column."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from anyrtd import lifecycle
from anyrtd.mirror import Mirror
from anyrtd.model import TriggerDef
from anyrtd.program import RunOutcome
from anyrtd.records import RecordCache
from anyrtd.registry import Entry, new_row
from anyrtd.rows import EntryRow, RunRow
from anyrtd.unit import Writes
from anyrtd.vocab import OPEN_STATES, Kind, RollupField, RunState, RunStatus

DUE = 1_800_000_000.0
PEER = "peer-a"


def record(kind: str) -> dict[str, Any]:
    spec = {"at": DUE} if kind == Kind.ONCE else {"every_s": 60}
    return {
        "id": kind,
        "_v": 1,
        "name": kind,
        "kind": kind,
        "spec": spec,
        "program": "x:y@v1",
        "owner": PEER,
        "enabled": True,
        "maxConsecutiveFailures": 2,
    }


def stage(kind: str) -> tuple[Writes, Entry, RecordCache]:
    records = RecordCache()
    records.put(record(kind))
    defn = records.parsed[kind]
    assert isinstance(defn, TriggerDef)
    entry = Entry(defn, new_row(defn, DUE - 100, claimed=False))
    entry.row.next_fire = DUE + 60 if kind == Kind.CRON else None  # the registry re-armed it
    return Writes(records), entry, records


def saved_states(w: Writes) -> list[str]:
    """The state each run row was in when it was written (the rows are copies)."""
    return [r.state for r in w.batch.runs]


def writes_of(w: Writes) -> dict[str, Any]:
    """What a unit of work holds, in the words of the transition table."""
    return {
        "runs": saved_states(w),
        "dropped": len(w.batch.drop_runs),
        "entries": [(e.consumed, e.enabled) for e in w.batch.entries],
        "server": sorted((write.dataset, tuple(sorted(write.fields))) for write in w.batch.outbox),
    }


class Snapshots(Writes):
    """A unit of work that keeps a copy of each row as it was written."""

    def save_run(self, row: RunRow) -> None:
        super().save_run(dataclasses.replace(row))

    def save(self, row: EntryRow) -> None:
        super().save(dataclasses.replace(row))


def snapshots(records: RecordCache) -> Snapshots:
    return Snapshots(records)


def ok(row: RunRow) -> RunOutcome:
    return RunOutcome(RunStatus.OK, None, None, row.started_at, row.started_at + 1, 1000)


def failed(row: RunRow) -> RunOutcome:
    return RunOutcome(RunStatus.FAILED, "E", "no", row.started_at, row.started_at + 1, 1000)


CONSUME = ("triggers", ("enabled", RollupField.LAST_RUN_AT.value))
# ------------------------------------------------------------------------ the table

# (transition, kind) → (the state after, what it writes). "server" lists the datasets and
# field names of the writes for the server; an ended run's `agent_runs` record is one
# write to `runs` and its rollup one to `triggers`.
TRANSITIONS: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "prepare",
        Kind.ONCE,
        RunState.PREPARED,
        {"runs": [RunState.PREPARED], "dropped": 0, "entries": [], "server": []},
    ),
    (
        "prepare",
        Kind.CRON,
        RunState.PREPARED,
        {"runs": [RunState.PREPARED], "dropped": 0, "entries": [], "server": []},
    ),
    (
        "begin",
        Kind.CRON,
        RunState.RUNNING,
        {"runs": [RunState.RUNNING], "dropped": 0, "entries": [], "server": []},
    ),
    (
        "cancel",
        Kind.ONCE,
        RunState.CANCELLED,
        {"runs": [], "dropped": 1, "entries": [(False, True)], "server": []},
    ),
    (
        "skip",
        Kind.CRON,
        RunState.CANCELLED,
        {"runs": [], "dropped": 1, "entries": [(False, True)], "server": []},
    ),
    (
        "started",
        Kind.ONCE,
        RunState.STARTED,
        {"runs": [], "dropped": 0, "entries": [], "server": []},
    ),
    (
        "note",
        Kind.ONCE,
        RunState.RUNNING,
        {
            "runs": [RunState.RUNNING],
            "dropped": 0,
            "entries": [(True, False)],
            "server": [CONSUME],
        },
    ),
    (
        "note",
        Kind.CRON,
        RunState.RUNNING,
        {"runs": [RunState.RUNNING], "dropped": 0, "entries": [(False, True)], "server": []},
    ),
]


def moved(transition: str, kind: str) -> tuple[RunRow, Snapshots, Entry]:
    """Take a run to the state `transition` leaves, then make it; return the run and the
    writes of `transition` alone."""
    before, entry, records = stage(kind)
    row = lifecycle.prepare(before, entry, DUE, DUE, PEER)
    w = snapshots(records)
    if transition == "prepare":
        row = lifecycle.prepare(w, entry, DUE, DUE, PEER)
    elif transition == "begin":
        row = lifecycle.begin(w, entry, None, DUE, PEER)
    elif transition == "cancel":
        lifecycle.cancel(w, entry, row)
    elif transition == "skip":
        lifecycle.skip(w, entry, row)
    elif transition == "started":
        lifecycle.started(row, DUE + 0.001)
    elif transition == "note":
        lifecycle.started(row, DUE + 0.001)
        lifecycle.note(w, entry, row, DUE)
    return row, w, entry


@pytest.mark.parametrize(
    ("transition", "kind", "after", "writes"),
    TRANSITIONS,
    ids=[f"{t}-{k}" for t, k, _, _ in TRANSITIONS],
)
def test_each_transition_moves_the_run_and_writes_what_the_table_says(
    transition: str, kind: str, after: str, writes: dict[str, Any]
) -> None:
    row, w, _ = moved(transition, kind)
    assert row.state == after
    assert writes_of(w) == writes


def test_a_note_consumes_a_once_at_its_due_time_and_lays_it_over_the_cache() -> None:
    _, entry, records = stage(Kind.ONCE)
    w = Writes(records)
    row = lifecycle.prepare(Writes(records), entry, DUE, DUE, PEER)
    assert row.started_at == DUE  # the time it is to start
    lifecycle.started(row, DUE + 0.002)
    lifecycle.note(w, entry, row, DUE)
    assert (row.state, row.started_at) == (RunState.RUNNING, DUE + 0.002)
    [write] = w.batch.outbox
    assert dict(write.fields) == {"enabled": False, RollupField.LAST_RUN_AT: DUE}
    defn = records.parsed[Kind.ONCE]
    assert isinstance(defn, TriggerDef) and not defn.enabled
    assert (entry.row.consumed, entry.row.enabled, entry.row.next_fire) == (True, False, None)


def test_a_run_that_ended_before_its_note_stays_ended() -> None:
    _, entry, records = stage(Kind.ONCE)
    row = lifecycle.prepare(Writes(records), entry, DUE, DUE, PEER)
    lifecycle.started(row, DUE)
    lifecycle.end(Writes(records), row, ok(row), entry, entry.defn)
    w = snapshots(records)
    lifecycle.note(w, entry, row, DUE)
    assert row.state == RunState.ENDED
    assert saved_states(w) == [RunState.ENDED]
    assert entry.row.consumed  # the note's own writes still come


def test_only_a_prepared_run_is_cancelled() -> None:
    _, entry, records = stage(Kind.ONCE)
    row = lifecycle.begin(Writes(records), entry, None, DUE, PEER)
    with pytest.raises(AssertionError, match="only a prepared run is cancelled"):
        lifecycle.cancel(Writes(records), entry, row)


@pytest.mark.parametrize(
    ("outcome", "status", "failures", "enabled"),
    [(ok, RunStatus.OK, 0, True), (failed, RunStatus.FAILED, 1, True)],
    ids=["ok", "failed"],
)
def test_end_writes_the_row_the_record_and_the_rollup(
    outcome: Any, status: str, failures: int, enabled: bool
) -> None:
    _, entry, records = stage(Kind.CRON)
    row = lifecycle.begin(Writes(records), entry, DUE, DUE, PEER)
    w = snapshots(records)
    write = lifecycle.end(w, row, outcome(row), entry, entry.defn)
    assert write is not None and write.failures == failures
    assert (row.state, row.status) == (RunState.ENDED, status)
    assert saved_states(w) == [RunState.ENDED]
    assert [(wr.dataset, wr.id) for wr in w.batch.outbox] == [
        ("runs", row.run_id),
        ("triggers", Kind.CRON),
    ]
    assert [(e.consecutive_failures, e.enabled) for e in w.batch.entries] == [(failures, enabled)]


def test_the_breaker_trips_at_the_limit_and_disables_the_entry() -> None:
    _, entry, records = stage(Kind.CRON)
    for _ in range(2):
        row = lifecycle.begin(Writes(records), entry, DUE, DUE, PEER)
        write = lifecycle.end(Writes(records), row, failed(row), entry, entry.defn)
    assert write is not None and write.tripped
    assert (entry.row.enabled, entry.row.next_fire) == (False, None)


def test_an_interrupted_run_says_why_and_counts_toward_no_breaker() -> None:
    _, entry, records = stage(Kind.CRON)
    row = lifecycle.begin(Writes(records), entry, DUE, DUE, PEER)
    row.output = "half a line"
    outcome = lifecycle.interrupted(row, DUE + 5, "stopped\n")
    write = lifecycle.end(Writes(records), row, outcome, entry, entry.defn)
    assert (row.state, row.status) == (RunState.ENDED, RunStatus.INTERRUPTED)
    assert row.error == lifecycle.INTERRUPTED_ERROR
    assert row.output == "half a line\nstopped\n"
    assert row.duration_ms == 5000
    assert write is not None and write.failures == 0


# ----------------------------------------------------------- what a restart does

# (the state found, its id in the start journal, kind) → (closed as interrupted, the
# entry's row after (consumed, enabled, next_fire), what is queued for the server)
AT_OPEN: list[tuple[str, bool, str, bool, tuple[bool, bool, float | None], list[Any]]] = [
    (RunState.PREPARED, False, Kind.ONCE, False, (False, True, None), []),
    (RunState.PREPARED, False, Kind.CRON, False, (False, True, DUE), []),
    (RunState.PREPARED, True, Kind.ONCE, True, (True, False, None), [CONSUME]),
    (RunState.PREPARED, True, Kind.CRON, True, (False, True, DUE + 60), []),
    (RunState.STARTED, False, Kind.ONCE, True, (True, False, None), [CONSUME]),
    (RunState.RUNNING, False, Kind.ONCE, True, (False, True, None), []),
    (RunState.RUNNING, False, Kind.CRON, True, (False, True, DUE + 60), []),
]


@pytest.mark.parametrize(
    ("found", "journaled", "kind", "interrupted", "entry_after", "server"),
    AT_OPEN,
    ids=[f"{s}-{'journaled' if j else 'not-journaled'}-{k}" for s, j, k, *_ in AT_OPEN],
)
def test_a_restart_settles_a_run_by_the_state_it_finds_it_in(
    found: str,
    journaled: bool,
    kind: str,
    interrupted: bool,
    entry_after: tuple[bool, bool, float | None],
    server: list[Any],
) -> None:
    _, entry, records = stage(kind)
    row = lifecycle.prepare(Writes(records), entry, DUE, DUE, PEER)
    row.state = found
    # The entry's row as the mirror has it: a tick may have written the re-armed cron, or
    # the once with no next fire, before the crash.
    stored = dataclasses.replace(entry.row)
    last_fired = {entry.id: DUE}
    w = Writes(records)
    how = lifecycle.judge(
        row, command=False, idempotent=False, journaled=journaled, spawned=False, ended=False
    )
    left = lifecycle.settle_at_open(w, [row], [stored], last_fired, {row.run_id: how})
    assert (left == [row]) is interrupted
    assert (stored.consumed, stored.enabled, stored.next_fire) == entry_after
    assert sorted((x.dataset, tuple(sorted(x.fields))) for x in w.batch.outbox) == server
    if not interrupted:
        assert w.batch.drop_runs == [row.run_id] and row.state == RunState.CANCELLED
        assert entry.id not in last_fired  # the occurrence did not run
    else:
        assert w.batch.drop_runs == [] and last_fired == {entry.id: DUE}


def test_the_open_states_are_those_a_restart_settles() -> None:
    assert set(OPEN_STATES) == {RunState.PREPARED, RunState.STARTED, RunState.RUNNING}


def test_the_state_column_follows_a_run_through_a_real_mirror(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path / "mirror.db")
    mirror.ensure_schema(create=True)
    _, entry, records = stage(Kind.ONCE)

    def commit(w: Writes) -> list[tuple[str, str]]:
        mirror.commit(w.batch, DUE)
        w.batch = type(w.batch)()
        return [(r.run_id, r.state) for r in mirror.open_runs()]

    w = Writes(records)
    w.save(entry.row)
    row = lifecycle.prepare(w, entry, DUE, DUE, PEER)
    assert commit(w) == [(row.run_id, RunState.PREPARED)]
    assert mirror.runs() == []  # a prepared run is not listed: it has not run
    lifecycle.started(row, DUE + 0.001)
    lifecycle.note(w, entry, row, DUE)
    assert commit(w) == [(row.run_id, RunState.RUNNING)]
    assert [r.run_id for r in mirror.runs()] == [row.run_id]
    lifecycle.end(w, row, ok(row), entry, entry.defn)
    assert commit(w) == []
    assert mirror.run(row.run_id) == row
    assert [e.consumed for e in mirror.snapshot().entries] == [True]
    mirror.close()


# (state, command, idempotent, journaled, spawned, ended) → what a restart does
JUDGED: list[tuple[str, bool, bool, bool, bool, bool, lifecycle.Settle]] = [
    (RunState.PREPARED, True, False, False, False, False, lifecycle.Settle.DISCARD),
    (RunState.RUNNING, True, False, False, False, False, lifecycle.Settle.NEVER),
    (RunState.PREPARED, True, False, False, True, False, lifecycle.Settle.CLOSE),
    (RunState.RUNNING, True, False, False, True, True, lifecycle.Settle.ENDED),
    (RunState.PREPARED, False, True, False, False, False, lifecycle.Settle.DISCARD),
    (RunState.PREPARED, False, True, True, False, False, lifecycle.Settle.RERUN),
    (RunState.RUNNING, False, True, False, False, False, lifecycle.Settle.RERUN),
    (RunState.PREPARED, False, False, True, False, False, lifecycle.Settle.UNCONFIRMED),
    (RunState.RUNNING, False, False, False, False, False, lifecycle.Settle.CLOSE),
]


@pytest.mark.parametrize(
    ("state", "command", "idempotent", "journaled", "spawned", "ended", "settle"), JUDGED
)
def test_a_restart_judges_an_open_run_by_what_its_program_left(
    state: str,
    command: bool,
    idempotent: bool,
    journaled: bool,
    spawned: bool,
    ended: bool,
    settle: lifecycle.Settle,
) -> None:
    _, entry, records = stage(Kind.ONCE)
    row = lifecycle.prepare(Writes(records), entry, DUE, DUE, PEER)
    row.state = state
    assert (
        lifecycle.judge(
            row,
            command=command,
            idempotent=idempotent,
            journaled=journaled,
            spawned=spawned,
            ended=ended,
        )
        == settle
    )
