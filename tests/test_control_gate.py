"""The control API's connection gate and pacer, on a real listener in this process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from anyrtd.config import Config
from anyrtd.control import guard
from anyrtd.control.gate import (
    MAX_CONNECTIONS,
    MIN_CONNECTIONS,
    Pacer,
    connection_limit,
    gate_metrics,
)
from anyrtd.control.server import ControlServer
from anyrtd.daemon import Daemon

WHOLE = b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
HALF = b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n"
SLOW_BODY = (
    b"POST /triggers/x/disable HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: 10\r\n\r\n{"
)

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Start = Callable[..., Awaitable[ControlServer]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    daemon = Daemon(Config(server="http://127.0.0.1:9", state_dir=tmp_path / "state"))
    servers: list[ControlServer] = []

    async def make(**options: object) -> ControlServer:
        server = ControlServer(daemon.port, "127.0.0.1:0", **options)  # type: ignore[arg-type]
        await server.start()
        servers.append(server)
        return server

    try:
        yield make
    finally:
        for server in servers:
            await server.stop()
        await daemon.client.aclose()


async def connect(server: ControlServer, first: bytes) -> Conn:
    assert server.address is not None
    host, _, port = str(server.address).rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(first)
    await writer.drain()
    return reader, writer


async def answer(conn: Conn, deadline: float = 5.0) -> bytes:
    """Return all the daemon sends before it closes the connection."""
    async with asyncio.timeout(deadline):
        return await conn[0].read()


async def still_open(conn: Conn, wait: float = 0.2) -> bool:
    try:
        async with asyncio.timeout(wait):
            await conn[0].read(1)
    except TimeoutError:
        return True
    return False


def close_all(conns: list[Conn]) -> None:
    for _, writer in conns:
        writer.close()


def test_the_cap_is_half_of_what_the_reserve_leaves_within_bounds() -> None:
    assert connection_limit(256) == 64
    assert connection_limit(1024) == 448
    assert connection_limit(65536) == MAX_CONNECTIONS
    assert connection_limit(524288) == MAX_CONNECTIONS
    assert connection_limit(64) == MIN_CONNECTIONS


async def test_a_half_sent_request_head_is_closed_at_the_head_deadline(start: Start) -> None:
    server = await start(head_timeout_s=0.3)
    half = await connect(server, HALF)
    whole = await connect(server, WHOLE)
    try:
        assert (await answer(half)) == b""
        head = await whole[0].readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        # An idle keep-alive connection is closed the same way once answered.
        assert (await answer(whole)).endswith(b"}")
        assert server.gate.timed_out == 2
    finally:
        close_all([half, whole])


async def test_the_oldest_idle_connection_makes_room_for_a_new_one(start: Start) -> None:
    server = await start(max_connections=3)
    idle = [await connect(server, HALF) for _ in range(3)]
    try:
        fresh = await connect(server, WHOLE)
        head = await fresh[0].readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        # Answered while every connection was taken: closed after its answer, so that
        # others waiting for room get their turn.
        assert b"Connection: close" in head
        assert (await answer(fresh)).endswith(b"}")
        assert (await answer(idle[0])) == b""
        assert await still_open(idle[1]) and await still_open(idle[2])
        assert server.gate.evicted == 1
        fresh[1].close()
        text = gate_metrics(server.gate)  # what GET /metrics adds (the daemon here is not open)
        assert 'anyrtd_control_connections_closed_total{reason="evicted"} 1' in text
        assert "anyrtd_control_connection_limit 3\n" in text
    finally:
        close_all(idle)


async def test_a_connection_past_the_cap_when_all_are_busy_waits_unaccepted_for_room(
    start: Start,
) -> None:
    server = await start(max_connections=2)
    busy = [await connect(server, SLOW_BODY) for _ in range(2)]
    try:
        for conn in busy:  # their heads are in: they wait on their bodies, busy
            assert await still_open(conn)
        extra = await connect(server, WHOLE)  # the kernel holds it: the daemon has no room
        busy.append(extra)
        assert await still_open(extra, wait=0.5)
        assert server.gate.open_connections == 2
        busy[0][1].write(b'"enabled":1}')  # one body completes: that request ends
        await busy[0][1].drain()
        assert (await answer(busy[0])).startswith(b"HTTP/1.1 ")
        head = await extra[0].readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert await still_open(busy[1])
    finally:
        close_all(busy)


async def test_a_body_that_does_not_arrive_in_time_is_answered_408_and_closed(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard, "BODY_TIMEOUT_S", 0.3)
    server = await start()
    slow = await connect(server, SLOW_BODY)
    try:
        sent = await slow[0].readuntil(b"}}")
        assert sent.startswith(b"HTTP/1.1 408")
        assert b'"request_timeout"' in sent
    finally:
        close_all([slow])


async def test_the_pacer_starts_a_few_requests_per_turn_of_the_loop_in_order() -> None:
    pacer = Pacer(per_turn=2)
    turn = 0
    done = asyncio.Event()

    def count_turns() -> None:
        nonlocal turn
        turn += 1
        if not done.is_set():
            asyncio.get_running_loop().call_soon(count_turns)

    asyncio.get_running_loop().call_soon(count_turns)
    started: list[tuple[int, int]] = []

    async def request(n: int) -> None:
        await pacer.turn()
        started.append((n, turn))

    await asyncio.gather(*(request(n) for n in range(10)))
    done.set()
    assert [n for n, _ in started] == list(range(10))
    per_turn: dict[int, int] = {}
    for _, at in started:
        per_turn[at] = per_turn.get(at, 0) + 1
    assert max(per_turn.values()) <= 2
    assert pacer.waited == 8


async def test_a_client_gone_mid_body_is_no_error_in_the_log(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start()
    gone = await connect(server, SLOW_BODY)
    assert await still_open(gone)  # the head is in, the body is awaited
    gone[1].close()
    await gone[1].wait_closed()
    # Another request is answered after the first one's end has been seen.
    other = await connect(server, WHOLE)
    head = await other[0].readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    other[1].close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
