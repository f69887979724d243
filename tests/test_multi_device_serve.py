"""Two `anyrtd serve` processes, one per device of a devserver: the election end to end."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import anyrtd_command
from control_support import ServeProcess
from support import wait_until

POLL = ("election_poll_s = 0.5",)


@pytest.fixture
def pair(
    devserver_factory: Callable[..., Any], tmp_path: Path
) -> Iterator[tuple[Any, ServeProcess, ServeProcess]]:
    server = devserver_factory(devices=2)
    one = ServeProcess(tmp_path, server.urls[0], name="one", config_lines=POLL)
    two = ServeProcess(tmp_path, server.urls[1], name="two", config_lines=POLL)
    try:
        one.start()
        wait_until(lambda: election(one)["verdict"] == "active", timeout=30, what="one active")
        two.start()
        yield server, one, two
    finally:
        one.stop()
        two.stop()


def election(proc: ServeProcess) -> dict[str, Any]:
    with proc.http() as client:
        body: dict[str, Any] = client.get("/election").json()
    return body


def chat_watch_owner(url: str) -> str | None:
    with httpx.Client(base_url=url, timeout=10) as http:
        types = http.get("/v1/spaces/bao/types", params={"includeHidden": "true"}).json()
        type_id = next(t["id"] for t in types["types"] if t["key"] == "agent_trigger")
        anchor = http.post(
            "/v1/spaces/bao/bundles/bao%2Fv1/children",
            json={"seed": "bao/triggers/v1", "type": type_id},
        ).json()["objectId"]
        found = http.post(
            "/v1/spaces/bao/query",
            json={"objectId": anchor, "dataset": "agent_triggers", "filter": {"id": "chat-watch"}},
        ).json()["records"]
    return str(found[0].get("owner")) if found else None


def test_two_served_devices_hold_one_role_and_a_manual_activate_moves_it(
    pair: tuple[Any, ServeProcess, ServeProcess],
) -> None:
    server, one, two = pair
    first, second = election(one), election(two)
    assert first["enabled"] and first["active"] and first["peerId"] == server.peers[0]
    assert second["verdict"] == "standby" and second["winner"] == server.peers[0]
    wait_until(
        lambda: chat_watch_owner(server.url) == server.peers[0],
        timeout=30,
        what="device 1 to hold chat-watch",
    )
    done = subprocess.run(
        [*anyrtd_command(), "devices", "activate", "--server", server.urls[1]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    moved = time.monotonic()
    wait_until(
        lambda: election(two)["verdict"] == "active" and election(one)["verdict"] == "standby",
        timeout=15,
        what="the role to move",
    )
    assert time.monotonic() - moved < 5.0  # a poll is 0.5 s; generous for a loaded machine
    wait_until(
        lambda: chat_watch_owner(server.url) == server.peers[1],
        timeout=30,
        what="chat-watch to follow the role",
    )
