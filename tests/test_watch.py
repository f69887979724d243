"""The missed watch's passes: the first reads every record, later ones only those the cache
says changed and those whose earliest occurrence that could be missed came due, so that a
pass over a large space with nothing new costs nothing that grows with its size."""

from __future__ import annotations

from typing import Any

import pytest

from anyrtd.client import DeviceRow, DevicesView
from anyrtd.records import Parsed, RecordCache
from anyrtd.watch import Watch

NOW = 1_800_000_000.0
ME = "12D3KooWme"
B = "12D3KooWbbb"
MIN = 60.0


class Devices:
    """The devices registry as a client answers it: this device and B, both live."""

    async def devices(self) -> DevicesView:
        rows = [DeviceRow(ME, "", "linux", {}), DeviceRow(B, "home-server", "linux", {})]
        return DevicesView(self_id=ME, active={}, devices=rows)


def record(rid: str, version: int = 1, **fields: Any) -> dict[str, Any]:
    return {
        "id": rid,
        "kind": "cron",
        "spec": {"cron": "* * * * *"},
        "program": "test:ok@v1",
        "owner": B,
        "enabled": True,
        "_v": version,
        "lastRunAt": NOW - 30,
        **fields,
    }


class Reads:
    """Counts the watch's reads of the record cache's definitions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gets = 0
        self.scans = 0
        get, iterate = Parsed.get, Parsed.__iter__

        def counted_get(parsed: Parsed, rid: str, default: Any = None) -> Any:
            self.gets += 1
            return get(parsed, rid, default)

        def counted_iter(parsed: Parsed) -> Any:
            self.scans += 1
            return iterate(parsed)

        monkeypatch.setattr(Parsed, "get", counted_get)
        monkeypatch.setattr(Parsed, "__iter__", counted_iter)

    def take(self) -> tuple[int, int]:
        taken, self.gets, self.scans = (self.gets, self.scans), 0, 0
        return taken


async def test_a_pass_after_the_first_reads_only_the_records_that_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = RecordCache()
    for i in range(1000):
        cache.put(record(f"t{i:04d}"))
    watch = Watch(records=cache, grace_s=MIN)
    reads = Reads(monkeypatch)
    assert await watch.step(NOW, ME, Devices()) == []  # type: ignore[arg-type]
    gets, scans = reads.take()
    assert scans == 1 and gets >= 1000  # the first pass reads every record
    cache.put(record("t0007", version=2, lastRunAt=NOW + 10))
    cache.drop("t0008")
    assert await watch.step(NOW + 20, ME, Devices()) == []  # type: ignore[arg-type]
    assert reads.take() == (2, 0)  # the two that changed, and no scan
    assert await watch.step(NOW + 25, ME, Devices()) == []  # type: ignore[arg-type]
    assert reads.take() == (0, 0)
    assert len(watch.definitions()) == 999


async def test_a_trigger_whose_owner_fell_silent_is_found_with_no_change_to_its_record() -> None:
    """Nothing about the record changes while its owner is away: the pass that comes after
    its next occurrence and the grace finds it (the heap of earliest occurrences)."""
    cache = RecordCache()
    cache.put(record("quiet"))
    cache.put(record("busy"))
    watch = Watch(records=cache, grace_s=MIN)
    assert await watch.step(NOW, ME, Devices()) == []  # type: ignore[arg-type]
    # busy's owner runs it every minute (its record changes); quiet's runs it no more.
    for minute in range(1, 6):
        cache.put(record("busy", version=1 + minute, lastRunAt=NOW + minute * MIN))
        await watch.step(NOW + minute * MIN + 5, ME, Devices())  # type: ignore[arg-type]
    found = await watch.step(NOW + 6 * MIN, ME, Devices())  # type: ignore[arg-type]
    assert [m.trigger_id for m in found] == ["quiet"]
    assert found[0].count >= 4
    assert set(watch.missed) == {"quiet"}
    # It runs again: its record changes, and it is no longer found.
    cache.put(record("quiet", version=2, lastRunAt=NOW + 6 * MIN))
    assert await watch.step(NOW + 6 * MIN + 5, ME, Devices()) == []  # type: ignore[arg-type]
    assert watch.missed == {}


async def test_a_record_dropped_or_broken_leaves_the_watch_and_its_notable_list() -> None:
    cache = RecordCache()
    cache.put(record("failing", lastStatus="error"))
    cache.put(record("gone", lastStatus="auto_disabled", enabled=False))
    watch = Watch(records=cache, grace_s=MIN)
    await watch.step(NOW, ME, Devices())  # type: ignore[arg-type]
    assert [d.id for d in watch.notable] == ["failing", "gone"]
    cache.drop("gone")
    cache.put({"id": "failing", "_v": 2, "kind": 7})  # malformed now
    await watch.step(NOW + 5, ME, Devices())  # type: ignore[arg-type]
    assert watch.notable == [] and watch.definitions() == []
