"""The missed watch: each pass finds the missed occurrences of the space's triggers.

Every device runs it (the control API, `why`, the status page and `/metrics` read its last
answer); only the active device sends notices about it (anyrtd/notices.py). The arithmetic
is `anyrtd/missed.py`'s; this stage gathers its facts: the records, the devices registry
(as the election's poll last read it, or read at most every `DEVICES_EVERY_S`), when this
daemon started.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from anyrtd.client import DevicesView, ServerError, ServerUnavailable
from anyrtd.election import APP
from anyrtd.missed import (
    DEFAULT_LOOKBACK_S,
    Missed,
    Scene,
    Skips,
    Watched,
    first_due,
    last_recorded,
    missed_of,
    sight,
)
from anyrtd.model import STANDING_BUILTINS, TriggerDef
from anyrtd.records import RecordCache
from anyrtd.vocab import DeviceState, LastStatus

REGISTRY_WAIT_S = 3.0
DEVICES_EVERY_S = 30.0
"""How often a pass reads the devices registry again (pruned and unknown owners)."""


class ReadsDevices(Protocol):
    """What reads the devices registry: the server client, or the daemon's port."""

    async def devices(self) -> DevicesView | None: ...


class SeesDevices(Protocol):
    """What may have read the devices registry lately: the election's gate."""

    def recent_view(self, within_s: float) -> DevicesView | None: ...


async def read_devices(
    source: ReadsDevices,
) -> tuple[dict[str, DeviceState] | None, dict[str, str]]:
    """Return each device's state (`live`, `pruned`) and name, or None when unread."""
    return devices_of(await read_view(source))


async def read_view(source: ReadsDevices) -> DevicesView | None:
    """Return the devices registry as `source` reads it now, or None when it cannot."""
    try:
        return await asyncio.wait_for(source.devices(), timeout=REGISTRY_WAIT_S)
    except (ServerUnavailable, ServerError, TimeoutError):
        return None


def devices_of(
    view: DevicesView | None,
) -> tuple[dict[str, DeviceState] | None, dict[str, str]]:
    """Return each device's state (`live`, `pruned`) and name in `view`; None without one."""
    if view is None:
        return None, {}
    states = {
        d.peer_id: DeviceState.PRUNED if d.deleted else DeviceState.LIVE for d in view.devices
    }
    names = {d.peer_id: d.name for d in view.devices if d.name}
    winner = view.active.get(APP)
    if winner and winner not in states:
        states[winner] = DeviceState.LIVE
    return states, names


SLICE = 1000
"""Triggers looked at between two turns of the event loop (a few milliseconds of work, at
most): the first pass over 100,000 triggers, or a pass after as many changes, holds up no
start."""
NOTABLE = frozenset({LastStatus.ERROR, LastStatus.AUTO_DISABLED})


