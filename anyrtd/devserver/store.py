"""The devserver's SQLite store: the only module with SQL in it.

One file holds everything: spaces, types, objects, the records and change feed
of each replica, the devices registry, and the queue of writes still to be
replicated. Methods are synchronous; the server calls them from one worker
thread, which also makes that thread the single writer.
"""

from __future__ import annotations

import json
import math
import secrets
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anyrtd.devserver import ids
from anyrtd.devserver.devices import DeviceRow, next_seq, winners
from anyrtd.devserver.errors import ApiError, not_found
from anyrtd.devserver.records import (
    Delta,
    Op,
    Record,
    Stamp,
    apply_ops,
    clean_fields,
    merge,
)

SCHEMA_VERSION = 1
DEFAULT_TYPE_KEY = "object"

KNOWN_CHILDREN = {
    ("bao/v1", "bao/triggers/v1"): "agent_triggers",
    ("bao/v1", "bao/runs/v1"): "agent_runs",
    ("bao/v1", "bao/chat/general"): "chat_messages",
}
"""Children of the agent bundle whose dataset is listed as soon as the child is resolved."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS peers (
    device INTEGER NOT NULL, generation INTEGER NOT NULL, peer_id TEXT NOT NULL UNIQUE,
    PRIMARY KEY (device, generation));
CREATE TABLE IF NOT EXISTS spaces (id TEXT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS types (
    space TEXT NOT NULL, id TEXT NOT NULL, key TEXT NOT NULL, name TEXT NOT NULL,
    hidden INTEGER NOT NULL, id_rule TEXT NOT NULL, dynamic INTEGER NOT NULL,
    PRIMARY KEY (space, id), UNIQUE (space, key));
CREATE TABLE IF NOT EXISTS objects (
    space TEXT NOT NULL, id TEXT NOT NULL, bundle TEXT NOT NULL, seed TEXT NOT NULL,
    type_id TEXT NOT NULL,
    PRIMARY KEY (space, id), UNIQUE (space, bundle, seed));
CREATE TABLE IF NOT EXISTS datasets (
    space TEXT NOT NULL, object_id TEXT NOT NULL, name TEXT NOT NULL,
    PRIMARY KEY (space, object_id, name));
CREATE TABLE IF NOT EXISTS replicas (replica INTEGER PRIMARY KEY, hlc INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    replica INTEGER NOT NULL, space TEXT NOT NULL, object_id TEXT NOT NULL,
    dataset TEXT NOT NULL, id TEXT NOT NULL, fields TEXT NOT NULL, clocks TEXT NOT NULL,
    deleted INTEGER NOT NULL, version INTEGER NOT NULL, updated_at REAL NOT NULL,
    PRIMARY KEY (replica, space, object_id, dataset, id));
CREATE TABLE IF NOT EXISTS changes (
    replica INTEGER NOT NULL, space TEXT NOT NULL, seq INTEGER NOT NULL,
    object_id TEXT NOT NULL, dataset TEXT NOT NULL, id TEXT NOT NULL, op TEXT NOT NULL,
    record TEXT,
    PRIMARY KEY (replica, space, seq));
CREATE TABLE IF NOT EXISTS devices (
    peer_id TEXT PRIMARY KEY, name TEXT NOT NULL, os TEXT NOT NULL, apps TEXT NOT NULL,
    deleted INTEGER NOT NULL, created INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sync_queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT, src INTEGER NOT NULL, dst INTEGER NOT NULL,
    due REAL NOT NULL, space TEXT NOT NULL, object_id TEXT NOT NULL, dataset TEXT NOT NULL,
    rec_id TEXT NOT NULL, delta TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sync_queue_due ON sync_queue (due);
"""


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


class StoreError(Exception):
    """The database file cannot be used; the message names it and says what to do."""


