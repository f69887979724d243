"""Why a trigger will or will not fire on this device: facts in, an ordered answer out (pure).

`explain(facts)` returns every reason it will not fire here, in the order to fix them
(the record, then this device, then where the trigger belongs, then its definition, then
its state), each with the fact behind it and the command that changes it; and, when it
will fire, when next and on which device. Notes that do not stop it (failing runs, a run
in flight, overlap skips, a claim awaiting its confirmation) follow as non-blocking
reasons. The daemon gathers the facts (`anyrtd/why_facts.py`); the control API serves the
answer at `GET /triggers/:id/why`.

The answer also carries the one word the trigger shows (`Shown`: its state, the reason in
a word, a severity), decided from those reasons: `triggers list`, the control API's trigger
views (what the status page draws) and `why` all take it from here, the list from the
facts it has at hand (`list_facts`), so they agree by construction.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from anyrtd.chain import RunFilter, describe, show_cycle
from anyrtd.missed import Missed, iso
from anyrtd.model import Malformed, TriggerDef, marker_reason
from anyrtd.registry import Entry
from anyrtd.vocab import (
    Cause,
    DeviceState,
    Kind,
    LastStatus,
    Marker,
    MissCause,
    RollupField,
    Severity,
    StateReason,
    TriggerState,
    Verdict,
    is_unassigned,
)

LIVE, PRUNED, UNKNOWN = DeviceState.LIVE, DeviceState.PRUNED, DeviceState.UNKNOWN

_FIELD = re.compile(r"(?:record id|_v|[A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?)\b")
_RECORD_FIELDS = frozenset(
    {"id", "name", "kind", "spec", "program", "args", "owner", "enabled", "limits"}
    | {
        "maxConsecutiveFailures",
        "_v",
        RollupField.LAST_RUN_AT,
        RollupField.LAST_STATUS,
        RollupField.CONSECUTIVE_FAILURES,
    }
    | {
        RollupField.LAST_DURATION_MS,
        RollupField.RUN_COUNT,
        RollupField.LAST_RUN_REF,
        RollupField.LAST_FUEL,
        RollupField.LAST_COST_USD,
    }
)


@dataclass(frozen=True)
class Failure:
    """One failed run: its id, when it started, and its error."""

    run_id: str
    started_at: float
    error: str | None
    error_type: str | None = None


@dataclass(frozen=True)
class WhyFacts:
    """What this device knows of one trigger and of itself, as of `now`."""

    id: str
    now: float
    peer_id: str | None
    """This device's peer id (None until the server or the mirror told it)."""
    verdict: str
    parsed: TriggerDef | Malformed | None = None
    entry: Entry | None = None
    tombstoned: bool = False
    devices: Mapping[str, DeviceState] | None = None
    """Each peer id's state in the devices registry (`live`, `pruned`); None when unread."""
    names: Mapping[str, str] = field(default_factory=dict)
    """Each peer id's device name, where the registry gives one."""
    winner: str | None = None
    """The device active now, as the election last read it."""
    hold: Mapping[str, Any] | None = None
    """The takeover hold while claims wait (`waitingFor`, `since`, `maxS`), or None."""
    may_claim: bool = True
    installed: bool = True
    """Whether this device can run the trigger's program."""
    failures: Sequence[Failure] = ()
    """The newest failed runs of the trigger on this device, newest first."""
    consumed_run: str | None = None
    """The run that consumed a `once` (its id), where this device knows it."""
    overlap_skips: int = 0
    """Occurrences skipped since the daemon started because a run was still in flight."""
    next_fires: Sequence[float] = ()
    """The next fires of this device's armed entry."""
    spec_fires: Sequence[float] = ()
    """The next occurrences of the spec from now, wherever it runs (for another device)."""
    missed: Missed | None = None
    """Its missed occurrences (anyrtd/missed.py), wherever it is pinned."""
    chain: RunFilter | None = None
    """A chain's filter (anyrtd/chain.py); None for any other trigger."""
    chain_loop: Sequence[str] | None = None
    """The loop of chains it is in, where it is in one: it never fires."""
    last_fired_by: str | None = None
    """A chain's: the upstream run its last run here answered."""
    confirm_s: float = 0.0
    """How long after its claim this device confirms it (the owner stamp seen back)."""
    standing: bool = False
    """Whether it is a standing built-in (anyrtd/standing.py): code-owned, not the user's."""


