"""A burst of feed changes is applied in slices of `TICK_CHANGES`, in the order read, so a
tick never holds the event loop (and the timer) for the whole burst; a full read is
applied whole."""

from __future__ import annotations

from anyrtd.client import Change, ServerClient
from anyrtd.metrics import Stats
from anyrtd.model import TriggerDef
from anyrtd.records import RecordCache
from anyrtd.sync import Sync
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


def test_a_full_read_is_applied_whole_with_the_changes_before_it() -> None:
    sync, _ = stage()
    sync.buffer(change(1, "early"))
    sync._buffer.append([fields(id=f"r{n}") for n in range(300)])  # as `full_read` buffers
    sync.buffer(change(2, "late"))
    touched = sync.apply_buffered(1)
    assert "early" in touched and len([t for t in touched if t.startswith("r")]) == 300
    assert sync.pending  # the change after the full read waits for the next slice
    assert sync.apply_buffered(1) == {"late"}
