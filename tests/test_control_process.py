"""The control API of a running `anyrtd serve` process, over its unix socket and over TCP."""

from __future__ import annotations

import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from support import SEED_KEYS, World, wait_until

T = TypeVar("T")
PY = sys.executable
ECHO = (
    '[programs."test:echo@v1"]',
    f'argv = ["{PY}", "-c", "print(\'hello from serve\')"]',
)


@pytest.fixture
def served(serve_on: Callable[..., ServeProcess]) -> ServeProcess:
    return serve_on(ECHO)


def adopted(served: ServeProcess, rid: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        with served.http() as c:
            resp = c.get(f"/triggers/{rid}")
        body: dict[str, Any] = resp.json()
        ok = resp.status_code == 200 and body["adopted"] and body["state"] != "claiming"
        return body if ok else None

    return wait_until(check, timeout=20, what=f"{rid} adopted by anyrtd serve")


def test_the_unix_socket_is_owner_only(served: ServeProcess) -> None:
    path = Path(served.listen[len("unix:") :])
    mode = path.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def test_every_route_answers_on_a_running_daemon(served: ServeProcess, world: World) -> None:
    world.put(
        "standup",
        name="Standup",
        kind="cron",
        spec={"cron": "0 9 * * 1-5"},
        program="test:echo@v1",
        owner="",
    )
    t = adopted(served, "standup")
    assert set(t) >= SEED_KEYS
    assert len(t["nextFires"]) == 5

    with served.http() as c:
        listed = c.get("/triggers").json()
        assert "standup" in [x["id"] for x in listed]
        assert all(set(x) >= SEED_KEYS for x in listed)

        resp = c.post("/triggers/standup/disable")
        assert resp.status_code == 200 and resp.json()["enabled"] is False
        assert world.record("standup")["enabled"] is False

        resp = c.post("/triggers/standup/enable")
        assert resp.status_code == 200 and resp.json()["enabled"] is True
        assert world.record("standup")["enabled"] is True

        resp = c.patch("/triggers/standup", json={"spec": {"every_s": 7200}})
        assert resp.status_code == 200 and resp.json()["spec"] == {"every_s": 7200}
        assert world.record("standup")["spec"] == {"every_s": 7200}

        resp = c.patch("/triggers/standup", json={"spec": {"every_s": -1}})
        assert resp.status_code == 400
        assert world.record("standup")["spec"] == {"every_s": 7200}

        resp = c.post("/triggers/standup/run")
        assert resp.status_code == 202
        run_id = resp.json()["runId"]

        def ended() -> dict[str, Any] | None:
            run: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            return run if run["status"] != "running" else None

        run = wait_until(ended, timeout=30, what="the manual run to end")
        assert run["status"] == "ok"
        assert "hello from serve" in run["output"]
        assert run["scheduledAt"] is None

        runs = c.get("/triggers/standup/runs").json()
        assert [r["runId"] for r in runs] == [run_id]
        assert c.get("/runs", params={"trigger": "standup"}).json()[0]["runId"] == run_id

        election = c.get("/election").json()
        assert {"app", "enabled", "active", "peerId", "winner"} <= set(election)
        health = c.get("/healthz").json()
        assert health["status"] == "ok" and health["lastTickAgeS"] < 30
        metrics = c.get("/metrics")
        assert metrics.status_code == 200 and "anyrtd_outbox_depth" in metrics.text
        doc = c.get("/openapi.json").json()
        assert "/triggers/{id}/run" in doc["paths"]

        assert c.get("/triggers/missing").status_code == 404
        assert c.get("/runs/missing").status_code == 404
        assert c.get("/runs", params={"limit": "x"}).status_code == 400


def test_tcp_listener_checks_host_and_cross_site_writes(
    devserver: DevserverProcess, world: World, tmp_path: Path
) -> None:
    proc = ServeProcess(tmp_path, devserver.url, listen="127.0.0.1:0", config_lines=ECHO)
    try:
        proc.start()
        host, _, port = proc.listen.rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        world.put("tcp", kind="cron", spec={"every_s": 3600}, program="test:echo@v1", owner="")
        adopted(proc, "tcp")
        with proc.http() as c:
            assert c.get("/triggers", headers={"Host": "rebind.example"}).status_code == 403
            resp = c.post("/triggers/tcp/disable", headers={"Origin": "https://evil.example"})
            assert resp.status_code == 403
            resp = c.post(
                "/triggers/tcp/disable",
                content=b"enabled=false",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            assert resp.status_code == 415
            assert world.record("tcp").get("enabled", True) is True
            # The seeds' `curl -X POST http://127.0.0.1:7010/triggers/ID/disable`.
            assert c.post("/triggers/tcp/disable").status_code == 200
        assert world.record("tcp")["enabled"] is False
    finally:
        proc.stop()


def test_a_group_readable_token_file_stops_the_start(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    proc = ServeProcess(
        tmp_path, devserver.url, listen="127.0.0.1:0", config_lines=(f'token_file = "{token}"',)
    )
    try:
        code = proc.spawn().wait(timeout=30)
        proc.proc = None
    finally:
        proc.stop()
    assert code != 0
    assert f"chmod 600 {token}" in proc.log.read_text()


def test_a_token_file_guards_the_tcp_listener(devserver: DevserverProcess, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    proc = ServeProcess(
        tmp_path, devserver.url, listen="127.0.0.1:0", config_lines=(f'token_file = "{token}"',)
    )
    proc.spawn()
    try:
        proc.listen = wait_until(
            lambda: _bound(proc), timeout=30, what="anyrtd serve to listen with a token"
        )
        with proc.http() as c:
            assert c.get("/triggers").status_code == 401
        with proc.http(headers={"Authorization": "Bearer s3cret"}) as c:
            wait_until(lambda: c.get("/healthz").status_code == 200, timeout=30, what="a tick")
            assert c.get("/triggers").status_code == 200
    finally:
        proc.stop()


def _bound(proc: ServeProcess) -> str | None:
    from control_support import LISTENING

    proc._check_alive()
    match = LISTENING.search(proc.log.read_text(errors="replace"))
    return match.group(1) if match else None
