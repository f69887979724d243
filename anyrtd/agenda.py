"""The agenda: what the space's triggers will run, where, in the next hours, and what is at
risk of being missed as things stand (pure).

Every device holds every trigger record of the space, so any device can list every enabled
trigger's next occurrences, wherever it is pinned, with its owner device's state as the
missed watch knows it (anyrtd/watch.py): running, standby, not running since a time,
pruned, unknown, unassigned. An occurrence is **at risk** when it will be missed unless
something changes: its device is pruned, not in the devices registry, or not running; the
breaker disabled the trigger; or it is unassigned and no device is active to claim it. Each
risk has the cause a miss would have (`MissCause`) and the command that helps, as `why`
gives it. Nothing here reads the clock: `now` and every fact come in (docs/cli.md, "agenda").

Event triggers have no times. A trigger that follows another (a chain: the `follows`
function says which upstream triggers it answers) appears right after each of its
upstreams' occurrences, with the upstream's id in `after`; every other event trigger is
listed once, without a time, in `listening`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from anyrtd.missed import Missed, iso
from anyrtd.model import STANDING_BUILTINS, TriggerDef, chain_of
from anyrtd.schedule import CronSchedule, EverySchedule, OnceSchedule
from anyrtd.vocab import DeviceState, Kind, LastStatus, MissCause, OwnerState, is_unassigned

DEFAULT_HOURS = 24.0
MAX_HOURS = 168.0
"""The longest window an agenda covers: a week."""
PER_TRIGGER = 100
"""The most occurrences listed per trigger in one window (its id is then in `capped`)."""
MAX_OCCURRENCES = 10_000
"""The most occurrences one agenda lists, earliest first (then `truncated`)."""
MAX_CHAIN_DEPTH = 10
"""How many links of a chain are followed from a timed trigger."""

Follows = Callable[[TriggerDef], Sequence[str] | None]
"""Which triggers an event trigger answers (its upstreams), or None when it answers none
of them (it listens to something else)."""


def no_follows(defn: TriggerDef) -> Sequence[str] | None:
    """Return None: no event trigger follows another."""
    return None


def chain_follows(defn: TriggerDef) -> Sequence[str] | None:
    """Return the upstream triggers a chain names in its filter (docs/events.md, "Chains"),
    else None: an event trigger on chat messages, or a chain on every trigger's runs, which
    follows no one trigger's occurrences and is listed once in `listening`."""
    f = chain_of(defn)
    return sorted(f.trigger_ids) if f is not None and f.trigger_ids else None


def parse_hours(text: str | None) -> float:
    """Return the window in hours that `text` asks for; raise ValueError saying what is wrong."""
    if text is None or text == "":
        return DEFAULT_HOURS
    try:
        hours = float(text)
    except ValueError:
        raise ValueError(
            f"hours must be a number of hours, like 24 (at most {MAX_HOURS:g}), not {text!r}"
        ) from None
    if not math.isfinite(hours) or not 0 < hours <= MAX_HOURS:
        raise ValueError(
            f"hours must be more than 0 and at most {MAX_HOURS:g} (a week), not {text!r}"
        )
    return hours


@dataclass(frozen=True)
class Scene:
    """What holds for every trigger of one agenda: the time and the devices."""

    now: float
    peer_id: str | None
    """This device's peer id."""
    devices: Mapping[str, DeviceState] | None
    """Each peer id's state in the devices registry; None when it was not read."""
    names: Mapping[str, str] = field(default_factory=dict)
    winner: str | None = None
    """The active device, as the election last read it (None: none is active, or unread)."""
    silent: Mapping[str, float] = field(default_factory=dict)
    """Since when each device the missed watch found silent has recorded nothing (-inf:
    nothing at all): `silences` of its last answer."""


def silences(missed: Iterable[Missed]) -> dict[str, float]:
    """Return since when each device recorded nothing, where a missed occurrence of a
    trigger it holds says so (cause `owner_not_running`; -inf: nothing at all)."""
    found: dict[str, float] = {}
    for m in missed:
        if m.last.cause != MissCause.OWNER_NOT_RUNNING:
            continue
        at = m.last.facts.get("lastRecordedAt")
        since = float(at) if isinstance(at, int | float) else float("-inf")
        found[m.owner] = max(found.get(m.owner, since), since)
    return found


@dataclass(frozen=True)
class Owner:
    """Where a trigger fires and what is known of that device."""

    peer: str
    """The record's `owner` ("" or a stamp: unassigned)."""
    device: str | None
    """The device that fires it: the owner, or the active device for an unassigned one."""
    state: OwnerState
    since: float | None = None
    """Since when a `not_running` device has recorded nothing (None: never, or not silent)."""
    name: str | None = None

    @property
    def label(self) -> str:
        who = self.device or ""
        return f"{self.name} ({who})" if self.name else who

    @property
    def state_text(self) -> str:
        """Return the state as a reader says it: `not running since ...`."""
        if self.state == OwnerState.NOT_RUNNING:
            return "not running " + (f"since {iso(self.since)}" if self.since else "at all")
        return self.state.replace("_", " ")


