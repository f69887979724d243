"""Three daemons, replication slower than a tick, a partition and three role moves: every
unassigned `once` runs exactly once in total (issue 16's fence, under issue 15's suite).

The cluster and the scenario are bench/bench_fence.py's (three `anyrtd serve` on a
replicated devserver; `once` records written across the replicas while the active role
moves and its holder is cut off); this family runs it at each replication delay and counts
what every device's replica shows afterwards.
"""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

from bench.bench_fence import Cluster, scenario
from bench.faults.common import Result

ROUNDS = 270  # unassigned onces in all, shared by the delays
QUICK = 30
DELAYS = (0.5, 2.0, 5.0)
QUICK_DELAYS = (1.0,)
TICK = 1.0
POLL = 1.0


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
