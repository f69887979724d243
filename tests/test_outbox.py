"""The outbox drain never wedges: a write the server can never take is set aside (kept in the
mirror, counted, shown by the doctor) and the writes behind it reach the server."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from conftest import anyrtd_command
from control_support import ServeProcess
from support import async_wait_until, daemon_with, server_runs, wait_until

from anyrtd.client import (
    Dataset,
    ServerClient,
    ServerError,
    ServerUnavailable,
    Upsert,
    encode,
)
from anyrtd.devserver import DevServer
from anyrtd.mirror import AsyncMirror, Mirror
from anyrtd.outbox import RUNS, TRIGGERS, DrainResult, DrainWake, drain
from anyrtd.places import resolve_places
from anyrtd.rows import Batch
from anyrtd.vocab import RunStatus

NOW = 1_800_000_000.0


async def queue(db: AsyncMirror, writes: Iterable[tuple[str, str, dict[str, Any]]]) -> None:
    batch = Batch()
    for dataset, rid, fields in writes:
        batch.write(dataset, rid, fields)
    await db.call(lambda m: m.commit(batch, NOW))


class FakeClient:
    """A server client that refuses some ids, fails on others, and takes the rest."""

    def __init__(self, refuse: set[str] = frozenset(), odd: set[str] = frozenset()) -> None:
        self.refuse = set(refuse)
        self.odd = set(odd)
        self.away = False
        self.taken: list[str] = []

    async def upsert(self, where: Dataset, writes: Iterable[Upsert]) -> dict[str, int]:
        writes = list(writes)
        if self.away:
            raise ServerUnavailable("connection refused")
        ids = {w.id for w in writes}
        if ids & self.refuse:
            raise ServerError(409, "tombstoned", "the record was deleted")
        if ids & self.odd:
            raise RecursionError("maximum recursion depth exceeded while encoding a JSON object")
        self.taken += [w.id for w in writes]
        return {w.id: 1 for w in writes}


def locate(dataset: str) -> Dataset:
    return Dataset("bao", "obj", dataset)


async def test_refused_and_unsendable_writes_are_set_aside_and_the_rest_are_sent_in_order(
    mirror: AsyncMirror,
) -> None:
    await queue(
        mirror,
        [
            (RUNS, "r1", {"status": "ok"}),
            (TRIGGERS, "gone", {"lastStatus": "ok"}),
            (RUNS, "deep", {"status": "ok"}),
            (RUNS, "r2", {"status": "ok"}),
        ],
    )
    client = FakeClient(refuse={"gone"}, odd={"deep"})
    result = await drain(mirror, client, locate, now=lambda: NOW + 5)  # type: ignore[arg-type]
    assert result.error is None and result.set_aside == 2 and result.sent == 2
    assert client.taken == ["r1", "r2"]
    assert await mirror.call(Mirror.outbox_counts) == (0, 2)
    aside = await mirror.call(lambda m: m.outbox_set_aside())
    assert [(a.dataset, a.record_id, a.set_aside_at) for a in aside] == [
        (TRIGGERS, "gone", NOW + 5),
        (RUNS, "deep", NOW + 5),
    ]
    assert aside[0].error == "the server refused it: 409 tombstoned: the record was deleted"
    assert aside[1].error.startswith("it cannot be sent: RecursionError: maximum recursion")
    # Kept, and never sent again.
    again = await drain(mirror, client, locate)  # type: ignore[arg-type]
    assert (again.sent, again.set_aside, again.error) == (0, 0, None)
    assert client.taken == ["r1", "r2"]
    assert await mirror.call(lambda m: m.outbox_pending()) == []


async def test_a_drain_waits_on_its_pace_before_each_round(mirror: AsyncMirror) -> None:
    # Each round reads and acknowledges in the mirror: a start due sooner must go first
    # (the daemon paces it with `clear_of_commit`), or its commit waits behind the round's.
    await queue(mirror, [(RUNS, f"r{n}", {"status": "ok"}) for n in range(5)])
    client, paced = FakeClient(), []

    async def pace() -> None:
        paced.append(len(client.taken))

    result = await drain(mirror, client, locate, batch=2, pace=pace)  # type: ignore[arg-type]
    assert result.sent == 5 and paced == [0, 2, 4]


async def test_the_mirror_tells_how_slow_its_calls_are_now(mirror: AsyncMirror) -> None:
    await mirror.call(lambda m: time.sleep(0.05))
    slow = mirror.slow_s
    assert slow >= 0.05  # at once
    await mirror.call(lambda m: None)
    assert 0.75 * slow < mirror.slow_s < 0.9 * slow  # a fifth of the way back at each faster
    for _ in range(40):
        await mirror.call(lambda m: None)
    assert mirror.slow_s < slow / 10


async def test_a_server_that_is_away_sets_nothing_aside(mirror: AsyncMirror) -> None:
    await queue(mirror, [(RUNS, "r1", {"status": "ok"}), (RUNS, "r2", {"status": "ok"})])
    client = FakeClient()
    client.away = True
    result = await drain(mirror, client, locate)  # type: ignore[arg-type]
    assert result.error == "connection refused" and result.set_aside == 0
    assert await mirror.call(Mirror.outbox_counts) == (2, 0)
    client.away = False
    result = await drain(mirror, client, locate)  # type: ignore[arg-type]
    assert result.sent == 2 and client.taken == ["r1", "r2"]


async def test_a_row_whose_text_no_longer_decodes_is_set_aside(mirror: AsyncMirror) -> None:
    await queue(mirror, [(RUNS, "r1", {"status": "ok"})])
    with sqlite3.connect(mirror.mirror.path) as conn:
        conn.execute(
            "INSERT INTO outbox (dataset, record_id, fields, created_at) "
            "VALUES ('runs', 'torn', '{\"status\": \"o', 1.0)"
        )
    client = FakeClient()
    result = await drain(mirror, client, locate)  # type: ignore[arg-type]
    assert result.sent == 1 and client.taken == ["r1"]
    assert await mirror.call(Mirror.outbox_counts) == (0, 1)
    (aside,) = await mirror.call(lambda m: m.outbox_set_aside())
    assert aside.record_id == "torn" and "not valid JSON" in aside.error


async def test_text_the_client_cannot_encode_is_set_aside_against_a_real_server(
    mirror: AsyncMirror, devserver_inprocess: DevServer
) -> None:
    # A lone surrogate (half an emoji, as JavaScript cuts strings) and a NaN: both are kept
    # in the mirror as JSON text, and neither can go on the wire.
    await queue(
        mirror,
        [
            (RUNS, "before", {"triggerId": "t", "status": "ok"}),
            (RUNS, "half-emoji", {"triggerId": "t", "title": "\ud800"}),
            (RUNS, "nan", {"triggerId": "t", "durationMs": float("nan")}),
            (RUNS, "after", {"triggerId": "t", "status": "ok"}),
        ],
    )
    async with ServerClient(devserver_inprocess.url) as client:
        places = await resolve_places(client, "bao")
        where = {RUNS: places.runs, TRIGGERS: places.triggers}
        result = await drain(mirror, client, where.get)
        assert (result.error, result.set_aside, result.sent) == (None, 2, 2)
        taken = await client.query_all(places.runs, filter={"triggerId": "t"})
    assert sorted(r["id"] for r in taken) == ["after", "before"]
    aside = await mirror.call(lambda m: m.outbox_set_aside())
    assert [a.record_id for a in aside] == ["half-emoji", "nan"]
    assert aside[0].error.startswith("it cannot be sent: UnicodeEncodeError")
    assert aside[1].error.startswith("it cannot be sent: ValueError")


def test_a_served_daemon_drains_past_a_write_it_cannot_send_and_says_so(
    devserver: Any, tmp_path: Path
) -> None:
    serve = ServeProcess(tmp_path, devserver.url)
    serve.start()  # makes the mirror, at head
    assert serve.stop() == 0
    mirror_path = serve.state / "anyrtd.sqlite3"
    with sqlite3.connect(mirror_path) as conn:
        # As a program's result would leave them before results were made valid: the first
        # write can never be encoded, the second is an ordinary run record behind it.
        conn.executemany(
            "INSERT INTO outbox (dataset, record_id, fields, created_at) VALUES (?, ?, ?, ?)",
            [
                ("runs", "bad-run", '{"triggerId": "t-aside", "title": "\\ud800"}', NOW),
                ("runs", "good-run", '{"triggerId": "t-aside", "status": "ok"}', NOW),
            ],
        )
    serve.start()
    try:
        wait_until(
            lambda: [r["id"] for r in server_runs(devserver.url, "t-aside")] == ["good-run"],
            timeout=30,
            what="the write behind the bad one to reach the server",
        )

        def set_aside_gauge() -> str | None:
            with serve.http() as client:
                text = client.get("/metrics").text
            lines = [ln for ln in text.splitlines() if ln.startswith("anyrtd_outbox_")]
            return "\n".join(lines) if "anyrtd_outbox_set_aside 1" in lines else None

        gauges = wait_until(set_aside_gauge, timeout=30, what="the set-aside gauge")
        assert "anyrtd_outbox_depth 0" in gauges
        log = serve.log.read_text()
        assert "set aside a write the server cannot take" in log and "bad-run" in log
        env = {
            **os.environ,
            "ANYRTD_SERVER": devserver.url,
            "ANYRTD_STATE_DIR": str(serve.state),
            "ANYRTD_LISTEN": serve.listen,
            "ANYRTD_CONFIG": str(serve.config),
        }
        doctor = subprocess.run(
            [*anyrtd_command(), "doctor"], env=env, capture_output=True, text=True, timeout=60
        )
        (line,) = [ln for ln in doctor.stdout.splitlines() if "outbox" in ln.split()[:2]]
        assert (
            line.startswith("warn")
            and "runs bad-run (it cannot be sent: UnicodeEncodeError" in line
        )
    finally:
        serve.stop()
    with sqlite3.connect(mirror_path) as conn:
        kept = conn.execute(
            "SELECT record_id FROM outbox WHERE set_aside_at IS NOT NULL"
        ).fetchall()
    assert kept == [("bad-run",)]


@pytest.mark.parametrize(
    "body",
    [{"title": "\ud800"}, {"costUsd": float("nan")}],
    ids=["a lone surrogate", "a NaN"],
)
def test_the_client_encoder_refuses_what_no_server_could_take(body: dict[str, Any]) -> None:
    """The premise of the tests above: the client's own wire encoding cannot carry them."""
    with pytest.raises(ValueError):
        encode(body)


