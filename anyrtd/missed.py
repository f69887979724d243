"""Missed occurrences: what a cron or `once` should have run and did not, and why (pure).

Every device holds every trigger record of the space, and each record's rollup says when
it last ran (`lastRunAt`, written by the device that ran it). An enabled trigger's
occurrences after that run (or after this device first saw its definition, for one that
never ran or was edited since), more than a grace ago, that no run answers are missed. Each
gets the cause that can be known: the owner device has recorded nothing since before it
(its daemon is stopped or the device is offline), the owner is pruned or not in the
devices registry, nobody holds it, this device was down, the trigger was disabled or
auto-disabled, this daemon skipped it after a stall, the previous run was still running
(an overlap skip). Nothing here reads the clock or does I/O: `now` and every fact come in
(docs/notices.md).

A stretch known to have run nothing (a `Gap`: the trigger was switched off, or this
daemon skipped its occurrences after a stall) is a fact, not a guess: a later run does not
answer its occurrences, which stay listed for the look-back.

The look-back is bounded (`DEFAULT_LOOKBACK_S`, a day) and so is the count of occurrences
walked per trigger (`MAX_WALKED`), so a trigger that was off for a year costs as much as
one that was off for a day.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from anyrtd.model import TriggerDef, once_at
from anyrtd.schedule.specs import EverySchedule
from anyrtd.vocab import DeviceState, Kind, LastStatus, MissCause, is_unassigned

MIN_GRACE_S = 60.0
"""The smallest default grace: an occurrence is missed only this long after it was due."""
DEFAULT_LOOKBACK_S = 86_400.0
"""How far back occurrences are looked for (a day)."""
MAX_WALKED = 1000
"""The most occurrences walked per trigger: a count at the cap is shown as `capped`."""
LISTED = 20
"""The newest missed occurrences listed per trigger (the count covers them all)."""
SAME_OCCURRENCE_S = 1.0
"""A run's `scheduledAt` this close to an occurrence answers it."""
MAX_GAPS = 8
"""The most stretches kept per trigger (of each kind), the newest."""


def default_grace(tick_s: float, run_timeout_s: float) -> float:
    """Return the default grace: one tick plus the run budget, at least `MIN_GRACE_S`.

    A run's rollup is written when the run ends, so an occurrence is judged only once its
    run had the whole budget to end and one tick to be recorded.
    """
    return max(MIN_GRACE_S, tick_s + run_timeout_s)


@dataclass(frozen=True)
class Scene:
    """What holds for every trigger of one pass: the time, the bounds, the devices."""

    now: float
    grace_s: float
    peer_id: str | None
    """This device's peer id."""
    up_since: float | None = None
    """When this device's daemon started (occurrences before it, pinned here: it was down)."""
    devices: Mapping[str, DeviceState] | None = None
    """Each peer id's state in the devices registry; None when the registry was not read."""
    names: Mapping[str, str] = field(default_factory=dict)
    device_seen: Mapping[str, float] = field(default_factory=dict)
    """The last time each device is known to have recorded a run, besides the rollups."""
    lookback_s: float = DEFAULT_LOOKBACK_S


@dataclass(frozen=True)
class Gap:
    """A stretch in which a trigger's occurrences did not run, for a known `cause`: it was
    switched off (`disabled`, `auto_disabled`) from `start` until `end`, or this daemon
    skipped the occurrence due at `start` and those after it until `end` (`stall_skip`)."""

    start: float
    end: float
    cause: MissCause
    after: float | None = None
    """The trigger's last run when the stretch ended: an occurrence before it is not the
    stretch's (the owner may have run it before it saw the disable)."""


