"""Benchmarks of the tick, the timer, start-up and the outbox, beside APScheduler 3.

Run: `python bench/bench_daemon.py [--quick] [--json FILE]`. The devserver runs as a
separate process so that the CPU the daemon spends is measured alone
(`time.process_time`). Figures go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support import percentile, start_devserver

from anyrtd.client import Dataset, ServerClient, Upsert
from anyrtd.config import Config
from anyrtd.daemon import Daemon
from anyrtd.program import ProgramContext
from anyrtd.runner import Runner


class Probe:
    """A no-op in-process program that notes how late it started."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.count = 0

    async def main(self, args: Mapping[str, Any], ctx: ProgramContext) -> None:
        self.count += 1
        if ctx.scheduled_at is not None:
            self.lags.append(time.time() - ctx.scheduled_at)


def make_daemon(url: str, state: Path, probe: Probe, tick: float = 5.0) -> Daemon:
    config = Config(server=url, state_dir=state, tick_s=tick)
    client = ServerClient(url)
    runner = Runner(
        client=client,
        clock=_clock(),
        agent_name="bao",
        space="bao",
        commands={},
        extra_builtins={"bench:noop@v1": probe.main},
    )
    return Daemon(config, client=client, runner=runner, confirm_after=0.0)


def _clock() -> Any:
    from anyrtd.clock import SystemClock

    return SystemClock()


async def seed(url: str, n: int, peer: str, *, spec: Any = None) -> None:
    """Write `n` triggers pinned to `peer`, in batches."""
    async with ServerClient(url) as client:
        type_id = await client.ensure_type("bao", "agent_trigger")
        anchor = await client.child("bao", "bao/v1", "bao/triggers/v1", type_id)
        where = Dataset("bao", anchor, "agent_triggers")
        for start in range(0, n, 1000):
            batch = []
            for i in range(start, min(n, start + 1000)):
                if spec is not None:
                    s = spec
                elif i % 3 == 0:
                    s = {"cron": f"{i % 60} {i % 24} * * *"}
                elif i % 3 == 1:
                    s = {"cron": f"*/{1 + i % 30} * * * *", "tz": "Europe/Berlin"}
                else:
                    s = {"every_s": 3600 + i}
                batch.append(
                    Upsert(
                        f"t{i:06d}",
                        {"kind": "cron", "spec": s, "program": "bench:noop@v1", "owner": peer},
                    )
                )
            await client.upsert(where, batch)


async def peer_of(url: str) -> str:
    async with ServerClient(url) as client:
        view = await client.devices()
        assert view is not None
        return view.self_id


async def bench_tick(url: str, n: int) -> dict[str, Any]:
    """CPU of a tick with no changes, with `n` triggers adopted; and the fire lag."""
    peer = await peer_of(url)
    await seed(url, n, peer)
    probe = Probe()
    with tempfile.TemporaryDirectory() as tmp:
        daemon = make_daemon(url, Path(tmp), probe)
        await daemon.open()
        t0 = time.perf_counter()
        await daemon.sync(0)
        await daemon.tick()
        adopt_s = time.perf_counter() - t0
        assert len(daemon.registry) >= n, len(daemon.registry)
        cpu: list[float] = []
        for _ in range(200):
            c0 = time.process_time()
            await daemon.sync(0)
            await daemon.tick()
            cpu.append(time.process_time() - c0)
        # Fire lag: 50 probe triggers due every 2 s, nothing else due meanwhile.
        await daemon.start()
        async with ServerClient(url) as client:
            assert daemon.places is not None
            await client.upsert(
                daemon.places.triggers,
                [
                    Upsert(
                        f"probe{i}",
                        {
                            "kind": "cron",
                            "spec": {"every_s": 2},
                            "program": "bench:noop@v1",
                            "owner": peer,
                        },
                    )
                    for i in range(50)
                ],
            )
        deadline = time.monotonic() + 30
        while len(probe.lags) < 500 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        await daemon.stop()
    return {
        "triggers": n,
        "first_tick_adopting_all_s": round(adopt_s, 3),
        "idle_tick_cpu_ms_median": round(statistics.median(cpu) * 1000, 3),
        "idle_tick_cpu_ms_p99": round(percentile(cpu, 0.99) * 1000, 3),
        "fire_lag_samples": len(probe.lags),
        "fire_lag_ms_p50": round(percentile(probe.lags, 0.5) * 1000, 2),
        "fire_lag_ms_p99": round(percentile(probe.lags, 0.99) * 1000, 2),
    }


async def bench_startup(url: str, n: int) -> dict[str, Any]:
    """Start to first tick from a mirror of `n` triggers, and the resident memory, in a child."""
    peer = await peer_of(url)
    await seed(url, n, peer)
    with tempfile.TemporaryDirectory() as tmp:
        probe = Probe()
        daemon = make_daemon(url, Path(tmp), probe)
        await daemon.open()
        await daemon.sync(0)
        await daemon.tick()
        await daemon.stop()
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--child-startup",
            url,
            tmp,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await child.communicate()
        assert child.returncode == 0, "the start-up child failed"
    return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