# when the outbox loop drains


async def woken(wake: DrainWake, retry_s: float = 0.0, within: float = 0.05) -> bool:
    """Whether the drain wake's wait returns within `within` s (a wait that should not
    return is given `retry_s` 0: only a wait for a queued write alone outlasts it)."""
    try:
        async with asyncio.timeout(within):
            await wake.wait(retry_s=retry_s)
    except TimeoutError:
        return False
    return True


async def test_the_drain_wake_sleeps_once_a_drain_took_all_and_wakes_on_a_queued_write() -> None:
    wake = DrainWake()
    assert await woken(wake)  # nothing drained yet: the loop drains at start
    wake.drained(DrainResult(sent=3))
    wake.tick()
    assert not await woken(wake)  # settled: neither a tick nor the retry period wakes it
    wake.queued()
    assert await woken(wake)
    wake.queued()  # a write queued while the drain runs is not missed by its end
    wake.drained(DrainResult())
    assert await woken(wake)
    assert not await woken(wake)


@pytest.mark.parametrize(
    "result",
    [None, DrainResult(error="server away"), DrainResult(sent=50_000, more=True)],
    ids=["no datasets yet", "server away", "more than its rounds"],
)
async def test_a_drain_that_left_writes_unsent_is_tried_again_after_each_tick_and_retry_period(
    result: DrainResult | None,
) -> None:
    wake = DrainWake()
    wake.drained(result)
    assert await woken(wake, retry_s=0.0)  # the retry period
    assert not await woken(wake, retry_s=3600.0)
    wake.tick()
    assert await woken(wake, retry_s=3600.0)  # a tick