@dataclass
class Topology:
    """Which replica each device writes to and how writes travel between replicas."""

    replicas: list[int] = field(default_factory=lambda: [1])
    delay: float = 0.0
    partitioned: set[int] = field(default_factory=set)

    @property
    def replicated(self) -> bool:
        return len(self.replicas) > 1


@dataclass(frozen=True)
class Where:
    """A resolved dataset: space, object and the dataset's short name."""

    space: str
    object_id: str
    dataset: str


@dataclass
class RecordWrite:
    """One record of an upsert (`fields`) or a modify (`ops`) batch."""

    id: str
    fields: dict[str, Any] | None = None
    ops: list[Op] | None = None
    upsert: bool = True
    if_version: int | None = None


@dataclass
class WriteResult:
    versions: list[tuple[str, int]] = field(default_factory=list)
    touched: set[tuple[int, str]] = field(default_factory=set)
    """(replica, space) pairs whose change feed grew: their waiting readers must wake."""
    queued: bool = False


@dataclass
class _Row:
    fields: dict[str, Any]
    clocks: dict[str, Stamp]
    deleted: bool
    version: int
    updated_at: float


class Store:
    """The devserver's state in one SQLite file (WAL)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None
        self._hlc: dict[int, int] = {}
        self.salt = ""
        self.topology = Topology()

    # lifecycle

    def open(self) -> None:
        """Open (creating when missing) the database file and its schema."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"--db {self.path}: cannot open it: {exc}") from None
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=30000")
            db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            db.close()
            raise StoreError(
                f"--db {self.path}: not a devserver database ({exc}); point --db at a new file"
            ) from None
        self._db = db
        with self._tx():
            version = self._meta("schema")
            if version is not None and int(version) > SCHEMA_VERSION:
                raise StoreError(
                    f"--db {self.path}: written by a newer devserver (schema "
                    f"{version}); use that version or a new --db file"
                )
            self._set_meta("schema", str(SCHEMA_VERSION))
            salt = self._meta("salt")
            if salt is None:
                salt = secrets.token_hex(16)
                self._set_meta("salt", salt)
            self.salt = salt
        self._hlc = {int(r): int(h) for r, h in self._q("SELECT replica, hlc FROM replicas")}

    def close(self) -> None:
        """Close the database file."""
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("store is not open")
        return self._db

    @contextmanager
    def _tx(self) -> Iterator[None]:
        # BEGIN IMMEDIATE takes the write lock up front, so two writers never interleave.
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _q(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.db.execute(sql, params).fetchall()

    def _meta(self, key: str) -> str | None:
        rows = self._q("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # devserver devices and replicas

    def ensure_devices(self, count: int, os_name: str) -> dict[int, str]:
        """Give devices 1..count a peer id (kept across restarts) and a registry row."""
        with self._tx():
            for device in range(1, count + 1):
                if self._current_peer(device) is None:
                    self._new_peer(device, 0, os_name)
        return self.peers()

    def reinit_device(self, device: int, os_name: str) -> str:
        """Give `device` a fresh peer id and row, like a fresh init on that machine."""
        with self._tx():
            rows = self._q("SELECT MAX(generation) FROM peers WHERE device = ?", (device,))
            generation = 0 if rows[0][0] is None else int(rows[0][0]) + 1
            return self._new_peer(device, generation, os_name)

    def _new_peer(self, device: int, generation: int, os_name: str) -> str:
        peer = ids.peer_id(self.salt, device, generation)
        self.db.execute(
            "INSERT INTO peers (device, generation, peer_id) VALUES (?, ?, ?)",
            (device, generation, peer),
        )
        self.db.execute(
            "INSERT OR IGNORE INTO devices (peer_id, name, os, apps, deleted, created) "
            "VALUES (?, ?, ?, '{}', 0, (SELECT COUNT(*) FROM devices))",
            (peer, f"devserver-{device}", os_name),
        )
        return peer

    def _current_peer(self, device: int) -> str | None:
        rows = self._q(
            "SELECT peer_id FROM peers WHERE device = ? ORDER BY generation DESC LIMIT 1", (device,)
        )
        return str(rows[0][0]) if rows else None

    def peers(self) -> dict[int, str]:
        """Return the current peer id of every devserver device."""
        rows = self._q(
            "SELECT device, peer_id FROM peers p WHERE generation = "
            "(SELECT MAX(generation) FROM peers q WHERE q.device = p.device)"
        )
        return {int(d): str(p) for d, p in rows}

    def ensure_replicas(self, replicas: Sequence[int], now: float) -> set[tuple[int, str]]:
        """Create missing replicas; a new one starts as a copy of replica 1 (its first sync)."""
        touched: set[tuple[int, str]] = set()
        with self._tx():
            for replica in replicas:
                if replica in self._hlc:
                    continue
                self.db.execute("INSERT INTO replicas (replica, hlc) VALUES (?, 0)", (replica,))
                self._hlc[replica] = 0
                if replica == 1 or 1 not in self._hlc:
                    continue
                self._observe(replica, self._hlc[1])
                rows = self._q(
                    "SELECT space, object_id, dataset, id, fields, clocks, deleted, updated_at "
                    "FROM records WHERE replica = 1 ORDER BY space, object_id, dataset, id"
                )
                for space, obj, ds, rid, fields, clocks, deleted, _ in rows:
                    row = _Row(json.loads(fields), _clocks(clocks), bool(deleted), 1, now)
                    self._save(replica, Where(space, obj, ds), rid, row)
                    self._log(
                        replica,
                        Where(space, obj, ds),
                        rid,
                        "delete" if deleted else "create",
                        None if deleted else _flat(rid, row),
                    )
                    touched.add((replica, space))
        return touched

    # spaces, types, objects, datasets

    def ensure_space(self, space: str) -> None:
        """Create `space` (and its default object type) when missing."""
        with self._tx():
            self.db.execute("INSERT OR IGNORE INTO spaces (id, name) VALUES (?, ?)", (space, space))
            self._insert_type(space, DEFAULT_TYPE_KEY, "Object", False, "auto", False)

    def spaces(self) -> list[dict[str, str]]:
        """Return every space."""
        return [{"id": i, "name": n} for i, n in self._q("SELECT id, name FROM spaces ORDER BY id")]

    def check_space(self, space: str) -> None:
        """Refuse an unknown space with 404."""
        if not self._q("SELECT 1 FROM spaces WHERE id = ?", (space,)):
            known = ", ".join(s["id"] for s in self.spaces())
            raise not_found(f"space {space!r} does not exist; known spaces: {known}")

    def types(self, space: str, include_hidden: bool) -> list[dict[str, Any]]:
        """Return the types of a space (hidden ones only when asked)."""
        self.check_space(space)
        rows = self._q(
            "SELECT id, key, name, hidden, id_rule, dynamic FROM types "
            "WHERE space = ? ORDER BY rowid",
            (space,),
        )
        return [_type_json(r) for r in rows if include_hidden or not r[3]]

    def ensure_type(
        self, space: str, key: str, name: str | None, hidden: bool, id_rule: str, dynamic: bool
    ) -> dict[str, Any]:
        """Return the type `key`, creating it when missing (same key, same type)."""
        self.check_space(space)
        with self._tx():
            type_id = self._insert_type(space, key, name or key, hidden, id_rule, dynamic)
        return self._type(space, type_id)

    def _insert_type(
        self, space: str, key: str, name: str, hidden: bool, id_rule: str, dynamic: bool
    ) -> str:
        rows = self._q("SELECT id FROM types WHERE space = ? AND key = ?", (space, key))
        if rows:
            return str(rows[0][0])
        type_id = ids.type_id(self.salt, space, key)
        self.db.execute(
            "INSERT INTO types (space, id, key, name, hidden, id_rule, dynamic) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (space, type_id, key, name, int(hidden), id_rule, int(dynamic)),
        )
        return type_id

    def _type(self, space: str, type_id: str) -> dict[str, Any]:
        rows = self._q(
            "SELECT id, key, name, hidden, id_rule, dynamic FROM types WHERE space = ? AND id = ?",
            (space, type_id),
        )
        return _type_json(rows[0])

    def child(self, space: str, bundle: str, seed: str, type_ref: str | None) -> dict[str, str]:
        """Resolve the bundle child `seed` to its object, creating it the first time."""
        self.check_space(space)
        with self._tx():
            type_id = None
            if type_ref is not None:
                rows = self._q(
                    "SELECT id FROM types WHERE space = ? AND (id = ? OR key = ?)",
                    (space, type_ref, type_ref),
                )
                if not rows:
                    raise not_found(
                        f"type {type_ref!r} does not exist in space {space!r}; "
                        f"create it with POST /v1/spaces/{space}/types"
                    )
                type_id = str(rows[0][0])
            default = self._insert_type(space, DEFAULT_TYPE_KEY, "Object", False, "auto", False)
            rows = self._q(
                "SELECT id, type_id FROM objects WHERE space = ? AND bundle = ? AND seed = ?",
                (space, bundle, seed),
            )
            if rows:
                obj, current = str(rows[0][0]), str(rows[0][1])
                # A child first resolved without a type takes the first type it is given.
                if type_id is not None and current == default and type_id != default:
                    self.db.execute(
                        "UPDATE objects SET type_id = ? WHERE space = ? AND id = ?",
                        (type_id, space, obj),
                    )
                    current = type_id
            else:
                obj = ids.object_id(self.salt, space, bundle, seed)
                current = type_id or default
                self.db.execute(
                    "INSERT INTO objects (space, id, bundle, seed, type_id) VALUES (?, ?, ?, ?, ?)",
                    (space, obj, bundle, seed, current),
                )
            known = KNOWN_CHILDREN.get((bundle, seed))
            if known is not None:
                self._register_dataset(space, obj, known)
        return {"objectId": obj, "type": current}

    def datasets(self, space: str) -> list[dict[str, Any]]:
        """Return every dataset by collection name with the objects that hold it."""
        self.check_space(space)
        rows = self._q(
            "SELECT o.type_id || '_' || d.name AS coll, d.object_id FROM datasets d "
            "JOIN objects o ON o.space = d.space AND o.id = d.object_id "
            "WHERE d.space = ? ORDER BY coll, d.object_id",
            (space,),
        )
        out: dict[str, list[str]] = {}
        for coll, obj in rows:
            out.setdefault(str(coll), []).append(str(obj))
        return [{"name": name, "objectIds": objs} for name, objs in out.items()]

    def resolve(self, space: str, object_id: str, dataset: str) -> Where:
        """Check space and object; accept the dataset's short or collection name."""
        self.check_space(space)
        rows = self._q("SELECT type_id FROM objects WHERE space = ? AND id = ?", (space, object_id))
        if not rows:
            raise not_found(
                f"object {object_id!r} does not exist in space {space!r}; resolve "
                f"it with POST /v1/spaces/{space}/bundles/<bundle>/children"
            )
        type_id = str(rows[0][0])
        prefix = type_id + "_"
        if dataset.startswith(prefix) and len(dataset) > len(prefix):
            return Where(space, object_id, dataset[len(prefix) :])
        head = dataset.split("_", 2)
        if (
            len(head) == 3
            and head[0] == "t"
            and len(head[1]) == 12
            and self._q("SELECT 1 FROM types WHERE space = ? AND id = ?", (space, f"t_{head[1]}"))
        ):
            raise not_found(
                f"dataset {dataset!r} is a collection of type t_{head[1]}, but "
                f"object {object_id!r} has type {type_id}; use {prefix}{head[2]} "
                f"or the short name {head[2]!r}"
            )
        return Where(space, object_id, dataset)

    def _register_dataset(self, space: str, object_id: str, name: str) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO datasets (space, object_id, name) VALUES (?, ?, ?)",
            (space, object_id, name),
        )

    # records

    def write(
        self, replica: int, where: Where, writes: Sequence[RecordWrite], writer: str, now: float
    ) -> WriteResult:
        """Apply an upsert or modify batch atomically: every record or none."""
        result = WriteResult()
        with self._tx():
            self._register_dataset(where.space, where.object_id, where.dataset)
            for i, w in enumerate(writes):
                at = f"records[{i}]"
                row = self._load(replica, where, w.id)
                if row is not None and row.deleted:
                    raise ApiError(
                        409,
                        "tombstoned",
                        f"{at}: record {w.id!r} is deleted and a "
                        "deleted id stays deleted; write it under a new id",
                    )
                if row is None and not w.upsert:
                    raise not_found(
                        f'{at}: record {w.id!r} does not exist; add "upsert": true to create it'
                    )
                current = row.version if row is not None else 0
                if w.if_version is not None and w.if_version != current:
                    raise ApiError(
                        409,
                        "version_conflict",
                        f"{at}: record {w.id!r} is at version "
                        f"{current}, not ifVersion {w.if_version}; read it again "
                        "and retry",
                    )
                old = row.fields if row is not None else {}
                if w.ops is not None:
                    new, touched = apply_ops(old, w.ops, w.id, at)
                else:
                    sent = clean_fields(w.fields or {}, w.id, f"{at}.fields")
                    new, touched = {**old, **sent}, set(sent)
                stamp = (self._tick(replica, now), writer)
                clocks = dict(row.clocks) if row is not None else {}
                clocks.update({k: stamp for k in touched})
                saved = _Row(new, clocks, False, current + 1, now)
                self._save(replica, where, w.id, saved)
                self._log(replica, where, w.id, "update" if row else "create", _flat(w.id, saved))
                result.versions.append((w.id, saved.version))
                result.touched.add((replica, where.space))
                delta = Delta(
                    stamp,
                    set={k: new[k] for k in touched if k in new},
                    unset=sorted(k for k in touched if k not in new),
                )
                result.queued |= self._fan_out(replica, where, w.id, delta, now, result.touched)
        return result

    def delete(
        self, replica: int, where: Where, record_ids: Sequence[str], writer: str, now: float
    ) -> WriteResult:
        """Tombstone ids (ids never written get a tombstone too, so they stay unusable)."""
        result = WriteResult()
        with self._tx():
            self._register_dataset(where.space, where.object_id, where.dataset)
            for rid in record_ids:
                row = self._load(replica, where, rid)
                if row is not None and row.deleted:
                    continue
                stamp = (self._tick(replica, now), writer)
                self._tombstone(replica, where, rid, row, now)
                result.versions.append((rid, (row.version if row else 0) + 1))
                result.touched.add((replica, where.space))
                delta = Delta(stamp, delete=True)
                result.queued |= self._fan_out(replica, where, rid, delta, now, result.touched)
        return result

    def records(self, replica: int, where: Where, include_deleted: bool) -> list[Record]:
        """Return the flat records of a dataset (and its tombstones when asked), by id."""
        return list(self.records_after(replica, where, include_deleted))

    def records_after(
        self, replica: int, where: Where, include_deleted: bool, after: str | None = None
    ) -> Iterator[Record]:
        """Yield the flat records of a dataset (and its tombstones when asked) with ids past
        `after`, by id, reading them a chunk at a time: a page of a large dataset reads only
        its own rows and those just past it, not the whole dataset."""
        sql = (
            "SELECT id, fields, deleted, version, updated_at FROM records WHERE replica = ? "
            "AND space = ? AND object_id = ? AND dataset = ?"
        )
        params: tuple[Any, ...] = (replica, where.space, where.object_id, where.dataset)
        if after is not None:
            sql, params = sql + " AND id > ?", (*params, after)
        if not include_deleted:
            sql += " AND deleted = 0"
        cursor = self.db.execute(sql + " ORDER BY id", params)
        try:
            while chunk := cursor.fetchmany(256):
                for rid, fields, deleted, version, updated_at in chunk:
                    if deleted:
                        yield {"id": rid, "_deleted": True, "_v": version}
                    else:
                        row = _Row(json.loads(fields), {}, False, version, updated_at)
                        yield _flat(rid, row)
        finally:
            cursor.close()

    def changes(self, replica: int, space: str, since: int, limit: int) -> tuple[list[Record], int]:
        """Return up to `limit` feed entries after `since`, and the feed's head."""
        self.check_space(space)
        rows = self._q(
            "SELECT seq, object_id, dataset, id, op, record FROM changes WHERE replica = ? "
            "AND space = ? AND seq > ? ORDER BY seq LIMIT ?",
            (replica, space, since, limit),
        )
        entries = []
        for seq, obj, ds, rid, op, record in rows:
            entry: Record = {"seq": seq, "objectId": obj, "dataset": ds, "id": rid, "op": op}
            if record is not None:
                entry["record"] = json.loads(record)
            entries.append(entry)
        return entries, self._head(replica, space)

    def heads(self, replica: int) -> dict[str, int]:
        """Return the feed head of every space on a replica."""
        return {str(s): self._head(replica, str(s)) for (s,) in self._q("SELECT id FROM spaces")}

    def _head(self, replica: int, space: str) -> int:
        rows = self._q(
            "SELECT MAX(seq) FROM changes WHERE replica = ? AND space = ?", (replica, space)
        )
        return int(rows[0][0] or 0)

    def _load(self, replica: int, where: Where, rid: str) -> _Row | None:
        rows = self._q(
            "SELECT fields, clocks, deleted, version, updated_at FROM records WHERE replica = ? "
            "AND space = ? AND object_id = ? AND dataset = ? AND id = ?",
            (replica, where.space, where.object_id, where.dataset, rid),
        )
        if not rows:
            return None
        fields, clocks, deleted, version, updated_at = rows[0]
        return _Row(
            json.loads(fields), _clocks(clocks), bool(deleted), int(version), float(updated_at)
        )

    def _save(self, replica: int, where: Where, rid: str, row: _Row) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO records (replica, space, object_id, dataset, id, fields, "
            "clocks, deleted, version, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                replica,
                where.space,
                where.object_id,
                where.dataset,
                rid,
                _dumps(row.fields),
                _dumps({k: list(v) for k, v in row.clocks.items()}),
                int(row.deleted),
                row.version,
                row.updated_at,
            ),
        )

    def _tombstone(
        self, replica: int, where: Where, rid: str, row: _Row | None, now: float
    ) -> None:
        version = (row.version if row else 0) + 1
        self._save(replica, where, rid, _Row({}, {}, True, version, now))
        self._log(replica, where, rid, "delete", None)

    def _log(self, replica: int, where: Where, rid: str, op: str, record: Record | None) -> None:
        seq = self._head(replica, where.space) + 1
        self.db.execute(
            "INSERT INTO changes (replica, space, seq, object_id, dataset, id, op, record) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                replica,
                where.space,
                seq,
                where.object_id,
                where.dataset,
                rid,
                op,
                None if record is None else _dumps(record),
            ),
        )

    # replication

    def _tick(self, replica: int, now: float) -> int:
        # A hybrid logical clock: never behind the wall clock, always past what the replica saw,
        # so a write made after seeing another one wins over it.
        hlc = max(int(now * 1_000_000), self._hlc.get(replica, 0) + 1)
        self._observe(replica, hlc)
        return hlc

    def _observe(self, replica: int, hlc: int) -> None:
        if hlc > self._hlc.get(replica, 0):
            self._hlc[replica] = hlc
            self.db.execute(
                "INSERT OR REPLACE INTO replicas (replica, hlc) VALUES (?, ?)", (replica, hlc)
            )

    def _fan_out(
        self,
        src: int,
        where: Where,
        rid: str,
        delta: Delta,
        now: float,
        touched: set[tuple[int, str]],
    ) -> bool:
        topo = self.topology
        queued = False
        for dst in topo.replicas:
            if dst == src:
                continue
            cut = src in topo.partitioned or dst in topo.partitioned
            if topo.delay <= 0 and not cut:
                if self._apply(dst, where, rid, delta, now):
                    touched.add((dst, where.space))
                continue
            self.db.execute(
                "INSERT INTO sync_queue (src, dst, due, space, object_id, dataset, rec_id, delta) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    src,
                    dst,
                    now + max(0.0, topo.delay),
                    where.space,
                    where.object_id,
                    where.dataset,
                    rid,
                    _dumps(delta.to_json()),
                ),
            )
            queued = True
        return queued

    def _apply(self, dst: int, where: Where, rid: str, delta: Delta, now: float) -> bool:
        """Merge a replicated delta into `dst`; tombstones win. Return whether the feed grew."""
        self._observe(dst, delta.stamp[0])
        row = self._load(dst, where, rid)
        if row is not None and row.deleted:
            return False
        if delta.delete:
            self._tombstone(dst, where, rid, row, now)
            return True
        old_fields = row.fields if row is not None else {}
        old_clocks = row.clocks if row is not None else {}
        fields, clocks, changed = merge(old_fields, old_clocks, delta)
        if row is not None and not changed:
            if clocks != old_clocks:
                self._save(
                    dst, where, rid, _Row(fields, clocks, False, row.version, row.updated_at)
                )
            return False
        saved = _Row(fields, clocks, False, (row.version if row else 0) + 1, now)
        self._save(dst, where, rid, saved)
        self._log(dst, where, rid, "update" if row else "create", _flat(rid, saved))
        return True

    def deliver(
        self, now: float, limit: int = 500, *, early: bool = False
    ) -> tuple[int, set[tuple[int, str]]]:
        """Apply queued writes due (all with `early`) and not cut off: (how many, feeds grown)."""
        cut = sorted(self.topology.partitioned)
        marks = ",".join("?" * len(cut))
        excluded = f" AND src NOT IN ({marks}) AND dst NOT IN ({marks})" if cut else ""
        touched: set[tuple[int, str]] = set()
        with self._tx():
            rows = self._q(
                "SELECT id, dst, space, object_id, dataset, rec_id, delta FROM sync_queue "
                f"WHERE (due <= ? OR ?){excluded} ORDER BY id LIMIT ?",
                (now, int(early), *cut, *cut, limit),
            )
            for qid, dst, space, obj, ds, rid, delta in rows:
                if self._apply(
                    int(dst), Where(space, obj, ds), rid, Delta.from_json(json.loads(delta)), now
                ):
                    touched.add((int(dst), str(space)))
                self.db.execute("DELETE FROM sync_queue WHERE id = ?", (qid,))
        return len(rows), touched

    def next_due(self) -> float | None:
        """Return when the next deliverable queued write falls due, or None."""
        cut = sorted(self.topology.partitioned)
        marks = ",".join("?" * len(cut))
        excluded = f" WHERE src NOT IN ({marks}) AND dst NOT IN ({marks})" if cut else ""
        rows = self._q(f"SELECT MIN(due) FROM sync_queue{excluded}", (*cut, *cut))
        return None if rows[0][0] is None else float(rows[0][0])

    def pending(self) -> dict[int, dict[str, int]]:
        """Return per replica how many queued writes it has still to send and to receive."""
        out: dict[int, dict[str, int]] = {
            r: {"outgoing": 0, "incoming": 0} for r in self.topology.replicas
        }
        for src, n in self._q("SELECT src, COUNT(*) FROM sync_queue GROUP BY src"):
            out.setdefault(int(src), {"outgoing": 0, "incoming": 0})["outgoing"] = int(n)
        for dst, n in self._q("SELECT dst, COUNT(*) FROM sync_queue GROUP BY dst"):
            out.setdefault(int(dst), {"outgoing": 0, "incoming": 0})["incoming"] = int(n)
        return out

    # devices registry

    def device_rows(self) -> list[DeviceRow]:
        """Return every device row, pruned ones included, oldest first."""
        rows = self._q("SELECT peer_id, name, os, apps, deleted FROM devices ORDER BY created")
        return [DeviceRow(p, n, o, json.loads(a), bool(d)) for p, n, o, a, d in rows]

    def devices_view(self, self_peer: str) -> dict[str, Any]:
        """Return the registry as `GET /v1/devices` answers it for device `self_peer`."""
        rows = self.device_rows()
        return {"self": self_peer, "active": winners(rows), "devices": [r.to_json() for r in rows]}

    def register(
        self,
        peer: str,
        name: str | None,
        os_name: str | None,
        apps: Mapping[str, Mapping[str, Any]],
    ) -> DeviceRow:
        """Update the own row: name, os and app versions (existing claims stay)."""
        with self._tx():
            row = self._own_row(peer)
            if name is not None:
                row.name = name
            if os_name is not None:
                row.os = os_name
            for app, entry in apps.items():
                row.apps[app] = {**row.apps.get(app, {}), **entry}
            self._save_device(row)
        return row

    def activate(self, peer: str, app: str, now: float) -> DeviceRow:
        """Give the own row the newest claim on `app`."""
        with self._tx():
            row = self._own_row(peer)
            seq = next_seq(self.device_rows(), app)
            entry = row.apps.setdefault(app, {"version": ""})
            entry.update({"seq": seq, "at": now})
            self._save_device(row)
        return row

    def prune(self, peer: str) -> DeviceRow:
        """Tombstone a device row; it stays listed with `deleted: true`."""
        with self._tx():
            row = self._device(peer)
            if row is None:
                raise not_found(
                    f"device {peer!r} is not in the registry; GET /v1/devices lists the peer ids"
                )
            row.deleted = True
            self._save_device(row)
        return row

    def _own_row(self, peer: str) -> DeviceRow:
        row = self._device(peer)
        if row is None:
            raise not_found(f"device {peer!r} has no registry row")
        if row.deleted:
            raise ApiError(
                409,
                "pruned",
                f"device {peer} was pruned from the account; only a "
                "fresh init (a new peer id) brings it back",
            )
        return row

    def _device(self, peer: str) -> DeviceRow | None:
        return next((r for r in self.device_rows() if r.peer_id == peer), None)

    def _save_device(self, row: DeviceRow) -> None:
        self.db.execute(
            "UPDATE devices SET name = ?, os = ?, apps = ?, deleted = ? WHERE peer_id = ?",
            (row.name, row.os, _dumps(row.apps), int(row.deleted), row.peer_id),
        )


def _flat(rid: str, row: _Row) -> Record:
    return {
        "id": rid,
        **row.fields,
        "_v": row.version,
        "_updatedAt": math.floor(row.updated_at * 1000) / 1000,
    }


def _clocks(raw: str) -> dict[str, Stamp]:
    return {k: (int(v[0]), str(v[1])) for k, v in json.loads(raw).items()}


def _type_json(row: tuple[Any, ...]) -> dict[str, Any]:
    type_id, key, name, hidden, id_rule, dynamic = row
    return {
        "id": type_id,
        "key": key,
        "name": name,
        "hidden": bool(hidden),
        "idRule": id_rule,
        "dynamic": bool(dynamic),
    }
