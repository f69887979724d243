"""Failures that are not the program's, through a real devserver and `anyrtd serve`: a server
outage never trips the breaker, failed runs are logged as warnings, `/healthz` says
`degraded` while it lasts, and `anyrtd doctor` lists what needs a hand."""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from conftest import DevserverProcess
from control_support import ServeProcess
from support import wait_until

from anyrtd.cli import main

PY = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class Space:
    """The agent space on one devserver device: trigger records and the general chat."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=10)
        children = "/v1/spaces/bao/bundles/bao%2Fv1/children"
        self.anchor = self.child(children, "bao/triggers/v1")
        self.chat = self.child(children, "bao/chat/general")

    def child(self, path: str, seed: str) -> str:
        resp = self.http.post(path, json={"seed": seed})
        resp.raise_for_status()
        object_id: str = resp.json()["objectId"]
        return object_id

    def put(self, rid: str, **fields: Any) -> None:
        self.write(self.anchor, "agent_triggers", rid, fields)

    def say(self, mid: str, text: str) -> None:
        self.write(self.chat, "chat_messages", mid, {"text": text, "createdAt": time.time()})

    def write(self, object_id: str, dataset: str, rid: str, fields: dict[str, Any]) -> None:
        resp = self.http.post(
            "/v1/spaces/bao/upsert",
            json={
                "objectId": object_id,
                "dataset": dataset,
                "records": [{"id": rid, "fields": fields}],
            },
        )
        resp.raise_for_status()

    def find(self, object_id: str, dataset: str, rid: str) -> dict[str, Any] | None:
        resp = self.http.post(
            "/v1/spaces/bao/query",
            json={"objectId": object_id, "dataset": dataset, "filter": {"id": rid}},
        )
        records: list[dict[str, Any]] = resp.json()["records"]
        return records[0] if records else None


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    """Start `anyrtd serve` processes; every one is stopped at teardown."""
    started: list[ServeProcess] = []

    def start(url: str, config_lines: tuple[str, ...] = ()) -> ServeProcess:
        serve = ServeProcess(tmp_path, url, config_lines=config_lines, name=f"serve{len(started)}")
        started.append(serve)
        return serve.start()

    yield start
    for serve in started:
        serve.stop()


def get(serve: ServeProcess, path: str, **params: Any) -> Any:
    with serve.http() as client:
        resp = client.get(path, params=params)
    assert resp.status_code in (200, 503), resp.text
    return resp.json()


def runs(serve: ServeProcess, trigger: str, status: str | None = None) -> list[dict[str, Any]]:
    params = {"trigger": trigger, "limit": 1000}
    if status is not None:
        params["status"] = status
    found: list[dict[str, Any]] = get(serve, "/runs", **params)
    return found


def log_lines(serve: ServeProcess, pattern: str) -> list[str]:
    return [
        ln for ln in serve.log.read_text(errors="replace").splitlines() if re.search(pattern, ln)
    ]


def test_a_server_outage_fails_runs_without_tripping_the_breaker_and_degrades_healthz(
    devserver_factory: Callable[..., DevserverProcess],
    served: Callable[..., ServeProcess],
) -> None:
    devserver = devserver_factory(extra=("--port", str(free_port())))
    space = Space(devserver.url)
    serve = served(devserver.url)
    space.put(
        "remind",
        kind="cron",
        spec={"every_s": 1},
        program="agent:remind@v1",
        args={"text": "stand up"},
        owner="",
        maxConsecutiveFailures=2,
    )
    wait_until(lambda: runs(serve, "remind", "ok"), timeout=30, what="a first ok run")
    space.http.close()

    devserver.stop()
    failed = wait_until(
        lambda: len(found := runs(serve, "remind", "FAILED")) >= 4 and found,
        timeout=30,
        what="four runs failed by the outage",
    )
    assert {r["errorType"] for r in failed} == {"ServerUnavailable"}
    held = get(serve, "/triggers/remind")
    assert held["enabled"] is True and held["state"] in ("scheduled", "running")
    assert held["consecutiveFailures"] == 0 and held["lastStatus"] != "auto_disabled"
    # Each failed run is a warning, so `journalctl -p warning` sees it.
    assert log_lines(
        serve, r" WARNING anyrtd\.firing: run \S+ of remind ended FAILED \(ServerUnavailable: "
    )
    assert not log_lines(serve, r" INFO anyrtd\.firing: run \S+ of remind ended FAILED")

    def degraded() -> dict[str, Any] | None:
        with serve.http() as client:
            resp = client.get("/healthz")
        body: dict[str, Any] = resp.json()
        ok = resp.status_code == 200 and body["status"] == "degraded" and len(body["reasons"]) == 2
        return body if ok else None

    health = wait_until(degraded, timeout=30, what="/healthz to say degraded")
    unreachable, outbox = health["reasons"]
    assert unreachable.startswith("server unreachable since ") and "ConnectError" in unreachable
    assert re.fullmatch(r"\d+ writes waiting in the outbox for the server", outbox)
    assert health["stateDir"] == str(serve.state)

    devserver.start()  # the same port: the daemon finds its server again
    before = len(runs(serve, "remind", "ok"))
    wait_until(
        lambda: len(runs(serve, "remind", "ok")) > before, timeout=30, what="an ok run after it"
    )
    healed = wait_until(
        lambda: (h := get(serve, "/healthz"))["status"] == "ok" and h,
        timeout=30,
        what="/healthz back to ok",
    )
    assert healed["reasons"] == []
    space = Space(devserver.url)
    record = wait_until(
        lambda: (
            (r := space.find(space.anchor, "agent_triggers", "remind"))
            and r["lastStatus"] == "ok"
            and r
        ),
        timeout=30,
        what="the record's rollup after the outage",
    )
    assert record.get("enabled", True) is True and record.get("consecutiveFailures", 0) == 0
    space.http.close()


def test_refused_chat_replies_never_silence_the_chat_watch(
    devserver_factory: Callable[..., DevserverProcess],
    served: Callable[..., ServeProcess],
) -> None:
    devserver = devserver_factory(devices=2)
    serve = served(devserver.url)
    wait_until(
        lambda: get(serve, "/triggers/chat-watch")["state"] == "listening",
        timeout=30,
        what="the chat watch to listen on this device",
    )
    user = Space(devserver.urls[1])  # the user writes through another device
    devserver.admin("faults", {"writes": "error"})  # this device's writes answer 503
    for n in range(4):
        user.say(f"m{n}", "/help")
        wait_until(
            lambda n=n: len(runs(serve, "chat-watch", "FAILED")) > n,
            timeout=30,
            what=f"conversation {n + 1} to fail",
        )
    assert {r["errorType"] for r in runs(serve, "chat-watch", "FAILED")} == {"ServerUnavailable"}
    watch = get(serve, "/triggers/chat-watch")
    assert watch["enabled"] is True and watch["state"] == "listening", watch
    devserver.admin("faults", {"writes": None})
    user.say("m-after", "/help")
    reply = wait_until(
        lambda: user.find(user.chat, "chat_messages", "reply-m-after"),
        timeout=30,
        what="the reply once the server takes writes again",
    )
    assert "I answer these commands" in reply["text"]
    user.http.close()


def doctor(serve: ServeProcess, server: str, state_dir: Path) -> dict[str, dict[str, Any]]:
    env = {
        "ANYRTD_CONFIG": str(serve.config),
        "ANYRTD_SERVER": server,
        "ANYRTD_LISTEN": serve.listen,
        "ANYRTD_STATE_DIR": str(state_dir),
    }
    result = CliRunner().invoke(main, ["doctor", "--json"], env=env, catch_exceptions=False)
    return {c["name"]: c for c in json.loads(result.stdout)}


def test_an_auto_disabled_trigger_is_an_error_line_and_doctor_lists_it_with_invalid_specs(
    devserver: DevserverProcess, served: Callable[..., ServeProcess], tmp_path: Path
) -> None:
    space = Space(devserver.url)
    serve = served(
        devserver.url,
        ('[programs."test:fail@v1"]', f'argv = ["{PY}", "-c", "raise SystemExit(3)"]'),
    )
    space.put(
        "flaky",
        kind="cron",
        spec={"every_s": 1},
        program="test:fail@v1",
        owner="",
        maxConsecutiveFailures=2,
    )
    space.put("typo", kind="cron", spec={"cron": "61 * * * *"}, program="test:fail@v1", owner="")
    wait_until(
        lambda: get(serve, "/triggers/flaky")["state"] == "auto_disabled",
        timeout=30,
        what="the breaker to trip",
    )
    wait_until(
        lambda: get(serve, "/triggers/typo")["stateReason"] == "invalid_spec",
        timeout=30,
        what="the typo to be marked",
    )
    assert log_lines(
        serve, r" ERROR anyrtd\.firing: flaky auto-disabled after 2 consecutive failures"
    )
    assert log_lines(serve, r" WARNING anyrtd\.firing: run \S+ of flaky ended FAILED \(ExitCode: ")

    elsewhere = tmp_path / "cli-state"  # the CLI's own state directory is not the daemon's
    checks = wait_until(
        lambda: (
            (c := doctor(serve, devserver.url, elsewhere))["triggers"]["status"] == "warn"
            and "flaky" in c["triggers"]["detail"]
            and "typo" in c["triggers"]["detail"]
            and c
        ),
        timeout=30,
        what="doctor to list both",
    )
    found = checks["triggers"]["detail"]
    assert "auto-disabled after repeated failures: flaky" in found
    assert "invalid_spec (can never fire): typo" in found
    assert "anyrtd triggers show flaky" in checks["triggers"]["fix"]
    assert (
        checks["statedir"]["status"] == "warn" and str(serve.state) in checks["statedir"]["detail"]
    )
    assert checks["mirror"]["status"] == "ok"
    assert str(serve.state / "anyrtd.sqlite3") in checks["mirror"]["detail"]
    assert checks["control"]["status"] == "ok"

    devserver.stop()  # the server away: the daemon's own view of the triggers is used
    offline = wait_until(
        lambda: (
            (c := doctor(serve, devserver.url, serve.state))["control"]["status"] == "warn" and c
        ),
        timeout=30,
        what="doctor to see the daemon degraded",
    )
    assert "degraded: server unreachable since" in offline["control"]["detail"]
    assert offline["server"]["status"] == "fail"
    assert offline["triggers"]["status"] == "warn"
    assert "on this device" in offline["triggers"]["detail"]
    assert "flaky" in offline["triggers"]["detail"] and "typo" in offline["triggers"]["detail"]
    assert "statedir" not in offline
    space.http.close()
