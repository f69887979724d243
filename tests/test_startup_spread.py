"""Start-up from the mirror: records parsed when first read, the reconcile of every id spread.

A start restores the registry from the mirror's entry rows and parses each record when it is
first needed; the reconcile of every id that a start (or a new verdict) runs is spread over
the ticks after it, and an entry that comes due before the spread reached it is reconciled
first. The daemon runs in-process on the fleet harness with a fake clock (tests/fleet.py).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any

import pytest
from fleet import T0, Node

from anyrtd import apply
from anyrtd.election import AlwaysActive
from anyrtd.model import Malformed, TriggerDef
from anyrtd.records import RecordCache
from anyrtd.vocab import Verdict

RECORDS: list[dict[str, Any]] = [
    {"id": "c", "_v": 3, "kind": "cron", "spec": {"cron": "0 8 * * *", "tz": "Europe/Paris"}},
    {"id": "e", "_v": 1, "kind": "cron", "spec": {"every_s": 90}, "args": {"a": [1, {"b": 2}]}},
    {"id": "o", "_v": 7, "kind": "once", "spec": {"at": T0}, "lastRunAt": T0, "runCount": 1},
    {"id": "v", "_v": 2, "kind": "event", "spec": {"dataset": "chat_messages", "objectId": "x"}},
    {"id": "m", "_v": 4, "kind": "cron", "spec": {"cron": "61 * * * *"}, "limits": {"timeoutS": 5}},
    {"id": "bad-kind", "_v": 1, "kind": "weekly", "spec": {}},
    {"id": "bad-spec", "_v": 1, "kind": "cron", "spec": "0 8 * * *"},
    {"id": "no-spec", "_v": 1, "kind": "once", "owner": "12D3KooWSomeoneElse", "enabled": False},
]


def records() -> list[dict[str, Any]]:
    return [{"program": "agent:remind@v1", "name": r["id"].upper(), **r} for r in RECORDS]


def comparable(parsed: TriggerDef | Malformed) -> object:
    """Return a definition with its compiled schedule as its type and error (the compiled
    objects themselves are built anew by each parse)."""
    if isinstance(parsed, Malformed):
        return parsed
    schedule = parsed.schedule
    return (dataclasses.replace(parsed, schedule=None), type(schedule), schedule.error)  # type: ignore[arg-type]


def loaded(texts: list[tuple[str, int, str]]) -> RecordCache:
    cache = RecordCache()
    cache.load_texts(texts)
    return cache


def eager_and_lazy() -> tuple[RecordCache, RecordCache]:
    texts = [(r["id"], r["_v"], json.dumps(r)) for r in records()]
    eager = RecordCache()
    eager.load_many([text for _, _, text in texts])
    return eager, loaded(texts)


def test_a_record_parsed_when_first_read_is_the_one_parsed_at_once() -> None:
    eager, lazy = eager_and_lazy()
    assert lazy.unparsed() == len(RECORDS) and len(lazy) == len(eager)
    assert set(lazy.parsed) == set(eager.parsed) and len(lazy.parsed) == len(RECORDS)
    assert all(rid in lazy.parsed for rid in eager.parsed)
    assert lazy.unparsed() == len(RECORDS), "listing the ids parses nothing"
    for rid in eager.parsed:
        assert comparable(lazy.parsed[rid]) == comparable(eager.parsed[rid]), rid
        assert lazy.raw(rid) == eager.raw(rid) and lazy.version(rid) == eager.version(rid)
    assert lazy.unparsed() == 0
    assert isinstance(lazy.parsed["bad-kind"], Malformed)
    assert lazy.parsed.get("nothing") is None and "nothing" not in lazy.parsed


def test_records_parsed_together_are_the_ones_parsed_one_by_one() -> None:
    eager, lazy = eager_and_lazy()
    texts = [(r["id"], r["_v"], json.dumps(r)) for r in records()]
    broken = loaded([("x", 1, "{not json"), *texts])
    lazy.parse_many([*eager.parsed, "nothing"])
    broken.parse_many(["x", *eager.parsed])
    assert lazy.unparsed() == 0 and broken.unparsed() == 0
    for rid in eager.parsed:
        assert comparable(lazy.parsed[rid]) == comparable(eager.parsed[rid]), rid
        assert comparable(broken.parsed[rid]) == comparable(eager.parsed[rid]), rid
    assert isinstance(broken.parsed["x"], Malformed)


def test_a_write_over_a_record_not_parsed_yet_is_the_write_over_a_parsed_one() -> None:
    eager, lazy = eager_and_lazy()
    for cache in (eager, lazy):
        cache.write("e", {"lastStatus": "ok", "runCount": 2})
        cache.write("c", {"name": "renamed"})
        cache.overlay_until_newer("o", {"lastRunAt": T0 + 5, "enabled": False})
    for rid in ("e", "c", "o"):
        assert comparable(lazy.parsed[rid]) == comparable(eager.parsed[rid]), rid
        assert lazy.raw(rid) == eager.raw(rid)
    assert lazy.pending_owner("eco") == eager.pending_owner("eco")


def test_a_newer_record_or_a_deletion_replaces_a_record_not_parsed_yet() -> None:
    _, lazy = eager_and_lazy()
    newer = {**records()[1], "_v": 2, "spec": {"every_s": 30}}
    assert lazy.put({**records()[1], "_v": 1}) is None  # the same version: nothing changed
    assert lazy.put(newer) == "e"
    parsed = lazy.parsed["e"]
    assert isinstance(parsed, TriggerDef) and parsed.spec == {"every_s": 30}
    assert lazy.drop("c") and "c" not in lazy.parsed and lazy.parsed.get("c") is None
    assert lazy.unparsed() == len(RECORDS) - 2


def test_a_mirror_text_that_is_not_a_record_reads_as_malformed() -> None:
    lazy = loaded([("x", 2, "{not json"), ("y", 1, "[1, 2]")])
    for rid in ("x", "y"):
        bad = lazy.parsed[rid]
        assert isinstance(bad, Malformed) and "not a JSON object" in bad.reason
        assert lazy.raw(rid) == {"id": rid}


# --- the daemon ----------------------------------------------------------------------------


class Switch(AlwaysActive):
    """A gate whose verdict the test sets."""

    def __init__(self) -> None:
        self.now: Verdict = Verdict.ACTIVE

    @property
    def verdict(self) -> Verdict:
        return self.now

    async def poll(self) -> Verdict:
        return self.now


def switched(h: Node) -> Switch:
    """Give the node a fresh daemon (not opened) whose verdict the test sets."""
    switch = Switch()
    h.daemon = h.make_daemon()
    h.daemon.gate = h.daemon.role.gate = switch
    return switch


def every(seconds: float, **fields: Any) -> dict[str, Any]:
    return {"kind": "cron", "spec": {"every_s": seconds}, "program": "test:ok@v1", **fields}


async def spread_out(h: Node, limit: int = 100) -> int:
    """Tick until the spread reconcile is done; return how many ticks it took."""
    for n in range(1, limit + 1):
        await h.tick()
        if not h.daemon.apply.spreading:
            return n
    raise AssertionError(f"the spread reconcile was not done after {limit} ticks")


async def reopen(h: Node) -> None:
    """Restart the node's daemon up to its first tick (not `boot`, which ticks twice)."""
    await h.stop()
    h.daemon = h.make_daemon()
    await h.daemon.open()
    await h.daemon.gate.boot()


