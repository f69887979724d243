"""Several real daemons, one per device of a devserver: what each verdict does to firing,
claiming and the active role's set, and the overlap window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fleet import Fleet

from anyrtd.vocab import Marker


def cron(expr: str = "*/10 * * * *", **fields: Any) -> dict[str, Any]:
    return {"kind": "cron", "spec": {"cron": expr}, "program": "test:ok@v1", **fields}


pytestmark = pytest.mark.devices(3)


@pytest.fixture
def replicated_fleet(fleet_factory: Callable[..., Fleet]) -> Fleet:
    return fleet_factory(devices=2, replicated=True, sync_delay=0.05)


async def test_the_active_device_claims_and_the_standby_fires_only_its_pins(fleet: Fleet) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    assert (a.election.verdict, b.election.verdict) == ("active", "standby")
    await fleet.put("free", owner="", **cron())
    await fleet.put("on-b", owner=b.me, **cron())
    await fleet.step(5)
    await fleet.step(5)  # the claim is confirmed a tick after its stamp is seen back
    assert (await fleet.record("free") or {})["owner"] == a.me
    assert "free" in a.daemon.registry and "free" not in b.daemon.registry
    assert "on-b" in b.daemon.registry and "on-b" not in a.daemon.registry
    await fleet.step(600)
    devices = {c[1]: c[2] for c in fleet.programs.calls}
    assert devices == {"free": a.me, "on-b": b.me}


async def test_the_active_role_set_lives_only_on_the_active_device(fleet: Fleet) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await fleet.step(5)
    await fleet.step(5)
    standing = {"rollup", "extraction", "linkgen", "evolution", "decay", "reflection"}
    assert standing <= set(a.daemon.registry.entries)
    assert not standing & set(b.daemon.registry.entries)
    cw = a.daemon.role.chat_watch_id
    assert cw == "chat-watch" and b.daemon.role.chat_watch_id == cw
    assert (await fleet.record(cw) or {})["owner"] == a.me
    assert a.daemon.chat.connected and not b.daemon.chat.connected
    markers = {e.id: e.row.marker for e in a.daemon.registry.entries.values() if e.id in standing}
    assert markers == {
        "rollup": None,
        "decay": None,
        "extraction": Marker.NOT_INSTALLED,
        "linkgen": Marker.NOT_INSTALLED,
        "evolution": Marker.NOT_INSTALLED,
        "reflection": Marker.NOT_INSTALLED,
    }


async def test_a_manual_activate_moves_the_role_within_one_poll_and_no_pinned_trigger(
    fleet: Fleet,
) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await fleet.put("claimed", owner="", **cron())
    await fleet.step(5)
    await fleet.step(5)
    assert (await fleet.record("claimed") or {})["owner"] == a.me
    await fleet.activate(b)
    await fleet.step(0, poll=True)  # one poll
    assert (a.election.verdict, b.election.verdict) == ("standby", "active")
    assert "rollup" in b.daemon.registry and "rollup" not in a.daemon.registry
    await fleet.step(5)
    await fleet.step(5)
    # The user trigger stays where it was claimed; the chat responder moved.
    assert (await fleet.record("claimed") or {})["owner"] == a.me
    assert "claimed" in a.daemon.registry and "claimed" not in b.daemon.registry
    assert (await fleet.record("chat-watch") or {})["owner"] == b.me
    assert b.daemon.chat.connected and not a.daemon.chat.connected
    await fleet.step(600)
    assert {c[2] for c in fleet.programs.of("claimed")} == {a.me}


async def test_a_pruned_device_fires_nothing_not_even_its_pins(fleet: Fleet) -> None:
    await fleet.node(1)
    b = await fleet.node(2)
    await fleet.put("on-b", owner=b.me, **cron("* * * * *"))
    await fleet.step(5)
    assert "on-b" in b.daemon.registry
    await fleet.prune(b)
    await fleet.step(0, poll=True)
    assert b.election.verdict == "pruned"
    for _ in range(3):
        await fleet.step(60)
    assert fleet.programs.of("on-b") == []
    assert await fleet.runs("on-b") == []


async def test_a_takeover_re_arms_the_standing_crons_strictly_forward(fleet: Fleet) -> None:
    await fleet.node(1)
    b = await fleet.node(2)
    await fleet.step(5)
    # Two days pass with device 1 active; then device 2 takes the role.
    await fleet.step(2 * 86400)
    await fleet.activate(b)
    await fleet.step(0, poll=True)
    now = fleet.clock.now()
    rollup = b.daemon.registry.get("rollup")
    assert rollup is not None and rollup.row.next_fire is not None
    assert now < rollup.row.next_fire <= now + 86400  # the next 08:00, no missed one replayed
    started = await fleet.step(1)
    assert not [r for r in started if r in {"rollup", "decay"}]
    assert (await fleet.record("rollup") or {})["owner"] == b.me


async def test_two_devices_active_for_a_poll_fire_each_fresh_once_exactly_once(
    replicated_fleet: Fleet,
) -> None:
    fleet = replicated_fleet
    a, b = await fleet.node(1), await fleet.node(2)
    await fleet.step(5)
    await fleet.activate(b)
    await b.election.poll()  # b now believes it is active; a has not polled yet
    assert (a.election.verdict, b.election.verdict) == ("active", "active")
    at = fleet.clock.now() - 60
    for i in range(100):
        writer = a if i % 2 else b
        await fleet.put(
            f"shot-{i:03d}",
            via=writer,
            kind="once",
            spec={"at": at},
            program="test:ok@v1",
            owner="",
        )
    await fleet.replicated()
    for _ in range(4):
        await fleet.step(5)
    await fleet.step(0, poll=True)
    for _ in range(2):
        await fleet.step(5)
    runs = await fleet.runs()
    counts: dict[str, int] = {}
    for run in runs:
        counts[run["triggerId"]] = counts.get(run["triggerId"], 0) + 1
    shots = {k: v for k, v in counts.items() if k.startswith("shot-")}
    assert len(shots) == 100 and set(shots.values()) == {1}
    assert len([c for c in fleet.programs.calls if str(c[1]).startswith("shot-")]) == 100
    owners = {(await fleet.record(f"shot-{i:03d}") or {}).get("owner") for i in range(100)}
    assert owners <= {a.me, b.me}


async def test_a_repin_moves_a_trigger_within_one_tick_old_evicts_new_adopts(fleet: Fleet) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    await fleet.put("job", owner=a.me, **cron("*/10 * * * *"))
    await fleet.step(5)
    assert "job" in a.daemon.registry and "job" not in b.daemon.registry
    await fleet.put("job", owner=b.me)
    await fleet.step(5)
    assert "job" not in a.daemon.registry and "job" in b.daemon.registry
    await fleet.step(600)
    assert {c[2] for c in fleet.programs.of("job")} == {b.me}


async def test_a_repinned_consumed_once_stays_consumed(fleet: Fleet) -> None:
    a, b = await fleet.node(1), await fleet.node(2)
    at = fleet.clock.now() + 10
    await fleet.put("shot", owner=a.me, kind="once", spec={"at": at}, program="test:ok@v1")
    await fleet.step(5)
    await fleet.step(10)
    assert len(fleet.programs.of("shot")) == 1
    await fleet.put("shot", owner=b.me)
    await fleet.step(5)
    await fleet.step(600)
    assert len(fleet.programs.of("shot")) == 1
    assert len(await fleet.runs("shot")) == 1
