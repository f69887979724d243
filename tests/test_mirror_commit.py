"""A commit writes its rows a statement of many rows at a time (`anyrtd.mirror.Rows`).

Row by row, each row is a step that lets go of the GIL and takes it again, and each take
waits up to 5 ms while the event loop's thread is busy: a tick's commit of 571 rows took
364 ms for 28 ms of CPU. These tests hold that a commit's statements do not grow with its
rows, and that what the rows say is written, in order, across the statements' bounds.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest
from support import Traced

from anyrtd.mirror import SQL_PARAMS, Mirror, Rows
from anyrtd.rows import Batch, EntryRow, RunRow

ENTRY_COLUMNS = len(fields(EntryRow))
RUN_COLUMNS = len(fields(RunRow))


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    opened = Mirror(tmp_path / "anyrtd.sqlite3")
    opened.ensure_schema(create=True)
    try:
        yield opened
    finally:
        opened.close()


def entry(n: int, fire: float) -> EntryRow:
    return EntryRow(f"t{n:05d}", f"fp{n}", "cron", True, 0.0, fire, run_count=n)


def run(n: int) -> RunRow:
    return RunRow(f"r{n:05d}", f"t{n:05d}", "agent:remind@v1", "12D3KooWself", None, float(n))


def test_a_commit_of_thousands_of_rows_runs_a_few_statements(mirror: Mirror) -> None:
    per_entry = SQL_PARAMS // ENTRY_COLUMNS
    per_run = SQL_PARAMS // RUN_COLUMNS
    entries = [entry(n, 100.0 + n) for n in range(3 * per_entry + 7)]
    runs = [run(n) for n in range(2 * per_run + 1)]
    batch = Batch(entries=entries, runs=runs, meta={"cursor": "7", "peer_id": "p"})
    batch.records = [(f"t{n:05d}", n, {"id": f"t{n:05d}", "name": "x" * n}) for n in range(300)]
    batch.tombstones = ["gone-1", "gone-2", "gone-1"]  # one twice: taken once
    for n in range(1000):
        batch.write("triggers", f"t{n:05d}", {"owner": "p", "n": n})
    seen = Traced(mirror.engine)

    mirror.commit(batch, now=5.0)

    per_record, per_write = SQL_PARAMS // 4, SQL_PARAMS // 6
    tables = [s.split(" (", 1)[0].removeprefix("INSERT INTO ") for s in seen.inserts()]
    assert sorted(tables) == sorted(
        ["trigger_records"] * math.ceil(300 / per_record)
        + ["entries"] * 4
        + ["tombstones"]
        + ["runs"] * 3
        + ["outbox"] * math.ceil(1000 / per_write)
        + ["meta"]
    )
    with sqlite3.connect(mirror.path) as db:
        got = db.execute("SELECT trigger_id, next_fire, run_count FROM entries ORDER BY 1")
        assert got.fetchall() == [(e.trigger_id, e.next_fire, e.run_count) for e in entries]
        assert db.execute("SELECT count(*) FROM runs").fetchone() == (len(runs),)
        assert db.execute("SELECT id FROM tombstones ORDER BY 1").fetchall() == [
            ("gone-1",),
            ("gone-2",),
        ]
        assert db.execute("SELECT record FROM trigger_records WHERE id = 't00299'").fetchone()
    sent = mirror.outbox_pending(limit=2000)
    assert [w.fields["n"] for w in sent] == list(range(1000))  # in the order they were queued
    assert mirror.snapshot().meta.items() >= {"cursor": "7", "peer_id": "p"}.items()


def test_rows_written_again_across_statements_replace_the_rows_they_name(
    mirror: Mirror,
) -> None:
    per_entry = SQL_PARAMS // ENTRY_COLUMNS
    count = per_entry + 1  # two statements: the last row alone in the second
    mirror.commit(Batch(entries=[entry(n, 1.0) for n in range(count)]), now=1.0)
    later = [entry(n, 2.0 + n) for n in range(count)]
    mirror.commit(Batch(entries=later, meta={"cursor": "8"}), now=2.0)

    assert mirror.snapshot().entries == later


@pytest.mark.parametrize("rows", [1, 2, 249, 250, 251, 999])
def test_a_statement_binds_at_most_sql_params(rows: int) -> None:
    four = Rows("INSERT INTO t (a, b, c, d)", "(?, ?, ?, ?)")
    per = four.per_statement
    assert per == 249
    counts = [min(per, rows - at) for at in range(0, rows, per)]
    for n in counts:
        assert four.sql(n).count("?") == 4 * n <= SQL_PARAMS
    assert sum(counts) == rows


def test_a_statements_journal_stays_in_memory(mirror: Mirror) -> None:
    # A multi-row statement after another write of its transaction keeps a statement
    # journal; on a temporary file, that was a file opened, unlinked and closed for each
    # statement past 64 KiB of it (docs/history/benchmarks-2026.md).
    with mirror.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA temp_store").scalar() == 2  # MEMORY
