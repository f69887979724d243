"""The control API with aiohttp_client, on a real daemon ticking against an in-process devserver.

Every route: the seeds' shapes, write-through to the record, run-now, the 404/400
paths, the Host and cross-site checks, the bearer token and the 503 when the server
is gone.
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from support import SEED_KEYS, async_wait_until

from anyrtd import daemon as daemon_module
from anyrtd.client import ServerClient, Upsert
from anyrtd.clock import FakeClock
from anyrtd.config import CommandProgram, Config
from anyrtd.control.api import make_app
from anyrtd.control.guard import Guard
from anyrtd.daemon import Daemon
from anyrtd.devserver import DevServer

FAR_CRON = {"cron": "0 0 1 1 *"}
PY = sys.executable


class Stack:
    """A daemon on a devserver, its control API under aiohttp_client, and a user's client."""

    def __init__(self, daemon: Daemon, http: TestClient[Any, Any], user: ServerClient) -> None:
        self.daemon = daemon
        self.http = http
        self.user = user

    @property
    def me(self) -> str:
        assert self.daemon.peer_id is not None
        return self.daemon.peer_id

    async def put(self, rid: str, **fields: Any) -> None:
        assert self.daemon.places is not None
        await self.user.upsert(self.daemon.places.triggers, [Upsert(rid, fields)])

    async def record(self, rid: str) -> dict[str, Any]:
        assert self.daemon.places is not None
        records, _ = await self.user.query(self.daemon.places.triggers, filter={"id": rid})
        assert records, f"no record {rid} on the server"
        return records[0]

    async def json(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        resp = await self.http.request(method, path, **kwargs)
        return resp.status, await resp.json()

    async def adopted(self, rid: str) -> dict[str, Any]:
        """Wait until `rid` is a confirmed registry entry; return its view."""

        async def check() -> dict[str, Any] | None:
            status, body = await self.json("GET", f"/triggers/{rid}")
            ok = status == 200 and body["adopted"] and body["state"] != "claiming"
            return body if ok else None

        return await async_wait_until(check, timeout=15, what=f"{rid} adopted")

    async def create(self, rid: str, **fields: Any) -> dict[str, Any]:
        base = {"kind": "cron", "spec": FAR_CRON, "program": "test:echo@v1", "owner": ""}
        await self.put(rid, **{**base, **fields})
        return await self.adopted(rid)

    async def run_ended(self, run_id: str) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            status, body = await self.json("GET", f"/runs/{run_id}")
            return body if status == 200 and body["status"] != "running" else None

        return await async_wait_until(check, timeout=20, what=f"run {run_id} to end")


def config_for(url: str, state: Path) -> Config:
    return Config(
        server=url,
        state_dir=state,
        tick_s=0.2,
        run_timeout_s=20.0,
        grace_s=1.0,
        programs={
            "test:echo@v1": CommandProgram(
                argv=(
                    PY,
                    "-c",
                    "import sys; print('hello from the run'); print('x', file=sys.stderr)",
                )
            ),
            "test:fail@v1": CommandProgram(argv=(PY, "-c", "raise SystemExit(3)")),
        },
    )


@pytest.fixture
async def stack(
    devserver_inprocess: DevServer,
    tmp_path: Path,
    aiohttp_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Stack]:
    # The outbox gathers a second's writes before it sends them; these tests wait for each
    # claim to reach the server, and are not about the gathering.
    monkeypatch.setattr(daemon_module, "WINDOW_S", 0.05)
    daemon = Daemon(config_for(devserver_inprocess.url, tmp_path / "state"))
    await daemon.open()
    await daemon.start()
    user = ServerClient(devserver_inprocess.url)
    try:
        await async_wait_until(
            _resolved(daemon), timeout=15, what="the daemon to resolve the anchor"
        )
        http = await aiohttp_client(make_app(daemon.port))
        yield Stack(daemon, http, user)
    finally:
        await user.aclose()
        await daemon.stop()


def _resolved(daemon: Daemon) -> Any:
    async def check() -> bool:
        return daemon.places is not None and daemon.peer_id is not None

    return check


# --------------------------------------------------------------------------- reads


async def test_list_shows_every_registry_entry_with_the_seeds_keys(stack: Stack) -> None:
    await stack.create("digest", name="daily digest", limits={"timeoutS": 30})
    await stack.create("standup", kind="once", spec={"at": 4_000_000_000})
    await stack.put(
        "elsewhere", kind="cron", spec=FAR_CRON, program="test:echo@v1", owner="12D3KooWother"
    )
    await stack.put("broken", kind="sometimes", program="test:echo@v1")
    await async_wait_until(
        lambda: _has(stack, "broken"), timeout=10, what="the broken record to reach the cache"
    )

    status, body = await stack.json("GET", "/triggers")

    assert status == 200
    assert isinstance(body, list)
    for t in body:
        assert set(t) >= SEED_KEYS
        assert t["adopted"] is True
    ids = [t["id"] for t in body]
    assert ids == sorted(ids)
    assert {"digest", "standup"} <= set(ids)
    assert not {"elsewhere", "broken"} & set(ids)
    body = [t for t in body if t["id"] in ("digest", "standup")]
    for t in body:
        assert t["owner"] == stack.me
        assert t["enabled"] is True
        assert t["lastRunAt"] is None and t["lastStatus"] is None
        assert t["consecutiveFailures"] == 0
    digest = body[0]
    assert digest["name"] == "daily digest"
    assert digest["kind"] == "cron"
    assert digest["limits"] == {"timeoutS": 30}
    assert digest["state"] == "scheduled"
    assert digest["nextFires"] == [digest["nextFire"]]
    assert body[1]["nextFire"] == 4_000_000_000

    status, everything = await stack.json("GET", "/triggers?all=true")
    assert status == 200
    by_id = {t["id"]: t for t in everything}
    assert {"digest", "standup", "elsewhere", "broken"} <= set(by_id)
    assert by_id["elsewhere"]["adopted"] is False
    assert by_id["elsewhere"]["state"] == "pinned_elsewhere"
    assert by_id["broken"]["state"] == "malformed"
    assert "sometimes" in by_id["broken"]["malformed"]
    assert set(by_id["broken"]) >= SEED_KEYS


async def _has(stack: Stack, rid: str) -> bool:
    status, _ = await stack.json("GET", f"/triggers/{rid}")
    return status == 200


async def test_show_gives_one_record_with_its_next_fire_times(stack: Stack) -> None:
    await stack.create("five", spec={"cron": "*/5 * * * *"}, args={"text": "hi"})

    status, t = await stack.json("GET", "/triggers/five")

    assert status == 200
    assert set(t) >= SEED_KEYS
    assert t["spec"] == {"cron": "*/5 * * * *"}
    assert t["program"] == "test:echo@v1"
    assert t["args"] == {"text": "hi"}
    fires = t["nextFires"]
    assert len(fires) == 5
    assert all(f % 300 == 0 for f in fires)
    assert all(b - a == 300 for a, b in itertools.pairwise(fires))
    assert fires[0] == t["nextFire"] > stack.daemon.clock.now()


async def test_unknown_ids_are_404_on_every_trigger_route(stack: Stack) -> None:
    for method, path in [
        ("GET", "/triggers/nope"),
        ("GET", "/triggers/nope/runs"),
        ("PATCH", "/triggers/nope"),
        ("POST", "/triggers/nope/enable"),
        ("POST", "/triggers/nope/disable"),
        ("POST", "/triggers/nope/run"),
        ("GET", "/runs/nope"),
    ]:
        kwargs = {"json": {"enabled": False}} if method == "PATCH" else {}
        status, body = await stack.json(method, path, **kwargs)
        assert status == 404, (method, path)
        assert "nope" in body["error"]["message"]
    status, body = await stack.json("GET", "/no/such/route")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = await stack.json("DELETE", "/triggers")
    assert status == 405 and "openapi" in body["error"]["message"]


async def test_a_deleted_trigger_disappears_and_answers_404(stack: Stack) -> None:
    await stack.create("gone")
    assert stack.daemon.places is not None
    await stack.user.delete(stack.daemon.places.triggers, ["gone"])

    async def evicted() -> bool:
        status, _ = await stack.json("GET", "/triggers/gone")
        return status == 404

    await async_wait_until(evicted, timeout=10, what="the deleted trigger to be evicted")
    status, _ = await stack.json("POST", "/triggers/gone/disable")
    assert status == 404


# --------------------------------------------------------------------------- writes


async def test_disable_writes_through_to_the_record(stack: Stack) -> None:
    await stack.create("digest")

    resp = await stack.http.post("/triggers/digest/disable")  # the seeds' bodiless curl
    body = await resp.json()

    assert resp.status == 200
    assert body["enabled"] is False
    assert body["state"] == "disabled"
    assert body["nextFire"] is None
    assert (await stack.record("digest"))["enabled"] is False
    # A later edit of another field refreshes the entry from the record: still disabled.
    await stack.put("digest", name="renamed")

    async def renamed() -> dict[str, Any] | None:
        _, t = await stack.json("GET", "/triggers/digest")
        return t if t["name"] == "renamed" else None

    t = await async_wait_until(renamed, timeout=10, what="the rename to arrive")
    assert t["enabled"] is False


@pytest.mark.process  # it starts a real program
async def test_enable_resets_the_breaker(stack: Stack) -> None:
    await stack.create("flaky", program="test:fail@v1", maxConsecutiveFailures=1)
    status, started = await stack.json("POST", "/triggers/flaky/run")
    assert status == 202
    run = await stack.run_ended(started["runId"])
    assert run["status"] == "FAILED"

    async def tripped() -> dict[str, Any] | None:
        _, t = await stack.json("GET", "/triggers/flaky")
        return t if t["state"] == "auto_disabled" else None

    t = await async_wait_until(tripped, timeout=10, what="the breaker to trip")
    assert t["enabled"] is False and t["consecutiveFailures"] == 1

    async def written() -> dict[str, Any] | None:
        record = await stack.record("flaky")
        return record if record.get("lastStatus") == "auto_disabled" else None

    await async_wait_until(written, timeout=10, what="the outbox to write the trip")

    status, body = await stack.json("POST", "/triggers/flaky/enable")

    assert status == 200
    assert body["enabled"] is True
    assert body["consecutiveFailures"] == 0
    assert body["lastStatus"] == "error"  # the trip goes; the failed run's status stays
    assert body["state"] == "scheduled"
    record = await stack.record("flaky")
    assert record["enabled"] is True
    assert record["consecutiveFailures"] == 0
    assert record["lastStatus"] == "error"


async def test_patch_spec_rearms_forward_and_writes_the_record(stack: Stack) -> None:
    await stack.create("moving")
    before = stack.daemon.clock.now()

    status, body = await stack.json("PATCH", "/triggers/moving", json={"spec": {"every_s": 3600}})

    assert status == 200
    assert body["spec"] == {"every_s": 3600}
    assert before + 3600 <= body["nextFire"] <= stack.daemon.clock.now() + 3600
    assert (await stack.record("moving"))["spec"] == {"every_s": 3600}


async def test_patch_enabled_false_and_true(stack: Stack) -> None:
    await stack.create("toggle")
    status, body = await stack.json("PATCH", "/triggers/toggle", json={"enabled": False})
    assert status == 200 and body["enabled"] is False
    status, body = await stack.json("PATCH", "/triggers/toggle", json={"enabled": True})
    assert status == 200 and body["enabled"] is True and body["nextFire"] is not None
    assert (await stack.record("toggle"))["enabled"] is True


async def test_patch_a_once_with_a_new_at_rearms_the_shot(stack: Stack) -> None:
    await stack.create("shot", kind="once", spec={"at": 4_000_000_000}, lastRunAt=1_700_000_000)
    status, body = await stack.json(
        "PATCH", "/triggers/shot", json={"spec": {"at": 4_100_000_000}, "enabled": True}
    )
    assert status == 200
    assert body["nextFire"] == 4_100_000_000
    assert "lastRunAt" not in await stack.record("shot")


async def test_patch_with_an_invalid_spec_is_400_and_writes_nothing(stack: Stack) -> None:
    await stack.create("keep", spec={"cron": "0 8 * * *"})
    version = (await stack.record("keep"))["_v"]

    status, body = await stack.json(
        "PATCH", "/triggers/keep", json={"spec": {"cron": "61 * * * *"}}
    )

    assert status == 400
    assert body["error"]["code"] == "invalid_spec"
    assert "minute 61 is out of range 0-59" in body["error"]["message"]
    record = await stack.record("keep")
    assert record["_v"] == version
    assert record["spec"] == {"cron": "0 8 * * *"}
    _, t = await stack.json("GET", "/triggers/keep")
    assert t["spec"] == {"cron": "0 8 * * *"} and t["nextFire"] is not None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "send a JSON object"),
        (b"[1, 2]", "JSON object"),
        (b'{"owner": "x"}', "cannot change owner"),
        (b"{}", "nothing to change"),
        (b'{"enabled": "yes"}', "true or false"),
        (b'{"enabled": NaN}', "not valid JSON"),
        (b'{"spec": {"every_s": 1e999}}', "not valid JSON"),
        (b'{"spec": "* * * * *"}', "spec must be an object"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
async def test_patch_refuses_bad_bodies_with_400(stack: Stack, body: bytes, words: str) -> None:
    await stack.create("target")
    version = (await stack.record("target"))["_v"]

    status, answer = await stack.json(
        "PATCH", "/triggers/target", data=body, headers={"Content-Type": "application/json"}
    )

    assert status == 400
    assert words in answer["error"]["message"]
    assert (await stack.record("target"))["_v"] == version


@pytest.mark.process  # it starts a real program
async def test_run_now_starts_a_manual_run_with_captured_output(stack: Stack) -> None:
    await stack.create("echo")

    status, started = await stack.json("POST", "/triggers/echo/run")

    assert status == 202
    assert started["triggerId"] == "echo" and started["status"] == "running"
    run = await stack.run_ended(started["runId"])
    assert run["status"] == "ok"
    assert run["scheduledAt"] is None
    assert run["triggerId"] == "echo"
    assert run["device"] == stack.me
    assert "hello from the run" in run["output"]
    assert run["outputDropped"] == 0
    status, runs = await stack.json("GET", "/triggers/echo/runs")
    assert status == 200 and [r["runId"] for r in runs] == [started["runId"]]
    assert "output" not in runs[0]
    status, listed = await stack.json("GET", "/runs", params={"trigger": "echo", "status": "ok"})
    assert [r["runId"] for r in listed] == [started["runId"]]
    _, none = await stack.json("GET", "/runs", params={"trigger": "echo", "status": "FAILED"})
    assert none == []


@pytest.mark.process  # it starts a real program
async def test_trigger_runs_lists_the_20_newest(stack: Stack) -> None:
    await stack.create("many")
    ids = []
    for _ in range(22):
        _, started = await stack.json("POST", "/triggers/many/run")
        ids.append(started["runId"])
    for run_id in ids:
        await stack.run_ended(run_id)

    status, runs = await stack.json("GET", "/triggers/many/runs")

    assert status == 200
    assert len(runs) == 20
    starts = [r["startedAt"] for r in runs]
    assert starts == sorted(starts, reverse=True)
    assert set(ids) - {r["runId"] for r in runs} == set(ids[:2])
    _, limited = await stack.json("GET", "/runs", params={"limit": "3"})
    assert len(limited) == 3


async def test_run_now_refuses_a_trigger_pinned_elsewhere(stack: Stack) -> None:
    await stack.put("far", kind="cron", spec=FAR_CRON, program="test:echo@v1", owner="12D3KooWx")
    await async_wait_until(lambda: _has(stack, "far"), timeout=10, what="the record")

    status, body = await stack.json("POST", "/triggers/far/run")

    assert status == 409
    assert body["error"]["code"] == "not_adopted"
    assert "pinned to 12D3KooWx" in body["error"]["message"]


@pytest.mark.parametrize(
    "query",
    [
        {"status": "done"},
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "many"},
        {"limit": "-1"},
        {"limit": "¹"},
        {"limit": "\u0661\u0660"},  # Arabic-Indic 10: a digit to str, not ASCII
    ],
)
async def test_runs_refuses_bad_queries(stack: Stack, query: dict[str, str]) -> None:
    status, body = await stack.json("GET", "/runs", params=query)
    assert status == 400
    assert body["error"]["message"]


