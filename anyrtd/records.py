"""The record cache: the server's trigger records as this device last saw them, plus its own
writes that the server has not shown back yet (the overlay)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from anyrtd.model import Malformed, TriggerDef, parse_record


@dataclass(slots=True)
class Overlay:
    """Fields this device wrote to a record, kept on top until the server shows them back."""

    fields: dict[str, Any] = field(default_factory=dict)
    unset: set[str] = field(default_factory=set)
    outstanding: int = 0
    """Writes queued and not yet acknowledged by the server."""
    acked_version: int = 0
    """The highest record version the server returned for these writes."""


class RecordCache:
    """Trigger records by id: raw JSON (compact), versions, parsed definitions and overlays."""

    def __init__(self) -> None:
        self._raw: dict[str, str] = {}
        self._version: dict[str, int] = {}
        self.parsed: dict[str, TriggerDef | Malformed] = {}
        self._overlay: dict[str, Overlay] = {}

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, rid: object) -> bool:
        return rid in self._raw

    def ids(self) -> Iterator[str]:
        return iter(list(self._raw))

    def version(self, rid: str) -> int | None:
        return self._version.get(rid)

    def raw(self, rid: str) -> dict[str, Any] | None:
        """Return the record as the server last showed it (without this device's overlay)."""
        text = self._raw.get(rid)
        return json.loads(text) if text is not None else None

    def put(self, record: Mapping[str, Any]) -> str | None:
        """Store a record from the server; return its id if it changed, else None."""
        rid = record.get("id")
        if not isinstance(rid, str) or not rid:
            return None
        version = record.get("_v")
        v = version if isinstance(version, int) and not isinstance(version, bool) else 0
        if rid in self._raw and self._version.get(rid, 0) >= v and v:
            return None
        self._raw[rid] = json.dumps(record, separators=(",", ":"))
        self._version[rid] = v
        overlay = self._overlay.get(rid)
        if overlay is not None and overlay.outstanding == 0 and v >= overlay.acked_version:
            del self._overlay[rid]
        self._reparse(rid, dict(record))
        return rid

    def drop(self, rid: str) -> bool:
        """Forget a deleted record; return True if it was known."""
        self._overlay.pop(rid, None)
        self.parsed.pop(rid, None)
        self._version.pop(rid, None)
        return self._raw.pop(rid, None) is not None

    def write(self, rid: str, fields: Mapping[str, Any], unset: Sequence[str] = ()) -> None:
        """Lay this device's own write over the record until the server shows it back."""
        overlay = self._overlay.setdefault(rid, Overlay())
        for key, value in fields.items():
            overlay.fields[key] = value
            overlay.unset.discard(key)
        for key in unset:
            overlay.fields.pop(key, None)
            overlay.unset.add(key)
        overlay.outstanding += 1
        if rid in self._raw:
            self._reparse(rid)

    def acked(self, rid: str, version: int | None) -> None:
        """Note that the server took one of this device's writes to `rid`, at `version`."""
        overlay = self._overlay.get(rid)
        if overlay is None:
            return
        overlay.outstanding = max(0, overlay.outstanding - 1)
        if version is not None:
            overlay.acked_version = max(overlay.acked_version, version)
        if overlay.outstanding == 0 and self._version.get(rid, 0) >= overlay.acked_version:
            del self._overlay[rid]
            if rid in self._raw:
                self._reparse(rid)

    def pending_owner(self) -> set[str]:
        """Return the ids whose owner stamp this device wrote and has not seen back."""
        return {rid for rid, o in self._overlay.items() if "owner" in o.fields}

    def _reparse(self, rid: str, record: dict[str, Any] | None = None) -> None:
        if record is None:
            record = json.loads(self._raw[rid])
        overlay = self._overlay.get(rid)
        if overlay is not None:
            record.update(overlay.fields)
            for key in overlay.unset:
                record.pop(key, None)
        self.parsed[rid] = parse_record(record)
