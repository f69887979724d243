"""What keeps the control API from eating the daemon: a cap on its connections, deadlines
for the requests on them, and a cap on the handlers that run at once.

Each connection costs a file descriptor, and the daemon's runs and mirror need theirs: a
client that opens hundreds of connections and sends half a request on each must not
take them all. The gate admits at most `limit` connections (derived from the process's
`RLIMIT_NOFILE`, `connection_limit`); when they are all taken, a new one takes the place
of the oldest connection that is not in the middle of a request, and only when every one
is busy is the new one answered 503 and closed at once. A connection must send a whole
request head within `head_timeout_s` of opening (or of its previous answer), and a body
within `body_timeout_s` (`guard.body_refusal`), or it is closed.

A flood of requests must not hold the event loop the timer fires from: `Pacer` lets a
few requests start in each turn of the loop; the others wait for later turns without
using it (docs/control-api.md, Limits).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web

from anyrtd.control.guard import Handler

log = logging.getLogger("anyrtd.control")

HEAD_TIMEOUT_S = 10.0
"""How long a connection may take to send a whole request head, or stay idle between requests."""
MAX_CONNECTIONS = 128
"""The most control connections at once, however many descriptors the process may open."""
MIN_CONNECTIONS = 8
RESERVED_DESCRIPTORS = 128
"""Descriptors kept out of the control API's reach for the daemon itself: the mirror, the
server client, the log, the interpreter. What is left is shared half and half between the
control API and the runs in flight (their pipes)."""
REQUESTS_PER_TURN = 2
"""How many requests may start in one turn of the event loop; the rest wait for later turns."""
BUSY_BODY = (
    b'{"error":{"code":"busy","message":"the control API has too many connections open; '
    b'retry in a moment"}}'
)
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(BUSY_BODY)).encode() + b"\r\n\r\n" + BUSY_BODY
)
"""The whole answer to a connection the gate cannot admit, written before it is closed."""


def nofile_soft_limit() -> int:
    """Return the soft `RLIMIT_NOFILE` of this process (a large number where unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_limit(nofile: int) -> int:
    """Return how many control connections a process that may open `nofile` descriptors
    admits: half of what `RESERVED_DESCRIPTORS` leaves, within [MIN, MAX]_CONNECTIONS."""
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, (nofile - RESERVED_DESCRIPTORS) // 2))


class _Connection(asyncio.Protocol):
    """One control connection: counted by the gate, handed to aiohttp's protocol once admitted."""

    __slots__ = ("_deadline", "_gate", "busy", "inner", "opened", "transport")

    def __init__(self, gate: ConnectionGate) -> None:
        self._gate = gate
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.opened = 0.0
        self.busy = 0
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.opened = time.monotonic()
        if not self._gate.admit(self):
            transport.write(BUSY)
            transport.close()
            return
        self.inner = self._gate.make_protocol()
        self._gate.register(self)
        self.arm()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        self._gate.release(self)
        inner, self.inner = self.inner, None
        self.transport = None
        if inner is not None:
            inner.connection_lost(exc)

    def arm(self) -> None:
        """Start the clock on the next request head."""
        self.disarm()
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self._gate.head_timeout_s, self._too_slow)

    def disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _too_slow(self) -> None:
        self._deadline = None
        if self.busy == 0:
            self._gate.timed_out += 1
            self.close()


class ConnectionGate:
    """The protocol factory the control API listens with (see the module's docstring)."""

    def __init__(
        self,
        make_protocol: Callable[[], Any],
        *,
        limit: int,
        head_timeout_s: float = HEAD_TIMEOUT_S,
    ) -> None:
        self.make_protocol = make_protocol
        self.limit = limit
        self.head_timeout_s = head_timeout_s
        self._open: dict[_Connection, None] = {}  # in the order they opened: oldest first
        self._by_protocol: dict[object, _Connection] = {}
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0

    def __call__(self) -> _Connection:
        return _Connection(self)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def admit(self, conn: _Connection) -> bool:
        """Count `conn` in, closing the oldest idle connection to make room; False when all
        `limit` are busy."""
        if len(self._open) >= self.limit:
            idle = next((c for c in self._open if c.busy == 0), None)
            if idle is None:
                self.refused += 1
                return False
            self.evicted += 1
            self._forget(idle)
            idle.disarm()
            idle.close()
        self._open[conn] = None
        return True

    def release(self, conn: _Connection) -> None:
        self._forget(conn)

    def _forget(self, conn: _Connection) -> None:
        self._open.pop(conn, None)
        if conn.inner is not None:
            self._by_protocol.pop(conn.inner, None)

    def register(self, conn: _Connection) -> None:
        """Note which aiohttp protocol serves `conn`, for the middleware to find it."""
        self._by_protocol[conn.inner] = conn

    @web.middleware
    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Stop the head deadline while a request is answered; start it again after."""
        conn = self._by_protocol.get(request.protocol)
        if conn is None:
            return await handler(request)
        conn.busy += 1
        conn.disarm()
        try:
            return await handler(request)
        finally:
            conn.busy -= 1
            if conn.busy == 0 and conn.transport is not None:
                conn.arm()


class Pacer:
    """Let at most `per_turn` requests start their work in one turn of the event loop.

    A handler that builds its answer without awaiting (the trigger list, say) runs to its
    end in the turn it starts in, and the timer's callbacks run only between turns: with
    a thousand requests ready at once, one turn would take seconds. Those past the first
    `per_turn` wait on a future, which costs the loop nothing, and start in later turns,
    `per_turn` at a time, first come first served.
    """

    def __init__(self, per_turn: int = REQUESTS_PER_TURN) -> None:
        self.per_turn = per_turn
        self._started = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._next_turn: asyncio.Handle | None = None
        self.waited = 0

    async def turn(self) -> None:
        """Return when this request may start: at once, or in a later turn of the loop."""
        if self._started < self.per_turn and not self._waiting:
            self._started += 1
            self._at_next_turn()
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self.waited += 1
        self._at_next_turn()
        await waiter

    def _at_next_turn(self) -> None:
        if self._next_turn is None:
            self._next_turn = asyncio.get_running_loop().call_soon(self._new_turn)

    def _new_turn(self) -> None:
        self._next_turn = None
        self._started = 0
        while self._waiting and self._started < self.per_turn:
            waiter = self._waiting.popleft()
            if not waiter.done():  # a cancelled one (its client went away) gives its place
                waiter.set_result(None)
                self._started += 1
        if self._waiting or self._started:
            self._at_next_turn()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Wait for this request's turn, except `GET /healthz`, which must answer at once."""
        if request.path != "/healthz":
            await self.turn()
        return await handler(request)
