"""A real full disk at fire time (issue 15, item 2): a real `anyrtd serve` whose state
directory is a small tmpfs, filled to the last byte while a `once` falls due.

Nothing of the fire happens while the disk is full (no run record, the `once` not consumed,
`/healthz` degraded with the reason, one log line for the episode); once there is room
again the `once` fires exactly once, late, and the mirror keeps no stray `running` row.
Needs root (to mount a tmpfs); skipped with the reason otherwise.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import support
from conftest import DevserverProcess
from control_support import ServeProcess
from support import wait_until

MARK = ('[programs."test:mark@v1"]', 'argv = ["/bin/sh", "-c", "echo fired >> \\"$FIRED\\""]')
FULL_LINE = "the disk of the mirror is full"


def _mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` at `where`; return why not, or None when mounted."""
    if os.geteuid() != 0:
        return "needs root to mount a small tmpfs for the state directory"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        return f"mount -t tmpfs is not permitted here: {done.stderr.strip()}"
    return None


@pytest.fixture
def small_state(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted where the daemon's state directory goes."""
    state = tmp_path / "serve-state"
    why = _mount_tmpfs(state, "4m")
    if why is not None:
        pytest.skip(why)
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], capture_output=True, timeout=30)


def fill(directory: Path) -> Path:
    """Write a file in `directory` until the file system has no byte left; return it."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
    return filler


def health(serve: ServeProcess) -> dict[str, Any]:
    with serve.http() as client:
        body: dict[str, Any] = client.get("/healthz").json()
    return body


def open_runs(mirror: Path) -> int:
    conn = sqlite3.connect(f"file:{mirror}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM runs WHERE status = 'running'").fetchone()[0])
    finally:
        conn.close()


def test_a_once_due_while_the_disk_is_full_fires_once_late_when_there_is_room(
    devserver: DevserverProcess, tmp_path: Path, small_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fired = tmp_path / "fired"
    monkeypatch.setenv("FIRED", str(fired))
    world = support.World(devserver.url)
    serve = ServeProcess(tmp_path, devserver.url, config_lines=MARK)
    assert serve.state == small_state
    try:
        serve.start()
        at = round(time.time() + 6)
        world.put("dentist", kind="once", spec={"at": at}, program="test:mark@v1", owner="")

        def armed() -> bool:
            with serve.http() as client:
                body = client.get("/triggers/dentist").json()
            return bool(body.get("adopted")) and body.get("nextFire") == at

        wait_until(armed, timeout=30, what="the once armed on the daemon")
        wait_until(
            lambda: world.record("dentist").get("owner"), timeout=30, what="the claim on the server"
        )
        filler = fill(small_state)

        # Due, and the disk full: nothing fires, nothing is consumed, and health says why.
        def degraded() -> str | None:
            reasons = health(serve).get("reasons", [])
            return next((r for r in reasons if "the disk is full" in r), None)

        reason = wait_until(degraded, timeout=30, what="/healthz to say the disk is full")
        assert "mirror cannot be written" in reason
        wait_until(lambda: time.time() > at + 4, timeout=30, what="the due time to pass")
        assert health(serve)["status"] == "degraded"
        record = world.record("dentist")
        assert "lastRunAt" not in record and record.get("enabled", True) is True
        assert support.server_runs(devserver.url, "dentist") == []
        assert not fired.exists()
        with serve.http() as client:
            assert client.get("/runs", params={"trigger": "dentist"}).json() == []
        log = serve.log.read_text()
        assert log.count(FULL_LINE) == 1, log
        assert "Traceback" not in log

        # Room again: it fires exactly once, late, and its record reaches the server.
        filler.unlink()
        wait_until(fired.exists, timeout=30, what="the once to fire once there is room")
        done = wait_until(
            lambda: [r for r in support.server_runs(devserver.url, "dentist") if r.get("endedAt")],
            timeout=30,
            what="the run record on the server",
        )
        assert [r["scheduledAt"] for r in done] == [at] and done[0]["status"] == "ok"
        wait_until(
            lambda: world.record("dentist").get("lastRunAt"), timeout=30, what="the consumption"
        )
        wait_until(lambda: health(serve)["status"] == "ok", timeout=30, what="health ok again")
        assert fired.read_text() == "fired\n"
        assert open_runs(small_state / "anyrtd.sqlite3") == 0
        assert "the mirror is written again" in serve.log.read_text()
    finally:
        serve.stop()
    assert fired.read_text() == "fired\n"
    assert len(support.server_runs(devserver.url, "dentist")) == 1
