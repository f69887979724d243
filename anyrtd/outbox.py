"""Draining the outbox: the mirror's queue of writes owed to the server, sent in order and in
batches, each acknowledged only once the server has taken it."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anyrtd.client import (
    Dataset,
    ServerClient,
    ServerError,
    ServerUnavailable,
    Unsendable,
    Upsert,
)
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
    set_aside: int = 0
    """Writes the server can never take, kept in the mirror and no longer sent."""
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
    now: Callable[[], float] = time.time,
) -> DrainResult:
    """Send queued writes until the queue is empty, the server is away, or `rounds` are done.

    Only a server that cannot be reached stops the drain. A write the server refuses, or
    one the client cannot even send (text that cannot be encoded, say), is set aside: kept
    in the mirror with the reason, counted, and no longer sent, so the writes behind it go.
    """
    result = DrainResult()
    for _ in range(rounds):
        items = await db.call(lambda m: m.outbox_pending(batch, due_by=now()))
        if not items:
            return result
        for dataset, group in coalesce(items):
            where = locate(dataset)
            if where is None:
                result.error = "the server's datasets are not resolved yet"
                return result
            try:
                versions = await client.upsert(where, merge(group))
                sent = group
            except ServerUnavailable as exc:
                result.error = str(exc)
                await db.call(functools.partial(_fail, seqs=[i.seq for i in group], error=str(exc)))
                return result
            except Exception:
                # A refused (atomic) batch, or one the client could not send: one item is
                # enough for that, so send one by one to find it.
                versions, sent = await _one_by_one(db, client, where, group, result, now)
            await db.call(functools.partial(_ack, seqs=[i.seq for i in sent]))
            result.sent += len(sent)
            result.acked.extend((i.dataset, i.record_id, versions.get(i.record_id)) for i in sent)
            if result.error is not None:
                return result
    return result


async def _one_by_one(
    db: AsyncMirror,
    client: ServerClient,
    where: Dataset,
    group: list[OutboxItem],
    result: DrainResult,
    now: Callable[[], float],
) -> tuple[dict[str, int], list[OutboxItem]]:
    """Send `group` a write at a time; set aside each one that can never go.

    Return the versions and the items the server took; stop at a server that is away
    (`result.error`).
    """
    versions: dict[str, int] = {}
    sent: list[OutboxItem] = []
    for item in group:
        try:
            versions.update(await client.upsert(where, merge([item])))
        except ServerUnavailable as exc:
            result.error = str(exc)
            return versions, sent
        except Exception as exc:  # a refusal, or a write the client cannot send at all
            reason = _reason(exc)
            result.set_aside += 1
            log.error(
                "set aside a write the server cannot take (kept in the mirror, not sent "
                "again; `anyrtd doctor` lists it): %s %s: %s",
                item.dataset,
                item.record_id,
                reason,
                extra={"trigger": item.record_id if item.dataset == TRIGGERS else None},
            )
            await db.call(functools.partial(_set_aside, seq=item.seq, error=reason, now=now()))
            continue
        sent.append(item)
    return versions, sent


def _reason(exc: Exception) -> str:
    if isinstance(exc, Unsendable):
        return f"it cannot be sent: {exc.message}"
    if isinstance(exc, ServerError):
        return f"the server refused it: {exc}"
    # The client failed on this write alone (a server that is away or answers nonsense is
    # ServerUnavailable): sending it again would fail again.
    return f"it cannot be sent: {exc.__class__.__name__}: {exc}"


def _ack(m: Mirror, seqs: list[int]) -> None:
    if seqs:
        m.ack_outbox(seqs)


def _fail(m: Mirror, seqs: list[int], error: str) -> None:
    m.fail_outbox(seqs, error)


def _set_aside(m: Mirror, seq: int, error: str, now: float) -> None:
    m.set_aside_outbox([seq], error, now)
