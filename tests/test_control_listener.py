"""The control API's listener: addresses, the unix socket's mode, stale sockets, tokens."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from anyrtd.address import (
    AddressError,
    TcpAddress,
    UnixAddress,
    is_loopback_host,
    parse_listen,
    read_token,
    split_host_header,
)
from anyrtd.config import Config
from anyrtd.control.server import ControlServer, ControlStartError
from anyrtd.daemon import Daemon
from anyrtd.daemon_port import DaemonPort


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[DaemonPort]:
    d = Daemon(Config(server="http://127.0.0.1:9", state_dir=tmp_path / "state"))
    try:
        yield d.port
    finally:
        await d.client.aclose()


def short_socket(tmp_path: Path, name: str = "c.sock") -> Path:
    # AF_UNIX paths are limited to ~107 bytes; pytest's tmp_path can come close.
    return tmp_path / name


async def test_unix_socket_is_created_0600_whatever_the_umask(
    daemon: DaemonPort, tmp_path: Path
) -> None:
    path = short_socket(tmp_path)
    old = os.umask(0)
    try:
        server = ControlServer(daemon, listen=f"unix:{path}")
        await server.start()
    finally:
        os.umask(old)
    try:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        transport = httpx.AsyncHTTPTransport(uds=str(path))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            resp = await c.get("/openapi.json")
            assert resp.status_code == 200
            # Any Host is fine on the socket: a browser cannot reach it.
            resp = await c.get("/openapi.json", headers={"Host": "rebind.example"})
            assert resp.status_code == 200
    finally:
        await server.stop()
    assert not path.exists()


async def test_a_stale_socket_is_replaced(daemon: DaemonPort, tmp_path: Path) -> None:
    path = short_socket(tmp_path)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a killed daemon leaves
    server = ControlServer(daemon, listen=f"unix:{path}")
    await server.start()
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        await server.stop()


async def test_a_live_socket_is_not_taken_over(daemon: DaemonPort, tmp_path: Path) -> None:
    path = short_socket(tmp_path)
    first = ControlServer(daemon, listen=f"unix:{path}")
    await first.start()
    try:
        with pytest.raises(ControlStartError, match="another process answers there"):
            await ControlServer(daemon, listen=f"unix:{path}").start()
    finally:
        await first.stop()


async def test_a_regular_file_in_the_way_is_refused(daemon: DaemonPort, tmp_path: Path) -> None:
    path = short_socket(tmp_path)
    path.write_text("not a socket")
    with pytest.raises(ControlStartError, match="not a socket"):
        await ControlServer(daemon, listen=f"unix:{path}").start()
    assert path.read_text() == "not a socket"


async def test_the_socket_directory_is_created_owner_only(
    daemon: DaemonPort, tmp_path: Path
) -> None:
    path = tmp_path / "run" / "c.sock"
    server = ControlServer(daemon, listen=f"unix:{path}")
    await server.start()
    try:
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    finally:
        await server.stop()


async def test_tcp_port_zero_reports_the_bound_port(daemon: DaemonPort) -> None:
    server = ControlServer(daemon, listen="127.0.0.1:0")
    await server.start()
    try:
        assert isinstance(server.address, TcpAddress)
        assert server.address.port > 0
        async with httpx.AsyncClient(base_url=server.url) as c:
            assert (await c.get("/openapi.json")).status_code == 200
    finally:
        await server.stop()


async def test_a_port_in_use_names_the_likely_cause(daemon: DaemonPort) -> None:
    first = ControlServer(daemon, listen="127.0.0.1:0")
    await first.start()
    assert isinstance(first.address, TcpAddress)
    try:
        with pytest.raises(ControlStartError, match="is another anyrtd running"):
            await ControlServer(daemon, listen=f"127.0.0.1:{first.address.port}").start()
    finally:
        await first.stop()


@pytest.mark.parametrize("listen", ["7010", "localhost", "unix:", "127.0.0.1:70100", ":7010"])
async def test_bad_listen_addresses_are_refused(daemon: DaemonPort, listen: str) -> None:
    with pytest.raises(ControlStartError, match="listen address"):
        await ControlServer(daemon, listen=listen).start()


async def test_a_missing_or_open_token_file_stops_the_start(
    daemon: DaemonPort, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    with pytest.raises(ControlStartError, match="not found"):
        await ControlServer(daemon, listen="127.0.0.1:0", token_file=token).start()
    token.write_text("abc\n")
    token.chmod(0o640)
    with pytest.raises(ControlStartError, match="chmod 600"):
        await ControlServer(daemon, listen="127.0.0.1:0", token_file=token).start()


async def test_the_token_is_not_asked_on_the_unix_socket(
    daemon: DaemonPort, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    token.chmod(0o644)  # not even read: the socket's mode is the guard
    path = short_socket(tmp_path)
    server = ControlServer(daemon, listen=f"unix:{path}", token_file=token)
    await server.start()
    try:
        transport = httpx.AsyncHTTPTransport(uds=str(path))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            assert (await c.get("/openapi.json")).status_code == 200
    finally:
        await server.stop()


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:7010") == TcpAddress("127.0.0.1", 7010)
    assert parse_listen("[::1]:7010") == TcpAddress("::1", 7010)
    assert str(parse_listen("[::1]:7010")) == "[::1]:7010"
    assert parse_listen("unix:/run/anyrtd/control.sock") == UnixAddress(
        Path("/run/anyrtd/control.sock")
    )
    with pytest.raises(AddressError):
        parse_listen("nonsense")
    with pytest.raises(AddressError):  # a digit to str.isdigit, but not to int()
        parse_listen("127.0.0.1:\u00b9")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("app.localhost", True),
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("[::1]", True),
        ("::1", True),
        ("10.0.0.1", False),
        ("evil.example", False),
        ("localhost.evil.example", False),
        ("", False),
    ],
)
def test_loopback_names(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(
    ("header", "host"),
    [("localhost:7010", "localhost"), ("[::1]:7010", "[::1]"), ("[::1]", "[::1]"), ("x", "x")],
)
def test_split_host_header(header: str, host: str) -> None:
    assert split_host_header(header) == host


def test_read_token(tmp_path: Path) -> None:
    token = tmp_path / "t"
    token.write_text("  abc  \n")
    token.chmod(0o600)
    assert read_token(token, check_mode=True) == "abc"
    token.write_text("two words\n")
    with pytest.raises(AddressError, match="one token"):
        read_token(token, check_mode=True)
