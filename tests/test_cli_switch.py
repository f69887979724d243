"""`triggers disable` / `enable` right after `create`, while the daemon's claim on the new
trigger is still in flight: the switch goes through the daemon, which sends its claim
first, so the claim is confirmed and the switch applied here at once. The real `anyrtd`
command line against a real `anyrtd serve` on a real devserver, behind a proxy that holds
the claim's write for a few seconds so that the claim is seen in flight."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import wait_until

# `bench` is a folder of the repository, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults.proxy import FaultProxy

PY = sys.executable
TICK_S = 10.0
HOLD_S = 4.0
"""How long the proxy holds a claim's write: the claim stays unconfirmed meanwhile."""


class HoldingProxy(FaultProxy):
    """Passes every request through, a claim's write only after `HOLD_S`."""

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and b'"claim"' in await request.read():
            await asyncio.sleep(HOLD_S)
        return await super()._answer(request)


@pytest.fixture
def proxy(devserver: DevserverProcess) -> Iterator[HoldingProxy]:
    p = HoldingProxy(devserver.url).start()
    try:
        yield p
    finally:
        p.stop()


def anyrtd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*anyrtd_command(), *args], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def test_disable_during_the_claim_sends_the_claim_first_and_takes_effect_at_once(
    devserver: DevserverProcess, proxy: HoldingProxy, tmp_path: Path
) -> None:
    served = ServeProcess(
        tmp_path,
        proxy.url,
        tick_s=TICK_S,
        config_lines=('[programs."test:echo@v1"]', f"argv = {json.dumps([PY, '-c', 'pass'])}"),
    ).start()
    env = {
        **os.environ,
        "ANYRTD_CONFIG": str(served.config),
        "ANYRTD_SERVER": devserver.url,
        "ANYRTD_LISTEN": served.listen,
    }

    def view() -> dict[str, Any]:
        shown = anyrtd(env, "triggers", "show", "sw1", "--json").stdout
        return dict(json.loads(shown)["trigger"])

    try:
        create = ("--id", "sw1", "--every", "3600", "--program", "test:echo@v1", "--yes")
        anyrtd(env, "triggers", "create", *create)
        claiming = wait_until(
            lambda: (v := view())["state"] == "claiming" and v["enabled"] and v,
            timeout=30,
            interval=0.05,
            what="sw1 claimed and not yet confirmed",
        )
        assert claiming
        said = anyrtd(env, "triggers", "disable", "sw1").stdout.strip()
        assert said == "sw1: disabled"
        done = view()
        assert done["state"] == "disabled" and not done["enabled"], done
        assert done["owner"] == devserver.peers[0]
        assert anyrtd(env, "triggers", "disable", "sw1").stdout.strip() == "sw1: disabled"
    finally:
        served.stop()
