"""anyrtd under a real systemd: the packaged unit, in the sandbox of tests/systemd_sandbox.py.

The sandbox boots systemd as PID 1 of a fresh PID namespace over this machine's own files
and network, so the test installs the packaged unit in /etc/systemd/system (verbatim, plus a
drop-in with ExecStart= pointed at a virtual environment built here from the checkout and
`WatchdogSec=3s`), talks to the daemon over its control socket in the sandbox's /run, and
reads its journal with the real journalctl. It needs root; where systemd cannot boot it fails
and says why. Everything it installs or leaves (units, the environment, the state
directory, the sandbox) is removed at the end.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import DevserverProcess
from support import put_triggers, server_runs, wait_until
from systemd_machine import (
    CONFIG_DIR,
    DROP_IN_DIR,
    MARK,
    REPO,
    STATE_PRIVATE,
    UNIT,
    Systemd,
    foreign_units,
    remove_installed,
)

pytestmark = pytest.mark.systemd
pytest_plugins = ("systemd_fixtures",)

PACKAGED_UNIT = REPO / "packaging" / "systemd" / "anyrtd.service"
FAR_CRON = {"kind": "cron", "spec": {"cron": "0 0 1 1 *"}}  # never due while a test runs


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevserverProcess]:
    """A devserver on 127.0.0.1, a free port: the sandbox shares this machine's network."""
    where = tmp_path_factory.mktemp("devserver")
    proc = DevserverProcess(where / "dev.sqlite3", ["--devices", "1"], where / "devserver.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop(timeout=10)


@dataclass
class Service:
    """The installed anyrtd.service, its config file and the devserver it talks to."""

    systemd: Systemd
    config: Path
    good_config: str
    server: DevserverProcess
    since: int  # the journal persists across boots: read only what this run wrote

    def systemctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run systemctl in the sandbox; on failure, fail with the unit's last journal lines."""
        done = self.systemd.run("systemctl", *args, check=False)
        if done.returncode != 0:
            pytest.fail(
                f"`systemctl {' '.join(args)}` exited {done.returncode}:\n{done.stderr}\n"
                f"journalctl -u anyrtd:\n{self.journal('-n', '40')}"
            )
        return done

    def show(self, *props: str) -> dict[str, str]:
        return self.systemd.show("anyrtd.service", *props)

    def journal(self, *args: str) -> str:
        return self.systemd.run(
            "journalctl", "-u", "anyrtd", "--no-pager", "-o", "cat", f"--since=@{self.since}", *args
        ).stdout

    def api(self, method: str, path: str) -> httpx.Response:
        """Call the control API on the unit's socket, /run/anyrtd/control.sock in the sandbox."""
        sock = self.systemd.root / "run/anyrtd/control.sock"
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(transport=transport, base_url="http://localhost", timeout=10) as c:
            return c.request(method, path)


@pytest.fixture(scope="module")
def service(systemd: Systemd, opt_home: Path, server: DevserverProcess) -> Iterator[Service]:
    """Install the packaged unit with a drop-in for this test's environment and devserver."""
    foreign = foreign_units()
    if foreign:
        pytest.fail(
            f"an anyrtd unit this test did not install is on this machine ({foreign[0]}); "
            "the test would replace it and its state: run it on a machine without anyrtd"
        )
    remove_installed([])  # what an interrupted run of this test left behind
    created = [p for p in (STATE_PRIVATE, CONFIG_DIR) if not p.exists()]
    config = opt_home / "anyrtd.toml"
    good = (
        f'server = "{server.url}"\n'
        "tick_s = 0.5\n"
        "grace_s = 1\n"
        '[programs."test:sleep@v1"]\n'
        'argv = ["/bin/sleep", "120"]\n'
    )
    config.write_text(good)
    config.chmod(0o644)
    UNIT.write_text(MARK + PACKAGED_UNIT.read_text())
    DROP_IN_DIR.mkdir()
    (DROP_IN_DIR / "test.conf").write_text(
        MARK + "[Service]\n"
        "ExecStart=\n"
        f"ExecStart={opt_home}/venv/bin/anyrtd serve --config {config} "
        "--listen unix:/run/anyrtd/control.sock\n"
        "WatchdogSec=3s\n"
    )
    try:
        systemd.run("systemctl", "daemon-reload")
        yield Service(systemd, config, good, server, since=int(time.time()))
    finally:
        systemd.run("systemctl", "stop", "anyrtd", check=False)
        systemd.run("systemctl", "reset-failed", "anyrtd", check=False)
        remove_installed(created)
        systemd.run("systemctl", "daemon-reload", check=False)


@pytest.fixture
def running(service: Service) -> Iterator[Service]:
    """The service started with the test's good config; stopped after the test."""
    service.config.write_text(service.good_config)
    service.systemctl("start", "anyrtd")
    try:
        yield service
    finally:
        service.systemd.run("systemctl", "stop", "anyrtd", check=False)


def in_order(text: str, *parts: str) -> bool:
    """Return whether every one of `parts` is in `text`, each after the one before."""
    at = 0
    for part in parts:
        at = text.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True


def test_start_returns_once_ready_and_status_shows_the_status_line(service: Service) -> None:
    service.systemctl("start", "anyrtd")
    try:
        # Type=notify: start returned after READY=1, so the daemon already answers and
        # has ticked.
        health = service.api("GET", "/healthz")
        props = service.show("ActiveState", "SubState", "StatusText")
        assert health.status_code == 200, health.text
        assert health.json()["status"] == "ok" and health.json()["lastTickAt"] is not None
        assert props["ActiveState"] == "active" and props["SubState"] == "running"

        status = service.systemctl("status", "anyrtd", "--no-pager").stdout
        line = re.search(
            r'Status: "(active; \d+ triggers adopted; \d+ runs today; outbox \d+)', status
        )
        assert line, status
        assert props["StatusText"].startswith(line.group(1))
    finally:
        service.systemctl("stop", "anyrtd")


def test_a_refused_reload_is_an_error_in_the_journal_and_the_status(running: Service) -> None:
    token = secrets.token_hex(4)
    running.config.write_text(f'run_timeout_s = "soon-{token}"\n' + running.good_config)
    running.systemctl("reload", "anyrtd")

    why = f"config key run_timeout_s: expected a number of seconds, got 'soon-{token}'"
    errors = wait_until(
        lambda: why in (out := running.journal("-p", "err")) and out,
        timeout=20,
        what="the refused reload in `journalctl -u anyrtd -p err`",
    )
    assert f"reload refused, keeping the running configuration: {why}" in errors
    props = running.show("ActiveState", "StatusText")
    assert props["ActiveState"] == "active"
    assert props["StatusText"].endswith(f"last error: reload refused: {why}")

    running.config.write_text(running.good_config)
    running.systemctl("reload", "anyrtd")
    wait_until(
        lambda: "reload refused" not in running.show("StatusText")["StatusText"],
        timeout=20,
        what="a good reload to clear the status",
    )


def test_a_stopped_daemon_is_killed_by_the_watchdog_and_restarted(running: Service) -> None:
    before = running.show("MainPID", "NRestarts", "WatchdogUSec")
    assert before["WatchdogUSec"] == "3s"
    since = int(time.time())
    # SIGSTOP freezes everything: the tick, the event loop and the pings.
    running.systemctl("kill", "--kill-whom=main", "--signal=SIGSTOP", "anyrtd")

    def restarted() -> dict[str, str] | None:
        now = running.show("MainPID", "NRestarts", "ActiveState")
        moved = now["MainPID"] not in ("0", before["MainPID"])
        done = now["NRestarts"] == str(int(before["NRestarts"]) + 1)
        return now if moved and done and now["ActiveState"] == "active" else None

    wait_until(restarted, timeout=30, interval=0.2, what="the watchdog to restart anyrtd")
    wait_until(
        lambda: in_order(
            running.journal(f"--since=@{since}"),
            "Watchdog timeout (limit 3s)!",
            "Failed with result 'watchdog'",
            "anyrtd is serving",
        ),
        what="the watchdog kill and the restart in the journal",
    )
    assert running.api("GET", "/healthz").json()["status"] == "ok"


def test_stop_ends_cleanly_with_the_in_flight_run_recorded_interrupted(running: Service) -> None:
    trigger = f"sleepy-{secrets.token_hex(3)}"
    me = running.server.peers[0]
    put_triggers(
        running.server.url, {trigger: {**FAR_CRON, "program": "test:sleep@v1", "owner": me}}
    )
    wait_until(
        lambda: running.api("GET", f"/triggers/{trigger}").json().get("adopted"),
        timeout=20,
        what=f"anyrtd to adopt {trigger}",
    )
    started = running.api("POST", f"/triggers/{trigger}/run")
    assert started.status_code == 202, started.text
    run_id = started.json()["runId"]
    assert running.api("GET", f"/runs/{run_id}").json()["status"] == "running"

    # The program sleeps far past grace_s (1 s): the stop interrupts it and records that.
    since = int(time.time())
    t0 = time.monotonic()
    running.systemctl("stop", "anyrtd")
    took = time.monotonic() - t0
    props = running.show("ActiveState", "Result", "ExecMainStatus")
    # Status 0, not 15: anyrtd exited by itself after SIGTERM, well before any SIGKILL.
    assert props == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}
    assert took < 15, f"the stop took {took:.1f} s"
    (record,) = server_runs(running.server.url, trigger)
    assert record["runId"] == run_id and record["status"] == "interrupted"
    # journald takes the lines off the service's stream in its own time.
    ended = f"run {run_id} of {trigger} ended interrupted"
    wait_until(
        lambda: in_order(running.journal(f"--since=@{since}"), ended, "anyrtd.serve: stopped"),
        what=f"{ended!r}, then 'stopped', in the journal",
    )
