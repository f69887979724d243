"""The in-memory registry: adopted entries and the heap of their next fire times."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from anyrtd.model import TriggerDef, health_marker, once_at
from anyrtd.rows import EntryRow
from anyrtd.schedule import once_due
from anyrtd.vocab import Kind


class Entry:
    """One adopted trigger: its definition, its persisted state and what runs now.

    An entry restored from the mirror's row (`Entry.restored`) reads its definition from
    the record cache when it is first asked for it (`defn`), not at start.
    """

    __slots__ = ("_defn", "_runs", "_source", "row")

    def __init__(self, defn: TriggerDef, row: EntryRow) -> None:
        self._defn: TriggerDef | None = defn
        self._source: Callable[[EntryRow], TriggerDef] | None = None
        self.row = row
        self._runs: Mapping[str, int] = _NO_RUNS

    @classmethod
    def restored(cls, row: EntryRow, source: Callable[[EntryRow], TriggerDef]) -> Entry:
        """Return the entry of `row` whose definition `source` gives when first needed."""
        entry = cls.__new__(cls)
        entry._defn, entry._source, entry.row, entry._runs = None, source, row, _NO_RUNS
        return entry

    @property
    def running(self) -> int:
        """How many runs of this trigger are in flight: counted by trigger id in the
        registry that holds the entry (`Registry.running`), so an entry rebuilt while a run
        is in flight counts it, and the run's end is counted off whichever entry is current."""
        return self._runs.get(self.row.trigger_id, 0)

    @property
    def known_defn(self) -> TriggerDef | None:
        """The definition if it was read already (a restored entry's may not be yet)."""
        return self._defn

    @property
    def defn(self) -> TriggerDef:
        defn = self._defn
        if defn is None:
            assert self._source is not None
            defn = self._defn = self._source(self.row)
            self._source = None
        return defn

    @defn.setter
    def defn(self, defn: TriggerDef) -> None:
        self._defn, self._source = defn, None

    @property
    def kind(self) -> str:
        """The definition's kind, without reading a definition not read yet."""
        return self.row.kind if self._defn is None else self._defn.kind

    @property
    def id(self) -> str:
        return self.row.trigger_id

    @property
    def confirmed(self) -> bool:
        return self.row.claimed_at is None


_NO_RUNS: Mapping[str, int] = {}
"""The run counts of an entry no registry holds: none."""


def new_row(defn: TriggerDef, now: float, *, claimed: bool) -> EntryRow:
    """Return the state of a freshly adopted (or rebuilt) entry."""
    return EntryRow(
        trigger_id=defn.id,
        fingerprint=defn.fingerprint,
        kind=defn.kind,
        enabled=defn.enabled,
        armed_at=now,
        next_fire=None,
        consumed=defn.kind == "once" and defn.rollup.last_run_at is not None,
        consecutive_failures=defn.rollup.consecutive_failures,
        run_count=defn.rollup.run_count,
        marker=health_marker(defn, now),
        claimed_at=now if claimed else None,
    )


def next_fire(entry: Entry, after: float) -> float | None:
    """Return when `entry` fires next, strictly forward of `after` for recurring kinds."""
    defn, row = entry.defn, entry.row
    if not row.enabled or not entry.confirmed or row.marker is not None:
        return None
    if defn.kind == "cron":
        return defn.schedule.next_after(after, row.armed_at)
    if defn.kind == "once":
        if row.consumed:
            return None
        return once_due(once_at(defn), defn.rollup.last_run_at)
    return None