async def test_list_refuses_a_bad_all_flag(stack: Stack) -> None:
    status, body = await stack.json("GET", "/triggers", params={"all": "maybe"})
    assert status == 400 and "true or false" in body["error"]["message"]


# --------------------------------------------------------------------------- the rest


async def test_election_has_the_seeds_shape(stack: Stack) -> None:
    status, body = await stack.json("GET", "/election")
    assert status == 200
    assert {"app", "enabled", "active", "peerId", "winner"} <= set(body)
    assert body["app"] == "bao"
    assert body["peerId"] == stack.me
    assert isinstance(body["active"], bool) and isinstance(body["enabled"], bool)


async def test_healthz_reports_the_age_of_the_last_tick(stack: Stack) -> None:
    status, body = await stack.json("GET", "/healthz")
    assert status == 200
    assert body["status"] == "ok"
    assert 0 <= body["lastTickAgeS"] < body["staleAfterS"]
    assert body["peerId"] == stack.me
    assert body["serverResolved"] is True


async def test_healthz_is_503_before_the_first_tick_and_once_ticks_stall(
    devserver_inprocess: DevServer, tmp_path: Path, aiohttp_client: Any
) -> None:
    clock = FakeClock()
    config = config_for(devserver_inprocess.url, tmp_path / "quiet")
    daemon = Daemon(config, clock=clock)
    await daemon.open()
    try:
        http = await aiohttp_client(make_app(daemon.port))
        resp = await http.get("/healthz")
        assert resp.status == 503 and (await resp.json())["status"] == "starting"

        await daemon.tick()  # no loops: the test is the only one ticking
        resp = await http.get("/healthz")
        assert resp.status == 200 and (await resp.json())["lastTickAgeS"] == 0

        clock.advance(31)
        resp = await http.get("/healthz")
        body = await resp.json()
        assert resp.status == 503
        assert body["status"] == "stale" and body["lastTickAgeS"] == 31
        assert body["staleAfterS"] == 30
    finally:
        await daemon.stop()


