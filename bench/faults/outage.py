"""The server away, and the daemon restarted (SIGTERM and kill -9 alternately) while it is.

Before each outage, `once` records are written due inside it; an every-second trigger, a
seconds cron and a two-second command keep coming due throughout. The devserver comes back
on the same port, and the promises are counted once everything has drained: every run a
program noted has its record on the server (0 lost), no occurrence was recorded twice, and
every `once` ran exactly once.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from bench.faults.common import (
    Result,
    Serve,
    Server,
    Space,
    cron,
    duplicates,
    every,
    family_run,
    free_port,
    marker_program,
    once,
    quiesce,
    started_runs,
    wait_for,
)

ROUNDS = 4
QUICK = 1
RESTARTS = 3
MARK = "faults:mark@v1"
SLOW = "faults:slow@v1"
RECURRING = {
    "every1": every(1, MARK),
    "cron1": cron("* * * * * *", MARK),
    "slow3": every(3, SLOW),
}


def run(work: Path, rounds: int, outage_s: float | None = None) -> Result:
    result = Result("outage")
    length = outage_s if outage_s is not None else (20.0 if rounds > 2 else 9.0)
    tag = f"outage-{time.time_ns()}"
    started = work / "started"
    server = Server(work, port=free_port()).start()
    serve = Serve(
        work,
        server.url,
        programs={
            MARK: marker_program(started),
            SLOW: marker_program(started, "sleep 2"),
        },
        env={"ANYRTD_FAULTS_TAG": tag},
    )
    space = Space(server.url)
    onces: list[str] = []
    restarts: Counter[str] = Counter()
    down_s = 0.0
    with family_run(result, serve, server, tag):
        space.put(RECURRING)
        serve.start()
        wait_for(lambda: len(started_runs(started)) >= 3, 30, "the first runs")
        for n in range(rounds):
            now = time.time()
            batch = {f"once-{n}-{k}": once(now + 1.0 + k * (length / 6), MARK) for k in range(8)}
            space.put(batch)
            onces += batch
            wait_for(
                lambda last=f"once-{n}-7": (
                    serve.get(f"/triggers/{last}").get("state") not in (None, "claiming")
                ),
                30,
                "the onces to reach the daemon",
            )
            server.stop()
            went = time.monotonic()
            for k in range(RESTARTS):
                time.sleep(length / (RESTARTS + 1))  # the outage itself: time passing
                if k % 2:
                    serve.kill9()
                    restarts["kill -9"] += 1
                else:
                    serve.stop()
                    restarts["SIGTERM"] += 1
                serve.start()
            time.sleep(max(0.0, went + length - time.monotonic()))
            down_s += time.monotonic() - went
            server.start()
        runs, noted, missing = quiesce(serve, space, RECURRING, started, onces)
        if missing:
            result.notes.append(missing)
        serve.stop()
    if result.error is not None:
        return result

    per_once = Counter(r.get("triggerId") for r in runs)
    result.zero("runs lost (no record)", len(set(noted) - {r.get("runId") for r in runs}))
    result.zero("duplicate (triggerId, scheduledAt)", duplicates(runs))
    result.zero("once fired twice", sum(1 for rid in onces if per_once[rid] > 1))
    result.zero("once never fired", sum(1 for rid in onces if per_once[rid] == 0))
    result.figures.update(
        outages=rounds,
        seconds_down=round(down_s, 1),
        restarts_inside=dict(restarts),
        runs_started=len(noted),
        runs_recorded=len(runs),
        statuses=dict(Counter(str(r.get("status")) for r in runs)),
        error_types=dict(Counter(str(r.get("errorType")) for r in runs if r.get("errorType"))),
    )
    return result
