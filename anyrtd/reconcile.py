"""The reconcile: a pure function from what the records say to a plan for the registry.

Inputs are the parsed records, a view of the registry, who this device is and what
the election says; the output is a list of actions that `daemon` applies. No I/O,
no clock: the lifecycle rules of the seeds (adopt, refresh, evict, claim, markers)
are table tests of this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Literal, Protocol

from anyrtd.claims import Token, outranks
from anyrtd.model import STANDING_BUILTINS, Malformed, TriggerDef, health_marker
from anyrtd.vocab import Kind, Marker, is_unassigned


class EntryFacts(Protocol):
    """What the reconcile reads of one registry entry: an `EntryView`, or the entry's own
    row (`rows.EntryRow`), which a reconcile of every entry reads without a copy."""

    @property
    def fingerprint(self) -> str: ...
    @property
    def enabled(self) -> bool: ...
    @property
    def marker(self) -> str | None: ...
    @property
    def claimed_at(self) -> float | None: ...
    @property
    def consumed(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class EntryView:
    """What the reconcile needs to know of one registry entry."""

    fingerprint: str
    enabled: bool
    marker: str | None
    claimed_at: float | None = None
    """When this device stamped its claim; None once the claim is confirmed (or never was one)."""
    consumed: bool = False
    """A `once` that has fired, as the entry holds it."""


@dataclass(frozen=True, slots=True)
class Adopt:
    defn: TriggerDef
    claim: bool
    """True when the record is unassigned and this device stamps its peer id on it."""


@dataclass(frozen=True, slots=True)
class Confirm:
    defn: TriggerDef


@dataclass(frozen=True, slots=True)
class Refresh:
    defn: TriggerDef


@dataclass(frozen=True, slots=True)
class Toggle:
    defn: TriggerDef
    enabled: bool


@dataclass(frozen=True, slots=True)
class Track:
    """The record changed outside the definition core (a rollup write): keep it current."""

    defn: TriggerDef


EvictReason = Literal["deleted", "repinned", "superseded", "unassigned", "malformed"]


@dataclass(frozen=True, slots=True)
class Evict:
    id: str
    reason: EvictReason


@dataclass(frozen=True, slots=True)
class Mark:
    """Stamp (or clear, with None) a health marker in the record's `lastStatus`."""

    id: str
    marker: str | None


@dataclass(frozen=True, slots=True)
class Skip:
    """A malformed record, left alone; the daemon logs it once per version."""

    id: str
    reason: str
    version: int | None


Action = Adopt | Confirm | Refresh | Toggle | Track | Evict | Mark | Skip


@dataclass(frozen=True, slots=True)
class Context:
    """Who is reconciling, and when."""

    peer_id: str
    active: bool
    now: float
    confirm_after: float = 0.0
    """How long a claim must stand, after it was stamped, before it is confirmed."""
    may_claim: bool = True
    """False during a takeover hold or once the role has evidently moved (anyrtd/claims.py)."""
    mine: Mapping[str, Token] = field(default_factory=dict)
    """The fencing token of each claim this device stamped."""
    seen: Mapping[str, Token] = field(default_factory=dict)
    """The fencing token each record shows, where its owner wrote one."""
    loops: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """A loop through each chain that is in one (`chain.ChainIndex.cycles`): marked
    `invalid_spec`, it never fires."""


MARKERS = frozenset({Marker.INVALID_SPEC, Marker.UNSUPPORTED_SOURCE})


def reconcile(
    ids: Iterable[str],
    records: Mapping[str, TriggerDef | Malformed],
    registry: Mapping[str, EntryFacts],
    ctx: Context,
    pending_owner: Set[str] = frozenset(),
) -> list[Action]:
    """Return the actions that bring the registry in line with `records` for `ids`.

    `records` holds every record this device knows (a missing id was deleted);
    `pending_owner` names records whose owner stamp this device wrote but the
    server has not shown back yet, so their claim cannot be confirmed.
    """
    plan: list[Action] = []
    for rid in ids:
        plan.extend(_one(rid, records.get(rid), registry.get(rid), ctx, pending_owner))
    return plan


def _one(
    rid: str,
    rec: TriggerDef | Malformed | None,
    entry: EntryFacts | None,
    ctx: Context,
    pending_owner: Set[str],
) -> list[Action]:
    if rid in STANDING_BUILTINS:
        return []
    if rec is None:
        return [Evict(rid, "deleted")] if entry is not None else []
    if isinstance(rec, Malformed):
        skip = Skip(rid, rec.reason, rec.version)
        return [Evict(rid, "malformed"), skip] if entry is not None else [skip]

    mine = rec.owner == ctx.peer_id
    if not mine and not is_unassigned(rec.owner):
        if entry is None:
            return []
        ours, theirs = ctx.mine.get(rid), ctx.seen.get(rid)
        if outranks(ours, theirs):
            # Two claims met and ours, of the earlier term, stands: stamp it again.
            return [Adopt(rec, claim=True)]
        return [Evict(rid, "superseded" if ours and theirs else "repinned")]
    if not mine:
        # Unassigned: the active device claims it (past its takeover hold); others let go.
        if ctx.active and ctx.may_claim:
            return [Adopt(rec, claim=True), *_marker(rec, ctx.now, ctx.loops)]
        return [Evict(rid, "unassigned")] if entry is not None else []

    if entry is None:
        return [Adopt(rec, claim=False), *_marker(rec, ctx.now, ctx.loops)]
    actions: list[Action] = []
    if entry.claimed_at is not None:
        if rid in pending_owner or ctx.now < entry.claimed_at + ctx.confirm_after:
            return [Track(rec)]
        actions.append(Confirm(rec))
    if rec.fingerprint != entry.fingerprint or _shot_changed(rec, entry):
        actions.append(Refresh(rec))
        if rec.enabled and not entry.enabled:
            # An edit that also re-enables: the flip still resets the breaker.
            actions.append(Toggle(rec, True))
    elif rec.enabled != entry.enabled:
        actions.append(Toggle(rec, rec.enabled))
    elif not actions:
        actions.append(Track(rec))
    actions.extend(_marker(rec, ctx.now, ctx.loops))
    return actions


def _shot_changed(rec: TriggerDef, entry: EntryFacts) -> bool:
    """Return whether a `once` record and its entry disagree on whether it has fired.

    A once takes the record's `lastRunAt` as its consumed state (seeds, Refresh): a record
    written again without it re-arms the shot, even with its definition unchanged.
    """
    return rec.kind == Kind.ONCE and entry.consumed != (rec.rollup.last_run_at is not None)


def _marker(rec: TriggerDef, now: float, loops: Mapping[str, Sequence[str]]) -> list[Action]:
    wanted = health_marker(rec, now)
    if wanted is None and loops and rec.enabled and rec.id in loops:
        wanted = Marker.INVALID_SPEC  # a chain in a loop (anyrtd/chain.py)
    shown = rec.rollup.last_status
    if wanted is not None:
        return [Mark(rec.id, wanted)] if shown != wanted else []
    if shown in MARKERS:
        return [Mark(rec.id, None)]
    return []