@pytest.mark.process  # it starts a real program
async def test_metrics_are_prometheus_text(stack: Stack) -> None:
    await stack.create("m1")
    await stack.create("m2")
    await stack.json("POST", "/triggers/m2/disable")
    _, started = await stack.json("POST", "/triggers/m1/run")
    await stack.run_ended(started["runId"])

    resp = await stack.http.get("/metrics")
    text = await resp.text()

    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = _samples(text)
    _, listed = await stack.json("GET", "/triggers")
    states = Counter(t["state"] for t in listed)
    assert states["disabled"] >= 1 and states["scheduled"] >= 1
    for state, count in states.items():
        assert samples[f'anyrtd_triggers{{state="{state}"}}'] == count
    assert samples['anyrtd_runs_total{status="ok"}'] == 1
    assert samples['anyrtd_election_verdict{verdict="active"}'] == 1
    assert samples['anyrtd_election_verdict{verdict="standby"}'] == 0
    assert samples["anyrtd_outbox_depth"] == stack.daemon.outbox_depth
    assert samples['anyrtd_tick_duration_seconds_bucket{le="+Inf"}'] >= 1
    assert samples["anyrtd_tick_duration_seconds_count"] >= 1
    assert 'anyrtd_fire_lag_seconds_bucket{le="+Inf"}' in samples
    for family in ("anyrtd_triggers", "anyrtd_runs_total", "anyrtd_fire_lag_seconds"):
        assert f"# TYPE {family} " in text


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def test_openapi_describes_every_route(stack: Stack) -> None:
    status, doc = await stack.json("GET", "/openapi.json")
    assert status == 200
    assert doc["openapi"].startswith("3.1")
    described = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    served = {
        (r.method, r.resource.canonical.replace("{run_id}", "{runId}"))
        for r in stack.http.app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    assert described == served


# --------------------------------------------------------------------------- safety


@pytest.mark.parametrize(
    "host", ["127.0.0.1:7010", "localhost", "localhost:1234", "[::1]:7010", "127.9.9.9"]
)
async def test_loopback_hosts_are_served(stack: Stack, host: str) -> None:
    resp = await stack.http.get("/healthz", headers={"Host": host})
    assert resp.status == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:7010", "10.0.0.1", "127.0.0.1.evil.example", ""]
)
async def test_foreign_hosts_are_refused(stack: Stack, host: str) -> None:
    await stack.create("safe")
    for method, path in [("GET", "/triggers"), ("POST", "/triggers/safe/disable")]:
        resp = await stack.http.request(method, path, headers={"Host": host})
        body = await resp.json()
        assert resp.status == 403, (host, method)
        assert body["error"]["code"] == "forbidden_host"
    assert (await stack.record("safe")).get("enabled", True) is True


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
    ],
)
async def test_cross_site_writes_are_refused(stack: Stack, headers: dict[str, str]) -> None:
    await stack.create("safe")
    resp = await stack.http.post("/triggers/safe/disable", headers=headers)
    assert resp.status == 403
    assert (await stack.record("safe")).get("enabled", True) is True
    # Reads carry no risk: the browser cannot read the answer without CORS headers.
    assert (await stack.http.get("/triggers/safe", headers=headers)).status == 200