@dataclass(frozen=True)
class Watched:
    """One trigger as this device has watched it."""

    defn: TriggerDef
    first_seen: float
    """When this device first saw this definition enabled (its daemon's start, at the latest)."""
    changed: bool = False
    """Whether the definition or `enabled` changed while this device watched it."""
    off: MissCause | None = None
    """What it was before it was enabled again (`disabled`, `auto_disabled`), when it was."""
    scheduled: Sequence[float] = ()
    """The `scheduledAt` of its runs that this device knows of."""
    off_since: float | None = None
    """Since when this device has seen it switched off, while it is."""
    gaps: tuple[Gap, ...] = ()
    """The stretches this device saw it switched off, oldest first (`sight` keeps them)."""
    skips: tuple[Gap, ...] = ()
    """The stretches this daemon skipped after a stall (the watch's to fill, from `Skips`)."""


@dataclass(frozen=True)
class Occurrence:
    """One missed occurrence, its cause, the fact behind it and the command that helps."""

    at: float
    cause: MissCause
    text: str
    fix: str | None
    facts: Mapping[str, Any]


@dataclass(frozen=True)
class Missed:
    """The missed occurrences of one trigger, newest first (at most `LISTED` of them)."""

    trigger_id: str
    owner: str
    count: int
    capped: bool
    """Whether the walk stopped at `MAX_WALKED`: there may be more."""
    occurrences: Sequence[Occurrence]
    since: float
    """Where the look-back started: the last run, the definition's first sighting, or the bound."""
    episode: str
    """The same for every device and every pass until the trigger runs or changes: the key
    a notice about these occurrences is sent under once."""

    @property
    def last(self) -> Occurrence:
        return self.occurrences[0]


