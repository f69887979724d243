"""kill -9 of `anyrtd serve` at random moments, over and over, with cron, `once` and command
triggers due all the while.

Each round starts the daemon on the same state directory and SIGKILLs it at a random moment
of its life (while importing, opening the mirror, ticking, firing, mid-run), then runs
`PRAGMA integrity_check` on the mirror it left. The programs are commands that note their
run id when they start; one of them ignores SIGTERM and leaves a grandchild, so a kill
strands a process group for the next start to stop. At the end one daemon runs until every
`once` has fired and every started run has its record, and the promises are counted:

- no `(triggerId, scheduledAt)` recorded twice, no `once` run twice or never;
- every run a program noted has an `agent_runs` record on the server;
- every mirror passed `PRAGMA integrity_check`;
- no process of a run the kill interrupted is left once a daemon has started again.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

from bench.faults.common import (
    Result,
    Serve,
    Server,
    Space,
    alive,
    cron,
    duplicates,
    every,
    family_run,
    integrity,
    marker_program,
    once,
    quiesce,
    tagged,
    within,
)

ROUNDS = 500
QUICK = 20
MARK = "faults:mark@v1"
LINGER = "faults:linger@v1"
ONCES_PER_ROUND = 2
RECURRING = {
    "every1": every(1, MARK),
    "cron1": cron("* * * * * *", MARK),
    "linger3": every(3, LINGER),
}
KILL_WITHIN_S = (0.2, 4.0)
OPENED = " opened: "  # the daemon's log line once it has closed what a crash left running


def run(work: Path, rounds: int, seed: int = 15) -> Result:
    result = Result("kill9")
    rng = random.Random(seed)
    tag = f"kill9-{work.name}-{time.time_ns()}"
    started = work / "started"
    server = Server(work).start()
    serve = Serve(
        work,
        server.url,
        programs={
            MARK: marker_program(started, "sleep 0.2"),
            # ignores SIGTERM and leaves a grandchild in its group: only SIGKILL ends it
            LINGER: marker_program(started, "trap '' TERM", "sleep 30 & sleep 2", "wait"),
        },
        tick=0.5,
        env={"ANYRTD_FAULTS_TAG": tag},
    )
    space = Space(server.url)
    onces: list[str] = []
    stranded: set[tuple[int, str]] = set()  # every process a kill left running
    pending: set[tuple[int, str]] = set()  # those no start has got past opening since
    leftovers: set[tuple[int, str]] = set()
    bad_integrity: list[str] = []
    exits: Counter[str] = Counter()
    with family_run(result, serve, server, tag):
        space.put(RECURRING)
        for n in range(rounds):
            now = time.time()
            batch = {
                f"once-{n:04d}-{k}": once(now + rng.uniform(0.0, 4.0), MARK)
                for k in range(ONCES_PER_ROUND)
            }
            space.put(batch)
            onces += batch
            proc = serve.spawn()
            offset = serve.log.stat().st_size if serve.log.exists() else 0
            deadline = time.monotonic() + rng.uniform(*KILL_WITHIN_S)
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.01)
            opened = OPENED in serve.log_text()[offset:]
            if proc.poll() is not None:
                exits[f"exited {proc.returncode} by itself"] += 1
                serve.proc = None
            else:
                serve.kill9()
                exits["killed"] += 1
            if opened:  # that start closed the interrupted runs: their processes are gone
                within(lambda p=pending: not alive(p), 2)
                leftovers |= alive(pending)
                pending = set()
            left = tagged(tag) - leftovers  # what the killed daemon's runs left running
            stranded |= left
            pending |= left
            verdict = integrity(serve.mirror)
            if verdict != "ok":
                bad_integrity.append(f"round {n}: {verdict}")
        # The last start: every once fires, every started run gets its record.
        serve.start()
        within(lambda: not alive(pending), 10)
        leftovers |= alive(pending)

        runs, noted, missing = quiesce(serve, space, RECURRING, started, onces)
        if missing:
            result.notes.append(missing)
        serve.stop()
        verdict = integrity(serve.mirror)
        if verdict != "ok":
            bad_integrity.append(f"after the last stop: {verdict}")
    if result.error is not None:
        return result

    per_once = Counter(r.get("triggerId") for r in runs if r.get("triggerId") in set(onces))
    recorded = {r.get("runId") for r in runs}
    statuses = Counter(str(r.get("status")) for r in runs)
    result.zero("duplicate (triggerId, scheduledAt)", duplicates(runs))
    result.zero("once fired twice", sum(1 for rid in onces if per_once[rid] > 1))
    result.zero("once never fired", sum(1 for rid in onces if per_once[rid] == 0))
    ran = Counter(trigger for trigger, _ in noted.values())
    result.zero("once whose program never started", sum(1 for rid in onces if ran[rid] == 0))
    result.zero("runs without a record", len(set(noted) - recorded))
    result.zero("integrity_check not ok", len(bad_integrity))
    result.zero("processes of interrupted runs left", len(leftovers))
    result.figures.update(
        kills=exits["killed"],
        exits=dict(exits),
        onces=len(onces),
        runs_started=len(noted),
        runs_recorded=len(runs),
        statuses=dict(statuses),
        recorded_never_started=len(recorded - set(noted)),
        stranded_processes=len(stranded),
    )
    result.notes += bad_integrity[:5]
    return result
