"""What keeps the control API from eating the daemon: a cap on its connections, deadlines
for the requests on them, and a pace for the work they bring.

Each connection costs a file descriptor, and the daemon's runs and mirror need theirs: a
client that opens hundreds of connections and sends half a request on each must not
take them all. The gate admits at most `limit` connections (derived from the process's
`RLIMIT_NOFILE`, `connection_limit`); when they are all taken, a new one takes the place
of the oldest connection that has had no request in progress for `EVICT_IDLE_S`, and
when there is none, `Acceptor` stops accepting until there is (the kernel holds the new
ones meanwhile). A connection must send a whole request head within `head_timeout_s` of
opening (or of its previous answer), and a body within `guard.BODY_TIMEOUT_S`
(`guard.body_refusal`), or it is closed.

A flood of requests must not hold the event loop the timer fires from: `Pacer` lets a
few requests start in each turn of the loop, and leaves the loop alone as long again;
the others wait for later turns without using it (docs/control-api.md, Limits).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web

from anyrtd.control.guard import Handler

log = logging.getLogger("anyrtd.control")

HEAD_TIMEOUT_S = 10.0
"""How long a connection may take to send a whole request head, or stay idle between requests."""
EVICT_IDLE_S = 0.25
"""How long a connection must have had no request in progress before a new one may take its
place: far longer than a busy client takes between two requests."""
BACKLOG = 128
ACCEPTS_PER_TURN = 16
"""How many connections are accepted in one turn of the event loop."""
ACCEPT_RETRY_S = 1.0
"""How long accepting pauses after the process ran out of descriptors to accept with."""
MAX_CONNECTIONS = 1024
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

    __slots__ = ("_deadline", "_gate", "busy", "idle_since", "inner", "transport")

    def __init__(self, gate: ConnectionGate) -> None:
        self._gate = gate
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.busy = 0
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.idle_since = time.monotonic()
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
        inner, self.inner = self.inner, None
        self.transport = None
        self._gate.release(self, inner)
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
    """The protocol factory the control API's connections are made with (see the module's
    docstring); `Acceptor` asks it whether there is room before it accepts one."""

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
        self._acceptor: Acceptor | None = None
        """What accepts the connections (`accept_on`): told when one ends, to resume."""
        self.accepting = 0
        """Connections accepted whose protocol is not made yet."""
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

    def has_room(self) -> bool:
        """Return whether one more connection may be accepted now."""
        need = len(self._open) + self.accepting + 1 - self.limit
        if need <= 0:
            return True
        now = time.monotonic()
        found = 0
        for conn in self._open:  # the ones accepted and not yet admitted take theirs first
            if conn.busy == 0 and now - conn.idle_since >= EVICT_IDLE_S:
                found += 1
                if found >= need:
                    return True
        return False

    def _evictable(self, now: float) -> _Connection | None:
        """Return the oldest connection idle for `EVICT_IDLE_S`, if any."""
        for conn in self._open:
            if conn.busy == 0 and now - conn.idle_since >= EVICT_IDLE_S:
                return conn
        return None

    def admit(self, conn: _Connection) -> bool:
        """Count `conn` in, closing the oldest idle connection to make room; False when there
        is none to close."""
        if len(self._open) >= self.limit:
            idle = self._evictable(time.monotonic())
            if idle is None:
                self.refused += 1
                return False
            self.evicted += 1
            self._forget(idle, idle.inner)
            idle.disarm()
            idle.close()
        self._open[conn] = None
        return True

    def accept_on(self, sockets: list[socket.socket]) -> Acceptor:
        """Return the acceptor of connections on `sockets` while there is room (started)."""
        self._acceptor = Acceptor(self, sockets)
        self._acceptor.start()
        return self._acceptor

    def register(self, conn: _Connection) -> None:
        """Note which aiohttp protocol serves `conn`, for the middleware to find it."""
        self._by_protocol[conn.inner] = conn

    def release(self, conn: _Connection, inner: object) -> None:
        """Forget a connection that ended; there is room again."""
        self._forget(conn, inner)
        if self._acceptor is not None:
            self._acceptor.room()

    def _forget(self, conn: _Connection, inner: object) -> None:
        self._open.pop(conn, None)
        if inner is not None:
            self._by_protocol.pop(inner, None)

    @web.middleware
    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Stop the head deadline while a request is answered; start it again after. While
        every connection is taken, close each one after its answer, so that the clients
        waiting for room get their turn."""
        conn = self._by_protocol.get(request.protocol)
        if conn is None:
            return await handler(request)
        conn.busy += 1
        conn.disarm()
        try:
            response = await handler(request)
            if len(self._open) >= self.limit:
                # Others may be waiting for room: this client queues again behind them.
                response.force_close()
            return response
        finally:
            conn.busy -= 1
            if conn.busy == 0:
                conn.idle_since = time.monotonic()
                if conn.transport is not None:
                    conn.arm()


