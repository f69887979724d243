"""The wall clock stepped under a running daemon: ±2 h, and a small step back (issue 15 item 3).

`anyrtd serve` runs under libfaketime (Debian's `faketime` package) with a timestamp file
this harness rewrites, so the daemon's wall clock (and its programs') jumps as an NTP step
or `date -s` would, while its monotonic clock does not. Each round steps the clock 2 h back
(on odd rounds restarting the daemon under the earlier clock), then 2 h forward to the true
time, then 30 s back and forward again; after each step every recurring trigger must fire
again within a deadline, a forward step must not fire a burst of missed occurrences, and
`once` records written under the earlier clock fire once and not again when the clock
moves on. Promised: no occurrence twice in a row (a trigger's run never repeats the
`scheduledAt` of the run before it), no `once` twice or never, no recurring trigger silent
after a step. A step back longer than a period runs the occurrences between the new time
and the last one fired again, as systemd's calendar timers do (docs/schedule.md, "When
the wall clock steps back"): counted as a figure, not a broken promise.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
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
    marker_program,
    once,
    quiesce,
)


def twice_in_a_row(noted: dict[str, tuple[str, str]]) -> int:
    """Count the runs whose scheduled time is the one of the run of the same trigger before
    them, in the order their programs noted their start (`started_runs`, the lines of one
    file appended to in turn): the occurrence fired last was fired again. Not the order of
    the records' `startedAt`, which is the stepped wall clock's: a run started after a step
    back would sort among the runs before it."""
    last: dict[str, str] = {}
    count = 0
    for tid, at in noted.values():
        if last.get(tid) == at:
            count += 1
        last[tid] = at
    return count


ROUNDS = 6
QUICK = 2
MARK = "faults:mark@v1"
PERIOD_S = {"every2": 2.0, "cron1": 1.0, "cron5": 5.0}
RECURRING = {
    "every2": every(2, MARK),
    "cron1": cron("* * * * * *", MARK),
    "cron5": cron("* * * * * */5", MARK),
}
STEPS = (-7200.0, 0.0, -30.0, 0.0)  # the clock's offset after each step of a round
SILENT_S = 20.0  # a recurring trigger that has not fired this long after a step stopped
BURST_WINDOW_S = 3.0  # after a forward step, fires counted over at least this long


def libfaketime() -> str | None:
    """Return the path of libfaketime's multi-threaded library, if installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    found += sorted(glob.glob("/usr/lib/faketime/libfaketimeMT.so.1"))
    return found[0] if found else None


def faketime_env(lib: str, rc: Path) -> dict[str, str]:
    return {
        "LD_PRELOAD": lib,
        "FAKETIME_TIMESTAMP_FILE": str(rc),
        "FAKETIME_CACHE_DURATION": "1",  # the file is read again each second, not each call
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }


def set_offset(rc: Path, seconds: float) -> None:
    tmp = rc.with_suffix(".new")
    tmp.write_text(f"{seconds:+.0f}\n")
    tmp.replace(rc)  # atomic: a reader never sees half a line


def usable(lib: str, rc: Path) -> str | None:
    """Return why libfaketime cannot step this interpreter's wall clock, or None when it can."""
    set_offset(rc, -7200)
    probe = "import time; print(time.time(), time.monotonic())"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, **faketime_env(lib, rc)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        wall, _ = (float(x) for x in done.stdout.split())
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return f"libfaketime did not run: {exc}"
    finally:
        set_offset(rc, 0)
    if abs(time.time() - 7200 - wall) > 60:
        return f"libfaketime did not step the clock (got {wall:.0f})"
    return None


def fired_after(started: Path, mark: int, ids: set[str], deadline_s: float) -> dict[str, float]:
    """Wait until each of `ids` has a run noted after line `mark`; return seconds to each."""
    began = time.monotonic()
    seen: dict[str, float] = {}
    while len(seen) < len(ids) and time.monotonic() - began < deadline_s:
        lines = started.read_text().splitlines()[mark:] if started.exists() else []
        for line in lines:
            parts = line.split(" ")
            if len(parts) == 3 and parts[1] in ids and parts[1] not in seen:
                seen[parts[1]] = time.monotonic() - began
        time.sleep(0.05)
    return seen


