"""Chains on real daemons (in process, a shared fake clock) and a devserver: a chain fires
once for each matching run record, on its own owner, with the upstream run in its args and
its record (docs/events.md, "Chains")."""

from __future__ import annotations

from typing import Any

import pytest
from fleet import Fleet, Node

from anyrtd import chaining
from anyrtd.chain import CHAIN_DEPTH_LIMIT, chained_run_id
from anyrtd.client import ServerUnavailable, Upsert


async def chain(fleet: Fleet, node: Node, rid: str = "report", **flt: Any) -> None:
    spec = {"dataset": "agent_runs", "filter": {"triggerId": "backup", **flt}}
    await fleet.put(
        rid, kind="event", spec=spec, program="test:ok@v1", args={"x": 1}, owner=node.me
    )
    await fleet.step(1)
    await fleet.step(1)
    assert rid in node.daemon.registry


async def backup(
    fleet: Fleet, node: Node, rid: str = "backup", program: str = "test:ok@v1"
) -> None:
    await fleet.put(rid, kind="cron", spec={"every_s": 60}, program=program, owner=node.me)
    await fleet.step(1)
    await fleet.step(1)
    assert rid in node.daemon.registry


async def steps(fleet: Fleet, n: int, seconds: float = 60) -> None:
    for _ in range(n):
        await fleet.step(seconds)
        await fleet.step(0)  # the run record's arrival on the feed, then the chain's run


async def test_a_chain_fires_once_for_each_ok_run_of_its_upstream_on_another_device(
    fleet: Fleet,
) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await chain(fleet, a)
    await backup(fleet, b)
    await steps(fleet, 3)
    ups = [r for r in await fleet.runs("backup") if r["status"] == "ok"]
    assert len(ups) >= 3
    answers = await fleet.runs("report")
    done = [r for r in answers if r["status"] == "ok"]
    calls = fleet.programs.of("report")
    assert {c[2] for c in calls} == {a.me}  # on its own owner only
    answered = {r["upstreamRunId"] for r in answers}
    assert len(answered) == len(answers)  # none twice
    # every upstream ok run that landed before the last step is answered, by its own run id
    settled = [u for u in ups if u["runId"] in answered]
    assert len(settled) >= 3
    for r in done:
        assert r["runId"] == chained_run_id("report", r["upstreamRunId"])
        assert r["chainDepth"] == 1
    event = calls[0][3]["event"]
    first = next(u for u in ups if u["runId"] == event["runId"])
    assert calls[0][3]["x"] == 1
    assert event["triggerId"] == "backup" and event["status"] == "ok"
    assert event["device"] == b.me and event["endedAt"] == first["endedAt"]
    assert event["startedAt"] == first["startedAt"] and event["depth"] == 0
    _, runs, _ = await fleet.places()
    assert event["ref"] == {
        "space": "bao",
        "objectId": runs.object_id,
        "dataset": runs.name,
        "id": event["runId"],
    }


async def test_a_chain_on_ok_runs_does_not_fire_for_failures_and_one_on_failed_does(
    fleet: Fleet,
) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await chain(fleet, a, "on-ok")
    await chain(fleet, a, "on-fail", status="failed")
    await backup(fleet, b, program="test:fail@v1")
    await steps(fleet, 2)
    assert fleet.programs.of("on-ok") == []
    failed = await fleet.runs("backup")
    assert failed and all(r["status"] == "FAILED" for r in failed)
    assert len(fleet.programs.of("on-fail")) >= 1
    assert {r["upstreamRunId"] for r in await fleet.runs("on-fail")} <= {r["runId"] for r in failed}


async def test_a_run_record_seen_again_or_answered_elsewhere_fires_nothing_more(
    fleet: Fleet,
) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await chain(fleet, a)
    _, runs, _ = await fleet.places()
    record = {
        "runId": "up-1",
        "triggerId": "backup",
        "status": "ok",
        "device": b.me,
        "startedAt": fleet.clock.now(),
        "endedAt": fleet.clock.now(),
    }
    await fleet.user.upsert(runs, [Upsert("up-1", record)])
    await fleet.step(1)
    assert len(fleet.programs.of("report")) == 1
    # the same record written again (a replayed outbox), and another field on it
    await fleet.user.upsert(runs, [Upsert("up-1", record)])
    await fleet.user.upsert(runs, [Upsert("up-1", {"title": "again"})])
    await fleet.step(1)
    # a process that forgot what it answered (a restart, a second device holding the chain
    # in the overlap window) is refused by the server's conditional create
    a.daemon.role.chains.answered.clear()
    await fleet.user.upsert(runs, [Upsert("up-1", {"title": "once more"})])
    await fleet.step(1)
    assert len(fleet.programs.of("report")) == 1
    # the other device answered up-2 first: its record exists, so this one does not run it
    other = chained_run_id("report", "up-2")
    await fleet.user.upsert(runs, [Upsert(other, {"runId": other, "status": "running"})])
    await fleet.user.upsert(runs, [Upsert("up-2", {**record, "runId": "up-2"})])
    await fleet.step(1)
    assert len(fleet.programs.of("report")) == 1
    answers = await fleet.runs("report")
    assert [r["upstreamRunId"] for r in answers] == ["up-1"]


