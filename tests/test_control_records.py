"""What the control API and the CLI accept and show of the records behind them: a standing
built-in's definition is anyrtd's own (refused, and listed as it runs), and a trigger's runs
are the synced `agent_runs` of every device, this device's mirror when the server is away.
Two real `anyrtd serve` processes, one per device of a real devserver, and the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import put_triggers, server_runs, wait_until

from anyrtd.client import ServerClient
from anyrtd.places import resolve_places

PY = sys.executable
CONFIG = (
    "election_poll_s = 0.5",
    '[programs."test:echo@v1"]',
    f'argv = ["{PY}", "-c", "print(\'echo\')"]',
)


class Pair:
    """The devserver, its two devices' daemons, and the CLI pointed at one of them."""

    def __init__(self, server: DevserverProcess, one: ServeProcess, two: ServeProcess) -> None:
        self.server, self.one, self.two = server, one, two

    def cli(
        self, served: ServeProcess, *args: str, code: int = 0
    ) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "TZ": "UTC",
            "ANYRTD_CONFIG": str(served.config),
            "ANYRTD_SERVER": served.server_url,
            "ANYRTD_LISTEN": served.listen,
        }
        result = subprocess.run(
            [*anyrtd_command(), *args], capture_output=True, text=True, timeout=60, env=env
        )
        assert result.returncode == code, (args, result.returncode, result.stdout, result.stderr)
        return result

    def record(self, rid: str) -> dict[str, Any] | None:
        async def main() -> dict[str, Any] | None:
            async with ServerClient(self.server.url) as client:
                places = await resolve_places(client, "bao")
                found, _ = await client.query(
                    places.triggers, filter={"id": rid}, include_deleted=True
                )
                return found[0] if found else None

        return asyncio.run(main())


def get(served: ServeProcess, path: str) -> Any:
    with served.http() as http:
        resp = http.get(path)
    assert resp.status_code == 200, resp.text
    return resp


def peer(served: ServeProcess) -> str:
    return str(get(served, "/election").json()["peerId"])


@pytest.fixture
def pair(devserver_factory: Callable[..., Any], tmp_path: Path) -> Iterator[Pair]:
    server = devserver_factory(devices=2)
    one = ServeProcess(tmp_path, server.urls[0], name="one", config_lines=CONFIG)
    two = ServeProcess(tmp_path, server.urls[1], name="two", config_lines=CONFIG)
    try:
        one.start()
        wait_until(
            lambda: get(one, "/election").json()["verdict"] == "active",
            timeout=30,
            what="device one active",
        )
        two.start()
        yield Pair(server, one, two)
    finally:
        one.stop()
        two.stop()


def listed(served: ServeProcess, rid: str, everything: bool = False) -> dict[str, Any] | None:
    items = get(served, "/triggers?all=true" if everything else "/triggers").json()
    return next((t for t in items if t["id"] == rid), None)


# --------------------------------------------------------------------------- standing built-ins


