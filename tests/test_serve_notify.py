"""`anyrtd serve` as systemd sees it: sd_notify on a real datagram socket, a real devserver.

Each test binds the service manager's end of `NOTIFY_SOCKET`, starts a real `anyrtd serve`
subprocess with short ticks and a short `WATCHDOG_USEC`, and reads what it announces:
`READY=1` only after the first reconcile, `STATUS=` lines, `WATCHDOG=1` pings that stop while
the tick loop is stuck on a locked mirror and resume when it clears, `STOPPING=1` on SIGTERM,
and `RELOADING=1` ... `READY=1` around SIGHUP, good config or bad.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import put_triggers, server_runs, wait_until

TICK = "0.2"
WATCHDOG_USEC = 400_000  # a ping every 0.2 s; the stall limit is then 3 ticks, 0.6 s
NOT_FOR_THE_DAEMON = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM")
FAR_CRON = {"kind": "cron", "spec": {"cron": "0 0 1 1 *"}}  # never due while a test runs

Message = dict[str, str]


class Manager:
    """The service manager's end of `NOTIFY_SOCKET`: a bound datagram socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))

    def next(self, timeout: float) -> Message | None:
        """Return the next message as a dict of its fields, or None after `timeout` s."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            raw = self.sock.recv(65536)
        except TimeoutError:
            return None
        fields = (line.split("=", 1) for line in raw.decode().split("\n") if line)
        return {k: v for k, v in fields}

    def drain(self) -> list[Message]:
        """Return the messages already queued."""
        out = []
        while (msg := self.next(0.001)) is not None:
            out.append(msg)
        return out

    def wait_for(
        self, want: Callable[[Message], bool], what: str, timeout: float = 20.0
    ) -> tuple[Message, list[Message]]:
        """Return the first message `want` accepts and the ones that came before it."""
        before: list[Message] = []
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            msg = self.next(left)
            if msg is None:
                break
            if want(msg):
                return msg, before
            before.append(msg)
        raise AssertionError(f"no {what} within {timeout} s; got {before}")

    def close(self) -> None:
        self.sock.close()


@dataclass
class Served:
    """A running `anyrtd serve` subprocess and the places it uses."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    control: Path
    mirror: Path
    config: Path
    manager: Manager
    argv: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 20.0, after: int = 0) -> int:
        """Wait until `text` is in the log past offset `after`; return where it ends."""

        def found() -> int:
            at = self.log().find(text, after)
            return at + len(text) if at >= 0 else 0

        return wait_until(found, timeout=timeout, what=f"{text!r} in the log:\n{self.log()}")

    def api(self, method: str, path: str) -> httpx.Response:
        """Call the control API over its unix socket."""
        transport = httpx.HTTPTransport(uds=str(self.control))
        with httpx.Client(transport=transport, base_url="http://localhost", timeout=10) as c:
            return c.request(method, path)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"anyrtd serve still runs; log:\n{self.log()}") from None


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A unix socket path must fit in 108 bytes; pytest's tmp_path may not.
    with tempfile.TemporaryDirectory(prefix="anyrtd-sn-") as d:
        yield Path(d)


@pytest.fixture
def manager(short_dir: Path) -> Iterator[Manager]:
    m = Manager(short_dir / "notify")
    try:
        yield m
    finally:
        m.close()


StartDaemon = Callable[..., Served]


@pytest.fixture
def start_daemon(
    devserver: Any, manager: Manager, short_dir: Path, tmp_path: Path
) -> Iterator[StartDaemon]:
    """Start `anyrtd serve` against the devserver with `NOTIFY_SOCKET` on `manager`."""
    started: list[Served] = []

    def start(config: str = "", watchdog: bool = True) -> Served:
        config_path = tmp_path / "anyrtd.toml"
        config_path.write_text(config)
        state = tmp_path / "state"
        control = short_dir / "control.sock"
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in NOT_FOR_THE_DAEMON and not k.startswith("ANYRTD_")
        }
        env["NOTIFY_SOCKET"] = str(manager.path)
        env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
        if watchdog:
            env["WATCHDOG_USEC"] = str(WATCHDOG_USEC)
        argv = [
            sys.executable,
            "-m",
            "anyrtd",
            "serve",
            "--config",
            str(config_path),
            "--server",
            devserver.url,
            "--state-dir",
            str(state),
            "--listen",
            f"unix:{control}",
            "--tick",
            TICK,
        ]
        log_path = tmp_path / "serve.log"
        with log_path.open("ab") as err:
            # Not the checkout as cwd: `-m anyrtd` must import the installed package.
            proc = subprocess.Popen(
                argv,
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,
            )
        daemon = Served(proc, log_path, control, state / "anyrtd.sqlite3", config_path, manager)
        daemon.argv = argv
        started.append(daemon)
        return daemon

    try:
        yield start
    finally:
        for daemon in started:
            if daemon.proc.poll() is None:
                daemon.proc.terminate()
                try:
                    daemon.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(daemon.proc.pid, signal.SIGKILL)
                    daemon.proc.wait()


