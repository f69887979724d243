"""Three daemons, replication slower than a tick, a partition and three role moves: every
unassigned `once` runs exactly once in total (issue 16's fence, under issue 15's suite).

The cluster and the scenario are bench/bench_fence.py's (three `anyrtd serve` on a
replicated devserver; `once` records written across the replicas while the active role
moves and its holder is cut off); this family runs it at each replication delay and counts
what every device's replica shows afterwards. A second scenario stops the holder
(SIGSTOP: its registry row stays, it sends no stand-down beat), moves the role away from it
and writes unassigned `once` records: they wait for the new holder's takeover hold, which
ends once no stopped device can still believe it holds the role (its lease, a tick and
the lag), not at `takeover_hold_s`; the holder then resumes, and every `once` has still run
once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from anyrtd.client import ServerClient, Upsert
from anyrtd.places import resolve_places
from bench.bench_fence import (
    PROGRAM,
    Cluster,
    activate,
    admin,
    registry,
    scenario,
    wait_for,
)
from bench.faults.common import Result

ROUNDS = 270  # unassigned onces in all, shared by the delays
QUICK = 30
DELAYS = (0.5, 2.0, 5.0)
QUICK_DELAYS = (1.0,)
TICK = 1.0
POLL = 1.0
STOPPED_ONCES = 6
"""Unassigned `once` records written while the stopped holder's successor holds its claims."""


async def stopped_holder(cluster: Cluster, count: int) -> dict[str, Any]:
    """Stop the holder, move the role away, write `count` unassigned onces due now; return
    how long they waited and whether any ran twice once the holder resumed."""
    urls, peers = cluster.urls, cluster.peers

    async def winner() -> int | None:
        view = await registry(urls[0])
        rows = [d for d in view["devices"] if "bao" in d.get("apps", {})]
        active = view.get("active", {}).get("bao")
        return peers.index(active) if len(rows) == 3 and active in peers else None

    [held] = await wait_for(lambda: _some(winner()), 60, "three registered devices and a winner")
    await asyncio.sleep(3 * cluster.tick + cluster.delay)  # its takeover settles
    stopped = cluster.daemons[held]
    os.kill(stopped.pid, signal.SIGSTOP)
    clients = [ServerClient(u) for u in urls]
    try:
        places = [await resolve_places(c, "bao") for c in clients]
        target = (held + 1) % 3
        moved = time.time()
        await activate(urls[target])
        ids = []
        for k in range(count):
            rid = f"stopped-{k:02d}"
            fields = {"name": rid, "kind": "once", "spec": {"at": time.time()}}
            fields |= {"program": PROGRAM, "owner": ""}
            replica = (held + 1 + k) % 3
            await clients[replica].upsert(places[replica].triggers, [Upsert(rid, fields)])
            ids.append(rid)
            await asyncio.sleep(0.2)

        async def runs() -> list[dict[str, Any]]:
            out: dict[str, dict[str, Any]] = {}
            for client, place in zip(clients, places, strict=True):
                for run in await client.query_all(place.runs):
                    if str(run.get("triggerId", "")).startswith("stopped-"):
                        out[str(run.get("runId") or run.get("id"))] = run
            return list(out.values())

        async def all_fired() -> bool:
            fired = {r.get("triggerId") for r in await runs()}
            return all(rid in fired for rid in ids)

        await wait_for(all_fired, 120 + 4 * cluster.delay, "every once to fire")
        fired = await runs()
        waits = sorted(float(r["startedAt"]) - float(r["scheduledAt"]) for r in fired)
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    # The holder resumes: time for a late claim of its own to surface, then everything.
    await asyncio.sleep(4 * cluster.delay + 3 * cluster.tick + 3 * cluster.poll)
    await admin(urls[0], "sync")
    await asyncio.sleep(2 * cluster.tick)
    per = Counter(r.get("triggerId") for r in await runs())
    for c in clients:
        await c.aclose()
    return {
        "delay_s": cluster.delay,
        "onces": count,
        "fired_twice": sum(1 for rid in ids if per[rid] > 1),
        "never_fired": sum(1 for rid in ids if per[rid] == 0),
        "once_wait_p50_s": round(waits[len(waits) // 2], 2),
        "once_wait_max_s": round(waits[-1], 2),
        "first_fire_after_move_s": round(min(float(r["startedAt"]) for r in fired) - moved, 2),
    }


async def _some(value: Any) -> Any:
    got = await value
    return None if got is None else (got,)


def run(work: Path, rounds: int) -> Result:
    result = Result("fleet")
    delays = QUICK_DELAYS if rounds <= QUICK else DELAYS
    per = max(6, rounds // len(delays))
    twice = never = cron_twice = cron_missed = 0
    scenarios = []
    for delay in delays:
        tmp = work / f"delay-{delay:g}"
        tmp.mkdir(parents=True, exist_ok=True)
        cluster = Cluster(tmp, delay, TICK, POLL)
        try:
            with warnings.catch_warnings():
                # Cluster.start hands its log files to the processes and drops its own copies
                warnings.simplefilter("ignore", ResourceWarning)
                cluster.start()
            # the onces are written over a window of 0.4 s each, as bench_fence does at 90/36 s
            outcome = asyncio.run(scenario(cluster, per, max(12.0, per * 0.4), "records"))
        except SystemExit as exc:  # bench_fence's way of saying a wait timed out
            result.error = f"delay {delay:g} s: {exc}"
            break
        finally:
            cluster.stop()
            if cluster.server is not None and cluster.server.stdout is not None:
                cluster.server.stdout.close()  # Cluster.stop leaves the pipe it read to the GC
        scenarios.append(outcome)
        twice += outcome["fired_twice"]
        never += outcome["never_fired"]
        cron_twice += outcome["cron_fired_twice"]
        cron_missed += outcome["cron_missed"]
    stopped: dict[str, Any] | None = None
    if result.error is None:
        tmp = work / "stopped-holder"
        tmp.mkdir(parents=True, exist_ok=True)
        cluster = Cluster(tmp, delays[0], TICK, POLL)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                cluster.start()
            stopped = asyncio.run(stopped_holder(cluster, STOPPED_ONCES))
        except SystemExit as exc:
            result.error = f"stopped holder: {exc}"
        finally:
            cluster.stop()
            if cluster.server is not None and cluster.server.stdout is not None:
                cluster.server.stdout.close()
    if stopped is not None:
        twice += stopped["fired_twice"]
        never += stopped["never_fired"]
        result.figures["stopped_holder"] = stopped
    result.zero("once fired twice (all devices)", twice)
    result.zero("once never fired", never)
    result.zero("pinned cron occurrence fired twice", cron_twice)
    result.figures.update(
        onces=per * len(scenarios),
        delays_s=list(delays),
        pinned_cron_occurrences_missed=cron_missed,
        scenarios=scenarios,
    )
    return result
