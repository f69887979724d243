"""The server client's deadline, size cap and `Retry-After` over its real transport (aiohttp)
against a real HTTP server on 127.0.0.1, port 0, that misbehaves: it trickles an answer a
byte at a time, sends an endless answer, or throttles."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from anyrtd.client import BadAnswer, ServerClient, ServerUnavailable

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def trickle(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    try:
        for _ in range(600):  # a minute, a byte every 0.1 s: each read wait is short
            await resp.write(b" ")
            await asyncio.sleep(0.1)
    except (ConnectionError, asyncio.CancelledError):
        pass
    return resp


async def endless(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    try:
        for _ in range(50 * 16):  # 50 MB, if anyone read it all
            await resp.write(b"[" * 65536)
    except (ConnectionError, asyncio.CancelledError):
        pass
    return resp


async def throttled(request: web.Request) -> web.Response:
    return web.json_response(
        {"error": {"code": "rate_limited", "message": "slow down"}},
        status=429,
        headers={"retry-after": "5"},
    )


async def test_an_answer_trickling_in_ends_at_the_deadline_though_bytes_keep_coming() -> None:
    async with serving(trickle) as url, ServerClient(url, timeout=0.5, deadline=1.0) as client:
        began = time.monotonic()
        with pytest.raises(ServerUnavailable, match=r"no whole answer in 1 s"):
            await client.spaces()
        assert 0.9 < time.monotonic() - began < 5.0


async def test_an_endless_answer_is_cut_at_the_cap_and_is_the_servers_fault() -> None:
    async with serving(endless) as url, ServerClient(url, max_answer_bytes=1_000_000) as client:
        with pytest.raises(BadAnswer, match="over the 1,000,000-byte cap"):
            await client.spaces()
        assert client.reach.fault is not None and "cap" in client.reach.fault


async def test_a_429_with_retry_after_comes_through_the_real_transport() -> None:
    async with serving(throttled) as url, ServerClient(url) as client:
        with pytest.raises(ServerUnavailable) as caught:
            await client.spaces()
    assert caught.value.retry_after == 5.0
