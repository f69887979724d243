"""Benchmark the control API while 10,000 triggers are registered and firing.

Run: `python bench/bench_control.py [--triggers N] [--rate R] [--duration S] [--json FILE]`.

Three processes, so that each one's CPU is its own: the devserver, the daemon with
its control API (this process: the real `Daemon` and `ControlServer`, with a no-op
in-process program so that firing costs the scheduler and not a program), and a
load generator (this script again, with `--load`). The load generator sends
`GET /triggers/:id` open-loop at a fixed rate (each latency counts from the moment
the request was due, so a stall is not hidden) and times `GET /triggers` (the whole
registry) one request at a time. Figures go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from anyrtd.client import ServerClient, Upsert
from anyrtd.clock import SystemClock
from anyrtd.config import Config
from anyrtd.control.server import ControlServer
from anyrtd.daemon import Daemon
from anyrtd.places import resolve_places
from anyrtd.program import ProgramContext
from anyrtd.runner import Runner
from anyrtd.serve import settle_heap

LINE = re.compile(r"^anyrtd devserver: device \d+ (\S+) (http://\S+)$")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def summary(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 2),
        "p99_ms": round(pct(ms, 99), 2),
        "max_ms": round(max(ms), 2),
    }


# --------------------------------------------------------------------------- the load generator


async def load(url: str, ids: list[str], rate: float, duration: float, lists: int) -> None:
    """Time GET /triggers, then send GET /triggers/:id open-loop; print JSON."""
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(url, connector=connector) as client:
        list_ms: list[float] = []
        body = b"[]"
        for _ in range(lists):
            t0 = time.perf_counter()
            async with client.get("/triggers") as resp:
                body = await resp.read()
                assert resp.status == 200
            list_ms.append((time.perf_counter() - t0) * 1000)
        count = len(json.loads(body))

        one_ms: list[float] = []
        errors = 0
        rng = random.Random(7)

        async def one(due: float) -> None:
            nonlocal errors
            async with client.get(f"/triggers/{rng.choice(ids)}") as resp:
                await resp.read()
                if resp.status != 200:
                    errors += 1
            one_ms.append((time.perf_counter() - due) * 1000)

        start = time.perf_counter()
        tasks = []
        n = int(rate * duration)
        for i in range(n):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(due)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    print(
        json.dumps(
            {
                "list": {**summary(list_ms), "entries": count, "bytes": len(body)},
                "one": {
                    **summary(one_ms),
                    "errors": errors,
                    "achieved_rate": round(n / elapsed, 1),
                },
            }
        )
    )


# --------------------------------------------------------------------------- the daemon side


class Noop:
    """An in-process program that does nothing: firing then costs only the scheduler."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, args: Mapping[str, Any], ctx: ProgramContext) -> dict[str, Any]:
        self.count += 1
        return {}


async def loop_lag(stalls: list[float], every: float = 0.005) -> None:
    """Note how late the daemon's event loop wakes a 5 ms sleep: what blocks it shows here."""
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(every)
        stalls.append((time.perf_counter() - t0 - every) * 1000)


def start_devserver(db: Path) -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "anyrtd", "devserver", "--port", "0", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        match = LINE.match(line.strip())
        if match:
            return proc, match.group(1), match.group(2)
    raise RuntimeError("the devserver did not start")


async def seed(url: str, peer: str, n: int) -> list[str]:
    """Write n trigger records pinned to the device, with periods spread over 10-300 s."""
    ids = [f"bench-{i:05d}" for i in range(n)]
    async with ServerClient(url, timeout=60) as client:
        places = await resolve_places(client, "bao")
        for start in range(0, n, 500):
            batch = [
                Upsert(
                    rid,
                    {
                        "kind": "cron",
                        "spec": {"every_s": 10 + (i % 290)},
                        "program": "bench:noop@v1",
                        "args": {"n": i},
                        "owner": peer,
                        "limits": {"timeoutS": 30},
                    },
                )
                for i, rid in enumerate(ids[start : start + 500], start)
            ]
            await client.upsert(places.triggers, batch)
    return ids


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-control-"))
    devserver, peer, url = start_devserver(tmp / "dev.sqlite3")
    try:
        t0 = time.perf_counter()
        ids = await seed(url, peer, args.triggers)
        seeded_s = time.perf_counter() - t0
        config = Config(server=url, state_dir=tmp / "state", listen="127.0.0.1:0", tick_s=5.0)
        noop = Noop()
        client = ServerClient(url, timeout=60)
        runner = Runner(
            client=client,
            clock=SystemClock(),
            agent_name="bao",
            space="bao",
            commands={},
            timeout_s=30.0,
            extra_builtins={"bench:noop@v1": noop},
        )
        daemon = Daemon(config, client=client, runner=runner)
        await daemon.open()
        control = ControlServer(daemon.port, config.listen, config.token_file)
        await control.start()
        t0 = time.perf_counter()
        await daemon.start()
        deadline = time.monotonic() + 300
        while sum(e.confirmed for e in daemon.registry.entries.values()) < args.triggers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(daemon.registry)} entries adopted")
            await asyncio.sleep(0.2)
        adopted_s = time.perf_counter() - t0
        if args.settle:
            settle_heap()  # what `anyrtd serve` does once the daemon has started
        # Let the first periods (10 s and up) come due, so the load meets a firing scheduler.
        await asyncio.sleep(args.warmup)
        fires_before, noop_before = daemon.stats.fires, noop.count
        ticks_before = daemon.stats.tick_duration.n
        stalls: list[float] = []
        probe = asyncio.create_task(loop_lag(stalls))
        t0 = time.perf_counter()
        loader = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--load",
            control.url,
            "--rate",
            str(args.rate),
            "--duration",
            str(args.duration),
            "--lists",
            str(args.lists),
            "--ids",
            ",".join(ids[:: max(1, len(ids) // 500)]),
            stdout=subprocess.PIPE,
        )
        out, _ = await loader.communicate()
        window = time.perf_counter() - t0
        probe.cancel()
        ticks = daemon.stats.tick_duration.recent[-(daemon.stats.tick_duration.n - ticks_before) :]
        result = json.loads(out.decode())
        result["daemon_loop"] = {
            "stall_p99_ms": round(pct(stalls, 99), 2),
            "stall_max_ms": round(max(stalls), 2),
            "tick_p50_ms": round(pct(ticks, 50) * 1000, 1) if ticks else None,
            "tick_max_ms": round(max(ticks) * 1000, 1) if ticks else None,
        }
        result["setup"] = {
            "triggers": args.triggers,
            "seed_s": round(seeded_s, 1),
            "adopt_s": round(adopted_s, 1),
            "fires_during_load": daemon.stats.fires - fires_before,
            "fires_per_s": round((daemon.stats.fires - fires_before) / window, 1),
            "runs_done_during_load": noop.count - noop_before,
            "fire_lag_p99_ms": round(pct(daemon.stats.fire_lag.recent, 99) * 1000, 2)
            if daemon.stats.fire_lag.recent
            else None,
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "settle_heap": args.settle,
        }
        await control.stop()
        await daemon.stop()
        return result
    finally:
        devserver.terminate()
        devserver.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--lists", type=int, default=20)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument(
        "--no-settle", dest="settle", action="store_false", help="Skip serve's settle_heap()."
    )
    parser.add_argument("--json", type=Path, help="Also write the figures to this file.")
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        asyncio.run(load(args.load, args.ids.split(","), args.rate, args.duration, args.lists))
        return
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
