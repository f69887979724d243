"""Event triggers: the pure matching rules, then real daemons on a devserver's change feed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet, Node
from support import async_wait_until, daemon_with

from anyrtd.client import Change, Dataset, ServerClient, Upsert
from anyrtd.config import Config
from anyrtd.daemon import Daemon
from anyrtd.events import LiveGate, fires, is_own, new_message
from anyrtd.model import TriggerDef, parse_record

# the pure rules


def change(
    op: str = "create", dataset: str = "chat_messages", seq: int = 10, **record: Any
) -> Change:
    body = {"text": "hi", "createdAt": 100.0, **record}
    return Change(seq, "chat1", dataset, "m1", op, body)


def trigger(rid: str = "t", **spec: Any) -> TriggerDef:
    defn = parse_record(
        {
            "id": rid,
            "kind": "event",
            "spec": {"dataset": "chat_messages", "objectId": "chat1", **spec},
            "program": "test:ok@v1",
            "args": {"x": 1},
        }
    )
    assert isinstance(defn, TriggerDef)
    return defn


def test_only_a_create_on_a_chat_dataset_is_a_new_message() -> None:
    assert new_message(change(), "bao") is not None
    assert new_message(change(dataset="t_abc_chat_messages"), "bao") is not None
    assert new_message(change(op="update"), "bao") is None  # edits and reactions
    assert new_message(change(op="delete"), "bao") is None
    assert new_message(change(dataset="agent_triggers"), "bao") is None


def test_the_event_payload_carries_agent_and_attachments_only_when_present() -> None:
    plain = new_message(change(), "bao")
    assert plain is not None
    assert plain.payload() == {"space": "bao", "objectId": "chat1", "messageId": "m1", "text": "hi"}
    rich = new_message(change(agent="scout", attachments=[{"name": "a.png"}]), "bao")
    assert rich is not None
    assert rich.payload()["agent"] == "scout" and rich.payload()["attachments"] == [
        {"name": "a.png"}
    ]


def test_the_agents_own_and_nameless_agent_messages_are_its_own() -> None:
    def own(**record: Any) -> bool:
        msg = new_message(change(**record), "bao")
        assert msg is not None
        return is_own(msg, "bao")

    assert own(agent="bao") and own(agent="") and own(agent=None)
    assert not own() and not own(agent="scout")


def test_fires_matches_the_chat_and_the_space() -> None:
    msg = new_message(change(), "bao")
    assert msg is not None
    here, elsewhere = trigger("here"), trigger("elsewhere", objectId="chat2")
    other_space = trigger("other", spaceId="work")
    same_space = trigger("same", spaceId="bao")
    got = fires(
        msg, [here, elsewhere, other_space, same_space], agent_space="bao", agent_name="bao"
    )
    assert [d.id for d in got] == ["here", "same"]
    own = new_message(change(agent="bao"), "bao")
    assert own is not None
    assert fires(own, [here], agent_space="bao", agent_name="bao") == []


def test_the_live_gate_admits_only_what_came_after_listening_began() -> None:
    gate = LiveGate(since=100.0)
    msg = new_message(change(seq=10), "bao")
    assert msg is not None and not gate.admits(msg)  # the head is not known yet
    gate.heads["bao"] = 9
    assert gate.admits(msg)
    gate.heads["bao"] = 10
    assert not gate.admits(msg)  # at or before the head: it arrived while not listening
    gate.heads["bao"] = 0
    late = new_message(change(seq=11, createdAt=99.0), "bao")
    assert late is not None and not gate.admits(late)  # replicated late, sent before


# real daemons


async def listen(fleet: Fleet, node: Node, rid: str = "on-chat", **fields: Any) -> None:
    _, _, chat = await fleet.places()
    body = {
        "kind": "event",
        "spec": {"dataset": "chat_messages", "objectId": chat.object_id},
        "program": "test:ok@v1",
        "args": {"x": 1},
        "owner": node.me,
        **fields,
    }
    await fleet.put(rid, **body)
    await fleet.step(1)
    assert rid in node.daemon.registry


async def test_a_new_message_fires_once_with_the_event_in_its_args(fleet: Fleet) -> None:
    node = await fleet.node(1)
    await listen(fleet, node)
    mid = await fleet.say("hello there")
    created = fleet.clock.now()
    await fleet.step(1)
    await fleet.step(1)
    calls = fleet.programs.of("on-chat")
    assert len(calls) == 1
    _, _, chat = await fleet.places()
    assert calls[0][3] == {
        "x": 1,
        "event": {
            "space": "bao",
            "objectId": chat.object_id,
            "messageId": mid,
            "text": "hello there",
        },
    }
    runs = await fleet.runs("on-chat")
    assert len(runs) == 1 and runs[0]["scheduledAt"] == created and runs[0]["status"] == "ok"


async def test_edits_reactions_and_the_agents_own_messages_never_fire(fleet: Fleet) -> None:
    node = await fleet.node(1)
    await listen(fleet, node)
    _, _, chat = await fleet.places()
    mid = await fleet.say("first")
    await fleet.step(1)
    await fleet.user.upsert(chat, [Upsert(mid, {"text": "first, edited", "editedAt": 1.0})])
    await fleet.user.upsert(chat, [Upsert(mid, {"reactions": {"+1": ["ana"]}})])
    await fleet.say("my own words", agent="bao")
    await fleet.say("a nameless agent", agent="")
    await fleet.step(1)
    assert len(fleet.programs.of("on-chat")) == 1
    await fleet.say("another agent's note", agent="scout")
    await fleet.step(1)
    calls = fleet.programs.of("on-chat")
    assert len(calls) == 2 and calls[1][3]["event"]["agent"] == "scout"


async def test_a_message_in_another_chat_does_not_fire(fleet: Fleet) -> None:
    node = await fleet.node(1)
    await listen(fleet, node)
    other = await fleet.user.child("bao", "bao/v1", "bao/chat/other")
    await fleet.say("elsewhere", chat=Dataset("bao", other, "chat_messages"))
    await fleet.step(1)
    assert fleet.programs.of("on-chat") == []


async def test_messages_sent_while_the_owner_was_down_never_fire(fleet: Fleet) -> None:
    node = await fleet.node(1)
    await listen(fleet, node)
    await node.stop()
    fleet.clock.advance(30)
    await fleet.say("while you were out")
    fleet.clock.advance(30)
    await node.restart()
    await fleet.step(1)
    assert fleet.programs.of("on-chat") == []
    await fleet.say("welcome back")
    await fleet.step(1)
    calls = fleet.programs.of("on-chat")
    assert [c[3]["event"]["text"] for c in calls] == ["welcome back"]


async def test_only_the_owner_fires_a_message_seen_by_every_device(fleet: Fleet) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await listen(fleet, b)
    await fleet.say("for b", via=a)
    await fleet.step(1)
    calls = fleet.programs.of("on-chat")
    assert [(c[2]) for c in calls] == [b.me]


async def test_event_failures_count_toward_the_breaker(fleet: Fleet) -> None:
    node = await fleet.node(1)
    await listen(fleet, node, program="test:fail@v1", maxConsecutiveFailures=2)
    for text in ("one", "two", "three"):
        await fleet.say(text)
        await fleet.step(1)
    assert len(fleet.programs.of("on-chat")) == 2
    record = await fleet.record("on-chat") or {}
    assert record["lastStatus"] == "auto_disabled" and record["enabled"] is False


async def test_concurrent_failures_trip_the_breaker_once(fleet: Fleet) -> None:
    # Three messages in one feed poll start three runs at once; all fail. Whatever order they
    # end in, the breaker's verdict is made once: the record says `auto_disabled`, and the
    # runs that end after the trip neither overwrite it nor count past it.
    node = await fleet.node(1)
    await listen(fleet, node, program="test:fail@v1", maxConsecutiveFailures=2)
    for text in ("one", "two", "three"):
        await fleet.say(text)
    await fleet.step(1)
    await fleet.step(1)
    assert len(fleet.programs.of("on-chat")) == 3
    record = await fleet.record("on-chat") or {}
    assert record["enabled"] is False
    assert record["lastStatus"] == "auto_disabled"
    assert record["consecutiveFailures"] == 2
    assert record["runCount"] == 3


async def test_a_message_reaches_its_program_within_a_second(
    devserver_factory: Callable[..., Any], tmp_path: Path
) -> None:
    server = devserver_factory()
    started: list[float] = []
    seen = asyncio.Event()

    async def program(args: Any, ctx: Any) -> None:
        started.append(time.time())
        seen.set()

    daemon = daemon_with(server.url, tmp_path / "state", {"test:mark@v1": program})
    user = ServerClient(server.url)
    try:
        await daemon.start()
        places = await async_wait_until(
            lambda: asyncio.sleep(0, daemon.places), what="the daemon to resolve"
        )
        chat = await user.child("bao", "bao/v1", "bao/chat/general")
        fields = {
            "kind": "event",
            "spec": {"dataset": "chat_messages", "objectId": chat},
            "program": "test:mark@v1",
            "owner": daemon.peer_id,
        }
        await user.upsert(places.triggers, [Upsert("mark", fields)])
        await async_wait_until(
            lambda: asyncio.sleep(0, "mark" in daemon.registry and daemon.role.live.heads),
            what="the trigger to be adopted and the feed followed",
        )
        sent = time.time()
        await user.upsert(
            Dataset("bao", chat, "chat_messages"),
            [Upsert("m-live", {"text": "now", "author": "ana", "createdAt": sent})],
        )
        async with asyncio.timeout(5):
            await seen.wait()
        assert started[0] - sent < 1.0
    finally:
        await daemon.stop()
        await user.aclose()


async def test_a_trigger_on_another_spaces_chat_follows_that_spaces_feed(
    devserver_factory: Callable[..., Any], tmp_path: Path
) -> None:
    # One devserver file holding two spaces: `team` made by a first start, `bao` by the second.
    first = devserver_factory(space="team")
    first.stop()
    server = devserver_factory(db=first.db)
    seen: list[dict[str, Any]] = []

    async def program(args: Any, ctx: Any) -> None:
        seen.append(dict(args["event"]))

    daemon = daemon_with(server.url, tmp_path / "state", {"test:mark@v1": program})
    user = ServerClient(server.url)
    try:
        await daemon.start()
        places = await async_wait_until(
            lambda: asyncio.sleep(0, daemon.places), what="the daemon to resolve"
        )
        elsewhere = await user.child("team", "bao/v1", "bao/chat/general")
        home = await user.child("bao", "bao/v1", "bao/chat/general")
        fields = {
            "kind": "event",
            "spec": {"dataset": "chat_messages", "objectId": elsewhere, "spaceId": "team"},
            "program": "test:mark@v1",
            "owner": daemon.peer_id,
        }
        await user.upsert(places.triggers, [Upsert("team-chat", fields)])
        await async_wait_until(
            lambda: asyncio.sleep(0, "team" in daemon.role.live.heads),
            timeout=30,
            what="the other space's feed to be followed",
        )
        facts = daemon.port.trigger("team-chat")
        assert facts is not None and facts.entry is not None and facts.entry.row.marker is None
        # A message in the agent space's chat does not fire it.
        await user.upsert(
            Dataset("bao", home, "chat_messages"),
            [Upsert("m-home", {"text": "at home", "author": "ana", "createdAt": time.time()})],
        )
        await user.upsert(
            Dataset("team", elsewhere, "chat_messages"),
            [Upsert("m-team", {"text": "over here", "author": "ana", "createdAt": time.time()})],
        )
        await async_wait_until(
            lambda: asyncio.sleep(0, seen), timeout=30, what="the trigger to fire"
        )
        assert seen == [
            {"space": "team", "objectId": elsewhere, "messageId": "m-team", "text": "over here"}
        ]
        # Disabled, the trigger's space is no longer followed.
        await user.upsert(places.triggers, [Upsert("team-chat", {"enabled": False})])
        await async_wait_until(
            lambda: asyncio.sleep(0, "team" not in daemon.role.cursors),
            timeout=30,
            what="the other space to be let go",
        )
    finally:
        await daemon.stop()
        await user.aclose()


async def test_a_space_that_cannot_be_followed_is_named_in_the_log_and_health(
    devserver_factory: Callable[..., Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = devserver_factory()
    config = Config(server=server.url, state_dir=tmp_path / "state", tick_s=0.2)
    daemon = Daemon(config)
    user = ServerClient(server.url)
    try:
        await daemon.start()
        places = await async_wait_until(
            lambda: asyncio.sleep(0, daemon.places), what="the daemon to resolve"
        )
        fields = {
            "kind": "event",
            "spec": {"dataset": "chat_messages", "objectId": "c1", "spaceId": "nowhere"},
            "program": "agent:remind@v1",
            "owner": daemon.peer_id,
        }
        await user.upsert(places.triggers, [Upsert("lost", fields)])
        await async_wait_until(
            lambda: asyncio.sleep(0, "cannot follow space nowhere" in caplog.text),
            timeout=30,
            what="a warning naming the space",
        )
        assert "no such space" in caplog.text
        assert "space nowhere" in (daemon.port.health().last_error or "")
    finally:
        await daemon.stop()
        await user.aclose()
