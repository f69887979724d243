"""Manual runs have a bound: a running `anyrtd serve` starts at most 16 at once.

Many concurrent `POST /triggers/:id/run` against a real daemon whose program waits for a
gate file: 16 start, the rest are answered 429 `too_many_runs` and start nothing; the CLI
prints that error; once the gate opens and the runs end, manual runs start again.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from conftest import DevserverProcess
from control_support import ServeProcess
from support import wait_until
from test_control_process import World, adopted

from anyrtd.cli import main
from anyrtd.firing import MAX_MANUAL_RUNS

PY = sys.executable
REQUESTS = 60


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path / "gate"


@pytest.fixture
def served(devserver: DevserverProcess, tmp_path: Path, gate: Path) -> Iterator[ServeProcess]:
    wait = f"import os, time\\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)"
    proc = ServeProcess(
        tmp_path,
        devserver.url,
        config_lines=('[programs."test:slow@v1"]', f'argv = ["{PY}", "-c", "{wait}"]'),
    )
    try:
        yield proc.start()
    finally:
        gate.touch()  # let the runs end, so the stop does not wait on them
        proc.stop()


async def burst(served: ServeProcess, n: int) -> list[httpx.Response]:
    transport = httpx.AsyncHTTPTransport(uds=served.listen[len("unix:") :])
    async with httpx.AsyncClient(base_url="http://localhost", transport=transport, timeout=30) as c:
        return await asyncio.gather(*(c.post("/triggers/slow/run") for _ in range(n)))


def running(served: ServeProcess) -> list[dict[str, Any]]:
    with served.http() as c:
        runs: list[dict[str, Any]] = c.get(
            "/runs", params={"trigger": "slow", "status": "running", "limit": 500}
        ).json()
    return runs


def test_concurrent_manual_runs_are_capped_and_the_rest_refused_with_429(
    served: ServeProcess, devserver: DevserverProcess, gate: Path
) -> None:
    World(devserver.url).put(
        "slow", kind="cron", spec={"cron": "0 9 1 1 *"}, program="test:slow@v1", owner=""
    )
    adopted(served, "slow")

    answers = asyncio.run(burst(served, REQUESTS))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [202] * MAX_MANUAL_RUNS + [429] * (REQUESTS - MAX_MANUAL_RUNS)
    refused = next(r for r in answers if r.status_code == 429).json()
    assert refused["error"]["code"] == "too_many_runs"
    assert "16 manual runs are already in flight" in refused["error"]["message"]
    started = {r.json()["runId"] for r in answers if r.status_code == 202}
    assert {r["runId"] for r in running(served)} == started

    env = {
        "ANYRTD_CONFIG": str(served.config),
        "ANYRTD_SERVER": devserver.url,
        "ANYRTD_LISTEN": served.listen,
        "ANYRTD_STATE_DIR": str(served.state),
    }
    result = CliRunner().invoke(main, ["triggers", "run", "slow"], env=env)
    assert result.exit_code == 1, result.output
    assert "16 manual runs are already in flight on this daemon" in result.output
    assert len(running(served)) == MAX_MANUAL_RUNS  # the refused requests started nothing

    gate.touch()
    wait_until(lambda: not running(served), timeout=30, what="the manual runs to end")
    again = asyncio.run(burst(served, 1))
    assert again[0].status_code == 202