def lines(started: Path) -> int:
    return len(started.read_text().splitlines()) if started.exists() else 0


def run(work: Path, rounds: int) -> Result:
    result = Result("clock")
    lib = libfaketime()
    rc = work / "faketime.rc"
    if lib is None:
        result.skipped = "libfaketime is not installed (Debian: apt-get install faketime)"
        return result
    why = usable(lib, rc)
    if why is not None:
        result.skipped = why
        return result
    tag = f"clock-{time.time_ns()}"
    started = work / "started"
    server = Server(work).start()
    serve = Serve(
        work,
        server.url,
        programs={MARK: marker_program(started)},
        env={"ANYRTD_FAULTS_TAG": tag, **faketime_env(lib, rc)},
        tick=0.5,
    )
    space = Space(server.url)
    recurring = set(RECURRING)
    onces: list[str] = []
    silent: list[str] = []
    waits: list[float] = []
    bursts: list[int] = []
    restarts = 0
    with family_run(result, serve, server, tag, last=lambda: set_offset(rc, 0)):
        space.put(RECURRING)
        serve.start()
        first = fired_after(started, 0, recurring, 60)
        if set(first) != recurring:
            raise AssertionError(f"not every recurring trigger fired before any step: {first}")
        for n in range(rounds):
            for k, offset in enumerate(STEPS):
                mark = lines(started)
                set_offset(rc, offset)
                stepped = time.monotonic()
                if k == 0 and n % 2 == 1:
                    serve.stop()
                    serve.start()
                    restarts += 1
                if offset != 0.0:  # a once written under the earlier clock, due in it
                    rid = f"once-{n}-{k}"
                    space.put({rid: once(time.time() + offset + 1.0, MARK)})
                    onces.append(rid)
                seen = fired_after(started, mark, recurring, SILENT_S)
                silent += [f"round {n} step {k}: {rid}" for rid in sorted(recurring - set(seen))]
                waits += seen.values()
                if offset == 0.0:  # forward: more fires than the time allows is a burst
                    time.sleep(max(0.0, stepped + BURST_WINDOW_S - time.monotonic()))
                    elapsed = time.monotonic() - stepped
                    window = started.read_text().splitlines()[mark:]
                    per = Counter(ln.split(" ")[1] for ln in window if ln.count(" ") == 2)
                    bursts.append(max(per[r] - int(elapsed / PERIOD_S[r]) - 2 for r in recurring))
        runs, noted, missing = quiesce(serve, space, RECURRING, started, onces, 60)
        if missing:
            result.notes.append(missing)
        serve.stop()
    if result.error is not None:
        return result

    per_once = Counter(trigger for trigger, _ in noted.values())
    result.zero("occurrence fired twice in a row", twice_in_a_row(noted))
    result.zero("once fired twice", sum(1 for rid in onces if per_once[rid] > 1))
    result.zero("once never fired", sum(1 for rid in onces if per_once[rid] == 0))
    result.zero(f"recurring trigger silent {SILENT_S:g} s after a step", len(silent))
    # Only the family's own programs note their start: a standing built-in (the daily
    # rollup, when a step forward crosses its hour) runs in the daemon and notes nothing.
    ours = recurring | set(onces)
    never = [r for r in runs if r.get("triggerId") in ours and r.get("runId") not in noted]
    result.zero("runs recorded whose program never started", len(never))
    result.zero("extra fires right after a forward step (a burst)", max(0, *bursts))
    result.figures.update(
        steps=rounds * len(STEPS),
        restarts_under_earlier_clock=restarts,
        refire_wait_max_s=round(max(waits, default=0.0), 2),
        refire_wait_p50_s=round(sorted(waits)[len(waits) // 2], 2) if waits else None,
        runs=len(runs),
        run_again_after_a_step_back=duplicates(runs),
        never_started_statuses=dict(Counter(str(r.get("status")) for r in never)),
    )
    result.notes += silent[:8]
    result.notes += [f"never started: {json.dumps(r, sort_keys=True)}" for r in never[:4]]
    return result