def _any_program(_program: str) -> bool:
    return True


@dataclass(frozen=True)
class Here:
    """What this device is, as a trigger's state reads it: the facts a list has at hand."""

    verdict: str = Verdict.ACTIVE
    may_claim: bool = True
    hold: Mapping[str, Any] | None = None
    installed: Callable[[str], bool] = _any_program
    confirm_s: float = 0.0


def list_facts(
    trigger_id: str,
    entry: Entry | None,
    parsed: TriggerDef | Malformed | None,
    peer_id: str | None,
    here: Here,
    now: float,
    *,
    standing: bool = False,
) -> WhyFacts:
    """Return the facts a list of triggers has for one row (no run history, no devices
    registry): enough for its state, which reads nothing else."""
    defn = parsed if isinstance(parsed, TriggerDef) else entry.defn if entry else None
    return WhyFacts(
        id=trigger_id,
        now=now,
        peer_id=peer_id,
        verdict=here.verdict,
        parsed=parsed,
        entry=entry,
        hold=here.hold,
        may_claim=here.may_claim,
        installed=defn is None or here.installed(defn.program),
        confirm_s=here.confirm_s,
        standing=standing,
    )


@dataclass(frozen=True)
class Shown:
    """The one word a trigger shows: its state, the reason in a word, and its severity."""

    state: TriggerState
    reason: str | None
    severity: Severity


@dataclass(frozen=True)
class Reason:
    """One reason, the fact behind it, and the command that changes it (None: nothing to run)."""

    cause: Cause
    text: str
    facts: Mapping[str, Any]
    fix: str | None = None
    blocking: bool = True


@dataclass(frozen=True)
class Answer:
    """Will it fire on this device; if not, why (fix-first order); if so, when and where."""

    id: str
    fires: bool
    device: str | None
    """The device it fires on (this one when `fires`), or None when none will."""
    next_fires: Sequence[float]
    reasons: Sequence[Reason]
    now: float
    shown: Shown = field(default_factory=lambda: Shown(TriggerState.UNKNOWN, None, Severity.BAD))
    """The state it shows, decided from these reasons (`shown`)."""


def malformed_field(reason: str) -> str | None:
    """Return the record field a malformed record's reason names first, if it names one."""
    match = _FIELD.match(reason)
    if match is None:
        return None
    word = match.group(0)
    if word == "record id":
        return "id"
    return word if word.split(".")[0] in _RECORD_FIELDS else None


def device_state(facts: WhyFacts, peer: str) -> DeviceState:
    """Return a device's state in the registry: `live`, `pruned` or `unknown`."""
    if facts.devices is None:
        return UNKNOWN
    return facts.devices.get(peer, UNKNOWN)


