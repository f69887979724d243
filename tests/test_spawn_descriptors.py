"""A command the daemon cannot start for want of file descriptors is the daemon's fault.

The descriptors run out for real here: the test lowers this process's soft
`RLIMIT_NOFILE` a little above what it holds and fills the rest with `/dev/null`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from support import run_of

from anyrtd.client import ServerClient
from anyrtd.clock import SystemClock
from anyrtd.config import CommandProgram
from anyrtd.rows import RunRow
from anyrtd.runner import Runner
from anyrtd.runs import DAEMON_FAULT, rollup

PY = sys.executable
ECHO = CommandProgram(argv=(PY, "-c", "print('started')"))


@contextlib.contextmanager
def no_descriptors_left() -> Iterator[Callable[[], None]]:
    """Take every descriptor this process may still open; yield what gives them back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []

    def release() -> None:
        while held:
            os.close(held.pop())

    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 32, hard))
    try:
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        yield release
    finally:
        release()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
async def client() -> AsyncIterator[ServerClient]:
    c = ServerClient("http://127.0.0.1:9")  # nothing listens there: no program reaches it
    try:
        yield c
    finally:
        await c.aclose()


def runner(client: ServerClient, timeout_s: float) -> Runner:
    return Runner(
        client=client,
        clock=SystemClock(),
        agent_name="bao",
        space="bao-space",
        commands={"test:echo@v1": ECHO},
        timeout_s=timeout_s,
    )


def request() -> tuple[RunRow, dict[str, Any]]:
    return run_of("test:echo@v1", scheduled_at=time.time())


async def test_a_spawn_out_of_descriptors_waits_and_starts_when_they_come_back(
    client: ServerClient,
) -> None:
    run = runner(client, timeout_s=30)
    assert run.resolve("test:echo@v1") is not None  # as the daemon has, at adoption
    with no_descriptors_left() as release:
        freed: list[float] = []

        def give_back() -> None:
            freed.append(time.time())
            release()

        asyncio.get_running_loop().call_later(0.3, give_back)
        outcome = await run.run(*request())
    assert outcome.status == "ok", (outcome.error_type, outcome.error, outcome.output)
    assert "started" in outcome.output
    # Its start is the moment it really started, not the first try.
    assert freed and outcome.started_at >= freed[0]


async def test_a_spawn_out_of_descriptors_for_the_whole_budget_is_the_daemons_fault(
    client: ServerClient,
) -> None:
    run = runner(client, timeout_s=0.5)
    assert run.resolve("test:echo@v1") is not None
    with no_descriptors_left():
        outcome = await run.run(*request())
    assert outcome.status == "FAILED"
    assert outcome.error_type == DAEMON_FAULT
    assert outcome.error is not None and "file descriptors" in outcome.error
    assert "LimitNOFILE" in outcome.error


async def test_a_program_lookup_out_of_descriptors_is_the_daemons_fault(
    client: ServerClient,
) -> None:
    run = runner(client, timeout_s=0.5)  # nothing resolved yet: the lookup reads files
    with no_descriptors_left():
        outcome = await run.run(*request())
    assert outcome.status == "FAILED"
    assert outcome.error_type == DAEMON_FAULT, (outcome.error_type, outcome.error)


@pytest.mark.parametrize("before", [0, 1])
def test_a_run_the_daemon_could_not_start_moves_the_breaker_neither_way(before: int) -> None:
    row = RunRow(
        run_id="r1",
        trigger_id="t",
        program="test:echo@v1",
        device="12D3KooWdevice",
        scheduled_at=1_800_000_000.0,
        started_at=1_800_000_000.25,
        status="FAILED",
        error_type=DAEMON_FAULT,
    )
    write = rollup(row, failures=before, run_count=4, limit=2, armed=True)
    assert write.failures == before and not write.tripped and "enabled" not in write.fields
    assert write.fields["consecutiveFailures"] == before
