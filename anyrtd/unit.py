"""Units of work: what a daemon step or a fire writes, committed as one transaction.

A unit of work is a `Writes`: records seen on the server, registry entries, runs, meta,
and field-level writes owed to the server. A trigger field write is laid over the record
cache at once (the overlay), so the next reconcile already sees it. The stages (sync,
apply, firing, the active role) write into the step's unit, the `Unit`, and its `commit`
writes everything pending in one transaction (a group commit).

A fire's writes go into a unit of their own (`Unit.fire`), handed to the functions that
make them (`anyrtd/lifecycle.py`), and committed together with what the step has pending
(`Unit.commit_fire`): when that transaction fails (the disk is full), nothing of the fire
is written, its overlay is rewound, and the step's writes stay pending for the next
commit. Nothing else can write into a fire's unit: it is an object of its own, not the
step's buffer swapped. A commit that fails raises `CommitFailed`; the first failure of an
episode is logged, and so is the recovery.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from anyrtd.mirror import AsyncMirror
from anyrtd.mirror_guard import MirrorFault
from anyrtd.outbox import RUNS, TRIGGERS
from anyrtd.records import RecordCache, RecordMark
from anyrtd.rows import Batch, EntryRow, RunRow
from anyrtd.runs import run_record

log = logging.getLogger("anyrtd.mirror")

SQLITE_FULL = 13
"""SQLite's primary result code for "database or disk is full"."""


class CommitFailed(Exception):
    """A commit that did not reach the mirror (the disk is full, say): nothing of it was
    written."""


@dataclass(frozen=True, slots=True)
class Failing:
    """The mirror cannot be written: since when, and why."""

    since: float
    full: bool
    error: str

    def reason(self) -> str:
        """Return the line `/healthz` gives for it."""
        since = datetime.fromtimestamp(self.since, UTC)
        what = "the disk is full" if self.full else "a write failed"
        return (
            f"the mirror cannot be written since {since:%Y-%m-%dT%H:%M:%SZ} ({what}: "
            f"{self.error}); due fires wait and fire late once it can be written"
        )


