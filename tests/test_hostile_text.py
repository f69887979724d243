"""Synced data with control characters (ids, names, run output) reaches neither the terminal
nor the log raw: the real `anyrtd` command line and a real `anyrtd serve` on a real
devserver, with records written straight to the server (they never pass the door that
`triggers create` is)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import put_triggers, wait_until

pytestmark = pytest.mark.process

PY = sys.executable

ATTACK = (
    "\x1b[2J\x1b[H"  # clear the screen
    "\x1b]52;c;aGFja2Vk\x07"  # OSC 52: set the clipboard, ended by BEL
    "\x1b[31mred"
    "\u202eesrever"  # right-to-left override
    "\x9b2J"  # C1 CSI
    "\x7f\x08"
)
FORGED = "2026-12-02T00:00:00.000+00:00 INFO anyrtd.daemon: forged"
HOSTILE_ID = "evil" + ATTACK + "\n" + FORGED
"""An id written straight to the server, past every door (argv takes no NUL): the daemon
skips its record as malformed, and says so in one escaped log line."""
HOSTILE_NAME = "name" + ATTACK + "\x00\r\n" + FORGED
HOSTILE_OUTPUT = "out" + ATTACK + "\x00 cr\r\n" + FORGED + "\nthe end\n"
PLAIN_ID = "plain-hostile"

RAW = re.compile(
    rb"[\x00-\x08\x0b-\x1f\x7f]"  # C0 but newline and tab, and DEL
    rb"|\xc2[\x80-\x9f]"  # C1, as UTF-8
    rb"|\xe2\x80[\x8b-\x8f\xa8-\xae]|\xe2\x81[\xa6-\xa9]"  # zero-width, bidi, separators
)


def raw_bytes(data: bytes) -> list[bytes]:
    return [m.group() for m in RAW.finditer(data)]


class Stack:
    """The devserver, the daemon, and `anyrtd ...` as a subprocess pointed at both."""

    def __init__(self, devserver: DevserverProcess, served: ServeProcess) -> None:
        self.devserver = devserver
        self.served = served
        self.env = {
            **os.environ,
            "TZ": "UTC",
            "ANYRTD_CONFIG": str(served.config),
            "ANYRTD_SERVER": devserver.url,
            "ANYRTD_LISTEN": served.listen,
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """Run `anyrtd ARGS` and return what it wrote, as bytes: nothing decoded away."""
        return subprocess.run(
            [*anyrtd_command(), *args], capture_output=True, timeout=60, env=self.env
        )

    def runs(self, trigger_id: str) -> list[dict[str, Any]]:
        with self.served.http() as client:
            resp = client.get("/runs", params={"trigger": trigger_id})
        return list(resp.json()) if resp.status_code == 200 else []


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("hostile")
    program = tmp / "hostile.py"
    program.write_text(
        f"import sys\nsys.stdout.buffer.write({HOSTILE_OUTPUT.encode()!r})\nsys.exit(3)\n"
    )
    devserver = DevserverProcess(tmp / "dev.sqlite3", ["--devices", "1"], tmp / "devserver.log")
    served = ServeProcess(
        tmp,
        "",
        config_lines=('[programs."test:hostile@v1"]', f"argv = {json.dumps([PY, str(program)])}"),
    )
    try:
        devserver.start()
        served.server_url = devserver.url
        served.start()
        here = devserver.peers[0]
        fields = {"kind": "cron", "spec": {"every_s": 1}, "program": "test:hostile@v1"}
        put_triggers(
            devserver.url,
            {
                PLAIN_ID: {**fields, "name": HOSTILE_NAME, "owner": here},
                HOSTILE_ID: {**fields, "name": HOSTILE_NAME, "owner": here},
            },
        )
        stack = Stack(devserver, served)
        wait_until(
            lambda: [r for r in stack.runs(PLAIN_ID) if r["status"] != "running"],
            timeout=30,
            what=f"an ended run of {PLAIN_ID!r}",
        )
        wait_until(
            lambda: b"skipped malformed record evil" in served.log.read_bytes(),
            timeout=30,
            what="the malformed record of the hostile id logged",
        )
        yield stack
    finally:
        served.stop()
        devserver.stop()


def test_no_control_character_reaches_the_terminal_from_any_listing(stack: Stack) -> None:
    run_id = next(r["runId"] for r in stack.runs(PLAIN_ID) if r["status"] != "running")
    commands = [
        ("triggers", "list"),
        ("triggers", "list", "--all", "--sort", "id"),
        ("triggers", "show", PLAIN_ID),
        ("triggers", "show", HOSTILE_ID),
        ("triggers", "why", PLAIN_ID),
        ("triggers", "why", HOSTILE_ID),
        ("runs", "list"),
        ("runs", "list", "--trigger", PLAIN_ID),
        ("runs", "show", run_id),
        ("election",),
        ("doctor",),
        ("triggers", "disable", HOSTILE_ID),
        ("triggers", "show", HOSTILE_ID + "-nonesuch"),
    ]
    seen = b""
    for args in commands:
        result = stack.run(*args)
        assert raw_bytes(result.stdout) == [], (args, result.stdout)
        assert raw_bytes(result.stderr) == [], (args, result.stderr)
        # A run's output keeps its own lines (under `output:`); nothing else starts one.
        shown = result.stdout.decode().partition("\noutput:\n")[0] + result.stderr.decode()
        for line in shown.splitlines():
            assert not line.startswith(FORGED[:20]), (args, line)
        seen += result.stdout + result.stderr
    text = seen.decode()
    # Shown, escaped: the name, the id and the output, each as it is on the server.
    assert "\\x1b]52;c;aGFja2Vk\\x07" in text
    assert "\\u202eesrever" in text and "\\x9b2J" in text and "\\x7f\\x08" in text
    assert "evil\\x1b[2J" in text and "name\\x1b[2J" in text and "out\\x1b[2J" in text
    assert "\\x00\\r\\n" + FORGED in text  # the name, on one line
    assert "\\x00 cr\\r\n" + FORGED + "\nthe end" in text  # the output keeps its lines


def test_json_is_the_same_data_with_no_raw_control_character(stack: Stack) -> None:
    run_id = next(r["runId"] for r in stack.runs(PLAIN_ID) if r["status"] != "running")
    for args, check in (
        (("triggers", "list", "--all"), lambda body: HOSTILE_ID in {t["id"] for t in body}),
        (("triggers", "show", PLAIN_ID), lambda body: body["trigger"]["name"] == HOSTILE_NAME),
        (("runs", "show", run_id), lambda body: body["output"] == HOSTILE_OUTPUT),
    ):
        result = stack.run(*args, "--json")
        assert result.returncode == 0, (args, result.stderr)
        assert raw_bytes(result.stdout) == [], (args, result.stdout)
        assert check(json.loads(result.stdout)), args


def test_no_control_character_reaches_the_log(stack: Stack) -> None:
    log = stack.served.log.read_bytes()
    assert raw_bytes(log) == []
    lines = log.decode().splitlines()
    assert not [line for line in lines if line.startswith(FORGED[:20])]
    skipped = [line for line in lines if "skipped malformed record evil" in line]
    assert skipped, "the daemon logged no skip of the hostile id"
    assert all("evil\\x1b[2J" in line and "\\n" + FORGED in line for line in skipped)
