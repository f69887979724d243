"""`/healthz` through a 429 outage of the writes alone (reads answered): `degraded` from the
first throttled write until the outbox drains, saying why, not flapping back to `ok` at each
read answered. Real processes: a devserver, a proxy in front of it, `anyrtd serve`."""

from __future__ import annotations

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults.proxy import RATE_LIMITED, FaultProxy

pytestmark = pytest.mark.timeout(120)
PY = sys.executable


class WriteThrottle(FaultProxy):
    """Passes everything through, but answers 429 (`Retry-After: 1`) to every write while
    `throttle` is set."""

    throttle = False

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if self.throttle and request.path.endswith(("/upsert", "/modify", "/delete")):
            self.answered["429"] += 1
            return web.Response(
                status=429,
                body=RATE_LIMITED,
                content_type="application/json",
                headers={"Retry-After": "1"},
            )
        return await super()._answer(request)


@pytest.fixture
def proxy(devserver: DevserverProcess) -> Iterator[WriteThrottle]:
    p = WriteThrottle(devserver.url)
    p.start()
    try:
        yield p
    finally:
        p.stop()


def _health(serve: ServeProcess) -> dict[str, Any]:
    with serve.http() as c:
        body: dict[str, Any] = c.get("/healthz").json()
    return body


def test_healthz_holds_degraded_through_a_429_outage_of_the_writes(
    proxy: WriteThrottle, world: World, tmp_path: Path
) -> None:
    argv = f'argv = ["{PY}", "-c", "pass"]'
    world.put("tick", kind="cron", spec={"every_s": 1}, program="test:pass@v1", owner="")
    serve = ServeProcess(tmp_path, proxy.url, config_lines=('[programs."test:pass@v1"]', argv))
    serve.start()
    try:
        wait_until(lambda: world.record("tick").get("lastRunAt"), timeout=20, what="a run")
        wait_until(lambda: _health(serve)["status"] == "ok", timeout=20, what="ok at first")
        proxy.throttle = True
        wait_until(
            lambda: _health(serve)["status"] == "degraded", timeout=15, what="degraded at first"
        )
        samples = []
        end = time.monotonic() + 8.0
        while time.monotonic() < end:  # runs keep ending: the outbox grows, reads answer
            samples.append(_health(serve))
            time.sleep(0.25)
        states = [s["status"] for s in samples]
        assert set(states) == {"degraded"}, states
        reasons = " ".join(samples[-1]["reasons"])
        assert "429" in reasons and "writes waiting in the outbox" in reasons, reasons
        assert proxy.answered["429"] >= 3
        proxy.throttle = False
        wait_until(lambda: _health(serve)["status"] == "ok", timeout=20, what="ok once drained")
    finally:
        serve.stop()