def explain(facts: WhyFacts) -> Answer:
    """Return the answer for one trigger: every reason it will not fire here, fix first."""
    reasons: list[Reason] = []
    parsed, entry = facts.parsed, facts.entry
    defn = parsed if isinstance(parsed, TriggerDef) else entry.defn if entry else None
    device = _device(facts, defn)
    if facts.tombstoned and defn is None:
        reasons.append(_tombstoned(facts))
    elif parsed is None and entry is None:
        reasons.append(_unknown(facts))
    elif defn is None:
        assert isinstance(parsed, Malformed)
        reasons.append(_malformed(facts, parsed))
    else:
        reasons += _device_reasons(facts)
        reasons += _placement(facts, defn)
        reasons += _definition(facts, defn, entry)
        reasons += _state(facts, defn, entry)
    blocking = [r for r in reasons if r.blocking]
    fires = not blocking
    if defn is not None:
        reasons += _notes(facts, defn, entry)
    look = shown(facts, defn, reasons)
    if fires:
        # Not armed yet (adopted next tick, or a claim to confirm): the spec's next fires.
        armed = entry is not None and entry.row.claimed_at is None
        ahead = list(facts.next_fires) if armed else _after_claim(facts, defn)
        return Answer(facts.id, True, facts.peer_id, ahead, reasons, facts.now, look)
    # Only where it belongs stops it here: it fires on that device, if that one is live.
    elsewhere = all(r.cause in (Cause.PINNED_ELSEWHERE, Cause.STANDBY) for r in blocking)
    if elsewhere and device is not None and device_state(facts, device) == LIVE:
        return Answer(facts.id, False, device, list(facts.spec_fires), reasons, facts.now, look)
    return Answer(facts.id, False, None, [], reasons, facts.now, look)


def _after_claim(facts: WhyFacts, defn: TriggerDef | None) -> list[float]:
    """Return the fires of a trigger not armed yet: the spec's, from when a claim in flight
    is confirmed (a cron's occurrence before then is not fired; a once fires when armed)."""
    row = facts.entry.row if facts.entry is not None else None
    if row is None or row.claimed_at is None or defn is None or defn.kind != Kind.CRON:
        return list(facts.spec_fires)
    by = row.claimed_at + facts.confirm_s
    return [t for t in facts.spec_fires if t > by]


_QUIET, _BAD = Severity.QUIET, Severity.BAD
_BY_CAUSE: Mapping[Cause, tuple[TriggerState, str | None, Severity]] = {
    Cause.UNKNOWN: (TriggerState.UNKNOWN, None, _BAD),
    Cause.TOMBSTONED: (TriggerState.DELETED, None, _QUIET),
    Cause.MALFORMED: (TriggerState.MALFORMED, None, _BAD),
    Cause.NO_PEER_ID: (TriggerState.UNASSIGNED, StateReason.NO_PEER_ID, Severity.WARN),
    Cause.DEVICE_PRUNED: (TriggerState.CANNOT_RUN, StateReason.DEVICE_PRUNED, _BAD),
    Cause.PINNED_ELSEWHERE: (TriggerState.PINNED_ELSEWHERE, None, _QUIET),
    Cause.STANDBY: (TriggerState.UNASSIGNED, StateReason.STANDBY, _QUIET),
    Cause.TAKEOVER_HOLD: (TriggerState.UNASSIGNED, StateReason.TAKEOVER_HOLD, Severity.BUSY),
    Cause.AUTO_DISABLED: (TriggerState.AUTO_DISABLED, None, _BAD),
    Cause.CONSUMED: (TriggerState.CONSUMED, None, _QUIET),
    Cause.DISABLED: (TriggerState.DISABLED, None, _QUIET),
    Cause.NO_NEXT_FIRE: (TriggerState.IDLE, StateReason.NO_NEXT_FIRE, Severity.WARN),
}


