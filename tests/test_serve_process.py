"""`anyrtd serve` as a real process: kill -9 mid-run, SIGTERM with runs in flight, restarts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_support import TICK, ServeProcess
from support import World, wait_until


def program_table(programs: dict[str, list[str]]) -> tuple[str, ...]:
    """Return the config lines that declare `programs` as commands."""
    return tuple(
        f'[programs."{name}"]\nargv = {json.dumps(argv)}' for name, argv in programs.items()
    )


def serve_with(tmp: Path, server_url: str, programs: dict[str, list[str]]) -> ServeProcess:
    return ServeProcess(tmp, server_url, config_lines=program_table(programs)).start()


def signal_and_wait(serve: ServeProcess, sig: int) -> int:
    """Send `sig` to the daemon and return its exit status."""
    proc, serve.proc = serve.proc, None
    assert proc is not None
    proc.send_signal(sig)
    return proc.wait(timeout=30)


def last_tick(serve: ServeProcess) -> float:
    with serve.http() as client:
        at: float = client.get("/healthz").json()["lastTickAt"]
    return at


def wait_ticks(serve: ServeProcess, n: int) -> None:
    """Wait until the daemon has run `n` more reconciles."""
    start = last_tick(serve)
    wait_until(lambda: last_tick(serve) >= start + n * TICK, timeout=30, what=f"{n} more ticks")


@pytest.fixture
def pids(tmp_path: Path) -> Iterator[Path]:
    """A file the test programs append their pids to; every pid in it is killed at teardown."""
    path = tmp_path / "pids"
    path.touch()
    yield path
    for line in path.read_text().split():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(line), signal.SIGKILL)


def sleeper(pids: Path, seconds: int) -> list[str]:
    return ["/bin/sh", "-c", f"echo $$ >> {pids}; exec sleep {seconds}"]


def test_kill_9_mid_run_closes_the_run_as_interrupted_and_never_refires_the_once(
    devserver: Any, world: World, tmp_path: Path, pids: Path
) -> None:
    serve = serve_with(tmp_path, devserver.url, {"test:sleep@v1": sleeper(pids, 60)})
    try:
        world.put(
            "standup", kind="once", spec={"at": time.time() - 5}, program="test:sleep@v1", owner=""
        )
        wait_until(lambda: pids.read_text().strip(), timeout=30, what="the program to start")
        assert signal_and_wait(serve, signal.SIGKILL) == -signal.SIGKILL
        serve.start()
        wait_until(
            lambda: [r["status"] for r in world.runs("standup")] == ["interrupted"],
            timeout=30,
            what="the interrupted run record",
        )
        wait_ticks(serve, 10)
        assert len(world.runs("standup")) == 1
        assert len(pids.read_text().split()) == 1  # the program never started again
        record = world.record("standup")
        assert record["enabled"] is False and record["lastStatus"] == "interrupted"
        assert record["consecutiveFailures"] == 0  # an interruption is not a failure
    finally:
        serve.stop()


def test_sigterm_lets_short_runs_finish_and_interrupts_the_rest(
    devserver: Any, world: World, tmp_path: Path, pids: Path
) -> None:
    serve = serve_with(
        tmp_path,
        devserver.url,
        {
            "test:short@v1": ["/bin/sh", "-c", f"echo $$ >> {pids}; sleep 0.3; echo done"],
            "test:long@v1": sleeper(pids, 60),
        },
    )
    try:
        at = time.time() - 1
        world.put("short", kind="once", spec={"at": at}, program="test:short@v1", owner="")
        world.put("long", kind="once", spec={"at": at}, program="test:long@v1", owner="")
        wait_until(
            lambda: len(pids.read_text().split()) == 2, timeout=30, what="both programs to start"
        )
        assert signal_and_wait(serve, signal.SIGTERM) == 0
        assert [r["status"] for r in world.runs("short")] == ["ok"]
        assert [r["status"] for r in world.runs("long")] == ["interrupted"]
        for pid in pids.read_text().split():  # nothing of either program is left behind
            with pytest.raises(ProcessLookupError):
                os.killpg(int(pid), 0)
    finally:
        serve.stop()


def test_a_restart_keeps_firing_from_the_mirror_while_the_server_is_away(
    devserver: Any, world: World, tmp_path: Path, pids: Path
) -> None:
    serve = serve_with(
        tmp_path,
        devserver.url,
        {
            "test:mark@v1": ["/bin/sh", "-c", f"echo $$ >> {pids}"],
        },
    )
    try:
        world.put("beat", kind="cron", spec={"every_s": 1}, program="test:mark@v1", owner="")
        wait_until(
            lambda: world.record("beat").get("runCount", 0) >= 1, timeout=30, what="the first run"
        )
        assert signal_and_wait(serve, signal.SIGTERM) == 0
        devserver.stop()
        serve.start()  # the server is down: the registry comes back from the mirror
        fired = len(pids.read_text().split())
        wait_until(
            lambda: len(pids.read_text().split()) >= fired + 2,
            timeout=30,
            what="fires while the server is away",
        )
        devserver.restart()
        assert signal_and_wait(serve, signal.SIGTERM) == 0
        serve.server_url = devserver.url
        serve.start()
        world.url = devserver.url
        wait_until(
            lambda: len(world.runs("beat")) >= len(pids.read_text().split()) - 1,
            timeout=30,
            what="the runs made offline to reach the server",
        )
        ids = [r["runId"] for r in world.runs("beat")]
        assert len(ids) == len(set(ids))
    finally:
        serve.stop()