def iso(ts: float) -> str:
    """Return a UTC time as the notices and the texts show it."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def last_recorded(defs: Iterable[TriggerDef], extra: Mapping[str, float]) -> dict[str, float]:
    """Return, per owner device, the latest `lastRunAt` among the triggers it holds."""
    seen: dict[str, float] = dict(extra)
    for d in defs:
        at = d.rollup.last_run_at
        owned = d.owner and not is_unassigned(d.owner)
        if at is not None and owned and at > seen.get(d.owner, float("-inf")):
            seen[d.owner] = at
    return seen


def find_missed(watched: Iterable[Watched], scene: Scene) -> list[Missed]:
    """Return the triggers that missed occurrences, in id order."""
    items = list(watched)
    seen = last_recorded((w.defn for w in items), scene.device_seen)
    out = [m for w in items if (m := missed_of(w, scene, seen)) is not None]
    return sorted(out, key=lambda m: m.trigger_id)


def first_due(w: Watched) -> float | None:
    """Return the earliest occurrence that could be missed as long as the trigger neither runs
    nor changes (None: none can be): until it is more than a grace ago, nothing is."""
    defn = w.defn
    if not defn.enabled or defn.kind not in (Kind.CRON, Kind.ONCE):
        return None
    if defn.kind == Kind.ONCE:
        return once_at(defn) if defn.rollup.last_run_at is None else None
    since = _since(w)
    anchor = since if isinstance(defn.schedule, EverySchedule) else 0.0
    firsts = [defn.schedule.next_after(since, anchor)]
    firsts += [next(iter(_in_gap(defn, g, float("-inf"), g.end, 1)[0]), None) for g in _gaps(w)]
    return min((t for t in firsts if t is not None), default=None)


def _gaps(w: Watched) -> tuple[Gap, ...]:
    return (*w.gaps, *w.skips)


def _in_gap(
    defn: TriggerDef, g: Gap, bound: float, until: float, most: int
) -> tuple[list[float], bool]:
    """Return the occurrences of `defn` in the stretch `g` that are at or past `bound` and
    before `until`, at most `most` of them, and whether capped."""
    schedule = defn.schedule
    # An `every_s` grid: anchored at the last run before the stretch, or at the skipped one.
    base = g.after if g.after is not None else g.start
    anchor = base if isinstance(schedule, EverySchedule) else 0.0
    end = min(g.end, until)
    times: list[float] = []
    if g.cause == MissCause.STALL_SKIP and bound <= g.start < end:
        times.append(g.start)  # the occurrence it skipped, due then
    t = max(g.start, base, bound - 1e-6)  # the walk takes the occurrences strictly after
    while len(times) < most:
        nxt = schedule.next_after(t, anchor)
        if nxt is None or nxt >= end:
            return times, False
        times.append(nxt)
        t = nxt
    nxt = schedule.next_after(t, anchor)
    return times, nxt is not None and nxt < end


def _since(w: Watched) -> float:
    """Return where a cron's look-back starts, before the bound: its last run, or when this
    device first saw its definition (never ran, or edited since)."""
    last_run = w.defn.rollup.last_run_at
    if last_run is None:
        return w.first_seen
    if w.changed and w.off is None:
        return max(last_run, w.first_seen)  # an edit: the old schedule's runs say nothing
    return last_run


def missed_of(w: Watched, scene: Scene, seen: Mapping[str, float]) -> Missed | None:
    """Return one trigger's missed occurrences, or None when it missed none."""
    defn = w.defn
    if not defn.enabled or defn.kind not in (Kind.CRON, Kind.ONCE):
        return None
    until = scene.now - scene.grace_s
    bound = scene.now - scene.lookback_s
    last_run = defn.rollup.last_run_at
    times: list[float]
    if defn.kind == Kind.ONCE:
        at = once_at(defn)
        if at is None or last_run is not None or not bound <= at < until:
            return None
        times, capped, since = [at], False, at
        episode = f"{defn.id}:once:{at!r}"
    else:
        since = max(_since(w), bound)
        times, capped = _walk(defn, since, until)
        gaps = _gaps(w)
        if gaps:
            # A stretch's occurrences are its own, whatever ran after them.
            times = [t for t in times if _gap_of(t, gaps) is None]
            for g in gaps:
                more, cut = _in_gap(defn, g, bound, until, MAX_WALKED)
                times += more
                capped = capped or cut
            times = sorted(set(times))
            if len(times) > MAX_WALKED:
                times, capped = times[-MAX_WALKED:], True
        episode = (
            f"{defn.id}:after:{last_run!r}"
            if last_run is not None
            else f"{defn.id}:never:{defn.fingerprint}"
        )
    answered = sorted(w.scheduled)
    times = [t for t in times if not _answered(t, answered)]
    if not times:
        return None
    listed = [_occurrence(t, w, scene, seen) for t in reversed(times[-LISTED:])]
    return Missed(defn.id, defn.owner, len(times), capped, listed, since, episode)


def _walk(defn: TriggerDef, since: float, until: float) -> tuple[list[float], bool]:
    """Return the occurrences in (since, until), at most `MAX_WALKED`, and whether capped."""
    schedule = defn.schedule
    times: list[float] = []
    t = since
    # An `every_s` grid is anchored where its entry was armed, which only the owner knows:
    # the last run (or the first sighting) stands for it.
    anchor = since if isinstance(schedule, EverySchedule) else 0.0
    while len(times) < MAX_WALKED:
        nxt = schedule.next_after(t, anchor)
        if nxt is None or nxt >= until:
            return times, False
        times.append(nxt)
        t = nxt
    nxt = schedule.next_after(t, anchor)
    return times, nxt is not None and nxt < until


def _gap_of(at: float, gaps: Sequence[Gap]) -> Gap | None:
    """Return the newest stretch that holds the occurrence `at`, or None."""
    for g in reversed(gaps):
        if g.start <= at < g.end and (g.after is None or at > g.after):
            return g
    return None