@dataclass
class Registry:
    """Entries by trigger id, a heap of (due, id) for the timer, and the event entries."""

    entries: dict[str, Entry] = field(default_factory=dict)
    events: set[str] = field(default_factory=set)
    """Ids of the event entries, so a chat message is matched without a scan of them all."""
    last_fired: dict[str, float] = field(default_factory=dict)
    """The scheduledAt of each recurring entry's last fired occurrence: a wall clock stepped
    back re-arms the entries from the new time, and this keeps that occurrence from firing
    twice."""
    running: dict[str, int] = field(default_factory=dict)
    """Runs in flight by trigger id (`began`, `ended`), kept by id rather than on an entry:
    an entry is rebuilt while a run is in flight (an edit, a repin back, an enable flip, a
    restore), and the run's end must be counted off the entry that is current then."""
    _heap: list[tuple[float, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, trigger_id: object) -> bool:
        return trigger_id in self.entries

    def get(self, trigger_id: str) -> Entry | None:
        return self.entries.get(trigger_id)

    def put(self, entry: Entry) -> None:
        entry._runs = self.running
        self.entries[entry.id] = entry
        if entry.kind == Kind.EVENT:
            self.events.add(entry.id)
        else:
            self.events.discard(entry.id)
        self.schedule(entry)

    def put_all(self, entries: Iterable[Entry]) -> None:
        """Put many entries as `put` does each (a restore), the heap rebuilt once."""
        by_id, events, heap, running = self.entries, self.events, self._heap, self.running
        for entry in entries:
            rid, due = entry.id, entry.row.next_fire
            entry._runs = running
            by_id[rid] = entry
            if entry.kind == Kind.EVENT:
                events.add(rid)
            elif events:
                events.discard(rid)
            if due is not None:
                heap.append((due, rid))
        heapq.heapify(heap)

    def began(self, trigger_id: str) -> None:
        """Count a run of `trigger_id` that started."""
        self.running[trigger_id] = self.running.get(trigger_id, 0) + 1

    def ended(self, trigger_id: str) -> None:
        """Count off a run of `trigger_id` that ended (whatever entry holds the id now)."""
        left = self.running.get(trigger_id, 0) - 1
        if left > 0:
            self.running[trigger_id] = left
        else:
            self.running.pop(trigger_id, None)

    def remove(self, trigger_id: str) -> Entry | None:
        # The heap keeps a stale item; `pop_due` drops it because the entry is gone. A run in
        # flight stays counted under the id until it ends (the record may come back).
        self.events.discard(trigger_id)
        self.last_fired.pop(trigger_id, None)
        return self.entries.pop(trigger_id, None)

    def arm(self, entry: Entry, after: float) -> None:
        """Compute the entry's next fire strictly forward of `after` and schedule it."""
        entry.row.next_fire = next_fire(entry, after)
        self.schedule(entry)

    def pull_back(self, entry: Entry, now: float) -> bool:
        """Re-arm a recurring `entry` from `now` when its next fire is further ahead than its
        schedule allows from `now` (armed under a wall clock since stepped back); return
        whether it moved."""
        if entry.kind != Kind.CRON or entry.row.next_fire is None:
            return False
        if entry.row.armed_at > now:  # an every_s grid anchored under the later clock
            entry.row.armed_at = now
        fresh = next_fire(entry, now)
        if fresh is None or fresh >= entry.row.next_fire:
            return False
        entry.row.next_fire = fresh
        self.schedule(entry)
        return True

    def refire(self, trigger_id: str, due: float) -> bool:
        """Return whether the occurrence `due` of `trigger_id` is the one it last fired;
        else note it as the last fired."""
        if self.last_fired.get(trigger_id) == due:
            return True
        self.last_fired[trigger_id] = due
        return False

    def schedule(self, entry: Entry) -> None:
        if entry.row.next_fire is not None:
            heapq.heappush(self._heap, (entry.row.next_fire, entry.id))

    def next_due(self) -> float | None:
        """Return the earliest due time in the heap (dropping stale items on the way)."""
        while self._heap:
            due, tid = self._heap[0]
            entry = self.entries.get(tid)
            if entry is not None and entry.row.next_fire == due:
                return due
            heapq.heappop(self._heap)
        return None

    def due_ids(self, at: float) -> list[str]:
        """Return the ids due at or before `at` (stale heap items too), in no order: a walk
        of the heap's top, not of all of it."""
        return [tid for _, tid in self._top(at)]

    def count_due(self, at: float) -> int:
        """Return about how many entries are due at or before `at` (stale heap items count
        too): a walk of the heap's top, not of all of it."""
        return len(self._top(at))

    def _top(self, at: float) -> list[tuple[float, str]]:
        """Return the heap's items due at or before `at`, stale ones too, in no order."""
        heap, out, todo = self._heap, [], [0]
        while todo:
            i = todo.pop()
            if i < len(heap) and heap[i][0] <= at:
                out.append(heap[i])
                todo += (2 * i + 1, 2 * i + 2)
        return out

    def pop_due(self, now: float) -> list[tuple[Entry, float]]:
        """Remove and return every (entry, due time) whose due time is at or before `now`."""
        out: list[tuple[Entry, float]] = []
        seen: set[str] = set()
        while self._heap and self._heap[0][0] <= now:
            due, tid = heapq.heappop(self._heap)
            entry = self.entries.get(tid)
            if entry is not None and entry.row.next_fire == due and tid not in seen:
                seen.add(tid)
                out.append((entry, due))
        return out
