"""The sd_notify protocol against a real datagram socket, and the progress-gated watchdog."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import async_wait_until

from anyrtd import notify
from anyrtd.clock import FakeClock, SystemClock
from anyrtd.notify import Notifier, child_environ, run_watchdog


class Receiver:
    """The service manager's end: a bound datagram socket that collects what arrives."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.setblocking(False)

    def drain(self) -> list[bytes]:
        """Return every datagram queued now, oldest first."""
        out = []
        while True:
            try:
                out.append(self.sock.recv(4096))
            except BlockingIOError:
                return out

    def recv(self, timeout: float = 5.0) -> bytes:
        """Return the next datagram, waiting at most `timeout` seconds."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(4096)
        finally:
            self.sock.setblocking(False)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A unix socket path must fit in 108 bytes; pytest's tmp_path for a long test name may not.
    with tempfile.TemporaryDirectory(prefix="anyrtd-ntf-") as d:
        yield Path(d)


@pytest.fixture
def receiver(short_dir: Path) -> Iterator[Receiver]:
    r = Receiver(str(short_dir / "notify.sock"))
    try:
        yield r
    finally:
        r.close()


MakeNotifier = Callable[..., Notifier]
NotifierFor = Callable[..., Notifier]


@pytest.fixture
def make() -> Iterator[MakeNotifier]:
    """Build notifiers and close each one when the test ends, so no socket outlives it."""
    made: list[Notifier] = []

    def build(env: dict[str, str], **kwargs: Any) -> Notifier:
        made.append(Notifier(env=env, **kwargs))
        return made[-1]

    try:
        yield build
    finally:
        for n in made:
            n.close()


@pytest.fixture
def notifier_for(make: MakeNotifier) -> NotifierFor:
    """Build a notifier aimed at a receiver, with extra environment variables."""

    def build(receiver: Receiver, **env: str) -> Notifier:
        return make({"NOTIFY_SOCKET": receiver.address, **env}, pid=4242)

    return build


def test_each_message_arrives_with_the_protocol_bytes(
    receiver: Receiver, make: MakeNotifier
) -> None:
    n = make({"NOTIFY_SOCKET": receiver.address}, monotonic_ns=lambda: 7_654_321_000)
    assert n.enabled
    n.ready()
    assert receiver.recv() == b"READY=1"
    n.ready("ready: active, 3 triggers adopted")
    assert receiver.recv() == b"READY=1\nSTATUS=ready: active, 3 triggers adopted"
    n.status("active, 4 triggers adopted")
    assert receiver.recv() == b"STATUS=active, 4 triggers adopted"
    n.reloading()
    assert receiver.recv() == b"RELOADING=1\nMONOTONIC_USEC=7654321"
    n.watchdog()
    assert receiver.recv() == b"WATCHDOG=1"
    n.stopping()
    assert receiver.recv() == b"STOPPING=1"
    n.stopping("stopping: 1 run in flight")
    assert receiver.recv() == b"STOPPING=1\nSTATUS=stopping: 1 run in flight"
    n.close()
    assert receiver.drain() == []


def test_status_is_sent_only_when_it_changes(receiver: Receiver, notifier_for: NotifierFor) -> None:
    n = notifier_for(receiver)
    n.status("active")
    n.status("active")
    n.status("standby")
    n.status("standby")
    n.ready("active")
    n.status("active")
    assert receiver.drain() == [b"STATUS=active", b"STATUS=standby", b"READY=1\nSTATUS=active"]


def test_status_is_kept_to_one_line(receiver: Receiver, notifier_for: NotifierFor) -> None:
    n = notifier_for(receiver)
    n.status("last error:\n  server down\tretrying")
    assert receiver.recv() == b"STATUS=last error: server down retrying"


def test_an_abstract_namespace_socket_is_reached(short_dir: Path, make: MakeNotifier) -> None:
    name = f"anyrtd-test-{os.getpid()}-{short_dir.name}"
    r = Receiver("\0" + name)
    try:
        n = make({"NOTIFY_SOCKET": "@" + name})
        n.ready("up")
        assert r.recv() == b"READY=1\nSTATUS=up"
    finally:
        r.close()


def test_without_notify_socket_nothing_is_opened_or_sent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_socket(*args: object, **kwargs: object) -> None:
        raise AssertionError("a notifier without NOTIFY_SOCKET opened a socket")

    monkeypatch.setattr(notify.socket, "socket", no_socket)
    n = Notifier(env={"WATCHDOG_USEC": "1000000"})
    assert not n.enabled
    assert n.watchdog_interval is None
    n.ready("x")
    n.status("y")
    n.reloading()
    n.watchdog()
    n.stopping()
    n.close()
    assert caplog.records == []


def test_a_notify_socket_that_is_not_a_path_disables_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    n = Notifier(env={"NOTIFY_SOCKET": "vsock:2:1234", "WATCHDOG_USEC": "1000000"})
    assert not n.enabled
    assert n.watchdog_interval is None
    n.ready()
    assert "vsock:2:1234" in caplog.text


def test_a_vanished_socket_is_logged_once_and_never_raises(
    short_dir: Path, make: MakeNotifier, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(short_dir / "gone.sock")
    r = Receiver(path)
    n = make({"NOTIFY_SOCKET": path})
    n.ready()
    assert r.recv() == b"READY=1"
    r.close()
    os.unlink(path)
    with caplog.at_level(logging.INFO, logger="anyrtd.notify"):
        for _ in range(5):
            n.watchdog()
        n.status("still here")
        warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "cannot notify the service manager" in warnings[0].getMessage()
        r2 = Receiver(path)
        try:
            n.watchdog()
            assert r2.recv() == b"WATCHDOG=1"
            assert "answers again" in caplog.text
        finally:
            r2.close()
    n.close()


def test_watchdog_interval_is_half_of_watchdog_usec(
    receiver: Receiver, notifier_for: NotifierFor
) -> None:
    assert notifier_for(receiver, WATCHDOG_USEC="30000000").watchdog_interval == 15.0
    assert notifier_for(receiver, WATCHDOG_USEC="200000").watchdog_interval == 0.1
    assert notifier_for(receiver).watchdog_interval is None


def test_watchdog_pid_of_another_process_disables_pings(
    receiver: Receiver, make: MakeNotifier, notifier_for: NotifierFor
) -> None:
    ours = notifier_for(receiver, WATCHDOG_USEC="1000000", WATCHDOG_PID="4242")
    assert ours.watchdog_interval == 0.5
    theirs = notifier_for(receiver, WATCHDOG_USEC="1000000", WATCHDOG_PID="4243")
    assert theirs.watchdog_interval is None
    # The default pid is this process's own.
    me = make(
        {
            "NOTIFY_SOCKET": receiver.address,
            "WATCHDOG_USEC": "1000000",
            "WATCHDOG_PID": str(os.getpid()),
        }
    )
    assert me.watchdog_interval == 0.5


def test_unusable_watchdog_values_disable_pings(
    receiver: Receiver, notifier_for: NotifierFor, caplog: pytest.LogCaptureFixture
) -> None:
    assert notifier_for(receiver, WATCHDOG_USEC="soon").watchdog_interval is None
    assert notifier_for(receiver, WATCHDOG_USEC="0").watchdog_interval is None
    assert notifier_for(receiver, WATCHDOG_USEC="1000", WATCHDOG_PID="me").watchdog_interval is None
    assert "WATCHDOG_USEC='soon'" in caplog.text
    assert "WATCHDOG_PID='me'" in caplog.text


def test_child_environ_drops_the_notify_variables() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "PATH": "/bin"}
    assert child_environ(env) == {"PATH": "/bin"}


async def test_watchdog_pings_while_progress_advances_and_stops_when_it_stalls(
    receiver: Receiver, notifier_for: NotifierFor, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    n = notifier_for(receiver, WATCHDOG_USEC="2000000")  # a ping every 1 s
    progress = [clock.monotonic()]
    checks: list[float] = []

    def last_progress() -> float:
        checks.append(clock.monotonic())
        return progress[0]

    async def step(advance: float, made_progress: bool) -> list[bytes]:
        """Move the clock, let the watchdog loop take one turn, and return what it sent."""
        before = len(checks)
        clock.advance(advance)
        if made_progress:
            progress[0] = clock.monotonic()

        async def turned() -> bool:
            return len(checks) > before

        await async_wait_until(turned, timeout=5, what="the watchdog loop to take a turn")
        return receiver.drain()

    task = asyncio.create_task(run_watchdog(n, last_progress, stall_after=3.0, clock=clock))
    try:
        with caplog.at_level(logging.INFO, logger="anyrtd.notify"):
            assert await step(0, made_progress=False) == [b"WATCHDOG=1"]
            for _ in range(3):
                assert await step(1, made_progress=True) == [b"WATCHDOG=1"]
            # The tick loop stops: progress 1 s and 2 s old still pings; 3 s old does not.
            assert await step(1, made_progress=False) == [b"WATCHDOG=1"]
            assert await step(1, made_progress=False) == [b"WATCHDOG=1"]
            assert await step(1, made_progress=False) == []
            assert await step(1, made_progress=False) == []
            assert await step(5, made_progress=False) == []
            errors = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1
            assert "no progress" in errors[0].getMessage()
            # It recovers: pings resume.
            assert await step(1, made_progress=True) == [b"WATCHDOG=1"]
            assert "making progress again" in caplog.text
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_watchdog_pings_on_the_real_clock(
    receiver: Receiver, notifier_for: NotifierFor
) -> None:
    clock = SystemClock()
    n = notifier_for(receiver, WATCHDOG_USEC="40000")  # a ping every 20 ms
    task = asyncio.create_task(
        run_watchdog(n, lambda: clock.monotonic(), stall_after=60.0, clock=clock)
    )
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(5):
            for _ in range(3):
                assert await loop.sock_recv(receiver.sock, 4096) == b"WATCHDOG=1"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_watchdog_returns_at_once_when_no_pings_are_wanted(
    receiver: Receiver, notifier_for: NotifierFor
) -> None:
    for n in (Notifier(env={}), notifier_for(receiver)):
        async with asyncio.timeout(5):
            await run_watchdog(n, lambda: 0.0, stall_after=1.0, clock=FakeClock())
    assert receiver.drain() == []
