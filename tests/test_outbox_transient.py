"""The drain tells "not now" from "never": a 429, a 408, a 5xx or an answer that is not the
server's JSON leaves every write queued (with the wait a `Retry-After` asked for); only what
the server refuses for good (400, 409, 413, 422 for the one write) is set aside. Through the
real server client over a fake transport, and a real mirror."""

from __future__ import annotations

import json

import pytest
from fake_transport import Answer, FakeTransport, answer, taken
from test_outbox import NOW, locate, queue

from anyrtd.client import ServerClient
from anyrtd.mirror import AsyncMirror, Mirror
from anyrtd.outbox import RUNS, TRIGGERS, drain

WRITES = [
    (RUNS, "r1", {"status": "ok"}),
    (TRIGGERS, "once-1", {"enabled": False, "lastRunAt": NOW}),
    (RUNS, "r2", {"status": "ok"}),
]


@pytest.mark.parametrize(
    ("status", "body", "headers", "wait"),
    [
        (
            429,
            b'{"error": {"code": "rate_limited", "message": "slow down"}}',
            {"Retry-After": "5"},
            5.0,
        ),
        (429, b"Too Many Requests", {}, None),
        (408, b"", {}, None),
        (500, b"oops", {}, None),
        (503, b"", {"Retry-After": "7200"}, 60.0),  # capped
        (200, b"<html>maintenance</html>", {}, None),
        (200, b'{"records": [{"id": "r1", "vers', {}, None),  # truncated
        (401, b'{"error": {"code": "unauthorized", "message": "no token"}}', {}, None),
    ],
)
async def test_a_storm_of_not_now_answers_keeps_every_write_queued(
    mirror: AsyncMirror,
    status: int,
    body: bytes,
    headers: dict[str, str],
    wait: float | None,
) -> None:
    await queue(mirror, WRITES)
    storm = FakeTransport(answer(status, body, headers))
    async with ServerClient("http://any.invalid", transport=storm) as client:
        for _ in range(3):
            result = await drain(mirror, client, locate, now=lambda: NOW + 5)
            assert result.error is not None and result.set_aside == 0 and result.sent == 0
            assert result.retry_after == wait
    assert await mirror.call(Mirror.outbox_counts) == (3, 0)
    calm = FakeTransport(by=lambda url, sent: taken(sent))
    async with ServerClient("http://any.invalid", transport=calm) as client:
        result = await drain(mirror, client, locate, now=lambda: NOW + 10)
    assert (result.error, result.set_aside, result.sent) == (None, 0, 3)
    assert await mirror.call(Mirror.outbox_counts) == (0, 0)


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, "bad_request"), (409, "tombstoned"), (413, "too_large"), (422, "invalid")],
)
async def test_a_write_the_server_refuses_for_good_is_set_aside_and_the_rest_go(
    mirror: AsyncMirror,
    status: int,
    code: str,
) -> None:
    await queue(mirror, [*WRITES, (RUNS, "bad", {"status": "ok"})])

    def server(url: str, sent: bytes | None) -> Answer:
        ids = [r["id"] for r in json.loads(sent or b"{}")["records"]]
        if "bad" in ids:
            error = {"error": {"code": code, "message": "records[0]: not taken"}}
            return answer(status, json.dumps(error).encode())
        return taken(sent)

    async with ServerClient("http://any.invalid", transport=FakeTransport(by=server)) as client:
        result = await drain(mirror, client, locate, now=lambda: NOW + 5)
    assert (result.error, result.set_aside, result.sent) == (None, 1, 3)
    (aside,) = await mirror.call(lambda m: m.outbox_set_aside())
    assert aside.record_id == "bad" and f"the server refused it: {status} {code}" in aside.error


async def test_a_429_while_the_drain_sends_one_by_one_keeps_the_writes_queued(
    mirror: AsyncMirror,
) -> None:
    await queue(mirror, [*WRITES, (RUNS, "bad", {"status": "ok"})])
    calls: list[list[str]] = []

    def server(url: str, sent: bytes | None) -> Answer:
        ids = [r["id"] for r in json.loads(sent or b"{}")["records"]]
        calls.append(ids)
        if "bad" in ids:
            return answer(400, b'{"error": {"code": "bad_request", "message": "no"}}')
        if len(calls) > 2:  # the storm starts while the drain looks for the refused write
            return answer(429, b"", {"Retry-After": "3"})
        return taken(sent)

    async with ServerClient("http://any.invalid", transport=FakeTransport(by=server)) as client:
        result = await drain(mirror, client, locate, now=lambda: NOW + 5)
    assert result.error is not None and result.retry_after == 3.0 and result.set_aside == 0
    pending = await mirror.call(lambda m: m.outbox_pending())
    assert {i.id for i in pending} >= {"bad"}
    assert await mirror.call(Mirror.outbox_counts) == (len(pending), 0)
