"""A fake transport for the server client (`anyrtd.client.Transport`): answers made up by a
test, no server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from anyrtd.client import Reply


async def chunks(parts: Iterable[bytes], pause: float = 0.0) -> AsyncIterator[bytes]:
    for part in parts:
        if pause:
            await asyncio.sleep(pause)
        yield part


Answer = tuple[int, Mapping[str, str], Callable[[], AsyncIterator[bytes]]]


def answer(status: int, body: bytes, headers: Mapping[str, str] | None = None) -> Answer:
    return status, headers or {}, lambda: chunks([body])


class FakeTransport:
    """Answers each request with the next of `answers` (the last one again once they run out),
    and notes what was asked."""

    def __init__(
        self, *answers: Answer, by: Callable[[str, bytes | None], Answer] | None = None
    ) -> None:
        self.answers = list(answers)
        self.by = by
        """When set, makes each answer from the request's URL and body instead."""
        self.asked: list[tuple[str, str, bytes | None, float]] = []
        self.closed = False

    @asynccontextmanager
    async def exchange(
        self,
        method: str,
        url: str,
        body: bytes | None,
        params: Mapping[str, Any] | None,
        wait: float,
    ) -> AsyncIterator[Reply]:
        self.asked.append((method, url, body, wait))
        if self.by is not None:
            status, headers, make = self.by(url, body)
        else:
            status, headers, make = (
                self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
            )
        yield Reply(status, headers, make())

    async def aclose(self) -> None:
        self.closed = True


def taken(body: bytes | None) -> Answer:
    """Return the answer of a server that took every record of a write request."""
    ids = [r["id"] for r in json.loads(body or b"{}")["records"]]
    return answer(200, json.dumps({"records": [{"id": i, "version": 1} for i in ids]}).encode())
