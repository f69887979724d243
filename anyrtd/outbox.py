"""Draining the outbox: the mirror's queue of writes owed to the server, sent in order and in
batches, each acknowledged only once the server has taken it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
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

log = logging.getLogger("anyrtd.outbox")

TRIGGERS = "triggers"
RUNS = "runs"

REFUSED = frozenset({400, 409, 413, 422})
"""The statuses by which the server says it will never take a write as it is (a malformed
write, one that conflicts with the record, one too large): set aside. Any other answer that
is not a success (a 429, a 408, a 5xx, a 401 or 404 while the server is being set up, a
body that is not its JSON) leaves the write queued, to be sent again."""

RETRY_S = 1.0
"""How long the outbox loop waits after a drain the server did not take, unless the server
named a longer wait (`Retry-After`, up to `anyrtd.client.RETRY_AFTER_MAX_S`).
Chosen (5b65746): a design pause, not measured; a server's `Retry-After` overrides it."""

WINDOW_S = 1.0
"""How long the outbox loop lets writes gather after it is woken, before it drains: the runs
of several due batches then go in one request per dataset, and their trigger's writes fold
into one write per record (`merge`), instead of a request pair for every batch.
Chosen: docs/benchmarks.md, "The fire path's last cuts" (0.5 s before): half the requests."""


@dataclass
class DrainResult:
    sent: int = 0
    acked: list[tuple[str, str, int | None]] = field(default_factory=list)
    """(dataset, record id, version) of every write the server took."""
    set_aside: int = 0
    """Writes the server can never take, kept in the mirror and no longer sent."""
    lost: list[tuple[str, str]] = field(default_factory=list)
    """(dataset, record id) of conditional writes the server refused because the record
    changed since they were made: dropped, as the change supersedes them (a claim met an
    owner written meanwhile)."""
    error: str | None = None
    """Set when the server could not be reached or said "not now": the rest stays queued."""
    retry_after: float | None = None
    """The longest wait the server asked for (`Retry-After`) in the drain's answers."""
    more: bool = False
    """The drain ran all its rounds: writes may be left to send."""

    def trigger_writes(self) -> list[tuple[str, int | None]]:
        """Return (record id, version) of each trigger write settled: taken at a version, or
        lost (no version: the record as the server has it stands)."""
        taken = [(rid, v) for dataset, rid, v in self.acked if dataset == TRIGGERS]
        return taken + [(rid, None) for dataset, rid in self.lost if dataset == TRIGGERS]