@dataclass(frozen=True)
class Risk:
    """Why an occurrence will be missed as things stand, and the command that helps."""

    cause: MissCause
    text: str
    fix: str


@dataclass(frozen=True)
class Occurrence:
    """One occurrence of a trigger in the window (`at` None: an event trigger's)."""

    trigger_id: str
    at: float | None
    kind: Kind
    tz: str
    """The zone of its schedule (`UTC` unless a cron names one)."""
    owner: Owner
    risk: Risk | None
    after: str | None = None
    """The upstream trigger whose occurrence it follows (a chain), else None."""
    depth: int = 0

    @property
    def at_risk(self) -> bool:
        return self.risk is not None


@dataclass(frozen=True)
class Agenda:
    """Every enabled trigger's occurrences in (now, until], earliest first."""

    now: float
    until: float
    occurrences: Sequence[Occurrence]
    listening: Sequence[Occurrence]
    """Event triggers that follow no timed trigger: no times, listed once each."""
    capped: Sequence[str]
    """Triggers with more than `PER_TRIGGER` occurrences in the window."""
    truncated: bool
    """Whether the list stopped at `MAX_OCCURRENCES`."""


def owner_of(defn: TriggerDef, scene: Scene) -> Owner:
    """Return the device that fires `defn` and its state as the missed watch knows it."""
    if is_unassigned(defn.owner):
        winner = scene.winner
        name = scene.names.get(winner) if winner else None
        return Owner(defn.owner, winner, OwnerState.UNASSIGNED, None, name)
    peer = defn.owner
    name = scene.names.get(peer)
    state = scene.devices.get(peer) if scene.devices is not None else None
    if state == DeviceState.PRUNED:
        return Owner(peer, peer, OwnerState.PRUNED, None, name)
    if scene.devices is not None and state is None:
        return Owner(peer, peer, OwnerState.UNKNOWN, None, name)
    if peer != scene.peer_id:
        silent = scene.silent.get(peer)
        if silent is not None:
            since = silent if silent != float("-inf") else None
            return Owner(peer, peer, OwnerState.NOT_RUNNING, since, name)
    if scene.devices is None and peer != scene.peer_id:
        return Owner(peer, peer, OwnerState.UNKNOWN, None, name)
    running = peer in (scene.peer_id, scene.winner)
    return Owner(peer, peer, OwnerState.RUNNING if running else OwnerState.STANDBY, None, name)


def risk_of(defn: TriggerDef, owner: Owner, scene: Scene) -> Risk | None:
    """Return why `defn`'s occurrences will be missed as things stand, or None."""
    if not defn.enabled:
        return Risk(
            MissCause.AUTO_DISABLED,
            f"the breaker disabled it after {defn.rollup.consecutive_failures} consecutive "
            f"failures (limit {defn.max_consecutive_failures})",
            f"anyrtd triggers enable {defn.id}",
        )
    return device_risk(defn.id, owner, scene)


def device_risk(tid: str, owner: Owner, scene: Scene) -> Risk | None:
    """Return why an enabled trigger `tid` on `owner` will miss its occurrences, or None."""
    pin = f"anyrtd triggers pin {tid} PEER"
    label = owner.label
    if owner.state == OwnerState.UNASSIGNED:
        if owner.device is None and scene.devices is not None:
            return Risk(
                MissCause.UNASSIGNED,
                "it is unassigned and no device is active to claim it",
                f"anyrtd triggers pin {tid} {scene.peer_id or 'PEER'}",
            )
        return None
    if owner.state == OwnerState.PRUNED:
        return Risk(
            MissCause.OWNER_PRUNED,
            f"device {label} is pruned in the devices registry: it fires nothing",
            pin,
        )
    if owner.state == OwnerState.UNKNOWN and scene.devices is not None:
        return Risk(MissCause.OWNER_UNKNOWN, f"device {label} is not in the devices registry", pin)
    if owner.state == OwnerState.NOT_RUNNING:
        return Risk(
            MissCause.OWNER_NOT_RUNNING,
            f"device {label} not running: it has recorded nothing "
            + (f"since {iso(owner.since)}" if owner.since is not None else "at all"),
            f"start anyrtd on {label}, or move it: {pin}",
        )
    return None


def listed(defn: TriggerDef) -> bool:
    """Tell whether the agenda lists `defn`: enabled, or switched off by the breaker."""
    if defn.id in STANDING_BUILTINS:
        return False
    return defn.enabled or defn.rollup.last_status == LastStatus.AUTO_DISABLED


def zone_name(defn: TriggerDef) -> str:
    """Return the zone a trigger's times are shown in."""
    s = defn.schedule
    return (s.tz or "UTC") if isinstance(s, CronSchedule) else "UTC"


