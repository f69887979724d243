"""Measure what a chain costs: a space whose run records land at `--rate` a minute, with no
chain and with one chain (docs/events.md, "Chains").

    python bench/bench_chains.py [--rate 10000] [--seconds 60] [--every 100] [--json out.json]

A real devserver subprocess and a real daemon (in this process, system clock, the change
feed long-polled as in production). The bench writes `agent_runs` records straight to the
server, as other devices' outboxes would, in batches ten times a second; one record in
`--every` is a run of `backup`, the rest of other triggers. It runs twice: first with no
chain (the space as it is today), then with one chain on `backup`'s ok runs, pinned to the
daemon's device.

Figures, per mode: the time the daemon spent routing the feed's pages to event triggers and
chains (`Role.route_events`, wall time summed, in ms per minute of records), the process's
CPU time per minute, and with the chain, each upstream record written → the chain's
program started (ms) and how many upstream runs were answered (each once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from support import percentile, start_devserver

from anyrtd.client import Change, ServerClient, Upsert
from anyrtd.clock import SystemClock
from anyrtd.config import Config
from anyrtd.daemon import Daemon
from anyrtd.program import ProgramContext
from anyrtd.runner import Runner

BATCHES_PER_S = 10
UNTIL_S = 30.0


async def until(check: Callable[[], bool]) -> None:
    """Wait until `check()` holds, looking every 50 ms, at most `UNTIL_S` seconds."""
    async with asyncio.timeout(UNTIL_S):
        while True:
            if check():
                return
            await asyncio.sleep(0.05)


def summary(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
    }


async def one(rate: int, seconds: float, every: int, with_chain: bool) -> dict[str, Any]:
    started: dict[str, float] = {}

    async def mark(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        up = str(args["event"]["runId"])
        if up in started:
            raise AssertionError(f"run {up} answered twice")
        started[up] = time.time()

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_devserver(Path(tmp) / "dev.sqlite3")
        client, user = ServerClient(url), ServerClient(url)
        runner = Runner(
            client=client,
            clock=SystemClock(),
            agent_name="bao",
            space="bao",
            commands={},
            extra_builtins={"bench:mark@v1": mark},
        )
        daemon = Daemon(
            Config(server=url, state_dir=Path(tmp) / "state", tick_s=1.0),
            client=client,
            runner=runner,
        )
        routed = [0.0]
        route = daemon.role.route_events

        async def timed(changes: Iterable[Change], space: str) -> None:
            t = time.perf_counter()
            try:
                await route(changes, space)
            finally:
                routed[0] += time.perf_counter() - t

        daemon.role.route_events = timed  # type: ignore[method-assign]  # the bench's probe
        sent: dict[str, float] = {}
        try:
            await daemon.start()
            await until(lambda: daemon.places is not None and daemon.peer_id is not None)
            places = daemon.places
            assert places is not None
            if with_chain:
                fields = {
                    "kind": "event",
                    "spec": {"dataset": "agent_runs", "filter": {"triggerId": "backup"}},
                    "program": "bench:mark@v1",
                    "owner": daemon.peer_id,
                    "maxConsecutiveFailures": 1000,
                }
                await user.upsert(places.triggers, [Upsert("report", fields)])
                await until(
                    lambda: (e := daemon.registry.get("report")) is not None and e.confirmed
                )
            await until(lambda: bool(daemon.role.live.heads))
            per_batch = max(1, round(rate / 60 / BATCHES_PER_S))
            batches = int(seconds * BATCHES_PER_S)
            cpu0, wall0, n = time.process_time(), time.perf_counter(), 0
            routed[0] = 0.0
            for b in range(batches):
                due = wall0 + b / BATCHES_PER_S
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                now = time.time()
                writes = []
                for _ in range(per_batch):
                    n += 1
                    rid = f"run-{n:08d}"
                    trigger = "backup" if n % every == 0 else f"job-{n % 50}"
                    record = {
                        "runId": rid,
                        "triggerId": trigger,
                        "program": "agent:x@v1",
                        "device": "elsewhere",
                        "startedAt": now - 1,
                        "endedAt": now,
                        "status": "ok",
                    }
                    writes.append(Upsert(rid, record))
                    if trigger == "backup":
                        sent[rid] = now
                await user.upsert(places.runs, writes)
            if with_chain:
                await until(lambda: all(r in started for r in sent))
            wall = time.perf_counter() - wall0
            cpu = time.process_time() - cpu0
        finally:
            await daemon.stop()
            await user.aclose()
            proc.terminate()
            proc.wait(timeout=10)
    minutes = wall / 60
    out: dict[str, Any] = {
        "records": n,
        "records_per_min": round(n / minutes),
        "route_ms_per_min": round(routed[0] * 1000 / minutes, 1),
        "process_cpu_s_per_min": round(cpu / minutes, 2),
    }
    if with_chain:
        out["upstream_runs"] = len(sent)
        out["answered"] = sum(1 for r in sent if r in started)
        out["written_to_started"] = summary([(started[r] - t) * 1000 for r, t in sent.items()])
    return out


async def bench(rate: int, seconds: float, every: int) -> dict[str, Any]:
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "load": os.getloadavg()[0],
        "rate_per_min": rate,
        "seconds": seconds,
        "no_chain": await one(rate, seconds, every, with_chain=False),
        "one_chain": await one(rate, seconds, every, with_chain=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=10_000, help="run records a minute")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=int, default=100, help="one record in N is backup's")
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    result = asyncio.run(bench(opts.rate, opts.seconds, opts.every))
    text = json.dumps(result, indent=2)
    print(text)
    if opts.json:
        opts.json.write_text(text + "\n")
    chain = result["one_chain"]
    print(
        f"routing: {result['no_chain']['route_ms_per_min']} ms/min without a chain, "
        f"{chain['route_ms_per_min']} ms/min with one; "
        f"{chain['answered']}/{chain['upstream_runs']} upstream runs answered"
    )


if __name__ == "__main__":
    main()