async def test_run_records_that_landed_while_the_owner_was_down_never_fire(fleet: Fleet) -> None:
    a = await fleet.node(1)
    await chain(fleet, a)
    _, runs, _ = await fleet.places()
    await a.stop()
    fleet.clock.advance(30)
    at = fleet.clock.now()
    record = {
        "triggerId": "backup",
        "status": "ok",
        "device": "nas",
        "startedAt": at,
        "endedAt": at,
    }
    await fleet.user.upsert(runs, [Upsert("while-down", {**record, "runId": "while-down"})])
    fleet.clock.advance(30)
    await a.restart()
    await fleet.step(1)
    assert fleet.programs.of("report") == []
    at = fleet.clock.now()
    fresh = {**record, "runId": "after", "startedAt": at, "endedAt": at}
    await fleet.user.upsert(runs, [Upsert("after", fresh)])
    await fleet.step(1)
    assert [c[3]["event"]["runId"] for c in fleet.programs.of("report")] == ["after"]


async def test_a_run_past_the_depth_limit_is_not_answered(fleet: Fleet) -> None:
    a = await fleet.node(1)
    await chain(fleet, a)
    _, runs, _ = await fleet.places()
    at = fleet.clock.now()
    base = {"triggerId": "backup", "status": "ok", "device": "x", "startedAt": at, "endedAt": at}
    deep = {**base, "runId": "deep", "chainDepth": CHAIN_DEPTH_LIMIT}
    await fleet.user.upsert(runs, [Upsert("deep", deep)])
    ok = {**base, "runId": "shallow", "chainDepth": CHAIN_DEPTH_LIMIT - 1}
    await fleet.user.upsert(runs, [Upsert("shallow", ok)])
    await fleet.step(1)
    assert [c[3]["event"]["runId"] for c in fleet.programs.of("report")] == ["shallow"]
    (answer,) = await fleet.runs("report")
    assert answer["chainDepth"] == CHAIN_DEPTH_LIMIT


async def test_chains_written_elsewhere_into_a_loop_are_marked_and_never_fire(
    fleet: Fleet,
) -> None:
    a = await fleet.node(1)

    def spec(up: str) -> dict[str, Any]:
        return {"dataset": "agent_runs", "filter": {"triggerId": up, "status": "any"}}

    await fleet.put("ping", kind="event", spec=spec("pong"), program="test:ok@v1", owner=a.me)
    await fleet.put("pong", kind="event", spec=spec("ping"), program="test:ok@v1", owner=a.me)
    await fleet.step(1)
    await fleet.step(1)
    for rid in ("ping", "pong"):
        assert (await a.record(rid)).get("lastStatus") == "invalid_spec"
    _, runs, _ = await fleet.places()
    at = fleet.clock.now()
    rec = {"runId": "u", "triggerId": "ping", "status": "ok", "startedAt": at, "endedAt": at}
    await fleet.user.upsert(runs, [Upsert("u", rec)])
    await fleet.step(1)
    assert fleet.programs.of("pong") == []
    # broken: pong now follows something else, and both markers clear
    await fleet.put("pong", spec=spec("backup"))
    await fleet.step(1)
    await fleet.step(1)
    for rid in ("ping", "pong"):
        assert (await a.record(rid)).get("lastStatus") is None


async def test_without_a_chain_no_run_record_is_looked_at(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await fleet.node(1)
    await backup(fleet, a)

    def looked(*_args: Any) -> None:
        raise AssertionError("a run record was read though no chain exists")

    monkeypatch.setattr(chaining, "upstream_run", looked)
    await steps(fleet, 2)
    assert len(await fleet.runs("backup")) >= 2
    assert not a.daemon.apply.chains


async def test_an_answer_the_server_could_not_take_is_tried_again_at_a_later_page(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await fleet.node(1)
    await chain(fleet, a)
    _, runs, _ = await fleet.places()
    client = a.daemon.role.chains.client
    real = client.upsert
    refused: list[str] = []

    async def once_away(where: Any, writes: Any) -> dict[str, int]:
        writes = list(writes)
        if not refused and writes and writes[0].if_version == 0:
            refused.append(writes[0].id)
            raise ServerUnavailable("connection refused")
        return await real(where, writes)

    monkeypatch.setattr(client, "upsert", once_away)
    at = fleet.clock.now()
    rec = {"runId": "u1", "triggerId": "backup", "status": "ok", "startedAt": at, "endedAt": at}
    await fleet.user.upsert(runs, [Upsert("u1", rec)])
    await fleet.step(1)
    assert refused == [chained_run_id("report", "u1")]
    await fleet.user.upsert(runs, [Upsert("u2", {**rec, "runId": "u2"})])
    await fleet.step(1)
    assert sorted(c[3]["event"]["runId"] for c in fleet.programs.of("report")) == ["u1", "u2"]
