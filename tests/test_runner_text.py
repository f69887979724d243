"""Text from programs is made valid before it is stored: through a real `anyrtd serve`, a
command whose last line carries a lone surrogate gets its run record onto the server."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from support import put_triggers, server_runs, wait_until

# What JavaScript's JSON.stringify gives for a string cut through an emoji.
CUT = 'print(\'{"title": "digest \\\\ud83d", "effects": 1}\')'
PROGRAMS = (
    '[programs."test:cut@v1"]',
    f"argv = {json.dumps([sys.executable, '-c', CUT])}",
)


@pytest.fixture
def served(serve_on: Callable[..., ServeProcess]) -> ServeProcess:
    return serve_on(PROGRAMS)


def test_a_lone_surrogate_in_a_result_reaches_the_server_replaced(
    served: ServeProcess, devserver: DevserverProcess
) -> None:
    put_triggers(
        devserver.url,
        {
            "cut": {
                "kind": "cron",
                "spec": {"cron": "0 9 * * *"},
                "program": "test:cut@v1",
                "owner": "",
            }
        },
    )

    def adopted() -> bool:
        with served.http() as c:
            body: dict[str, Any] = c.get("/triggers/cut").json()
        return bool(body.get("adopted")) and body.get("state") != "claiming"

    wait_until(adopted, timeout=30, what="cut adopted by anyrtd serve")
    with served.http() as c:
        resp = c.post("/triggers/cut/run")
        assert resp.status_code == 202, resp.text
        run_id = resp.json()["runId"]

        def ended() -> dict[str, Any] | None:
            run: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            return run if run["status"] != "running" else None

        run = wait_until(ended, timeout=30, what="the manual run to end")
    assert run["status"] == "ok", run
    assert run["title"] == "digest \ufffd"
    assert (
        "anyrtd: result key 'title': text that is not valid Unicode (a lone surrogate) was "
        "replaced with U+FFFD"
    ) in run["output"].splitlines()

    def on_server() -> dict[str, Any] | None:
        return next((r for r in server_runs(devserver.url, "cut") if r["runId"] == run_id), None)

    record = wait_until(on_server, timeout=30, what="the run record on the server")
    assert record["title"] == "digest \ufffd" and record["effects"] == 1

    with served.http() as c:
        assert c.get("/healthz").json()["status"] == "ok"
