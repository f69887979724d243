"""Draining the outbox: the mirror's queue of writes owed to the server, sent in order and in
batches, each acknowledged only once the server has taken it."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anyrtd.client import Dataset, ServerClient, ServerError, ServerUnavailable, Upsert
from anyrtd.mirror import AsyncMirror, Mirror
from anyrtd.rows import OutboxItem

log = logging.getLogger("anyrtd.outbox")

TRIGGERS = "triggers"
RUNS = "runs"


@dataclass
class DrainResult:
    sent: int = 0
    acked: list[tuple[str, str, int | None]] = field(default_factory=list)
    """(dataset, record id, version) of every write the server took."""
    dropped: int = 0
    error: str | None = None
    """Set when the server could not be reached: the rest stays queued."""


def coalesce(items: list[OutboxItem]) -> list[tuple[str, list[OutboxItem]]]:
    """Group a window of queued items by dataset, keeping each record's writes in order.

    Writes to different records are independent, so one request per dataset carries the
    whole window; the order that matters, that of the writes to one record, is kept.
    """
    groups: dict[str, list[OutboxItem]] = {}
    for item in items:
        groups.setdefault(item.dataset, []).append(item)
    return list(groups.items())


def merge(items: list[OutboxItem]) -> list[Upsert]:
    """Fold several field writes of one record into one write (later fields win)."""
    merged: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for item in items:
        fields, unset = merged.setdefault(item.record_id, ({}, []))
        for key in item.unset:
            fields.pop(key, None)
            if key not in unset:
                unset.append(key)
        for key, value in item.fields.items():
            fields[key] = value
            if key in unset:
                unset.remove(key)
    return [Upsert(id=rid, fields=f, unset=u) for rid, (f, u) in merged.items()]


async def drain(
    db: AsyncMirror,
    client: ServerClient,
    locate: Callable[[str], Dataset | None],
    *,
    batch: int = 500,
    rounds: int = 100,
) -> DrainResult:
    """Send queued writes until the queue is empty, the server is away, or `rounds` are done."""
    result = DrainResult()
    for _ in range(rounds):
        items = await db.call(lambda m: m.outbox_pending(batch))
        if not items:
            return result
        for dataset, group in coalesce(items):
            where = locate(dataset)
            if where is None:
                result.error = "the server's datasets are not resolved yet"
                return result
            try:
                versions = await client.upsert(where, merge(group))
            except ServerUnavailable as exc:
                result.error = str(exc)
                await db.call(functools.partial(_fail, seqs=[i.seq for i in group], error=str(exc)))
                return result
            except ServerError:
                # One bad record refuses the whole (atomic) batch: send one by one to find it.
                versions = await _one_by_one(db, client, where, group, result)
                if result.error is not None:
                    return result
            await db.call(functools.partial(_ack, seqs=[i.seq for i in group]))
            result.sent += len(group)
            result.acked.extend((i.dataset, i.record_id, versions.get(i.record_id)) for i in group)
    return result


async def _one_by_one(
    db: AsyncMirror,
    client: ServerClient,
    where: Dataset,
    group: list[OutboxItem],
    result: DrainResult,
) -> dict[str, int]:
    versions: dict[str, int] = {}
    for item in group:
        try:
            versions.update(await client.upsert(where, merge([item])))
        except ServerUnavailable as exc:
            result.error = str(exc)
            return versions
        except ServerError as exc:
            # A refused write can never succeed (a tombstoned record, a bad field): drop it
            # rather than block every write behind it.
            result.dropped += 1
            log.warning(
                "dropped a write the server refused: %s %s: %s",
                item.dataset,
                item.record_id,
                exc,
                extra={"trigger": item.record_id if item.dataset == TRIGGERS else None},
            )
            await db.call(functools.partial(_fail_then_ack, seq=item.seq, error=str(exc)))
    return versions


def _ack(m: Mirror, seqs: list[int]) -> None:
    m.ack_outbox(seqs)


def _fail(m: Mirror, seqs: list[int], error: str) -> None:
    m.fail_outbox(seqs, error)


def _fail_then_ack(m: Mirror, seq: int, error: str) -> None:
    m.fail_outbox([seq], error)
    m.ack_outbox([seq])
