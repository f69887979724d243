"""The mirror's guard, one piece at a time: the marker, the file's identity, the faults."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from anyrtd.mirror import (
    AsyncMirror,
    Mirror,
    SchemaNotAtHead,
    SchemaUnversioned,
    rebuild_if_lost,
    sqlite_fault,
)
from anyrtd.mirror_guard import (
    EXIT_BROKEN_STATE,
    MARKER_FILE,
    MirrorCorrupt,
    MirrorLost,
    MirrorUnusable,
    read_marker,
    rebuild,
)
from anyrtd.rows import Batch


def opened(path: Path) -> Mirror:
    """Return the mirror at `path` opened as the daemon opens it."""
    mirror = Mirror(path)
    mirror.ensure_schema(create=True)
    return mirror


def with_state(path: Path) -> str:
    """Make a mirror at `path` that holds state (a committed batch); return its id."""
    mirror = opened(path)
    try:
        mirror.commit(Batch(meta={"peer_id": "12D3KooWself"}), now=1.0)
        assert mirror.mirror_id is not None
        return mirror.mirror_id
    finally:
        mirror.close()


def test_a_new_mirror_is_marked_once_it_holds_state(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    mirror = opened(path)
    try:
        assert not (tmp_path / MARKER_FILE).exists()  # nothing held yet: nothing to lose
        mirror.commit(Batch(meta={"peer_id": "12D3KooWself"}), now=1.0)
        assert read_marker(path) == mirror.mirror_id
    finally:
        mirror.close()


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda p: [f.unlink() for f in p.parent.glob("anyrtd.sqlite3*")], "is missing"),
        (lambda p: [f.write_bytes(b"") for f in p.parent.glob("anyrtd.sqlite3*")], "is empty"),
    ],
    ids=["deleted", "emptied"],
)
def test_a_marked_state_directory_refuses_a_missing_or_empty_mirror(
    tmp_path: Path, damage: object, said: str
) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    with_state(path)
    damage(path)  # type: ignore[operator]
    before = sorted(os.listdir(tmp_path))
    mirror = Mirror(path)
    with pytest.raises(MirrorLost, match=said) as refused:
        mirror.ensure_schema(create=True)
    mirror.close()
    assert refused.value.exit_status == EXIT_BROKEN_STATE
    assert "`anyrtd db rebuild`" in str(refused.value)
    assert "a `once` may fire twice" in str(refused.value)
    assert sorted(os.listdir(tmp_path)) == before  # nothing was made


def test_another_mirror_put_in_its_place_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a" / "anyrtd.sqlite3"
    other = tmp_path / "b" / "anyrtd.sqlite3"
    with_state(path)
    with_state(other)
    for f in path.parent.glob("anyrtd.sqlite3*"):
        f.unlink()
    for f in other.parent.glob("anyrtd.sqlite3*"):
        shutil.copy(f, path.parent / f.name)
    mirror = Mirror(path)
    with pytest.raises(MirrorLost, match="is another mirror"):
        mirror.ensure_schema(create=True)
    mirror.close()


def test_a_mirror_from_before_the_marker_is_adopted(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    mirror_id = with_state(path)
    (tmp_path / MARKER_FILE).unlink()  # as an anyrtd without the marker left it
    mirror = opened(path)
    mirror.close()
    assert read_marker(path) == mirror_id


def test_a_backup_from_before_the_marker_is_taken_as_the_marked_mirror(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    mirror_id = with_state(path)
    mirror = Mirror(path)
    with mirror.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM meta WHERE key = 'mirror_id'")  # an older anyrtd's
    mirror.ensure_schema(create=True)
    mirror.close()
    assert mirror.mirror_id == mirror_id == read_marker(path)


def test_a_deleted_or_replaced_file_is_noticed_before_the_next_write(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    with_state(path)
    mirror = opened(path)
    try:
        path.unlink()
        with pytest.raises(MirrorLost, match="was deleted while anyrtd ran"):
            mirror.commit(Batch(meta={"cursor": "1"}), now=2.0)
        path.write_bytes(b"")
        with pytest.raises(MirrorLost, match="was replaced by another file"):
            mirror.commit(Batch(meta={"cursor": "1"}), now=2.0)
    finally:
        mirror.close()


async def test_the_async_mirror_keeps_the_first_fault_for_serve_to_stop_on(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    with_state(path)
    db = AsyncMirror(opened(path))
    try:
        assert await db.call(Mirror.outbox_depth) == 0
        assert not db.faulted.is_set()
        path.unlink()
        with pytest.raises(MirrorLost):
            await db.call(Mirror.outbox_depth)  # a read is checked too: one stat
        async with asyncio.timeout(1):
            await db.faulted.wait()
        assert isinstance(db.fault, MirrorLost)
    finally:
        await db.close()


def test_a_corrupt_mirror_is_one_fault_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    path.write_bytes(b"not a database " * 512)
    mirror = Mirror(path)
    with pytest.raises(MirrorCorrupt) as refused:
        mirror.ensure_schema(create=True)
    mirror.close()
    assert str(refused.value).startswith(f"the mirror {path} is damaged (file is not a database)")
    assert refused.value.exit_status == EXIT_BROKEN_STATE


def test_a_mirror_that_is_not_a_file_cannot_be_opened(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    path.mkdir()
    mirror = Mirror(path)
    with pytest.raises(MirrorUnusable, match="cannot be opened"):
        mirror.ensure_schema(create=True)
    mirror.close()


def sqlite_error(cls: type[sqlite3.Error], message: str, code: int) -> sqlite3.Error:
    """Return a SQLite error as the driver raises it, with its result code."""
    error = cls(message)
    error.sqlite_errorcode = code
    return error


def test_a_file_that_cannot_be_opened_is_a_fault_only_while_opening(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    cantopen = sqlite_error(sqlite3.OperationalError, "unable to open database file", 14)
    assert isinstance(sqlite_fault(path, cantopen, opening=True), MirrorUnusable)
    # Once open, it may be a passing shortage of descriptors: a retry, not a stop for good.
    assert sqlite_fault(path, cantopen, opening=False) is None
    corrupt = sqlite_error(sqlite3.DatabaseError, "database disk image is malformed", 11)
    assert isinstance(sqlite_fault(path, corrupt, opening=False), MirrorCorrupt)
    readonly = sqlite_error(sqlite3.OperationalError, "attempt to write a readonly database", 8)
    assert isinstance(sqlite_fault(path, readonly, opening=False), MirrorUnusable)
    moved = sqlite_error(sqlite3.OperationalError, "attempt to write a readonly database", 1032)
    assert isinstance(sqlite_fault(path, moved, opening=False), MirrorLost)
    busy = sqlite_error(sqlite3.OperationalError, "database is locked", 5)
    assert sqlite_fault(path, busy, opening=False) is None


def test_an_unversioned_mirror_is_told_to_rebuild(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    with_state(path)
    mirror = Mirror(path)
    with mirror.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE alembic_version")
    with pytest.raises(SchemaUnversioned, match=r"no schema revision.*`anyrtd db rebuild`"):
        mirror.ensure_schema(create=True)
    mirror.close()


def test_a_newer_mirror_is_told_to_upgrade_anyrtd(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    with_state(path)
    mirror = Mirror(path)
    with mirror.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    unknown = "revision 9999, which this anyrtd does not know"
    with pytest.raises(SchemaNotAtHead, match=unknown) as e:
        mirror.ensure_schema(create=True)
    mirror.close()
    assert "upgrade anyrtd" in str(e.value)
    assert "run `anyrtd db upgrade`" not in str(e.value)


def test_rebuild_moves_every_file_aside_and_forgets_the_marker(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    with_state(path)
    (tmp_path / "anyrtd.sqlite3-wal").write_bytes(b"stale")  # a WAL a new file must not take
    done = rebuild(path, "a test")
    assert "the old files are kept as" in done
    assert not (tmp_path / MARKER_FILE).exists()
    sqlite_files = [f.name for f in tmp_path.glob("anyrtd.sqlite3*")]
    assert sqlite_files and all(".old-" in name for name in sqlite_files)
    assert any(name.endswith("-wal") for name in sqlite_files)
    opened(path).close()  # a new one starts afresh


def test_rebuild_if_lost_keeps_a_good_mirror_and_rebuilds_a_lost_one(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    assert rebuild_if_lost(path) is None  # a new state directory: nothing to rebuild
    mirror_id = with_state(path)
    assert rebuild_if_lost(path) is None
    assert read_marker(path) == mirror_id
    path.unlink()
    done = rebuild_if_lost(path)
    assert done is not None and "(--rebuild-mirror: it was missing, empty or another" in done
    assert read_marker(path) is None
    opened(path).close()