def is_ready(msg: Message) -> bool:
    return msg.get("READY") == "1"


def is_ping(msg: Message) -> bool:
    return msg.get("WATCHDOG") == "1"


def test_ready_comes_only_after_the_first_reconcile_then_status_lines_follow(
    devserver: Any, start_daemon: StartDaemon, manager: Manager
) -> None:
    me = devserver.peers[0]
    put_triggers(devserver.url, {"early": {**FAR_CRON, "program": "test:quick@v1", "owner": me}})
    quick = f'[programs."test:quick@v1"]\nargv = [{json.dumps(sys.executable)}, "-c", "pass"]\n'

    daemon = start_daemon(quick)
    ready, before = manager.wait_for(is_ready, "READY=1")

    # Nothing is announced before READY=1, and READY=1 comes once the first reconcile has
    # adopted the record that was on the server before the daemon started.
    assert before == []
    assert re.fullmatch(r"active; \d+ triggers adopted; 0 runs today; outbox 0", ready["STATUS"])
    daemon.wait_log("anyrtd is serving")  # logged right after READY=1 is sent
    log = daemon.log()
    assert log.index("adopted early") < log.index("anyrtd is serving")
    # The control API was listening and the tick had run when READY=1 was sent.
    health = daemon.api("GET", "/healthz").json()
    assert health["status"] == "ok" and health["lastTickAt"] is not None
    assert "early" in [t["id"] for t in daemon.api("GET", "/triggers").json()]

    # A change of state shows up as a new STATUS= line within a few ticks.
    assert daemon.api("POST", "/triggers/early/run").status_code == 202
    status, _ = manager.wait_for(
        lambda m: "; 1 runs today;" in m.get("STATUS", ""), "STATUS= with 1 run today"
    )
    assert list(status) == ["STATUS"]


def test_sigterm_sends_stopping_first_and_in_flight_runs_end_interrupted(
    devserver: Any, start_daemon: StartDaemon, manager: Manager, tmp_path: Path
) -> None:
    env_dump = tmp_path / "child-env.json"
    # The command program writes down the environment it got, then outlives the grace period.
    program = (
        "import json, os, sys, time\n"
        f"open({str(env_dump)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
        "time.sleep(60)\n"
    )
    config = (
        "grace_s = 0.5\n"
        '[programs."test:linger@v1"]\n'
        f"argv = [{json.dumps(sys.executable)}, '-c', {json.dumps(program)}]\n"
    )
    me = devserver.peers[0]
    put_triggers(devserver.url, {"linger": {**FAR_CRON, "program": "test:linger@v1", "owner": me}})
    daemon = start_daemon(config)
    manager.wait_for(is_ready, "READY=1")
    started = daemon.api("POST", "/triggers/linger/run")
    assert started.status_code == 202, started.text
    run_id = started.json()["runId"]
    child_env = wait_until(
        lambda: env_dump.exists() and json.loads(env_dump.read_text() or "null"),
        what="the command program to start",
    )

    # The notify variables are the daemon's alone: a child cannot ping its watchdog.
    assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} & set(child_env)
    assert child_env["ANYRTD_RUN_ID"] == run_id

    manager.drain()
    daemon.signal(signal.SIGTERM)
    stopping, _ = manager.wait_for(lambda m: m.get("STOPPING") == "1", "STOPPING=1")
    assert stopping["STATUS"] == "stopping: letting in-flight runs finish"
    assert daemon.wait_exit() == 0
    # STOPPING=1 came as the stop began, before the grace period ran out on the run.
    assert manager.drain() == []
    log = daemon.log()
    assert "interrupting 1 runs still in flight" in log
    assert log.rstrip().splitlines()[-1].endswith("anyrtd.serve: stopped")
    (record,) = server_runs(devserver.url, "linger")
    assert record["runId"] == run_id and record["status"] == "interrupted"


