"""The chat responder: the seeded chat-watch record, answers, the backlog, moves and stand-downs."""

from __future__ import annotations

import asyncio

from fleet import Fleet
from support import async_wait_until

from anyrtd.chat import ChatWatch, ResponderContext
from anyrtd.client import Dataset, ServerClient
from anyrtd.events import ChatMessage
from anyrtd.vocab import CHAT_WATCH_PROGRAM


async def hold(fleet: Fleet) -> None:
    """Step until the claim of chat-watch is confirmed and the watch connected."""
    for _ in range(3):
        await fleet.step(5)


async def until_answered(fleet: Fleet, mids: list[str], conversations: int) -> None:
    """Step (without moving the clock) until every message of `mids` has a reply and
    `conversations` chat-watch runs are recorded on the server.

    The chat watch starts one conversation after another, so a step's settle can fall in
    the gap between two of them: one step is not always enough on a loaded machine.
    """

    async def done() -> bool:
        await fleet.step(0)
        replied = set(await fleet.replies())
        return replied >= set(mids) and len(await fleet.runs("chat-watch")) >= conversations

    await async_wait_until(done, timeout=30, what=f"answers to {mids}")


async def test_boot_seeds_the_chat_watch_record_and_the_active_device_claims_it(
    fleet: Fleet,
) -> None:
    node = await fleet.node(1)
    await hold(fleet)
    _, _, chat = await fleet.places()
    record = await fleet.record("chat-watch") or {}
    assert {k: record.get(k) for k in ("kind", "spec", "program", "owner", "enabled")} == {
        "kind": "event",
        "spec": {"dataset": "chat_messages", "objectId": chat.object_id},
        "program": CHAT_WATCH_PROGRAM,
        "owner": node.me,
        "enabled": True,
    }
    assert node.daemon.chat.connected and node.daemon.chat.chat == chat


async def test_a_tombstoned_chat_watch_is_seeded_under_the_next_generation(fleet: Fleet) -> None:
    node = await fleet.node(1)
    triggers, _, _ = await fleet.places()
    await fleet.user.delete(triggers, ["chat-watch"])
    await node.restart()
    await hold(fleet)
    assert node.daemon.role.chat_watch_id == "chat-watch-g2"
    assert (await fleet.record("chat-watch-g2") or {})["owner"] == node.me
    await fleet.user.delete(triggers, ["chat-watch-g2"])
    await node.restart()
    assert node.daemon.role.chat_watch_id == "chat-watch-g3"


async def test_slash_commands_are_answered_once_and_recorded_as_conversations(
    fleet: Fleet,
) -> None:
    node = await fleet.node(1)
    await fleet.put("daily", owner="", kind="cron", spec={"cron": "0 9 * * *"}, program="x:y@v1")
    await hold(fleet)
    asked = {text: await fleet.say(text) for text in ("/help", "/triggers", "/next", "/runs")}
    chatter = await fleet.say("just chatting")
    await fleet.step(1)
    await until_answered(fleet, list(asked.values()), conversations=4)
    replies = await fleet.replies()
    assert set(replies) == set(asked.values()) and chatter not in replies
    for mid in asked.values():
        (reply,) = replies[mid]
        assert reply["id"] == f"reply-{mid}" and reply["agent"] == "bao"
    text = {t: replies[mid][0]["text"] for t, mid in asked.items()}
    assert "/triggers" in text["/help"] and "/next" in text["/help"]
    assert "daily (cron, x:y@v1) here" in text["/triggers"]
    assert "chat-watch (event" in text["/triggers"]
    assert "daily at 2027-01-15 09:00:00 UTC (in 60 min)" in text["/next"]
    runs = await fleet.runs("chat-watch")
    assert len(runs) == 4 and {r["program"] for r in runs} == {CHAT_WATCH_PROGRAM}
    assert {r["status"] for r in runs} == {"ok"} and {r["device"] for r in runs} == {node.me}
    # The agent's own replies never start another conversation.
    await fleet.step(1)
    assert len(await fleet.runs("chat-watch")) == 4


async def test_disabling_chat_watch_stops_the_answers(fleet: Fleet) -> None:
    node = await fleet.node(1)
    await hold(fleet)
    await fleet.put("chat-watch", enabled=False)
    await fleet.step(1)
    assert not node.daemon.chat.connected
    mid = await fleet.say("/help")
    await fleet.step(1)
    await fleet.step(1)
    assert mid not in await fleet.replies()
    assert await fleet.runs("chat-watch") == []