def peak_rss_mb() -> float:
    """Return this process's peak resident memory in MiB.

    Read from /proc (VmHWM) where there is one: `ru_maxrss` of a process started by fork
    and exec also counts its parent's size at the fork.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def child_startup(url: str, state: str) -> None:
    probe = Probe()
    t0 = time.perf_counter()
    daemon = make_daemon(url, Path(state), probe)
    await daemon.open()
    await daemon.tick()
    elapsed = time.perf_counter() - t0
    gc.collect()
    rss_mb = peak_rss_mb()
    print(
        json.dumps(
            {
                "mirrored_triggers": len(daemon.records),
                "adopted": len(daemon.registry),
                "start_to_first_tick_s": round(elapsed, 3),
                "max_rss_mb": round(rss_mb, 1),
            }
        )
    )
    await daemon.stop()


async def bench_burst(url: str, n: int) -> dict[str, Any]:
    """`n` runs at once: time until all are in the mirror and on the server."""
    peer = await peer_of(url)
    probe = Probe()
    with tempfile.TemporaryDirectory() as tmp:
        daemon = make_daemon(url, Path(tmp), probe)
        await daemon.open()
        await daemon.sync(0)
        await daemon.tick()
        assert daemon.places is not None
        at = time.time() + 3
        async with ServerClient(url) as client:
            for start in range(0, n, 500):
                await client.upsert(
                    daemon.places.triggers,
                    [
                        Upsert(
                            f"burst{i}",
                            {
                                "kind": "once",
                                "spec": {"at": at},
                                "program": "bench:noop@v1",
                                "owner": peer,
                            },
                        )
                        for i in range(start, min(n, start + 500))
                    ],
                )
        await daemon.start()
        while time.time() < at:  # noqa: ASYNC110 - wall-clock due time, not an event
            await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        async with ServerClient(url) as client:
            while True:
                counts = await daemon.db_call(lambda m: m.run_counts())
                mirrored = counts.get("ok", 0)
                on_server = len(await client.query_all(daemon.places.runs, page_size=1000))
                if mirrored >= n and on_server >= n:
                    break
                if time.perf_counter() - t0 > 60:
                    break
                await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - t0
        await daemon.stop()
    return {
        "runs": n,
        "all_recorded_s": round(elapsed, 3),
        "mirrored": mirrored,
        "on_server": on_server,
    }


async def bench_apscheduler(n: int, n_start: int) -> dict[str, Any]:
    """APScheduler 3 in the same run: its fire lag with `n` jobs, and a start with `n_start`."""
    from apscheduler.events import EVENT_JOB_SUBMITTED, JobSubmissionEvent
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.triggers.interval import IntervalTrigger

    sched = AsyncIOScheduler(timezone="UTC")
    lags: list[float] = []

    def on_submit(event: JobSubmissionEvent) -> None:
        for when in event.scheduled_run_times:
            lags.append(time.time() - when.timestamp())

    sched.add_listener(on_submit, EVENT_JOB_SUBMITTED)
    add_jobs(sched, n)
    sched.start()
    for i in range(50):
        sched.add_job(_noop, IntervalTrigger(seconds=2), id=f"probe{i}")
    deadline = time.monotonic() + 30
    while len(lags) < 500 and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    sched.shutdown(wait=False)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--child-apscheduler",
        str(n_start),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await child.communicate()
    assert child.returncode == 0, "the APScheduler start-up child failed"
    return {
        "jobs": n,
        "fire_lag_samples": len(lags),
        "fire_lag_ms_p50": round(percentile(lags, 0.5) * 1000, 2) if lags else None,
        "fire_lag_ms_p99": round(percentile(lags, 0.99) * 1000, 2) if lags else None,
        "startup": json.loads(out.decode().strip().splitlines()[-1]),
    }


async def _noop() -> None:
    return None


def add_jobs(sched: Any, n: int) -> None:
    """Add `n` cron jobs of the same mix the anyrtd benchmarks seed."""
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    for i in range(n):
        if i % 3 == 0:
            trigger: Any = CronTrigger(minute=i % 60, hour=i % 24, timezone="UTC")
        elif i % 3 == 1:
            trigger = CronTrigger(minute=f"*/{1 + i % 30}", timezone="Europe/Berlin")
        else:
            trigger = IntervalTrigger(seconds=3600 + i)
        sched.add_job(_noop, trigger, id=f"t{i:06d}")


async def child_apscheduler(n: int) -> None:
    """Start APScheduler with `n` jobs in memory (its default store) and report time and memory."""
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    t0 = time.perf_counter()
    sched = AsyncIOScheduler(timezone="UTC")
    add_jobs(sched, n)
    sched.start()
    elapsed = time.perf_counter() - t0
    gc.collect()
    print(
        json.dumps(
            {"jobs": n, "add_and_start_s": round(elapsed, 3), "max_rss_mb": round(peak_rss_mb(), 1)}
        )
    )
    sched.shutdown(wait=False)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    n_tick = 2_000 if args.quick else 10_000
    n_start = 10_000 if args.quick else 100_000
    python = sys.version.split()[0]
    results: dict[str, Any] = {"machine": f"{os.cpu_count()} cores, Python {python}"}
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn, n in (
            ("tick", bench_tick, n_tick),
            ("startup", bench_startup, n_start),
            ("burst", bench_burst, 1_000),
        ):
            proc, url = start_devserver(Path(tmp) / f"{name}.sqlite3")
            try:
                results[name] = await fn(url, n)
            finally:
                proc.terminate()
                proc.wait()
            print(name, json.dumps(results[name]), flush=True)
    results["apscheduler"] = await bench_apscheduler(n_tick, n_start)
    print("apscheduler", json.dumps(results["apscheduler"]), flush=True)
    return results


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child-startup":
        asyncio.run(child_startup(sys.argv[2], sys.argv[3]))
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "--child-apscheduler":
        asyncio.run(child_apscheduler(int(sys.argv[2])))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    ns = parser.parse_args()
    out = asyncio.run(main(ns))
    if ns.json:
        ns.json.write_text(json.dumps(out, indent=2) + "\n")
