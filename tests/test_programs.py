"""The built-in programs, one piece at a time: the requests they make and the digest they write."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from support import run_of

from anyrtd.client import ServerClient
from anyrtd.clock import FakeClock, SystemClock
from anyrtd.config import CommandProgram, load_config
from anyrtd.programs.rollup import author_of, digest_text, first_line
from anyrtd.rows import RunRow
from anyrtd.runner import Runner

NOW = 1_800_000_000.0


class FakeServer:
    """Answer the few routes the built-ins call, and remember every request."""

    def __init__(self, messages: list[dict[str, Any]] | None = None) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.messages = messages or []

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        path = request.raw_path.split("?")[0]
        self.requests.append((request.method, path, body))
        if path.endswith("/children"):
            return web.json_response({"objectId": "obj-general"})
        if path.endswith("/upsert"):
            return web.json_response(
                {"records": [{"id": r["id"], "version": 1} for r in body["records"]]}
            )
        if path.endswith("/query"):
            return web.json_response({"records": self.messages})
        return web.json_response({"error": {"code": "not_found", "message": path}}, status=404)

    def writes(self) -> list[Any]:
        return [body for method, path, body in self.requests if path.endswith("/upsert")]


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    """Serve every route with `handler` on 127.0.0.1 (a free port); yield its base URL."""
    app = web.Application()
    for method in ("GET", "POST", "PUT", "DELETE"):
        app.router.add_route(method, "/{tail:.*}", handler)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture
async def runner(server: FakeServer) -> AsyncIterator[Runner]:
    async with serving(server.handle) as url, ServerClient(url) as client:
        yield Runner(
            client=client, clock=FakeClock(NOW), agent_name="bao", space="agent-space", commands={}
        )


def request(program: str, args: Mapping[str, Any]) -> tuple[RunRow, dict[str, Any]]:
    return run_of(
        program, args, run_id="run-7", trigger_id="trig-7", scheduled_at=NOW, device="dev"
    )


# agent:remind@v1


async def test_remind_posts_the_text_as_a_message_under_the_agent_name(
    runner: Runner, server: FakeServer
) -> None:
    out = await runner.run(
        *request("agent:remind@v1", {"space": "sp", "chatId": "chat-1", "text": "standup in 5"})
    )

    assert out.status == "ok", out.error
    assert out.result == {"title": "Reminder: standup in 5", "effects": 1}
    assert server.requests == [
        (
            "POST",
            "/v1/spaces/sp/upsert",
            {
                "objectId": "chat-1",
                "dataset": "chat_messages",
                "records": [
                    {
                        "id": "remind-run-7",
                        "fields": {"text": "standup in 5", "agent": "bao", "createdAt": NOW},
                    }
                ],
            },
        )
    ]


async def test_remind_without_a_chat_posts_to_the_agent_space_general_chat(
    runner: Runner, server: FakeServer
) -> None:
    out = await runner.run(*request("agent:remind@v1", {"text": "hi"}))

    assert out.status == "ok", out.error
    assert server.requests[0] == (
        "POST",
        "/v1/spaces/agent-space/bundles/bao%2Fv1/children",
        {"seed": "bao/chat/general"},
    )
    assert server.writes()[0]["objectId"] == "obj-general"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"chatId": "c"}, "agent:remind@v1 needs args.text, a non-empty string; got None"),
        ({"chatId": "c", "text": "  "}, "needs args.text, a non-empty string; got '  '"),
        ({"chatId": "c", "text": 5}, "needs args.text, a non-empty string; got 5"),
        ({"chatId": ["c"], "text": "x"}, "takes an optional args.chatId, a non-empty string"),
        ({"space": "", "text": "x"}, "takes an optional args.space, a non-empty string"),
    ],
)
async def test_remind_with_bad_args_fails_saying_what_to_fix(
    runner: Runner, server: FakeServer, args: dict[str, Any], message: str
) -> None:
    out = await runner.run(*request("agent:remind@v1", args))

    assert (out.status, out.error_type) == ("FAILED", "InvalidArgs")
    assert out.error is not None and message in out.error
    assert server.writes() == []


async def test_remind_reports_a_server_refusal_as_a_failure() -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "tombstoned", "message": "gone"}}, status=409)

    async with serving(refuse) as url, ServerClient(url) as client:
        runner = Runner(
            client=client, clock=FakeClock(NOW), agent_name="bao", space="s", commands={}
        )
        out = await runner.run(*request("agent:remind@v1", {"chatId": "c", "text": "x"}))

    assert (out.status, out.error_type) == ("FAILED", "ServerError")
    assert out.error == "409 tombstoned: gone"


# agent:rollup@v1


def msg(mid: str, at: float, text: str, **kw: Any) -> dict[str, Any]:
    return {"id": mid, "createdAt": at, "text": text, "_v": 1, "_updatedAt": at, **kw}


async def test_rollup_posts_a_digest_of_the_last_day(runner: Runner, server: FakeServer) -> None:
    server.messages = [
        msg("m0", NOW - 90_000, "too old", author="alice"),
        msg("digest-run-1", NOW - 86_000, "Digest of yesterday", agent="bao"),
        msg("m1", NOW - 3_600, "Good morning\nsecond line", author="alice"),
        msg("m2", NOW - 3_000, "Shipping the release today", author="bob"),
        msg("m3", NOW - 2_000, "", author="alice", attachments=[{"name": "a.png"}]),
        msg("m4", NOW - 1_000, "reminder: standup", agent="bao"),
        msg("m5", NOW - 500, "deleted", author="bob", _deleted=True),
    ]
    out = await runner.run(*request("agent:rollup@v1", {"space": "sp", "chatId": "chat-1"}))

    assert out.status == "ok", out.error
    assert out.result == {"title": "Digest: 4 messages from 3 authors", "effects": 1}
    query = next(b for m, p, b in server.requests if p.endswith("/query"))
    assert query["filter"] == {"createdAt": {"$gte": NOW - 86_400}}
    assert query["sort"] == ["createdAt"]
    (write,) = server.writes()
    (record,) = write["records"]
    assert record["id"] == "digest-run-7"
    assert record["fields"]["agent"] == "bao"
    assert record["fields"]["text"] == (
        "Digest of the last 24 h (2027-01-14 08:00 to 2027-01-15 08:00 UTC): "
        "4 messages from 3 authors.\n"
        "\n"
        "alice: 2 messages\n"
        "- Good morning\n"
        "- (attachment)\n"
        "\n"
        "bao (agent): 1 message\n"
        "- reminder: standup\n"
        "\n"
        "bob: 1 message\n"
        "- Shipping the release today"
    )


async def test_rollup_of_a_quiet_chat_posts_nothing(runner: Runner, server: FakeServer) -> None:
    server.messages = [msg("digest-run-1", NOW - 100, "Digest of ...", agent="bao")]
    out = await runner.run(*request("agent:rollup@v1", {"chatId": "chat-1", "hours": 2}))

    assert out.status == "ok"
    assert out.result == {"title": "No messages in the last 2 h", "effects": 0}
    assert server.writes() == []
    assert "nothing to post" in out.output


@pytest.mark.parametrize("hours", [0, -1, "24", True, 10_000, float("nan")])
async def test_rollup_with_a_bad_window_fails_saying_what_to_fix(
    runner: Runner, server: FakeServer, hours: Any
) -> None:
    out = await runner.run(*request("agent:rollup@v1", {"chatId": "c", "hours": hours}))

    assert (out.status, out.error_type) == ("FAILED", "InvalidArgs")
    assert out.error is not None and "args.hours, the window in hours" in out.error
    assert server.requests == []


def test_a_digest_lists_at_most_a_hundred_first_lines_but_counts_all() -> None:
    messages = [msg(f"m{i}", NOW - 1000 + i, f"line {i}", author=f"u{i % 3}") for i in range(150)]
    text = digest_text(messages, NOW - 86_400, NOW, 24)

    assert "150 messages from 3 authors" in text
    assert text.count("\n- ") == 100
    assert text.endswith("… and 50 more not listed.")
    assert "u0: 50 messages" in text and "u1: 50 messages" in text and "u2: 50 messages" in text


def test_first_lines_are_shortened_and_authors_named() -> None:
    assert first_line({"text": "\n\n  " + "y" * 300}) == "y" * 119 + "…"
    assert first_line({"text": None}) == "(no text)"
    assert author_of({"author": " carol "}) == "carol"
    assert author_of({"agent": ""}) == "an agent"
    assert author_of({}) == "unknown"


# the example command program in contrib/


CONTRIB = Path(__file__).resolve().parent.parent / "contrib" / "programs"


def test_the_contrib_program_table_is_a_valid_config() -> None:
    config = load_config(str(CONTRIB / "anyrtd.toml"), env={})

    assert set(config.programs) == {"mine:disk-report@v1", "mine:backup@v1"}
    backup = config.programs["mine:backup@v1"]
    assert backup.env == {"BACKUP_TARGET": "/srv/backup"} and backup.cwd == "/var/lib/backup"


@pytest.mark.parametrize(("warn", "status"), [(100, "ok"), (0.0001, "FAILED")])
async def test_the_contrib_disk_report_runs_as_a_command_program(
    warn: float, status: str, tmp_path: Path
) -> None:
    report = CommandProgram(argv=(sys.executable, str(CONTRIB / "disk_report.py")))
    async with ServerClient("http://127.0.0.1:9") as client:
        runner = Runner(
            client=client,
            clock=SystemClock(),
            agent_name="bao",
            space="s",
            commands={"mine:disk-report@v1": report},
        )
        out = await runner.run(
            *request("mine:disk-report@v1", {"path": str(tmp_path), "warnPercent": warn})
        )

    assert out.status == status, out.output
    assert out.error_type == (None if status == "ok" else "ExitCode")
    assert out.result["title"].startswith(f"{tmp_path} ")
    assert "run run-7 on dev" in out.output and "% used" in out.output
