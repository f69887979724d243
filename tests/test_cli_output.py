"""What the CLI prints about a run the daemon did not see end: a real daemon is killed in the
middle of a run, started again, and `anyrtd runs show` says why the run was closed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import wait_until

SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"


def anyrtd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*anyrtd_command(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


@pytest.mark.process  # it starts a real program
def test_an_interrupted_run_shows_why_without_an_empty_error_type(tmp_path: Path) -> None:
    pid_file = tmp_path / "program.pid"
    devserver = DevserverProcess(tmp_path / "dev.sqlite3", [], tmp_path / "devserver.log")
    served = ServeProcess(
        tmp_path,
        "",
        config_lines=(
            '[programs."test:sleep@v1"]',
            f'argv = ["{sys.executable}", "-c", "{SLEEPER}", "{pid_file}"]',
        ),
    )
    try:
        devserver.start()
        served.server_url = devserver.url
        served.start()
        env = {
            # The daemon's own config: the CLI checks the program against this device's table.
            "ANYRTD_CONFIG": str(served.config),
            "ANYRTD_SERVER": devserver.url,
            "ANYRTD_LISTEN": served.listen,
        }
        made = anyrtd(
            env, "triggers", "create", "--id", "sleepy", "--every", "3600", "--program",
            "test:sleep@v1",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        wait_until(
            lambda: anyrtd(env, "triggers", "run", "sleepy").returncode == 0,
            timeout=30,
            what="the daemon to adopt the trigger and start a run",
        )
        wait_until(pid_file.exists, timeout=30, what="the program to start")
        listed = anyrtd(env, "runs", "list", "--trigger", "sleepy", "--json")
        run_id = next(r["runId"] for r in json.loads(listed.stdout))

        assert served.proc is not None
        os.killpg(served.proc.pid, signal.SIGKILL)
        served.proc.wait()
        served.proc = None
        served.start()

        def closed() -> str | None:
            shown = anyrtd(env, "runs", "show", run_id)
            lines = [line.split() for line in shown.stdout.splitlines()]
            return shown.stdout if ["status:", "interrupted"] in lines else None

        text = wait_until(closed, timeout=30, what="the restarted daemon to close the run")
        error = next(line for line in text.splitlines() if line.startswith("error:"))
        assert error.split(None, 1)[1] == "the daemon stopped while the run was in flight"
    finally:
        served.stop()
        devserver.stop()
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