def is_disk_full(exc: BaseException) -> bool:
    """Return whether `exc` (or what caused it) says the disk is full."""
    seen: BaseException | None = exc
    while seen is not None:
        code = getattr(seen, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == SQLITE_FULL:
            return True
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__
    return False


class Writes:
    """One unit of work: the rows and field writes it makes, to commit as one transaction.
    A fire's (`rewind`) keeps the record cache as it was before its first write to each
    record, so that a failed commit can put the overlay back."""

    def __init__(self, records: RecordCache, *, rewind: bool = False) -> None:
        self.records = records
        self.batch = Batch()
        self.marks: dict[str, RecordMark] | None = {} if rewind else None
        """The record cache before this unit's first write to each record (a fire's)."""

    def __bool__(self) -> bool:
        return bool(self.batch)

    def save(self, row: EntryRow) -> None:
        """Write a registry entry's row."""
        self.batch.entries.append(row)

    def evict(self, trigger_id: str) -> None:
        """Remove a registry entry's row."""
        self.batch.evict.append(trigger_id)

    def keep_record(self, rid: str, version: int | None, record: Mapping[str, Any]) -> None:
        """Write the text of a record as the server showed it."""
        self.batch.records.append((rid, version, dict(record)))

    def drop_record(self, rid: str) -> None:
        """Remove a record the server no longer shows."""
        self.batch.forget_records.append(rid)

    def tombstone(self, rid: str) -> None:
        """Note a record id the server deleted."""
        self.batch.tombstones.append(rid)

    def meta(self, values: Mapping[str, str]) -> None:
        """Write meta values (peer id, resolved places, cursor, verdict)."""
        self.batch.meta.update(values)

    def save_run(self, row: RunRow) -> None:
        """Write a run's row, in whatever state it is (`anyrtd/lifecycle.py`)."""
        self.batch.runs.append(row)

    def drop_run(self, run_id: str) -> None:
        """Remove a run's row: a run cancelled before its program started."""
        self.batch.drop_runs.append(run_id)

    def send_run(self, row: RunRow) -> None:
        """Queue a finished run's `agent_runs` record for the server."""
        self.batch.write(RUNS, row.run_id, run_record(row))

    def write_trigger(
        self,
        rid: str,
        fields: Mapping[str, Any],
        unset: Iterable[str] = (),
        *,
        if_version: int | None = None,
    ) -> None:
        """Queue a field-level write of a trigger record and lay it over the cache; with
        `if_version`, the server takes it only if the record is still at that version."""
        unset = list(unset)
        self.batch.write(TRIGGERS, rid, fields, unset, if_version)
        if self.marks is not None and rid not in self.marks:
            self.marks[rid] = self.records.mark(rid)
        self.records.write(rid, fields, unset)

    def rewind(self) -> None:
        """Put the record cache back as it was before this unit's trigger writes."""
        for rid, mark in (self.marks or {}).items():
            self.records.rewind(rid, mark)


class Unit(Writes):
    """The step's unit of work (the writes pending), and the group commit that makes them
    and a fire's durable."""

    def __init__(self, records: RecordCache, *, on_outbox: Callable[[], None]) -> None:
        super().__init__(records)
        self.db: AsyncMirror | None = None
        """The mirror commits go to; None while it is closed (nothing is written then)."""
        self._on_outbox = on_outbox
        self._lock = asyncio.Lock()
        self.failing: Failing | None = None
        """Set while commits fail (from the first failure to the next commit that works)."""

    def open(self, db: AsyncMirror) -> AsyncMirror:
        """Commit to `db` from now on; return it."""
        self.db = db
        return db

    async def close(self) -> None:
        """Close the mirror: nothing is written after."""
        if self.db is not None:
            await self.db.close()
            self.db = None

    def wait_s(self) -> float:
        """Return how long a commit may have to wait for the mirror's call in flight: its
        recent slowest (`AsyncMirror.slow_s`); 0 while it is closed."""
        return self.db.slow_s if self.db is not None else 0.0

    def fire(self) -> Writes:
        """Return a new unit of work for one fire's writes (`commit_fire`)."""
        return Writes(self.records, rewind=True)

    async def commit_step(self, now: float) -> None:
        """Commit a tick's writes. A full disk is waited out: the tick completes (degraded;
        `/healthz` says why) and its writes wait in memory. Any other failure (the mirror
        locked past busy_timeout) raises `CommitFailed`: the tick stalls, so a lock that
        never clears stops the watchdog's pings and systemd restarts anyrtd."""
        try:
            await self.commit(now)
        except CommitFailed:
            if self.failing is None or not self.failing.full:
                raise

    async def commit(self, now: float) -> None:
        """Write what is pending in one transaction; return once it is durable.

        Callers that arrive while a commit is in flight wait for it, and the first of them
        then writes everything pending at once (a group commit): a thousand runs ending
        together cost a few transactions, not a thousand. Raise `CommitFailed` when the
        transaction fails: what was pending stays pending, for the next commit.
        """
        if not self.batch:
            if self._lock.locked():  # a commit in flight took this caller's writes: wait
                async with self._lock:
                    pass
            return
        async with self._lock:
            if not self.batch:  # the commit this caller waited for took its writes
                return
            await asyncio.sleep(0)  # the writes queued in this turn of the loop join in
            await self._commit_pending(now)

    async def commit_fire(self, fire: Writes, now: float) -> None:
        """Commit a fire's unit of work together with what is pending; return once durable.

        On failure, raise `CommitFailed`: nothing of the fire is written and its overlay is
        rewound (the fire did not happen); what else was pending stays for the next commit.
        """
        async with self._lock:
            try:
                await self._commit_pending(now, fire.batch)
            except Exception:
                fire.rewind()
                raise

    async def _commit_pending(self, now: float, fire: Batch | None = None) -> None:
        batch, self.batch = self.batch, Batch()
        both = _merged(batch, fire) if fire else batch
        if not both or self.db is None:
            return
        try:
            await self.db.call(lambda m: m.commit(both, now))
        except Exception as exc:
            # One transaction, so nothing of it was written (the disk is full, or the mirror
            # stayed locked past busy_timeout): keep the step's writes for the next commit,
            # ahead of what came since; a fire's are the caller's to take back.
            self.batch = _merged(batch, self.batch)
            if isinstance(exc, MirrorFault):
                raise
            self.note_failed(exc, now)
            raise CommitFailed(_first_line(exc)) from exc
        if self.failing is not None:
            log.warning(
                "the mirror is written again, after %.0f s in which it could not be",
                max(0.0, now - self.failing.since),
            )
            self.failing = None
        if both.outbox:
            self._on_outbox()

    def note_failed(self, exc: Exception, now: float) -> None:
        """Note a failed commit; log the first of an episode (and a change of its cause)."""
        full = is_disk_full(exc)
        before = self.failing
        self.failing = Failing(before.since if before else now, full, _first_line(exc))
        if before is None or before.full != full:
            log.error(
                "%s (%s): writes wait in memory, and what falls due waits to fire until it "
                "can be written again",
                "the disk of the mirror is full" if full else "the mirror cannot be written",
                self.failing.error,
            )


def _merged(first: Batch, then: Batch) -> Batch:
    """Return one batch holding the writes of `first`, then those of `then`."""
    out = Batch(meta={**first.meta, **then.meta})
    for name in _LISTS:
        setattr(out, name, [*getattr(first, name), *getattr(then, name)])
    return out


_LISTS = tuple(f.name for f in dataclasses.fields(Batch) if f.name != "meta")
"""A batch's lists of writes (its fields but `meta`): looked up once, not for each merge."""


def _first_line(exc: BaseException) -> str:
    """Return the first line of what `exc` says (SQLAlchemy adds the statement below)."""
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0] if text else exc.__class__.__name__


__all__ = ["CommitFailed", "Failing", "Unit", "Writes", "is_disk_full"]
