"""A chain on real processes: two `anyrtd serve` on one devserver. A chain pinned to device A
answers each `ok` run of a cron pinned to device B, and not its failures, while A is killed
with SIGKILL and restarted, the active role moves twice and A re-reads every record every
two seconds: every upstream `ok` run is answered exactly once (its program ran once for
it), none twice, and none whose record landed while A was down (docs/events.md, "Chains")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import anyrtd_command
from control_support import ServeProcess
from support import wait_until

from anyrtd.chain import chained_run_id

pytestmark = pytest.mark.process

PY = sys.executable
# The upstream: ok, or FAILED about one time in three (by its start time).
BACKUP = "import sys, time; sys.exit(0 if int(time.time() * 10) % 3 else 1)"
# The chain's program: notes, one line per run, the upstream run it answers.
REPORT = (
    "import json, sys; e = json.load(sys.stdin)['event']; "
    "open(sys.argv[1], 'a').write(e['runId'] + ' ' + e['status'] + '\\n')"
)


def runs_of(url: str, trigger_id: str) -> list[dict[str, Any]]:
    with httpx.Client(base_url=url, timeout=10) as http:
        types = http.get("/v1/spaces/bao/types", params={"includeHidden": "true"}).json()
        type_id = next(t["id"] for t in types["types"] if t["key"] == "agent_trigger")
        anchor = http.post(
            "/v1/spaces/bao/bundles/bao%2Fv1/children",
            json={"seed": "bao/runs/v1", "type": type_id},
        ).json()["objectId"]
        out: list[dict[str, Any]] = []
        after = None
        while True:
            body: dict[str, Any] = {
                "objectId": anchor,
                "dataset": f"{type_id}_agent_runs",
                "filter": {"triggerId": trigger_id},
                "limit": 1000,
            }
            if after is not None:
                body["after"] = after
            page = http.post("/v1/spaces/bao/query", json=body).json()
            out += page["records"]
            after = page.get("next")
            if not after:
                return out


def cli(*args: str) -> None:
    done = subprocess.run([*anyrtd_command(), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def verdict(proc: ServeProcess) -> str:
    with proc.http() as client:
        return str(client.get("/election").json()["verdict"])


def test_a_chain_answers_each_ok_upstream_run_once_through_kills_role_moves_and_rereads(
    devserver_factory: Any, tmp_path: Path
) -> None:
    server = devserver_factory(devices=2)
    answers = tmp_path / "answers.txt"
    programs = (
        '[programs."test:backup@v1"]',
        f"argv = {json.dumps([PY, '-c', BACKUP])}",
        '[programs."test:report@v1"]',
        f"argv = {json.dumps([PY, '-c', REPORT, str(answers)])}",
    )
    lines = ("election_poll_s = 0.5", "full_resync_s = 2", *programs)
    a = ServeProcess(tmp_path, server.urls[0], name="a", config_lines=lines)
    b = ServeProcess(tmp_path, server.urls[1], name="b", config_lines=lines)
    a_peer, b_peer = server.peers[0], server.peers[1]
    try:
        a.start()
        wait_until(lambda: verdict(a) == "active", timeout=30, what="a active")
        b.start()
        common = ("--server", server.url, "--yes")
        cli(
            "triggers", "create", "--id", "report", "--after", "backup", "--program",
            "test:report@v1", "--owner", a_peer, "--force", *common,
        )  # fmt: skip
        wait_until(
            lambda: a.trigger("report")["state"] == "listening", timeout=30, what="report here"
        )
        cli(
            "triggers", "create", "--id", "backup", "--every", "1", "--program",
            "test:backup@v1", "--owner", b_peer, "--force", "--max-failures", "1000", *common,
        )  # fmt: skip
        wait_until(lambda: len(runs_of(server.url, "backup")) >= 6, timeout=30, what="b's runs")
        # kill -9 while upstream runs keep landing
        assert a.proc is not None
        killed = time.time()
        os.killpg(a.proc.pid, signal.SIGKILL)
        a.proc.wait()
        a.proc = None
        time.sleep(4)
        restarted = time.time()
        a.start()
        time.sleep(3)
        # move the active role twice
        cli("devices", "activate", "--server", server.urls[1])
        wait_until(lambda: verdict(b) == "active", timeout=30, what="b active")
        time.sleep(2)
        cli("devices", "activate", "--server", server.urls[0])
        wait_until(lambda: verdict(a) == "active", timeout=30, what="a active again")
        time.sleep(3)
        cli("triggers", "edit", "backup", "--set", "enabled=false", "--server", server.url, "--yes")
        stopped = time.time()
        time.sleep(2)  # the last upstream runs land, and their answers

        def settled() -> bool:
            ups = runs_of(server.url, "backup")
            done = {r["upstreamRunId"] for r in runs_of(server.url, "report")}
            late = [u for u in ups if u["status"] == "ok" and u["endedAt"] > restarted + 3]
            return all(u["runId"] in done for u in late)

        wait_until(settled, timeout=30, what="the answers to the last upstream runs")
    finally:
        a.stop()
        b.stop()

    ups = [u for u in runs_of(server.url, "backup") if u["endedAt"] is not None]
    assert {u["status"] for u in ups} == {"ok", "FAILED"}, "the upstream needs both outcomes"
    ran = Counter(line.split()[0] for line in answers.read_text().splitlines())
    records = runs_of(server.url, "report")
    answered = Counter(r["upstreamRunId"] for r in records)
    twice = {k: n for k, n in ran.items() if n > 1}
    assert not twice, f"upstream runs answered twice: {twice}"
    by_id = {u["runId"]: u for u in ups}
    assert all(by_id[k]["status"] == "ok" for k in answered), "a failure was answered"
    assert all(by_id[k]["status"] == "ok" for k in ran)
    for r in records:
        assert r["runId"] == chained_run_id("report", r["upstreamRunId"])
        assert r["device"] == a_peer and r["chainDepth"] == 1
    ok = [u for u in ups if u["status"] == "ok"]
    # Landed while A was down (ended after the kill, before the new process listened): never.
    down = [u["runId"] for u in ok if killed <= u["endedAt"] <= restarted]
    assert down, "no upstream run landed while A was down"
    assert not [k for k in down if k in answered or k in ran], "answered after A was down"
    # Landed while A listened (with a margin for the outbox's second and the feed): once.
    before = [u["runId"] for u in ok if u["endedAt"] < killed - 3]
    after = [u["runId"] for u in ok if restarted + 3 < u["endedAt"] < stopped - 1]
    assert len(before) >= 2 and len(after) >= 2, (len(before), len(after))
    live = before + after
    missing = [k for k in live if answered[k] != 1]
    assert not missing, f"upstream ok runs not answered: {missing}"
    # Its program ran once for each (a run the kill interrupted may not have written its line).
    interrupted = {r["upstreamRunId"] for r in records if r["status"] != "ok"}
    assert [k for k in live if ran[k] != 1 and k not in interrupted] == []