@pytest.mark.parametrize(
    ("content_type", "data"),
    [
        ("text/plain", b'{"enabled": false}'),
        ("application/x-www-form-urlencoded", b"enabled=false"),
        ("multipart/form-data; boundary=x", b"--x\r\n\r\nfalse\r\n--x--\r\n"),
        ("text/plain", b""),
    ],
)
async def test_form_and_text_bodies_are_refused(
    stack: Stack, content_type: str, data: bytes
) -> None:
    await stack.create("safe")
    for method, path in [("POST", "/triggers/safe/disable"), ("PATCH", "/triggers/safe")]:
        resp = await stack.http.request(
            method, path, data=data, headers={"Content-Type": content_type}
        )
        assert resp.status == 415, (method, content_type)
        assert "JSON" in (await resp.json())["error"]["message"]
    assert (await stack.record("safe")).get("enabled", True) is True


async def test_same_machine_origins_may_write(stack: Stack) -> None:
    await stack.create("local")
    resp = await stack.http.post(
        "/triggers/local/disable",
        headers={"Origin": "http://localhost:3000", "Sec-Fetch-Site": "same-site"},
    )
    assert resp.status == 200


async def test_a_bearer_token_guards_the_tcp_listener(stack: Stack, aiohttp_client: Any) -> None:
    guarded = await aiohttp_client(make_app(stack.daemon.port, Guard(token="s3cret-token")))
    resp = await guarded.get("/triggers")
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    resp = await guarded.get("/triggers", headers={"Authorization": "Bearer wrong"})
    assert resp.status == 401
    resp = await guarded.get("/triggers", headers={"Authorization": "Bearer s3cret-token"})
    assert resp.status == 200


