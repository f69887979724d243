"""Stretches known to have run nothing are missed occurrences with a cause of their own, on
a real `anyrtd serve`: a trigger disabled for a while (`disabled`), and occurrences the
daemon skipped itself after a stall (`stall_skip`, SIGSTOP then SIGCONT); a later run
answers none of them (docs/notices.md)."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import pytest
from control_support import ServeProcess
from support import World, wait_until

from anyrtd.firing import MISSED_AFTER_S
from anyrtd.vocab import MissCause

pytestmark = pytest.mark.process

PY = sys.executable
GRACE_S = 1.0
LINES = (
    f"missed_grace_s = {GRACE_S}",
    '[programs."test:quick@v1"]',
    f'argv = ["{PY}", "-c", "pass"]',
)


def missed(served: ServeProcess, rid: str) -> dict[str, Any]:
    with served.http() as c:
        resp = c.get(f"/triggers/{rid}/missed")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def runs_after(served: ServeProcess, rid: str, at: float) -> list[dict[str, Any]]:
    return [r for r in served.runs(rid) if (r.get("scheduledAt") or 0) > at]


def test_a_disabled_stretch_is_missed_as_disabled_after_the_next_run(
    serve_on: Any, world: World
) -> None:
    served: ServeProcess = serve_on(LINES)
    world.put("beat", kind="cron", spec={"every_s": 1}, program="test:quick@v1", owner="")
    wait_until(lambda: len(served.runs("beat")) >= 2, timeout=30, what="beat to run")
    with served.http() as c:
        assert c.post("/triggers/beat/disable").status_code == 200
    off = time.time()
    wait_until(lambda: time.time() >= off + 7, timeout=15, what="the disabled stretch")
    with served.http() as c:
        assert c.post("/triggers/beat/enable").status_code == 200
    on = time.time()
    # Runs after the enable, then a grace and a pass: the stretch is still listed.
    wait_until(lambda: len(runs_after(served, "beat", on)) >= 3, timeout=30, what="runs again")

    def listed() -> dict[str, Any] | None:
        body = missed(served, "beat")
        return body if body["count"] >= 5 else None

    body = wait_until(listed, timeout=20, what="the disabled stretch's occurrences")
    causes = {o["cause"] for o in body["occurrences"]}
    assert causes == {MissCause.DISABLED}, body["occurrences"]
    ats = [o["at"] for o in body["occurrences"]]
    assert all(off - 1.5 <= at <= on + 1.5 for at in ats), (off, on, ats)
    assert body["count"] <= 9  # about seven seconds of a one-second grid, not more


def stopped_for(served: ServeProcess, seconds: float) -> None:
    assert served.proc is not None
    os.kill(served.proc.pid, signal.SIGSTOP)
    try:
        until = time.monotonic() + seconds
        wait_until(lambda: time.monotonic() >= until, timeout=seconds + 5, what="the stop")
    finally:
        os.kill(served.proc.pid, signal.SIGCONT)


def test_occurrences_skipped_after_a_stall_are_missed_as_stall_skips(
    serve_on: Any, world: World
) -> None:
    served: ServeProcess = serve_on(LINES)
    world.put("tick", kind="cron", spec={"every_s": 2}, program="test:quick@v1", owner="")
    wait_until(lambda: len(served.runs("tick")) >= 2, timeout=30, what="tick to run")
    assert missed(served, "tick")["count"] == 0
    stopped_for(served, MISSED_AFTER_S + 4.0)
    resumed = time.time()
    wait_until(lambda: runs_after(served, "tick", resumed), timeout=20, what="tick again")

    def listed() -> dict[str, Any] | None:
        body = missed(served, "tick")
        return body if body["count"] else None

    body = wait_until(listed, timeout=20, what="the skipped occurrences")
    causes = {o["cause"] for o in body["occurrences"]}
    assert causes == {MissCause.STALL_SKIP}, body["occurrences"]
    assert 3 <= body["count"] <= 6  # a 2 s grid over a stop of about 9 s
    newest = body["occurrences"][0]
    assert "skipped it" in newest["text"] and newest["at"] < resumed
    with served.http() as c:
        why = c.get("/triggers/tick/why").json()
    note = next(r for r in why["reasons"] if r["cause"] == "missed")
    assert note["facts"]["occurrences"][0]["cause"] == MissCause.STALL_SKIP
