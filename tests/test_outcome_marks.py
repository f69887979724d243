"""A command that ends while the daemon is dead (kill -9) is recorded with its real exit
status and end time, from its supervisor's end mark, not as `interrupted`."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from control_support import ServeProcess
from support import put_triggers, server_runs, wait_until
from test_leftover_groups import open_group

LINUX = Path("/proc/sys/kernel/random/boot_id").exists()
pytestmark = pytest.mark.skipif(not LINUX, reason="the runs' process groups are read from /proc")


def test_a_command_that_ended_while_the_daemon_was_dead_is_recorded_as_it_ended(
    devserver: Any, tmp_path: Path
) -> None:
    ended = tmp_path / "ended"
    go = tmp_path / "go"
    # It waits for the daemon to be gone, then ends on its own with status 3, noting when.
    script = (
        f"while [ ! -e {go} ]; do sleep 0.02; done; "
        f"python3 -c 'import time; print(time.time())' > {ended}; exit 3"
    )
    argv = ["/bin/sh", "-c", script]
    serve = ServeProcess(
        tmp_path,
        devserver.url,
        config_lines=(f'[programs."test:late@v1"]\nargv = {json.dumps(argv)}',),
    )
    serve.start()
    try:
        put_triggers(
            devserver.url,
            {
                "late": {
                    "kind": "once",
                    "spec": {"at": time.time() - 1},
                    "program": "test:late@v1",
                    "owner": "",
                    "enabled": True,
                }
            },
        )
        mirror = serve.state / "anyrtd.sqlite3"
        run_id, _ = wait_until(lambda: open_group(mirror), timeout=30, what="the run's group")
        proc, serve.proc = serve.proc, None
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        go.touch()
        marks = serve.state / "anyrtd.runs"
        wait_until(lambda: (marks / f"{run_id}.ended").exists(), timeout=30, what="the end mark")
        at = float(ended.read_text())

        serve.start()
        (record,) = wait_until(
            lambda: [r for r in server_runs(devserver.url, "late") if r.get("endedAt")],
            timeout=30,
            what="the run record",
        )
        assert record["runId"] == run_id
        assert (record["status"], record["errorType"]) == ("FAILED", "ExitCode")
        with contextlib.closing(sqlite3.connect(f"file:{mirror}?mode=ro", uri=True)) as conn:
            (error, output) = conn.execute(
                "SELECT error, output FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        assert "exited with status 3" in error
        assert "its output was not kept" in output
        assert abs(record["endedAt"] - at) < 0.1  # the mark's time, to the file system's tick
        assert not list(marks.iterdir())  # removed once the outcome is in the mirror
    finally:
        serve.stop()
