"""A misbehaving change feed (repeating entries already read, its head going back each poll)
is polled with a back-off, not about 99 times a second, and followed again at once when it
behaves. Real processes: a devserver, a proxy in front of it, `anyrtd serve`."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from conftest import DevserverProcess
from control_support import ServeProcess
from support import World, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults.proxy import PASS, FaultProxy

pytestmark = pytest.mark.timeout(120)

REPEAT = "repeat"
BACK = "back"


class FeedProxy(FaultProxy):
    """Passes everything through but `/changes`, which in `REPEAT` mode answers the feed's
    first entries again and again, and in `BACK` mode a head one behind the `since` asked;
    `.polls` counts the `/changes` requests by mode."""

    feed = PASS

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.polls: dict[str, int] = {}

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if not request.path.endswith("/changes"):
            return await super()._answer(request)
        feed = self.feed
        self.polls[feed] = self.polls.get(feed, 0) + 1
        if feed == PASS:
            return await super()._answer(request)
        since = int(request.query.get("since", "0"))
        if feed == BACK:
            body = {"changes": [], "seq": max(0, since - 1)}
            return web.Response(body=json.dumps(body), content_type="application/json")
        assert self._session is not None
        async with self._session.get(
            f"{self.upstream}{request.path}", params={"since": "0", "limit": "3"}
        ) as resp:
            page = await resp.json()
        return web.Response(body=json.dumps(page), content_type="application/json")


@pytest.fixture
def proxy(devserver: DevserverProcess) -> Iterator[FeedProxy]:
    p = FeedProxy(devserver.url)
    p.start()
    try:
        yield p
    finally:
        p.stop()


def _adopted(serve: ServeProcess, rid: str) -> bool:
    with serve.http() as c:
        resp = c.get(f"/triggers/{rid}")
    return resp.status_code == 200 and bool(resp.json().get("adopted"))


@pytest.mark.parametrize("feed", [REPEAT, BACK])
def test_a_misbehaving_feed_is_polled_with_a_back_off_and_followed_once_it_behaves(
    feed: str, proxy: FeedProxy, world: World, tmp_path: Path
) -> None:
    for n in range(4):  # entries for the feed to repeat
        world.put(f"old{n}", kind="cron", spec={"every_s": 3600}, program="agent:remind@v1")
    serve = ServeProcess(tmp_path, proxy.url).start()
    try:
        wait_until(lambda: _adopted(serve, "old3"), timeout=20, what="the records adopted")
        proxy.feed = feed
        time.sleep(6.0)  # the misbehaving stretch whose polls are counted
        polls = proxy.polls.get(feed, 0)
        assert 1 <= polls <= 10, f"{polls} polls of a misbehaving feed in 6 s"
        proxy.feed = PASS
        world.put("new", kind="cron", spec={"every_s": 3600}, program="agent:remind@v1")
        # followed again within the back-off's longest wait (10 s) and a poll
        wait_until(lambda: _adopted(serve, "new"), timeout=15, what="a record written after")
        text = serve.log.read_text(errors="replace")
        assert text.count("the change feed misbehaves") == 1, text
        assert "the change feed behaves again" in text
    finally:
        serve.stop()
