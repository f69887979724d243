"""`--replicated`: one replica per device, replication delay, partitions, LWW merges, faults."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import DevserverProcess
from support import async_wait_until, wait_until

from anyrtd.clock import FakeClock
from anyrtd.devserver import DevServer, start_devserver
from anyrtd.devserver.records import Delta, merge


@dataclass
class Cluster:
    server: DevServer
    http: list[httpx.AsyncClient]
    anchor: str

    async def admin(self, path: str, body: dict[str, Any] | None = None, device: int = 0) -> Any:
        resp = await self.http[device].post(f"/_dev/{path}", json=body or {})
        assert resp.status_code == 200, resp.text
        return resp.json()

    async def state(self) -> Any:
        return (await self.http[0].get("/_dev/state")).json()

    async def write(self, device: int, verb: str, body: dict[str, Any], status: int = 200) -> Any:
        resp = await self.http[device].post(
            f"/v1/spaces/bao/{verb}",
            json={"objectId": self.anchor, "dataset": "agent_triggers", **body},
        )
        assert resp.status_code == status, resp.text
        return resp.json()

    async def upsert(self, device: int, rid: str, **fields: Any) -> Any:
        return await self.write(device, "upsert", {"records": [{"id": rid, "fields": fields}]})

    async def records(self, device: int, include_deleted: bool = False) -> dict[str, Any]:
        body = await self.write(device, "query", {"includeDeleted": include_deleted})
        return {
            r["id"]: {k: v for k, v in r.items() if k not in ("_v", "_updatedAt")}
            for r in body["records"]
        }

    async def changes(self, device: int, since: int = 0, wait: float = 0) -> Any:
        resp = await self.http[device].get(
            "/v1/spaces/bao/changes", params={"since": since, "wait": wait}, timeout=wait + 10
        )
        return resp.json()

    async def converged(self) -> bool:
        state = await self.state()
        if state["pending"]:
            return False
        views = [await self.records(i, include_deleted=True) for i in range(len(self.http))]
        return all(v == views[0] for v in views)


async def make_cluster(path: Path, devices: int = 3, **kw: Any) -> Cluster:
    server = await start_devserver(path, devices=devices, replicated=True, **kw)
    http = [httpx.AsyncClient(base_url=u, timeout=10) for u in server.urls]
    resp = await http[0].post(
        "/v1/spaces/bao/bundles/bao%2Fv1/children", json={"seed": "bao/triggers/v1"}
    )
    return Cluster(server, http, resp.json()["objectId"])


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = await make_cluster(tmp_path / "dev.sqlite3")
    try:
        yield c
    finally:
        for h in c.http:
            await h.aclose()
        await c.server.close()


async def test_each_device_has_its_own_replica_and_feed(cluster: Cluster) -> None:
    state = await cluster.state()
    assert state["mode"] == "replicated" and [d["replica"] for d in state["devices"]] == [1, 2, 3]
    await cluster.upsert(2, "b", x=1)
    await cluster.upsert(0, "a", x=1)
    await cluster.upsert(0, "a", y=2)
    for i in range(3):
        assert await cluster.records(i) == {
            "a": {"id": "a", "x": 1, "y": 2},
            "b": {"id": "b", "x": 1},
        }
    feed1 = (await cluster.changes(0))["changes"]
    feed3 = (await cluster.changes(2))["changes"]
    assert [(c["seq"], c["id"], c["op"]) for c in feed1] == [
        (1, "b", "create"),
        (2, "a", "create"),
        (3, "a", "update"),
    ]
    assert [(c["seq"], c["id"], c["op"]) for c in feed3] == [
        (1, "b", "create"),
        (2, "a", "create"),
        (3, "a", "update"),
    ]
    assert feed3[2]["record"]["y"] == 2 and feed3[2]["dataset"] == "agent_triggers"
    state = await cluster.state()
    assert [d["seq"]["bao"] for d in state["devices"]] == [3, 3, 3] and state["pending"] == 0


async def test_a_write_wakes_a_reader_waiting_on_another_replica(cluster: Cluster) -> None:
    reader = asyncio.create_task(cluster.changes(1, 0, wait=20))
    await async_wait_until(
        lambda: _true(cluster.server.hub.waiting(2, "bao")), what="the reader on device 2 to wait"
    )
    await cluster.upsert(0, "a", x=1)
    written = time.monotonic()
    body = await asyncio.wait_for(reader, 10)
    assert [c["id"] for c in body["changes"]] == ["a"]
    assert time.monotonic() - written < 0.5


async def _true(value: bool) -> bool:
    return value


async def test_the_sync_delay_holds_writes_back(cluster: Cluster) -> None:
    state = await cluster.admin("sync-delay", {"seconds": 30})
    assert state["syncDelay"] == 30
    await cluster.upsert(0, "a", x=1)
    assert await cluster.records(1) == {}
    state = await cluster.state()
    assert state["pending"] == 2 and state["devices"][0]["pending"] == {
        "outgoing": 2,
        "incoming": 0,
    }
    await cluster.admin("sync")
    assert await cluster.records(1) == {"a": {"id": "a", "x": 1}}
    await cluster.admin("sync-delay", {"seconds": 0.3})
    await cluster.upsert(1, "b", x=2)
    written = time.monotonic()

    async def arrived() -> bool:
        return "b" in await cluster.records(2)

    await async_wait_until(arrived, what="the write to reach device 3")
    assert time.monotonic() - written >= 0.25
    for bad in ({}, {"seconds": -1}, {"seconds": "1"}, {"seconds": 4000}):
        resp = await cluster.http[0].post("/_dev/sync-delay", json=bad)
        assert resp.status_code == 400


async def test_a_partition_cuts_a_device_off_until_healed(cluster: Cluster) -> None:
    await cluster.upsert(0, "shared", owner="", n=0)
    state = await cluster.admin("partition", {"device": 2})
    assert state["partitioned"] == [2] and state["devices"][1]["partitioned"] is True
    await cluster.upsert(0, "from1", x=1)
    await cluster.upsert(1, "from2", x=2)
    await cluster.upsert(0, "shared", owner="device-1")
    await cluster.upsert(1, "shared", n=5)
    await cluster.upsert(1, "shared", owner="device-2")  # later: wins the field on heal
    assert set(await cluster.records(1)) == {"shared", "from2"}
    assert set(await cluster.records(2)) == {"shared", "from1"}
    assert (await cluster.records(2))["shared"] == {"id": "shared", "owner": "device-1", "n": 0}
    state = await cluster.state()
    assert state["devices"][1]["pending"] == {"outgoing": 6, "incoming": 2}
    await cluster.admin("heal", {"device": cluster.server.peers[1]})
    await async_wait_until(cluster.converged, what="the replicas to converge")
    assert await cluster.records(2) == {
        "shared": {"id": "shared", "owner": "device-2", "n": 5},
        "from1": {"id": "from1", "x": 1},
        "from2": {"id": "from2", "x": 2},
    }
    resp = await cluster.http[0].post("/_dev/partition", json={"device": 7})
    assert resp.status_code == 404


async def test_heal_without_a_device_heals_every_partition(cluster: Cluster) -> None:
    await cluster.admin("partition", {"device": 1})
    await cluster.admin("partition", {}, device=2)
    assert (await cluster.state())["partitioned"] == [1, 3]
    await cluster.upsert(0, "a", x=1)
    await cluster.upsert(2, "b", x=1)
    state = await cluster.admin("heal")
    assert state["partitioned"] == []
    await async_wait_until(cluster.converged, what="the replicas to converge")
    assert set(await cluster.records(1)) == {"a", "b"}


async def test_tombstones_win_over_concurrent_writes(cluster: Cluster) -> None:
    await cluster.upsert(0, "doomed", x=1)
    await cluster.admin("partition", {"device": 3})
    await cluster.write(0, "delete", {"ids": ["doomed"]})
    await cluster.upsert(2, "doomed", x=2, y=3)  # device 3 has not heard of the delete
    head3 = (await cluster.changes(2))["seq"]
    await cluster.admin("heal")
    await async_wait_until(cluster.converged, what="the replicas to converge")
    for i in range(3):
        assert await cluster.records(i, include_deleted=True) == {
            "doomed": {"id": "doomed", "_deleted": True}
        }
    later = (await cluster.changes(2, head3))["changes"]
    assert [(c["id"], c["op"]) for c in later] == [("doomed", "delete")]
    body = await cluster.write(2, "upsert", {"records": [{"id": "doomed", "fields": {}}]}, 409)
    assert body["error"]["code"] == "tombstoned"


async def test_equal_clocks_break_ties_by_peer_id(tmp_path: Path) -> None:
    clock = FakeClock(1_800_000_000.0)
    c = await make_cluster(tmp_path / "tie.sqlite3", devices=2, clock=clock)
    try:
        await c.upsert(0, "r", x="start")
        await c.admin("partition", {"device": 2})
        # The wall clock stands still: both replicas stamp their write with the same clock.
        await c.upsert(0, "r", x="one")
        await c.upsert(1, "r", x="two")
        await c.admin("heal")
        await async_wait_until(c.converged, what="the replicas to converge")
        winner = "one" if c.server.peers[0] > c.server.peers[1] else "two"
        assert (await c.records(0))["r"]["x"] == winner
        assert (await c.records(1))["r"]["x"] == winner
    finally:
        for h in c.http:
            await h.aclose()
        await c.server.close()


async def test_the_registry_is_global_but_self_is_per_device(cluster: Cluster) -> None:
    await cluster.admin("partition", {"device": 1})
    await cluster.http[1].put("/v1/devices/me", json={"apps": {"bao": {"version": "1"}}})
    await cluster.http[1].post("/v1/devices/activate", json={"app": "bao"})
    for i, client in enumerate(cluster.http):
        view = (await client.get("/v1/devices")).json()
        assert view["self"] == cluster.server.peers[i]
        assert view["active"] == {"bao": cluster.server.peers[1]}


async def test_faults_apply_per_device_in_replicated_mode(cluster: Cluster) -> None:
    await cluster.admin("faults", {"device": 3, "devices": "error", "changes": "missing"})
    assert (await cluster.http[2].get("/v1/devices")).status_code == 503
    assert (await cluster.http[2].get("/v1/spaces/bao/changes")).status_code == 404
    assert (await cluster.http[0].get("/v1/devices")).status_code == 200
    await cluster.admin("faults", {"devices": "missing"}, device=2)
    assert (await cluster.http[2].get("/v1/devices")).status_code == 404
    await cluster.admin("faults", {"devices": None, "changes": None}, device=2)
    assert (await cluster.http[2].get("/v1/devices")).status_code == 200


def test_merges_converge_whatever_the_order() -> None:
    deltas = [
        Delta((5, "B"), set={"a": 1, "b": 1}),
        Delta((5, "A"), set={"a": 2}, unset=["b"]),
        Delta((7, "A"), unset=["a"]),
        Delta((6, "C"), set={"c": {"x": 1}, "a": 3}),
        Delta((4, "C"), set={"b": "old"}),
    ]
    results = set()
    for order in itertools.permutations(deltas):
        fields: dict[str, Any] = {}
        clocks: dict[str, tuple[int, str]] = {}
        for d in order:
            fields, clocks, _ = merge(fields, clocks, d)
            fields, clocks, changed = merge(fields, clocks, d)  # a repeat is a no-op
            assert not changed
        results.add(repr(sorted(fields.items())))
    assert results == {repr([("b", 1), ("c", {"x": 1})])}


# as a subprocess


Factory = Callable[..., DevserverProcess]


def _records(url: str, anchor: str) -> dict[str, Any]:
    body = httpx.post(
        f"{url}/v1/spaces/bao/query",
        timeout=10,
        json={"objectId": anchor, "dataset": "agent_triggers"},
    ).json()
    return {r["id"]: r for r in body["records"]}


def test_sync_delay_flag_and_queued_writes_survive_a_restart(devserver_factory: Factory) -> None:
    dev = devserver_factory(devices=3, sync_delay=0.2)
    state = httpx.get(f"{dev.url}/_dev/state", timeout=10).json()
    assert state["mode"] == "replicated" and state["syncDelay"] == 0.2
    anchor = httpx.post(
        f"{dev.url}/v1/spaces/bao/bundles/bao%2Fv1/children",
        timeout=10,
        json={"seed": "bao/triggers/v1"},
    ).json()["objectId"]
    httpx.post(
        f"{dev.url}/v1/spaces/bao/upsert",
        timeout=10,
        json={
            "objectId": anchor,
            "dataset": "agent_triggers",
            "records": [{"id": "a", "fields": {}}],
        },
    )
    wait_until(lambda: "a" in _records(dev.urls[2], anchor), what="device 3 to get the write")
    httpx.post(f"{dev.url}/_dev/partition", json={"device": 2}, timeout=10)
    httpx.post(
        f"{dev.url}/v1/spaces/bao/upsert",
        timeout=10,
        json={
            "objectId": anchor,
            "dataset": "agent_triggers",
            "records": [{"id": "b", "fields": {}}],
        },
    )
    wait_until(lambda: "b" in _records(dev.urls[2], anchor), what="device 3 to get b")
    assert "b" not in _records(dev.urls[1], anchor)
    dev.restart()  # partitions live in memory: the restarted devserver is healed
    wait_until(lambda: "b" in _records(dev.urls[1], anchor), what="the queued write to arrive")
    state = httpx.get(f"{dev.url}/_dev/state", timeout=10).json()
    assert state["partitioned"] == [] and state["pending"] == 0


def test_a_new_replica_starts_as_a_copy_of_device_1(
    devserver_factory: Factory, tmp_path: Path
) -> None:
    dev = devserver_factory(devices=1)
    anchor = httpx.post(
        f"{dev.url}/v1/spaces/bao/bundles/bao%2Fv1/children",
        timeout=10,
        json={"seed": "bao/triggers/v1"},
    ).json()["objectId"]
    httpx.post(
        f"{dev.url}/v1/spaces/bao/upsert",
        timeout=10,
        json={
            "objectId": anchor,
            "dataset": "agent_triggers",
            "records": [{"id": "a", "fields": {"x": 1}}],
        },
    )
    httpx.post(
        f"{dev.url}/v1/spaces/bao/delete",
        timeout=10,
        json={"objectId": anchor, "dataset": "agent_triggers", "ids": ["gone"]},
    )
    assert dev.stop() == 0
    again = devserver_factory(devices=2, replicated=True, db=dev.db)
    assert again.peers[0] == dev.peers[0]
    assert _records(again.urls[1], anchor)["a"]["x"] == 1
    resp = httpx.post(
        f"{again.urls[1]}/v1/spaces/bao/upsert",
        timeout=10,
        json={
            "objectId": anchor,
            "dataset": "agent_triggers",
            "records": [{"id": "gone", "fields": {}}],
        },
    )
    assert resp.status_code == 409
    feed = httpx.get(f"{again.urls[1]}/v1/spaces/bao/changes", timeout=10).json()["changes"]
    assert [(c["id"], c["op"]) for c in feed] == [("a", "create"), ("gone", "delete")]


def test_the_fixture_drives_the_admin_routes(devserver_factory: Factory) -> None:
    dev = devserver_factory(devices=2, replicated=True)
    assert dev.admin("partition", {"device": 2})["partitioned"] == [2]
    assert dev.admin("state", device=2)["devices"][1]["partitioned"] is True
    assert dev.admin("heal")["partitioned"] == []
    faults = dev.admin("faults", {"devices": "missing"}, device=2)["faults"]
    assert faults == {"devices": "missing", "changes": None, "writes": None}
    assert httpx.get(f"{dev.urls[1]}/v1/devices", timeout=10).status_code == 404
