"""A run's record says when its program really started, as the program itself saw it.

A real daemon on the real clock fires three `once` triggers due at the same instant: two
in-process programs that note `time.time()` the moment they are called and then hold the
event loop for `HOLD_S` (as a program doing CPU work before its first await would), and
a command that prints the time it started. The second in-process program and the
command can only start after the first program's hold, so a `startedAt` stamped anywhere
but at the real start would be off by at least `HOLD_S`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from support import async_wait_until, daemon_with

from anyrtd.client import ServerClient, Upsert
from anyrtd.clock import SystemClock
from anyrtd.config import CommandProgram, Config
from anyrtd.daemon import Daemon
from anyrtd.program import ProgramContext
from anyrtd.runner import Runner

HOLD_S = 1.0
ROUNDING_S = 0.0005
"""A record carries its times to the millisecond: `startedAt` may be rounded up by this."""
NOTE_TIME = "import json, time; print(json.dumps({'title': repr(time.time())}))"


async def test_a_run_record_says_when_its_program_really_started(
    devserver: Any, tmp_path: Path
) -> None:
    saw: dict[str, float] = {}

    async def hold(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        assert ctx.trigger_id is not None
        saw[ctx.trigger_id] = time.time()
        time.sleep(HOLD_S)  # noqa: ASYNC251 - it holds the loop: nothing else starts meanwhile

    client = ServerClient(devserver.url)
    runner = Runner(
        client=client,
        clock=SystemClock(),
        agent_name="bao",
        space="bao",
        commands={"test:stamp@v1": CommandProgram(argv=(sys.executable, "-S", "-c", NOTE_TIME))},
        extra_builtins={"test:hold@v1": hold},
    )
    config = Config(server=devserver.url, state_dir=tmp_path / "state", tick_s=0.2)
    daemon = Daemon(config, client=client, runner=runner)
    user = ServerClient(devserver.url)
    ids = {"a-hold": "test:hold@v1", "b-hold": "test:hold@v1", "c-stamp": "test:stamp@v1"}
    try:
        await daemon.start()
        places = await async_wait_until(
            lambda: asyncio.sleep(0, daemon.places), what="the daemon to resolve"
        )
        at = time.time() + 2.0
        await user.upsert(
            places.triggers,
            [
                Upsert(
                    rid,
                    {
                        "kind": "once",
                        "spec": {"at": at},
                        "program": program,
                        "owner": daemon.peer_id,
                    },
                )
                for rid, program in ids.items()
            ],
        )

        async def recorded() -> list[dict[str, Any]] | None:
            runs = [r for r in await user.query_all(places.runs) if r["triggerId"] in ids]
            return runs if len(runs) == len(ids) else None

        runs = await async_wait_until(recorded, timeout=30.0, what="three run records")
        by_trigger = {r["triggerId"]: r for r in runs}
        assert {r["status"] for r in runs} == {"ok"}, runs
        saw["c-stamp"] = float(by_trigger["c-stamp"]["title"])
        lags = sorted(r["startedAt"] - r["scheduledAt"] for r in runs)
        for rid, record in by_trigger.items():
            # The record's start is the program's start: never after what the program saw,
            # and closer to it than the hold that made one of them start late.
            assert record["startedAt"] <= saw[rid] + ROUNDING_S, (rid, record, saw[rid])
            assert saw[rid] - record["startedAt"] < HOLD_S, (rid, record, saw[rid])
            assert record["durationMs"] == round(
                (record["endedAt"] - record["startedAt"]) * 1000
            ), record
        # One of the two held programs started after the other's hold, and says so.
        held = sorted(by_trigger[rid]["startedAt"] for rid in ("a-hold", "b-hold"))
        assert held[1] - held[0] >= HOLD_S - 2 * ROUNDING_S
        # /metrics' fire lag measures the same thing as the records.
        observed = sorted(daemon.stats.fire_lag.recent[-len(ids) :])
        assert len(observed) == len(ids)
        for seen, claimed in zip(observed, lags, strict=True):
            assert abs(seen - claimed) <= 2 * ROUNDING_S, (observed, lags)
    finally:
        await daemon.stop()
        await user.aclose()


BURST = 20


async def test_a_due_batch_starts_every_program_before_any_runs_other_work(
    devserver: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anyrtd")
    # What each program saw when called: the batch's budget timers and "firing" lines so far.
    seen: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def note(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        budgets = sum(
            1 for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Runner._budget"
        )
        firing = sum(1 for r in caplog.records if r.getMessage().startswith("firing "))
        seen.append((budgets, firing))
        if len(seen) == BURST:
            done.set()

    daemon = daemon_with(devserver.url, tmp_path / "state", {"test:note@v1": note})
    user = ServerClient(devserver.url)
    try:
        await daemon.start()
        places = await async_wait_until(
            lambda: asyncio.sleep(0, daemon.places), what="the daemon to resolve"
        )
        at = time.time() + 2.0
        fields = {"kind": "once", "spec": {"at": at}, "program": "test:note@v1"}
        await user.upsert(
            places.triggers,
            [Upsert(f"n{i:02d}", {**fields, "owner": daemon.peer_id}) for i in range(BURST)],
        )
        async with asyncio.timeout(30):
            await done.wait()
        # Every program of the batch began before any run of it had its budget timer or
        # its log line: starting them cost only the creation of their tasks.
        assert seen == [(0, 0)] * BURST
        await async_wait_until(
            lambda: asyncio.sleep(
                0, sum(r.getMessage().startswith("firing ") for r in caplog.records) == BURST
            ),
            what="the batch's log lines",
        )
    finally:
        await daemon.stop()
        await user.aclose()
