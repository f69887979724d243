"""The agenda across three devices, one stopped, on real processes: three `anyrtd serve` on a
three-device devserver. Device A's agenda lists the stopped device's occurrences as at risk
on every surface (`anyrtd agenda`, its `--json`, `GET /agenda`, the status page in headless
Chromium), and A makes the notice before the miss once, the lead time before, on the chat
and on the command channel, then says in the same thread that the occurrence was missed
(docs/notices.md)."""

from __future__ import annotations

import json
import os
import subprocess
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
from test_notices_serve import PY, chat_notices, delivered, election, get, put, record
from test_status_page import browser, open_page, wait_for  # noqa: F401 (a fixture)

from anyrtd.notices import message_id, risk_key
from anyrtd.vocab import MissCause, NoticeKind, OwnerState

pytestmark = pytest.mark.process

GRACE_S = 2.0
LEAD_S = 6.0


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
        "at_risk = true",
        f"at_risk_lead_s = {LEAD_S}",
        "[notices.command]",
        f'argv = [{json.dumps(PY)}, "-c", {json.dumps(keep)}]',
    )


@pytest.fixture
def trio(
    devserver_factory: Callable[..., DevserverProcess], tmp_path: Path
) -> Iterator[tuple[DevserverProcess, list[ServeProcess], Path]]:
    out = tmp_path / "notices"
    out.mkdir()
    server = devserver_factory(devices=3)
    lines = config_lines(out)
    a = ServeProcess(tmp_path, server.urls[0], name="a", listen="127.0.0.1:0", config_lines=lines)
    b = ServeProcess(tmp_path, server.urls[1], name="b", config_lines=lines)
    c = ServeProcess(tmp_path, server.urls[2], name="c", config_lines=lines)
    try:
        a.start()
        wait_until(lambda: election(a)["verdict"] == "active", timeout=30, what="a active")
        b.start()
        c.start()
        yield server, [a, b, c], out
    finally:
        for proc in (a, b, c):
            proc.stop()


def of_kind(items: list[dict[str, Any]], kind: str, key: str = "kind") -> list[dict[str, Any]]:
    return [n for n in items if n.get(key) == kind]