async def test_an_idle_daemon_leaves_its_outbox_alone_and_a_fire_still_reaches_the_server(
    devserver_inprocess: DevServer, tmp_path: Path
) -> None:
    async def ok(args: Any, ctx: Any) -> None:
        return None

    daemon = daemon_with(devserver_inprocess.url, tmp_path / "state", {"test:ok@v1": ok}, 0.05)
    drains: list[DrainResult | None] = []
    drain_outbox = daemon.drain_outbox

    async def counted() -> DrainResult | None:
        drains.append(result := await drain_outbox())
        return result

    daemon.drain_outbox = counted  # type: ignore[method-assign]
    user = ServerClient(devserver_inprocess.url)
    try:
        await daemon.start()
        await async_wait_until(lambda: asyncio.sleep(0, drains), what="the first drain")

        async def quiet() -> bool:
            """40 ticks (2 s) pass without a drain (the start's writes are sent by then)."""
            ticks, seen = daemon.stats.ticks, len(drains)
            await async_wait_until(
                lambda: asyncio.sleep(0, daemon.stats.ticks >= ticks + 40), what="40 ticks"
            )
            return len(drains) == seen

        await async_wait_until(quiet, timeout=20.0, what="40 ticks without an empty drain")
        assert daemon.places is not None and daemon.peer_id is not None
        await user.upsert(
            daemon.places.triggers,
            [
                Upsert(
                    "soon",
                    {
                        "kind": "once",
                        "spec": {"at": time.time()},
                        "program": "test:ok@v1",
                        "owner": daemon.peer_id,
                    },
                )
            ],
        )
        runs = await async_wait_until(
            lambda: (
                user.query_all(daemon.places.runs, filter={"triggerId": "soon"})
                if daemon.places
                else asyncio.sleep(0, None)
            ),
            what="the run on the server",
        )
        assert [r["status"] for r in runs] == [RunStatus.OK]
    finally:
        await daemon.stop()
        await user.aclose()


