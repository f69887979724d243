"""The tick against a real devserver: each lifecycle rule of the seeds, the mirror, the outbox.

The daemon runs in-process with an injected clock (tests/fleet.py, one node); each test
calls `tick()` and `fire_due(now)` itself, so hours of schedule pass in milliseconds and
nothing waits on a bare sleep.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from fleet import T0, Node
from support import AGENT_RUNS_FIELDS, Turns, async_wait_until

from anyrtd import apply
from anyrtd import daemon as daemon_module
from anyrtd.client import ServerError, Upsert
from anyrtd.clock import Slice
from anyrtd.records import ACK_SLICE
from anyrtd.sync import FIRST_FULL_AFTER_S, TICK_CHANGES


def cron(expr: str = "*/10 * * * *", **fields: Any) -> dict[str, Any]:
    return {"kind": "cron", "spec": {"cron": expr}, "program": "test:ok@v1", **fields}


async def test_a_pinned_record_is_adopted_within_one_tick(h: Node) -> None:
    await h.put("digest", owner=h.me, **cron())
    await h.tick()
    entry = h.daemon.registry.get("digest")
    assert entry is not None and entry.row.next_fire == T0 + 600


async def test_an_unassigned_record_is_claimed_then_fires_after_confirmation(h: Node) -> None:
    await h.put("floating", owner="", **cron())
    await h.tick()
    assert (await h.record("floating"))["owner"] == ""  # the claim waits in the outbox
    await h.daemon.drain_outbox()
    assert (await h.record("floating"))["owner"] == h.me
    entry = h.daemon.registry.get("floating")
    assert entry is not None and not entry.confirmed and entry.row.next_fire is None
    await h.step(5)  # the next reconcile still shows this device as the owner
    assert entry.confirmed and entry.row.next_fire is not None


async def test_a_foreign_pinned_record_is_left_alone(h: Node) -> None:
    await h.put("theirs", owner="12D3KooWSomeoneElse", **cron())
    await h.step(5)
    assert "theirs" not in h.daemon.registry
    assert (await h.record("theirs"))["owner"] == "12D3KooWSomeoneElse"


async def test_a_repinned_trigger_is_evicted_within_one_tick(h: Node) -> None:
    await h.put("t", owner=h.me, **cron())
    await h.step(1)
    await h.put("t", owner="12D3KooWSomeoneElse")
    await h.step(5)
    assert "t" not in h.daemon.registry
    await h.step(600)
    assert await h.runs("t") == []


async def test_a_reassigned_trigger_is_claimed_again(h: Node) -> None:
    await h.put("t", owner="12D3KooWSomeoneElse", **cron())
    await h.step(1)
    await h.put("t", owner="")
    await h.step(5)
    assert (await h.record("t"))["owner"] == h.me
    assert "t" in h.daemon.registry


async def test_a_pin_written_while_a_claim_is_on_its_way_stands(h: Node) -> None:
    await h.put("t", owner="", **cron())
    await h.tick()  # the claim is queued, not sent yet
    elsewhere = "12D3KooWSomeoneElse"
    await h.put("t", owner=elsewhere)  # the user pins it meanwhile
    result = await h.daemon.drain_outbox()
    assert result is not None and result.lost == [("triggers", "t")] and result.set_aside == 0
    record = await h.record("t")
    assert record["owner"] == elsewhere and "claim" not in record
    await h.step(5)
    assert "t" not in h.daemon.registry
    assert (await h.record("t"))["owner"] == elsewhere
    await h.step(600)
    assert await h.runs("t") == []


async def test_a_claim_lost_to_another_field_write_is_made_again(h: Node) -> None:
    await h.put("t", owner="", **cron())
    await h.tick()
    await h.put("t", name="renamed")  # still unassigned, at a newer version
    result = await h.daemon.drain_outbox()
    assert result is not None and result.lost == [("triggers", "t")]
    await h.step(5)
    await h.step(5)
    assert (await h.record("t"))["owner"] == h.me
    entry = h.daemon.registry.get("t")
    assert entry is not None and entry.confirmed


async def test_a_deleted_trigger_is_evicted_and_its_id_stays_tombstoned(h: Node) -> None:
    await h.put("t", owner=h.me, **cron())
    await h.step(1)
    await h.user.delete(h.triggers, ["t"])
    await h.step(5)
    assert "t" not in h.daemon.registry
    with pytest.raises(ServerError) as err:
        await h.put("t", owner=h.me, **cron())
    assert err.value.code == "tombstoned"
    await h.restart()
    assert "t" not in h.daemon.registry


async def test_a_definition_edit_re_arms_strictly_forward(h: Node) -> None:
    await h.put("t", owner=h.me, **cron("0 9 * * *"))
    await h.step(1)
    entry = h.daemon.registry.get("t")
    assert entry is not None and entry.row.next_fire == T0 + 3600
    await h.put("t", spec={"cron": "*/5 * * * *"})
    await h.step(1)
    entry = h.daemon.registry.get("t")
    assert entry is not None and entry.row.next_fire == T0 + 300


async def test_a_cron_fires_and_writes_a_run_record_and_the_rollup(h: Node) -> None:
    await h.put("t", owner=h.me, **cron())
    await h.step(1)
    started = await h.step(600)
    assert len(started) == 1
    runs = await h.runs("t")
    assert len(runs) == 1
    run = runs[0]
    assert AGENT_RUNS_FIELDS | {"scheduledAt"} <= set(run)
    assert run["status"] == "ok" and run["scheduledAt"] == T0 + 600 and run["device"] == h.me
    assert run["title"] == "fine"
    rec = await h.record("t")
    assert rec["lastStatus"] == "ok" and rec["runCount"] == 1 and rec["lastRunRef"] == run["id"]
    assert rec["consecutiveFailures"] == 0 and rec["lastCostUsd"] == 0.01


async def test_a_cron_after_a_gap_fires_once_not_a_burst(h: Node) -> None:
    await h.put("t", owner=h.me, **cron("* * * * *"))
    await h.step(1)
    started = await h.step(6 * 3600)
    assert len(started) == 1
    entry = h.daemon.registry.get("t")
    assert entry is not None and entry.row.next_fire is not None
    assert entry.row.next_fire > h.clock.now()


async def test_a_once_in_the_past_fires_late_exactly_once(h: Node) -> None:
    await h.put("standup", owner=h.me, kind="once", spec={"at": T0 - 3600}, program="test:ok@v1")
    await h.tick()
    started = await h.daemon.fire_due(h.clock.now())
    await h.settle()
    assert len(started) == 1
    rec = await h.record("standup")
    assert rec["enabled"] is False and rec["lastRunAt"] == T0
    for _ in range(3):
        assert await h.step(3600) == []
    await h.restart()
    assert await h.step(60) == []
    assert len(await h.runs("standup")) == 1


async def test_a_rewritten_once_without_last_run_at_fires_again(h: Node) -> None:
    await h.put("o", owner=h.me, kind="once", spec={"at": T0 + 10}, program="test:ok@v1")
    await h.step(1)
    assert len(await h.step(10)) == 1
    full = await h.record("o")
    fresh = {k: v for k, v in full.items() if not k.startswith("_") and k != "id"}
    fresh.pop("lastRunAt")
    fresh.update(enabled=True, spec={"at": T0 + 100})
    await h.user.replace(h.triggers, "o", fresh)
    await h.step(1)
    assert len(await h.step(100)) == 1


async def test_the_breaker_trips_after_n_failures_and_a_flip_resets_it(h: Node) -> None:
    await h.put(
        "flaky", owner=h.me, **cron("* * * * *", program="test:fail@v1", maxConsecutiveFailures=2)
    )
    await h.step(1)
    await h.step(60)
    rec = await h.record("flaky")
    assert rec["consecutiveFailures"] == 1 and rec["lastStatus"] == "error"
    await h.step(60)
    rec = await h.record("flaky")
    assert rec["enabled"] is False and rec["lastStatus"] == "auto_disabled"
    assert await h.step(600) == []
    await h.put("flaky", enabled=True, program="test:ok@v1")
    await h.step(1)
    entry = h.daemon.registry.get("flaky")
    assert entry is not None and entry.row.consecutive_failures == 0
    assert len(await h.step(60)) == 1
    rec = await h.record("flaky")
    assert rec["lastStatus"] == "ok" and rec["consecutiveFailures"] == 0


async def test_an_enable_flip_after_a_trip_keeps_the_failed_runs_status(h: Node) -> None:
    program = cron("* * * * *", program="test:fail@v1", maxConsecutiveFailures=1)
    await h.put("tripped", owner=h.me, **program)
    await h.step(1)
    await h.step(60)
    rec = await h.record("tripped")
    assert rec["enabled"] is False and rec["lastStatus"] == "auto_disabled"
    await h.put("tripped", enabled=True)
    await h.step(1)
    rec = await h.record("tripped")
    assert rec["enabled"] is True and rec["consecutiveFailures"] == 0
    assert rec["lastStatus"] == "error" and rec["runCount"] == 1  # it ran: not "never ran"


async def test_an_enable_flip_resets_the_breaker_count(h: Node) -> None:
    await h.put("t", owner=h.me, **cron("* * * * *", program="test:fail@v1"))
    await h.step(1)
    await h.step(60)
    await h.put("t", enabled=False)
    await h.step(1)
    await h.put("t", enabled=True)
    await h.step(1)
    rec = await h.record("t")
    assert rec["consecutiveFailures"] == 0


async def test_markers_appear_and_clear_when_fixed(h: Node) -> None:
    await h.put("bad", owner=h.me, **cron("0 0 30 2 *"))
    await h.step(1)
    assert (await h.record("bad"))["lastStatus"] == "invalid_spec"
    await h.put(
        "src",
        owner=h.me,
        kind="event",
        program="test:ok@v1",
        spec={"dataset": "emails", "objectId": "x"},
    )
    await h.step(1)
    assert (await h.record("src"))["lastStatus"] == "unsupported_source"
    await h.put("bad", spec={"cron": "0 0 28 2 *"})
    await h.step(1)
    assert "lastStatus" not in await h.record("bad")
    entry = h.daemon.registry.get("bad")
    assert entry is not None and entry.row.next_fire is not None


async def test_malformed_records_are_skipped_while_good_ones_fire(
    h: Node, caplog: pytest.LogCaptureFixture
) -> None:
    await h.put("broken", owner=h.me, kind="weekly", program="test:ok@v1")
    await h.put("good", owner=h.me, **cron("* * * * *"))
    await h.step(1)
    assert len(await h.step(60)) == 1
    await h.step(60)
    await h.step(60)
    lines = [
        r for r in caplog.records if "malformed" in r.getMessage() and "broken" in r.getMessage()
    ]
    assert len(lines) == 1
    assert "broken" not in h.daemon.registry


async def test_a_user_edit_survives_a_rollup_write(h: Node) -> None:
    await h.put("t", owner=h.me, **cron("* * * * *", args={"text": "old"}))
    await h.step(1)
    h.programs.release.clear()
    h.clock.advance(60)
    await h.tick()
    assert len(await h.daemon.fire_due(h.clock.now())) == 1
    await h.put("t", args={"text": "new"}, name="renamed")  # the user edits mid-run
    h.programs.release.set()
    await h.settle()
    rec = await h.record("t")
    assert rec["args"] == {"text": "new"} and rec["name"] == "renamed"
    assert rec["lastStatus"] == "ok" and rec["runCount"] == 1


async def test_a_standing_built_in_record_is_ignored(h: Node) -> None:
    await h.put("rollup", owner="", **cron())
    await h.step(5)
    entry = h.daemon.registry.get("rollup")  # the code-owned built-in, not the record
    assert entry is None or entry.defn.program != "test:ok@v1"


async def test_an_overlapping_occurrence_is_skipped(h: Node) -> None:
    await h.put("slow", owner=h.me, **cron("* * * * *"))
    await h.step(1)
    h.programs.release.clear()
    h.clock.advance(60)
    assert len(await h.daemon.fire_due(h.clock.now())) == 1
    h.clock.advance(60)
    assert await h.daemon.fire_due(h.clock.now()) == []
    assert h.daemon.stats.overlap_skips == 1
    h.programs.release.set()
    await h.settle()
    assert len(await h.runs("slow")) == 1


async def test_a_restart_comes_back_from_the_mirror_alone(h_process: Node, devserver: Any) -> None:
    h = h_process
    await h.put("t", owner=h.me, **cron("*/10 * * * *"))
    await h.step(1)
    await h.daemon.stop()
    devserver.stop()
    h.daemon = h.make_daemon()
    await h.daemon.open()
    await h.tick()  # the server is away
    entry = h.daemon.registry.get("t")
    assert entry is not None and entry.row.next_fire == T0 + 600
    h.clock.advance(600)
    assert len(await h.daemon.fire_due(h.clock.now())) == 1
    async with asyncio.timeout(10):
        await h.daemon.wait_idle()
    devserver.restart()
    await h.repoint(devserver.url)
    await h.daemon.drain_outbox()
    assert [r["status"] for r in await h.runs("t")] == ["ok"]


async def test_a_restart_takes_what_changed_while_it_was_down_from_the_feed(h: Node) -> None:
    """A mirror that follows the feed resumes it at start: what changed meanwhile is
    adopted, refreshed and evicted at the first tick, and the full read of every record
    (the safety net) comes `FIRST_FULL_AFTER_S` later, not before readiness."""
    for rid in ("kept", "edited", "gone", "repinned"):
        await h.put(rid, owner=h.me, **cron("0 9 * * *"))
    await h.step(1)
    triggers = h.triggers
    await h.stop()
    await h.put("edited", spec={"cron": "*/5 * * * *"})
    await h.user.delete(triggers, ["gone"])
    await h.put("repinned", owner="12D3KooWSomeoneElse")
    await h.put("new", owner=h.me, **cron("*/10 * * * *"))
    h.daemon = h.make_daemon()
    full_reads: list[object] = []
    query_all = h.daemon.client.query_all

    async def counted(dataset: Any, *args: Any, **kwargs: Any) -> Any:
        if dataset == triggers:
            full_reads.append(dataset)
        return await query_all(dataset, *args, **kwargs)

    h.daemon.client.query_all = counted  # type: ignore[method-assign]
    await h.boot()
    assert full_reads == []
    registry = h.daemon.registry
    mine = {"kept", "edited", "gone", "repinned", "new"}
    assert mine & set(registry.entries) == {"edited", "kept", "new"}
    edited, new = registry.get("edited"), registry.get("new")
    assert edited is not None and edited.row.next_fire == T0 + 300  # the edit
    assert new is not None and new.row.next_fire is not None
    await h.step(FIRST_FULL_AFTER_S - 10)
    assert full_reads == []
    await h.step(10)
    assert len(full_reads) == 1
    assert mine & set(registry.entries) == {"edited", "kept", "new"}


async def test_a_server_outage_loses_no_run_record_and_writes_none_twice(
    h_process: Node, devserver: Any
) -> None:
    h = h_process
    await h.put("t", owner=h.me, **cron("* * * * *"))
    await h.step(1)
    devserver.stop()
    for _ in range(5):
        h.clock.advance(60)
        await h.tick()
        assert len(await h.daemon.fire_due(h.clock.now())) == 1
        async with asyncio.timeout(10):
            await h.daemon.wait_idle()
        await h.daemon.drain_outbox()
    assert h.daemon.db is not None
    waiting = await h.daemon.db.call(lambda m: [i.dataset for i in m.outbox_pending()])
    assert waiting == ["runs", "triggers"] * 5  # each run's record and its rollup, kept
    devserver.restart()
    await h.repoint(devserver.url)
    await h.daemon.drain_outbox()
    await h.daemon.drain_outbox()
    runs = await h.runs("t")
    assert len(runs) == 5 and len({r["runId"] for r in runs}) == 5
    assert all(r["_v"] == 1 for r in runs)  # each record written once
    rec = await h.record("t")
    assert rec["runCount"] == 5


async def test_a_consumed_once_whose_run_never_finished_does_not_fire_again(
    h: Node,
) -> None:
    await h.put("o", owner=h.me, kind="once", spec={"at": T0 + 10}, program="test:ok@v1")
    await h.step(1)
    h.programs.release.clear()
    h.clock.advance(10)
    assert len(await h.daemon.fire_due(h.clock.now())) == 1

    async def program_started() -> bool:
        return len(h.programs.calls) == 1

    await async_wait_until(program_started, what="the program to start")
    # Simulate a crash: drop the daemon without letting the run finish or the mirror close
    # (once each run's task has begun following its program, so cancelling it stops both).
    await asyncio.sleep(0)
    for task in list(h.daemon.firing.in_flight):
        task.cancel()
    assert h.daemon.db is not None
    await h.daemon.db.close()
    h.daemon.unit.db = None
    await h.daemon.client.aclose()  # a dead process's sockets die with it
    h.programs.release.set()
    h.daemon = h.make_daemon()
    await h.daemon.open()
    await h.tick()
    await h.daemon.drain_outbox()
    assert await h.step(60) == []
    runs = await h.runs("o")
    assert [r["status"] for r in runs] == ["interrupted"]
    assert len(h.programs.calls) == 1


async def test_a_full_read_of_many_changed_records_leaves_the_loop_free_between_its_slices(
    h: Node,
) -> None:
    """The tick loop applies a full read a slice of `TICK_CHANGES` at a time, and other
    tasks (the timer, the control API) have their turn between the slices."""
    count = 3 * TICK_CHANGES + 10
    upserts = [Upsert(id=f"t{n:03d}", fields={"owner": h.me, **cron()}) for n in range(count)]
    await h.user.upsert(h.triggers, upserts)
    daemon = h.daemon
    daemon.sync_stage._last_full = None  # as at a start without a cursor: every record
    assert await daemon.sync() == 1  # the full read, buffered
    slices: list[tuple[int, int]] = []  # the other task's turns, and the entries, at each slice
    apply_buffered = daemon.sync_stage.apply_buffered
    async with Turns() as turns:

        def counted(changes: int | None = None, within: Slice | None = None) -> set[str]:
            slices.append((turns.n, len(daemon.registry)))
            return apply_buffered(changes, within)

        daemon.sync_stage.apply_buffered = counted  # type: ignore[method-assign]
        daemon._wake.set()
        ticking = asyncio.create_task(daemon._loop(daemon._tick_loop))
        try:
            await async_wait_until(
                lambda: asyncio.sleep(0, len(daemon.registry) >= count),
                what="every record adopted",
            )
        finally:
            ticking.cancel()
            await asyncio.gather(ticking, return_exceptions=True)
    applying = [turn for turn, entries in slices if entries < count]
    assert len(applying) >= count // TICK_CHANGES + 1  # in slices, not in one piece
    assert all(a < b for a, b in itertools.pairwise(applying))  # the loop free between them


async def test_a_drain_of_many_trigger_writes_takes_their_acks_with_the_loop_free_between(
    h: Node,
) -> None:
    """A drain's rounds can take thousands of owner stamps and markers; their
    acknowledgements (each may parse its record again) are taken `ACK_SLICE` at a time,
    and other tasks have their turn between the slices."""
    count = 2 * ACK_SLICE + 10
    await h.user.upsert(h.triggers, [Upsert(id=f"t{n:03d}", fields=cron()) for n in range(count)])
    await h.tick()  # every record claimed: the owner stamps wait in the outbox
    at_ack: list[int] = []
    acked = h.daemon.records.acked
    async with Turns() as turns:

        def counted(rid: str, version: int | None) -> None:
            at_ack.append(turns.n)
            acked(rid, version)

        h.daemon.records.acked = counted  # type: ignore[method-assign]
        result = await h.daemon.drain_outbox()
    assert result is not None and result.sent >= count and len(at_ack) >= count
    slices = [at_ack[n] for n in range(0, len(at_ack), ACK_SLICE)]
    assert len(slices) >= 3 and all(a < b for a, b in itertools.pairwise(slices))


async def test_a_drain_takes_one_ack_a_turn_once_each_slice_of_the_loop_is_spent(
    h: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acknowledgement of a record of megabytes parses it again for milliseconds: the
    slice of the loop's time ends a run of acknowledgements before `ACK_SLICE` does."""
    await h.user.upsert(h.triggers, [Upsert(id=f"t{n}", fields=cron()) for n in range(5)])
    await h.tick()  # every record claimed: the owner stamps wait in the outbox
    at_ack: list[int] = []
    acked = h.daemon.records.acked
    monkeypatch.setattr(daemon_module, "Slice", lambda: Slice(0.0))  # spent at once
    async with Turns() as turns:

        def counted(rid: str, version: int | None) -> None:
            at_ack.append(turns.n)
            acked(rid, version)

        h.daemon.records.acked = counted  # type: ignore[method-assign]
        await h.daemon.drain_outbox()
    assert len(at_ack) >= 5 and all(a < b for a, b in itertools.pairwise(at_ack))


