"""A mirror deleted under a running daemon that has runs in flight: a real `anyrtd serve`.

It stops with exit status 65 and one error line, no task exception left unretrieved and no
traceback, and it stops the runs in flight, naming each one it could not record."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from support import put_triggers, wait_until

from anyrtd.mirror_guard import EXIT_BROKEN_STATE

SLEEPERS = 6


@pytest.fixture
def serve(tmp_path: Path, devserver: DevserverProcess) -> Iterator[ServeProcess]:
    pids = tmp_path / "pids"
    lines = (
        '[programs."test:nap@v1"]',
        f'argv = ["/bin/sh", "-c", "echo $$ >> {pids}; exec sleep 30"]',
    )
    proc = ServeProcess(tmp_path, devserver.url, config_lines=lines)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.process
def test_a_mirror_deleted_with_runs_in_flight_stops_with_one_error_and_no_task_exceptions(
    serve: ServeProcess, devserver: DevserverProcess, tmp_path: Path
) -> None:
    put_triggers(
        devserver.url,
        {
            f"nap-{i}": {
                "name": f"nap {i}",
                "kind": "cron",
                "spec": {"every_s": 1},
                "program": "test:nap@v1",
                "owner": "",
                "enabled": True,
            }
            for i in range(SLEEPERS)
        },
    )
    serve.start()
    pids = tmp_path / "pids"
    wait_until(
        lambda: pids.exists() and len(pids.read_text().split()) >= SLEEPERS,
        timeout=60,
        what="every trigger's run in flight",
    )
    assert serve.proc is not None
    for f in serve.state.glob("anyrtd.sqlite3*"):
        f.unlink()

    assert serve.proc.wait(timeout=60) == EXIT_BROKEN_STATE
    log = serve.log.read_text()
    assert "Task exception was never retrieved" not in log
    assert "Traceback" not in log
    lines = log.splitlines()
    assert lines[-1].startswith(f"Error: the mirror {serve.state / 'anyrtd.sqlite3'} was deleted")
    assert [line for line in lines if " ERROR " in line] == []  # the one error is the last line
    # every run in flight was stopped, and its end is in the log, saying it is not recorded
    fired = set(re.findall(r"firing nap-\d \(test:nap@v1\) trigger=nap-\d run=(\w+)", log))
    unrecorded = set(
        re.findall(r"run (\w+) of nap-\d ended \w+; not recorded: the mirror cannot be used", log)
    )
    assert len(fired) >= SLEEPERS
    assert unrecorded == fired
    for pid in pids.read_text().split():
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