async def test_writes_answer_503_and_change_nothing_when_the_server_is_gone(
    stack: Stack, devserver_inprocess: DevServer
) -> None:
    await stack.create("offline")
    await devserver_inprocess.close()

    status, body = await stack.json("POST", "/triggers/offline/disable")

    assert status == 503
    assert body["error"]["code"] == "server_unavailable"
    assert "nothing was written" in body["error"]["message"]
    _, t = await stack.json("GET", "/triggers/offline")
    assert t["enabled"] is True
    status, body = await stack.json("PATCH", "/triggers/offline", json={"enabled": False})
    assert status == 503


@pytest.mark.process  # it starts a real program
async def test_enable_lands_after_a_trip_still_queued_in_the_outbox(
    devserver_inprocess: DevServer, tmp_path: Path, aiohttp_client: Any
) -> None:
    # No loops run: the trip the failed run queues stays in the outbox until someone drains.
    daemon = Daemon(config_for(devserver_inprocess.url, tmp_path / "quiet"), confirm_after=0.0)
    await daemon.open()
    user = ServerClient(devserver_inprocess.url)
    try:

        async def step() -> Daemon:
            await daemon.sync()
            await daemon.tick()
            return daemon

        await async_wait_until(step, timeout=10, what="the first sync")
        assert daemon.places is not None and daemon.peer_id is not None
        fields = {
            "kind": "cron",
            "spec": FAR_CRON,
            "program": "test:fail@v1",
            "owner": daemon.peer_id,
            "maxConsecutiveFailures": 1,
        }
        await user.upsert(daemon.places.triggers, [Upsert("trip", fields)])

        async def adopted() -> bool:
            await step()
            entry = daemon.registry.get("trip")
            return entry is not None and entry.confirmed

        await async_wait_until(adopted, timeout=10, what="trip adopted")
        http = await aiohttp_client(make_app(daemon.port))
        run_id = await daemon.port.run_now("trip")

        async def tripped() -> bool:
            resp = await http.get(f"/runs/{run_id}")
            return (await resp.json())["status"] == "FAILED"

        await async_wait_until(tripped, timeout=20, what="the run to fail")
        records, _ = await user.query(daemon.places.triggers, filter={"id": "trip"})
        assert records[0].get("enabled", True) is True  # the trip is queued, not sent

        resp = await http.post("/triggers/trip/enable")
        body = await resp.json()

        assert resp.status == 200 and body["enabled"] is True
        await daemon.drain_outbox()
        records, _ = await user.query(daemon.places.triggers, filter={"id": "trip"})
        assert records[0]["enabled"] is True
        assert records[0]["consecutiveFailures"] == 0
        assert records[0]["lastStatus"] == "error"
    finally:
        await user.aclose()
        await daemon.stop()