def _gap_occurrence(at: float, g: Gap, tid: str) -> Occurrence:
    if g.cause == MissCause.STALL_SKIP:
        return Occurrence(
            at,
            g.cause,
            f"this daemon skipped it: it was stopped or its machine paused until "
            f"{iso(g.end)}, and a missed occurrence does not fire late",
            f"anyrtd runs list --trigger {tid}",
            {"skippedAt": g.end},
        )
    was = "the breaker had disabled it" if g.cause == MissCause.AUTO_DISABLED else "disabled"
    return Occurrence(at, g.cause, f"it was {was} until {iso(g.end)}", None, {"enabledAt": g.end})


def _answered(at: float, scheduled: Sequence[float]) -> bool:
    i = bisect.bisect_left(scheduled, at - SAME_OCCURRENCE_S)
    return i < len(scheduled) and scheduled[i] <= at + SAME_OCCURRENCE_S


def _label(peer: str, scene: Scene) -> str:
    name = scene.names.get(peer)
    return f"{name} ({peer})" if name else peer


def _occurrence(at: float, w: Watched, scene: Scene, seen: Mapping[str, float]) -> Occurrence:
    """Return one missed occurrence with its cause: the first rule that holds, in order."""
    defn = w.defn
    tid, owner, rollup = defn.id, defn.owner, defn.rollup
    pin = f"anyrtd triggers pin {tid} PEER"
    if (g := _gap_of(at, _gaps(w))) is not None:
        return _gap_occurrence(at, g, tid)
    if w.off is not None and at < w.first_seen:
        was = "the breaker had disabled it" if w.off == MissCause.AUTO_DISABLED else "disabled"
        return Occurrence(
            at, w.off, f"it was {was} until {iso(w.first_seen)}", None, {"enabledAt": w.first_seen}
        )
    last = rollup.last_run_at
    took = rollup.last_duration_ms
    if last is not None and took is not None and last < at < last + took / 1000.0:
        return Occurrence(
            at,
            MissCause.OVERLAP_SKIP,
            f"the run that started at {iso(last)} was still running (an overlap skip)",
            f"anyrtd runs list --trigger {tid}",
            {"lastRunAt": last, "lastDurationMs": took},
        )
    if is_unassigned(owner):
        return Occurrence(
            at,
            MissCause.UNASSIGNED,
            "no device holds it: the active device claims an unassigned trigger",
            "anyrtd election",
            {"owner": owner},
        )
    if owner == scene.peer_id:
        if scene.up_since is not None and at < scene.up_since:
            return Occurrence(
                at,
                MissCause.THIS_DEVICE_DOWN,
                f"this device was down: its anyrtd started at {iso(scene.up_since)}",
                "anyrtd service install",
                {"owner": owner, "upSince": scene.up_since},
            )
        return Occurrence(
            at,
            MissCause.UNKNOWN,
            "this device was running and did not record it",
            f"anyrtd triggers why {tid}",
            {"owner": owner},
        )
    state = DeviceState.UNKNOWN if scene.devices is None else scene.devices.get(owner)
    label = _label(owner, scene)
    if state == DeviceState.PRUNED:
        return Occurrence(
            at,
            MissCause.OWNER_PRUNED,
            f"device {label} is pruned in the devices registry: it fires nothing",
            pin,
            {"owner": owner, "deviceState": DeviceState.PRUNED},
        )
    if scene.devices is not None and state is None:
        return Occurrence(
            at,
            MissCause.OWNER_UNKNOWN,
            f"device {label} is not in the devices registry",
            pin,
            {"owner": owner, "deviceState": DeviceState.UNKNOWN},
        )
    recorded = seen.get(owner)
    if recorded is None or recorded < at:
        since = f"since {iso(recorded)}" if recorded is not None else "at all"
        return Occurrence(
            at,
            MissCause.OWNER_NOT_RUNNING,
            f"device {label} not running: it has recorded nothing {since}",
            f"start anyrtd on {label}, or move it: {pin}",
            {"owner": owner, "lastRecordedAt": recorded},
        )
    return Occurrence(
        at,
        MissCause.UNKNOWN,
        f"device {label} recorded runs after it, but not this one",
        f"anyrtd triggers why {tid} (on {label})",
        {"owner": owner, "lastRecordedAt": recorded},
    )


