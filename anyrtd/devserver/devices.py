"""The devices registry's rule, without storage: one winner per app slug."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class DeviceRow:
    """A device of the account: its apps carry `version` and, once claimed, `seq` and `at`."""

    peer_id: str
    name: str
    os: str
    apps: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted: bool = False

    def to_json(self) -> dict[str, Any]:
        """Return the row as the registry routes answer it."""
        out: dict[str, Any] = {
            "peerId": self.peer_id,
            "name": self.name,
            "os": self.os,
            "apps": self.apps,
        }
        if self.deleted:
            out["deleted"] = True
        return out


def claim_key(row: DeviceRow, app: str) -> tuple[float, float, str] | None:
    """Return the row's claim on `app` as a sortable key, or None when it holds none."""
    entry = row.apps.get(app)
    if row.deleted or not isinstance(entry, Mapping) or "seq" not in entry:
        return None
    return (float(entry["seq"]), float(entry.get("at", 0)), row.peer_id)


def winners(rows: Iterable[DeviceRow]) -> dict[str, str | None]:
    """Return the winner per app slug (highest `seq`, `at`, `peerId`), or None without claims."""
    rows = list(rows)
    apps = sorted({app for row in rows for app in row.apps})
    out: dict[str, str | None] = {}
    for app in apps:
        claims = [k for k in (claim_key(r, app) for r in rows) if k is not None]
        out[app] = max(claims)[2] if claims else None
    return out


def next_seq(rows: Iterable[DeviceRow], app: str) -> int:
    """Return the seq a new claim on `app` takes: one more than any row's, pruned rows included."""
    seqs = [
        int(r.apps[app]["seq"])
        for r in rows
        if isinstance(r.apps.get(app), Mapping) and "seq" in r.apps[app]
    ]
    return max(seqs, default=0) + 1
