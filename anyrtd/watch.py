"""The missed watch: each pass finds the missed occurrences of the space's triggers.

Every device runs it (the control API, `why`, the status page and `/metrics` read its last
answer); only the active device sends notices about it (anyrtd/notices.py). The arithmetic
is `anyrtd/missed.py`'s; this stage gathers its facts: the records, the devices registry
(read at most every `DEVICES_EVERY_S`), when this daemon started. A trigger whose next
occurrence is still less than a grace old costs one comparison a pass.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from anyrtd.client import ServerClient, ServerError, ServerUnavailable
from anyrtd.election import APP
from anyrtd.missed import (
    DEFAULT_LOOKBACK_S,
    Missed,
    Scene,
    Sightings,
    Watched,
    first_due,
    last_recorded,
    missed_of,
)
from anyrtd.model import STANDING_BUILTINS, TriggerDef
from anyrtd.records import RecordCache
from anyrtd.vocab import DeviceState

REGISTRY_WAIT_S = 3.0
DEVICES_EVERY_S = 30.0
"""How often a pass reads the devices registry again (pruned and unknown owners)."""


async def read_devices(
    client: ServerClient,
) -> tuple[dict[str, DeviceState] | None, dict[str, str]]:
    """Return each device's state (`live`, `pruned`) and name, or None when unread."""
    try:
        view = await asyncio.wait_for(client.devices(), timeout=REGISTRY_WAIT_S)
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


class Watch:
    """The last missed occurrences of every trigger, and the counts `/metrics` shows."""

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
        self.sightings = Sightings()
        self.missed: dict[str, Missed] = {}
        """The triggers that missed occurrences at the last pass, by id."""
        self.totals: Counter[str] = Counter()
        """Missed occurrences counted since the daemon started, by trigger id."""
        self.last_pass: float | None = None
        self._counted: dict[str, float] = {}
        self._due: dict[str, tuple[TriggerDef, float, float | None]] = {}
        self._devices: tuple[Mapping[str, DeviceState] | None, Mapping[str, str]] = (None, {})
        self._devices_at: float | None = None
        self._watched: dict[str, Watched] = {}

    def definitions(self) -> list[TriggerDef]:
        """Return the parsed definitions the watch looks at (not the standing built-ins)."""
        parsed = self.records.parsed
        return [
            d
            for rid in parsed
            if rid not in STANDING_BUILTINS and isinstance(d := parsed.get(rid), TriggerDef)
        ]

    async def step(self, now: float, peer_id: str | None, client: ServerClient) -> list[Missed]:
        """Take one pass as of `now`; return the triggers that missed occurrences."""
        if self.up_since is None:
            self.up_since = now
        if self.records.unparsed():
            return list(self.missed.values())  # a start-up spread parses them first
        if self._devices_at is None or now - self._devices_at >= DEVICES_EVERY_S:
            self._devices = await read_devices(client)
            self._devices_at = now
        defs = self.definitions()
        watched = self.sightings.observe(defs, now)
        self._watched = {w.defn.id: w for w in watched}
        until = now - self.grace_s
        self._due = {k: v for k, v in self._due.items() if k in self._watched}
        due = [w for w in watched if self._may_miss(w, until)]
        found: list[Missed] = []
        if due:
            # An owner's silence is judged on every trigger it holds, not only the due ones.
            scene, seen = self.scene(now, peer_id), last_recorded(defs, {})
            found = [m for w in due if (m := missed_of(w, scene, seen)) is not None]
        self.missed = {m.trigger_id: m for m in found}
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
        w = self._watched.get(trigger_id)
        parsed = self.records.parsed.get(trigger_id)
        if w is None or not isinstance(parsed, TriggerDef):
            return None
        w = replace(w, defn=parsed, scheduled=tuple(scheduled))
        return missed_of(w, self.scene(now, peer_id), last_recorded(self.definitions(), {}))

    def _may_miss(self, w: Watched, until: float) -> bool:
        """Return whether a trigger's first occurrence that could be missed is a grace old."""
        cached = self._due.get(w.defn.id)
        if cached is not None and cached[0] is w.defn and cached[1] == w.first_seen:
            due = cached[2]
        else:
            due = first_due(w)
            self._due[w.defn.id] = (w.defn, w.first_seen, due)
        return due is not None and due < until

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


__all__ = ["DEVICES_EVERY_S", "MissedFacts", "Watch", "read_devices"]
