"""A burst of feed changes, or a full read of many changed records, is applied in slices of
`TICK_CHANGES`, in the order read, so a tick never holds the event loop (and the timer) for
the whole burst; as a safety net a full read comes less often for a large record set."""

from __future__ import annotations

from anyrtd.client import Change, ChangePage, ServerClient
from anyrtd.clock import Slice
from anyrtd.metrics import Stats
from anyrtd.model import TriggerDef
from anyrtd.records import RecordCache
from anyrtd.sync import (
    FIRST_FULL_AFTER_S,
    RESYNC_S_PER_RECORD,
    TICK_CHANGES,
    TICK_SCAN,
    Sync,
    _FullRead,
)
from anyrtd.unit import Unit


def fields(**more: object) -> dict[str, object]:
    return {"kind": "cron", "spec": {"every_s": 60}, "program": "x:y@v1", **more}


def change(seq: int, rid: str, **more: object) -> Change:
    return Change(seq, "obj", "agent_triggers", rid, "upsert", fields(**more))


def stage() -> tuple[Sync, RecordCache]:
    records = RecordCache()
    unit = Unit(records, on_outbox=lambda: None)
    return Sync(ServerClient("http://127.0.0.1:9"), "space", records, unit, Stats()), records


def test_a_burst_of_changes_is_applied_a_slice_per_tick_in_the_order_read() -> None:
    sync, records = stage()
    for n in range(250):
        sync.buffer(change(n, f"t{n:03d}"))
    sync.buffer(change(250, "t000", name="renamed"))  # a later change of the first record
    assert sync.apply_buffered(100) == {f"t{n:03d}" for n in range(100)}
    assert sync.pending and len(records) == 100
    assert sync.apply_buffered(100) == {f"t{n:03d}" for n in range(100, 200)}
    assert sync.apply_buffered(100) == {f"t{n:03d}" for n in range(200, 250)} | {"t000"}
    assert not sync.pending and len(records) == 250
    defn = records.parsed["t000"]
    assert isinstance(defn, TriggerDef) and defn.name == "renamed"


def full_read(sync: Sync, records: list[dict[str, object]]) -> None:
    sync._buffer.append(_FullRead.of(records))  # as `full_read` buffers


def test_a_full_read_is_applied_a_slice_per_tick_after_the_changes_before_it() -> None:
    sync, records = stage()
    records.put({"id": "gone", "_v": 1, **fields()})
    sync.buffer(change(1, "early"))
    full_read(sync, [{"id": f"r{n:03d}", "_v": 1, **fields()} for n in range(250)])
    sync.buffer(change(2, "late"))
    assert sync.apply_buffered(100) == {"early"} | {f"r{n:03d}" for n in range(99)}
    assert sync.apply_buffered(100) == {f"r{n:03d}" for n in range(99, 199)}
    assert "gone" in records  # evicted only once the read is applied to its end
    last = {f"r{n:03d}" for n in range(199, 250)} | {"gone", "early", "late"}
    assert sync.apply_buffered(100) == last  # what the read did not show is evicted
    assert "gone" not in records and "early" not in records
    assert not sync.pending and len(records) == 251


def test_unchanged_records_of_a_full_read_cost_a_slice_only_every_tick_scan_records() -> None:
    sync, records = stage()
    read = [{"id": f"r{n:05d}", "_v": 1, **fields()} for n in range(TICK_SCAN + 10)]
    for record in read:
        records.put(record)
    full_read(sync, [*read, {"id": "new", "_v": 1, **fields()}])
    assert sync.apply_buffered(TICK_CHANGES) == set() and sync.pending
    assert sync.apply_buffered(TICK_CHANGES) == {"new"} and not sync.pending


def test_a_newer_full_read_supersedes_one_not_applied_to_its_end() -> None:
    sync, records = stage()
    records.put({"id": "old", "_v": 1, **fields()})
    full_read(sync, [{"id": f"r{n:03d}", "_v": 1, **fields()} for n in range(150)])
    sync.apply_buffered(100)
    sync._buffer = [i for i in sync._buffer if not isinstance(i, _FullRead)]  # as `full_read`
    full_read(sync, [{"id": "r000", "_v": 2, **fields(name="again")}])
    assert sync.apply_buffered(None) == {"old"} | {f"r{n:03d}" for n in range(100)}
    assert set(records.ids()) == {"r000"} and not sync.pending


def following(cursor: int) -> tuple[Sync, Unit]:
    """A sync stage restored from a mirror that followed the feed up to `cursor`."""
    records = RecordCache()
    unit = Unit(records, on_outbox=lambda: None)
    sync = Sync(ServerClient("http://127.0.0.1:9"), "space", records, unit, Stats())
    meta = {
        "space": "space",
        "type_id": "type",
        "triggers_object": "obj",
        "runs_object": "runs",
        "cursor": str(cursor),
    }
    sync.restore(meta, ())
    return sync, unit


