"""A chain is seen where users look: `GET /triggers/:id` and `triggers show` name the upstream
and the run that fired it last, `why` says what it answers, the runs name the run they
answer (`runs list`), `schedule preview` says "after each ok run of …" (docs/events.md)."""

from __future__ import annotations

import time
from typing import Any

from support import async_wait_until
from test_control import Stack, stack

from anyrtd.cli import format as fmt
from anyrtd.cli.runs import runs_table
from anyrtd.client import Upsert

__all__ = ["stack"]  # the control API's fixture, shared


async def test_a_chains_upstream_and_last_firing_run_are_shown(stack: Stack) -> None:
    spec = {"dataset": "agent_runs", "filter": {"triggerId": "nightly-backup"}}
    view = await stack.create("report", kind="event", spec=spec, program="test:echo@v1")
    assert view["chain"] == {
        "after": "after each ok run of nightly-backup",
        "upstream": ["nightly-backup"],
        "statuses": ["ok"],
        "device": None,
        "lastFiredBy": None,
    }
    assert stack.daemon.places is not None
    runs = stack.daemon.places.runs
    now = time.time()
    record = {
        "runId": "up-1",
        "triggerId": "nightly-backup",
        "status": "ok",
        "device": "nas",
        "startedAt": now,
        "endedAt": now,
    }
    await stack.user.upsert(runs, [Upsert("up-1", record)])

    async def answered() -> dict[str, Any] | None:
        status, body = await stack.json("GET", "/triggers/report")
        return body if status == 200 and body["chain"]["lastFiredBy"] == "up-1" else None

    body = await async_wait_until(answered, timeout=20, what="the chain's run to end")
    assert body["lastStatus"] == "ok"
    _, listed = await stack.json("GET", "/runs")
    (mine,) = [r for r in listed if r["triggerId"] == "report"]
    assert mine["upstreamRunId"] == "up-1" and mine["chainDepth"] == 1
    table = runs_table(listed, time.time())
    assert table.splitlines()[0].endswith("AFTER RUN")
    assert any(line.endswith("up-1") for line in table.splitlines() if mine["runId"] in line)
    _, why = await stack.json("GET", "/triggers/report/why")
    (note,) = [r for r in why["reasons"] if r["cause"] == "chain"]
    assert note["text"] == (
        "it is a chain: it fires after each ok run of nightly-backup; its last run answered "
        "run up-1"
    )
    assert not note["blocking"]


def test_the_schedule_of_a_chain_reads_in_words() -> None:
    spec = {"dataset": "agent_runs", "filter": {"triggerId": "nightly-backup"}}
    assert fmt.schedule("event", spec) == "after each ok run of nightly-backup"
    spec = {"dataset": "agent_runs", "filter": {"status": ["failed", "incomplete"]}}
    assert fmt.schedule("event", spec) == (
        "after each FAILED or incomplete run of any trigger (no chain's run)"
    )
    # a table without a chain's run has no AFTER RUN column
    row = {"runId": "r", "triggerId": "t", "startedAt": 1.0, "status": "ok"}
    assert "AFTER RUN" not in runs_table([row], 2.0)


def test_schedule_preview_says_when_a_chain_fires() -> None:
    from click.testing import CliRunner

    from anyrtd.cli import main

    spec = '{"dataset": "agent_runs", "filter": {"triggerId": "nightly-backup"}}'
    result = CliRunner().invoke(main, ["schedule", "preview", spec])
    assert result.exit_code == 0, result.output
    assert result.output == (
        "after each ok run of nightly-backup: a chain fires on run records, never on the clock\n"
    )
    bad = '{"dataset": "agent_runs", "filter": {"status": "done"}}'
    result = CliRunner().invoke(main, ["schedule", "preview", bad])
    assert result.exit_code == 1 and "filter.status 'done'" in result.output
