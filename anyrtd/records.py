"""The record cache: the server's trigger records as this device last saw them, plus its own
writes that the server has not shown back yet (the overlay).

Only the parsed definitions stay in memory. The JSON text of the server's record is kept
just where a parsed definition cannot stand in for it: under an overlay (so the server's
view can be restored when the overlay goes) and for a malformed record, and for a record
read back from the mirror until it is first read (`parsed` parses it then): a start-up
from 100,000 records parses none of them before it is ready.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from anyrtd.model import (
    RUNTIME_FIELDS,
    Malformed,
    TriggerDef,
    parse_record,
    with_runtime,
    with_version,
)

ACK_SLICE = 100
"""The most acknowledgements of this device's writes taken (`RecordCache.acked`) between
two turns of the event loop: an acknowledgement that lets an overlay go parses the
server's record again, up to about 1 ms for a large one (10,000 broken records: 6,667
owner stamps and markers acknowledged, 1.2 s). A slice also ends once `LOOP_SLICE_S` is
spent: records of megabytes cost more than that each."""


@dataclass(slots=True)
class Overlay:
    """Fields this device wrote to a record, kept on top until the server shows them back."""

    fields: dict[str, Any] = field(default_factory=dict)
    unset: set[str] = field(default_factory=set)
    outstanding: int = 0
    """Writes queued and not yet acknowledged by the server."""
    acked_version: int = 0
    """The highest record version the server returned for these writes."""
    base_version: int = 0
    """The version of the server's record under these writes (the cache's)."""
    acks: set[int] = field(default_factory=set)
    """Every record version the server returned for these writes."""
    writes: int = 0
    """Writes laid so far, counted from 1: the number of the write that laid each key is in
    `laid_by`."""
    laid_by: dict[str, int] = field(default_factory=dict)
    """For each key of `fields` and `unset`, the number of the write that last laid it."""
    taken: list[tuple[int, int]] = field(default_factory=list)
    """(writes acknowledged so far, the version the server gave the last of them), in the
    order acknowledged: the server's record at that version or later has those writes."""
    floor: int = 0
    """The record's version in the cache when the oldest write not yet acknowledged was
    laid: the server acknowledges it at a higher one, unless its versions went back."""
    before_back: int = 0
    """The writes acknowledged before the server's versions went back (`RecordCache.
    went_back`): the record the server shows next says what became of them."""

    def echoed_by(self, version: int) -> bool:
        """Return whether the record at `version` is the server's record under this overlay
        with these writes and nothing else: every write acknowledged, and each version
        between the base and `version` one of them."""
        if self.outstanding or version != self.acked_version or version <= self.base_version:
            return False
        return sum(1 for v in self.acks if v > self.base_version) == version - self.base_version

    def shown(self, version: int) -> None:
        """Let go of the keys of the writes the server's record at `version` already has
        (acknowledged at or before it): that record says what they are now, another
        device's later write included."""
        through = max((n for n, v in self.taken if v <= version), default=0)
        if not through:
            return
        for key in [k for k, n in self.laid_by.items() if n <= through]:
            del self.laid_by[key]
            self.fields.pop(key, None)
            self.unset.discard(key)
        self.taken = [(n, v) for n, v in self.taken if n > through]

    def went_back(self) -> None:
        """Forget the versions the server gave this device's writes so far: its versions
        went back, and those numbers say nothing of the record it shows from now on."""
        self.before_back = self.writes - self.outstanding
        self.acks.clear()
        self.taken.clear()
        self.acked_version = self.floor = 0

    def shown_after_back(self) -> None:
        """Let go of the keys of the writes acknowledged before the server's versions went
        back, as the first record it shows since is taken: that record says whether they
        stayed (a reset of the numbers) or went with the rest (a restore from a backup)."""
        through, self.before_back = self.before_back, 0
        for key in [k for k, n in self.laid_by.items() if n <= through]:
            del self.laid_by[key]
            self.fields.pop(key, None)
            self.unset.discard(key)


