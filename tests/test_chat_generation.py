"""A chat-watch generation seeded after the devices booted, end to end: two `anyrtd serve`
on one devserver; `chat-watch` is deleted while device 1 holds the role, device 2 restarts
(and seeds `chat-watch-g2`), then takes the role. The active device claims the generation
in use, answers from it natively (the backlog first), and the one that stands down clears
its owner without writing to the deleted record (docs/events.md, docs/election.md)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from support import wait_until

from anyrtd.chat import current_generation, generation_of
from anyrtd.claims import handoff_field
from anyrtd.client import Dataset, ServerClient, Upsert
from anyrtd.places import resolve_places
from anyrtd.programs.chat import AGENT_BUNDLE, GENERAL_CHAT_SEED

CONFIG = ("election_poll_s = 0.5",)
ANSWERED_WITHIN_S = 10.0
"""A claim, its confirmation and the backlog's read, with room for a loaded machine."""


@pytest.fixture
def pair(
    devserver_factory: Callable[..., DevserverProcess], tmp_path: Path
) -> Iterator[tuple[DevserverProcess, ServeProcess, ServeProcess]]:
    server = devserver_factory(devices=2)
    one = ServeProcess(tmp_path, server.urls[0], name="one", config_lines=CONFIG)
    two = ServeProcess(tmp_path, server.urls[1], name="two", config_lines=CONFIG)
    try:
        one.start()
        wait_until(lambda: verdict(one) == "active", timeout=30, what="device 1 to be active")
        two.start()
        yield server, one, two
    finally:
        one.stop()
        two.stop()


def verdict(proc: ServeProcess) -> str:
    with proc.http() as client:
        return str(client.get("/election").json()["verdict"])


