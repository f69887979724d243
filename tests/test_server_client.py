"""The server client's HTTP side: the proxy the environment names, read once, and reached for
real; a client closed in one event loop and used in the next."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from anyrtd.client import ServerClient, proxy_for


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def test_the_proxy_is_the_one_the_environment_names_for_the_server(
    no_proxy_env: pytest.MonkeyPatch,
) -> None:
    assert proxy_for("http://any.example:7001") is None
    no_proxy_env.setenv("http_proxy", "http://proxy.example:3128")
    no_proxy_env.setenv("no_proxy", "localhost,127.0.0.1,.internal")
    assert proxy_for("http://any.example:7001") == "http://proxy.example:3128"
    assert proxy_for("https://any.example") is None  # no https_proxy
    assert proxy_for("http://127.0.0.1:7001") is None
    assert proxy_for("http://box.internal:7001") is None


@asynccontextmanager
async def proxy(seen: list[str]) -> AsyncIterator[str]:
    """A forward proxy on 127.0.0.1 that answers every request itself and notes its URL."""

    async def answer(request: web.Request) -> web.Response:
        seen.append(str(request.url))
        return web.json_response({"spaces": [{"id": "bao", "name": "bao"}]})

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


async def test_requests_go_through_the_proxy_the_environment_names(
    no_proxy_env: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []
    async with proxy(seen) as url:
        no_proxy_env.setenv("http_proxy", url)
        # Nothing could answer at this address but the proxy.
        async with ServerClient("http://any-server.invalid:7001") as client:
            assert await client.spaces() == [{"id": "bao", "name": "bao"}]
            await client.spaces()
    assert seen == ["http://any-server.invalid:7001/v1/spaces"] * 2


def test_a_client_closed_in_one_event_loop_works_again_in_the_next(
    no_proxy_env: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []
    client = ServerClient("http://any-server.invalid:7001")

    async def ask() -> None:
        async with proxy(seen) as url:
            no_proxy_env.setenv("http_proxy", url)
            await client.spaces()
            await client.aclose()

    asyncio.run(ask())
    asyncio.run(ask())  # the first loop, and its session, are gone
    assert len(seen) == 2