def times(defn: TriggerDef, now: float, until: float) -> Iterator[float]:
    """Yield `defn`'s occurrences in (now, until], at most `PER_TRIGGER` + 1 of them."""
    s = defn.schedule
    if defn.kind == Kind.ONCE:
        if isinstance(s, OnceSchedule) and defn.rollup.last_run_at is None and now < s.at <= until:
            yield s.at
        return
    if defn.kind != Kind.CRON:
        return
    # An `every_s` grid is anchored where its owner armed it; the last run stands for it.
    last = defn.rollup.last_run_at
    anchor = last if isinstance(s, EverySchedule) and last is not None else now
    t, n = now, 0
    while n <= PER_TRIGGER:
        nxt = s.next_after(t, anchor)
        if nxt is None or nxt > until:
            return
        yield nxt
        t, n = nxt, n + 1


def agenda(
    defs: Iterable[TriggerDef],
    scene: Scene,
    *,
    hours: float = DEFAULT_HOURS,
    device: str | None = None,
    follows: Follows = chain_follows,
    at_risk_only: bool = False,
) -> Agenda:
    """Return the agenda of `defs` in (now, now + hours], earliest first.

    `device` keeps the occurrences of one device (its peer id or name); `follows` names the
    upstreams of an event trigger (by default a chain's filter: `chain_follows`);
    `at_risk_only` walks
    only the triggers at risk (what the notice before the miss needs; chains then list only
    the ones whose own device is at risk).
    """
    now = scene.now
    until = now + hours * 3600.0
    shown = [d for d in defs if listed(d)]
    # A device's state is worked out once per owner value, not once per trigger.
    by_owner: dict[str, Owner] = {}
    owners: dict[str, Owner] = {}
    for d in shown:
        o = by_owner.get(d.owner)
        if o is None:
            o = by_owner[d.owner] = owner_of(d, scene)
        owners[d.id] = o
    if at_risk_only:
        risky = {peer: device_risk("ID", o, scene) is not None for peer, o in by_owner.items()}
        shown = [d for d in shown if not d.enabled or risky[d.owner]]
    risks = {d.id: risk_of(d, owners[d.id], scene) for d in shown}
    capped: list[str] = []

    def stream(d: TriggerDef) -> Iterator[tuple[float, int, str, Occurrence]]:
        tz, owner, risk = zone_name(d), owners[d.id], risks[d.id]
        for i, at in enumerate(times(d, now, until)):
            if i == PER_TRIGGER:
                capped.append(d.id)
                return
            yield at, 0, d.id, Occurrence(d.id, at, d.kind, tz, owner, risk)

    timed = [d for d in shown if d.kind in (Kind.CRON, Kind.ONCE)]
    events = [d for d in shown if d.kind == Kind.EVENT]
    upstreams = {d.id: tuple(u) for d in events if (u := follows(d))}
    out: list[Occurrence] = []
    truncated = False
    for _, _, _, occ in heapq.merge(*(stream(d) for d in timed)):
        if len(out) == MAX_OCCURRENCES:
            truncated = True
            break
        out.append(occ)
    out = _with_chains(out, {d.id: d for d in events}, upstreams, owners, risks)
    listening = [
        Occurrence(d.id, None, d.kind, "UTC", owners[d.id], risks[d.id])
        for d in sorted(events, key=lambda d: d.id)
        if d.id not in upstreams
    ]
    if device is not None:
        out = [o for o in out if _on(o.owner, device)]
        listening = [o for o in listening if _on(o.owner, device)]
    return Agenda(now, until, out, listening, sorted(capped), truncated)


def _with_chains(
    timed: Sequence[Occurrence],
    events: Mapping[str, TriggerDef],
    upstreams: Mapping[str, Sequence[str]],
    owners: Mapping[str, Owner],
    risks: Mapping[str, Risk | None],
) -> list[Occurrence]:
    """Return `timed` with each chain's occurrence placed right after its upstream's."""
    if not upstreams:
        return list(timed)
    followers: dict[str, list[str]] = {}
    for tid, ups in upstreams.items():
        for u in ups:
            followers.setdefault(u, []).append(tid)
    out: list[Occurrence] = []

    def follow(occ: Occurrence) -> None:
        out.append(occ)
        if occ.depth >= MAX_CHAIN_DEPTH:
            return
        for tid in sorted(followers.get(occ.trigger_id, ())):
            d = events[tid]
            risk = risks[tid]
            if risk is None and occ.risk is not None:
                risk = Risk(
                    occ.risk.cause,
                    f"it follows {occ.trigger_id}, which is at risk: {occ.risk.text}",
                    occ.risk.fix,
                )
            follow(
                Occurrence(
                    tid, occ.at, d.kind, occ.tz, owners[tid], risk, occ.trigger_id, occ.depth + 1
                )
            )

    for occ in timed:
        follow(occ)
    return out


def _on(owner: Owner, device: str) -> bool:
    return device in (owner.device, owner.peer) or (owner.name is not None and owner.name == device)


__all__ = [
    "DEFAULT_HOURS",
    "MAX_HOURS",
    "MAX_OCCURRENCES",
    "PER_TRIGGER",
    "Agenda",
    "Follows",
    "Occurrence",
    "Owner",
    "Risk",
    "Scene",
    "agenda",
    "chain_follows",
    "device_risk",
    "listed",
    "no_follows",
    "owner_of",
    "parse_hours",
    "risk_of",
    "silences",
    "times",
    "zone_name",
]
