"""The missed watch: each pass finds the missed occurrences of the space's triggers.

Every device runs it (the control API, `why`, the status page and `/metrics` read its last
answer); only the active device sends notices about it (anyrtd/notices.py). The arithmetic
is `anyrtd/missed.py`'s; this stage gathers its facts: the records, the devices registry
(read at most every `DEVICES_EVERY_S`), when this daemon started.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from anyrtd.client import DevicesView, ServerClient, ServerError, ServerUnavailable
from anyrtd.election import APP
from anyrtd.missed import (
    DEFAULT_LOOKBACK_S,
    Missed,
    Scene,
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


async def read_devices(
    source: ReadsDevices,
) -> tuple[dict[str, DeviceState] | None, dict[str, str]]:
    """Return each device's state (`live`, `pruned`) and name, or None when unread."""
    try:
        view = await asyncio.wait_for(source.devices(), timeout=REGISTRY_WAIT_S)
    except (ServerUnavailable, ServerError, TimeoutError):
        return None, {}
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
most, once the first pass has seen them): a pass over 100,000 triggers holds up no start."""
NOTABLE = frozenset({LastStatus.ERROR, LastStatus.AUTO_DISABLED})


class Watch:
    """The last missed occurrences of every trigger, and the counts `/metrics` shows.

    Each trigger is kept with its definition as last seen and the earliest occurrence that
    could be missed (`first_due`); a definition object that did not change since the last
    pass costs a comparison, the rest is worked out only for the triggers that are due.
    """

    def __init__(
        self,
        *,
        records: RecordCache,
        grace_s: float,
        lookback_s: float = DEFAULT_LOOKBACK_S,
    ) -> None:
        self.records = records
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
        self._tracked: dict[str, tuple[Watched, float | None, bool]] = {}
        self._devices: tuple[Mapping[str, DeviceState] | None, Mapping[str, str]] = (None, {})
        self._devices_at: float | None = None

    def definitions(self) -> list[TriggerDef]:
        """Return the definitions the last pass looked at (not the standing built-ins)."""
        return [kept[0].defn for kept in self._tracked.values()]

    async def step(
        self,
        now: float,
        peer_id: str | None,
        client: ServerClient,
        pace: Callable[[], Awaitable[None]] | None = None,
    ) -> list[Missed]:
        """Take one pass as of `now`; return the triggers that missed occurrences. `pace` is
        awaited before each slice of `SLICE` triggers (the timer's `clear_of`)."""
        if self.up_since is None:
            self.up_since = now
        if self.records.unparsed():
            return list(self.missed.values())  # a start-up spread parses them first
        if self._devices_at is None or now - self._devices_at >= DEVICES_EVERY_S:
            self._devices = await read_devices(client)
            self._devices_at = now
        until = now - self.grace_s
        parsed = self.records.parsed
        ids = list(parsed)
        old, fresh = self._tracked, {}
        due: list[Watched] = []
        notable: list[TriggerDef] = []
        get = parsed.get
        for start in range(0, len(ids), SLICE):
            if start:
                await asyncio.sleep(0)  # let the loop breathe between slices
            if pace is not None:
                await pace()  # a slice holds the loop for milliseconds: not over a start
            for rid in ids[start : start + SLICE]:
                d = get(rid)
                kept = old.get(rid)
                if kept is None or kept[0].defn is not d:
                    if not isinstance(d, TriggerDef) or rid in STANDING_BUILTINS:
                        continue
                    w = sight(kept[0] if kept is not None else None, d, now)
                    kept = (w, first_due(w), d.rollup.last_status in NOTABLE)
                fresh[rid] = kept
                if kept[1] is not None and kept[1] < until:
                    due.append(kept[0])
                if kept[2]:
                    notable.append(kept[0].defn)
        self._tracked = fresh
        found: list[Missed] = []
        if due:
            # An owner's silence is judged on every trigger it holds, not only the due ones.
            scene, seen = self.scene(now, peer_id), last_recorded(self.definitions(), {})
            found = [m for w in due if (m := missed_of(w, scene, seen)) is not None]
        self.missed = {m.trigger_id: m for m in found}
        self.notable = notable
        self._count(found)
        self.last_pass = now
        return found

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
        kept = self._tracked.get(trigger_id)
        parsed = self.records.parsed.get(trigger_id)
        if kept is None or not isinstance(parsed, TriggerDef):
            return None
        w = replace(sight(kept[0], parsed, now), scheduled=tuple(scheduled))
        return missed_of(w, self.scene(now, peer_id), last_recorded(self.definitions(), {}))

    def _count(self, found: Iterable[Missed]) -> None:
        for m in found:
            counted = self._counted.get(m.trigger_id)
            if counted is None or counted < m.occurrences[-1].at:
                fresh = m.count  # every one of them is newer than what was counted
            else:
                fresh = sum(1 for o in m.occurrences if o.at > counted)
            self.totals[m.trigger_id] += fresh
            self._counted[m.trigger_id] = m.last.at


@dataclass(frozen=True)
class MissedFacts:
    """A trigger's missed occurrences as of `now` (None: it missed none), and the bounds."""

    id: str
    missed: Missed | None
    grace_s: float
    lookback_s: float
    now: float


__all__ = ["DEVICES_EVERY_S", "MissedFacts", "ReadsDevices", "Watch", "read_devices"]
