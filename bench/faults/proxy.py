"""A misbehaving server: a small HTTP proxy in front of a real devserver that passes requests
through, or answers them itself as a server in trouble does (a 429 storm with `Retry-After`,
a 200 with an HTML maintenance page, a 200 with a truncated body).

It runs in a thread of the harness, on `127.0.0.1` port 0, with its own event loop; the
daemon under test is given its `.url` as the server. The mode is read when an answer is
sent, so a long poll that was waiting when the mode changed gets the new mode's answer.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

from aiohttp import ClientSession, ClientTimeout, web
from yarl import URL

PASS = "pass"
THROTTLE = "429"
HTML = "html"
TRUNCATED = "truncated"
MODES = (PASS, THROTTLE, HTML, TRUNCATED)

MAINTENANCE = (
    b"<!DOCTYPE html>\n<html><head><title>503 Service Temporarily Unavailable</title></head>"
    b"<body><h1>Down for maintenance</h1><p>We will be back shortly.</p></body></html>\n"
)
RATE_LIMITED = b'{"error": {"code": "rate_limited", "message": "too many requests; slow down"}}'


class FaultProxy:
    """`.url`, `.mode` (one of `MODES`, set at any time), `.answered` (answers by mode)."""

    def __init__(self, upstream: str, *, retry_after: str = "5") -> None:
        self.upstream = upstream.rstrip("/")
        self.retry_after = retry_after
        self.mode = PASS
        self.url = ""
        self.answered: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout: float = 30.0) -> FaultProxy:
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"the fault proxy did not start: {self._error!r}")
        return self

    def stop(self, timeout: float = 15.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._loop = self._thread = None

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._open())
        except BaseException as exc:  # handed to the starting thread
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._close())
            loop.close()

    async def _open(self) -> None:
        self._session = ClientSession(timeout=ClientTimeout(total=120))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if self.mode == PASS:
            status, content_type, body = await self._forward(request)
        else:
            status, content_type, body = 0, "", b""
        mode = self.mode  # as the answer leaves: a long poll gets the mode of its end
        self.answered[mode] += 1
        if mode == THROTTLE:
            return web.Response(
                status=429,
                body=RATE_LIMITED,
                content_type="application/json",
                headers={"Retry-After": self.retry_after},
            )
        if mode == HTML:
            return web.Response(status=200, body=MAINTENANCE, content_type="text/html")
        if mode == TRUNCATED:
            if not body:
                status, content_type, body = await self._forward(request)
            return web.Response(status=200, body=body[: max(1, len(body) // 2)])
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    async def _forward(self, request: web.Request) -> tuple[int, str, bytes]:
        assert self._session is not None
        data = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with self._session.request(
            request.method,
            URL(self.upstream + request.raw_path, encoded=True),  # `bao%2Fv1` stays encoded
            data=data if data else None,
            headers=headers if data else None,
        ) as resp:
            body = await resp.read()
            return resp.status, resp.headers.get("Content-Type", "application/json"), body
