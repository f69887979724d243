"""Fix hints that fix, through the real `anyrtd` command against `anyrtd serve` on a
devserver: a reminder whose chat does not exist is warned of when it is written, its run
fails in one line in the user's words (no traceback, no server API path), and `why` gives
the edit that fixes it (not `enable`, which would fail again); that edit does fix it."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from support import wait_until
from test_cli_checked_writes import cli

pytestmark = pytest.mark.process


@pytest.fixture
def served(devserver: DevserverProcess, tmp_path: Path) -> Iterator[ServeProcess]:
    proc = ServeProcess(tmp_path, devserver.url)
    try:
        yield proc.start()
    finally:
        proc.stop()


def test_a_reminder_to_a_missing_chat_gets_a_fix_that_fixes(
    served: ServeProcess, devserver: DevserverProcess, tmp_path: Path
) -> None:
    url, listen = devserver.url, served.listen

    def run(*args: str) -> Any:
        return cli(tmp_path, url, *args, listen=listen)

    made = (
        "triggers", "create", "--id", "broken", "--every", "3600", "--program",
        "agent:remind@v1", "--arg", "text=standup", "--arg", "chatId=no-such-chat",
        "--max-failures", "1",
    )  # fmt: skip
    asked = run(*made)
    assert asked.returncode == 1, asked
    assert "warning: chat no-such-chat does not exist in space bao" in asked.stderr
    assert "every run of agent:remind@v1 would fail" in asked.stderr
    created = run(*made, "--yes")
    assert created.returncode == 0, created.stderr

    def adopted() -> bool:
        with served.http() as c:
            resp = c.get("/triggers/broken")
        return resp.status_code == 200 and resp.json()["state"] == "scheduled"

    wait_until(adopted, timeout=30, what="broken to be armed")
    failed = run("triggers", "run", "broken", "--wait", "--timeout", "30", "--json")
    assert failed.returncode == 1, failed
    result = json.loads(failed.stdout)
    assert result["status"] == "FAILED" and result["errorType"] == "ChatNotFound", result
    said = "chat no-such-chat does not exist in space bao: set args.chatId to a chat"
    assert said in result["error"]
    shown = run("runs", "show", result["runId"])
    assert "Traceback" not in shown.stdout and "/v1/spaces" not in shown.stdout, shown.stdout
    assert [line for line in shown.stdout.splitlines() if said in line], shown.stdout

    def tripped() -> dict[str, Any] | None:
        with served.http() as c:
            why: dict[str, Any] = c.get("/triggers/broken/why").json()
        return why if why["state"] == "auto_disabled" else None

    why = wait_until(tripped, timeout=30, what="the breaker to trip")
    (reason,) = [r for r in why["reasons"] if r["blocking"]]
    fix = reason["fix"]
    assert fix.startswith("anyrtd triggers edit broken --args-json "), fix
    assert fix.endswith(" && anyrtd triggers enable broken"), fix
    text = run("triggers", "why", "broken")
    assert f"fix:  {fix}" in text.stdout

    # the fix, run as printed, fixes it: the next run posts to the general chat
    for part in fix.split(" && "):
        argv = shlex.split(part)
        assert argv[0] == "anyrtd"
        done = run(*argv[1:])
        assert done.returncode == 0, (part, done.stderr)

    def enabled() -> bool:
        with served.http() as c:
            t = c.get("/triggers/broken").json()
        return bool(t["enabled"]) and t["state"] == "scheduled" and "chatId" not in t["args"]

    wait_until(enabled, timeout=30, what="broken to be enabled with the fixed args")
    ok = run("triggers", "run", "broken", "--wait", "--timeout", "30", "--json")
    assert ok.returncode == 0, ok.stdout
    assert json.loads(ok.stdout)["status"] == "ok"
