"""Idle connections to the control API cannot take the daemon's file descriptors (issue 15.4).

A real `anyrtd serve` starts with a low `RLIMIT_NOFILE` (soft and hard 256, so it cannot
raise it), hundreds of connections each holding half a request are opened to it, and
its every-second command trigger must go on running, by schedule and by hand, its
`/healthz` must answer, and its log must stay small.
"""

from __future__ import annotations

import re
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from support import World, wait_until

from anyrtd.control.gate import connection_limit

NOFILE = 256
IDLE = 300
PY = sys.executable
ECHO = (
    '[programs."test:echo@v1"]',
    f'argv = ["{PY}", "-c", "print(\'hello\')"]',
)


class LimitedServe(ServeProcess):
    """`anyrtd serve` with soft and hard `RLIMIT_NOFILE` set to `NOFILE` before it starts."""

    def spawn(self) -> subprocess.Popen[bytes]:
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                preexec_fn=limit,
            )
        return self.proc


@pytest.fixture
def served(devserver: DevserverProcess, tmp_path: Path) -> Iterator[ServeProcess]:
    proc = LimitedServe(tmp_path, devserver.url, listen="127.0.0.1:0", config_lines=ECHO)
    try:
        yield proc.start()
    finally:
        proc.stop()


@pytest.fixture
def idle_sockets() -> Iterator[list[socket.socket]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, IDLE + 1024), hard))
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def runs_of(served: ServeProcess, rid: str) -> list[dict[str, Any]]:
    with served.http() as c:
        resp = c.get("/runs", params={"trigger": rid, "limit": 200})
    assert resp.status_code == 200, resp.text
    runs: list[dict[str, Any]] = resp.json()
    return runs


def open_half_requests(address: str, count: int, held: list[socket.socket]) -> None:
    host, _, port = address.rpartition(":")
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: half
        held.append(sock)


def closed_by_daemon(sock: socket.socket) -> bool:
    ready, _, _ = select.select([sock], [], [], 0)
    if not ready:
        return False
    try:
        data = sock.recv(4096)
    except OSError:
        return True
    return data == b"" or data.startswith(b"HTTP/1.1 503")


def test_idle_connections_leave_the_runs_and_healthz_their_descriptors(
    served: ServeProcess, devserver: DevserverProcess, idle_sockets: list[socket.socket]
) -> None:
    world = World(devserver.url)
    world.put(
        "tick",
        name="Tick",
        kind="cron",
        spec={"every_s": 1},
        program="test:echo@v1",
        owner="",
    )
    wait_until(
        lambda: any(r["status"] == "ok" for r in runs_of(served, "tick")),
        timeout=30,
        what="a first ok run of the every-second trigger",
    )

    open_half_requests(served.listen, IDLE, idle_sockets)
    flooded_at = time.time()

    # Before the 10 s the half requests have are over (so not because they timed out): the
    # newest connections take the place of the oldest idle ones.
    with httpx.Client(base_url=f"http://{served.listen}", timeout=8) as c:
        health = c.get("/healthz")
        assert health.status_code == 200, health.text
        assert health.json()["status"] in ("ok", "degraded")
        manual = c.post("/triggers/tick/run")
        assert manual.status_code == 202, manual.text
    manual_id = manual.json()["runId"]
    cap = connection_limit(NOFILE)
    closed = sum(closed_by_daemon(s) for s in idle_sockets)
    assert closed >= IDLE - cap, f"{closed} of {IDLE} closed with a cap of {cap}"
    with served.http() as c:
        metrics = c.get("/metrics").text
    assert f"anyrtd_control_connection_limit {cap}\n" in metrics
    evicted = re.search(
        r'anyrtd_control_connections_closed_total\{reason="evicted"\} (\d+)', metrics
    )
    assert evicted is not None and int(evicted.group(1)) >= IDLE - cap, metrics

    def fresh_ok_runs() -> list[dict[str, Any]] | None:
        runs = runs_of(served, "tick")
        later = [r for r in runs if (r["startedAt"] or 0) > flooded_at + 1]
        scheduled = [r for r in later if r["scheduledAt"] is not None]
        manual_done = any(r["runId"] == manual_id and r["status"] == "ok" for r in runs)
        return runs if len(scheduled) >= 3 and manual_done else None

    runs = wait_until(fresh_ok_runs, timeout=30, what="scheduled and manual runs after the flood")
    ended = [r for r in runs if r["status"] != "running"]
    failed = [(r["status"], r["errorType"], r["error"]) for r in ended if r["status"] != "ok"]
    assert failed == [], failed
    with served.http() as c:
        trigger = c.get("/triggers/tick").json()
    assert trigger["enabled"] is True
    assert trigger["consecutiveFailures"] == 0

    log = served.log.read_text(errors="replace")
    assert "Too many open files" not in log
    assert log.count("Traceback") == 0, log[-3000:]
