"""The SQLite mirror: the only module that speaks SQL.

The daemon keeps everything it must not lose here: the last-seen trigger records,
each registry entry's state, run summaries with their captured output, the outbox
of writes still owed to the server, tombstoned ids and small state. Writes come in
batches, each one `BEGIN IMMEDIATE` transaction, so a crash leaves either all of a
batch or none of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    create_engine,
    delete,
    event,
    false,
    func,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.pool import ConnectionPoolEntry

from anyrtd.client import Upsert
from anyrtd.clock import rise_at_once
from anyrtd.heap import gc_paused
from anyrtd.mirror_guard import (
    AT_RISK,
    REBUILD,
    FileId,
    MirrorCorrupt,
    MirrorFault,
    MirrorLost,
    MirrorUnusable,
    check_same_file,
    file_id,
    lost,
    read_marker,
    rebuild,
    write_marker,
)
from anyrtd.rows import Batch, EntryRow, NoticeRow, RunRow, SetAside
from anyrtd.vocab import OPEN_STATES, RunState

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

T = TypeVar("T")
log = logging.getLogger("anyrtd.mirror")

MIRROR_ID = "mirror_id"
"""The `meta` key of the mirror's own id, which the state directory's marker names too."""
UPGRADE = "`anyrtd db upgrade` (with the same --state-dir)"

metadata = MetaData()
"""The mirror's tables as the migrations leave them at head (tests/test_mirror_schema.py checks).

The views (`scheduled_next`, `recent_runs`) are made by the migration alone: they are for
people reading the file with `sqlite3`, and no code here reads them.
"""

meta_table = Table(
    "meta", metadata, Column("key", Text, primary_key=True), Column("value", Text, nullable=False)
)
records_table = Table(
    "trigger_records",
    metadata,
    Column("id", Text, primary_key=True),
    Column("version", Integer),
    Column("record", Text, nullable=False),
    Column("seen_at", Float, nullable=False),
)
entries_table = Table(
    "entries",
    metadata,
    Column("trigger_id", Text, primary_key=True),
    Column("fingerprint", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("armed_at", Float, nullable=False),
    Column("next_fire", Float),
    Column("consumed", Boolean, nullable=False, server_default=false()),
    Column("consecutive_failures", Integer, nullable=False, server_default="0"),
    Column("run_count", Integer, nullable=False, server_default="0"),
    Column("marker", Text),
    Column("claimed_at", Float),
    Index("entries_next_fire", "next_fire"),
)
runs_table = Table(
    "runs",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("trigger_id", Text),
    Column("program", Text, nullable=False),
    Column("device", Text, nullable=False),
    Column("scheduled_at", Float),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float),
    Column("duration_ms", Integer),
    Column("status", Text, nullable=False),
    Column("error_type", Text),
    Column("error", Text),
    Column("result", Text, nullable=False, server_default="{}"),
    Column("output", Text, nullable=False, server_default=text("''")),
    Column("output_dropped", Integer, nullable=False, server_default="0"),
    Column("process_group", Integer),
    Column("process_start", Text),
    Column("state", Text, nullable=False, server_default=RunState.ENDED.value),
    Column("upstream_run_id", Text),
    Column("chain_depth", Integer, nullable=False, server_default="0"),
    Index("runs_trigger_started", "trigger_id", "started_at"),
    Index("runs_status", "status"),
    Index("runs_started", "started_at"),
)
outbox_table = Table(
    "outbox",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("dataset", Text, nullable=False),
    Column("record_id", Text, nullable=False),
    Column("fields", Text, nullable=False),
    Column("unset", Text, nullable=False, server_default="[]"),
    Column("created_at", Float, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("last_error", Text),
    Column("set_aside_at", Float),
    Column("if_version", Integer),
)
tombstones_table = Table(
    "tombstones",
    metadata,
    Column("id", Text, primary_key=True),
    Column("deleted_at", Float, nullable=False),
)
notices_table = Table(
    "notices",
    metadata,
    Column("key", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("trigger_id", Text),
    Column("created_at", Float, nullable=False),
    Column("notice", Text, nullable=False),
    Column("pending", Text, nullable=False, server_default=text("''")),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_try_at", Float),
    Column("last_error", Text),
    Index("notices_created", "created_at"),
)


class SchemaNotAtHead(MirrorFault):
    """The mirror's schema is older (or newer) than this anyrtd expects."""


class SchemaUnversioned(SchemaNotAtHead):
    """The mirror has tables but no schema revision: anyrtd did not make it, or not all of it."""


@dataclass(frozen=True)
class Snapshot:
    """What a restart needs from the mirror before the server answers."""

    entries: list[EntryRow]
    tombstones: set[str]
    meta: dict[str, str]
    last_fired: dict[str, float] = field(default_factory=dict)
    """The latest scheduledAt run of each trigger (recurring ones are not fired there again)."""


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def _dumps(value: Any) -> str:
    # One encoder for every value: `json.dumps` with options builds one per call.
    return _ENCODER.encode(value)


