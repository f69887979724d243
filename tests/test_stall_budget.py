"""A stall is not a failure: the time the daemon was held up (stopped, its loop blocked) is
not counted in a run's budget (issue 23, item 10). The SIGSTOP of a real daemon is in
tests/test_stall.py."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import run_of

from anyrtd.client import ServerClient
from anyrtd.clock import SystemClock
from anyrtd.config import CommandProgram
from anyrtd.rows import RunRow
from anyrtd.runner import Runner
from anyrtd.runner.budget import BEAT_S
from anyrtd.vocab import RunStatus

pytestmark = pytest.mark.process  # the programs are real processes


@pytest.fixture
async def client() -> AsyncIterator[ServerClient]:
    c = ServerClient("http://127.0.0.1:9")
    try:
        yield c
    finally:
        await c.aclose()


def runner(client: ServerClient, code: str, budget_s: float) -> Runner:
    program = CommandProgram(argv=(sys.executable, "-c", code))
    return Runner(
        client=client,
        clock=SystemClock(),
        agent_name="bao",
        space="s",
        commands={"mine:p@v1": program},
        timeout_s=budget_s,
    )


def request() -> tuple[RunRow, dict[str, Any]]:
    return run_of("mine:p@v1", run_id="r1", trigger_id="t", device="d")


def hold_the_loop(seconds: float) -> None:
    """Hold the event loop as a stopped daemon's is held: nothing of it runs meanwhile."""
    time.sleep(seconds)  # the stall itself, not a wait for anything


async def started(flag: asyncio.Event) -> None:
    async with asyncio.timeout(20):
        await flag.wait()


async def test_a_run_that_ended_while_the_daemon_was_held_up_is_not_past_its_budget(
    client: ServerClient,
) -> None:
    run = runner(client, "import time; time.sleep(0.3)", budget_s=1.0)
    began = asyncio.Event()
    task = asyncio.create_task(run.run(*request(), on_start=lambda _at: began.set()))
    await started(began)
    hold_the_loop(2.0)  # the program ends meanwhile; the budget's time passes too
    out = await asyncio.wait_for(task, 20)
    assert (out.status, out.error_type) == (RunStatus.OK, None)


async def test_a_stall_does_not_hide_a_run_that_overruns_its_budget(client: ServerClient) -> None:
    run = runner(client, "import time; time.sleep(60)", budget_s=1.0)
    began = asyncio.Event()
    task = asyncio.create_task(run.run(*request(), on_start=lambda _at: began.set()))
    await started(began)
    hold_the_loop(2.5)
    out = await asyncio.wait_for(task, 20)
    assert (out.status, out.error_type) == (RunStatus.INCOMPLETE, "BudgetExceeded")
    # The budget counted the watched time only: the stall (less at most one beat, when it
    # is noticed) came on top of the budget's second.
    assert out.duration_ms >= 1000 + 2500 - BEAT_S * 1000 - 200
