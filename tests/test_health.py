"""What the daemon says of its health when the server is away: the client's reach and the
reasons `/healthz` gives for `degraded` (pure pieces; the process tests are in test_outage)."""

from __future__ import annotations

import socket

import pytest
from aiohttp import web

from anyrtd.client import Reach, ServerClient, ServerError, ServerUnavailable
from anyrtd.port import OUTBOX_BACKLOG, server_reasons


async def test_the_client_notes_since_when_the_server_cannot_be_reached() -> None:
    clock = iter([100.0, 200.0])
    with socket.socket() as probe:  # a port nothing listens on, until the server below does
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def answering(status: int) -> web.AppRunner:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response({"spaces": []}, status=status)

        app = web.Application()
        app.router.add_get("/v1/spaces", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
        return runner

    async with ServerClient(f"http://127.0.0.1:{port}", now=lambda: next(clock)) as client:
        for _ in range(2):
            with pytest.raises(ServerUnavailable):
                await client.spaces()
        assert client.reach.unreachable_since == 100.0  # the first failure, not the last
        assert client.reach.error == f"http://127.0.0.1:{port}: ConnectError: Connection refused"
        server = await answering(503)  # an answer, even a 5xx, means the server is reached
        with pytest.raises(ServerUnavailable):
            await client.spaces()
        assert client.reach == Reach()
        await server.cleanup()
        with pytest.raises(ServerUnavailable):
            await client.spaces()
        assert client.reach.unreachable_since == 200.0
        server = await answering(404)
        try:
            with pytest.raises(ServerError):
                await client.spaces()
        finally:
            await server.cleanup()
        assert client.reach == Reach()


def test_the_reasons_name_the_outage_and_the_writes_it_holds_back() -> None:
    assert server_reasons(Reach(), 0) == []
    assert server_reasons(Reach(), 12) == []  # a few writes on their way: nothing wrong
    away = Reach(unreachable_since=1_800_000_000.0, error="http://x: ConnectError: refused")
    first, second = server_reasons(away, 7)
    assert first.startswith("server unreachable since 2027-01-15T08:00:00Z (")
    assert "ConnectError: refused" in first
    assert second == "7 writes waiting in the outbox for the server"
    assert server_reasons(away, 0) == [first]
    assert server_reasons(Reach(), OUTBOX_BACKLOG) == [
        f"{OUTBOX_BACKLOG} writes waiting in the outbox for the server"
    ]
