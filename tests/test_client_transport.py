"""The server client against a fake transport, no server: which answers are transient (the
server's "not now"), which are the server's fault (`BadAnswer`), `Retry-After`, the size cap
and the deadline. The wire contract itself is tested against the real devserver elsewhere."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from email.utils import formatdate
from typing import Any

import pytest
from aiohttp import web
from fake_transport import FakeTransport, answer, chunks

from anyrtd.client import (
    RETRY_AFTER_MAX_S,
    BadAnswer,
    Reach,
    Reply,
    ServerClient,
    ServerError,
    ServerUnavailable,
    Unreached,
)

URL = "http://any.invalid:7001"


class Refusing(FakeTransport):
    @asynccontextmanager
    async def exchange(
        self,
        method: str,
        url: str,
        body: bytes | None,
        params: Mapping[str, Any] | None,
        wait: float,
    ) -> AsyncIterator[Reply]:
        raise Unreached("ConnectError: Connection refused")
        yield  # pragma: no cover - an async generator that never yields


def client(transport: FakeTransport, **kw: Any) -> ServerClient:
    return ServerClient(URL, transport=transport, now=lambda: 1000.0, **kw)


SPACES = answer(200, b'{"spaces": [{"id": "bao", "name": "bao"}]}')


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
async def test_not_now_statuses_are_transient_not_a_refusal(status: int) -> None:
    fake = FakeTransport(answer(status, b'{"error": {"code": "busy", "message": "later"}}'))
    async with client(fake) as c:
        with pytest.raises(ServerUnavailable) as caught:
            await c.spaces()
    assert not isinstance(caught.value, ServerError)
    assert f"server answered {status}" in str(caught.value)
    assert fake.closed


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        ("5", 5.0),
        ("0.5", 0.5),
        ("86400", RETRY_AFTER_MAX_S),  # capped: asked again a minute later at the latest
        ("-3", 0.0),
        ("soon", None),
        ("nan", None),
        (formatdate(1000.0 + 20, usegmt=True), 20.0),  # an HTTP date, against the client's clock
    ],
)
async def test_a_429_carries_the_wait_its_retry_after_asks_for(
    header: str, wait: float | None
) -> None:
    fake = FakeTransport(answer(429, b"slow down", {"retry-after": header}))
    async with client(fake) as c:
        with pytest.raises(ServerUnavailable) as caught:
            await c.spaces()
    assert caught.value.retry_after == wait


async def test_a_refusal_of_the_request_stays_a_server_error() -> None:
    body = b'{"error": {"code": "bad_request", "message": "records[0]: no id"}}'
    async with client(FakeTransport(answer(400, body))) as c:
        with pytest.raises(ServerError) as caught:
            await c.spaces()
    assert (caught.value.status, caught.value.code) == (400, "bad_request")


@pytest.mark.parametrize(
    "body",
    [
        b"<html><head><title>Down for maintenance</title></head>\x1b[31m</html>",
        b'{"spaces": [{"id": "bao", "na',  # truncated
        b"[1, 2, 3]",  # JSON, but not an object
        b'{"spaces": [1, 2]}',  # an object of another shape
        b'{"nothing": "here"}',
    ],
)
async def test_a_200_that_is_not_the_servers_json_is_a_bad_answer(body: bytes) -> None:
    async with client(FakeTransport(answer(200, body))) as c:
        with pytest.raises(BadAnswer):
            await c.spaces()
        assert c.reach.faulty_since == 1000.0 and c.reach.fault is not None
        assert c.reach.unreachable_since is None  # it answers: it is reached


async def test_a_child_the_server_answers_with_html_is_the_servers_fault_not_a_type_error() -> None:
    html = answer(200, b"<!doctype html><p>maintenance</p>", {"Content-Type": "text/html"})
    async with client(FakeTransport(html)) as c:
        with pytest.raises(ServerUnavailable):  # what a program lets propagate: not its fault
            await c.child("bao", "bao/v1", "bao/chat/general")


async def test_bad_answers_are_logged_once_a_condition_and_cleared_by_a_sound_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    html = answer(200, b"<html>\x1b]52;c;aGk=\x07 maintenance</html>")
    big = (200, {}, lambda: chunks([b"x" * 600] * 10))
    fake = FakeTransport(html, html, html, big, big, SPACES, html)
    caplog.set_level(logging.INFO, logger="anyrtd.client")
    async with client(fake, max_answer_bytes=1000) as c:
        for _ in range(5):
            with pytest.raises(BadAnswer):
                await c.spaces()
        assert c.reach.fault is not None and "cap" in c.reach.fault
        assert await c.spaces() == [{"id": "bao", "name": "bao"}]
        assert c.reach == Reach()
        with pytest.raises(BadAnswer):
            await c.spaces()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines  # not JSON; over the cap; sound again; not JSON
    first, cap, again, last = lines
    assert "GET /v1/spaces answered 200 with a body that is not JSON" in first
    assert "b'<html>\\x1b]52;c;aGk=\\x07 maintenance</html>'" in first  # escaped
    assert "\x1b" not in first and "\x07" not in first
    assert "over the 1,000-byte cap" in cap and "answers soundly again" in again
    assert "not JSON" in last


async def test_an_answer_over_the_cap_is_not_read_past_it() -> None:
    read: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        while True:
            read.append(1)
            yield b"x" * 1024

    async with client(FakeTransport((200, {}, endless)), max_answer_bytes=10_000) as c:
        with pytest.raises(BadAnswer, match="over the 10,000-byte cap"):
            await c.spaces()
    assert len(read) == 10  # the chunk that passed the cap is the last one read


async def test_a_trickling_answer_ends_at_the_deadline() -> None:
    trickle = (200, {}, lambda: chunks([b"{"] + [b" "] * 10_000, pause=0.05))
    async with client(FakeTransport(trickle), deadline=0.5) as c:
        began = time.monotonic()
        with pytest.raises(ServerUnavailable, match=r"no whole answer in 0\.5 s") as caught:
            await c.spaces()
        took = time.monotonic() - began
        assert not isinstance(caught.value, BadAnswer)
        assert c.reach.unreachable_since == 1000.0
    assert 0.4 < took < 3.0


async def test_a_long_poll_gets_its_wait_on_top_of_the_deadline_and_the_read_wait() -> None:
    fake = FakeTransport(answer(200, b'{"changes": [], "seq": 7}'))
    async with client(fake, timeout=10.0, deadline=30.0) as c:
        page = await c.changes("bao", since=3, wait=25.0)
    assert page is not None and page.seq == 7
    assert fake.asked[0][3] == 35.0  # the transport's wait for bytes: 10 s + the poll's 25 s


async def test_an_unreached_server_is_noted_as_unreachable() -> None:
    async with client(Refusing(SPACES)) as c:
        with pytest.raises(ServerUnavailable, match="Connection refused"):
            await c.spaces()
        assert c.reach.unreachable_since == 1000.0 and c.reach.faulty_since is None


async def test_a_write_answered_with_a_page_is_a_bad_answer_and_may_be_sent_again() -> None:
    from anyrtd.client import Dataset, Upsert

    fake = FakeTransport(answer(200, b'{"records": [{"id": "a"}]}'))
    async with client(fake) as c:
        with pytest.raises(BadAnswer):
            await c.upsert(Dataset("bao", "obj", "agent_triggers"), [Upsert("a", {"x": 1})])
    method, url, body, _ = fake.asked[0]
    assert (method, url) == ("POST", f"{URL}/v1/spaces/bao/upsert") and body is not None


async def test_bad_answers_make_the_health_degraded_while_they_last() -> None:
    from anyrtd.port import server_reasons

    html = answer(200, b"<html>maintenance</html>")
    async with client(FakeTransport(html, SPACES)) as c:
        with pytest.raises(BadAnswer):
            await c.spaces()
        fault, writes = server_reasons(c.reach, 3)
        assert fault.startswith("server answers badly since 1970-01-01T00:16:40Z (GET /v1/")
        assert "a body that is not JSON" in fault
        assert writes == "3 writes waiting in the outbox for the server"
        await c.spaces()
        assert server_reasons(c.reach, 3) == []


async def test_a_429_storm_makes_the_health_degraded_until_a_sound_answer() -> None:
    from anyrtd.port import server_reasons

    fake = FakeTransport(answer(429, b"", {"Retry-After": "5"}), answer(503, b""))
    async with client(fake) as c:
        with pytest.raises(ServerUnavailable):
            await c.spaces()
        (fault, _) = server_reasons(c.reach, 1)
        assert "429 Too Many Requests" in fault
        with pytest.raises(ServerUnavailable):
            await c.spaces()  # still a fault until a sound answer, not cleared by a 503
        assert c.reach.faulty_since is not None


async def test_a_prune_answered_without_a_body_is_taken() -> None:
    fake = FakeTransport(answer(204, b""), answer(200, b""))
    async with client(fake) as c:
        await c.prune("peer-1")
        assert c.reach == Reach()
        with pytest.raises(BadAnswer):  # where an answer is owed, an empty one is not one
            await c.spaces()


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="needs glibc's malloc_trim"
)
async def test_answers_refused_at_the_cap_give_their_memory_back() -> None:
    async def fifty_mb(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(50):
                await resp.write(b"x" * (1 << 20))
        return resp

    app = web.Application()
    app.router.add_get("/v1/spaces", fifty_mb)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with ServerClient(f"http://127.0.0.1:{runner.addresses[0][1]}") as c:
            before = _rss_mb()
            for _ in range(5):  # an answer of 50 MB, read up to the cap (16 MB) each
                with pytest.raises(BadAnswer, match="cap"):
                    await c.spaces()
            grown = _rss_mb() - before
    finally:
        await runner.cleanup()
    assert grown < 12, f"resident memory grew {grown:.1f} MB over five refused answers"
