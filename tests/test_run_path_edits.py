"""Edits of a trigger while it runs or between its fires, on a real `anyrtd serve` (issue 23,
items 1 and 14)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from support import World, wait_until

pytestmark = pytest.mark.process

PY = sys.executable
SLEEPY = (
    '[programs."test:sleepy@v1"]',
    f'argv = ["{PY}", "-c", "import time; time.sleep(1.5)"]',
    '[programs."test:quick@v1"]',
    f'argv = ["{PY}", "-c", "pass"]',
)


@pytest.fixture
def world(devserver: DevserverProcess) -> World:
    return World(devserver.url)


@pytest.fixture
def served(devserver: DevserverProcess, tmp_path: Path) -> Iterator[ServeProcess]:
    proc = ServeProcess(tmp_path, devserver.url, config_lines=SLEEPY)
    try:
        yield proc.start()
    finally:
        proc.stop()


def view(served: ServeProcess, rid: str) -> dict[str, Any]:
    with served.http() as c:
        resp = c.get(f"/triggers/{rid}")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def runs(served: ServeProcess, rid: str) -> list[dict[str, Any]]:
    with served.http() as c:
        resp = c.get("/runs", params={"trigger": rid, "limit": "100"})
    assert resp.status_code == 200, resp.text
    found: list[dict[str, Any]] = resp.json()
    return found


def test_a_cron_edited_while_it_runs_fires_again_after_that_run(
    served: ServeProcess, world: World
) -> None:
    world.put(
        "x",
        name="x",
        kind="cron",
        spec={"every_s": 2},
        program="test:sleepy@v1",
        owner="",
        enabled=True,
    )
    wait_until(lambda: view(served, "x")["running"] == 1, timeout=30, what="a run of x")
    world.put("x", name="x edited")  # a refresh rebuilds the entry while the run is in flight
    wait_until(lambda: view(served, "x")["name"] == "x edited", timeout=20, what="the edit")
    edited_runs = {r["runId"] for r in runs(served, "x")}

    def a_later_run_ended() -> bool:
        later = [r for r in runs(served, "x") if r["runId"] not in edited_runs]
        return any(r["status"] == "ok" for r in later)

    wait_until(a_later_run_ended, timeout=30, what="a run of x started after the edit")
    wait_until(lambda: view(served, "x")["running"] in (0, 1), timeout=5, what="x's count")