def shown(facts: WhyFacts, defn: TriggerDef | None, reasons: Sequence[Reason]) -> Shown:
    """Return the state a trigger shows: its first blocking reason's, or, when it fires here,
    what it is doing (running, being claimed or adopted, listening, scheduled)."""
    blocking = [r for r in reasons if r.blocking]
    if blocking:
        first = blocking[0]
        if first.cause in (Cause.MARKER, Cause.NOT_INSTALLED):
            word = str(first.facts.get("marker") or StateReason.NOT_INSTALLED)
            if facts.standing and word == StateReason.NOT_INSTALLED:
                return Shown(TriggerState.UNAVAILABLE, word, _QUIET)
            return Shown(TriggerState.CANNOT_RUN, word, _BAD)
        # The list has no devices registry at hand: the state never reads it.
        return Shown(*_BY_CAUSE[first.cause])
    causes = {r.cause for r in reasons}
    entry = facts.entry
    if entry is not None and entry.running:
        return Shown(TriggerState.RUNNING, None, Severity.BUSY)
    if Cause.CLAIMING in causes:
        return Shown(TriggerState.CLAIMING, None, Severity.BUSY)
    if Cause.NOT_ADOPTED in causes and defn is not None:
        here = TriggerState.UNASSIGNED if is_unassigned(defn.owner) else TriggerState.PINNED_HERE
        return Shown(here, StateReason.NOT_ADOPTED, Severity.BUSY)
    if defn is not None and defn.kind == Kind.EVENT:
        return Shown(TriggerState.LISTENING, None, Severity.OK)
    if entry is not None and entry.row.next_fire is not None:
        return Shown(TriggerState.SCHEDULED, None, Severity.OK)
    return Shown(TriggerState.IDLE, None, Severity.WARN)


def _device(facts: WhyFacts, defn: TriggerDef | None) -> str | None:
    """Return the device a valid trigger belongs on, as far as this device can tell."""
    if defn is None:
        return None
    if not is_unassigned(defn.owner):
        return defn.owner if device_state(facts, defn.owner) != PRUNED else None
    return facts.winner


# the record


def _unknown(facts: WhyFacts) -> Reason:
    return Reason(
        Cause.UNKNOWN,
        f"no trigger {facts.id!r} among this daemon's records",
        {"id": facts.id},
        "anyrtd triggers list --all",
    )


def _tombstoned(facts: WhyFacts) -> Reason:
    return Reason(
        Cause.TOMBSTONED,
        f"trigger {facts.id!r} was deleted: its id is tombstoned and cannot be reused",
        {"id": facts.id, "tombstoned": True},
        "anyrtd triggers create --id NEW-ID ...",
    )


def _malformed(facts: WhyFacts, bad: Malformed) -> Reason:
    at_fault = malformed_field(bad.reason)
    target = at_fault.split(".")[0] if at_fault else "FIELD"
    return Reason(
        Cause.MALFORMED,
        f"the record is malformed, so no device adopts it: {bad.reason}",
        {"field": at_fault, "reason": bad.reason, "version": bad.version},
        f"anyrtd triggers edit {facts.id} --set {target}=JSON",
    )


# this device


def _device_reasons(facts: WhyFacts) -> list[Reason]:
    out: list[Reason] = []
    if facts.peer_id is None:
        out.append(
            Reason(
                Cause.NO_PEER_ID,
                "this device has no peer id yet: the server has not answered since it started",
                {"peerId": None},
                "anyrtd doctor",
            )
        )
    if facts.verdict == Verdict.PRUNED:
        me = facts.peer_id or "this device"
        elsewhere = facts.winner if facts.winner and facts.winner != facts.peer_id else "PEER"
        out.append(
            Reason(
                Cause.DEVICE_PRUNED,
                f"this device ({me}) is pruned in the devices registry: it fires nothing, "
                "pins included, until a fresh init gives it a new peer id",
                {"peerId": facts.peer_id, "deviceState": PRUNED, "verdict": facts.verdict},
                f"anyrtd triggers pin {facts.id} {elsewhere}",
            )
        )
    return out


# where the trigger belongs


