"""The built-in programs against a real devserver: what they post is what the chat reads."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import run_of

from anyrtd.client import Dataset, ServerClient, Upsert
from anyrtd.clock import SystemClock
from anyrtd.config import CommandProgram
from anyrtd.devserver import DevServer
from anyrtd.rows import RunRow
from anyrtd.runner import Runner

SPACE = "bao"


@pytest.fixture
async def client(devserver_inprocess: DevServer) -> AsyncIterator[ServerClient]:
    async with ServerClient(devserver_inprocess.url) as c:
        yield c


@pytest.fixture
def runner(client: ServerClient) -> Runner:
    return Runner(client=client, clock=SystemClock(), agent_name="bao", space=SPACE, commands={})


async def general_chat(client: ServerClient) -> Dataset:
    chat = await client.child(SPACE, "bao/v1", "bao/chat/general")
    return Dataset(SPACE, chat, "chat_messages")


def request(program: str, args: dict[str, Any], run_id: str) -> tuple[RunRow, dict[str, Any]]:
    return run_of(program, args, run_id=run_id, trigger_id="trig", device="12D3KooWtest")


async def test_remind_posts_a_message_the_chat_reads_as_new(
    client: ServerClient, runner: Runner
) -> None:
    chat = await general_chat(client)
    page = await client.changes(SPACE, since=0)
    assert page is not None
    since = page.seq

    out = await runner.run(
        *request(
            "agent:remind@v1",
            {"space": SPACE, "chatId": chat.object_id, "text": "standup in 5"},
            "run-remind",
        )
    )

    assert out.status == "ok", out.error
    (message,) = await client.query_all(chat)
    assert message["id"] == "remind-run-remind"
    assert message["text"] == "standup in 5"
    assert message["agent"] == "bao"
    assert out.started_at - 0.001 <= message["createdAt"] <= out.ended_at + 0.001  # ms precision
    page = await client.changes(SPACE, since=since)
    assert page is not None
    assert [(c.id, c.op) for c in page.changes if c.object_id == chat.object_id] == [
        ("remind-run-remind", "create")
    ]


async def test_remind_into_a_space_that_does_not_exist_fails(
    client: ServerClient, runner: Runner
) -> None:
    out = await runner.run(
        *request(
            "agent:remind@v1",
            {"space": "no-such-space", "chatId": "obj", "text": "hello"},
            "run-lost",
        )
    )

    assert out.status == "FAILED"
    assert out.error_type == "ChatNotFound"
    assert out.error is not None
    assert out.error.startswith("chat obj does not exist in space no-such-space: set args.chatId")
    assert "Traceback" not in out.output and out.output.count("\n") == 1


async def test_rollup_posts_a_digest_of_the_last_day_skipping_its_own(
    client: ServerClient, runner: Runner
) -> None:
    chat = await general_chat(client)
    now = SystemClock().now()
    await client.upsert(
        chat,
        [
            Upsert(
                "old", {"text": "from last week", "author": "alice", "createdAt": now - 7 * 86400}
            ),
            Upsert("m1", {"text": "Good morning\nall", "author": "alice", "createdAt": now - 7200}),
            Upsert("m2", {"text": "release is out", "author": "bob", "createdAt": now - 3600}),
            Upsert("m3", {"text": "nice", "author": "alice", "createdAt": now - 60}),
        ],
    )

    first = await runner.run(*request("agent:rollup@v1", {"chatId": chat.object_id}, "r1"))
    second = await runner.run(*request("agent:rollup@v1", {"chatId": chat.object_id}, "r2"))

    assert first.status == "ok", first.error
    assert first.result == {"title": "Digest: 3 messages from 2 authors", "effects": 1}
    assert second.result == first.result, "the second digest counted the first one"
    records = {r["id"]: r for r in await client.query_all(chat)}
    digest = records["digest-r1"]
    assert digest["agent"] == "bao"
    lines = digest["text"].splitlines()
    assert lines[0].startswith("Digest of the last 24 h (")
    assert lines[0].endswith("UTC): 3 messages from 2 authors.")
    assert lines[1:] == [
        "",
        "alice: 2 messages",
        "- Good morning",
        "- nice",
        "",
        "bob: 1 message",
        "- release is out",
    ]
    assert records["digest-r2"]["text"].splitlines()[1:] == lines[1:]


async def test_rollup_with_no_args_digests_the_general_chat(
    client: ServerClient, runner: Runner
) -> None:
    chat = await general_chat(client)
    await runner.run(*request("agent:remind@v1", {"text": "water the plants"}, "rem"))

    out = await runner.run(*request("agent:rollup@v1", {}, "roll"))

    assert out.status == "ok", out.error
    assert out.result["title"] == "Digest: 1 message from 1 author"
    records = {r["id"]: r for r in await client.query_all(chat)}
    assert records["digest-roll"]["text"].splitlines()[2:] == [
        "bao (agent): 1 message",
        "- water the plants",
    ]


async def test_a_command_program_reaches_the_server_named_in_its_environment(
    client: ServerClient,
) -> None:
    code = (
        "import json, os, urllib.request\n"
        "url = os.environ['ANYRTD_SERVER'] + '/v1/spaces'\n"
        "spaces = json.load(urllib.request.urlopen(url, timeout=10))['spaces']\n"
        "mine = [s['id'] for s in spaces if s['id'] == os.environ['ANYRTD_SPACE']]\n"
        "print(json.dumps({'title': 'found ' + ','.join(mine)}))\n"
    )
    runner = Runner(
        client=client,
        clock=SystemClock(),
        agent_name="bao",
        space=SPACE,
        commands={"mine:probe@v1": CommandProgram(argv=(sys.executable, "-c", code))},
        timeout_s=30,
    )
    out = await runner.run(*request("mine:probe@v1", {}, "probe"))

    assert out.status == "ok", out.output
    assert out.result == {"title": f"found {SPACE}"}
