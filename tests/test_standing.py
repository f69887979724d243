"""The standing built-ins on the active device: schedules, `not_installed`, rollup and decay."""

from __future__ import annotations

from typing import Any

import pytest
from fleet import Fleet

from anyrtd.client import Upsert
from anyrtd.mirror import Mirror
from anyrtd.standing import STANDING, definition
from anyrtd.vocab import Marker

pytestmark = pytest.mark.devices(1)


def test_the_definition_is_code_owned_over_the_records_own_fields() -> None:
    rollup = STANDING[0]
    defn = definition(
        rollup, "peer", {"program": "evil:rm@v1", "enabled": False, "runCount": 7, "spec": 3}
    )
    assert (defn.program, defn.spec["cron"], defn.owner) == ("agent:rollup@v1", "0 8 * * *", "peer")
    assert defn.enabled is False and defn.rollup.run_count == 7


async def test_rollup_and_decay_are_scheduled_and_the_rest_never_fire(fleet: Fleet) -> None:
    node = await fleet.node(1)
    await fleet.say("good morning")
    for _ in range(25):
        await fleet.step(3600)  # a day, hour by hour
    runs = await fleet.runs()
    by_trigger: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_trigger.setdefault(run["triggerId"], []).append(run)
    assert len(by_trigger["rollup"]) == 1 and by_trigger["rollup"][0]["status"] == "ok"
    assert len(by_trigger["decay"]) == 1 and by_trigger["decay"][0]["status"] == "ok"
    for rid in ("extraction", "linkgen", "evolution", "reflection"):
        assert rid not in by_trigger
        entry = node.daemon.registry.get(rid)
        assert entry is not None and entry.row.marker == Marker.NOT_INSTALLED
        assert entry.row.next_fire is None
    digests = [m for m in await fleet.messages() if str(m["id"]).startswith("digest-")]
    assert len(digests) == 1 and "good morning" in digests[0]["text"]
    record = await fleet.record("rollup") or {}
    assert record["owner"] == node.me and record["lastStatus"] == "ok"


async def test_decay_prunes_old_run_records_and_mirror_rows(fleet: Fleet) -> None:
    node = await fleet.node(1)
    _, runs, _ = await fleet.places()
    now = fleet.clock.now()
    old = [
        Upsert(f"old-{i}", {"runId": f"old-{i}", "startedAt": now - 40 * 86400}) for i in range(3)
    ]
    await fleet.user.upsert(runs, old)
    await fleet.put("tick", owner=node.me, kind="cron", spec={"every_s": 60}, program="test:ok@v1")
    await fleet.step(1)
    await fleet.step(60)  # one run of "tick", in the mirror and on the server
    assert len(await node.daemon.db_call(lambda m: m.runs(trigger_id="tick"))) == 1
    fleet.clock.advance(31 * 86400)  # that run is now past the 30 days kept
    recent = Upsert("recent", {"runId": "recent", "startedAt": fleet.clock.now() - 86400})
    await fleet.user.upsert(runs, [recent])
    run_id = await node.daemon.port.run_now("decay")
    assert run_id is not None
    await node.settle()
    left = {r["id"] for r in await fleet.user.query_all(runs)}
    assert not {"old-0", "old-1", "old-2"} & left and "recent" in left
    assert await fleet.runs("tick") == []
    mirror_rows: list[Any] = await node.daemon.db_call(lambda m: Mirror.runs(m, trigger_id="tick"))
    assert mirror_rows == []
    (decay,) = [r for r in await fleet.user.query_all(runs) if r["id"] == run_id]
    assert decay["status"] == "ok" and decay["mutations"] == 5


async def test_a_disabled_standing_record_keeps_its_built_in_off(fleet: Fleet) -> None:
    node = await fleet.node(1)
    await fleet.put("rollup", enabled=False)
    await fleet.step(1)
    entry = node.daemon.registry.get("rollup")
    assert entry is not None and not entry.row.enabled and entry.row.next_fire is None
    await fleet.put("rollup", enabled=True)
    await fleet.step(1)
    assert entry.row.enabled and entry.row.next_fire is not None
