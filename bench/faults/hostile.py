"""Thousands of hostile programs run by one daemon (issue 15 item 1 and the runner's promises).

Command programs that leave children behind, ignore SIGTERM past their budget, spew
megabytes on stdout and stderr, print one huge line without a newline, close their output
early, die of a signal, exit 255, hand a grandchild their stdout and exit, stop
themselves, or end with a result holding a lone surrogate (`{"title": "\\ud800"}`), each on
many every-second triggers, until the programs have started `rounds` times. Promised: every
started run has its record on the server (the outbox is never wedged), no process of a
finished run left running, no zombie child of the daemon, and a flat descriptor count.
Programs that leave their process group with `setsid` are counted apart: a process group
cannot hold them (a systemd unit's cgroup does, at stop).
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
    every,
    family_run,
    fd_count,
    marker_program,
    process_key,
    quiesce,
    started_runs,
    tagged,
    within,
    zombies_of,
)

ROUNDS = 10_000
QUICK = 300
COPIES = 3  # every-second triggers per kind of program
BUDGET_S = 1.0  # the daemon's run budget (`run_timeout_s`): what ends `deaf` and `stopped`
ESCAPED = "ANYRTD_FAULTS_ESCAPED=1"
SURROGATE = '{"title": "\\ud800 cut through an emoji"}'

KINDS: dict[str, tuple[str, ...]] = {
    "forker": ("sleep 30 &", "sleep 30 &", "echo forked"),
    "deaf": ("trap '' TERM", "sleep 30"),  # the budget ends it, by SIGKILL
    "spew": ("head -c 1000000 /dev/zero | tr '\\0' x", "head -c 300000 /dev/zero >&2"),
    "oneline": ("head -c 2000000 /dev/zero",),
    "closer": ("exec >&- 2>&-", "sleep 0.2"),
    "segv": ("kill -SEGV $$",),
    "exit255": ("exit 255",),
    "handoff": ("(sleep 5 &)", "exit 0"),  # a grandchild keeps stdout open
    "stopped": ("kill -STOP $$",),  # stopped until its budget ends
    "surrogate": (f"echo '{SURROGATE}'",),
    "escaper": (f"setsid env {ESCAPED} sleep 20 &", "echo escaped"),
}


def run(work: Path, rounds: int) -> Result:
    result = Result("programs")
    tag = f"programs-{time.time_ns()}"
    started = work / "started"
    programs = {f"faults:{kind}@v1": marker_program(started, *body) for kind, body in KINDS.items()}
    server = Server(work).start()
    serve = Serve(
        work,
        server.url,
        programs=programs,
        env={"ANYRTD_FAULTS_TAG": tag},
        tick=0.5,
        config=[f"run_timeout_s = {BUDGET_S}"],
    )
    space = Space(server.url)
    records = {
        f"{kind}-{c}": every(1, f"faults:{kind}@v1", maxConsecutiveFailures=1_000_000)
        for kind in KINDS
        for c in range(COPIES)
    }
    fds: list[int] = []
    zombies: list[int] = []
    with family_run(result, serve, server, tag):
        serve.start()
        pid = serve.pid
        assert pid is not None
        _daemon = {k for k in [process_key(pid)] if k is not None}
        time.sleep(2.0)  # the daemon's start-up settles before its descriptors are counted
        fds_before = fd_count(pid, sockets=False)
        space.put(records)
        began = time.monotonic()
        while len(started_runs(started)) < rounds:
            serve.check_alive()
            fds.append(fd_count(pid))
            zombies.append(zombies_of(pid))
            if time.monotonic() - began > max(120.0, rounds / 5):
                result.notes.append(f"only {len(started_runs(started))} programs in time")
                break
            time.sleep(0.5)
        runs, noted, missing = quiesce(serve, space, records, started, timeout=90)
        if missing:
            result.notes.append(missing)
        # what the runs left: wait out the budgets' ends and the kill grace
        within(lambda: not (tagged(tag) - _escaped(tag) - _daemon), 15)
        leftovers = tagged(tag) - _escaped(tag) - _daemon
        escaped = len(_escaped(tag))
        zombies_after = zombies_of(pid)
        fds_after = fd_count(pid, sockets=False)
        metrics = serve.get_text("/metrics")
        serve.stop()
    if result.error is not None:
        return result

    recorded = {r.get("runId") for r in runs}
    kinds = Counter(trigger.rsplit("-", 1)[0] for trigger, _ in noted.values())
    result.zero("runs without a record", len(set(noted) - recorded))
    result.zero("processes of finished runs left", len(leftovers))
    result.zero("zombie children after the runs", zombies_after)
    result.at_most("descriptors gained, sockets aside (after - before)", fds_after - fds_before, 2)
    result.figures.update(
        programs=len(noted),
        per_kind=dict(kinds),
        statuses=dict(Counter(str(r.get("status")) for r in runs)),
        fds_before=fds_before,
        fds_max=max(fds, default=0),
        fds_after=fds_after,
        zombies_max_sampled=max(zombies, default=0),
        escaped_with_setsid_still_running=escaped,
        outbox_set_aside=[
            ln.split()[-1]
            for ln in metrics.splitlines()
            if ln.startswith("anyrtd_outbox_set_aside")
        ],
    )
    return result


def _escaped(tag: str) -> set[tuple[int, str]]:
    """Return the tagged processes that left their group with `setsid` (marked in env)."""
    out = set()
    for key in tagged(tag):
        try:
            env = Path(f"/proc/{key[0]}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if ESCAPED.encode() in env:
            out.add(key)
    return out