class DrainWake:
    """When the outbox loop drains: once a commit queued writes (`queued`), and, while the
    last drain left writes unsent (the server away, its datasets not resolved yet, more than a
    drain's rounds), after every tick and every wait. With nothing queued, the loop sleeps:
    an idle daemon does not poll its own outbox."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._settled = False
        """The last drain took all there was; nothing was queued since."""

    def queued(self) -> None:
        self._settled = False
        self._event.set()

    def tick(self) -> None:
        if not self._settled:
            self._event.set()

    async def wait(self, retry_s: float) -> None:
        """Wait for a reason to drain. While the last drain left writes unsent, that is the
        next tick or `retry_s` (the loop's retry period), whichever comes first; once a
        drain took all there was, a queued write alone: no timer of its own wakes an idle
        daemon's outbox loop."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(None if self._settled else retry_s):
                await self._event.wait()
        self._event.clear()

    def drained(self, result: DrainResult | None) -> None:
        """Note what the loop's drain did (None: it could not start, no datasets yet)."""
        self._settled = result is not None and result.error is None and not result.more


def coalesce(items: list[Upsert]) -> list[tuple[str, list[Upsert]]]:
    """Group a window of queued writes by dataset, keeping each record's writes in order.

    Writes to different records are independent, so one request per dataset carries the
    whole window; the order that matters, that of the writes to one record, is kept.
    """
    groups: dict[str, list[Upsert]] = {}
    for item in items:
        groups.setdefault(item.dataset, []).append(item)
    return list(groups.items())


def merge(items: list[Upsert]) -> list[Upsert]:
    """Fold several field writes of one record into one write (later fields win).

    A record's folded write is conditional on the version of its first conditional write:
    the writes before that one were made against the same version, as nothing of them has
    reached the server yet.
    """
    merged: dict[str, tuple[dict[str, Any], list[str]]] = {}
    versions: dict[str, int] = {}
    for item in items:
        if item.if_version is not None:
            versions.setdefault(item.id, item.if_version)
        fields, unset = merged.setdefault(item.id, ({}, []))
        for key in item.unset:
            fields.pop(key, None)
            if key not in unset:
                unset.append(key)
        for key, value in item.fields.items():
            fields[key] = value
            if key in unset:
                unset.remove(key)
    return [Upsert(rid, f, unset=u, if_version=versions.get(rid)) for rid, (f, u) in merged.items()]


async def drain(
    db: AsyncMirror,
    client: ServerClient,
    locate: Callable[[str], Dataset | None],
    *,
    batch: int = 500,
    rounds: int = 100,
    now: Callable[[], float] = time.time,
    pace: Callable[[], Awaitable[None]] | None = None,
) -> DrainResult:
    """Send queued writes until the queue is empty, the server is away, or `rounds` are done.

    A server that cannot be reached or says "not now" (a 429, a 408, a 5xx, an answer that
    is not its JSON) stops the drain: the writes stay queued (`DrainResult.error`, and the
    wait it asked for in `retry_after`). A write the server refuses for good (`REFUSED`), or
    one the client cannot even send (text that cannot be encoded, say), is set aside: kept
    in the mirror with the reason, counted, and no longer sent, so the writes behind it go.
    A conditional write refused because its record changed is dropped (`DrainResult.lost`).
    `pace` is awaited before each round (the daemon's `clear_of_commit`).
    """
    result = DrainResult()
    for _ in range(rounds):
        if pace is not None:
            await pace()
        queued = db.mirror.outbox_queued
        items = await db.call(lambda m: m.outbox_pending(batch))
        if not items:
            return result
        located = [(locate(dataset), group) for dataset, group in coalesce(items)]
        groups = [(where, group) for where, group in located if where is not None]
        if len(groups) < len(located):
            result.error = "the server's datasets are not resolved yet"
            return result
        # One request per dataset, sent together: the server takes them at once, and the
        # change feed shows them back in one page rather than one page each.
        answers = await asyncio.gather(
            *(client.upsert(where, merge(group)) for where, group in groups),
            return_exceptions=True,
        )
        taken: list[Upsert] = []
        try:
            for (where, group), answer in zip(groups, answers, strict=True):
                if isinstance(answer, Exception) and not refused(answer):
                    _not_now(result, answer)
                    seqs = [i.seq for i in group]
                    await db.call(functools.partial(_fail, seqs=seqs, error=str(answer)))
                    continue
                if isinstance(answer, Exception):
                    # A refused (atomic) batch, or one the client could not send: one write is
                    # enough for that, so send one by one to find it.
                    versions, sent, lost = await _one_by_one(db, client, where, group, result, now)
                    taken += lost
                    result.lost.extend((i.dataset, i.id) for i in lost)
                elif isinstance(answer, BaseException):
                    raise answer
                else:
                    versions, sent = answer, group
                taken += sent
                result.sent += len(sent)
                result.acked.extend((i.dataset, i.id, versions.get(i.id)) for i in sent)
        finally:
            # What the server took is acknowledged in one transaction per round, whatever
            # stopped the round.
            if taken:
                await db.call(functools.partial(_ack, seqs=[i.seq for i in taken]))
        if result.error is not None:
            return result
        if len(items) < batch and db.mirror.outbox_queued == queued:
            return result  # the round took all there was, and nothing was queued since
    result.more = True
    return result


async def _one_by_one(
    db: AsyncMirror,
    client: ServerClient,
    where: Dataset,
    group: list[Upsert],
    result: DrainResult,
    now: Callable[[], float],
) -> tuple[dict[str, int], list[Upsert], list[Upsert]]:
    """Send `group` a write at a time; set aside each one that can never go.

    Return the versions, the writes the server took, and the conditional writes it refused
    because their record changed (`DrainResult.lost`); stop at a server that is away or
    says "not now" (`result.error`).
    """
    versions: dict[str, int] = {}
    sent: list[Upsert] = []
    lost: list[Upsert] = []
    for item in group:
        try:
            versions.update(await client.upsert(where, merge([item])))
        except Exception as exc:  # a refusal, a write the client cannot send, or "not now"
            if not refused(exc):
                _not_now(result, exc)
                return versions, sent, lost
            if superseded(item, exc):
                log.info(
                    "dropped a write to %s %s made against version %s: the record changed "
                    "on the server since, and that change stands",
                    item.dataset,
                    item.id,
                    item.if_version,
                    extra={"trigger": item.id if item.dataset == TRIGGERS else None},
                )
                lost.append(item)
                continue
            reason = _reason(exc)
            result.set_aside += 1
            log.error(
                "set aside a write the server cannot take (kept in the mirror, not sent "
                "again; `anyrtd doctor` lists it): %s %s: %s",
                item.dataset,
                item.id,
                reason,
                extra={"trigger": item.id if item.dataset == TRIGGERS else None},
            )
            await db.call(functools.partial(_set_aside, seq=item.seq, error=reason, now=now()))
            continue
        sent.append(item)
    return versions, sent, lost


def refused(exc: Exception) -> bool:
    """Tell whether a write can never go as it is: the server refused it for good (`REFUSED`),
    or the client cannot send it (`Unsendable`, or a failure of the client on it alone)."""
    if isinstance(exc, ServerUnavailable):
        return False
    if isinstance(exc, ServerError) and not isinstance(exc, Unsendable):
        return exc.status in REFUSED
    return True


def _not_now(result: DrainResult, exc: Exception) -> None:
    result.error = str(exc)
    if isinstance(exc, ServerUnavailable) and exc.retry_after is not None:
        result.retry_after = max(exc.retry_after, result.retry_after or 0.0)


def superseded(item: Upsert, exc: Exception) -> bool:
    """Tell whether the server refused a conditional write because its record changed."""
    return (
        item.if_version is not None
        and isinstance(exc, ServerError)
        and exc.code == "version_conflict"
    )


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