def test_a_standing_built_in_is_listed_as_it_runs_and_only_its_enabled_changes(
    pair: Pair,
) -> None:
    one, two = pair.one, pair.two
    wait_until(lambda: listed(one, "rollup"), timeout=30, what="rollup armed on the active one")
    # The takeover writes the code-owned fields (and the owner) through the outbox: an edit
    # before they land would be overwritten by them, and the record below would move.
    wait_until(
        lambda: (pair.record("rollup") or {}).get("owner") == peer(one),
        timeout=30,
        what="the active one's takeover stamp on rollup's record",
    )
    # A record edited behind anyrtd's back (as `triggers edit` could before): what runs is
    # the code's schedule, and that is what both devices list.
    put_triggers(pair.server.url, {"rollup": {"spec": {"cron": "* * * * *"}}})
    wait_until(
        lambda: (
            (get(two, "/triggers/rollup").json()["version"] or 0)
            >= (pair.record("rollup") or {})["_v"]
        ),
        timeout=30,
        what="the edit to reach device two",
    )
    for served, everything in ((one, False), (two, True)):
        shown = listed(served, "rollup", everything)
        assert shown is not None and shown["spec"] == {"cron": "0 8 * * *"}, shown
        assert get(served, "/triggers/rollup").json()["spec"] == {"cron": "0 8 * * *"}
    rows = pair.cli(two, "triggers", "list", "--all", "--json")
    assert {"cron": "0 8 * * *"} in [t["spec"] for t in json.loads(rows.stdout)]

    # The control API refuses the definition, and writes nothing.
    before = pair.record("rollup")
    with one.http() as http:
        resp = http.patch("/triggers/rollup", json={"spec": {"cron": "0 9 * * *"}})
    assert resp.status_code == 409, resp.text
    error = resp.json()["error"]
    assert error["code"] == "code_owned"
    assert "standing built-in" in error["message"] and "only enabled can change" in error["message"]
    assert pair.record("rollup") == before
    # Its enabled is the user's.
    with one.http() as http:
        resp = http.patch("/triggers/rollup", json={"enabled": False})
    assert resp.status_code == 200, resp.text
    assert resp.json()["enabled"] is False and (pair.record("rollup") or {})["enabled"] is False

    # The CLI refuses to delete it, before it asks, and the record stays.
    refused = pair.cli(one, "triggers", "delete", "decay", code=1)
    assert "decay is a standing built-in" in refused.stderr
    assert "cannot be deleted" in refused.stderr and "only enabled can change" in refused.stderr
    assert "delete decay?" not in refused.stderr
    pair.cli(one, "triggers", "delete", "decay", "--yes", code=1)
    decay = pair.record("decay")
    assert decay is not None and not decay.get("_deleted")


# --------------------------------------------------------------------------- run history


def test_after_a_repin_the_new_owner_answers_the_triggers_history(pair: Pair) -> None:
    one, two = pair.one, pair.two
    first, second = peer(one), peer(two)
    put_triggers(
        pair.server.url,
        {
            "hist": {
                "name": "History",
                "kind": "cron",
                "spec": {"cron": "0 0 1 1 *"},
                "program": "test:echo@v1",
                "owner": first,
            }
        },
    )
    wait_until(lambda: (listed(one, "hist") or {}).get("adopted"), timeout=30, what="adopted")
    for _ in range(3):
        pair.cli(one, "triggers", "run", "hist", "--wait")
    made = wait_until(
        lambda: (runs := server_runs(pair.server.url, "hist")) and len(runs) == 3 and runs,
        timeout=30,
        what="three runs synced",
    )
    newest_first = [r["runId"] for r in sorted(made, key=lambda r: -r["startedAt"])]

    # Repinned to device two: it made none of these runs, and answers all of them.
    put_triggers(pair.server.url, {"hist": {"owner": second}})
    wait_until(lambda: (listed(two, "hist") or {}).get("adopted"), timeout=30, what="repinned")
    resp = get(two, "/triggers/hist/runs")
    assert resp.headers["X-Anyrtd-Source"] == "server"
    body = resp.json()
    assert [r["runId"] for r in body] == newest_first
    assert {r["device"] for r in body} == {first} and all(r["status"] == "ok" for r in body)
    assert get(two, "/runs?limit=50").json() == []  # no run of its own
    shown = pair.cli(two, "runs", "list", "--trigger", "hist")
    assert "runs on every device" in shown.stdout
    assert all(run_id in shown.stdout for run_id in newest_first)
    status = get(two, "/runs?trigger=hist&status=FAILED")
    assert status.json() == [] and status.headers["X-Anyrtd-Source"] == "server"

    # With the server away, each device answers from its own mirror, and says so.
    pair.server.stop()
    resp = get(one, "/triggers/hist/runs")
    assert resp.headers["X-Anyrtd-Source"] == "mirror"
    assert [r["runId"] for r in resp.json()] == newest_first
    resp = get(two, "/triggers/hist/runs")
    assert resp.headers["X-Anyrtd-Source"] == "mirror" and resp.json() == []
    away = pair.cli(one, "runs", "list", "--trigger", "hist")
    assert "runs on this device only (the server is not reachable" in away.stdout
    assert all(run_id in away.stdout for run_id in newest_first)