def _placement(facts: WhyFacts, defn: TriggerDef) -> list[Reason]:
    me, owner = facts.peer_id, defn.owner
    if not is_unassigned(owner):
        if owner == me:
            return []
        state = device_state(facts, owner)
        name = facts.names.get(owner)
        shown = f"{owner} ({name})" if name else owner
        text = {
            LIVE: f"it is pinned to another device, {shown}, which is live: it fires there",
            PRUNED: f"it is pinned to {shown}, which is pruned: it fires nowhere",
            UNKNOWN: f"it is pinned to {shown}, which the devices registry does not list: "
            "it fires nowhere unless that device comes back",
        }[state]
        silent = _silent_since(facts)
        if state == LIVE and silent is not None:
            since = f"since {iso(silent)}" if silent != float("-inf") else "at all"
            text = (
                f"it is pinned to another device, {shown}, which is live in the devices "
                f"registry but has recorded nothing {since}: it fires there while its anyrtd "
                "runs"
            )
        return [
            Reason(
                Cause.PINNED_ELSEWHERE,
                text,
                {"owner": owner, "ownerState": state, "ownerName": name, "peerId": me},
                f"anyrtd triggers pin {facts.id} {me or 'here'}",
            )
        ]
    if facts.verdict == Verdict.STANDBY:
        winner = facts.winner
        state = device_state(facts, winner) if winner else UNKNOWN
        where = f"the active device, {winner}, claims it" if winner else "no device is active"
        return [
            Reason(
                Cause.STANDBY,
                f"it is unassigned and this device is on standby, so it may not claim it: {where}",
                {"owner": owner, "verdict": facts.verdict, "winner": winner, "winnerState": state},
                f"anyrtd triggers pin {facts.id} {me or 'here'}",
            )
        ]
    held = facts.hold is not None or not facts.may_claim
    if facts.verdict == Verdict.ACTIVE and facts.entry is None and held:
        hold = dict(facts.hold or {})
        waiting = hold.get("waitingFor")
        text = (
            f"this device took the active role and holds its claims until the stand-down "
            f"beat of {waiting} arrives (at most takeover_hold_s)"
            if waiting
            else "this device may not claim now: the devices registry has not been read "
            "within its lease, or a newer term holds the role"
        )
        return [Reason(Cause.TAKEOVER_HOLD, text, {"owner": owner, **hold}, "anyrtd election")]
    return []


def _silent_since(facts: WhyFacts) -> float | None:
    """Return since when the owner has recorded nothing, when its silence is why the trigger
    missed occurrences (-inf: nothing at all); else None."""
    m = facts.missed
    if m is None or m.last.cause != MissCause.OWNER_NOT_RUNNING:
        return None
    at = m.last.facts.get("lastRecordedAt")
    return float(at) if isinstance(at, int | float) else float("-inf")


# the definition


def _definition(facts: WhyFacts, defn: TriggerDef, entry: Entry | None) -> list[Reason]:
    out: list[Reason] = []
    here = _here(facts, defn)
    pinned = defn.owner == facts.peer_id
    free = facts.peer_id is not None and (pinned or (facts.may_claim and facts.hold is None))
    if entry is None and here and facts.verdict != Verdict.PRUNED and free:
        out.append(
            Reason(
                Cause.NOT_ADOPTED,
                "it belongs on this device and is not adopted yet: the next tick takes it up, "
                "and it fires here from then on",
                {"owner": defn.owner, "verdict": facts.verdict},
                None,
                blocking=False,
            )
        )
    row = entry.row if entry is not None else None
    if row is not None and row.claimed_at is not None:
        by = row.claimed_at + facts.confirm_s
        when = (
            f"by about {iso(by)}, a round trip after the server acknowledges its owner stamp"
            if by > facts.now
            else "as soon as the server acknowledges its owner stamp (within a second or so)"
        )
        out.append(
            Reason(
                Cause.CLAIMING,
                f"this device claimed it at {iso(row.claimed_at)} and confirms the claim {when}:"
                " it is armed then, and fires here from its next occurrence",
                {"claimedAt": row.claimed_at, "confirmBy": by, "owner": defn.owner},
                None,
                blocking=False,
            )
        )
    if facts.chain_loop is not None and defn.enabled:
        shown = show_cycle(facts.chain_loop)
        out.append(
            Reason(
                Cause.MARKER,
                f"it is a chain in a loop ({shown}) and never fires: it would trigger itself",
                {"marker": Marker.INVALID_SPEC, "field": "spec", "loop": list(facts.chain_loop)},
                f"anyrtd triggers edit {facts.id} --after ID",
            )
        )
    if row is not None and row.marker is not None:
        reason = marker_reason(defn, facts.now) or row.marker
        at_fault = "program" if row.marker == Marker.NOT_INSTALLED else "spec"
        fix = (
            "anyrtd programs list"
            if row.marker == Marker.NOT_INSTALLED
            else f"anyrtd triggers edit {facts.id} --set spec=JSON"
        )
        out.append(
            Reason(
                Cause.MARKER,
                f"it is marked {row.marker} and can never fire as it stands: {reason}",
                {"marker": row.marker, "field": at_fault, "reason": reason, "spec": defn.spec},
                fix,
            )
        )
    elif here and not facts.installed:
        out.append(
            Reason(
                Cause.NOT_INSTALLED,
                f"its program {defn.program} is not installed on this device: a run would fail",
                {"program": defn.program, "peerId": facts.peer_id},
                "anyrtd programs list",
            )
        )
    return out