def test_watchdog_pings_stop_while_the_mirror_is_locked_and_resume_when_it_clears(
    devserver: Any, start_daemon: StartDaemon, manager: Manager
) -> None:
    daemon = start_daemon()
    manager.wait_for(is_ready, "READY=1")
    for n in range(3):
        manager.wait_for(is_ping, f"WATCHDOG=1 number {n + 1}", timeout=10)

    # Another process holds the mirror's write lock. The daemon's next write (the record
    # put below, read from the change feed) waits on it in the mirror's thread: the event
    # loop stays free, but the tick does not complete.
    before_lock = len(daemon.log())
    lock = sqlite3.connect(daemon.mirror, isolation_level=None, timeout=10)
    try:
        lock.execute("BEGIN EXCLUSIVE")
        me = devserver.peers[0]
        put_triggers(devserver.url, {"stuck": {**FAR_CRON, "program": "test:idle@v1", "owner": me}})
        # The write waits out busy_timeout (5 s) and fails; the pings stop well before.
        last_ping = time.monotonic()
        deadline = last_ping + 30
        while "database is locked" not in daemon.log()[before_lock:]:
            msg = manager.next(0.1)
            if msg is not None and is_ping(msg):
                last_ping = time.monotonic()
            assert time.monotonic() < deadline, f"no 'database is locked':\n{daemon.log()}"
        assert time.monotonic() - last_ping > 2.0, "pings went on while the tick was stuck"
        daemon.wait_log("the tick loop has made no progress", after=before_lock)

        # The tick retries the kept write and waits again: a lock that never clears gets
        # no more pings, so systemd would restart anyrtd.
        manager.drain()
        quiet_until = time.monotonic() + 1.5
        while (left := quiet_until - time.monotonic()) > 0:
            msg = manager.next(left)
            assert msg is None or not is_ping(msg), f"a ping while the tick is stuck: {msg}"
        assert daemon.api("GET", "/healthz").status_code == 200  # the event loop answers
    finally:
        lock.close()

    manager.wait_for(is_ping, "WATCHDOG=1 after the lock is released", timeout=20)
    daemon.wait_log("watchdog pings resume", after=before_lock)
    # The write the lock held up was kept and landed: the mirror has the entry.
    with sqlite3.connect(daemon.mirror, timeout=10) as db:
        rows = db.execute("SELECT trigger_id FROM entries WHERE trigger_id = 'stuck'").fetchall()
    assert rows == [("stuck",)]


def test_sighup_reloads_a_good_config_and_keeps_the_old_one_when_it_is_bad(
    devserver: Any, start_daemon: StartDaemon, manager: Manager
) -> None:
    me = devserver.peers[0]
    put_triggers(devserver.url, {"hup": {**FAR_CRON, "program": "test:hup@v1", "owner": me}})
    daemon = start_daemon(config="grace_s = 1\n", watchdog=False)
    manager.wait_for(is_ready, "READY=1")

    def run_status() -> str:
        started = daemon.api("POST", "/triggers/hup/run")
        assert started.status_code == 202, started.text
        path = f"/runs/{started.json()['runId']}"
        return str(
            wait_until(
                lambda: (s := daemon.api("GET", path).json()["status"]) != "running" and s,
                what="the run to end",
            )
        )

    def reload(config: str) -> Message:
        daemon.config.write_text(config)
        manager.drain()
        daemon.signal(signal.SIGHUP)
        reloading, before = manager.wait_for(lambda m: m.get("RELOADING") == "1", "RELOADING=1")
        assert not any(is_ready(m) for m in before)
        assert int(reloading["MONOTONIC_USEC"]) > 0
        ready, _ = manager.wait_for(is_ready, "READY=1 after the reload")
        return ready

    refused = daemon.api("POST", "/triggers/hup/run")  # test:hup@v1 is not installed yet
    assert refused.status_code == 409 and "not installed" in refused.text, refused.text

    good = f'[programs."test:hup@v1"]\nargv = [{json.dumps(sys.executable)}, "-c", "pass"]\n'
    ready = reload(good)
    assert "last error" not in ready["STATUS"]
    assert run_status() == "ok"

    ready = reload('tick_s = "soon"\n' + good.replace("pass", "raise SystemExit(3)"))
    why = "config key tick_s: expected a number of seconds, got 'soon'"
    assert ready["STATUS"].endswith(f"last error: reload refused: {why}")
    assert f"ERROR anyrtd.serve: reload refused, keeping the running configuration: {why}" in (
        daemon.log()
    )
    assert run_status() == "ok"  # the running configuration was kept whole

    ready = reload(good)
    assert "reload refused" not in ready["STATUS"]
    assert daemon.proc.poll() is None
