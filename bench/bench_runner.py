"""Measure the runner alone: many runs started at once, in-process and as commands.

    python bench/bench_runner.py [--runs 1000] [--commands 100]

No server is involved (the programs do not call it); the daemon-level figure
(runs recorded in the mirror and on the server) is bench/bench_runs.py.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import httpx

from anyrtd.client import ServerClient
from anyrtd.clock import SystemClock
from anyrtd.config import CommandProgram
from anyrtd.program import ProgramContext, RunOutcome
from anyrtd.rows import RunRow
from anyrtd.runner import Runner

Run = tuple[RunRow, dict[str, Any]]
"""A run to hand the runner: its row and its program's args."""


async def stuck(args: Mapping[str, Any], ctx: ProgramContext) -> None:
    """Wait forever, like a program stuck on a peer that never answers."""
    await asyncio.Event().wait()


async def interrupt_burst(runner: Runner, reqs: list[Run]) -> tuple[float, list[RunOutcome]]:
    """Start `reqs`, wait until all are in flight, and time interrupt_all until all have ended."""
    tasks = [asyncio.create_task(runner.run(*r)) for r in reqs]
    await asyncio.sleep(1.0)  # let every run start, and the commands get past exec
    assert runner.in_flight == len(reqs), f"only {runner.in_flight} of {len(reqs)} in flight"
    t0 = time.perf_counter()
    await runner.interrupt_all()
    seconds = time.perf_counter() - t0
    return seconds, list(await asyncio.gather(*tasks))


async def noop(args: Mapping[str, Any], ctx: ProgramContext) -> Mapping[str, Any]:
    """Do nothing but yield once and report a result, like a program that only returns."""
    await asyncio.sleep(0)
    return {"title": "noop", "fuel": 0}


def requests(program: str, n: int) -> list[Run]:
    return [
        (RunRow(f"run-{i:05d}", "bench", program, "bench-device", None, 0.0), {"i": i})
        for i in range(n)
    ]


async def burst(runner: Runner, reqs: list[Run]) -> tuple[float, list[RunOutcome]]:
    t0 = time.perf_counter()
    outcomes = await asyncio.gather(*(runner.run(*r) for r in reqs))
    return time.perf_counter() - t0, list(outcomes)


def report(label: str, seconds: float, outcomes: list[RunOutcome]) -> None:
    statuses = Counter(str(o.status) for o in outcomes)
    per_run = [o.duration_ms for o in outcomes]
    print(
        f"{label}: {len(outcomes)} runs in {seconds * 1000:.0f} ms "
        f"({len(outcomes) / seconds:,.0f} runs/s); statuses {dict(statuses)}; "
        f"per-run durationMs median {statistics.median(per_run):.0f}, max {max(per_run)}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="in-process runs at once")
    parser.add_argument("--commands", type=int, default=100, help="command runs at once")
    parser.add_argument("--rounds", type=int, default=5, help="repeat the in-process burst")
    opts = parser.parse_args()

    transport = httpx.MockTransport(lambda r: httpx.Response(503))
    async with ServerClient("http://127.0.0.1:9", transport=transport) as client:
        runner = Runner(
            client=client,
            clock=SystemClock(),
            agent_name="bao",
            space="bench",
            commands={
                "bench:true@v1": CommandProgram(argv=(sys.executable, "-c", "pass")),
                "bench:sleep@v1": CommandProgram(argv=("sleep", "600")),
            },
            extra_builtins={"bench:noop@v1": noop, "bench:stuck@v1": stuck},
        )
        await burst(runner, requests("bench:noop@v1", 10))  # warm up
        times = []
        for round_ in range(opts.rounds):
            seconds, outcomes = await burst(runner, requests("bench:noop@v1", opts.runs))
            times.append(seconds)
            report(f"in-process round {round_ + 1}", seconds, outcomes)
        print(
            f"in-process: {opts.runs} runs at once, median of {opts.rounds} rounds "
            f"{statistics.median(times) * 1000:.0f} ms"
        )
        if opts.commands:
            seconds, outcomes = await burst(runner, requests("bench:true@v1", opts.commands))
            report(f"command ({sys.executable} -c pass)", seconds, outcomes)
        seconds, outcomes = await interrupt_burst(runner, requests("bench:stuck@v1", opts.runs))
        report("interrupt_all, in-process", seconds, outcomes)
        if opts.commands:
            seconds, outcomes = await interrupt_burst(
                runner, requests("bench:sleep@v1", opts.commands)
            )
            report("interrupt_all, commands (sleep 600)", seconds, outcomes)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS of the benchmark process: {peak:.0f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