async def test_the_outbox_depth_is_counted_again_only_once_the_outbox_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts: list[int] = []
    outbox_depth = Mirror.outbox_depth

    def counted(m: Mirror) -> int:
        counts.append(depth := outbox_depth(m))
        return depth

    monkeypatch.setattr(Mirror, "outbox_depth", counted)
    daemon = daemon_with("http://127.0.0.1:9", tmp_path / "state", {})
    await daemon.open()
    try:
        assert daemon.db is not None
        await daemon.refresh_summary(runs=False)
        await daemon.refresh_summary(runs=False)
        assert (counts, daemon.outbox_depth) == ([0], 0)  # nothing changed: no second count
        await queue(daemon.db, [(RUNS, "r1", {"status": "ok"}), (RUNS, "r2", {})])
        await daemon.refresh_summary(runs=False)
        assert (counts, daemon.outbox_depth) == ([0, 2], 2)
        items = await daemon.db.call(lambda m: m.outbox_pending())
        await daemon.db.call(lambda m: m.set_aside_outbox([items[0].seq], "refused", NOW))
        await daemon.refresh_summary(runs=False)
        await daemon.db.call(lambda m: m.ack_outbox([items[1].seq]))
        await daemon.refresh_summary(runs=False)
        await daemon.refresh_summary(runs=False)
        assert (counts, daemon.outbox_depth) == ([0, 2, 1, 0], 0)
    finally:
        await daemon.stop()
