"""A run held up by the server is the server's fault, whatever the budget: a real `anyrtd
serve` behind a proxy that trickles the answer to the reminder's post (a byte every 0.2 s),
with a run budget (2 s) below the client's deadline for an answer (30 s)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import DevserverProcess
from control_support import ServeProcess
from support import World, wait_until

# `bench` is a folder of the repository, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from anyrtd.runs import SERVER_UNAVAILABLE
from anyrtd.vocab import RunStatus
from bench.faults.proxy import FaultProxy

pytestmark = pytest.mark.process

BUDGET_S = 2


class TricklingProxy(FaultProxy):
    """Passes every request through but a reminder's post, whose answer it trickles."""

    trickled = 0

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method != "POST" or b'"remind-' not in body:
            return await super()._answer(request)
        self.trickled += 1
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        until = time.monotonic() + 60
        try:
            await resp.write(b"{")
            while time.monotonic() < until:
                await asyncio.sleep(0.2)
                await resp.write(b" ")
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away: the run was stopped
        return resp


@pytest.fixture
def proxy(devserver: DevserverProcess) -> Iterator[TricklingProxy]:
    p = TricklingProxy(devserver.url).start()
    try:
        yield p
    finally:
        p.stop()


def test_a_remind_held_up_by_the_server_past_its_budget_does_not_count_toward_the_breaker(
    proxy: TricklingProxy, world: World, tmp_path: Path
) -> None:
    served = ServeProcess(tmp_path, proxy.url, config_lines=(f"run_timeout_s = {BUDGET_S}",))
    served.start()
    try:
        world.put(
            "nudge",
            kind="cron",
            spec={"every_s": 3},
            program="agent:remind@v1",
            args={"text": "stand up"},
            owner="",
            maxConsecutiveFailures=1,
        )

        def ended() -> list[dict[str, Any]] | None:
            runs = [r for r in served.runs("nudge") if r["status"] != RunStatus.RUNNING]
            return runs or None

        [run, *_] = wait_until(ended, timeout=20, what="a run of nudge to end")
        assert proxy.trickled >= 1
        assert run["status"] == RunStatus.INCOMPLETE, run
        assert run["errorType"] == SERVER_UNAVAILABLE, run
        assert "the any server held its request" in run["error"], run
        assert "not counted toward the breaker" in run["error"], run
        wait_until(
            lambda: world.record("nudge").get("lastRunRef") is not None,
            timeout=10,
            what="the rollup",
        )
        record = world.record("nudge")
        assert record.get("enabled", True) is True and record["lastStatus"] == "error"
        assert record.get("consecutiveFailures", 0) == 0
        # Not switched off: it runs again, and is held up again.
        wait_until(lambda: len(served.runs("nudge")) >= 2, timeout=15, what="a second run")
    finally:
        served.stop()
