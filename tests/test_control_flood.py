"""A request flood on the control API does not starve the timer (issue 15.5, small counts;
`bench/bench_flood.py` measures the lag under the full flood)."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from support import World, wait_until

from anyrtd.client import Upsert

PY = sys.executable
ECHO = ('[programs."test:echo@v1"]', f'argv = ["{PY}", "-c", "print(1)"]')
CLIENTS = 100
FLOOD_S = 5.0
HEAVY = 200


@pytest.fixture
def served(devserver: DevserverProcess, tmp_path: Path) -> Iterator[ServeProcess]:
    proc = ServeProcess(tmp_path, devserver.url, listen="127.0.0.1:0", config_lines=ECHO)
    try:
        yield proc.start()
    finally:
        proc.stop()


def runs_of(served: ServeProcess, rid: str) -> list[dict[str, Any]]:
    with served.http() as c:
        resp = c.get("/runs", params={"trigger": rid, "limit": 200})
    assert resp.status_code == 200, resp.text
    runs: list[dict[str, Any]] = resp.json()
    return runs


async def flood(url: str, clients: int, seconds: float) -> dict[str, int]:
    """Keep `clients` sending GET /triggers back to back for `seconds`."""
    statuses: dict[str, int] = {}
    end = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as session:

        async def one_client() -> None:
            while time.monotonic() < end:
                try:
                    async with session.get("/triggers") as resp:
                        await resp.read()
                        key = str(resp.status)
                except aiohttp.ClientError as exc:
                    key = type(exc).__name__
                statuses[key] = statuses.get(key, 0) + 1

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return statuses


def test_an_every_second_trigger_fires_every_occurrence_under_a_request_flood(
    served: ServeProcess, devserver: DevserverProcess
) -> None:
    world = World(devserver.url)

    def peer_id() -> str | None:
        with served.http() as c:
            peer: str | None = c.get("/healthz").json()["peerId"]
        return peer

    peer = wait_until(peer_id, timeout=20, what="the daemon's peer id")

    async def seed(client: Any, places: Any) -> None:
        heavy = [
            Upsert(
                f"daily-{i:04d}",
                {
                    "kind": "cron",
                    "name": f"Daily {i}",
                    "spec": {"every_s": 86400},
                    "program": "test:echo@v1",
                    "owner": peer,
                },
            )
            for i in range(HEAVY)
        ]
        await client.upsert(places.triggers, heavy)

    world.call(seed)
    world.put(
        "tick", name="Tick", kind="cron", spec={"every_s": 1}, program="test:echo@v1", owner=""
    )

    def listed() -> bool:
        with served.http() as c:
            return len(c.get("/triggers").json()) >= HEAVY + 1

    wait_until(listed, timeout=60, what="every trigger adopted")
    wait_until(
        lambda: any(r["status"] == "ok" for r in runs_of(served, "tick")),
        timeout=30,
        what="a first ok run of the every-second trigger",
    )

    started = time.time()
    statuses = asyncio.run(flood(f"http://{served.listen}", CLIENTS, FLOOD_S))
    ended = time.time()
    assert statuses.get("200", 0) > 0, statuses

    def due_in_flood() -> list[dict[str, Any]] | None:
        runs = runs_of(served, "tick")
        if not any((r["scheduledAt"] or 0) >= ended + 1 for r in runs):
            return None  # the occurrences after the flood are not recorded yet
        return [r for r in runs if started + 1 <= (r["scheduledAt"] or 0) <= ended]

    during = wait_until(due_in_flood, timeout=30, what="the runs after the flood")
    due = sorted(r["scheduledAt"] for r in during)
    assert len(due) >= int(ended - started) - 2, (due, started, ended)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(due)]
    assert all(gap == 1.0 for gap in gaps), gaps  # not one occurrence skipped
    assert all(r["status"] in ("ok", "running") for r in during), during
