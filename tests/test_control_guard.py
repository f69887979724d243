"""The control API's guard at its edges, on a real `anyrtd serve` listening on TCP.

`Origin` parsed as a browser serialises it, a request without `Host`, and the 256 KiB body
limit on every route, sent byte for byte over a socket where a client library would
tidy the request up.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from support import put_triggers, wait_until

from anyrtd.control.guard import MAX_BODY

FAR_CRON = {"kind": "cron", "spec": {"cron": "0 0 1 1 *"}}  # never due while a test runs
UNKNOWN = "/triggers/no-such-trigger"
"""Past the guard, a write to it answers 404 and changes nothing."""


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A real daemon on a devserver, its control API on 127.0.0.1 (a free port)."""
    where = tmp_path_factory.mktemp("guard")
    server = DevserverProcess(where / "dev.sqlite3", [], where / "devserver.log").start()
    try:
        daemon = ServeProcess(where, server.url, listen="127.0.0.1:0").start()
        try:
            yield daemon
        finally:
            daemon.stop()
    finally:
        server.stop(timeout=10)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, str]:
        error: dict[str, str] = json.loads(self.body)["error"]
        return error


def send(serve: ServeProcess, request: bytes) -> Answer:
    """Send `request` as is and read the answer until the daemon closes the connection."""
    host, port = serve.listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    return Answer(int(status_line.split()[1]), headers, body)


def request(
    method: str, path: str, headers: dict[str, str], body: bytes = b"", version: str = "1.1"
) -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(body: bytes, size: int = 65536) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


LOCAL = {"Host": "127.0.0.1"}


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example\\@127.0.0.1",
        "http://evil.example\\@127.0.0.1:7010",
        "http://user@127.0.0.1",
        "http://127.0.0.1@evil.example",
        "http://127.0.0.1/",
        "http://127.0.0.1:7010/path",
        "http://127.0.0.1?x",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:",
        "ftp://127.0.0.1",
        "http://[::1",
        "http://127.0.0.1.evil.example",
        "null",
        "",
    ],
)
def test_an_origin_other_than_a_browsers_loopback_origin_is_refused(
    serve: ServeProcess, origin: str
) -> None:
    answer = send(serve, request("POST", f"{UNKNOWN}/disable", {**LOCAL, "Origin": origin}))
    assert answer.status == 403, origin
    assert answer.error()["code"] == "cross_origin"


@pytest.mark.parametrize(
    "origin",
    ["http://127.0.0.1:7010", "http://localhost", "https://[::1]:8443", "http://LOCALHOST:3000"],
)
def test_a_loopback_origin_may_write(serve: ServeProcess, origin: str) -> None:
    answer = send(serve, request("POST", f"{UNKNOWN}/disable", {**LOCAL, "Origin": origin}))
    assert answer.status == 404, origin  # past the guard: the trigger does not exist
    assert answer.error()["code"] == "not_found"


def log_tail(serve: ServeProcess, offset: int) -> str:
    return serve.log.read_text(errors="replace")[offset:]


def test_a_request_without_host_is_a_clean_400(serve: ServeProcess) -> None:
    offset = serve.log.stat().st_size
    # HTTP/1.0 may leave Host out: the guard answers.
    old = send(serve, request("GET", "/healthz", {}, version="1.0"))
    assert old.status == 400
    assert "no Host header" in old.error()["message"]
    # HTTP/1.1 must carry it: aiohttp's parser refuses the request before any route.
    new = send(serve, request("POST", f"{UNKNOWN}/run", {}))
    assert new.status == 400
    assert b"Host" in new.body

    assert serve._ticking()  # the daemon answers on
    tail = log_tail(serve, offset)
    assert "Traceback" not in tail and " ERROR " not in tail, tail
    assert "WARNING anyrtd.control.http: control API: refused a malformed request from " in tail
    assert "Missing 'Host' header" in tail


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", f"{UNKNOWN}/enable"),
        ("POST", f"{UNKNOWN}/disable"),
        ("POST", f"{UNKNOWN}/run"),
        ("PATCH", UNKNOWN),
        ("GET", "/healthz"),
    ],
)
def test_a_body_over_256_kib_is_413_on_every_route(
    serve: ServeProcess, method: str, path: str
) -> None:
    body = b'{"x": "' + b"a" * MAX_BODY + b'"}'
    json_type = {**LOCAL, "Content-Type": "application/json"}
    length = {"Content-Length": str(len(body))}
    sized = send(serve, request(method, path, {**json_type, **length}, body))
    assert sized.status == 413, (method, path)
    assert sized.error()["code"] == "too_large"
    assert f"this one is {len(body)} bytes" in sized.error()["message"]

    streamed = send(
        serve, request(method, path, {**json_type, "Transfer-Encoding": "chunked"}, chunked(body))
    )
    assert streamed.status == 413, (method, path)
    assert streamed.error()["code"] == "too_large"


def test_a_body_within_the_limit_reaches_the_handler_whole(serve: ServeProcess) -> None:
    put_triggers(serve.server_url, {"guarded": {**FAR_CRON, "program": "agent:remind@v1"}})
    wait_until(
        lambda: send(serve, request("GET", "/triggers/guarded", LOCAL)).status == 200,
        timeout=20,
        what="the daemon to see the trigger",
    )
    body = json.dumps({"enabled": False, "pad": "a" * (MAX_BODY - 64)}).encode()
    assert len(body) <= MAX_BODY
    json_type = {**LOCAL, "Content-Type": "application/json"}
    for framing in ({"Content-Length": str(len(body))}, {"Transfer-Encoding": "chunked"}):
        sent = chunked(body) if "Transfer-Encoding" in framing else body
        answer = send(serve, request("PATCH", "/triggers/guarded", {**json_type, **framing}, sent))
        # The handler parsed all of it: it refuses the key at its end and changes nothing.
        assert answer.status == 400, framing
        assert "pad" in answer.error()["message"]
    shown = json.loads(send(serve, request("GET", "/triggers/guarded", LOCAL)).body)
    assert shown["enabled"] is True
