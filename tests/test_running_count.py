"""A run in flight is counted by trigger id, whatever rebuilds the trigger's entry meanwhile
(issue 23, item 1): an edit, a repin away and back, an enable flip, a restore from the mirror,
the standing built-ins taken over again."""

from __future__ import annotations

from typing import Any

from anyrtd import standing
from anyrtd.apply import Apply
from anyrtd.metrics import Stats
from anyrtd.records import RecordCache
from anyrtd.registry import Entry, Registry
from anyrtd.unit import Unit
from anyrtd.vocab import Verdict

T0 = 1_800_000_000.0
PEER = "peer-a"
OTHER = "peer-b"


def record(**fields: Any) -> dict[str, Any]:
    return {
        "id": "t",
        "_v": 1,
        "name": "t",
        "kind": "cron",
        "spec": {"every_s": 60},
        "program": "x:y@v1",
        "owner": PEER,
        "enabled": True,
        **fields,
    }


class Stage:
    def __init__(self) -> None:
        self.records = RecordCache()
        self.registry = Registry()
        self.unit = Unit(self.records, on_outbox=lambda: None)
        self.apply = Apply(
            registry=self.registry,
            records=self.records,
            unit=self.unit,
            stats=Stats(),
            confirm_after=0.0,
        )
        self.version = 0

    def write(self, now: float, **fields: Any) -> Entry | None:
        """Put a new version of the record and reconcile it; return the entry after."""
        self.version += 1
        self.records.put(record(_v=self.version, **fields))
        self.apply.reconcile(["t"], now, Verdict.ACTIVE, PEER)
        return self.registry.get("t")


def test_an_edit_while_a_run_is_in_flight_counts_it_on_the_rebuilt_entry() -> None:
    stage = Stage()
    old = stage.write(T0)
    assert old is not None
    stage.registry.began("t")
    new = stage.write(T0 + 1, name="edited")
    assert new is not None and new is not old
    assert new.running == 1
    stage.registry.ended("t")  # the run's end, whichever entry it started from
    assert new.running == 0 and old.running == 0
    assert stage.registry.running == {}


def test_a_repin_away_and_back_while_a_run_is_in_flight_keeps_its_count() -> None:
    stage = Stage()
    assert stage.write(T0) is not None
    stage.registry.began("t")
    assert stage.write(T0 + 1, owner=OTHER) is None  # evicted: pinned elsewhere
    back = stage.write(T0 + 2, owner=PEER)
    assert back is not None and back.running == 1
    stage.registry.ended("t")
    assert back.running == 0


def test_an_enable_flip_while_a_run_is_in_flight_keeps_its_count() -> None:
    stage = Stage()
    assert stage.write(T0) is not None
    stage.registry.began("t")
    off = stage.write(T0 + 1, enabled=False)
    on = stage.write(T0 + 2, enabled=True)
    assert off is not None and on is not None and on.running == 1
    stage.registry.ended("t")
    assert on.running == 0


def test_a_restore_counts_the_runs_in_flight_under_its_id() -> None:
    stage = Stage()
    entry = stage.write(T0)
    assert entry is not None
    row = entry.row
    stage.registry.began("t")
    stage.registry.remove("t")
    stage.apply.restore([row], T0 + 1)
    restored = stage.registry.get("t")
    assert restored is not None and restored is not entry
    assert restored.running == 1
    stage.registry.ended("t")
    assert restored.running == 0


def test_standing_built_ins_taken_over_again_count_their_runs_in_flight() -> None:
    registry = Registry()
    first = standing.entries(PEER, lambda _rid: None, lambda _p: True, T0)
    registry.put_all(first)
    registry.began("rollup")
    for entry in standing.entries(PEER, lambda _rid: None, lambda _p: True, T0 + 1):
        registry.put(entry)
    again = registry.get("rollup")
    assert again is not None and again.running == 1
    registry.ended("rollup")
    assert again.running == 0 and registry.running == {}


def test_an_entry_no_registry_holds_runs_nothing() -> None:
    entry = standing.entries(PEER, lambda _rid: None, lambda _p: True, T0)[0]
    assert entry.running == 0