def _here(facts: WhyFacts, defn: TriggerDef) -> bool:
    """Tell whether the trigger belongs on this device (pinned here, or unassigned and active)."""
    if not is_unassigned(defn.owner):
        return defn.owner == facts.peer_id
    return facts.verdict == Verdict.ACTIVE


# its state


def _state(facts: WhyFacts, defn: TriggerDef, entry: Entry | None) -> list[Reason]:
    row = entry.row if entry is not None else None
    enabled = row.enabled if row is not None else defn.enabled
    failures = row.consecutive_failures if row is not None else defn.rollup.consecutive_failures
    consumed = (
        row.consumed
        if row is not None
        else defn.kind == Kind.ONCE and (defn.rollup.last_run_at is not None)
    )
    if enabled:
        armed = row is not None and row.marker is None and row.claimed_at is None
        idle = row is not None and row.next_fire is None and not consumed
        if armed and idle and defn.kind != Kind.EVENT:
            return [
                Reason(
                    Cause.NO_NEXT_FIRE,
                    "it is enabled but has no occurrence ahead",
                    {"kind": defn.kind, "spec": dict(defn.spec)},
                    f"anyrtd triggers edit {facts.id} --set spec=JSON",
                )
            ]
        return []
    if defn.rollup.last_status == LastStatus.AUTO_DISABLED:
        errors = [
            {"runId": f.run_id, "startedAt": f.started_at, "error": f.error} for f in facts.failures
        ]
        return [
            Reason(
                Cause.AUTO_DISABLED,
                f"the breaker disabled it after {failures} consecutive failures "
                f"(limit {defn.max_consecutive_failures})",
                {
                    RollupField.CONSECUTIVE_FAILURES: failures,
                    "maxConsecutiveFailures": defn.max_consecutive_failures,
                    RollupField.LAST_STATUS: defn.rollup.last_status,
                    "lastErrors": errors,
                },
                _args_fix(facts, defn, f" && anyrtd triggers enable {facts.id}")
                or f"anyrtd triggers enable {facts.id}",
            )
        ]
    if defn.kind == Kind.ONCE and consumed:
        run = facts.consumed_run or defn.rollup.last_run_ref
        return [
            Reason(
                Cause.CONSUMED,
                "it is a once that already ran"
                + (f" (run {run})" if run else "")
                + ": it does not fire again",
                {
                    RollupField.LAST_RUN_AT: defn.rollup.last_run_at,
                    "run": run,
                    RollupField.LAST_STATUS: defn.rollup.last_status,
                },
                f"anyrtd triggers edit {facts.id} --at TIME",
            )
        ]
    return [
        Reason(
            Cause.DISABLED,
            "it is disabled",
            {"enabled": False},
            f"anyrtd triggers enable {facts.id}",
        )
    ]


CHAT_NOT_FOUND = "ChatNotFound"
"""The `errorType` of a built-in's run whose chat does not exist (anyrtd/programs/chat.py)."""


