"""A trigger's run history: the server's `agent_runs`, or this device's mirror without it.

The runs of a trigger are synced records (the seeds' `agent_runs`), written by whichever
device ran each one, so after a repin the new owner still answers the trigger's history.
This device's own runs not yet on the server (still running, or waiting in the outbox) are
laid over what the server holds. When the server is away, the answer is this device's
mirror alone, and says so (`source`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from anyrtd.client import ServerClient, ServerError, ServerUnavailable
from anyrtd.mirror import Mirror
from anyrtd.places import Places
from anyrtd.rows import RunRow
from anyrtd.runs import run_row
from anyrtd.vocab import HistorySource

log = logging.getLogger("anyrtd.history")

TRIGGER_RUNS = 20
"""The seeds' count of a trigger's newest runs."""


@dataclass(frozen=True)
class RunHistory:
    """A trigger's newest runs, newest first, and where they were read."""

    runs: Sequence[RunRow]
    source: HistorySource
    """`server`: the synced `agent_runs` of every device (with this device's unsynced runs
    laid over); `mirror`: this device's own runs, the server being away."""


async def trigger_runs(
    client: ServerClient,
    places: Places | None,
    db_call: Callable[[Callable[[Mirror], Any]], Awaitable[Any]],
    trigger_id: str,
    *,
    status: str | None = None,
    limit: int = TRIGGER_RUNS,
) -> RunHistory:
    """Return the newest `limit` runs of a trigger (of one `status`, if given)."""
    own: list[RunRow] = await db_call(
        lambda m: m.runs(trigger_id=trigger_id, status=status, limit=limit)
    )
    if places is None:
        return RunHistory(own, HistorySource.MIRROR)
    where = places.runs
    wanted = {"triggerId": trigger_id, **({"status": status} if status is not None else {})}
    try:
        records, _ = await client.query(where, filter=wanted, sort=["-startedAt"], limit=limit)
    except (ServerUnavailable, ServerError) as exc:
        log.debug("runs of %s from the mirror: %s", trigger_id, exc)
        return RunHistory(own, HistorySource.MIRROR)
    # This device's rows win: they hold the error text, and a run the server has not seen end.
    merged = {r.run_id: r for r in (run_row(rec) for rec in records) if r is not None}
    merged.update((r.run_id, r) for r in own)
    newest = sorted(merged.values(), key=lambda r: (r.started_at, r.run_id), reverse=True)
    return RunHistory(newest[:limit], HistorySource.SERVER)


__all__ = ["TRIGGER_RUNS", "RunHistory", "trigger_runs"]