async def test_pinning_chat_watch_moves_where_it_answers(fleet: Fleet) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await hold(fleet)
    assert a.daemon.chat.connected
    await fleet.put("chat-watch", owner=b.me)
    await hold(fleet)
    assert b.daemon.chat.connected and not a.daemon.chat.connected
    mid = await fleet.say("/help")
    await fleet.step(1)
    await fleet.step(1)
    assert mid in await fleet.replies()
    assert [r["device"] for r in await fleet.runs("chat-watch")] == [b.me]


async def test_a_takeover_answers_the_backlog_once(fleet: Fleet) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await hold(fleet)
    answered = await fleet.say("/help")
    await fleet.step(1)
    await fleet.step(1)
    assert answered in await fleet.replies()
    await a.stop()  # the active device goes away; its row stays, so nobody takes over yet
    fleet.clock.advance(60)
    waiting = [await fleet.say("/next"), await fleet.say("/runs")]
    await fleet.say("not a command")
    await fleet.activate(b)  # a manual move of the role
    await fleet.step(0, poll=True)
    assert b.election.verdict == "active"
    await hold(fleet)
    assert b.daemon.chat.connected

    async def backlog_answered() -> bool:
        # The watch answers its backlog one conversation at a time, in the background.
        await fleet.step(1)
        replies = await fleet.replies()
        return all(mid in replies for mid in [answered, *waiting])

    await async_wait_until(backlog_answered, timeout=20, what="the backlog to be answered")
    replies = await fleet.replies()
    assert all(len(replies.get(mid, [])) == 1 for mid in [answered, *waiting])
    assert len(replies) == 3
    # Connecting again (a restart) finds nothing left to answer.
    await b.restart()
    await hold(fleet)
    await fleet.step(1)
    assert {k: len(v) for k, v in (await fleet.replies()).items()} == dict.fromkeys(
        [answered, *waiting], 1
    )
    assert len(await fleet.runs("chat-watch")) == 3


async def test_a_stand_down_clears_the_owner_of_chat_watch(fleet: Fleet) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await hold(fleet)
    await fleet.activate(b)
    await a.election.poll()  # only a notices for now
    await a.tick()
    await a.settle()
    assert not a.daemon.chat.connected
    assert (await fleet.record("chat-watch") or {})["owner"] == ""
    await fleet.step(0, poll=True)
    await hold(fleet)
    assert (await fleet.record("chat-watch") or {})["owner"] == b.me
    assert b.daemon.chat.connected


async def test_a_plugged_in_responder_answers_what_the_shipped_one_leaves(fleet: Fleet) -> None:
    class Echo:
        def accepts(self, message: ChatMessage) -> bool:
            return message.text.startswith("echo ")

        async def respond(self, message: ChatMessage, ctx: ResponderContext) -> str | None:
            return message.text[5:]

    node = await fleet.node(1)
    node.daemon.chat.responders.append(Echo())
    await hold(fleet)
    mid = await fleet.say("echo hello")
    await fleet.step(1)
    await fleet.step(1)
    assert (await fleet.replies())[mid][0]["text"] == "hello"


async def test_a_disconnect_drops_deferred_conversations_and_lets_the_running_one_finish(
    fleet: Fleet,
) -> None:
    await fleet.node(1)
    _, _, chat = await fleet.places()
    release, running, done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    started: list[str] = []
    finished: list[str] = []

    async def conversation(message: ChatMessage) -> None:
        started.append(message.message_id)
        running.set()
        await release.wait()
        finished.append(message.message_id)
        done.set()

    async def fire(trigger_id: str, message: ChatMessage) -> asyncio.Task[None]:
        return asyncio.create_task(conversation(message))

    client = ServerClient(fleet.server.url)
    watch = ChatWatch(
        agent_name="bao",
        client=client,
        clock=fleet.clock,
        scheduler=fleet.nodes[0].daemon.port,
        fire=fire,
        responders=[],
    )
    try:
        watch.connect("chat-watch", Dataset(chat.space, chat.object_id, chat.name))
        for i in range(3):
            msg = ChatMessage("bao", chat.object_id, f"q{i}", "/help", None, None, None, i, {})
            assert watch.offer(msg)
        async with asyncio.timeout(5):
            await running.wait()
        assert watch.disconnect("stood down") == 2
        release.set()
        async with asyncio.timeout(5):
            await done.wait()
        assert started == finished == ["q0"]  # the two deferred ones never ran
    finally:
        await watch.stop()
        await client.aclose()
