"""The disk fills at each step of a fire (issue 15 item 2).

The state directory is a small tmpfs (mounted as root; the family is skipped, with the
reason, where mounting is not permitted). Each round writes a `once` due two seconds out
whose command runs for a second, then fills the tmpfs at a moment swept across the fire
(before it is prepared, while it is prepared and started, while the program runs, as it
ends and its record is queued), holds it full for three seconds and frees it. An
every-second trigger keeps firing into the full disk. Promised: every `once` runs exactly
once (late beats lost), no run is recorded that never started, no row stays `running`,
every run that started has its record, no occurrence twice, the daemon keeps running (a
full disk is not a broken mirror), and `/healthz` says the disk is full while a write
fails on it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

from bench.faults.common import (
    DaemonExited,
    Result,
    Serve,
    Server,
    Space,
    duplicates,
    every,
    kill_tagged,
    marker_program,
    once,
    quiesce,
    started_runs,
    within,
)

ROUNDS = 12
QUICK = 4
MARK = "faults:mark@v1"
WORK = "faults:work@v1"
SIZE = "8m"
DUE_IN_S = 2.0
HOLD_S = 3.0
SETTLE_S = 60.0  # for the last onces to fire once the disk has room
# when the disk fills, relative to the once's due time: before it, at it, inside its run,
# at its end (the program runs one second)
SWEEP = (-0.5, -0.05, 0.0, 0.02, 0.05, 0.1, 0.3, 0.6, 0.9, 1.0, 1.05, 1.2, 1.5)


def mount(where: Path) -> str | None:
    """Mount a tmpfs of SIZE at `where`; return why not, or None when mounted."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return f"mount -t tmpfs refused: {done.stderr.strip() or done.returncode}"
    return None


def fill(where: Path) -> Path:
    """Fill the filesystem of `where` to the last block; return the filler file."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def running_rows(mirror: Path) -> int:
    """Count the mirror's runs still marked `running`."""
    if not mirror.exists():
        return 0
    with contextlib.closing(sqlite3.connect(mirror, timeout=10)) as conn:
        (n,) = conn.execute("SELECT count(*) FROM runs WHERE status = 'running'").fetchone()
    return int(n)


def says_full(serve: Serve) -> bool:
    with contextlib.suppress(Exception), serve.http(timeout=2) as client:
        body = client.get("/healthz").json()
        text = " ".join(str(r) for r in body.get("reasons", [])).lower()
        return "disk" in text or "space" in text or "full" in text
    return False


def run(work: Path, rounds: int) -> Result:
    result = Result("diskfull")
    state = work / "state"
    why = mount(state)
    if why is not None:
        result.skipped = why
        return result
    tag = f"diskfull-{time.time_ns()}"
    started = work / "started"
    server = Server(work).start()
    serve = Serve(
        work,
        server.url,
        state=state,
        programs={MARK: marker_program(started), WORK: marker_program(started, "sleep 1")},
        env={"ANYRTD_FAULTS_TAG": tag},
        tick=0.5,
    )
    space = Space(server.url)
    onces: list[str] = []
    exits: Counter[str] = Counter()
    writes_failed = unsaid = 0
    left_running = 0
    try:
        space.put({"every1": every(1, MARK)})
        serve.start()
        for n in range(rounds):
            offset = SWEEP[n % len(SWEEP)]
            rid = f"once-{n:03d}"
            due = time.time() + DUE_IN_S
            space.put({rid: once(due, WORK)})
            onces.append(rid)
            time.sleep(max(0.0, due + offset - time.time()))  # the moment of the fault
            mark = serve.log.stat().st_size
            filler = fill(state)
            held_until = time.monotonic() + HOLD_S
            said = False
            while time.monotonic() < held_until:
                said = said or says_full(serve)
                if serve.proc is not None and serve.proc.poll() is not None:
                    break
                time.sleep(0.1)
            # SQLite writes on into the room its WAL file already has: only a round in
            # which a write failed must show on /healthz
            failed = "disk is full" in serve.log.read_bytes()[mark:].decode(errors="replace")
            writes_failed += failed
            unsaid += failed and not said
            filler.unlink()
            if serve.proc is not None and serve.proc.poll() is not None:
                exits[f"exit {serve.proc.returncode}"] += 1
                serve.proc = None
                serve.start()  # as an operator would; the unit would not (exit 65)
            # pace the rounds: this once runs (or is lost) before the next fault
            within(lambda rid=rid: rid in {t for t, _ in started_runs(started).values()}, 8)
        runs, noted, missing = quiesce(serve, space, ["every1"], started, onces, SETTLE_S)
        if missing:
            result.notes.append(missing)
        left_running = running_rows(serve.mirror)
        serve.stop()
    except DaemonExited as exc:
        result.error = str(exc)
        runs = space.runs()
    finally:
        serve.stop()
        server.stop()
        kill_tagged(tag)
        subprocess.run(["umount", "-l", str(state)], capture_output=True)

    ran = Counter(trigger for trigger, _ in noted.values())
    recorded = {r.get("runId") for r in runs}
    ours = {"every1", *onces}  # a standing built-in (the daily rollup) notes no start
    never_started = [r for r in runs if r.get("triggerId") in ours and r.get("runId") not in noted]
    result.zero("once ran twice", sum(1 for rid in onces if ran[rid] > 1))
    result.zero("once never ran", sum(1 for rid in onces if ran[rid] == 0))
    result.zero("runs recorded that never started", len(never_started))
    result.zero("runs left running in the mirror", left_running)
    result.zero("runs without a record", len(set(noted) - recorded))
    result.zero("duplicate (triggerId, scheduledAt)", duplicates(runs))
    result.zero("daemon exits on a full disk", sum(exits.values()))
    result.zero("rounds a write failed and /healthz did not say the disk is full", unsaid)
    result.figures.update(
        onces=len(onces),
        exits=dict(exits),
        never_started_statuses=dict(Counter(str(r.get("status")) for r in never_started)),
        statuses=dict(Counter(str(r.get("status")) for r in runs)),
        tmpfs=SIZE,
        rounds_a_write_failed=writes_failed,
    )
    return result