async def test_many_claims_come_back_and_are_confirmed_a_slice_per_tick(
    h: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many claims come back at once, a tick reconciles a bounded number of ids
    (`CONFIRM_SLICE` of what changed, as many waiting claims, and a spread's slice),
    and the next tick follows at once."""
    monkeypatch.setattr(apply, "CONFIRM_SLICE", 5)
    monkeypatch.setattr(apply, "SPREAD_SLICE", 10)
    await h.user.upsert(h.triggers, [Upsert(id=f"t{n:02d}", fields=cron()) for n in range(40)])
    sizes: list[int] = []
    reconcile = h.daemon.apply.reconcile

    def counted(ids: Any, now: float, verdict: str, peer_id: str) -> None:
        sizes.append(len(ids))
        reconcile(ids, now, verdict, peer_id)

    h.daemon.apply.reconcile = counted  # type: ignore[method-assign]
    await h.tick()  # every record claimed, over the ticks: the stamps wait in the outbox
    while h.daemon.apply.spreading:
        await h.tick()
    assert len(h.daemon.apply.unconfirmed) >= 40
    await h.daemon.drain_outbox()  # every stamp back at once
    h.clock.advance(5)  # past the confirmation time
    await h.tick()
    assert h.daemon.apply.spreading  # more claims ready than a tick takes
    while h.daemon.apply.spreading:  # as the tick loop does, at once
        await h.tick()
    assert not h.daemon.apply.unconfirmed
    assert all(e.confirmed for e in h.daemon.registry.entries.values() if e.id.startswith("t"))
    assert sizes and max(sizes) <= 5 + 5 + 10


async def test_a_step_reconciles_chunks_till_its_slice_ends_and_leaves_the_rest_to_the_next(
    h: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk of `STEP_CHUNK` ids at least, then chunks while the step's slice of the loop's
    time lasts: records of megabytes cost milliseconds each, a count alone does not bound
    the step. What is left joins the spread reconcile, and the next tick follows at once."""
    monkeypatch.setattr(apply, "STEP_CHUNK", 3)
    upserts = [Upsert(id=f"t{n:02d}", fields={"owner": h.me, **cron()}) for n in range(10)]
    await h.user.upsert(h.triggers, upserts)
    daemon = h.daemon
    await daemon.sync()
    changed = {rid for rid in daemon.sync_stage.apply_buffered() if rid.startswith("t")}
    assert len(changed) == 10
    verdict, peer = daemon.gate.verdict, daemon.peer_id
    assert peer is not None
    done = daemon.apply.step(changed, h.clock.now(), verdict, peer, Slice(0.0))
    ours = {tid for tid in daemon.registry.entries if tid.startswith("t")}
    assert len(done) == 3 and ours == {rid for rid in done if rid.startswith("t")}
    assert daemon.apply.spreading  # the rest: the next tick, at once
    while daemon.apply.spreading:
        await h.tick()
    ours = {tid for tid in daemon.registry.entries if tid.startswith("t")}
    assert sorted(ours) == [f"t{n:02d}" for n in range(10)]


async def test_a_step_sizes_its_chunks_by_what_an_id_was_measured_to_cost(h: Node) -> None:
    """Ids that cost more (records of megabytes: 16-37 ms a hundred) come in smaller
    chunks, about `CHUNK_S` each at the measured cost of an id, so that a step overruns its
    slice of the loop by that much at most; the measure follows what the chunks cost."""
    upserts = [Upsert(id=f"t{n:02d}", fields={"owner": h.me, **cron()}) for n in range(10)]
    await h.user.upsert(h.triggers, upserts)
    daemon = h.daemon
    await daemon.sync()
    changed = {rid for rid in daemon.sync_stage.apply_buffered() if rid.startswith("t")}
    verdict, peer = daemon.gate.verdict, daemon.peer_id
    assert peer is not None
    daemon.apply.per_id_s = apply.CHUNK_S / 4  # as if the last chunks cost that: four ids
    done = daemon.apply.step(changed, h.clock.now(), verdict, peer, Slice(0.0))
    assert len(done) == 4 and daemon.apply.spreading
    assert daemon.apply.per_id_s < apply.CHUNK_S / 4  # ordinary ids cost far less