async def test_a_restart_reads_no_record_before_it_needs_it_and_reconciles_every_id_in_slices(
    h: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(apply, "SPREAD_SLICE", 2)
    ids = [f"t{i}" for i in range(9)]
    for rid in ids:
        await h.put(rid, owner=h.me, **every(3600))
    await h.step(1)
    await h.step(1)
    armed = {rid: h.daemon.registry.entries[rid].row.next_fire for rid in ids}
    await reopen(h)
    assert h.daemon.records.unparsed() >= len(ids)  # a record with a write queued is read
    assert {rid: h.daemon.registry.entries[rid].row.next_fire for rid in ids} == armed
    await h.tick()
    unsettled = h.daemon.apply.unsettled
    assert h.daemon.apply.spreading and len(set(ids) & unsettled) >= len(ids) - 2
    ticks = 1 + await spread_out(h)
    assert ticks >= len(ids) // 2 and not h.daemon.apply.unsettled
    assert h.daemon.records.unparsed() == 0
    assert {rid: h.daemon.registry.entries[rid].row.next_fire for rid in ids} == armed
    meta = await h.daemon.db_call(lambda m: m.snapshot().meta)
    assert meta["verdict"] == Verdict.ACTIVE


def edit_mirror(h: Node, rid: str, **fields: Any) -> None:
    """Change the mirror's copy of a record while the daemon is down, without a reconcile
    (as a record stored by a step that did not reconcile it would be)."""
    with sqlite3.connect(h.config.mirror_path) as db:
        (text,) = db.execute("SELECT record FROM trigger_records WHERE id = ?", (rid,)).fetchone()
        record = {**json.loads(text), **fields}
        db.execute("UPDATE trigger_records SET record = ? WHERE id = ?", (json.dumps(record), rid))


async def test_an_entry_due_before_the_spread_reaches_it_is_reconciled_before_it_fires(
    h: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"t{i}" for i in range(6)]
    for rid in ids:
        await h.put(rid, owner=h.me, **every(60))
    await h.step(1)
    await h.stop()
    edit_mirror(h, "t1", owner="12D3KooWSomeoneElse")
    edit_mirror(h, "t2", kind="weekly")
    monkeypatch.setattr(apply, "SPREAD_SLICE", 0)  # the spread never comes: only the due do
    await reopen(h)
    await h.tick()
    assert set(ids) <= h.daemon.apply.unsettled
    t2 = h.daemon.registry.get("t2")
    assert t2 is not None and not t2.defn.enabled, "a record that no longer parses never fires"
    await h.step(60)  # T0 + 61: every entry due (armed at T0 + 1)
    registry = h.daemon.registry
    assert "t1" not in registry and "t2" not in registry
    assert sorted(c[1] for c in h.programs.calls if c[1] in ids) == ["t0", "t3", "t4", "t5"]
    for rid in ("t0", "t3", "t4", "t5"):
        assert [r["scheduledAt"] for r in await h.runs(rid)] == [T0 + 61]
    assert await h.runs("t1") == [] and await h.runs("t2") == []


async def test_a_record_edited_while_the_daemon_was_down_fires_its_new_definition(
    h: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(apply, "SPREAD_SLICE", 1)
    for i in range(5):
        await h.put(f"t{i}", owner=h.me, **every(60, args={"v": 1}))
    await h.step(1)
    await h.stop()
    await h.put("t3", args={"v": 2}, spec={"every_s": 30})
    h.daemon = h.make_daemon()
    await h.boot()
    entry = h.daemon.registry.get("t3")
    assert entry is not None and entry.row.next_fire == T0 + 31 and entry.defn.args == {"v": 2}
    assert h.daemon.apply.spreading
    await h.step(30)  # T0 + 31 (the edit was taken at T0 + 1)
    assert [c[3] for c in h.programs.of("t3")] == [{"v": 2}]
    await h.step(30)  # T0 + 61
    assert [c[3] for c in h.programs.of("t3")] == [{"v": 2}, {"v": 2}]
    assert [c[3] for c in h.programs.of("t0")] == [{"v": 1}]


async def test_a_verdict_change_while_the_spread_goes_on_starts_it_again(
    h: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    await h.put("mine", owner=h.me, **every(600))
    await h.step(1)
    await h.stop()
    unassigned = [f"u{i}" for i in range(7)]
    for rid in unassigned:
        await h.put(rid, owner="", **every(600))
    switch = switched(h)
    switch.now = Verdict.STANDBY
    await h.boot()  # standby: the unassigned records are left alone
    registry = h.daemon.registry
    assert "mine" in registry and not set(unassigned) & set(registry.entries)
    monkeypatch.setattr(apply, "SPREAD_SLICE", 2)
    switch.now = Verdict.ACTIVE
    for _ in range(3):
        await h.tick()  # claiming begins, two ids a tick
    claimed = set(unassigned) & set(registry.entries)
    assert len(claimed) <= 6 and h.daemon.apply.spreading
    every_id = set(h.daemon.records.ids()) | set(registry.entries)
    assert len(every_id - h.daemon.apply.unsettled) >= 6
    switch.now = Verdict.STANDBY
    await h.tick()  # the spread starts again, under the new verdict
    again = every_id - h.daemon.apply.unconfirmed  # those are reconciled every tick
    assert len(again & h.daemon.apply.unsettled) >= len(again) - 3, (
        "all again (two a tick, a change)"
    )
    await spread_out(h)
    assert set(unassigned) & set(registry.entries) == claimed, "standby claims nothing more"
    switch.now = Verdict.ACTIVE
    await spread_out(h)
    assert set(unassigned) <= set(registry.entries)
    await h.daemon.drain_outbox()
    for rid in unassigned:
        assert (await h.record(rid))["owner"] == h.me
    await h.step(5)  # the claims come back: confirmed, armed
    assert all(registry.entries[rid].row.next_fire is not None for rid in unassigned)


async def test_a_restart_from_a_mirror_of_many_triggers_fires_each_on_time(
    h: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    periods = {f"t{i:03d}": 10.0 * (1 + i % 6) for i in range(240)}
    triggers = h.triggers
    from anyrtd.client import Upsert

    await h.user.upsert(triggers, [Upsert(rid, every(p, owner=h.me)) for rid, p in periods.items()])
    await h.step(0)
    assert set(periods) <= set(h.daemon.registry.entries)
    await h.stop()
    monkeypatch.setattr(apply, "SPREAD_SLICE", 7)
    h.daemon = h.make_daemon()
    await h.boot()
    assert h.daemon.apply.spreading
    for _ in range(12):
        await h.step(5)  # one tick each: the spread goes on meanwhile
    assert not h.daemon.apply.spreading
    fired: dict[str | None, list[float]] = {}
    for rid, p in periods.items():
        fired[rid] = sorted(r["scheduledAt"] for r in await h.fleet.runs(rid))
        assert fired[rid] == [T0 + p * k for k in range(1, int(60 // p) + 1)], rid