@dataclass(frozen=True, slots=True)
class RecordMark:
    """A record's overlay, base and parsed definition at one moment (`RecordCache.mark`)."""

    version: int | None
    overlay: Overlay | None
    base: str | TriggerDef | None
    parsed: TriggerDef | Malformed | None


def _keyed(record: dict[str, Any], rid: str) -> dict[str, Any]:
    """Return `record` with its id the cache's own string for it (equal: the mirror's row and
    its text say the same id), so that its definition does not hold a copy."""
    if record.get("id") == rid:
        record["id"] = rid
    return record


def _dumps(record: Mapping[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


class Parsed(Mapping[str, "TriggerDef | Malformed"]):
    """The parsed definition of every record in a cache; a record read back from the mirror
    is parsed when it is first read, here."""

    __slots__ = ("_cache",)

    def __init__(self, cache: RecordCache) -> None:
        self._cache = cache

    def __getitem__(self, rid: str) -> TriggerDef | Malformed:
        done = self._cache._parsed.get(rid)
        return done if done is not None else self._cache._parse_loaded(rid)

    def get(self, rid: str, default: Any = None) -> Any:
        done = self._cache._parsed.get(rid)
        if done is not None:
            return done
        return self._cache._parse_loaded(rid) if rid in self._cache._loaded else default

    def __contains__(self, rid: object) -> bool:
        return rid in self._cache._parsed or rid in self._cache._loaded

    def __iter__(self) -> Iterator[str]:
        return (rid for rid in self._cache.ids() if rid in self)

    def __len__(self) -> int:
        return len(self._cache._parsed) + len(self._cache._loaded)


class RecordCache:
    """Trigger records by id: versions, parsed definitions, and this device's overlays."""

    def __init__(self) -> None:
        self._version: dict[str, int] = {}
        self._parsed: dict[str, TriggerDef | Malformed] = {}
        self._loaded: dict[str, str] = {}
        """The JSON text of each record read back from the mirror and not parsed yet."""
        self.parsed = Parsed(self)
        self._base: dict[str, str | TriggerDef] = {}
        """The server's view under an overlay, or of a malformed record: its JSON text, or
        the parsed definition it was before this device's first write (turned into a record
        only if it is needed again)."""
        self._overlay: dict[str, Overlay] = {}
        self._changed: set[str] = set()
        """The ids whose definition was stored, replaced or dropped since `take_changed`."""
        self._stale: set[str] = set()
        """The ids whose version was read before the server's versions went back
        (`went_back`): the next record the server shows of each is taken, whatever its
        version."""

    def __len__(self) -> int:
        return len(self._version)

    def __contains__(self, rid: object) -> bool:
        return rid in self._version

    def ids(self) -> Iterator[str]:
        return iter(list(self._version))

    def known(self) -> dict[str, str]:
        """Return the id of every record held by itself: the one string object the cache and
        its definition hold for that id, for others to share (100,000 copies weigh 6 MB)."""
        return {rid: rid for rid in self._version}

    def take_changed(self) -> set[str]:
        """Return the ids whose definition was stored, replaced or dropped since the last
        call, and start again: what the one reader that follows the cache (the missed watch,
        `anyrtd/watch.py`) looks at again, instead of every record each pass."""
        changed, self._changed = self._changed, set()
        return changed

    def unparsed(self) -> int:
        """Return how many records read back from the mirror have not been parsed yet."""
        return len(self._loaded)

    def version(self, rid: str) -> int | None:
        return self._version.get(rid)

    def raw(self, rid: str) -> dict[str, Any] | None:
        """Return the record as the server last showed it (without this device's overlay)."""
        if rid in self._base:
            return self._base_record(rid)[0]
        parsed = self.parsed.get(rid)
        return parsed.to_record() if isinstance(parsed, TriggerDef) else None

    def put(self, record: Mapping[str, Any]) -> str | None:
        """Store a record from the server; return its id if it changed, else None."""
        rid = record.get("id")
        if not isinstance(rid, str) or not rid:
            return None
        version = record.get("_v")
        v = version if isinstance(version, int) and not isinstance(version, bool) else 0
        stale = rid in self._stale
        if not stale and rid in self._version and self._version[rid] >= v and v:
            return None
        overlay = self._overlay.get(rid)
        if stale:
            self._stale.discard(rid)
            if overlay is not None:
                overlay.shown_after_back()
        parsed = self._parsed.get(rid)  # under an overlay, parsed: `write` read it
        if (
            not stale
            and overlay is not None
            and overlay.echoed_by(v)
            and isinstance(parsed, TriggerDef)
        ):
            # This device's own writes shown back, on the record it had: the definition is
            # the one already held (the overlay laid over it), at the new version.
            self._version[rid] = v
            del self._overlay[rid]
            self._base.pop(rid, None)
            self._parsed[rid] = with_version(parsed, v)
            self._changed.add(rid)
            return rid
        self._version[rid] = v
        if overlay is not None and overlay.outstanding == 0 and v >= overlay.acked_version:
            del self._overlay[rid]
        elif overlay is not None:
            overlay.base_version = v
            overlay.shown(v)
        self._store(rid, dict(record), None)
        return rid

    def echo(self, rid: str) -> bool:
        """Return whether a change of `rid` may be this device's own fire writes shown back
        (it has such writes on it, runtime fields only), which no tick has to wait for."""
        overlay = self._overlay.get(rid)
        return (
            overlay is not None
            and overlay.fields.keys() <= RUNTIME_FIELDS
            and overlay.unset <= RUNTIME_FIELDS
        )

    def load(self, text: str) -> None:
        """Store a record read back from the mirror, given as the JSON text it was stored in."""
        self._load(text, json.loads(text))

    def load_many(self, texts: Sequence[str]) -> None:
        """Store records read back from the mirror, as `load` each: decoded as one JSON array
        (a decode per text costs a start-up from 100,000 records about 0.3 s more)."""
        try:
            records = json.loads("[" + ",".join(texts) + "]")
        except ValueError:
            records = None
        if not isinstance(records, list) or len(records) != len(texts):
            # A text that is not one JSON value: each on its own, as `load` reads it.
            for text in texts:
                self.load(text)
            return
        for text, record in zip(texts, records, strict=True):
            self._load(text, record)

    def load_texts(self, rows: Iterable[tuple[str, int | None, str]]) -> None:
        """Store records read back from the mirror as (id, version, JSON text) without parsing
        them: each is parsed when it is first read (`parsed`)."""
        for rid, version, text in rows:
            self._version[rid] = version or 0
            self._parsed.pop(rid, None)
            self._loaded[rid] = text
            self._changed.add(rid)

    def parse_many(self, rids: Iterable[str]) -> None:
        """Parse the records of `rids` read back from the mirror and not parsed yet, their
        texts decoded as one JSON array (a decode per text costs a call each)."""
        loaded = self._loaded
        texts = [(rid, text) for rid in rids if (text := loaded.get(rid)) is not None]
        if not texts:
            return
        try:
            records = json.loads("[" + ",".join(text for _, text in texts) + "]")
        except ValueError:
            records = None
        if not isinstance(records, list) or len(records) != len(texts):
            records = [None] * len(texts)  # a text that is not one JSON value: each alone
        for (rid, text), record in zip(texts, records, strict=True):
            if isinstance(record, dict):
                self._store(rid, _keyed(record, rid), text)
            else:
                self._parse_loaded(rid)

    def compact(self) -> None:
        """Let go of the room the texts of records not parsed yet took (a dict keeps the size
        it had: 100,000 records read back from the mirror, about 5 MB)."""
        self._loaded = dict(self._loaded)

    def _parse_loaded(self, rid: str) -> TriggerDef | Malformed:
        """Parse the record of `rid` read back from the mirror (KeyError when there is none)."""
        text = self._loaded[rid]
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            del self._loaded[rid]
            why = "the mirror's copy of the record is not a JSON object; anyrtd db rebuild"
            bad = self._parsed[rid] = Malformed(rid, why, self._version.get(rid))
            self._base[rid] = _dumps({"id": rid})
            self._changed.add(rid)
            return bad
        self._store(rid, _keyed(record, rid), text)
        return self._parsed[rid]

    def _load(self, text: str, record: Any) -> None:
        rid = record.get("id") if isinstance(record, dict) else None
        if not isinstance(rid, str) or not rid:
            return
        version = record.get("_v")
        self._version[rid] = version if isinstance(version, int) else 0
        self._store(rid, record, text)

    def drop(self, rid: str) -> bool:
        """Forget a deleted record; return True if it was known."""
        self._changed.add(rid)
        self._stale.discard(rid)
        self._overlay.pop(rid, None)
        self._parsed.pop(rid, None)
        self._loaded.pop(rid, None)
        self._base.pop(rid, None)
        return self._version.pop(rid, None) is not None

    def write(self, rid: str, fields: Mapping[str, Any], unset: Sequence[str] = ()) -> None:
        """Lay this device's own write over the record until the server shows it back."""
        if rid not in self._overlay and rid not in self._base:
            parsed = self.parsed.get(rid)
            if isinstance(parsed, TriggerDef):
                # Keep the server's view from before the first write, to return to later.
                self._base[rid] = parsed
        overlay = self._overlay.get(rid)
        if overlay is None:
            overlay = self._overlay[rid] = Overlay(base_version=self._version.get(rid, 0))
        if not overlay.outstanding:
            overlay.floor = 0 if rid in self._stale else self._version.get(rid, 0)
        overlay.writes += 1
        for key, value in fields.items():
            overlay.fields[key] = value
            overlay.unset.discard(key)
            overlay.laid_by[key] = overlay.writes
        for key in unset:
            overlay.fields.pop(key, None)
            overlay.unset.add(key)
            overlay.laid_by[key] = overlay.writes
        overlay.outstanding += 1
        if rid in self._base:
            parsed = self.parsed.get(rid)
            # A fire's writes (a once's consumption, a run's rollup) leave the definition
            # core alone: lay them over the parsed definition instead of parsing it all again.
            quick = with_runtime(parsed, fields, unset) if isinstance(parsed, TriggerDef) else None
            if quick is not None:
                self._parsed[rid] = quick
                self._changed.add(rid)
            else:
                self._store(rid, *self._base_record(rid))

    def acked(self, rid: str, version: int | None) -> bool:
        """Note that the server took one of this device's writes to `rid`, at `version`;
        return whether that version is not above the one the record had when the write was
        laid: the server's versions went back (then `went_back` has been applied first)."""
        overlay = self._overlay.get(rid)
        if overlay is None:
            return False
        back = version is not None and 0 < version <= overlay.floor
        if back:
            self.went_back()
        overlay.outstanding = max(0, overlay.outstanding - 1)
        if version is not None:
            overlay.acked_version = max(overlay.acked_version, version)
            overlay.acks.add(version)
            overlay.taken.append((overlay.writes - overlay.outstanding, version))
        if (
            overlay.outstanding == 0
            and rid not in self._stale
            and self._version.get(rid, 0) >= overlay.acked_version
        ):
            del self._overlay[rid]
            if rid in self._base:
                self._store(rid, *self._base_record(rid))
        return back

    def went_back(self, shown: Iterable[str] = ()) -> None:
        """Take the next record the server shows of each id whatever its version (but those
        of `shown`, read since its versions went back), and forget the versions it gave
        this device's writes: its versions went back (docs/reliability.md)."""
        exempt = set(shown)
        self._stale = {rid for rid in self._version if rid not in exempt}
        for overlay in self._overlay.values():
            overlay.went_back()

    def is_stale(self, rid: str) -> bool:
        """Return whether the next record shown of `rid` is taken whatever its version."""
        return rid in self._stale

    @property
    def stale(self) -> int:
        """Return how many records were last read before the server's versions went back."""
        return len(self._stale)

    def overlay_until_newer(self, rid: str, fields: Mapping[str, Any]) -> None:
        """Lay `fields` over a record until the server shows a newer version than the cached
        one: a write of this device the server took before a restart, not yet read back."""
        self.write(rid, fields)
        overlay = self._overlay[rid]
        # Not a version the server returned: the record shown at it is read as it is.
        overlay.outstanding -= 1
        newer = self._version.get(rid, 0) + 1
        overlay.acked_version = max(overlay.acked_version, newer)
        overlay.taken.append((overlay.writes - overlay.outstanding, newer))

    def mark(self, rid: str) -> RecordMark:
        """Return what `rewind` needs to put `rid` back as it is now (before a write)."""
        overlay = self._overlay.get(rid)
        kept = None
        if overlay is not None:
            kept = Overlay(
                dict(overlay.fields),
                set(overlay.unset),
                overlay.outstanding,
                overlay.acked_version,
                overlay.base_version,
                set(overlay.acks),
                overlay.writes,
                dict(overlay.laid_by),
                list(overlay.taken),
                overlay.floor,
                overlay.before_back,
            )
        return RecordMark(self._version.get(rid), kept, self._base.get(rid), self.parsed.get(rid))

    def rewind(self, rid: str, mark: RecordMark) -> None:
        """Take back the writes laid over `rid` since `mark` (they were never made durable)."""
        if self._version.get(rid) != mark.version and rid in self._base:
            # The server showed a newer record meanwhile: keep it, under the overlay as it was.
            record, text = self._base_record(rid)
            self._overlay.pop(rid, None)
            if mark.overlay is not None:
                self._overlay[rid] = mark.overlay
                mark.overlay.shown(self._version.get(rid, 0))
            self._store(rid, record, text)
            return
        self._overlay.pop(rid, None)
        self._base.pop(rid, None)
        self._parsed.pop(rid, None)
        if mark.overlay is not None:
            self._overlay[rid] = mark.overlay
        if mark.base is not None:
            self._base[rid] = mark.base
        if mark.parsed is not None:
            self._loaded.pop(rid, None)
            self._parsed[rid] = mark.parsed
        self._changed.add(rid)

    def pending_owner(self, ids: Iterable[str]) -> set[str]:
        """Return those of `ids` whose owner stamp this device wrote and has not seen back
        (a look per id: the overlay holds thousands while a barrage's claims are on their
        way, and a tick reconciles a hundred ids at a time)."""
        overlay = self._overlay
        return {rid for rid in ids if (o := overlay.get(rid)) is not None and "owner" in o.fields}

    def _base_record(self, rid: str) -> tuple[dict[str, Any], str | None]:
        """Return the server's view of `rid` as a record, with its JSON text if kept."""
        base = self._base[rid]
        if isinstance(base, TriggerDef):
            return base.to_record(), None
        loaded: dict[str, Any] = json.loads(base)
        return loaded, base

    def _store(self, rid: str, record: dict[str, Any], text: str | None) -> None:
        """Parse the server's `record` under the overlay; keep its text only where needed."""
        self._changed.add(rid)
        self._loaded.pop(rid, None)
        overlay = self._overlay.get(rid)
        if overlay is not None:
            self._base[rid] = text if text is not None else _dumps(record)
            merged = {**record, **overlay.fields}
            for key in overlay.unset:
                merged.pop(key, None)
            self._parsed[rid] = parse_record(merged)
            return
        parsed = parse_record(record)
        self._parsed[rid] = parsed
        if isinstance(parsed, Malformed):
            self._base[rid] = text if text is not None else _dumps(record)
        else:
            self._base.pop(rid, None)
