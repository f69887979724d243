"""Serve the control API inside the daemon's loop: an `AppRunner` behind a connection gate,
on a TCP or unix-socket listener."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
from pathlib import Path

from aiohttp import web

from anyrtd.address import (
    AddressError,
    TcpAddress,
    UnixAddress,
    is_loopback_host,
    parse_listen,
    read_token,
)
from anyrtd.control.api import make_app
from anyrtd.control.gate import (
    HEAD_TIMEOUT_S,
    Acceptor,
    ConnectionGate,
    connection_limit,
    nofile_soft_limit,
)
from anyrtd.control.guard import PROTOCOL_LOG, Guard
from anyrtd.port import Port

log = logging.getLogger("anyrtd.control")


LINGER_S = 2.0
"""How long the rest of a refused body is read (and dropped) before the connection is closed."""
MAX_REQUEST_LINE = 16 * 1024
"""The longest request line read, in bytes (aiohttp's default is 8190): long enough that a
trigger id far over `MAX_ID_LENGTH` reaches the route and is refused with its reason."""


class ControlStartError(Exception):
    """The control API cannot listen; the message says why and what to do."""


class ControlServer:
    """The control API's listener on `listen` (`host:port` or `unix:PATH`): start after
    `Daemon.open()`, stop before `Daemon.stop()`.

    At most `max_connections` at once (by default derived from `RLIMIT_NOFILE`), each
    closed when it sends no whole request head for `head_timeout_s` (`anyrtd.control.gate`).
    """

    def __init__(
        self,
        port: Port,
        listen: str,
        token_file: Path | None = None,
        *,
        max_connections: int | None = None,
        head_timeout_s: float = HEAD_TIMEOUT_S,
    ) -> None:
        self.port = port
        self.max_connections = max_connections
        self.head_timeout_s = head_timeout_s
        self.listen = listen
        self.token_file = token_file
        self.address: TcpAddress | UnixAddress | None = None
        self._runner: web.AppRunner | None = None
        self._socket_path: Path | None = None
        self._acceptor: Acceptor | None = None
        self._gate: ConnectionGate | None = None

    @property
    def url(self) -> str:
        """Return the base URL (for a unix socket, the URL to use over the socket)."""
        assert self.address is not None, "the control API is not started"
        return self.address.url

    async def start(self) -> None:
        """Listen; raise `ControlStartError` with a one-line reason when that is impossible."""
        try:
            address = parse_listen(self.listen)
            token = None
            if isinstance(address, TcpAddress) and self.token_file is not None:
                token = read_token(self.token_file, check_mode=True)
        except AddressError as exc:
            raise ControlStartError(str(exc)) from None
        unix = isinstance(address, UnixAddress)
        extra: frozenset[str] = frozenset()
        if isinstance(address, TcpAddress) and not is_loopback_host(address.host):
            extra = frozenset({address.host.lower()})
            if address.host not in ("0.0.0.0", "::"):
                extra |= {f"[{address.host.lower()}]"}
            if token is None:
                log.warning(
                    "the control API listens on %s, which is not loopback, without a token: "
                    "set token_file in the config",
                    address,
                )
        self._gate = gate = ConnectionGate(
            self._make_protocol,
            limit=self.max_connections or connection_limit(nofile_soft_limit()),
            head_timeout_s=self.head_timeout_s,
        )
        runner = web.AppRunner(
            make_app(self.port, Guard(token=token, unix=unix, extra_hosts=extra), gate=gate),
            access_log=None,
            handle_signals=False,
            logger=PROTOCOL_LOG,
            lingering_time=LINGER_S,
            max_line_size=MAX_REQUEST_LINE,
        )
        await runner.setup()
        self._runner = runner
        try:
            if isinstance(address, UnixAddress):
                sockets = [_bind_unix(address.path)]
                self._socket_path = address.path
            else:
                sockets = await asyncio.to_thread(_bind_tcp, address.host, address.port)
        except ControlStartError:
            await self.stop()
            raise
        except OSError as exc:
            await self.stop()
            hint = (
                "is another anyrtd running? stop it or pick another --listen"
                if exc.errno == errno.EADDRINUSE
                else "pick another --listen"
            )
            raise ControlStartError(
                f"cannot listen on {address}: {exc.strerror or exc}; {hint}"
            ) from None
        self._acceptor = gate.accept_on(sockets)
        if isinstance(address, TcpAddress):
            bound = sockets[0].getsockname()
            address = TcpAddress(address.host, int(bound[1]))
        self.address = address
        log.info("control API listening on %s%s", address, " (bearer token)" if token else "")

    def _make_protocol(self) -> asyncio.Protocol:
        """Return aiohttp's protocol for one admitted connection."""
        assert self._runner is not None and self._runner.server is not None
        return self._runner.server()

    @property
    def gate(self) -> ConnectionGate:
        """Return the connection gate (started only)."""
        assert self._gate is not None, "the control API is not started"
        return self._gate

    async def stop(self) -> None:
        """Stop listening, close the connections and remove the socket file."""
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            acceptor.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._socket_path.unlink()
            self._socket_path = None


def _bind_tcp(host: str, port: int) -> list[socket.socket]:
    """Bind a socket on every address `host` names (IPv4 and IPv6 for `localhost`)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, where in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # the port the first address got, on every one
                where = (where[0], sockets[0].getsockname()[1], *where[2:])
            sock.bind(where)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _bind_unix(path: Path) -> socket.socket:
    """Bind a unix socket at `path`, mode 0600 from its first moment."""
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ControlStartError(
                f"cannot listen on unix:{path}: a file that is not a socket is in the way"
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # stale: left by a daemon that did not stop cleanly
        else:
            raise ControlStartError(
                f"cannot listen on unix:{path}: another process answers there; "
                "is another anyrtd running?"
            )
        finally:
            probe.close()
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The umask makes the socket 0600 as it is created, with no window where others could connect.
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise ControlStartError(f"cannot listen on unix:{path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.setblocking(False)
    return sock
