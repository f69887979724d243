"""The devserver's spaces, types, bundles, devices registry, faults and error handling."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from anyrtd.devserver import DevServer, start_devserver
from anyrtd.devserver.devices import DeviceRow, next_seq, winners
from anyrtd.devserver.ids import is_peer_id

TYPE_ID = re.compile(r"^t_[0-9a-f]{12}$")


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[DevServer]:
    server = await start_devserver(tmp_path / "dev.sqlite3", devices=3)
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def http(three: DevServer) -> AsyncIterator[list[httpx.AsyncClient]]:
    clients = [httpx.AsyncClient(base_url=u, timeout=10) for u in three.urls]
    try:
        yield clients
    finally:
        for c in clients:
            await c.aclose()


def error_code(resp: httpx.Response) -> str:
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["code"])


# spaces, types, bundles, datasets


async def test_spaces_list_the_default_space(http: list[httpx.AsyncClient]) -> None:
    resp = await http[0].get("/v1/spaces")
    assert resp.json() == {"spaces": [{"id": "bao", "name": "bao"}]}


async def test_another_space_name_is_created_on_start(tmp_path: Path) -> None:
    server = await start_devserver(tmp_path / "d.sqlite3", space="lab")
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert (await http.get("/v1/spaces")).json()["spaces"] == [{"id": "lab", "name": "lab"}]
    finally:
        await server.close()


async def test_hidden_types_are_created_idempotently_by_key(http: list[httpx.AsyncClient]) -> None:
    c = http[0]
    spec = {"key": "agent_trigger", "hidden": True, "idRule": "user", "dynamic": True}
    made = (await c.post("/v1/spaces/bao/types", json=spec)).json()
    assert TYPE_ID.match(made["id"])
    assert made == {
        "id": made["id"],
        "key": "agent_trigger",
        "name": "agent_trigger",
        "hidden": True,
        "idRule": "user",
        "dynamic": True,
    }
    again = (await c.post("/v1/spaces/bao/types", json={**spec, "name": "renamed"})).json()
    assert again == made
    from_other_device = (await http[2].post("/v1/spaces/bao/types", json=spec)).json()
    assert from_other_device["id"] == made["id"]
    visible = (await c.get("/v1/spaces/bao/types")).json()["types"]
    everything = (await c.get("/v1/spaces/bao/types?includeHidden=true")).json()["types"]
    assert made not in visible and made in everything
    assert all(set(t) == {"id", "key", "name", "hidden", "idRule", "dynamic"} for t in everything)
    assert [t["key"] for t in visible] == ["object"]
    resp = await c.get("/v1/spaces/bao/types?includeHidden=maybe")
    assert resp.status_code == 400 and error_code(resp) == "bad_request"
    for bad in (
        {},
        {"key": ""},
        {"key": 3},
        {"key": "k", "hidden": "yes"},
        {"key": "k", "dynamic": 1},
        {"key": "k", "name": 5},
    ):
        resp = await c.post("/v1/spaces/bao/types", json=bad)
        assert resp.status_code == 400 and error_code(resp) == "bad_request", bad


async def test_bundle_children_resolve_idempotently_by_seed(http: list[httpx.AsyncClient]) -> None:
    c = http[0]
    tid = (
        await c.post(
            "/v1/spaces/bao/types",
            json={"key": "agent_trigger", "hidden": True, "idRule": "user", "dynamic": True},
        )
    ).json()
    tid = tid["id"]
    encoded = "/v1/spaces/bao/bundles/bao%2Fv1/children"
    first = (await c.post(encoded, json={"seed": "bao/triggers/v1", "type": tid})).json()
    assert first["objectId"].startswith("bafyrei") and first["type"] == tid
    again = (await http[1].post(encoded, json={"seed": "bao/triggers/v1"})).json()
    raw = (
        await c.post("/v1/spaces/bao/bundles/bao/v1/children", json={"seed": "bao/triggers/v1"})
    ).json()
    assert again["objectId"] == raw["objectId"] == first["objectId"]
    runs = (await c.post(encoded, json={"seed": "bao/runs/v1", "type": tid})).json()
    other_bundle = (
        await c.post("/v1/spaces/bao/bundles/x/children", json={"seed": "bao/runs/v1"})
    ).json()
    assert len({first["objectId"], runs["objectId"], other_bundle["objectId"]}) == 3
    resp = await c.post(encoded, json={"seed": "s", "type": "t_000000000000"})
    assert resp.status_code == 404 and error_code(resp) == "not_found"
    for bad in ({}, {"seed": ""}, {"seed": 1}, {"seed": "s", "type": 3}):
        resp = await c.post(encoded, json=bad)
        assert resp.status_code == 400 and error_code(resp) == "bad_request", bad


async def test_a_child_first_resolved_untyped_takes_its_first_type(
    http: list[httpx.AsyncClient],
) -> None:
    c = http[0]
    url = "/v1/spaces/bao/bundles/bao%2Fv1/children"
    untyped = (await c.post(url, json={"seed": "bao/triggers/v1"})).json()
    tid = (await c.post("/v1/spaces/bao/types", json={"key": "agent_trigger"})).json()["id"]
    typed = (await c.post(url, json={"seed": "bao/triggers/v1", "type": tid})).json()
    assert typed == {"objectId": untyped["objectId"], "type": tid}
    other = (await c.post("/v1/spaces/bao/types", json={"key": "other"})).json()["id"]
    kept = (await c.post(url, json={"seed": "bao/triggers/v1", "type": other})).json()
    assert kept == typed


async def test_datasets_list_collection_names_with_their_objects(
    http: list[httpx.AsyncClient],
) -> None:
    c = http[0]
    tid = (
        await c.post(
            "/v1/spaces/bao/types",
            json={"key": "agent_trigger", "hidden": True, "idRule": "user", "dynamic": True},
        )
    ).json()
    tid = tid["id"]
    url = "/v1/spaces/bao/bundles/bao%2Fv1/children"
    triggers = (await c.post(url, json={"seed": "bao/triggers/v1", "type": tid})).json()
    runs = (await c.post(url, json={"seed": "bao/runs/v1", "type": tid})).json()
    chat = (await c.post(url, json={"seed": "bao/chat/general"})).json()
    mine = (
        await c.post("/v1/spaces/bao/bundles/mine/children", json={"seed": "a", "type": tid})
    ).json()
    await c.post(
        "/v1/spaces/bao/upsert",
        json={"objectId": mine["objectId"], "dataset": "agent_triggers", "records": []},
    )
    listing = (await c.get("/v1/spaces/bao/datasets")).json()["datasets"]
    assert {d["name"]: sorted(d["objectIds"]) for d in listing} == {
        f"{tid}_agent_triggers": sorted([triggers["objectId"], mine["objectId"]]),
        f"{tid}_agent_runs": [runs["objectId"]],
        f"{chat['type']}_chat_messages": [chat["objectId"]],
    }


# the devices registry


async def test_each_device_answers_with_its_own_self(
    three: DevServer, http: list[httpx.AsyncClient]
) -> None:
    assert len(set(three.peers)) == 3 and all(is_peer_id(p) for p in three.peers)
    assert all(len(p) == 52 and p.startswith("12D3KooW") for p in three.peers)
    for client, peer in zip(http, three.peers, strict=True):
        view = (await client.get("/v1/devices")).json()
        assert view["self"] == peer and view["active"] == {}
        assert [d["peerId"] for d in view["devices"]] == three.peers
        assert all(set(d) == {"peerId", "name", "os", "apps"} for d in view["devices"])


async def test_register_sets_the_own_row_and_keeps_its_claim(
    three: DevServer, http: list[httpx.AsyncClient]
) -> None:
    c = http[1]
    row = (
        await c.put(
            "/v1/devices/me",
            json={"name": "laptop", "os": "linux", "apps": {"bao": {"version": "0.1.0"}}},
        )
    ).json()
    assert row == {
        "peerId": three.peers[1],
        "name": "laptop",
        "os": "linux",
        "apps": {"bao": {"version": "0.1.0"}},
    }
    claimed = (await c.post("/v1/devices/activate", json={"app": "bao"})).json()
    assert (
        claimed["apps"]["bao"]["seq"] == 1 and abs(claimed["apps"]["bao"]["at"] - time.time()) < 60
    )
    row = (await c.put("/v1/devices/me", json={"apps": {"bao": {"version": "0.2.0"}}})).json()
    assert row["name"] == "laptop"
    assert row["apps"]["bao"] == {"version": "0.2.0", "seq": 1, "at": claimed["apps"]["bao"]["at"]}
    view = (await http[0].get("/v1/devices")).json()
    assert view["active"] == {"bao": three.peers[1]}
    for bad in (
        {},
        {"apps": []},
        {"apps": {"bao": {}}},
        {"apps": {"bao": {"version": 1}}},
        {"apps": {"": {"version": "1"}}},
        {"apps": {}, "name": 3},
    ):
        resp = await c.put("/v1/devices/me", json=bad)
        assert resp.status_code == 400 and error_code(resp) == "bad_request", bad


async def test_activate_takes_the_newest_claim_and_the_winner_follows(
    three: DevServer, http: list[httpx.AsyncClient]
) -> None:
    for c in http:
        await c.put("/v1/devices/me", json={"apps": {"bao": {"version": "1"}}})
    assert (await http[0].get("/v1/devices")).json()["active"] == {"bao": None}
    seqs = []
    for i in (2, 0, 1, 2):
        row = (await http[i].post("/v1/devices/activate", json={"app": "bao"})).json()
        seqs.append(row["apps"]["bao"]["seq"])
        view = (await http[(i + 1) % 3].get("/v1/devices")).json()
        assert view["active"]["bao"] == three.peers[i]
    assert seqs == [1, 2, 3, 4]
    other = (await http[0].post("/v1/devices/activate", json={"app": "notes"})).json()
    assert other["apps"]["notes"]["seq"] == 1 and other["apps"]["notes"]["version"] == ""
    view = (await http[0].get("/v1/devices")).json()
    assert view["active"] == {"bao": three.peers[2], "notes": three.peers[0]}
    for bad in ({}, {"app": ""}, {"app": 3}):
        resp = await http[0].post("/v1/devices/activate", json=bad)
        assert resp.status_code == 400 and error_code(resp) == "bad_request"


async def test_pruning_keeps_the_row_and_refuses_the_pruned_device(
    three: DevServer, http: list[httpx.AsyncClient]
) -> None:
    p = three.peers
    for c in http:
        await c.put("/v1/devices/me", json={"apps": {"bao": {"version": "1"}}})
    await http[1].post("/v1/devices/activate", json={"app": "bao"})
    await http[2].post("/v1/devices/activate", json={"app": "bao"})
    pruned = (await http[0].delete(f"/v1/devices/{p[2]}")).json()
    assert pruned["deleted"] is True and pruned["peerId"] == p[2]
    view = (await http[0].get("/v1/devices")).json()
    assert view["active"] == {"bao": p[1]}
    assert [d.get("deleted", False) for d in view["devices"]] == [False, False, True]
    assert (await http[2].get("/v1/devices")).json()["self"] == p[2]
    for resp in (
        await http[2].put("/v1/devices/me", json={"apps": {"bao": {"version": "2"}}}),
        await http[2].post("/v1/devices/activate", json={"app": "bao"}),
    ):
        assert resp.status_code == 409 and error_code(resp) == "pruned"
    assert (await http[0].delete(f"/v1/devices/{p[2]}")).status_code == 200
    again = (await http[0].post("/v1/devices/activate", json={"app": "bao"})).json()
    assert again["apps"]["bao"]["seq"] == 3, "a pruned row's claim still counts toward max(seq)"
    assert (await http[1].delete("/v1/devices/me")).json()["peerId"] == p[1]
    await http[0].delete("/v1/devices/me")
    assert (await http[0].get("/v1/devices")).json()["active"] == {"bao": None}
    resp = await http[0].delete("/v1/devices/12D3KooWnotadevice")
    assert resp.status_code == 404 and error_code(resp) == "not_found"


async def test_a_fresh_init_gives_a_device_a_new_peer_id(
    three: DevServer, http: list[httpx.AsyncClient]
) -> None:
    old = three.peers[2]
    await http[0].delete(f"/v1/devices/{old}")
    fresh = (await http[0].post("/_dev/reinit", json={"device": 3})).json()
    assert fresh["device"] == 3 and fresh["peerId"] != old and is_peer_id(fresh["peerId"])
    assert three.peers[2] == fresh["peerId"]
    row = (await http[2].put("/v1/devices/me", json={"apps": {"bao": {"version": "1"}}})).json()
    assert row["peerId"] == fresh["peerId"]
    view = (await http[2].get("/v1/devices")).json()
    assert view["self"] == fresh["peerId"]
    assert [d["peerId"] for d in view["devices"]] == [*three.peers[:2], old, fresh["peerId"]]


def test_the_winner_rule_orders_by_seq_then_at_then_peer_id() -> None:
    def row(peer: str, seq: int | None, at: float = 0, deleted: bool = False) -> DeviceRow:
        entry: dict[str, Any] = {"version": "1"}
        if seq is not None:
            entry.update(seq=seq, at=at)
        return DeviceRow(peer, peer, "linux", {"bao": entry}, deleted)

    assert winners([row("A", 1, 9), row("B", 2, 1)]) == {"bao": "B"}
    assert winners([row("A", 2, 9), row("B", 2, 1)]) == {"bao": "A"}
    assert winners([row("A", 2, 5), row("B", 2, 5)]) == {"bao": "B"}
    assert winners([row("A", 2, 5), row("B", 3, 5, deleted=True)]) == {"bao": "A"}
    assert winners([row("A", None), row("B", None)]) == {"bao": None}
    assert winners([]) == {}
    assert next_seq([row("A", 4, deleted=True), row("B", 2)], "bao") == 5
    assert next_seq([row("A", None)], "bao") == 1


# faults


async def test_faults_imitate_a_server_without_registry_or_feed(
    three: DevServer, http: list[httpx.AsyncClient]
) -> None:
    c = http[0]
    resp = await c.post("/_dev/faults", json={"devices": "missing"})
    assert resp.json()["faults"] == {"devices": "missing", "changes": None, "writes": None}
    for call in (
        c.get("/v1/devices"),
        c.put("/v1/devices/me", json={"apps": {}}),
        c.post("/v1/devices/activate", json={"app": "bao"}),
        c.delete(f"/v1/devices/{three.peers[1]}"),
    ):
        resp = await call
        assert resp.status_code == 404 and error_code(resp) == "no_route"
    assert (await http[1].get("/v1/devices")).status_code == 200, "faults are per device"
    await c.post("/_dev/faults", json={"devices": "error"})
    resp = await c.get("/v1/devices")
    assert resp.status_code == 503 and error_code(resp) == "unavailable"
    await http[1].post("/_dev/faults", json={"device": 1, "devices": None, "changes": "missing"})
    assert (await c.get("/v1/devices")).status_code == 200
    resp = await c.get("/v1/spaces/bao/changes")
    assert resp.status_code == 404 and error_code(resp) == "no_route"
    await c.post("/_dev/faults", json={"changes": None})
    assert (await c.get("/v1/spaces/bao/changes")).status_code == 200
    await c.post("/_dev/faults", json={"writes": "error"})
    anchor = (
        await c.post("/v1/spaces/bao/bundles/bao%2Fv1/children", json={"seed": "bao/triggers/v1"})
    ).json()["objectId"]
    where = {"objectId": anchor, "dataset": "agent_triggers"}
    resp = await c.post(
        "/v1/spaces/bao/upsert", json={**where, "records": [{"id": "a", "fields": {}}]}
    )
    assert resp.status_code == 503 and error_code(resp) == "unavailable"
    assert (await c.post("/v1/spaces/bao/query", json=where)).status_code == 200, "reads work"
    await c.post("/_dev/faults", json={"writes": None})
    resp = await c.post(
        "/v1/spaces/bao/upsert", json={**where, "records": [{"id": "a", "fields": {}}]}
    )
    assert resp.status_code == 200
    for bad in (
        {},
        {"devices": "broken"},
        {"changes": "error"},
        {"writes": "missing"},
        {"device": 9, "devices": None},
    ):
        resp = await c.post("/_dev/faults", json=bad)
        assert resp.status_code in (400, 404) and error_code(resp) in ("bad_request", "not_found")
    state = (await c.get("/_dev/state")).json()
    assert (
        state["mode"] == "shared"
        and [d["faults"] for d in state["devices"]]
        == [{"devices": None, "changes": None, "writes": None}] * 3
    )


async def test_replication_controls_need_replicas(http: list[httpx.AsyncClient]) -> None:
    for path, body in (
        ("/_dev/partition", {"device": 2}),
        ("/_dev/heal", {}),
        ("/_dev/sync-delay", {"seconds": 1}),
    ):
        resp = await http[0].post(path, json=body)
        assert resp.status_code == 409 and error_code(resp) == "not_replicated"


# bad input


ROUTES = [
    ("POST", "/v1/spaces/bao/types"),
    ("POST", "/v1/spaces/bao/bundles/bao%2Fv1/children"),
    ("POST", "/v1/spaces/bao/upsert"),
    ("POST", "/v1/spaces/bao/modify"),
    ("POST", "/v1/spaces/bao/query"),
    ("POST", "/v1/spaces/bao/delete"),
    ("PUT", "/v1/devices/me"),
    ("POST", "/v1/devices/activate"),
    ("POST", "/_dev/faults"),
]

GARBAGE: list[bytes] = [
    b"",
    b"{",
    b"not json",
    b"[]",
    b'"text"',
    b"null",
    b"3",
    b'{"key": NaN}',
    b'{"key": Infinity}',
    b'{"key": 1e999}',
    b'{"key": "\\ud800"}',
    b"\xff\xfe{}",
    b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"a": ' + b"1" * 5000 + b"}",
    b'{"objectId": 1, "dataset": [], "records": {}, "ids": "x", "seed": null, "app": {}}',
    b'{"objectId": "", "dataset": "", "records": [], "ids": []}',
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_garbage_bodies_get_a_4xx_error_body(
    http: list[httpx.AsyncClient], method: str, path: str
) -> None:
    for body in GARBAGE:
        resp = await http[0].request(
            method, path, content=body, headers={"Content-Type": "application/json"}
        )
        assert 400 <= resp.status_code < 500, (body[:40], resp.status_code, resp.text)
        assert error_code(resp), body[:40]
    assert (await http[0].get("/v1/spaces")).status_code == 200


async def test_records_with_wrong_shapes_are_400(http: list[httpx.AsyncClient]) -> None:
    c = http[0]
    obj = (await c.post("/v1/spaces/bao/bundles/b/children", json={"seed": "s"})).json()
    where = {"objectId": obj["objectId"], "dataset": "d"}
    cases = [
        ("upsert", {"dataset": "d", "records": []}),
        ("upsert", {"objectId": obj["objectId"], "records": []}),
        ("upsert", {**where}),
        ("upsert", {**where, "records": [{"fields": {}}]}),
        ("upsert", {**where, "records": [{"id": "", "fields": {}}]}),
        ("upsert", {**where, "records": [{"id": 1, "fields": {}}]}),
        ("upsert", {**where, "records": [{"id": "a"}]}),
        ("upsert", {**where, "records": [{"id": "a", "fields": []}]}),
        ("upsert", {**where, "records": [{"id": "a", "fields": {}, "ifVersion": "1"}]}),
        ("upsert", {**where, "records": [{"id": "a", "fields": {}, "ifVersion": -1}]}),
        ("upsert", {**where, "records": ["a"]}),
        ("modify", {**where, "records": [{"id": "a"}]}),
        ("modify", {**where, "records": [{"id": "a", "ops": [], "upsert": "yes"}]}),
        ("query", {**where, "includeDeleted": "yes"}),
        ("query", {**where, "after": 5}),
        ("delete", {**where}),
        ("delete", {**where, "ids": [""]}),
        ("delete", {**where, "ids": [1]}),
    ]
    for verb, body in cases:
        resp = await c.post(f"/v1/spaces/bao/{verb}", json=body)
        assert resp.status_code == 400, (verb, body, resp.text)
        assert error_code(resp) == "bad_request"


async def test_oversize_bodies_are_413(http: list[httpx.AsyncClient]) -> None:
    big = b'{"seed": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    resp = await http[0].post("/v1/spaces/bao/bundles/b/children", content=big)
    assert resp.status_code == 413 and error_code(resp) == "too_large"
    ok = b'{"seed": "' + b"x" * (7 * 1024 * 1024) + b'"}'
    assert (await http[0].post("/v1/spaces/bao/bundles/b/children", content=ok)).status_code == 200


async def test_unknown_routes_and_methods_get_json_errors(http: list[httpx.AsyncClient]) -> None:
    resp = await http[0].get("/v2/nothing")
    assert resp.status_code == 404 and error_code(resp) == "no_route"
    resp = await http[0].delete("/v1/spaces")
    assert resp.status_code == 405 and error_code(resp) == "method_not_allowed"
    resp = await http[0].get("/v1/spaces/bao/upsert")
    assert resp.status_code == 405


async def test_garbage_on_the_socket_does_not_hurt_the_server(three: DevServer) -> None:
    host, port = three.url.removeprefix("http://").rsplit(":", 1)
    for junk in (
        b"GARBAGE\r\n\r\n",
        b"\x00\x01\x02" * 100,
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /v1/spaces/bao/query HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(junk)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(200), 10)
        writer.close()
        assert reply == b"" or reply.startswith(b"HTTP/1.1 4") or reply.startswith(b"HTTP/1.0 4")
    async with httpx.AsyncClient(base_url=three.url) as http:
        assert (await http.get("/v1/spaces")).status_code == 200


async def test_an_unexpected_failure_is_a_500_error_body_not_a_dropped_connection(
    three: DevServer,
    http: list[httpx.AsyncClient],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> list[dict[str, str]]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(three.hub.store, "spaces", broken)
    resp = await http[0].get("/v1/spaces")
    assert resp.status_code == 500 and error_code(resp) == "internal"
    assert "a bug" not in resp.text
    assert any("GET /v1/spaces failed" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    assert (await http[0].get("/v1/spaces")).status_code == 200