def _args_fix(facts: WhyFacts, defn: TriggerDef, then: str) -> str | None:
    """Return the command that fixes what the newest failure says, when it says what: a
    chat that does not exist is fixed by args without it (the general chat), not by enable."""
    newest = facts.failures[0] if facts.failures else None
    if newest is None or newest.error_type != CHAT_NOT_FOUND or "chatId" not in defn.args:
        return None
    args = {k: v for k, v in defn.args.items() if k != "chatId"}
    shown = shlex.quote(json.dumps(args, ensure_ascii=False, separators=(", ", ": ")))
    return f"anyrtd triggers edit {facts.id} --args-json {shown}{then}"


# notes that do not stop it


def _notes(facts: WhyFacts, defn: TriggerDef, entry: Entry | None) -> list[Reason]:
    out: list[Reason] = []
    row = entry.row if entry is not None else None
    failures = row.consecutive_failures if row is not None else defn.rollup.consecutive_failures
    enabled = row.enabled if row is not None else defn.enabled
    if enabled and failures > 0:
        errors = [
            {"runId": f.run_id, "startedAt": f.started_at, "error": f.error} for f in facts.failures
        ]
        out.append(
            Reason(
                Cause.FAILING,
                f"its last {failures} runs failed; the breaker disables it at "
                f"{defn.max_consecutive_failures}",
                {
                    RollupField.CONSECUTIVE_FAILURES: failures,
                    "maxConsecutiveFailures": defn.max_consecutive_failures,
                    "lastErrors": errors,
                },
                _args_fix(facts, defn, "") or f"anyrtd runs list --trigger {facts.id}",
                blocking=False,
            )
        )
    if entry is not None and entry.running:
        out.append(
            Reason(
                Cause.RUNNING,
                "a run is in flight: an occurrence that comes due before it ends is skipped",
                {"running": entry.running},
                None,
                blocking=False,
            )
        )
    if facts.overlap_skips:
        out.append(
            Reason(
                Cause.OVERLAP_SKIPS,
                f"{facts.overlap_skips} occurrences were skipped since the daemon started "
                "because the previous run was still running",
                {"overlapSkips": facts.overlap_skips},
                None,
                blocking=False,
            )
        )
    if facts.missed is not None:
        out.append(missed_reason(facts.missed))
    if facts.chain is not None:
        fired = facts.last_fired_by
        out.append(
            Reason(
                Cause.CHAIN,
                f"it is a chain: it fires {describe(facts.chain)}"
                + (f"; its last run answered run {fired}" if fired else "; it has not fired here"),
                {
                    "upstream": None
                    if facts.chain.trigger_ids is None
                    else sorted(facts.chain.trigger_ids),
                    "lastFiredBy": fired,
                },
                f"anyrtd runs list --trigger {facts.id}",
                blocking=False,
            )
        )
    return out


MISSED_LISTED = 5
"""The newest missed occurrences a `why` lists (`GET /triggers/:id/missed` has them all)."""


def missed_reason(m: Missed) -> Reason:
    """Return the note that a trigger missed occurrences, the newest listed with their causes."""
    n = f"{m.count}{'+' if m.capped else ''}"
    last = m.last
    return Reason(
        Cause.MISSED,
        f"it missed {n} occurrence{'s' if m.count != 1 else ''} since {iso(m.since)}, "
        f"the last at {iso(last.at)}: {last.text}",
        {
            "missed": m.count,
            "occurrences": [
                {"at": o.at, "cause": o.cause, "text": o.text}
                for o in m.occurrences[:MISSED_LISTED]
            ],
        },
        last.fix,
        blocking=False,
    )


__all__ = [
    "LIVE",
    "PRUNED",
    "UNKNOWN",
    "Answer",
    "Failure",
    "Here",
    "Reason",
    "Shown",
    "WhyFacts",
    "device_state",
    "explain",
    "list_facts",
    "malformed_field",
    "missed_reason",
]
