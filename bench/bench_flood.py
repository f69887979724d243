"""Benchmark an every-second trigger's timing while `GET /triggers` floods the control API.

Run: `python bench/bench_flood.py [--triggers 1000] [--concurrency 1000] [--flood 10]
[--idle N] [--nofile N] [--json FILE]` (issue 15, items 4 and 5). With `--idle 1100
--nofile 1024 --concurrency 0` it holds 1,100 half-sent requests open for `--flood`
seconds instead of flooding, against a daemon limited to 1,024 descriptors.

Three processes beside this one: the devserver, a real `anyrtd serve` (TCP control API)
holding `--triggers` adopted triggers (every day, so `GET /triggers` is heavy but they do
not fire) and one every-second command trigger (`/bin/true`), and a load generator (this
script again, with `--load`) that keeps `--concurrency` aiohttp clients sending
`GET /triggers` back to back for `--flood` seconds. The fire lag is read from the run
records the daemon wrote to the devserver (`startedAt - scheduledAt`), for the seconds
before the flood, during it and after it; a missed occurrence is a second of the
trigger's grid with no run. The daemon's CPU time and the machine's load average are
reported beside them: the figures are only comparable at a similar load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from anyrtd.client import ServerClient, Upsert
from anyrtd.places import resolve_places

LINE = re.compile(r"^anyrtd devserver: device \d+ (\S+) (http://\S+)$")
LISTENING = re.compile(r"control API listening on (\S+)")
PROBE = "flood-probe"


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def anyrtd() -> list[str]:
    exe = shutil.which("anyrtd")
    return [exe] if exe else [sys.executable, "-m", "anyrtd"]


# --------------------------------------------------------------------------- the load generator


async def load(url: str, concurrency: int, seconds: float) -> None:
    """Keep `concurrency` clients sending GET /triggers for `seconds`; print JSON."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 2 * concurrency + 256)), hard))
    statuses: dict[str, int] = {}
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    end = time.monotonic() + seconds
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as client:

        async def worker() -> None:
            while time.monotonic() < end:
                t0 = time.perf_counter()
                try:
                    async with client.get("/triggers") as resp:
                        await resp.read()
                        key = str(resp.status)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    key = type(exc).__name__
                    await asyncio.sleep(0.05)  # a refused client retries, not in a tight loop
                latencies.append(time.perf_counter() - t0)
                statuses[key] = statuses.get(key, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    ok = statuses.get("200", 0)
    print(
        json.dumps(
            {
                "requests": sum(statuses.values()),
                "answered_200_per_s": round(ok / seconds, 1),
                "statuses": statuses,
                "latency_p50_ms": round((pct(latencies, 50) or 0) * 1000, 1),
                "latency_p99_ms": round((pct(latencies, 99) or 0) * 1000, 1),
            }
        )
    )


# --------------------------------------------------------------------------- the daemon side


def start_devserver(db: Path) -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen(
        [*anyrtd(), "devserver", "--port", "0", "--db", str(db)],
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


def start_serve(
    tmp: Path, url: str, nofile: int | None = None
) -> tuple[subprocess.Popen[bytes], str, Path]:
    config = tmp / "anyrtd.toml"
    config.write_text('[programs."bench:true@v1"]\nargv = ["/bin/true"]\n')
    log = tmp / "serve.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [
                *anyrtd(),
                "serve",
                "--config",
                str(config),
                "--server",
                url,
                "--state-dir",
                str(tmp / "state"),
                "--listen",
                "127.0.0.1:0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=None if nofile is None else lambda: limit_nofile(nofile),
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = LISTENING.search(log.read_text(errors="replace"))
        if match:
            return proc, f"http://{match.group(1)}", log
        if proc.poll() is not None:
            raise RuntimeError(f"anyrtd serve exited:\n{log.read_text()}")
        time.sleep(0.1)
    raise RuntimeError("anyrtd serve did not listen")


def limit_nofile(n: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


async def hold_idle(control: str, n: int) -> list[asyncio.StreamWriter]:
    """Open `n` connections at once, each sending half a request head and nothing more;
    return those that got in within 3 s."""
    host, _, port = control.removeprefix("http://").rpartition(":")

    async def one() -> asyncio.StreamWriter | None:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 3)
        except (OSError, TimeoutError):
            return None  # the kernel's queue is full: that one never got in
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        return writer

    return [w for w in await asyncio.gather(*(one() for _ in range(n))) if w is not None]


async def watch_health(control: str, until: float) -> dict[str, Any]:
    """GET /healthz twice a second until `until`; return its latency and failures."""
    latencies: list[float] = []
    failures = 0
    async with httpx.AsyncClient(base_url=control, timeout=5) as c:
        while time.time() < until:
            t0 = time.perf_counter()
            try:
                ok = (await c.get("/healthz")).status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append((time.perf_counter() - t0) * 1000)
            failures += not ok
            await asyncio.sleep(0.5)
    return {
        "checks": len(latencies),
        "failed": failures,
        "p50_ms": round(pct(latencies, 50) or 0, 1),
        "max_ms": round(max(latencies), 1) if latencies else None,
    }


async def seed(url: str, peer: str, n: int) -> None:
    """Write n daily triggers and the every-second probe, all pinned to the device."""
    async with ServerClient(url, timeout=60) as client:
        places = await resolve_places(client, "bao")
        ids = [f"flood-{i:05d}" for i in range(n)]
        for start in range(0, n, 500):
            batch = [
                Upsert(
                    rid,
                    {
                        "kind": "cron",
                        "name": f"Daily {i}",
                        "spec": {"every_s": 86400},
                        "program": "bench:true@v1",
                        "args": {"n": i, "note": "x" * 40},
                        "owner": peer,
                        "enabled": True,
                    },
                )
                for i, rid in enumerate(ids[start : start + 500], start)
            ]
            await client.upsert(places.triggers, batch)
        probe = {
            "kind": "cron",
            "name": "Every second",
            "spec": {"every_s": 1},
            "program": "bench:true@v1",
            "owner": peer,
            "enabled": True,
        }
        await client.upsert(places.triggers, [Upsert(PROBE, probe)])


async def probe_runs(url: str) -> list[dict[str, Any]]:
    async with ServerClient(url, timeout=60) as client:
        places = await resolve_places(client, "bao")
        records = await client.query_all(places.runs, filter={"triggerId": PROBE})
    return [dict(r) for r in records]


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def window(runs: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """Return the probe's lag and missed seconds for the occurrences due in [start, end)."""
    due = sorted(
        {r["scheduledAt"]: r for r in runs if r.get("scheduledAt") is not None}.values(),
        key=lambda r: r["scheduledAt"],
    )
    inside = [r for r in due if start <= r["scheduledAt"] < end]
    lags = [max(0.0, r["startedAt"] - r["scheduledAt"]) * 1000 for r in inside]
    expected = 0
    if due:
        # The grid points first + k (k whole) of the every-second trigger in [start, end).
        first = due[0]["scheduledAt"]
        lo = max(start, first)
        expected = max(0, math.ceil(end - first - 1e-6) - math.ceil(lo - first - 1e-6))
    failed = sum(1 for r in inside if r.get("status") != "ok")
    return {
        "seconds": round(end - start, 1),
        "runs": len(inside),
        "missed": max(0, expected - len(inside)),
        "failed": failed,
        "lag_p50_ms": round(pct(lags, 50) or 0, 1),
        "lag_p99_ms": round(pct(lags, 99) or 0, 1),
        "lag_max_ms": round(max(lags), 1) if lags else None,
    }


async def wait_adopted(control: str, want: int) -> None:
    deadline = time.monotonic() + 300
    async with httpx.AsyncClient(base_url=control, timeout=60) as c:
        while time.monotonic() < deadline:
            resp = await c.get("/triggers")
            if resp.status_code == 200:
                items = resp.json()
                armed = [t for t in items if t.get("state") in ("scheduled", "running")]
                if len(armed) >= want:
                    return
            await asyncio.sleep(1)
    raise RuntimeError("the triggers were not adopted in 300 s")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.idle + 1024)), hard))
    tmp = Path(tempfile.mkdtemp(prefix="bench-flood-"))
    devserver, peer, url = start_devserver(tmp / "dev.sqlite3")
    serve: subprocess.Popen[bytes] | None = None
    try:
        await seed(url, peer, args.triggers)
        serve, control, log = start_serve(tmp, url, args.nofile)
        await wait_adopted(control, args.triggers + 1)
        t_before = time.time()
        await asyncio.sleep(args.calm)
        cpu0, t_flood = cpu_s(serve.pid), time.time()
        load_avg = os.getloadavg()[0]
        idle = await hold_idle(control, args.idle)
        watcher = asyncio.create_task(watch_health(control, t_flood + args.flood))
        out = b""
        if args.concurrency:
            loader = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--load",
                control,
                "--concurrency",
                str(args.concurrency),
                "--flood",
                str(args.flood),
                stdout=subprocess.PIPE,
            )
            out, _ = await loader.communicate()
        health_during = await watcher
        for writer in idle:
            writer.close()
        t_after, cpu1 = time.time(), cpu_s(serve.pid)
        load_during = os.getloadavg()[0]
        await asyncio.sleep(args.calm)
        t_end = time.time()
        # The run records reach the devserver through the outbox: wait for the last ones.
        deadline = time.monotonic() + 60
        runs = await probe_runs(url)
        while time.monotonic() < deadline:
            if any(r.get("scheduledAt", 0) >= t_end - 2 for r in runs):
                break
            await asyncio.sleep(1)
            runs = await probe_runs(url)
        async with httpx.AsyncClient(base_url=control, timeout=30) as c:
            health = (await c.get("/healthz")).json()
            probe = (await c.get(f"/triggers/{PROBE}")).json()
        flood = json.loads(out.decode()) if out.strip() else {}
        return {
            "before": window(runs, t_before + 1, t_flood),
            "during": window(runs, t_flood, t_after),
            "after": window(runs, t_after, t_end - 1),
            "healthz_during": health_during,
            "idle_connections_held": len(idle),
            "flood": {
                **flood,
                "concurrency": args.concurrency,
                "seconds": args.flood,
                "daemon_cpu_s": round(cpu1 - cpu0, 2),
            },
            "probe": {
                "enabled": probe.get("enabled"),
                "consecutiveFailures": probe.get("consecutiveFailures"),
                "health": health.get("status"),
            },
            "setup": {
                "triggers": args.triggers,
                "nofile": args.nofile,
                "cpus": os.cpu_count(),
                "load_avg_1m_before": round(load_avg, 2),
                "load_avg_1m_during": round(load_during, 2),
                "log_bytes": log.stat().st_size,
            },
        }
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(timeout=60)
        devserver.terminate()
        devserver.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--flood", type=float, default=10.0, help="seconds of flood")
    parser.add_argument("--calm", type=float, default=10.0, help="seconds before and after")
    parser.add_argument("--idle", type=int, default=0, help="half-sent connections to hold")
    parser.add_argument("--nofile", type=int, help="the daemon's soft and hard RLIMIT_NOFILE")
    parser.add_argument("--json", type=Path, help="Also write the figures to this file.")
    parser.add_argument("--load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        asyncio.run(load(args.load, args.concurrency, args.flood))
        return
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
