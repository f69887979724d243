"""A second stop signal during the grace period stops at once (issue 14): the runs still in
flight are recorded `interrupted` instead of being waited for."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

from control_support import ServeProcess
from support import put_triggers, server_runs, wait_until

GRACE_S = 600.0
"""Far longer than the test: only the second signal can end the wait."""


def running_runs(mirror: Path) -> int:
    """Return how many runs the mirror holds open."""
    with sqlite3.connect(f"file:{mirror}?mode=ro", uri=True) as conn:
        (count,) = conn.execute("SELECT count(*) FROM runs WHERE status = 'running'").fetchone()
    return int(count)


def test_a_second_stop_signal_interrupts_the_runs_in_flight_at_once(
    devserver: Any, tmp_path: Path
) -> None:
    argv = ["/bin/sh", "-c", "sleep 300"]
    serve = ServeProcess(
        tmp_path,
        devserver.url,
        grace_s=GRACE_S,
        config_lines=(f'[programs."test:long@v1"]\nargv = {json.dumps(argv)}',),
    )
    serve.start()
    try:
        put_triggers(
            devserver.url,
            {
                "long": {
                    "kind": "once",
                    "spec": {"at": time.time() - 1},
                    "program": "test:long@v1",
                    "owner": "",
                    "enabled": True,
                }
            },
        )
        mirror = serve.state / "anyrtd.sqlite3"
        wait_until(lambda: running_runs(mirror) == 1, timeout=30, what="the run to start")
        proc = serve.proc
        assert proc is not None
        offset = serve.log.stat().st_size
        proc.send_signal(signal.SIGTERM)
        wait_until(
            lambda: "stop again: now" in serve.log.read_text()[offset:],
            timeout=30,
            what="the daemon to wait for its run",
        )
        assert proc.poll() is None  # the grace period holds it: the run is still in flight
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        serve.proc = None
        log = serve.log.read_text()[offset:]
        assert "a second stop signal: interrupting the runs in flight now" in log
        assert "interrupting 1 runs still in flight" in log
        (record,) = wait_until(
            lambda: [r for r in server_runs(devserver.url, "long") if r.get("endedAt")],
            timeout=30,
            what="the run record on the server",
        )
        assert record["status"] == "interrupted"
    finally:
        serve.stop()
