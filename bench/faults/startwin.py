"""kill -9 of `anyrtd serve` inside the start window: the few milliseconds after a batch of
`once` comes due, and as its programs end.

Each round writes a batch of `BATCH` `once` due 1.5 s ahead (the daemon is up and ticking
by then), kills the daemon at a random moment from 0 to 40 ms after their due time (the
start window) or, every other round, around the programs' end (they run 0.3 s), and
starts it again on the same state directory. The programs are commands that note their run
id when they start and their exit status and end time just before they exit, so what ran
and how it ended is the program's own word. Promised:

- no `once` never run, none run twice;
- every run a program noted as ended is recorded with that status, its end within 50 ms
  of the time the program noted (the supervisor's end mark, to the file system's tick).
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
    family_run,
    once,
    settle,
    started_runs,
    wait_for,
)

ROUNDS = 300
QUICK = 20
UNIT = "rounds"
BATCH = 8
END = "faults:end@v1"
RUN_S = 0.3
AHEAD_S = 1.5
OPENED = " opened: "


def run(work: Path, rounds: int, seed: int = 36) -> Result:
    result = Result("startwin")
    rng = random.Random(seed)
    tag = f"startwin-{work.name}-{time.time_ns()}"
    started, ended = work / "started", work / "ended"
    server = Server(work).start()
    end_note = f'echo "$ANYRTD_RUN_ID 3 $(date +%s.%N)" >> {ended}'
    serve = Serve(
        work,
        server.url,
        programs={
            END: [
                "/bin/sh",
                "-c",
                f'echo "$ANYRTD_RUN_ID $ANYRTD_TRIGGER_ID $ANYRTD_SCHEDULED_AT" >> {started}\n'
                f"sleep {RUN_S}\n{end_note}\nexit 3",
            ]
        },
        tick=0.5,
        env={"ANYRTD_FAULTS_TAG": tag},
    )
    space = Space(server.url)
    onces: list[str] = []
    kills: Counter[str] = Counter()
    with family_run(result, serve, server, tag):
        for n in range(rounds):
            proc = serve.spawn()
            offset = serve.log.stat().st_size if serve.log.exists() else 0
            wait_for(lambda o=offset: OPENED in serve.log_text()[o:], 60, "the daemon to open")
            due = time.time() + AHEAD_S
            batch = {f"once-{n:04d}-{k}": once(due, END) for k in range(BATCH)}
            space.put(batch)
            onces += batch
            at_end = n % 2 == 1
            kill_at = due + (RUN_S + rng.uniform(-0.02, 0.03) if at_end else rng.uniform(0, 0.04))
            while time.time() < kill_at and proc.poll() is None:
                time.sleep(0.001)
            if proc.poll() is None:
                serve.kill9()
                kills["at the programs' end" if at_end else "in the start window"] += 1
            else:
                serve.proc = None
        serve.start()
        runs, missing = settle(space, started, onces, 120.0)
        if missing:
            result.notes.append(missing)
        serve.stop()
    if result.error is not None:
        return result
    noted = started_runs(started)
    ran = Counter(trigger for trigger, _ in noted.values())
    ends = {}
    if ended.exists():
        for line in ended.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                ends[parts[0]] = (int(parts[1]), float(parts[2]))
    by_run = {r.get("runId"): r for r in runs}
    wrong = 0
    for run_id, (_, at) in ends.items():
        record = by_run.get(run_id)
        if (
            record is None
            or record.get("status") != "FAILED"
            or record.get("errorType") != "ExitCode"
            or abs(float(record.get("endedAt") or 0) - at) > 0.05
        ):
            wrong += 1
    result.zero("once never run", sum(1 for rid in onces if ran[rid] == 0))
    result.zero("once run twice", sum(1 for rid in onces if ran[rid] > 1))
    result.zero("ended runs not recorded as they ended", wrong)
    result.figures.update(
        kills=dict(kills),
        onces=len(onces),
        runs_started=len(noted),
        runs_ended_by_their_own_word=len(ends),
        statuses=dict(Counter(str(r.get("status")) for r in runs)),
    )
    return result
