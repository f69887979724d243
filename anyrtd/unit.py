"""The unit of work of one daemon step: what the step writes, committed as one transaction.

The stages (sync, apply, firing, the active role) queue their writes here: records seen
on the server, registry entries, runs, meta, and field-level writes owed to the server.
A trigger field write is laid over the record cache at once (the overlay), so the next
reconcile already sees it. `commit` writes everything pending in one transaction.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from anyrtd.mirror import AsyncMirror
from anyrtd.outbox import RUNS, TRIGGERS
from anyrtd.records import RecordCache
from anyrtd.rows import Batch, EntryRow, RunRow
from anyrtd.runs import run_record


class Unit:
    """The pending writes of the daemon's current step, and the group commit that makes them
    durable."""

    def __init__(self, records: RecordCache, *, on_outbox: Callable[[], None]) -> None:
        self.records = records
        self.db: AsyncMirror | None = None
        """The mirror commits go to; None while it is closed (nothing is written then)."""
        self._on_outbox = on_outbox
        self._batch = Batch()
        self._lock = asyncio.Lock()

    def __bool__(self) -> bool:
        return bool(self._batch)

    def save(self, row: EntryRow) -> None:
        """Write a registry entry's row."""
        self._batch.entries.append(row)

    def evict(self, trigger_id: str) -> None:
        """Remove a registry entry's row."""
        self._batch.evict.append(trigger_id)

    def keep_record(self, rid: str, version: int | None, record: Mapping[str, Any]) -> None:
        """Write the text of a record as the server showed it."""
        self._batch.records.append((rid, version, dict(record)))

    def drop_record(self, rid: str) -> None:
        """Remove a record the server no longer shows."""
        self._batch.forget_records.append(rid)

    def tombstone(self, rid: str) -> None:
        """Note a record id the server deleted."""
        self._batch.tombstones.append(rid)

    def meta(self, values: Mapping[str, str]) -> None:
        """Write meta values (peer id, resolved places, cursor, verdict)."""
        self._batch.meta.update(values)

    def save_run(self, row: RunRow) -> None:
        """Write a run's summary (open as `running`, or closed)."""
        self._batch.runs.append(row)

    def send_run(self, row: RunRow) -> None:
        """Queue a finished run's `agent_runs` record for the server."""
        self._batch.write(RUNS, row.run_id, run_record(row))

    def write_trigger(self, rid: str, fields: Mapping[str, Any], unset: Iterable[str] = ()) -> None:
        """Queue a field-level write of a trigger record and lay it over the cache."""
        unset = list(unset)
        self._batch.write(TRIGGERS, rid, fields, unset)
        self.records.write(rid, fields, unset)

    async def commit(self, now: float) -> None:
        """Write what is pending in one transaction; return once it is durable.

        Callers that arrive while a commit is in flight wait for it, and the first of them
        then writes everything pending at once (a group commit): a thousand runs ending
        together cost a few transactions, not a thousand.
        """
        if not self._batch:
            return
        async with self._lock:
            await asyncio.sleep(0)  # the writes queued in this turn of the loop join in
            await self._commit_pending(now)

    async def _commit_pending(self, now: float) -> None:
        batch, self._batch = self._batch, Batch()
        if batch and self.db is not None:
            try:
                await self.db.call(lambda m: m.commit(batch, now))
            except Exception:
                # One transaction, so nothing of it was written (say the mirror stayed locked
                # past busy_timeout): keep it for the next commit, ahead of what came since.
                self._batch = _merged(batch, self._batch)
                raise
            if batch.outbox:
                self._on_outbox()


def _merged(first: Batch, then: Batch) -> Batch:
    """Return one batch holding the writes of `first`, then those of `then`."""
    out = Batch(meta={**first.meta, **then.meta})
    for f in dataclasses.fields(Batch):
        if f.name != "meta":
            setattr(out, f.name, [*getattr(first, f.name), *getattr(then, f.name)])
    return out


__all__ = ["Unit"]