SCHEMA_HEAD = "chained_runs"
"""The schema revision this code works on: the head of migrations/ (a test holds them
equal). A start whose mirror is at it reads the revision without loading Alembic, which
costs the start about 0.2 s of imports; anything else (a new mirror, an upgrade, a mirror
at another revision) asks Alembic."""


def alembic_config(url: str) -> AlembicConfig:
    """Return an Alembic config for `url` using the migrations shipped in the package."""
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(resources.files("anyrtd.migrations")))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


TRIM_ROWS = 2000
"""The most run rows one commit deletes to keep triggers to their bound: a mirror far over it
(one from before the bound, or a bound lowered) comes down over the next commits, never in
one long transaction."""


def trim_slack(kept: int) -> int:
    """Return how many runs of a trigger may end beyond `kept` before they are trimmed: a
    tenth of the bound, so that a trim deletes a batch of rows, not one row per run."""
    return max(1, kept // 10)


class Mirror:
    """The SQLite mirror of one daemon; use from one thread (the daemon's db executor).

    With `runs_kept` (the `runs_kept_per_trigger` setting, read at each commit), each
    trigger keeps its newest `runs_kept()` finished runs: once `trim_slack` more of its runs
    have ended, the commit that comes next deletes the older ones in the same transaction,
    through the index on (trigger_id, started_at), so no commit scans the table.
    """

    def __init__(self, path: Path, *, runs_kept: Callable[[], int] | None = None) -> None:
        self.path = path
        self._runs_kept = runs_kept
        self._ended: dict[str, int] = {}
        """Finished runs written per trigger since its runs were last trimmed."""
        self._trim_due: set[str] = set()
        """The triggers whose runs the next commit trims to the bound."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.url = f"sqlite:///{path}"
        self.engine: Engine = create_engine(self.url)
        self.mirror_id: str | None = None
        self.opened: FileId | None = None
        """The file's identity once `ensure_schema` passed: checked before each use."""
        self._unmarked = False
        self._marker_failed = False
        self.outbox_queued = 0
        """How many commits have queued outbox writes (read from the loop: a drain whose
        last read saw the count unchanged has seen every write queued)."""
        self.outbox_changes = 0
        """How many transactions have changed the outbox's rows (queued, released, dropped,
        sent, set aside): an outbox depth counted at one value holds until it moves."""
        self._writer: Connection | None = None
        """The connection the hot writes (`commit`, the outbox's acks) go through, kept
        open: a pool checkout, a connection object and its reset for every transaction were
        about a tenth of a fire's CPU in the loop's thread and the mirror's."""
        event.listen(self.engine, "connect", _on_connect)
        event.listen(self.engine, "begin", self._on_begin)
        event.listen(self.engine, "handle_error", self._on_error)

    def close(self) -> None:
        self._drop_writer()
        self.engine.dispose()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Cursor]:
        """One transaction on the kept connection, its statements run on the SQLite
        connection itself; a failure closes it (the next one opens another, whatever state
        the failure left it in). A SQLite error that says the mirror is lost, damaged or
        cannot be written is raised as its `MirrorFault`, as `_on_error` does for the
        statements that go through SQLAlchemy.

        Not through SQLAlchemy: its transaction, its `begin` event and its execution of
        each statement cost a fire's transactions 161 µs of CPU where these take 138
        (`bench/bench_perfire.py`; docs/benchmarks.md, "Where issue 22's spread CPU
        went")."""
        conn = self._writer
        if conn is None or conn.closed or conn.invalidated:
            conn = self._writer = self.engine.connect()
        raw = conn.connection.driver_connection
        assert isinstance(raw, sqlite3.Connection)
        try:
            self.check_file()
            cur = raw.cursor()
            cur.execute("BEGIN IMMEDIATE")
            yield cur
            cur.execute("COMMIT")
        except BaseException as exc:
            self._drop_writer()  # its return to the pool rolls back what is left open
            if isinstance(exc, sqlite3.Error) and (fault := self._fault(exc)) is not None:
                raise fault from exc
            raise

    def _drop_writer(self) -> None:
        conn, self._writer = self._writer, None
        if conn is not None:
            with contextlib.suppress(Exception):  # it failed already: closing is all that's left
                conn.close()

    def _on_begin(self, conn: Connection) -> None:
        self.check_file()
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    def _on_error(self, context: ExceptionContext) -> None:
        fault = self._fault(context.original_exception)
        if fault is not None:
            raise fault

    def _fault(self, exc: BaseException) -> MirrorFault | None:
        """Return the `MirrorFault` a SQLite error on this mirror means, if any."""
        return sqlite_fault(self.path, exc, opening=self.opened is None)

    def check_file(self) -> None:
        """Raise `MirrorLost` when the file opened is deleted or replaced (one stat)."""
        if self.opened is not None:
            check_same_file(self.path, self.opened)

    # schema

    def revisions(self) -> tuple[str | None, str | None]:
        """Return (the mirror's current revision, the head this code expects)."""
        with self.engine.connect() as conn:
            found = conn.exec_driver_sql(_HAS_VERSIONS).first() is not None
            versions = conn.exec_driver_sql(_VERSIONS).all() if found else []
            if [tuple(v) for v in versions] == [(SCHEMA_HEAD,)]:
                return SCHEMA_HEAD, SCHEMA_HEAD  # at head: no need to load Alembic
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(alembic_config(self.url)).get_current_head()
        with self.engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
        return current, head

    def known_revision(self, revision: str) -> bool:
        """Return whether this anyrtd's migrations know `revision`."""
        from alembic.script import ScriptDirectory

        script = ScriptDirectory.from_config(alembic_config(self.url))
        return any(s.revision == revision for s in script.walk_revisions())

    def upgrade(self) -> None:
        """Bring the schema to head."""
        from alembic import command

        cfg = alembic_config(self.url)
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def is_empty(self) -> bool:
        """Return whether the mirror has no tables (a missing file has none)."""
        if not self.path.exists():
            return True
        with self.engine.connect() as conn:
            n = conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar_one()
        return int(n) == 0

    def check_revision(self) -> None:
        """Raise `SchemaNotAtHead` (saying what to do) unless the mirror is at head."""
        current, head = self.revisions()
        if current == head:
            return
        if current is None:
            raise SchemaUnversioned(
                f"the mirror {self.path} has tables but no schema revision (no alembic_version "
                f"table): anyrtd did not make it, or did not finish; run {REBUILD} to move it "
                f"aside and start afresh (this loses {AT_RISK})"
            )
        if not self.known_revision(current):
            raise SchemaNotAtHead(
                f"the mirror {self.path} is at schema revision {current}, which this anyrtd does "
                f"not know (its newest is {head}): a newer anyrtd wrote it; upgrade anyrtd to "
                "that version or later (`anyrtd db upgrade` cannot go forward to it)"
            )
        raise SchemaNotAtHead(
            f"the mirror {self.path} is at schema revision {current}, "
            f"this anyrtd needs {head}: run {UPGRADE}"
        )

    def upgrade_checked(self) -> str | None:
        """Bring the schema to head as `anyrtd db upgrade` does; return the revision before.

        Raise a `MirrorFault` instead where an upgrade cannot help: a lost mirror (the state
        directory's marker says it had one), a damaged one, an unversioned or a newer one.
        """
        if self.is_empty():
            if read_marker(self.path) is not None:
                raise lost(self.path, "is missing" if not self.path.exists() else "is empty")
            self.upgrade()
            return None
        current, _ = self.revisions()
        try:
            self.check_revision()
        except SchemaNotAtHead:
            if current is None or not self.known_revision(current):
                raise
        self.upgrade()
        return current

    def ensure_schema(self, *, create: bool) -> None:
        """Open the mirror for the daemon, or raise a `MirrorFault` that says what to do.

        A state directory that never had a mirror gets a new one at head when `create`. One
        that had a mirror (its marker says so) refuses a missing, empty or other one. The
        mirror must be at head and writable; its file's identity is kept for `check_file`.
        """
        had = read_marker(self.path)
        if self.is_empty():
            if had is not None:
                raise lost(self.path, "is missing" if not self.path.exists() else "is empty")
            if not create:
                raise SchemaNotAtHead(f"there is no mirror at {self.path}: run {UPGRADE}")
            self.upgrade()
        else:
            self.check_revision()
        self._adopt_id(had)
        self.opened = file_id(self.path)

    def _adopt_id(self, had: str | None) -> None:
        """Read (or give) the mirror its id and check it against the marker `had`.

        A write transaction, so a mirror anyrtd cannot write fails here, at start.
        """
        with self.engine.begin() as conn:
            found = conn.execute(
                select(meta_table.c.value).where(meta_table.c.key == MIRROR_ID)
            ).scalar_one_or_none()
            if had is not None and found is not None and found != had:
                other = f"is another mirror (its id is {found}, the state directory had {had})"
                raise lost(self.path, other)
            # No id: a mirror from before the marker, say a backup restored; it is taken as
            # the one the marker names.
            found = found or had or uuid.uuid4().hex
            # Written even when it is there: a read-only file lets BEGIN IMMEDIATE pass and
            # fails only on a write.
            stmt = sqlite_insert(meta_table).values(key=MIRROR_ID, value=found)
            conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": found}))
            holds_state = _holds_state(conn)
        self.mirror_id = found
        self._unmarked = had is None
        if self._unmarked and holds_state:
            # A mirror from before the marker, or a crash between its first commit and the
            # marker: it holds state, so the directory has a mirror from now on.
            self._mark()

    def _mark(self) -> None:
        """Write the state directory's marker once the mirror holds state; never raise."""
        assert self.mirror_id is not None
        try:
            write_marker(self.path, self.mirror_id)
        except OSError as exc:
            if not self._marker_failed:
                self._marker_failed = True
                log.warning(
                    "cannot write the marker beside %s (%s): a deleted mirror would not be "
                    "noticed at the next start",
                    self.path,
                    exc.strerror,
                )
            return
        self._unmarked = False

    # reading

    @gc_paused()  # the entries of 100,000 triggers: anyrtd/heap.py
    def snapshot(self) -> Snapshot:
        with self.engine.connect() as conn:
            entries = [_entry_row(r) for r in conn.exec_driver_sql(_SELECT_ENTRIES)]
            tombs = {r.id for r in conn.execute(select(tombstones_table.c.id))}
            meta = {r.key: r.value for r in conn.execute(select(meta_table))}
            latest = func.max(runs_table.c.scheduled_at)
            fired = conn.execute(
                select(runs_table.c.trigger_id, latest, func.count())
                .where(runs_table.c.trigger_id.is_not(None))
                .group_by(runs_table.c.trigger_id)
            )
            kept = self._runs_kept() if self._runs_kept is not None else None
            last_fired: dict[str, float] = {}
            for tid, at, count in fired:
                if at is not None:
                    last_fired[tid] = at
                if kept is not None and count > kept:
                    self._trim_due.add(tid)  # over the bound already: trimmed from the next commit
        return Snapshot(entries, tombs, meta, last_fired)

    def record_texts(self, after: str = "", limit: int = 5000) -> list[tuple[str, int | None, str]]:
        """Return a page of (id, version, record JSON text) with ids after `after`, in id
        order."""
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(_RECORD_TEXTS, (after, limit))
            return [(rid, version, text) for rid, version, text in rows]

    def open_runs(self) -> list[RunRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(runs_table).where(runs_table.c.state.in_(OPEN_STATES)))
            return [_run(r) for r in rows]

    def runs(
        self, *, trigger_id: str | None = None, status: str | None = None, limit: int = 20
    ) -> list[RunRow]:
        """Return the newest runs, optionally of one trigger and/or one status (a run prepared
        ahead of its due time is not one until its program starts)."""
        q = select(runs_table).where(runs_table.c.state != RunState.PREPARED)
        q = q.order_by(runs_table.c.started_at.desc()).limit(limit)
        if trigger_id is not None:
            q = q.where(runs_table.c.trigger_id == trigger_id)
        if status is not None:
            q = q.where(runs_table.c.status == status)
        with self.engine.connect() as conn:
            return [_run(r) for r in conn.execute(q)]

    def run(self, run_id: str) -> RunRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(runs_table).where(runs_table.c.run_id == run_id)).first()
        return _run(row) if row is not None else None

    def run_counts(self, since: float | None = None) -> dict[str, int]:
        """Return the number of runs by status (started at or after `since`)."""
        q = select(runs_table.c.status, func.count()).group_by(runs_table.c.status)
        q = q.where(runs_table.c.state != RunState.PREPARED)
        if since is not None:
            q = q.where(runs_table.c.started_at >= since)
        with self.engine.connect() as conn:
            return {str(s): int(n) for s, n in conn.execute(q)}

    def outbox_pending(self, limit: int = 500) -> list[Upsert]:
        """Return the oldest writes still to send, in order; set-aside ones are not sent.

        A row whose stored text no longer decodes (a damaged mirror) is set aside here, so
        that it cannot stop the writes behind it.
        """
        items: list[Upsert] = []
        undecodable: list[int] = []
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(_PENDING_OUTBOX, (limit,))
            for seq, dataset, record_id, fields_text, unset_text, attempts, if_version in rows:
                try:
                    fields_, unset = json.loads(fields_text), json.loads(unset_text)
                except ValueError:
                    undecodable.append(seq)
                    continue
                items.append(
                    Upsert(
                        record_id, fields_, unset, if_version, dataset, seq=seq, attempts=attempts
                    )
                )
        if undecodable:
            reason = "its text in the mirror is not valid JSON"
            self.set_aside_outbox(undecodable, reason, time.time())
        return items

    def outbox_depth(self) -> int:
        """Return how many writes wait to be sent (set-aside ones not counted)."""
        q = select(func.count()).select_from(outbox_table)
        with self.engine.connect() as conn:
            return int(conn.execute(q.where(outbox_table.c.set_aside_at.is_(None))).scalar_one())

    def outbox_counts(self) -> tuple[int, int]:
        """Return how many writes wait to be sent, and how many are set aside (never sent)."""
        aside = outbox_table.c.set_aside_at.is_not(None)
        q = select(func.count(), func.count().filter(aside)).select_from(outbox_table)
        with self.engine.connect() as conn:
            total, set_aside = conn.execute(q).one()
        return int(total) - int(set_aside), int(set_aside)

    def outbox_set_aside(self, limit: int = 100) -> list[SetAside]:
        """Return the writes set aside, oldest first."""
        c = outbox_table.c
        q = (
            select(c.seq, c.dataset, c.record_id, c.set_aside_at, c.last_error)
            .where(c.set_aside_at.is_not(None))
            .order_by(c.seq)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [
                SetAside(r.seq, r.dataset, r.record_id, r.set_aside_at, r.last_error or "")
                for r in conn.execute(q)
            ]

    # writing

    def commit(self, batch: Batch, now: float) -> None:
        """Write a whole batch in one transaction, with the trims of runs that are due."""
        if not batch:
            return
        kept = self._runs_kept() if self._runs_kept is not None else None
        with self._writing() as cur:
            _write_batch(cur, batch, now)
            trimmed = _trim_runs(cur, self._trim_due, kept) if kept and self._trim_due else ()
        if kept:
            self._count_ended(batch, kept, trimmed)
        if batch.outbox:
            self.outbox_queued += 1
            self.outbox_changes += 1
        if self._unmarked and self.mirror_id is not None:
            self._mark()

    def _count_ended(self, batch: Batch, kept: int, trimmed: Iterable[str]) -> None:
        """Note the triggers trimmed down to the bound, and count the runs `batch` ended."""
        for tid in trimmed:
            self._trim_due.discard(tid)
            self._ended.pop(tid, None)
        slack = trim_slack(kept)
        for run in batch.runs:
            of = run.trigger_id
            if of is None or run.state != RunState.ENDED:
                continue
            ended = self._ended[of] = self._ended.get(of, 0) + 1
            if ended >= slack:
                self._trim_due.add(of)

    def ack_outbox(self, seqs: Iterable[int]) -> None:
        seqs = list(seqs)
        with self._writing() as cur:
            _each_in(cur, "DELETE FROM outbox WHERE seq IN ({})", seqs)
        self.outbox_changes += 1

    def fail_outbox(self, seqs: Iterable[int], error: str) -> None:
        seqs = list(seqs)
        with self._writing() as cur:
            _each_in(cur, _FAILED, seqs, (error,))

    def set_aside_outbox(self, seqs: Iterable[int], error: str, now: float) -> None:
        """Keep writes the server can never take, with the reason, and stop sending them."""
        seqs = list(seqs)
        with self._writing() as cur:
            _each_in(cur, _SET_ASIDE, seqs, (error, now))
        self.outbox_changes += 1

    # notices (docs/notices.md)

    def notices_known(self, keys: Iterable[str]) -> set[str]:
        """Return which of `keys` this mirror has a notice for."""
        found: set[str] = set()
        c = notices_table.c
        with self.engine.connect() as conn:
            for chunk in _chunks(list(keys), 500):
                found.update(conn.execute(select(c.key).where(c.key.in_(chunk))).scalars())
        return found

    def notices_retry_at(self) -> float | None:
        """Return when the earliest notice with channels left is to be tried (0 for one
        never tried), or None when none is left."""
        c = notices_table.c
        q = select(func.min(func.coalesce(c.next_try_at, 0.0))).where(c.pending != "")
        with self.engine.connect() as conn:
            at = conn.execute(q).scalar()
        return None if at is None else float(at)

    def notices_since(self, since: float) -> int:
        """Return how many notices this device made to deliver at or after `since` (not the
        ones it found made by another device: nothing left to deliver, never tried)."""
        c = notices_table.c
        mine = or_(c.pending != "", c.attempts > 0)
        q = select(func.count()).select_from(notices_table).where(c.created_at >= since, mine)
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar_one())

    def notices_due(self, now: float) -> list[NoticeRow]:
        """Return the notices with channels left to try at `now`, oldest first."""
        c = notices_table.c
        q = (
            select(notices_table)
            .where(c.pending != "", or_(c.next_try_at.is_(None), c.next_try_at <= now))
            .order_by(c.created_at)
        )
        with self.engine.connect() as conn:
            return [_notice(r) for r in conn.execute(q)]

    def save_notice(self, row: NoticeRow) -> None:
        """Write a notice's row, new or updated."""
        values = {
            "key": row.key,
            "kind": row.kind,
            "trigger_id": row.trigger_id,
            "created_at": row.created_at,
            "notice": _dumps(row.notice),
            "pending": " ".join(row.pending),
            "attempts": row.attempts,
            "next_try_at": row.next_try_at,
            "last_error": row.last_error,
        }
        with self._writing() as cur:
            _UPSERT_NOTICE.run(cur, [tuple(values[c.name] for c in notices_table.c)])

    def prune_runs(self, before: float) -> int:
        """Delete finished runs that started before `before`; return how many."""
        with self.engine.begin() as conn:
            result = conn.execute(
                delete(runs_table).where(
                    runs_table.c.started_at < before, runs_table.c.state == RunState.ENDED
                )
            )
        return int(result.rowcount or 0)


