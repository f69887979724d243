"""`GET /triggers/:id/why` on real daemons and a real devserver: a test per reason.

Each node of the fleet (tests/fleet.py) is a real `Daemon` with its own election on one
device of a multi-device devserver subprocess; the control API is served on that daemon
(`make_app(daemon.port)`), and the answer is read over HTTP as a user's client reads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import pytest
from fleet import Fleet, Node

from anyrtd.control.api import make_app
from anyrtd.vocab import Cause, Marker

Ask = Callable[[Node, str], Awaitable[dict[str, Any]]]


def cron(expr: str = "*/10 * * * *", **fields: Any) -> dict[str, Any]:
    return {"kind": "cron", "spec": {"cron": expr}, "program": "test:ok@v1", **fields}


@pytest.fixture
def ask(aiohttp_client: Any) -> Ask:
    clients: dict[int, Any] = {}

    async def why(node: Node, rid: str) -> dict[str, Any]:
        if node.index not in clients:
            clients[node.index] = await aiohttp_client(make_app(node.daemon.port))
        resp = await clients[node.index].get(f"/triggers/{quote(rid, safe='')}/why")
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body

    return why


def blocking(answer: dict[str, Any]) -> list[str]:
    return [r["cause"] for r in answer["reasons"] if r["blocking"]]


def reason(answer: dict[str, Any], cause: Cause) -> dict[str, Any]:
    found = [r for r in answer["reasons"] if r["cause"] == cause]
    assert found, (cause, answer["reasons"])
    return found[0]


async def test_a_pinned_cron_fires_here_with_its_next_fires(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    await fleet.put("daily", owner=a.me, **cron("0 8 * * *"))
    await fleet.step(5)
    answer = await ask(a, "daily")
    assert answer["fires"] is True and answer["device"] == a.me
    assert len(answer["nextFires"]) == 5 and answer["nextFire"] == answer["nextFires"][0]
    assert answer["nextFires"] == sorted(answer["nextFires"])
    assert answer["nextFire"] > fleet.clock.now()
    assert blocking(answer) == []


async def test_an_unknown_id(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    answer = await ask(a, "no-such-trigger")
    assert answer["fires"] is False and blocking(answer) == [Cause.UNKNOWN]
    assert reason(answer, Cause.UNKNOWN)["fix"] == "anyrtd triggers list --all"


async def test_a_deleted_trigger_is_tombstoned(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    await fleet.put("gone", owner=a.me, **cron())
    await fleet.step(5)
    triggers, _, _ = await fleet.places()
    await fleet.user.delete(triggers, ["gone"])
    await fleet.step(5)
    answer = await ask(a, "gone")
    assert blocking(answer) == [Cause.TOMBSTONED]


async def test_a_malformed_record_names_the_field(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    await fleet.put("broken", owner=a.me, spec={"cron": "* * * * *"}, program="test:ok@v1")
    await fleet.step(5)
    answer = await ask(a, "broken")
    found = reason(answer, Cause.MALFORMED)
    assert blocking(answer) == [Cause.MALFORMED] and found["facts"]["field"] == "kind"
    assert found["fix"] == "anyrtd triggers edit broken --set kind=JSON"


async def test_pinned_to_another_live_device(fleet: Fleet, ask: Ask) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await fleet.put("on-b", owner=b.me, **cron())
    await fleet.step(5)
    answer = await ask(a, "on-b")
    found = reason(answer, Cause.PINNED_ELSEWHERE)
    assert blocking(answer) == [Cause.PINNED_ELSEWHERE]
    assert found["facts"]["owner"] == b.me and found["facts"]["ownerState"] == "live"
    assert found["facts"]["ownerName"] == "device2"
    assert found["fix"] == f"anyrtd triggers pin on-b {a.me}"
    # It fires there, and the answer says when.
    assert answer["device"] == b.me and answer["nextFires"]
    there = await ask(b, "on-b")
    assert there["fires"] is True and there["nextFire"] == answer["nextFire"]


async def test_pinned_to_a_pruned_device(fleet: Fleet, ask: Ask) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await fleet.put("orphan", owner=b.me, **cron())
    await fleet.step(5)
    await fleet.prune(b)
    answer = await ask(a, "orphan")
    found = reason(answer, Cause.PINNED_ELSEWHERE)
    assert found["facts"]["ownerState"] == "pruned" and "fires nowhere" in found["text"]
    assert answer["device"] is None and answer["nextFires"] == []


async def test_pinned_to_a_device_the_registry_does_not_list(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    await fleet.put("lost", owner="12D3KooWnobodyhere", **cron())
    await fleet.step(5)
    found = reason(await ask(a, "lost"), Cause.PINNED_ELSEWHERE)
    assert found["facts"]["ownerState"] == "unknown"


async def test_a_standby_may_not_claim(fleet: Fleet, ask: Ask) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    assert b.election.verdict == "standby"
    await fleet.put("free", owner="", **cron())
    await b.tick()  # before the active device claims it
    answer = await ask(b, "free")
    found = reason(answer, Cause.STANDBY)
    assert blocking(answer) == [Cause.STANDBY] and found["facts"]["winner"] == a.me
    assert found["facts"]["winnerState"] == "live" and answer["device"] == a.me


async def test_this_device_pruned(fleet: Fleet, ask: Ask) -> None:
    _, b = await fleet.node(1), await fleet.node(2)
    await fleet.put("on-b", owner=b.me, **cron())
    await fleet.step(5)
    await fleet.prune(b)
    await fleet.step(0, poll=True)
    assert b.election.verdict == "pruned"
    answer = await ask(b, "on-b")
    found = reason(answer, Cause.DEVICE_PRUNED)
    assert blocking(answer)[0] == Cause.DEVICE_PRUNED
    assert found["facts"]["deviceState"] == "pruned" and answer["fires"] is False


async def test_the_takeover_hold(fleet: Fleet, ask: Ask) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await fleet.step(5)
    await fleet.activate(b)
    await b.election.poll()  # b takes the role; a has not stood down: no beat yet
    await b.tick()
    await fleet.put("fresh", owner="", **cron())
    await b.tick()
    answer = await ask(b, "fresh")
    found = reason(answer, Cause.TAKEOVER_HOLD)
    assert blocking(answer) == [Cause.TAKEOVER_HOLD]
    assert a.me in found["facts"]["waitingFor"]


async def test_a_new_holder_not_yet_adopted(fleet: Fleet, ask: Ask) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await fleet.put("free", owner="", **cron())
    await b.tick()  # standby: b knows the record and leaves it
    await fleet.activate(b)
    await b.election.poll()  # b holds the role now; its next tick adopts the record
    answer = await ask(b, "free")
    # not blocking: the next tick adopts it, and it fires here from then on
    assert blocking(answer) == [] and answer["fires"] is True and answer["nextFires"]
    assert reason(answer, Cause.NOT_ADOPTED)["facts"]["verdict"] == "active"
    assert answer["state"] == "unassigned" and answer["stateReason"] == "not_adopted"
    assert a.me != b.me


async def test_a_claim_awaiting_confirmation(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    await fleet.put("claimed", owner="", **cron())
    await a.tick()
    answer = await ask(a, "claimed")
    # not blocking: it says when the claim is confirmed, and that it fires here from then on
    assert blocking(answer) == [] and answer["fires"] is True and answer["state"] == "claiming"
    claim = reason(answer, Cause.CLAIMING)
    assert claim["facts"]["claimedAt"] is not None
    # confirmed once the server acknowledges the stamp: no tick to wait (docs/election.md)
    assert claim["facts"]["confirmBy"] >= claim["facts"]["claimedAt"]
    assert "as soon as the server acknowledges its owner stamp" in claim["text"]
    assert "fires here" in claim["text"] and answer["nextFires"]
    await fleet.step(5)
    await fleet.step(5)
    assert (await ask(a, "claimed"))["fires"] is True


async def test_an_invalid_spec_marker(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    await fleet.put("feb30", owner=a.me, **cron("0 0 30 2 *"))
    await fleet.step(5)
    found = reason(await ask(a, "feb30"), Cause.MARKER)
    assert found["facts"]["marker"] == Marker.INVALID_SPEC and found["facts"]["field"] == "spec"


async def test_a_program_not_installed_here(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    await fleet.put("nope", owner=a.me, **cron(program="test:nope@v1"))
    await fleet.step(5)
    answer = await ask(a, "nope")
    assert blocking(answer) == [Cause.NOT_INSTALLED]
    assert reason(answer, Cause.NOT_INSTALLED)["facts"]["program"] == "test:nope@v1"


async def test_failing_then_auto_disabled_with_the_last_errors(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    await fleet.put(
        "flaky", owner=a.me, maxConsecutiveFailures=2, **cron("* * * * *", program="test:fail@v1")
    )
    await fleet.step(5)
    await fleet.step(60)
    answer = await ask(a, "flaky")
    assert answer["fires"] is True
    failing = reason(answer, Cause.FAILING)
    assert failing["facts"]["consecutiveFailures"] == 1
    assert "boom" in failing["facts"]["lastErrors"][0]["error"]
    await fleet.step(60)
    await fleet.step(5)
    answer = await ask(a, "flaky")
    found = reason(answer, Cause.AUTO_DISABLED)
    assert blocking(answer) == [Cause.AUTO_DISABLED]
    assert found["facts"]["consecutiveFailures"] == 2
    assert len(found["facts"]["lastErrors"]) == 2
    assert found["fix"] == "anyrtd triggers enable flaky"


async def test_concurrent_failures_show_the_breakers_trip(fleet: Fleet, ask: Ask) -> None:
    # Three runs of one event trigger in flight at once, all failing: the breaker trips at
    # the second, and the third's end does not turn the trip into a plain disable.
    a = await fleet.node(1)
    _, _, chat = await fleet.places()
    await fleet.put(
        "loud",
        owner=a.me,
        kind="event",
        spec={"dataset": "chat_messages", "objectId": chat.object_id},
        program="test:fail@v1",
        maxConsecutiveFailures=2,
    )
    await fleet.step(5)
    for text in ("one", "two", "three"):
        await fleet.say(text)
    await fleet.step(1)
    await fleet.step(5)
    assert len(fleet.programs.of("loud")) == 3
    answer = await ask(a, "loud")
    assert blocking(answer) == [Cause.AUTO_DISABLED]
    assert reason(answer, Cause.AUTO_DISABLED)["fix"] == "anyrtd triggers enable loud"


async def test_a_consumed_once_names_its_run(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    at = fleet.clock.now() + 10
    await fleet.put("once", owner=a.me, kind="once", spec={"at": at}, program="test:ok@v1")
    await fleet.step(5)
    started = await fleet.step(10)
    assert len(started) == 1
    await fleet.step(5)
    answer = await ask(a, "once")
    found = reason(answer, Cause.CONSUMED)
    assert blocking(answer) == [Cause.CONSUMED] and found["facts"]["run"] == started[0]


async def test_disabled(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    await fleet.put("off", owner=a.me, enabled=False, **cron())
    await fleet.step(5)
    answer = await ask(a, "off")
    assert blocking(answer) == [Cause.DISABLED]
    assert reason(answer, Cause.DISABLED)["fix"] == "anyrtd triggers enable off"


async def test_a_run_in_flight_and_the_overlap_skips(fleet: Fleet, ask: Ask) -> None:
    a = await fleet.node(1)
    await fleet.put("slow", owner=a.me, **cron("* * * * *"))
    await fleet.step(5)
    fleet.programs.release.clear()
    try:
        fleet.clock.advance(60)
        assert await a.daemon.fire_due(fleet.clock.now())
        async with asyncio.timeout(10):
            await fleet.programs.started.wait()
        answer = await ask(a, "slow")
        assert answer["fires"] is True and reason(answer, Cause.RUNNING)["facts"]["running"] == 1
        fleet.clock.advance(60)
        assert await a.daemon.fire_due(fleet.clock.now()) == []
        answer = await ask(a, "slow")
        assert reason(answer, Cause.OVERLAP_SKIPS)["facts"]["overlapSkips"] == 1
        assert answer["fires"] is True
    finally:
        fleet.programs.release.set()
    await a.settle()


async def test_every_reason_in_the_order_to_fix_it(fleet: Fleet, ask: Ask) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await fleet.put("both", owner=b.me, enabled=False, **cron())
    await fleet.step(5)
    answer = await ask(a, "both")
    assert blocking(answer) == [Cause.PINNED_ELSEWHERE, Cause.DISABLED]
    assert answer["device"] is None
