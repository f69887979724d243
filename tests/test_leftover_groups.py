"""After kill -9 of the daemon, the next start stops what its command programs left running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_support import ServeProcess
from support import put_triggers, server_runs, wait_until

from anyrtd.client import ServerClient
from anyrtd.clock import SystemClock
from anyrtd.firing import Firing
from anyrtd.metrics import Stats
from anyrtd.missed import Skips
from anyrtd.records import RecordCache
from anyrtd.registry import Registry
from anyrtd.rows import RunRow
from anyrtd.runner import Runner
from anyrtd.runner.process import (
    group_members,
    kill_group,
    leftover_group,
    process_start,
    run_groups,
)
from anyrtd.unit import Unit

LINUX = Path("/proc/sys/kernel/random/boot_id").exists()
pytestmark = pytest.mark.skipif(not LINUX, reason="a process's start time is read from /proc")


@pytest.fixture
def group() -> Iterator[subprocess.Popen[bytes]]:
    """A `sleep` leading a process group of its own, with a second member; killed at the end."""
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)
    wait_until(lambda: group_members(proc.pid) == 2, timeout=10, what="both members")
    yield proc
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_group_is_known_by_its_leaders_start_not_its_id_alone(
    group: subprocess.Popen[bytes],
) -> None:
    started = process_start(group.pid)
    assert started is not None
    assert leftover_group(group.pid, started)
    boot, _, ticks = started.partition(":")
    # The same id, started at another time: a later process that was given the id.
    assert not leftover_group(group.pid, f"{boot}:{int(ticks) + 1}")
    assert not leftover_group(group.pid, None)
    assert group_members(group.pid) == 2  # nothing was signalled


async def test_a_group_whose_leader_exited_is_still_stopped(
    group: subprocess.Popen[bytes],
) -> None:
    started = process_start(group.pid)
    os.kill(group.pid, signal.SIGKILL)  # the leader goes; its background member stays
    group.wait()
    wait_until(lambda: group_members(group.pid) == 1, timeout=10, what="the leader to go")
    assert leftover_group(group.pid, started)
    # On another boot, that id means nothing any more.
    assert not leftover_group(group.pid, f"another-boot:{started.partition(':')[2]}")
    assert await kill_group(group.pid, 1.0) == 1
    assert group_members(group.pid) == 0
    assert not leftover_group(group.pid, started)


def start_group(run_id: str) -> subprocess.Popen[bytes]:
    """Start a two-member group with `ANYRTD_RUN_ID` set, as the runner starts a command."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 60 & exec sleep 60"],
        start_new_session=True,
        env={**os.environ, "ANYRTD_RUN_ID": run_id},
    )
    wait_until(lambda: group_members(proc.pid) == 2, timeout=10, what="both members")
    return proc


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def firing(tmp_path: Path) -> Firing:
    runner = Runner(
        client=ServerClient("http://127.0.0.1:9"),
        clock=SystemClock(),
        agent_name="bao",
        space="bao",
        commands={},
        kill_grace_s=0.2,
    )
    records = RecordCache()
    return Firing(
        registry=Registry(),
        records=records,
        unit=Unit(records, on_outbox=lambda: None),
        runner=runner,
        stats=Stats(),
        clock=SystemClock(),
        skips=Skips(),
    )


def open_row(run_id: str, **kw: Any) -> RunRow:
    return RunRow(run_id, None, "test:x@v1", "me", None, time.time() - 5, **kw)


