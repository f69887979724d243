"""The missed watch's passes: the first reads every record, later ones only those the cache
says changed and those whose earliest occurrence that could be missed came due, so that a
pass over a large space with nothing new costs nothing that grows with its size."""

from __future__ import annotations

from typing import Any

import pytest

from anyrtd.client import DeviceRow, DevicesView
from anyrtd.missed import Skips
from anyrtd.records import Parsed, RecordCache
from anyrtd.vocab import MissCause
from anyrtd.watch import DEVICES_EVERY_S, Watch

NOW = 1_800_000_000.0
ME = "12D3KooWme"
B = "12D3KooWbbb"
MIN = 60.0


def view(*, b_pruned: bool = False) -> DevicesView:
    """The devices registry: this device and B, live unless said."""
    rows = [DeviceRow(ME, "", "linux", {}), DeviceRow(B, "home-server", "linux", {}, b_pruned)]
    return DevicesView(self_id=ME, active={}, devices=rows)


class Devices:
    """The devices registry as the server client reads it (counted), and as the election's
    last poll saw it (`polled`; None: no poll recent enough)."""

    def __init__(self, polled: DevicesView | None = None) -> None:
        self.polled = polled
        self.reads = 0

    async def devices(self) -> DevicesView:
        self.reads += 1
        return view()

    def recent_view(self, within_s: float) -> DevicesView | None:
        return self.polled


def watching(cache: RecordCache, devices: Devices | None = None) -> Watch:
    devices = devices or Devices()
    return Watch(records=cache, polls=devices, server=devices, grace_s=MIN, skips=Skips())


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
    watch = watching(cache)
    reads = Reads(monkeypatch)
    assert await watch.step(NOW, ME) == []
    gets, scans = reads.take()
    assert scans == 1 and gets >= 1000  # the first pass reads every record
    cache.put(record("t0007", version=2, lastRunAt=NOW + 10))
    cache.drop("t0008")
    assert await watch.step(NOW + 20, ME) == []
    assert reads.take() == (2, 0)  # the two that changed, and no scan
    assert await watch.step(NOW + 25, ME) == []
    assert reads.take() == (0, 0)
    assert len(watch.definitions()) == 999


async def test_a_trigger_whose_owner_fell_silent_is_found_with_no_change_to_its_record() -> None:
    """Nothing about the record changes while its owner is away: the pass that comes after
    its next occurrence and the grace finds it (the heap of earliest occurrences)."""
    cache = RecordCache()
    cache.put(record("quiet"))
    cache.put(record("busy"))
    watch = watching(cache)
    assert await watch.step(NOW, ME) == []
    # busy's owner runs it every minute (its record changes); quiet's runs it no more.
    for minute in range(1, 6):
        cache.put(record("busy", version=1 + minute, lastRunAt=NOW + minute * MIN))
        await watch.step(NOW + minute * MIN + 5, ME)
    found = await watch.step(NOW + 6 * MIN, ME)
    assert [m.trigger_id for m in found] == ["quiet"]
    assert found[0].count >= 4
    assert set(watch.missed) == {"quiet"}
    # It runs again: its record changes, and it is no longer found.
    cache.put(record("quiet", version=2, lastRunAt=NOW + 6 * MIN))
    assert await watch.step(NOW + 6 * MIN + 5, ME) == []
    assert watch.missed == {}


async def test_a_record_dropped_or_broken_leaves_the_watch_and_its_notable_list() -> None:
    cache = RecordCache()
    cache.put(record("failing", lastStatus="error"))
    cache.put(record("gone", lastStatus="auto_disabled", enabled=False))
    watch = watching(cache)
    await watch.step(NOW, ME)
    assert [d.id for d in watch.notable] == ["failing", "gone"]
    cache.drop("gone")
    cache.put({"id": "failing", "_v": 2, "kind": 7})  # malformed now
    await watch.step(NOW + 5, ME)
    assert watch.notable == [] and watch.definitions() == []


async def test_the_devices_come_from_the_election_s_recent_poll_else_a_read_every_30_s() -> None:
    cache = RecordCache()
    cache.put(record("quiet", lastRunAt=NOW - 10 * MIN))  # its owner is B
    devices = Devices()
    watch = watching(cache, devices)
    await watch.step(NOW, ME)
    await watch.step(NOW + 5, ME)
    assert devices.reads == 1  # no poll to take them from: read, at most every 30 s
    await watch.step(NOW + DEVICES_EVERY_S, ME)
    assert devices.reads == 2
    devices.polled = view(b_pruned=True)
    found = await watch.step(NOW + DEVICES_EVERY_S + 5, ME)
    assert devices.reads == 2  # the election's view, read a moment ago, is taken as it is
    assert [(m.trigger_id, m.last.cause) for m in found] == [("quiet", MissCause.OWNER_PRUNED)]