def test_a_mirror_that_follows_the_feed_reads_every_record_only_after_the_start() -> None:
    sync, _ = following(10)
    assert sync.following
    assert not sync.full_read_due(1000.0, 300.0)  # the feed from the cursor first
    assert not sync.full_read_due(1000.0 + FIRST_FULL_AFTER_S - 1, 300.0)
    assert sync.full_read_due(1000.0 + FIRST_FULL_AFTER_S, 300.0)
    fresh, _ = stage()  # no cursor: every record at once
    assert fresh.full_read_due(1000.0, 300.0)
    lost, _ = following(10)
    lost.feed_available = False  # no feed: every step reads every record
    assert lost.full_read_due(1000.0, 300.0)


def test_the_mirror_keeps_the_cursor_only_once_what_it_covers_is_applied() -> None:
    sync, unit = following(10)
    sync.take(ChangePage([change(n, f"t{n:03d}") for n in range(11, 161)], 170), 0.0)
    assert sync.cursor == 170
    assert "cursor" not in unit.batch.meta  # a commit now must not skip the changes
    sync.apply_buffered(100)
    assert "cursor" not in unit.batch.meta
    sync.apply_buffered(100)
    assert unit.batch.meta["cursor"] == "170" and not sync.pending
    sync.take(ChangePage([], 180), 0.0)  # a page with no trigger change still moves it
    sync.take(ChangePage([], 190), 0.0)
    sync.apply_buffered(100)
    assert unit.batch.meta["cursor"] == "190"


def test_a_feed_behind_the_mirrors_cursor_is_followed_from_its_head_after_a_full_read() -> None:
    sync, unit = following(500)
    assert not sync.full_read_due(1000.0, 300.0)
    sync.take(ChangePage([change(3, "t")], 4), 1000.0)  # another server, or a restored one
    assert sync.cursor == 4
    assert sync.full_read_due(1000.0, 300.0)
    sync.apply_buffered()
    assert unit.batch.meta["cursor"] == "4"


def test_the_safety_net_full_read_comes_less_often_for_a_large_record_set() -> None:
    sync, records = stage()
    sync._last_full = 1000.0
    assert sync.resync_every(300.0) == 300.0  # no records: the configured period
    for n in range(10_000):
        records.put({"id": f"t{n:05d}", "_v": 1, **fields()})
    assert sync.resync_every(300.0) == 10_000 * RESYNC_S_PER_RECORD == 600.0
    assert sync.resync_every(900.0) == 900.0  # a longer configured period stands
    assert not sync.full_read_due(1000.0 + 599.0, 300.0)
    assert sync.full_read_due(1000.0 + 600.0, 300.0)
    sync.feed_available = False  # without a change feed: every step, whatever the count
    assert sync.full_read_due(1000.0 + 1.0, 300.0)


def test_the_first_full_read_after_a_resumed_start_does_not_wait_for_a_large_sets_period() -> None:
    sync, _ = following(10)
    for n in range(10_000):  # a safety net every 600 s
        sync.records.put({"id": f"t{n:05d}", "_v": 1, **fields()})
    assert not sync.full_read_due(1000.0, 300.0)
    assert not sync.full_read_due(1000.0 + FIRST_FULL_AFTER_S - 1, 300.0)
    assert sync.full_read_due(1000.0 + FIRST_FULL_AFTER_S, 300.0)


class Ticks:
    """A `Slice` timer that moves one unit per look: a slice of `n` units is over at the
    `n`th look, however fast the work runs."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_changes_stop_where_the_slice_of_the_loops_time_ends_and_follow_next_tick() -> None:
    # A change of a record of megabytes costs milliseconds: a count alone lets 100 of them
    # hold the loop for a tenth of a second.
    sync, records = stage()
    for n in range(10):
        sync.buffer(change(n, f"t{n}"))
    assert sync.apply_buffered(100, Slice(3.0, Ticks())) == {"t0", "t1", "t2"}
    assert sync.pending
    assert sync.apply_buffered(100, Slice(0.0)) == {"t3"}  # over at once: one change still
    assert sync.apply_buffered(100) == {f"t{n}" for n in range(4, 10)}
    assert not sync.pending and len(records) == 10


def test_a_full_read_stops_where_the_slice_ends_and_goes_on_from_there() -> None:
    sync, records = stage()
    full_read(sync, [{"id": f"r{n}", "_v": 1, **fields()} for n in range(5)])
    first = sync.apply_buffered(100, Slice(3.0, Ticks()))
    assert len(first) == 3 and sync.pending  # the first record, then one a look till it ends
    rest = sync.apply_buffered(100)
    assert first | rest == {f"r{n}" for n in range(5)} and not first & rest
    assert not sync.pending and len(records) == 5
