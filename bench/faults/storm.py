"""A misbehaving server: a 429 storm, then answers that are not the server's JSON.

`anyrtd serve` talks to a real devserver through a small proxy (bench/faults/proxy.py). Each
round, `once` records pinned to the daemon come due inside a storm of `429 Too Many
Requests` (`Retry-After: 5`) on every request, while an every-second trigger keeps firing;
then the proxy answers 200 with an HTML maintenance page, passes a moment, and answers 200
with truncated bodies, while an `agent:remind@v1` trigger (whose program asks the server
for the chat) fires every second. Counted once everything has drained: every run a program
noted has its record on the server, nothing is set aside, every `once` ran once and the
server holds it consumed (so a repin elsewhere would not run it again); no trigger is
auto-disabled for the server's bad answers, their runs are not blamed on the program, the
log says so once a condition (with the status and the body's first bytes) and never with a
loop's traceback, and `/healthz` says degraded while it lasts.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.faults.common import (
    Result,
    Serve,
    Server,
    Space,
    duplicates,
    every,
    family_run,
    marker_program,
    once,
    quiesce,
    started_runs,
    wait_for,
)
from bench.faults.proxy import HTML, PASS, THROTTLE, TRUNCATED, FaultProxy

ROUNDS = 3
QUICK = 1
ONCES = 3
MARK = "faults:mark@v1"
REMIND = "agent:remind@v1"
RECURRING = {
    "every1": every(1, MARK),
    "remind1": every(1, REMIND, args={"text": "still here"}),
}
BAD_ANSWER = re.compile(r"anyrtd\.client.*answered 200 with .*\(first bytes b'")
TRACEBACK = "failed; retrying"


def run(work: Path, rounds: int, storm_s: float | None = None) -> Result:
    result = Result("storm")
    length = storm_s if storm_s is not None else (15.0 if rounds > 1 else 8.0)
    tag = f"storm-{time.time_ns()}"
    started = work / "started"
    server = Server(work).start()
    proxy = FaultProxy(server.url, retry_after="5").start()
    serve = Serve(
        work, proxy.url, programs={MARK: marker_program(started)}, env={"ANYRTD_FAULTS_TAG": tag}
    )
    space = Space(server.url)
    onces: list[str] = []
    degraded: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    with family_run(result, serve, server, tag, last=proxy.stop):
        space.put(RECURRING)
        serve.start()
        peer = wait_for(lambda: serve.get("/healthz").get("peerId"), 30, "the daemon's peer id")
        wait_for(lambda: len(started_runs(started)) >= 2, 30, "the first runs")
        for n in range(rounds):
            now = time.time()
            batch = {
                f"storm-{n}-{k}": {**once(now + 2.0 + k * length / ONCES, MARK), "owner": peer}
                for k in range(ONCES)
            }
            space.put(batch)
            onces += batch
            wait_for(
                lambda ids=list(batch): all(
                    serve.get(f"/triggers/{rid}").get("state") not in (None, "claiming")
                    for rid in ids
                ),
                30,
                "the pinned onces to reach the daemon",
            )
            for mode, seconds in ((THROTTLE, length), (HTML, length / 2), (TRUNCATED, length / 2)):
                proxy.mode = mode
                phases[mode] += 1
                if _degraded_within(serve, seconds):
                    degraded[mode] += 1
                proxy.mode = PASS
                wait_for(
                    lambda: serve.get("/healthz").get("status") == "ok", 60, "a sound /healthz"
                )
        runs, noted, missing = quiesce(serve, space, RECURRING, started, onces)
        if missing:
            result.notes.append(missing)
        aside = _set_aside(serve.get_text("/metrics"))
        states = {rid: serve.get(f"/triggers/{rid}").get("state") for rid in RECURRING}
        held = {r.get("id"): r for r in space.triggers()}
        serve.stop()
    if result.error is not None:
        return result

    log = serve.log_text()
    per_once = Counter(r.get("triggerId") for r in runs)
    reminds = [r for r in runs if r.get("triggerId") == "remind1"]
    blamed = [
        r for r in reminds if r.get("status") != "ok" and r.get("errorType") != "ServerUnavailable"
    ]
    bad_lines = len(BAD_ANSWER.findall(log))
    result.zero("runs lost (no record)", len(set(noted) - {r.get("runId") for r in runs}))
    result.zero("writes set aside", aside)
    result.zero("duplicate (triggerId, scheduledAt)", duplicates(runs))
    result.zero("once fired twice", sum(1 for rid in onces if per_once[rid] > 1))
    result.zero("once never fired", sum(1 for rid in onces if per_once[rid] == 0))
    result.zero(
        "once not consumed on the server", sum(1 for rid in onces if not _consumed(held.get(rid)))
    )
    result.zero(
        "auto-disabled by bad answers", sum(1 for s in states.values() if s == "auto_disabled")
    )
    result.zero("remind runs blamed on the program", len(blamed))
    result.zero("loop tracebacks", log.count(TRACEBACK))
    result.at_most(
        "bad-answer log lines per bad phase",
        bad_lines / max(1, phases[HTML] + phases[TRUNCATED]),
        1,
    )
    result.at_least("bad-answer log lines", bad_lines, 1)
    result.equal("phases with /healthz degraded", sum(degraded.values()), sum(phases.values()))
    result.at_least("429 answers", proxy.answered[THROTTLE], 1)
    result.figures.update(
        rounds=rounds,
        storm_s=length,
        answers=dict(proxy.answered),
        runs_started=len(noted),
        runs_recorded=len(runs),
        remind_runs=dict(Counter(f"{r.get('status')}:{r.get('errorType')}" for r in reminds)),
        statuses=dict(Counter(str(r.get("status")) for r in runs)),
        degraded=dict(degraded),
    )
    return result


def _degraded_within(serve: Serve, seconds: float) -> bool:
    """Ask `/healthz` through a phase of `seconds` (the phase itself: time passing); return
    whether it said degraded at some point."""
    seen = False
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen = seen or serve.get("/healthz").get("status") == "degraded"
        time.sleep(0.25)
    return seen


def _set_aside(metrics: str) -> int:
    match = re.search(r"^anyrtd_outbox_set_aside (\d+)", metrics, re.MULTILINE)
    return int(match.group(1)) if match else -1


def _consumed(record: dict[str, Any] | None) -> bool:
    return record is not None and record.get("enabled") is False and bool(record.get("lastRunAt"))