def gate_metrics(gate: ConnectionGate) -> str:
    """Return the gate's part of `GET /metrics`: connections open, the limit, and the
    connections the daemon closed, by reason."""
    closed = (("evicted", gate.evicted), ("timed_out", gate.timed_out), ("refused", gate.refused))
    lines = [
        "# HELP anyrtd_control_connections Control API connections open now.",
        "# TYPE anyrtd_control_connections gauge",
        f"anyrtd_control_connections {gate.open_connections}",
        "# HELP anyrtd_control_connection_limit The most control API connections at once.",
        "# TYPE anyrtd_control_connection_limit gauge",
        f"anyrtd_control_connection_limit {gate.limit}",
        "# HELP anyrtd_control_connections_closed_total Control API connections the daemon "
        "closed: to make room (evicted), for a slow request (timed_out), or at once (refused).",
        "# TYPE anyrtd_control_connections_closed_total counter",
        *(f'anyrtd_control_connections_closed_total{{reason="{r}"}} {n}' for r, n in closed),
    ]
    return "\n".join(lines) + "\n"


class Acceptor:
    """Accept connections on listening sockets while the gate has room, and stop accepting
    while it has none.

    A connection the gate has no room for stays in the kernel's queue (`BACKLOG`), costing
    the daemon nothing, instead of being accepted only to be closed: a thousand clients
    retrying at once would otherwise keep the event loop busy accepting.
    """

    def __init__(self, gate: ConnectionGate, sockets: list[socket.socket]) -> None:
        self._gate = gate
        self._sockets = sockets
        self._loop = asyncio.get_running_loop()
        self._paused = True
        self._poll: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def sockets(self) -> list[socket.socket]:
        return list(self._sockets)

    def start(self) -> None:
        for sock in self._sockets:
            sock.setblocking(False)
            sock.listen(BACKLOG)
        self._resume()

    def close(self) -> None:
        """Stop accepting and close the listening sockets."""
        self._pause()
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        for sock in self._sockets:  # no room resumes it now: it has no sockets left
            sock.close()
        self._sockets = []

    def _resume(self) -> None:
        if self._paused and self._sockets:
            self._paused = False
            for sock in self._sockets:
                self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _pause(self) -> None:
        if not self._paused:
            self._paused = True
            for sock in self._sockets:
                self._loop.remove_reader(sock.fileno())

    def room(self) -> None:
        """Resume accepting, if paused, when there is room again (a connection ended)."""
        if self._paused and self._sockets and self._gate.has_room():
            if self._poll is not None:
                self._poll.cancel()
                self._poll = None
            self._resume()

    def _wait_for_room(self, after: float) -> None:
        """Pause; look again after `after` s (an idle connection may have become evictable)."""
        self._pause()
        if self._poll is None:
            self._poll = self._loop.call_later(after, self._look_again)

    def _look_again(self) -> None:
        self._poll = None
        if self._gate.has_room():
            self._resume()
        else:
            self._wait_for_room(EVICT_IDLE_S / 2)

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            if not self._gate.has_room():
                self._wait_for_room(EVICT_IDLE_S / 2)
                return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning(
                        "control API: cannot accept a connection: %s; pausing %g s",
                        exc.strerror,
                        ACCEPT_RETRY_S,
                    )
                    self._wait_for_room(ACCEPT_RETRY_S)
                    return
                continue  # ECONNABORTED and the like: that client is gone
            conn.setblocking(False)
            self._gate.accepting += 1
            task = self._loop.create_task(self._connect(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._gate, sock=conn)
        except OSError:
            conn.close()
        finally:
            self._gate.accepting -= 1


class Pacer:
    """Let at most `per_turn` requests start their work in one turn of the event loop, and
    leave the loop as long again to itself before the next ones start.

    A handler that builds its answer without awaiting (the trigger list, say) runs to its
    end in the turn it starts in, and the timer's callbacks run only between turns: with
    a thousand requests ready at once, one turn would take seconds. Those past the first
    `per_turn` wait on a future, which costs the loop nothing, first come first served;
    while requests wait, each batch is followed by a pause as long as its turn took, so
    the control API takes at most about half of the loop's time and anything else that
    comes due waits for one batch at most.
    """

    def __init__(self, per_turn: int = REQUESTS_PER_TURN) -> None:
        self.per_turn = per_turn
        self._started = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._next_turn: asyncio.TimerHandle | asyncio.Handle | None = None
        self._batch_at: float | None = None
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
        now = time.perf_counter()
        if self._batch_at is not None:
            spent, self._batch_at = now - self._batch_at, None
            if self._waiting and spent > 0.0005:
                # The last batch ran in the turn that just ended: give the loop as long.
                self._started = self.per_turn
                loop = asyncio.get_running_loop()
                self._next_turn = loop.call_later(min(spent, 0.1), self._new_turn)
                return
        self._started = 0
        while self._waiting and self._started < self.per_turn:
            waiter = self._waiting.popleft()
            if not waiter.done():  # a cancelled one (its client went away) gives its place
                waiter.set_result(None)
                self._started += 1
        if self._started and self._waiting:
            self._batch_at = now
        if self._waiting or self._started:
            self._at_next_turn()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Wait for this request's turn, except `GET /healthz`, which must answer at once."""
        if request.path != "/healthz":
            await self.turn()
        return await handler(request)
