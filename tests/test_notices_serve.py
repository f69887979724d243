"""A device that stops, seen from another: two `anyrtd serve` processes on a two-device
devserver, a cron pinned to device B; B's daemon stops and device A tells it everywhere a
user looks (`why`, `/metrics`, the status page in headless Chromium, `GET
/triggers/:id/missed`), with one chat message and one command notice (docs/notices.md)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from support import wait_until
from test_status_page import browser, open_page, row, wait_for  # noqa: F401 (a fixture)

from anyrtd.client import Dataset, ServerClient, Upsert
from anyrtd.places import resolve_places
from anyrtd.programs.chat import AGENT_BUNDLE, GENERAL_CHAT_SEED
from anyrtd.vocab import MissCause, NoticeKind

pytestmark = pytest.mark.process

PY = sys.executable
GRACE_S = 2.0
EVERY_S = 2


def config_lines(out: Path) -> tuple[str, ...]:
    keep = (
        "import sys, uuid, pathlib; "
        f"pathlib.Path({str(out)!r}, uuid.uuid4().hex + '.json')"
        ".write_bytes(sys.stdin.buffer.read())"
    )
    return (
        "election_poll_s = 0.5",
        f"missed_grace_s = {GRACE_S}",
        '[programs."test:true@v1"]',
        f'argv = [{json.dumps(PY)}, "-c", "pass"]',
        "[notices]",
        "chat = true",
        "[notices.command]",
        f'argv = [{json.dumps(PY)}, "-c", {json.dumps(keep)}]',
    )


def run(coro_fn: Callable[[ServerClient], Any], url: str) -> Any:
    async def main() -> Any:
        async with ServerClient(url) as client:
            return await coro_fn(client)

    return asyncio.run(main())


def put(url: str, rid: str, **fields: Any) -> None:
    async def write(client: ServerClient) -> None:
        places = await resolve_places(client, "bao")
        await client.upsert(places.triggers, [Upsert(rid, fields)])

    run(write, url)


def record(url: str, rid: str) -> dict[str, Any]:
    async def read(client: ServerClient) -> dict[str, Any]:
        places = await resolve_places(client, "bao")
        records, _ = await client.query(places.triggers, filter={"id": rid})
        return records[0]

    found: dict[str, Any] = run(read, url)
    return found


def chat_notices(url: str) -> list[dict[str, Any]]:
    async def read(client: ServerClient) -> list[dict[str, Any]]:
        chat = await client.child("bao", AGENT_BUNDLE, GENERAL_CHAT_SEED)
        messages = await client.query_all(Dataset("bao", chat, "chat_messages"))
        return [m for m in messages if m.get("notice")]

    found: list[dict[str, Any]] = run(read, url)
    return found


def delivered(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def get(proc: ServeProcess, path: str) -> Any:
    with proc.http() as client:
        resp = client.get(path)
    assert resp.status_code == 200, resp.text
    return resp.json() if path != "/metrics" else resp.text


def sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def election(proc: ServeProcess) -> dict[str, Any]:
    body: dict[str, Any] = get(proc, "/election")
    return body


def activate(url: str) -> None:
    done = subprocess.run(
        [*anyrtd_command(), "devices", "activate", "--server", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def pair(
    devserver_factory: Callable[..., DevserverProcess], tmp_path: Path
) -> Iterator[tuple[DevserverProcess, ServeProcess, ServeProcess, Path]]:
    out = tmp_path / "notices"
    out.mkdir()
    server = devserver_factory(devices=2)
    lines = config_lines(out)
    a = ServeProcess(tmp_path, server.urls[0], name="a", listen="127.0.0.1:0", config_lines=lines)
    b = ServeProcess(tmp_path, server.urls[1], name="b", config_lines=lines)
    try:
        a.start()
        wait_until(lambda: election(a)["verdict"] == "active", timeout=30, what="a active")
        b.start()
        yield server, a, b, out
    finally:
        a.stop()
        b.stop()


def test_a_stopped_device_is_seen_from_the_other_and_noticed_once(
    pair: tuple[DevserverProcess, ServeProcess, ServeProcess, Path],
    browser: WebDriver,  # noqa: F811
) -> None:
    server, a, b, out = pair
    peer_b = server.peers[1]
    put(
        server.url,
        "tick",
        kind="cron",
        spec={"every_s": EVERY_S},
        program="test:true@v1",
        owner=peer_b,
    )
    wait_until(
        lambda: (record(server.url, "tick").get("runCount") or 0) >= 2,
        timeout=30,
        what="device B to fire tick",
    )
    assert get(a, "/triggers/tick/missed")["count"] == 0

    b.stop()
    stopped = time.monotonic()

    def missed() -> dict[str, Any] | None:
        body: dict[str, Any] = get(a, "/triggers/tick/missed")
        return body if body["count"] else None

    answer = wait_until(missed, timeout=30, what="device A to see tick's missed occurrences")
    # The first occurrence after the stop, a grace later, plus a pass: generous for a busy box.
    assert time.monotonic() - stopped < EVERY_S + GRACE_S + 10
    newest = answer["occurrences"][0]
    assert newest["cause"] == MissCause.OWNER_NOT_RUNNING
    assert newest["text"].startswith(f"device {peer_b}") or f"({peer_b})" in newest["text"]
    assert "not running" in newest["text"]
    assert answer["graceS"] == GRACE_S

    env = {**os.environ, "ANYRTD_CONFIG": str(a.config), "ANYRTD_LISTEN": a.listen}
    why = subprocess.run(
        [*anyrtd_command(), "triggers", "why", "tick"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert why.returncode == 0, why.stderr
    assert "missed:" in why.stdout and "owner_not_running" in why.stdout
    assert "not running" in why.stdout
    listed = subprocess.run(
        [*anyrtd_command(), "triggers", "list", "--all"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert listed.returncode == 0 and ", missed " in listed.stdout, listed.stdout

    metrics = get(a, "/metrics")
    assert (sample(metrics, 'anyrtd_missed_occurrences_total{trigger="tick"}') or 0) >= 1
    last_run = sample(metrics, 'anyrtd_trigger_last_run_timestamp_seconds{trigger="tick"}')
    assert last_run == record(server.url, "tick")["lastRunAt"]

    open_page(browser, a)
    wait_for(
        browser,
        lambda br: br.find_element(By.ID, "h-missed").text.splitlines()[1] == "1",
        "the missed card to count tick",
    )
    assert "not running" in browser.find_element(By.ID, "h-missed").text
    wait_for(
        browser,
        lambda br: (
            (tr := row(br, "tick")) is not None
            and tr.get_attribute("data-missed") not in (None, "0")
            and tr.find_elements(By.CSS_SELECTOR, "svg circle.missed")
        ),
        "tick's timeline to mark its missed occurrences",
    )

    wait_until(lambda: len(delivered(out)) == 1, timeout=30, what="one command notice")
    wait_until(lambda: len(chat_notices(server.url)) == 1, timeout=30, what="one chat notice")
    note = delivered(out)[0]
    assert note["kind"] == NoticeKind.MISSED and note["triggerId"] == "tick"
    assert "not running" in note["why"]

    counted = sample(get(a, "/metrics"), 'anyrtd_missed_occurrences_total{trigger="tick"}') or 0
    wait_until(  # several more passes, each seeing more missed occurrences
        lambda: (
            (sample(get(a, "/metrics"), 'anyrtd_missed_occurrences_total{trigger="tick"}') or 0)
            >= counted + 2
        ),
        timeout=30,
        what="more missed occurrences counted",
    )
    activate(server.urls[1])  # the role moves to B (its daemon is stopped) ...
    wait_until(lambda: election(a)["verdict"] == "standby", timeout=15, what="a standby")
    activate(server.urls[0])  # ... and back
    wait_until(lambda: election(a)["verdict"] == "active", timeout=15, what="a active again")
    seen = sample(get(a, "/metrics"), 'anyrtd_missed_occurrences_total{trigger="tick"}') or 0
    wait_until(
        lambda: (
            (sample(get(a, "/metrics"), 'anyrtd_missed_occurrences_total{trigger="tick"}') or 0)
            >= seen + 2
        ),
        timeout=30,
        what="more passes after the role came back",
    )
    assert len(delivered(out)) == 1 and len(chat_notices(server.url)) == 1

    runs_before = record(server.url, "tick").get("runCount") or 0
    b.start()
    wait_until(
        lambda: (record(server.url, "tick").get("runCount") or 0) > runs_before + 1,
        timeout=30,
        what="tick to fire on B again",
    )
    wait_until(
        lambda: get(a, "/triggers/tick/missed")["count"] == 0,
        timeout=30,
        what="device A to see tick run again",
    )
    assert len(delivered(out)) == 1 and len(chat_notices(server.url)) == 1