def run(coro: Callable[[ServerClient], Any], url: str) -> Any:
    async def go() -> Any:
        client = ServerClient(url)
        try:
            return await coro(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


def record(url: str, rid: str) -> dict[str, Any] | None:
    async def go(client: ServerClient) -> dict[str, Any] | None:
        places = await resolve_places(client, "bao")
        found, _ = await client.query(places.triggers, filter={"id": rid})
        return found[0] if found else None

    result: dict[str, Any] | None = run(go, url)
    return result


def delete(url: str, rid: str) -> None:
    async def go(client: ServerClient) -> None:
        places = await resolve_places(client, "bao")
        await client.delete(places.triggers, [rid])

    run(go, url)


async def _general(client: ServerClient) -> Dataset:
    chat = await client.child("bao", AGENT_BUNDLE, GENERAL_CHAT_SEED)
    return Dataset("bao", chat, "chat_messages")


def say(url: str, text: str) -> str:
    mid = f"m-{uuid.uuid4().hex[:12]}"

    async def go(client: ServerClient) -> None:
        body = {"text": text, "author": "ana", "createdAt": time.time()}
        await client.upsert(await _general(client), [Upsert(mid, body)])

    run(go, url)
    return mid


def reply_to(url: str, mid: str) -> dict[str, Any] | None:
    async def go(client: ServerClient) -> list[dict[str, Any]]:
        return await client.query_all(await _general(client), filter={"replyTo": mid})

    found: list[dict[str, Any]] = run(go, url)
    return found[0] if found else None


def runs_of(url: str, trigger_id: str) -> list[dict[str, Any]]:
    async def go(client: ServerClient) -> list[dict[str, Any]]:
        places = await resolve_places(client, "bao")
        return await client.query_all(places.runs, filter={"triggerId": trigger_id})

    found: list[dict[str, Any]] = run(go, url)
    return found


def owner(url: str, rid: str) -> str | None:
    found = record(url, rid)
    return None if found is None else str(found.get("owner", ""))


@pytest.mark.parametrize(
    ("rid", "n"),
    [
        ("chat-watch", 1),
        ("chat-watch-g2", 2),
        ("chat-watch-g17", 17),
        ("chat-watch-g1", None),  # the first generation is the bare id
        ("chat-watch-g02", None),
        ("chat-watch-g", None),
        ("chat-watch-g\uff12", None),  # a full-width digit: not an id boot ever seeds
        ("chat-watcher", None),
        ("daily", None),
    ],
)
def test_the_generation_of_an_id(rid: str, n: int | None) -> None:
    assert generation_of(rid) == n


def test_the_generation_in_use_is_the_first_not_deleted_from_the_one_boot_found() -> None:
    assert current_generation("chat-watch", set()) == "chat-watch"
    assert current_generation("chat-watch", {"chat-watch"}) == "chat-watch-g2"
    assert current_generation("chat-watch", {"chat-watch", "chat-watch-g2"}) == "chat-watch-g3"
    # Boot found g3 (the earlier ones deleted before this device knew them): still g3.
    assert current_generation("chat-watch-g3", set()) == "chat-watch-g3"
    assert current_generation("chat-watch-g3", {"chat-watch-g3"}) == "chat-watch-g4"


@pytest.mark.process
def test_a_generation_seeded_after_boot_is_claimed_answered_from_and_released(
    pair: tuple[DevserverProcess, ServeProcess, ServeProcess],
) -> None:
    server, one, two = pair
    first, second = server.peers[0], server.peers[1]
    wait_until(lambda: owner(server.url, "chat-watch") == first, timeout=30, what="1 to hold it")
    delete(server.url, "chat-watch")
    # Asked while no chat-watch record exists: the generation's first holder answers it
    # from the backlog when it connects.
    asked = say(server.url, "/help")
    assert two.stop() == 0
    two.start()  # boot seeds the next generation
    wait_until(
        lambda: owner(server.url, "chat-watch-g2") == first,
        timeout=30,
        what="the active device 1 to claim chat-watch-g2",
    )
    claimed = time.monotonic()
    wait_until(
        lambda: reply_to(server.url, asked),
        timeout=ANSWERED_WITHIN_S,
        what="the /help asked before the claim to be answered",
    )
    assert time.monotonic() - claimed < ANSWERED_WITHIN_S
    (conversation,) = wait_until(
        lambda: runs_of(server.url, "chat-watch-g2"), timeout=15, what="the conversation's run"
    )
    assert conversation["device"] == first and conversation["program"] == "internal:chat-watch"
    # Device 2 takes the role: it re-stamps the generation in use, device 1 lets it go.
    with httpx.Client(base_url=server.urls[1], timeout=10) as http:
        http.post("/v1/devices/activate", json={"app": "bao"}).raise_for_status()
    wait_until(
        lambda: verdict(two) == "active" and verdict(one) == "standby",
        timeout=15,
        what="the role to move to device 2",
    )
    wait_until(
        lambda: owner(server.url, "chat-watch-g2") == second,
        timeout=30,
        what="chat-watch-g2 to follow the role",
    )
    again = say(server.url, "/help")
    wait_until(
        lambda: reply_to(server.url, again),
        timeout=ANSWERED_WITHIN_S,
        what="device 2 to answer from chat-watch-g2",
    )
    answers = wait_until(
        lambda: [r for r in runs_of(server.url, "chat-watch-g2") if r["device"] == second],
        timeout=15,
        what="device 2's conversation run",
    )
    assert len(answers) == 1
    # Nothing was written to the deleted record, so nothing was set aside or refused.
    wait_until(lambda: "stood down" in one.log.read_text(), timeout=10, what="the stand-down")
    record_g2 = record(server.url, "chat-watch-g2")
    assert record_g2 is not None and record_g2.get(handoff_field(first), {}).get("peer") == first
    for proc in (one, two):
        log = proc.log.read_text()
        assert "set aside" not in log and " ERROR " not in log, log
        with proc.http() as client:
            metrics = client.get("/metrics").text
        assert "anyrtd_outbox_set_aside 0" in metrics.splitlines()
    assert record(server.url, "chat-watch") is None
