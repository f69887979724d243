"""A burst of `once` triggers due in the same second, measured from the programs' side.

Run: `python bench/bench_burst.py [--runs 1000] [--commands 100] [--rounds 1]`.

Each in-process program notes `time.time()` the moment it is called; each command
program prints the time it started as its result `title`. The real start lag is that
time less the run's `scheduledAt`; beside it, the lag the run records claim
(`startedAt - scheduledAt`) and how far each record's `startedAt` is from what its
program saw. The devserver runs as a separate process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support import percentile, start_devserver

from anyrtd.client import ServerClient, Upsert
from anyrtd.clock import SystemClock
from anyrtd.config import CommandProgram, Config
from anyrtd.daemon import Daemon
from anyrtd.program import ProgramContext
from anyrtd.runner import Runner

IN_PROCESS = "bench:note@v1"
COMMAND = "bench:date@v1"
# `date +%s.%N` is the command's own start, give or take the shell's start-up.
DATE_ARGV = ["/bin/sh", "-c", 'echo "{\\"title\\": \\"$(date +%s.%N)\\"}"']


class Probe:
    """An in-process program that notes when it was called."""

    def __init__(self) -> None:
        self.saw: dict[str, float] = {}

    async def main(self, args: Mapping[str, Any], ctx: ProgramContext) -> None:
        self.saw[ctx.run_id] = time.time()


def make_daemon(url: str, state: Path, probe: Probe) -> Daemon:
    config = Config(server=url, state_dir=state, tick_s=5.0)
    client = ServerClient(url)
    runner = Runner(
        client=client,
        clock=SystemClock(),
        agent_name="bao",
        space="bao",
        commands={COMMAND: CommandProgram(argv=tuple(DATE_ARGV))},
        extra_builtins={IN_PROCESS: probe.main},
    )
    return Daemon(config, client=client, runner=runner, confirm_after=0.0)


def ms(values: list[float]) -> str:
    if not values:
        return "-"
    p50, p99 = percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000
    return f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(values) * 1000:.1f} ms"


async def burst(url: str, n: int, program: str, lead_s: float) -> dict[str, Any]:
    """Fire `n` onces of `program` due at one instant; return the lags seen."""
    probe = Probe()
    with tempfile.TemporaryDirectory() as tmp:
        daemon = make_daemon(url, Path(tmp), probe)
        await daemon.open()
        await daemon.sync(0)
        await daemon.tick()
        assert daemon.places is not None and daemon.peer_id is not None
        at = round(time.time() + lead_s)  # a whole second, as users write them
        async with ServerClient(url) as client:
            for start in range(0, n, 500):
                upserts = [
                    Upsert(
                        f"b{int(at)}-{i}",
                        {
                            "kind": "once",
                            "spec": {"at": at},
                            "program": program,
                            "owner": daemon.peer_id,
                        },
                    )
                    for i in range(start, min(n, start + 500))
                ]
                await client.upsert(daemon.places.triggers, upserts)
        await daemon.start()
        deadline = time.time() + lead_s + 120
        rows: list[Any] = []
        while time.time() < deadline:
            await asyncio.sleep(0.1)
            rows = await daemon.db_call(lambda m: m.runs(limit=n + 10))
            if len(rows) >= n and all(r.ended_at is not None for r in rows):
                break
        await daemon.stop()
    real: list[float] = []
    claimed: list[float] = []
    apart: list[float] = []
    for row in rows:
        if program == IN_PROCESS:
            saw = probe.saw.get(row.run_id)
        else:
            title = row.result.get("title")
            saw = float(title) if isinstance(title, str) else None
        if saw is None or row.scheduled_at is None:
            continue
        real.append(saw - row.scheduled_at)
        claimed.append(row.started_at - row.scheduled_at)
        apart.append(abs(saw - row.started_at))
    return {
        "program": program,
        "runs": n,
        "recorded": len(rows),
        "real_start_lag": ms(real),
        "recorded_lag": ms(claimed),
        "record_vs_program": ms(apart),
        "real_p50_ms": round(percentile(real, 0.5) * 1000, 1) if real else None,
        "real_p99_ms": round(percentile(real, 0.99) * 1000, 1) if real else None,
    }


async def main(opts: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server, url = start_devserver(Path(tmp) / "dev.db")
        try:
            for _ in range(opts.rounds):
                for n, program in ((opts.runs, IN_PROCESS), (opts.commands, COMMAND)):
                    if n > 0:
                        print(json.dumps(await burst(url, n, program, opts.lead)), flush=True)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="in-process onces in the burst")
    parser.add_argument("--commands", type=int, default=100, help="command onces in the burst")
    parser.add_argument("--rounds", type=int, default=1, help="repeat each burst")
    parser.add_argument("--lead", type=float, default=4.0, help="seconds until the due time")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