def sight(before: Watched | None, d: TriggerDef, now: float) -> Watched:
    """Return a trigger as watched once its definition `d` is seen at `now`: a definition or
    `enabled` that changed since `before` counts from now, and remembers what it was before
    it was enabled again. (`scheduled` is the reader's to fill.)"""
    if before is None:
        return Watched(d, now, off_since=None if d.enabled else now)
    old = before.defn
    if old.fingerprint == d.fingerprint and old.enabled == d.enabled:
        return Watched(
            d,
            before.first_seen,
            before.changed,
            before.off,
            off_since=before.off_since,
            gaps=before.gaps,
        )
    off = None
    # An edit drops the stretches: the old schedule's occurrences say nothing of the new one.
    gaps = before.gaps if old.fingerprint == d.fingerprint else ()
    off_since = None
    if not old.enabled and d.enabled:
        auto = before.off == MissCause.AUTO_DISABLED
        auto = auto or d.rollup.last_status == LastStatus.AUTO_DISABLED
        off = MissCause.AUTO_DISABLED if auto else MissCause.DISABLED
        start = before.off_since if before.off_since is not None else before.first_seen
        gaps = (*gaps, Gap(start, now, off, d.rollup.last_run_at))[-MAX_GAPS:]
    elif not d.enabled:
        off_since = before.off_since if not old.enabled and before.off_since else now
        if d.rollup.last_status == LastStatus.AUTO_DISABLED:
            off = MissCause.AUTO_DISABLED  # remembered for when it is enabled again
    return Watched(d, now, True, off, off_since=off_since, gaps=gaps)


class Skips:
    """The stretches this daemon skipped itself after a stall, by trigger id: the firing
    notes each (`note`), the missed watch reads them (`of`, `take_changed`). Kept in
    memory, the newest `MAX_GAPS` per trigger."""

    def __init__(self) -> None:
        self._by_id: dict[str, tuple[Gap, ...]] = {}
        self._changed: set[str] = set()

    def note(self, trigger_id: str, due: float, until: float) -> None:
        """Note that the occurrence due at `due`, and those after it until `until`, were skipped."""
        gap = Gap(due, max(until, due + 1e-3), MissCause.STALL_SKIP)
        self._by_id[trigger_id] = (*self._by_id.get(trigger_id, ()), gap)[-MAX_GAPS:]
        self._changed.add(trigger_id)

    def of(self, trigger_id: str) -> tuple[Gap, ...]:
        """Return the stretches skipped of one trigger, oldest first."""
        return self._by_id.get(trigger_id, ())

    def take_changed(self) -> set[str]:
        """Return the triggers with a stretch noted since the last call, and forget them."""
        changed, self._changed = self._changed, set()
        return changed


class Sightings:
    """When this device first saw each trigger's definition enabled, and what it was before
    (`sight` for each). Kept in memory; a definition seen at the first `observe` counts from
    then, unchanged: its rollup says when it last ran."""

    def __init__(self) -> None:
        self._seen: dict[str, Watched] = {}

    def observe(self, defs: Iterable[TriggerDef], now: float) -> list[Watched]:
        """Note the definitions as of `now`; return the enabled ones as watched."""
        self._seen = {d.id: sight(self._seen.get(d.id), d, now) for d in defs}
        return [w for w in self._seen.values() if w.defn.enabled]


__all__ = [
    "DEFAULT_LOOKBACK_S",
    "LISTED",
    "MAX_GAPS",
    "MAX_WALKED",
    "MIN_GRACE_S",
    "Gap",
    "Missed",
    "Occurrence",
    "Scene",
    "Sightings",
    "Skips",
    "Watched",
    "default_grace",
    "find_missed",
    "first_due",
    "iso",
    "last_recorded",
    "missed_of",
    "sight",
]