class Watch:
    """The last missed occurrences of every trigger, and the counts `/metrics` shows.

    Each trigger is kept with its definition as last seen and the earliest occurrence that
    could be missed (`first_due`). The first pass looks at every record; later passes look
    only at the records the cache says changed since (`RecordCache.take_changed`), and at
    the triggers whose earliest occurrence that could be missed is now more than a grace
    ago (a heap by that time): a pass over 100,000 triggers none of which changed or came
    due costs nothing that grows with the count.
    """

    def __init__(
        self,
        *,
        records: RecordCache,
        polls: SeesDevices,
        server: ReadsDevices,
        grace_s: float,
        skips: Skips,
        lookback_s: float = DEFAULT_LOOKBACK_S,
    ) -> None:
        self.records = records
        self.skips = skips
        """The stretches this daemon skipped after a stall: missed occurrences of their own."""
        self.polls = polls
        """The election's gate: the devices as its last poll read them, when recent."""
        self.server = server
        """What reads the devices registry when no poll is recent: the server client."""
        self.grace_s = grace_s
        self.lookback_s = lookback_s
        self.up_since: float | None = None
        self.missed: dict[str, Missed] = {}
        """The triggers that missed occurrences at the last pass, by id."""
        self.notable: list[TriggerDef] = []
        """The triggers whose last run failed or tripped the breaker, at the last pass."""
        self.totals: Counter[str] = Counter()
        """Missed occurrences counted since the daemon started, by trigger id."""
        self.last_pass: float | None = None
        self._counted: dict[str, float] = {}
        self._tracked: dict[str, tuple[Watched, float | None]] | None = None
        """Each trigger as watched and its `first_due`, by id (None before the first pass)."""
        self._coming: list[tuple[float, str]] = []
        """(`first_due`, id) of the triggers not due yet, earliest first (an entry whose
        trigger changed since is left to fall out when it comes up)."""
        self._due: set[str] = set()
        """The triggers whose `first_due` is more than a grace ago: looked at every pass."""
        self._notable: dict[str, TriggerDef] = {}
        self._seen: dict[str, float] | None = None
        """`last_recorded` of every trigger (None: to work out again)."""
        self._devices: tuple[Mapping[str, DeviceState] | None, Mapping[str, str]] = (None, {})
        self._devices_at: float | None = None
        self._view: DevicesView | None = None
        """The election's view the devices were taken from (None: read by this watch)."""
        self.winner: str | None = None
        """The active device as the devices were last read (None: none, or not read)."""

    def definitions(self) -> list[TriggerDef]:
        """Return the definitions the last pass looked at (not the standing built-ins)."""
        return [kept[0].defn for kept in (self._tracked or {}).values()]

    async def step(
        self,
        now: float,
        peer_id: str | None,
        pace: Callable[[], Awaitable[None]] | None = None,
    ) -> list[Missed]:
        """Take one pass as of `now`; return the triggers that missed occurrences. The
        devices come from the election's last poll when it is recent (`polls`), else from
        a read of their own at most every `DEVICES_EVERY_S` (`server`). `pace` is awaited
        before each slice of `SLICE` triggers (the timer's `clear_of`)."""
        if self.up_since is None:
            self.up_since = now
        if self.records.unparsed():
            return list(self.missed.values())  # a start-up spread parses them first
        await self._follow_devices(now)
        changed = self.records.take_changed() | self.skips.take_changed()
        if self._tracked is None:
            self._tracked = {}
            ids: list[str] = list(self.records.parsed)
        else:
            ids = sorted(changed)
        for start in range(0, len(ids), SLICE):
            if start:
                await asyncio.sleep(0)  # let the loop breathe between slices
            if pace is not None:
                await pace()  # a slice holds the loop for milliseconds: not over a start
            for rid in ids[start : start + SLICE]:
                self._look_at(rid, now)
        until = now - self.grace_s
        coming, tracked, due = self._coming, self._tracked, self._due
        while coming and coming[0][0] < until:
            at, rid = heapq.heappop(coming)
            kept = tracked.get(rid)
            if kept is not None and kept[1] == at:
                due.add(rid)
        found: list[Missed] = []
        if due:
            # An owner's silence is judged on every trigger it holds, not only the due ones.
            scene = self.scene(now, peer_id)
            if self._seen is None:
                self._seen = last_recorded(self.definitions(), {})
            seen = self._seen
            found = [
                m
                for rid in sorted(due)
                if (m := missed_of(tracked[rid][0], scene, seen)) is not None
            ]
        self.missed = {m.trigger_id: m for m in found}
        self.notable = [self._notable[rid] for rid in sorted(self._notable)]
        self._count(found)
        self.last_pass = now
        return found

    async def _follow_devices(self, now: float) -> None:
        view = self.polls.recent_view(DEVICES_EVERY_S)
        if view is not None:
            if view is not self._view:
                self._devices, self._view = devices_of(view), view
                self._devices_at, self.winner = now, view.active.get(APP)
        elif self._devices_at is None or now - self._devices_at >= DEVICES_EVERY_S:
            read = await read_view(self.server)
            self._devices, self._view = devices_of(read), None
            self._devices_at = now
            self.winner = read.active.get(APP) if read is not None else None

    @property
    def devices(self) -> tuple[Mapping[str, DeviceState] | None, Mapping[str, str]]:
        """Return each device's state and name as last read (None: the registry unread)."""
        return self._devices

    def _look_at(self, rid: str, now: float) -> None:
        """Take the record of `rid` as it is now (new, changed, or gone)."""
        assert self._tracked is not None
        d = self.records.parsed.get(rid)
        kept = self._tracked.get(rid)
        skips = self.skips.of(rid)
        if kept is not None and kept[0].defn is d and kept[0].skips == skips:
            return
        self._due.discard(rid)
        self._notable.pop(rid, None)
        if kept is not None and self._seen is not None and _may_lower(kept[0].defn, d):
            self._seen = None  # the latest run of its owner may be gone: work it out again
        if not isinstance(d, TriggerDef) or rid in STANDING_BUILTINS:
            self._tracked.pop(rid, None)
            return
        w = replace(sight(kept[0] if kept is not None else None, d, now), skips=skips)
        at = first_due(w)
        self._tracked[rid] = (w, at)
        if at is not None:
            heapq.heappush(self._coming, (at, rid))
        if d.rollup.last_status in NOTABLE:
            self._notable[rid] = d
        if self._seen is not None:
            self._seen = last_recorded((d,), self._seen)

    def scene(self, now: float, peer_id: str | None) -> Scene:
        """Return the facts every trigger of a pass shares."""
        devices, names = self._devices
        return Scene(
            now=now,
            grace_s=self.grace_s,
            peer_id=peer_id,
            up_since=self.up_since,
            devices=devices,
            names=names,
            lookback_s=self.lookback_s,
        )

    def of(
        self, trigger_id: str, now: float, peer_id: str | None, scheduled: Sequence[float] = ()
    ) -> Missed | None:
        """Return one trigger's missed occurrences as of `now`, with the `scheduledAt` of the
        runs a reader knows of (None when it missed none, or the watch has not seen it)."""
        kept = (self._tracked or {}).get(trigger_id)
        parsed = self.records.parsed.get(trigger_id)
        if kept is None or not isinstance(parsed, TriggerDef):
            return None
        w = replace(
            sight(kept[0], parsed, now),
            scheduled=tuple(scheduled),
            skips=self.skips.of(trigger_id),
        )
        seen = self._seen if self._seen is not None else last_recorded(self.definitions(), {})
        return missed_of(w, self.scene(now, peer_id), seen)

    def _count(self, found: Iterable[Missed]) -> None:
        for m in found:
            counted = self._counted.get(m.trigger_id)
            if counted is None or counted < m.occurrences[-1].at:
                fresh = m.count  # every one of them is newer than what was counted
            else:
                fresh = sum(1 for o in m.occurrences if o.at > counted)
            self.totals[m.trigger_id] += fresh
            self._counted[m.trigger_id] = m.last.at


def _may_lower(before: TriggerDef, now: TriggerDef | object) -> bool:
    """Return whether a definition replacing `before` (or its record's going) may lower the
    latest run its owner's triggers show (`last_recorded`): it showed a run, and the new one
    shows none later under the same owner."""
    at = before.rollup.last_run_at
    if at is None:
        return False
    if not isinstance(now, TriggerDef) or now.owner != before.owner:
        return True
    later = now.rollup.last_run_at
    return later is None or later < at


@dataclass(frozen=True)
class MissedFacts:
    """A trigger's missed occurrences as of `now` (None: it missed none), and the bounds."""

    id: str
    missed: Missed | None
    grace_s: float
    lookback_s: float
    now: float


__all__ = [
    "DEVICES_EVERY_S",
    "MissedFacts",
    "ReadsDevices",
    "SeesDevices",
    "Watch",
    "devices_of",
    "read_devices",
]
