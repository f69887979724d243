"""`anyrtd dev` as a real process: the sample fires into the chat, Ctrl-C stops it, state stays."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import anyrtd_command
from support import wait_until

from anyrtd.client import Dataset, ServerClient

HOW_TO = re.compile(
    r"any server \(devserver\)\s+(\S+).*\n"
    r"\s+control API\s+(\S+)\n"
    r"\s+this device\s+(\S+)"
)


class DevProcess:
    """An `anyrtd dev` subprocess on free ports; `.server` and `.control` come from its how-to."""

    def __init__(self, state: Path, tmp: Path) -> None:
        self.state = state
        self.tmp = tmp
        self.command = anyrtd_command()
        self.args: list[str] = []
        self.env: dict[str, str] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.out = tmp / "dev.out"
        self.err = tmp / "dev.err"
        self.server = ""
        self.control = ""
        self.peer = ""

    def start(self) -> DevProcess:
        for f in (self.out, self.err):
            f.write_text("")
        with self.out.open("ab") as out, self.err.open("ab") as err:
            self.proc = subprocess.Popen(
                [
                    *self.command,
                    "dev",
                    "--state-dir",
                    str(self.state),
                    "--port",
                    "0",
                    "--listen",
                    "127.0.0.1:0",
                    "--tick",
                    "0.2",
                    *self.args,
                ],
                stdout=out,
                stderr=err,
                env={**os.environ, "ANYRTD_CONFIG": "/dev/null", **self.env},
                start_new_session=True,
            )

        def printed() -> re.Match[str] | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"anyrtd dev exited:\n{self.err.read_text()}")
            text = self.out.read_text()
            return HOW_TO.search(text)

        match = wait_until(printed, timeout=60, what="anyrtd dev to print its how-to")
        self.server, self.control, self.peer = match.group(1), match.group(2), match.group(3)
        return self

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=f"http://{self.control}", timeout=10)

    def interrupt(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=60)
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[DevProcess]:
    proc = DevProcess(tmp_path / "state", tmp_path)
    try:
        yield proc
    finally:
        proc.kill()


def sample(dev: DevProcess) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        with dev.http() as c:
            resp = c.get("/triggers/dev-reminder")
        body: dict[str, Any] = resp.json()
        return body if resp.status_code == 200 and body["state"] == "scheduled" else None

    return wait_until(check, timeout=30, what="the sample trigger to be armed")


async def chat_texts(url: str) -> list[str]:
    async with ServerClient(url) as client:
        chat = await client.child("bao", "bao/v1", "bao/chat/general")
        messages = await client.query_all(Dataset("bao", chat, "chat_messages"))
    return [str(m.get("text")) for m in messages]


def test_dev_runs_everything_and_keeps_state_across_restarts(dev: DevProcess) -> None:
    dev.start()
    how_to = dev.out.read_text()
    for line in ("anyrtd triggers list", "curl -s http://", "/triggers/dev-reminder/disable"):
        assert line in how_to
    t = sample(dev)
    assert t["kind"] == "cron" and t["spec"] == {"cron": "* * * * *"}
    assert t["program"] == "agent:remind@v1"
    assert t["owner"] == dev.peer
    assert t["nextFire"] % 60 == 0

    with dev.http() as c:
        run_id = c.post("/triggers/dev-reminder/run").json()["runId"]

        def ended() -> dict[str, Any] | None:
            run: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            return run if run["status"] != "running" else None

        run = wait_until(ended, timeout=30, what="the sample's run to end")
    assert run["status"] == "ok"
    texts = asyncio.run(chat_texts(dev.server))
    assert any("Reminder from anyrtd dev" in text for text in texts)
    wait_until(
        lambda: (
            f"run {run_id} of dev-reminder ended ok" in dev.err.read_text()
            and "general chat: bao: Reminder from anyrtd dev" in dev.err.read_text()
        ),
        timeout=30,
        what="the log to show the run and the message",
    )
    assert "created the sample trigger dev-reminder" in dev.err.read_text()

    assert dev.interrupt() == 0
    assert "stopped; the state is in" in dev.err.read_text()
    peer = dev.peer

    dev.start()
    assert dev.peer == peer
    assert "created the sample trigger" not in dev.err.read_text()
    t = sample(dev)
    assert t["runCount"] >= 1 and t["lastRunRef"] is not None
    with dev.http() as c:
        assert run_id in [r["runId"] for r in c.get("/runs").json()]
    assert dev.interrupt() == 0


def test_dev_refuses_a_busy_port_with_a_hint(dev: DevProcess, tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [*anyrtd_command(), "dev", "--state-dir", str(tmp_path / "s"), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "ANYRTD_CONFIG": "/dev/null"},
        )
    assert result.returncode == 1
    assert "is another `anyrtd dev` or `anyrtd devserver` running?" in result.stderr


def tries(how_to: str) -> list[str]:
    """Return the commands the how-to offers to try, one per line."""
    block = how_to.split("Try, in another terminal:\n", 1)[1].split("\n\n", 1)[0]
    return [line.strip() for line in block.splitlines()]


def run_printed(dev: DevProcess, *commands: str) -> subprocess.CompletedProcess[str]:
    """Run printed commands from a fresh shell that, like a second terminal, lacks the venv."""
    return subprocess.run(
        ["bash", "-c", "set -e\n" + "\n".join(commands)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ANYRTD_CONFIG": "/dev/null", **dev.env},
    )


def test_the_how_to_follows_the_space_no_sample_and_what_exists(dev: DevProcess) -> None:
    # Started by path, as the README's first command does, with anyrtd not on PATH.
    dev.command = [shutil.which(dev.command[0]) or dev.command[0], *dev.command[1:]]
    dev.env = {"PATH": "/usr/bin:/bin"}
    dev.args = ["--no-sample", "--space", "lab"]
    assert shutil.which("anyrtd", path=dev.env["PATH"]) is None
    invoked = shlex.join(dev.command)

    dev.start()
    offered = tries(dev.out.read_text())
    assert "dev-reminder" not in dev.out.read_text()
    export = offered[0]
    assert export.startswith("export ") and "ANYRTD_SPACE=lab" in export.split()
    create = next(line for line in offered if " triggers create " in line)
    assert create.startswith(f"{invoked} triggers create --id hello ")
    assert f"{invoked} triggers list" in offered

    made = run_printed(dev, export, create, f"{invoked} triggers list")
    assert made.returncode == 0, made.stderr
    assert "created hello" in made.stdout

    assert dev.interrupt() == 0
    dev.start()
    how_to = dev.out.read_text()
    assert "triggers create --id hello " not in how_to
    assert f"{invoked} triggers show hello" in tries(how_to)


def test_the_how_to_leaves_out_a_deleted_sample(dev: DevProcess) -> None:
    dev.start()
    assert "dev-reminder" in dev.out.read_text()
    env = {"ANYRTD_SERVER": dev.server, "ANYRTD_LISTEN": dev.control}
    deleted = run_printed(
        dev, f"{' '.join(f'{k}={v}' for k, v in env.items())} {shlex.join(dev.command)} "
        "triggers delete dev-reminder --yes"
    )  # fmt: skip
    assert deleted.returncode == 0, deleted.stderr
    assert dev.interrupt() == 0
    dev.start()
    how_to = dev.out.read_text()
    assert "dev-reminder" not in how_to
    assert "sample trigger          none" in how_to


def test_the_first_fire_comes_within_seconds_of_the_daemon_being_ready(dev: DevProcess) -> None:
    started = time.time()
    dev.start()
    ready = time.time()
    how_to = dev.out.read_text()
    assert "first fire              dev-first at " in how_to
    assert "anyrtd runs list --trigger dev-first" in how_to
    assert "status page" in how_to.split("first fire", 1)[1].splitlines()[0]

    def first_run() -> dict[str, Any] | None:
        with dev.http() as c:
            runs: list[dict[str, Any]] = c.get("/runs", params={"trigger": "dev-first"}).json()
        done = [r for r in runs if r["triggerId"] == "dev-first" and r["status"] != "running"]
        return done[0] if done else None

    run = wait_until(first_run, timeout=30, what="the first fire of anyrtd dev")
    assert run["status"] == "ok" and run["scheduledAt"] is not None
    # within seconds of the daemon being ready (the sample every minute could take 60 s)
    assert run["startedAt"] - ready < 10, (run, ready)
    print(
        f"anyrtd dev: ready {ready - started:.1f} s after start, first fire "
        f"{run['startedAt'] - started:.1f} s after start "
        f"({run['startedAt'] - ready:.1f} s after ready)"
    )
    texts = asyncio.run(chat_texts(dev.server))
    assert any("First fire from anyrtd dev" in text for text in texts)
    # the built-ins a dev user cannot install are quiet, not red `not_installed` rows
    with dev.http() as c:
        listed = {t["id"]: t for t in c.get("/triggers").json()}
    for rid in ("extraction", "linkgen", "evolution", "reflection"):
        shown = (listed[rid]["state"], listed[rid]["stateReason"], listed[rid]["severity"])
        assert shown == ("unavailable", "not_installed", "quiet"), (rid, listed[rid])
    assert not [t for t in listed.values() if t["severity"] == "bad"], listed

    # a restart arms it again, a few seconds ahead: a sign of life every start
    assert dev.interrupt() == 0
    again = time.time()
    dev.start()

    def second_run() -> dict[str, Any] | None:
        with dev.http() as c:
            runs: list[dict[str, Any]] = c.get("/runs", params={"trigger": "dev-first"}).json()
        later = [r for r in runs if r["startedAt"] > again and r["status"] != "running"]
        return later[0] if later else None

    assert (
        wait_until(second_run, timeout=30, what="the first fire after a restart")["status"] == "ok"
    )
    assert dev.interrupt() == 0