async def test_a_run_whose_group_was_not_kept_yet_is_found_by_its_run_id(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    # A crash between the start of the command and the write of its group: the group is
    # found by the run id the runner put in the command's environment.
    mine, other = start_group("run-crashed"), start_group("run-of-someone-else")
    started += [mine, other]
    assert run_groups(["run-crashed", "nobody"]) == {"run-crashed": {mine.pid}}
    row = open_row("run-crashed")
    await firing(tmp_path).close_interrupted([row], time.time())
    assert group_members(mine.pid) == 0
    assert group_members(other.pid) == 2
    assert row.status == "interrupted"
    assert row.output == (
        "anyrtd: the program was still running when the daemon started again; it was "
        f"stopped (process group {mine.pid}, 2 process(es))\n"
    )


async def test_a_kept_group_without_its_start_time_is_found_by_its_run_id(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    # The command exited before its start time was read: the row keeps its group but no
    # start time. What the command left in its group is still found, by its run id, and
    # stopped; a stranger's group under the same id is not.
    mine, other = start_group("run-quick"), start_group("run-of-someone-else")
    started += [mine, other]
    row = open_row("run-quick", process_group=other.pid, process_start=None)
    await firing(tmp_path).close_interrupted([row], time.time())
    assert group_members(mine.pid) == 0
    assert group_members(other.pid) == 2
    assert row.status == "interrupted" and "stopped (process group" in row.output


async def test_a_kept_group_whose_leader_id_was_given_to_another_process_is_left_alone(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    stranger = start_group("run-other")
    started.append(stranger)
    boot, _, ticks = (process_start(stranger.pid) or "").partition(":")
    row = open_row("run-old", process_group=stranger.pid, process_start=f"{boot}:{int(ticks) - 1}")
    await firing(tmp_path).close_interrupted([row], time.time())
    assert group_members(stranger.pid) == 2
    assert row.status == "interrupted" and row.output == ""


@pytest.fixture
def pids(tmp_path: Path) -> Iterator[Path]:
    """A file the test programs append their pids to; every group in it is killed at the end."""
    path = tmp_path / "pids"
    path.touch()
    yield path
    for line in path.read_text().split():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(int(line)), signal.SIGKILL)


def open_group(mirror: Path) -> tuple[str, int] | None:
    """Return the open run and its process group once the mirror holds it."""
    with contextlib.closing(sqlite3.connect(f"file:{mirror}?mode=ro", uri=True)) as conn:
        row = conn.execute(
            "SELECT run_id, process_group FROM runs "
            "WHERE status = 'running' AND process_group IS NOT NULL"
        ).fetchone()
    return (str(row[0]), int(row[1])) if row else None


def test_a_restart_after_kill_9_stops_the_process_group_its_command_left_running(
    devserver: Any, tmp_path: Path, pids: Path
) -> None:
    # The program ignores SIGTERM, and leaves a grandchild in its group: only SIGKILL of
    # the whole group ends it.
    argv = ["/bin/sh", "-c", f"trap '' TERM; echo $$ >> {pids}; sleep 120 & wait"]
    serve = ServeProcess(
        tmp_path,
        devserver.url,
        config_lines=(f'[programs."test:linger@v1"]\nargv = {json.dumps(argv)}',),
    )
    serve.start()
    try:
        put_triggers(
            devserver.url,
            {
                "linger": {
                    "kind": "once",
                    "spec": {"at": time.time() - 1},
                    "program": "test:linger@v1",
                    "owner": "",
                    "enabled": True,
                }
            },
        )
        mirror = serve.state / "anyrtd.sqlite3"
        run_id, pgid = wait_until(
            lambda: open_group(mirror), timeout=30, what="the run's process group in the mirror"
        )
        # The group is kept at the spawn: the shell may not have run its first line yet. Its
        # leader is the run's supervisor, which runs the program in the same group.
        wait_until(
            lambda: len(pids.read_text().split()) == 1 and group_members(pgid) == 3,
            timeout=30,
            what="the supervisor, the program and its grandchild to run",
        )
        assert os.getpgid(int(pids.read_text())) == pgid
        proc, serve.proc = serve.proc, None
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert group_members(pgid) == 3  # the program and its grandchild outlived the daemon

        offset = serve.log.stat().st_size
        serve.start()
        wait_until(lambda: group_members(pgid) == 0, timeout=30, what="the group to be stopped")
        log = serve.log.read_text()[offset:]
        assert (
            f"run {run_id} of linger: its program was still running after the crash "
            f"(process group {pgid}, 3 process(es)): stopped it" in log
        )
        # Before anything fired: the group was stopped while the mirror was opened.
        assert log.index(f"process group {pgid}") < log.index(" opened: ")
        (record,) = wait_until(
            lambda: [r for r in server_runs(devserver.url, "linger") if r.get("endedAt")],
            timeout=30,
            what="the interrupted run record",
        )
        assert record["status"] == "interrupted"
    finally:
        serve.stop()