def cli(a: ServeProcess, *args: str) -> str:
    env = {**os.environ, "ANYRTD_CONFIG": str(a.config), "ANYRTD_LISTEN": a.listen}
    done = subprocess.run(
        [*anyrtd_command(), "agenda", *args], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_stopped_devices_occurrences_are_at_risk_everywhere_and_noticed_once_before(
    trio: tuple[DevserverProcess, list[ServeProcess], Path],
    browser: WebDriver,  # noqa: F811
) -> None:
    server, (a, _b, c), out = trio
    peer_a, peer_b, peer_c = server.peers[:3]
    hourly = {"kind": "cron", "spec": {"every_s": 3600}, "program": "test:true@v1"}
    put(server.url, "on-a", **hourly, owner=peer_a)
    put(server.url, "on-b", **hourly, owner=peer_b)
    put(
        server.url, "c-tick", kind="cron", spec={"every_s": 2}, program="test:true@v1", owner=peer_c
    )
    wait_until(
        lambda: (record(server.url, "c-tick").get("runCount") or 0) >= 2,
        timeout=30,
        what="device C to fire c-tick",
    )

    c.stop()

    def c_silent() -> dict[str, Any] | None:
        body: dict[str, Any] = get(a, "/agenda?hours=2")
        states = {o["triggerId"]: o["deviceState"] for o in body["occurrences"]}
        return body if states.get("c-tick") == OwnerState.NOT_RUNNING else None

    body = wait_until(c_silent, timeout=30, what="device A to see device C not running")
    by_id: dict[str, list[dict[str, Any]]] = {}
    for o in body["occurrences"]:
        by_id.setdefault(o["triggerId"], []).append(o)
    assert {"on-a", "on-b", "c-tick"} <= by_id.keys()
    assert all(not o["atRisk"] for o in by_id["on-a"] + by_id["on-b"])
    assert by_id["on-a"][0]["deviceState"] == OwnerState.RUNNING
    assert by_id["on-b"][0]["deviceState"] == OwnerState.STANDBY
    tick = by_id["c-tick"]
    assert all(o["atRisk"] and o["cause"] == MissCause.OWNER_NOT_RUNNING for o in tick)
    assert f"({peer_c})" in tick[0]["reason"] or peer_c in tick[0]["reason"]
    assert "not running" in tick[0]["reason"] and tick[0]["fix"].startswith("start anyrtd on")
    assert [o["at"] for o in body["occurrences"]] == sorted(o["at"] for o in body["occurrences"])

    # The occurrence to warn of: a once on C, due a little more than the lead from now.
    due = time.time() + LEAD_S + 8
    put(server.url, "c-backup", kind="once", spec={"at": due}, program="test:true@v1", owner=peer_c)

    def listed() -> dict[str, Any] | None:
        got: dict[str, Any] = get(a, "/agenda?hours=1")
        return next((o for o in got["occurrences"] if o["triggerId"] == "c-backup"), None)

    backup = wait_until(listed, timeout=15, what="c-backup in A's agenda")
    assert backup["atRisk"] and backup["deviceState"] == OwnerState.NOT_RUNNING

    shown = cli(a, "--hours", "1")
    lines = [line for line in shown.splitlines() if " c-backup " in line]
    assert lines and "at risk: owner_not_running" in lines[0] and "not running since" in lines[0]
    assert "- c-backup: device" in shown and "fix:  start anyrtd on" in shown
    on_a = [line for line in shown.splitlines() if " on-a " in line]
    assert on_a and on_a[0].rstrip().endswith("-") and " running " in on_a[0]
    as_json = json.loads(cli(a, "--hours", "1", "--json"))
    risky = {o["triggerId"] for o in as_json["occurrences"] if o["atRisk"]}
    assert risky == {"c-tick", "c-backup"}
    mine = json.loads(cli(a, "--hours", "1", "--json", "--device", peer_c))
    assert {o["triggerId"] for o in mine["occurrences"]} == {"c-tick", "c-backup"}

    open_page(browser, a)
    wait_for(
        browser,
        lambda br: br.find_elements(
            By.CSS_SELECTOR, '#agenda-table tr[data-trigger="c-backup"][data-at-risk="true"]'
        ),
        "the page's agenda to mark c-backup at risk",
    )
    tr = browser.find_element(By.CSS_SELECTOR, '#agenda-table tr[data-trigger="c-backup"]')
    assert "not running since" in tr.text and "start anyrtd on" in tr.text
    fine = browser.find_elements(By.CSS_SELECTOR, '#agenda-table tr[data-trigger="on-a"]')
    assert fine and all(r.get_attribute("data-at-risk") == "false" for r in fine)
    assert browser.find_elements(
        By.CSS_SELECTOR, '#agenda-table tr[data-trigger="c-tick"][data-at-risk="true"]'
    )

    # The notice before the miss: once, the lead time before it is due, on both channels.
    def warned() -> list[dict[str, Any]] | None:
        got = of_kind(delivered(out), NoticeKind.AT_RISK)
        return got or None

    notes = wait_until(warned, timeout=30, what="the notice before the miss")
    arrived = time.time()
    assert due - LEAD_S - 1.0 <= arrived <= due - LEAD_S + 5.0, (due - arrived, LEAD_S)
    (note,) = notes
    key = risk_key("c-backup", note["at"])
    assert note["key"] == key and note["triggerId"] == "c-backup"
    assert note["at"] == pytest.approx(due)
    assert "will be missed" in note["text"] and "not running" in note["why"]
    assert note["facts"]["deviceState"] == OwnerState.NOT_RUNNING
    wait_until(
        lambda: len(of_kind(chat_notices(server.url), NoticeKind.AT_RISK, "notice")) == 1,
        timeout=30,
        what="one chat notice before the miss",
    )

    # It is missed (C stays down): the same thread says so, once.
    def missed_said() -> list[dict[str, Any]] | None:
        got = of_kind(delivered(out), NoticeKind.AT_RISK_OVER)
        return got or None

    (over,) = wait_until(missed_said, timeout=30, what="the follow-up of the notice")
    assert time.time() >= due + GRACE_S - 0.5
    assert over["thread"] == key and over["facts"]["outcome"] == "missed"
    assert "did not run" in over["text"]
    wait_until(
        lambda: len(of_kind(chat_notices(server.url), NoticeKind.AT_RISK_OVER, "notice")) == 1,
        timeout=30,
        what="the follow-up in the chat",
    )
    (reply,) = of_kind(chat_notices(server.url), NoticeKind.AT_RISK_OVER, "notice")
    (first,) = of_kind(chat_notices(server.url), NoticeKind.AT_RISK, "notice")
    assert reply["replyTo"] == first["id"] == message_id(key)

    wait_until(  # more passes go by: nothing is said twice
        lambda: (get(a, "/healthz") or True) and time.time() > arrived + 3, timeout=10, what="time"
    )
    assert len(of_kind(delivered(out), NoticeKind.AT_RISK)) == 1
    assert len(of_kind(delivered(out), NoticeKind.AT_RISK_OVER)) == 1
    assert len(of_kind(chat_notices(server.url), NoticeKind.AT_RISK, "notice")) == 1