SQL_PARAMS = 999
"""The most parameters one statement of a commit binds: SQLite's limit before 3.32 (32,766
since), so that any SQLite will do."""


@dataclass(frozen=True, slots=True)
class Rows:
    """An INSERT of many rows as few statements: the rows' values in one multi-row VALUES,
    up to `SQL_PARAMS` parameters a statement.

    Row by row (`executemany`), each row is a step of the statement, and each step lets go
    of the GIL and takes it again; while the event loop's thread is busy, each take waits
    up to the interpreter's switch interval (5 ms). A tick's commit of 571 rows then took
    364 ms for 28 ms of CPU, and a start whose prepare's commit queued behind it came
    475 ms late (the records fault family, docs/reliability.md). As one statement for up
    to `SQL_PARAMS` parameters, the same rows take the GIL again a few times, not 571."""

    head: str
    """The statement up to VALUES."""
    row: str
    """One row's values: `(?, ?, 0)`."""
    tail: str = ""
    """What follows the rows (`ON CONFLICT …`)."""

    @property
    def per_statement(self) -> int:
        """How many rows one statement takes."""
        return max(1, SQL_PARAMS // self.row.count("?"))

    def sql(self, rows: int) -> str:
        """Return the statement for `rows` rows."""
        return _values_sql(self.head, self.row, self.tail, rows)

    def run(self, cur: sqlite3.Cursor, rows: Sequence[Sequence[Any]]) -> None:
        """Write `rows`, each a row's values in the order of its marks."""
        for chunk in _chunks(rows, self.per_statement):
            values = tuple(value for row in chunk for value in row)
            cur.execute(self.sql(len(chunk)), values)


@functools.cache
def _values_sql(head: str, row: str, tail: str, rows: int) -> str:
    return f"{head} VALUES {', '.join([row] * rows)}{tail}"


def _upsert(table: Table, key: str) -> Rows:
    """Return the INSERT … ON CONFLICT DO UPDATE of every column of `table` but `key`."""
    cols = [c.name for c in table.c]
    sets = ", ".join(f"{c} = excluded.{c}" for c in cols if c != key)
    return Rows(
        f"INSERT INTO {table.name} ({', '.join(cols)})",
        f"({', '.join('?' for _ in cols)})",
        f" ON CONFLICT ({key}) DO UPDATE SET {sets}",
    )


# The statements a step's commit runs, written once: built and compiled by SQLAlchemy on
# every commit, they cost more CPU than the rows they write (issue 13, item 3).
_RECORD_COLS = ("id", "version", "record", "seen_at")
_UPSERT_RECORD = Rows(
    f"INSERT INTO trigger_records ({', '.join(_RECORD_COLS)})",
    "(?, ?, ?, ?)",
    " ON CONFLICT (id) DO UPDATE SET version = excluded.version, record = excluded.record, "
    "seen_at = excluded.seen_at",
)
_UPSERT_ENTRY = _upsert(entries_table, "trigger_id")
_UPSERT_RUN = _upsert(runs_table, "run_id")
_INSERT_OUTBOX = Rows(
    "INSERT INTO outbox (dataset, record_id, fields, unset, created_at, attempts, last_error, "
    "set_aside_at, if_version)",
    "(?, ?, ?, ?, ?, 0, NULL, NULL, ?)",
)
_PENDING_OUTBOX = (
    "SELECT seq, dataset, record_id, fields, unset, attempts, if_version FROM outbox "
    "WHERE set_aside_at IS NULL ORDER BY seq LIMIT ?"
)
_INSERT_TOMBSTONE = Rows(
    "INSERT INTO tombstones (id, deleted_at)", "(?, ?)", " ON CONFLICT (id) DO NOTHING"
)
_UPSERT_NOTICE = _upsert(notices_table, "key")
_UPSERT_META = Rows(
    "INSERT INTO meta (key, value)",
    "(?, ?)",
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
)


def _write_batch(cur: sqlite3.Cursor, batch: Batch, now: float) -> None:
    # The upserts are unconditional, so only the last write of a key counts: a run noted
    # started and then closed in one batch is written once.
    if batch.records:
        records = _last_of(batch.records, lambda r: r[0])
        _UPSERT_RECORD.run(cur, [(i, v, _dumps(r), now) for i, v, r in records])
    _each_in(cur, "DELETE FROM trigger_records WHERE id IN ({})", batch.forget_records)
    if batch.entries:
        entries = _last_of(batch.entries, lambda e: e.trigger_id)
        _UPSERT_ENTRY.run(cur, [_entry_values(e) for e in entries])
    _each_in(cur, "DELETE FROM entries WHERE trigger_id IN ({})", batch.evict)
    if batch.tombstones:
        _INSERT_TOMBSTONE.run(cur, [(i, now) for i in batch.tombstones])
    if batch.runs:
        runs = _last_of(batch.runs, lambda r: r.run_id)
        _UPSERT_RUN.run(cur, [_run_values(r) for r in runs])
    _each_in(cur, "DELETE FROM runs WHERE run_id IN ({})", batch.drop_runs)
    if batch.outbox:
        _INSERT_OUTBOX.run(
            cur,
            [(d, i, _dumps(f), _dumps(list(u)), now, v) for i, f, u, v, d, _, _ in batch.outbox],
        )
    if batch.meta:
        _UPSERT_META.run(cur, list(batch.meta.items()))


def _each_in(
    cur: sqlite3.Cursor, sql: str, ids: Sequence[Any], values: tuple[Any, ...] = ()
) -> None:
    """Run `sql` for up to 500 of `ids` at a time, its `{}` the marks of their `IN (…)` list,
    bound after `values` (the statement's marks before that list)."""
    for chunk in _chunks(ids, 500):
        cur.execute(sql.format(", ".join("?" * len(chunk))), (*values, *chunk))


_NEWEST_START = (
    "SELECT started_at FROM runs WHERE trigger_id = ? AND state = ? "
    "ORDER BY started_at DESC LIMIT 1 OFFSET ?"
)
_TRIM_RUNS = (
    "DELETE FROM runs WHERE rowid IN (SELECT rowid FROM runs WHERE trigger_id = ? "
    "AND started_at < ? AND state = ? LIMIT ?)"
)


def _trim_runs(cur: sqlite3.Cursor, due: Iterable[str], kept: int) -> list[str]:
    """Delete the finished runs of the `due` triggers older than each one's newest `kept`, at
    most `TRIM_ROWS` rows in all; return the triggers brought down to the bound."""
    done: list[str] = []
    budget = TRIM_ROWS
    for tid in sorted(due):
        if budget <= 0:
            break
        # Both statements walk the index on (trigger_id, started_at): the newest `kept`
        # ended runs of this trigger (a run prepared or in flight is not one of them), then
        # the ended rows older than the last of them.
        newest = cur.execute(_NEWEST_START, (tid, RunState.ENDED, kept - 1)).fetchone()
        deleted = 0
        if newest is not None:
            cur.execute(_TRIM_RUNS, (tid, newest[0], RunState.ENDED, budget))
            deleted = max(0, cur.rowcount)
        if deleted < budget:
            done.append(tid)
        budget -= deleted
    return done


_FAILED = "UPDATE outbox SET attempts = attempts + 1, last_error = ? WHERE seq IN ({})"
_SET_ASIDE = (
    "UPDATE outbox SET attempts = attempts + 1, last_error = ?, set_aside_at = ? WHERE seq IN ({})"
)


def _last_of(items: Sequence[T], key: Callable[[T], Any]) -> Iterable[T]:
    """Return the last of the items of each key."""
    return {key(item): item for item in items}.values()


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# The columns of `entries` and `runs` are named as the fields of EntryRow and RunRow, so a
# row maps onto its dataclass field by field; only a run's `result` is stored as JSON.
_ENTRY_COLS = tuple(c.name for c in entries_table.c)
_RUN_COLS = tuple(c.name for c in runs_table.c)


_ENTRY_FIELDS = tuple(f.name for f in fields(EntryRow))
_HAS_VERSIONS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
_VERSIONS = "SELECT version_num FROM alembic_version"
_SELECT_ENTRIES = f"SELECT {', '.join(_ENTRY_FIELDS)} FROM entries"
_RECORD_TEXTS = "SELECT id, version, record FROM trigger_records WHERE id > ? ORDER BY id LIMIT ?"
_BOOL_AT = tuple(i for i, f in enumerate(fields(EntryRow)) if f.type in (bool, "bool"))


def _entry_row(r: Sequence[Any]) -> EntryRow:
    """Return the entry of a `_SELECT_ENTRIES` row (SQLite gives its booleans as 0 and 1)."""
    values = list(r)
    for i in _BOOL_AT:
        values[i] = bool(values[i])
    return EntryRow(*values)


def _entry_values(e: EntryRow) -> tuple[Any, ...]:
    """Return an entry's values in the order of the `entries` table's columns."""
    return tuple(getattr(e, name) for name in _ENTRY_COLS)


def _notice(r: Any) -> NoticeRow:
    return NoticeRow(
        key=r.key,
        kind=r.kind,
        trigger_id=r.trigger_id,
        created_at=r.created_at,
        notice=json.loads(r.notice),
        pending=tuple(r.pending.split()),
        attempts=r.attempts,
        next_try_at=r.next_try_at,
        last_error=r.last_error,
    )


def _run(r: Any) -> RunRow:
    return RunRow(**{**r._mapping, "result": json.loads(r.result)})


def _run_values(r: RunRow) -> tuple[Any, ...]:
    """Return a run's values in the order of the `runs` table's columns."""
    return tuple(
        _dumps(dict(r.result)) if name == "result" else getattr(r, name) for name in _RUN_COLS
    )


def _on_connect(dbapi_conn: sqlite3.Connection, record: ConnectionPoolEntry) -> None:
    # Let SQLAlchemy's "begin" event issue BEGIN IMMEDIATE instead of pysqlite's deferred BEGIN,
    # so a writer takes the lock up front and never fails half-way on SQLITE_BUSY.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.execute("PRAGMA foreign_keys=ON")
    # A multi-row statement (`Rows`) after another write in a transaction keeps a statement
    # journal, to undo itself alone should it fail; past 64 KiB SQLite moves that journal
    # into a temporary file, opened, unlinked and closed again by the statement: 757 files
    # a minute at 10,000 runs a minute, the part of the mirror thread's system time that
    # single-row statements did not have (docs/benchmarks.md, "Where issue 22's spread CPU
    # went"). In memory, a journal holds at most the pages one statement of `SQL_PARAMS`
    # values changes.
    cur.execute("PRAGMA temp_store=MEMORY")
    cur.close()


def _holds_state(conn: Connection) -> bool:
    """Return whether the mirror holds anything beyond its schema and its own id."""
    for table in (records_table, entries_table, runs_table, outbox_table, tombstones_table):
        if conn.execute(select(1).select_from(table).limit(1)).first() is not None:
            return True
    other_meta = select(1).select_from(meta_table).where(meta_table.c.key != MIRROR_ID).limit(1)
    return conn.execute(other_meta).first() is not None


# SQLite's primary result codes (the low byte of an extended code) that mean the mirror
# cannot be used as it is: a restart would meet them again.
SQLITE_PERM, SQLITE_READONLY, SQLITE_CORRUPT, SQLITE_CANTOPEN, SQLITE_NOTADB = 3, 8, 11, 14, 26
SQLITE_READONLY_DBMOVED = 1032


def sqlite_fault(path: Path, exc: BaseException, *, opening: bool) -> MirrorFault | None:
    """Return the `MirrorFault` a SQLite error on the mirror at `path` means, if any.

    A file that cannot be opened is a fault only while `opening`: once the mirror is open,
    the same code can come from a passing shortage (no descriptor left), which a retry mends.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int):
        return None
    if code == SQLITE_READONLY_DBMOVED:
        return MirrorLost(
            f"the mirror {path} was moved or deleted while anyrtd ran ({exc}): restore it, or "
            f"run {REBUILD} to start afresh (this loses {AT_RISK})"
        )
    primary = code & 0xFF
    if primary in (SQLITE_CORRUPT, SQLITE_NOTADB):
        return MirrorCorrupt(
            f"the mirror {path} is damaged ({exc}): restore it from a backup, or run "
            f"{REBUILD} to move it aside and start afresh (this loses {AT_RISK})"
        )
    if primary == SQLITE_READONLY:
        return MirrorUnusable(
            f"the mirror {path} cannot be written ({exc}): give the user anyrtd runs as "
            f"write access to it, to its -wal and -shm files and to {path.parent}"
        )
    if primary in (SQLITE_CANTOPEN, SQLITE_PERM) and opening:
        return MirrorUnusable(
            f"the mirror {path} cannot be opened ({exc}): it must be a file the user anyrtd "
            f"runs as may read and write, in a directory it may write ({path.parent})"
        )
    return None


def rebuild_if_lost(path: Path) -> str | None:
    """Move aside a mirror that is lost, damaged or not anyrtd's; keep a good one.

    For `anyrtd serve --rebuild-mirror`: return what was done, or None when the mirror
    was fine. Other faults (an old or newer schema, permissions) are raised: starting
    afresh would not mend them.
    """
    mirror = Mirror(path)
    try:
        mirror.ensure_schema(create=False)
        return None
    except MirrorLost:
        reason = "--rebuild-mirror: it was missing, empty or another mirror"
    except MirrorCorrupt:
        reason = "--rebuild-mirror: it was damaged"
    except SchemaUnversioned:
        reason = "--rebuild-mirror: it had tables but no schema revision"
    except SchemaNotAtHead:
        if not mirror.is_empty():
            raise
        return None  # a new state directory: the daemon makes its first mirror
    finally:
        mirror.close()
    return rebuild(path, reason)


class AsyncMirror:
    """The mirror behind one worker thread: one writer, and never a blocking call on the loop."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anyrtd-db")
        self.fault: MirrorFault | None = None
        self.faulted = asyncio.Event()
        self._depth, self._depth_at = 0, -1  # the outbox depth, at `Mirror.outbox_changes`
        self._aside: list[SetAside] = []
        self._aside_at = -1  # the writes set aside, at `Mirror.outbox_changes`
        self.slow_s = 0.0
        """How long a call may take now, its wait for the thread included: the slowest
        recent one, falling back a fifth of the way at each faster one (`Unit.wait_s`). Bulk
        work waits for a start due sooner than twice that (`Daemon.clear_of_commit`), and a
        batch is prepared that much earlier (`Lead.of`): a fire's commit queued behind a
        call would make the start late (1.5 ms on an idle disk; 40-150 ms under the records
        fault family's barrage)."""

    async def call(self, fn: Callable[[Mirror], T]) -> T:
        """Run `fn(mirror)` on the mirror's thread and return its result.

        The file's identity is checked first (one stat). A `MirrorFault` is kept in `fault`
        and sets `faulted`, for `anyrtd serve` to stop on: the mirror cannot be used.
        """
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        try:
            return await loop.run_in_executor(self._pool, _checked, fn, self.mirror)
        except MirrorFault as exc:
            if self.fault is None:
                self.fault = exc
                self.faulted.set()
            raise
        finally:
            took = time.perf_counter() - began
            self.slow_s = rise_at_once(self.slow_s, took)

    async def outbox_depth(self) -> int:
        """Return `Mirror.outbox_depth`, counted again only once the outbox changed
        (`Mirror.outbox_changes`): an idle daemon does not query it every few seconds."""
        changes = self.mirror.outbox_changes  # before the count: a change during it counts
        if changes != self._depth_at:
            self._depth = await self.call(Mirror.outbox_depth)
            self._depth_at = changes
        return self._depth

    async def outbox_set_aside(self) -> list[SetAside]:
        """Return `Mirror.outbox_set_aside`, read again only once the outbox changed: the
        notices' pass asks every tick."""
        changes = self.mirror.outbox_changes  # before the read: a change during it counts
        if changes != self._aside_at:
            self._aside = await self.call(Mirror.outbox_set_aside)
            self._aside_at = changes
        return self._aside

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self.mirror.close)
        self._pool.shutdown(wait=True)


def _checked(fn: Callable[[Mirror], T], mirror: Mirror) -> T:
    mirror.check_file()
    return fn(mirror)
