"""The control API flooded, then held open by idle connections (issue 15 items 4 and 5).

`anyrtd serve` listens on TCP with systemd's default descriptor limit (1,024) and runs an
every-second command trigger (breaker at 3 failures) and `once` records due during each
phase. Phase one: `GET /triggers` at a concurrency of 1,000 for 10 s. Phase two: 2,000
connections that send half a request and wait, held for 15 s, while `/healthz` is asked on
a fresh connection every 200 ms. Promised for both phases: the trigger's fire lag p99 under
50 ms, no failed run, no trigger auto-disabled, every `once` once, `/healthz` answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.faults.common import (
    Result,
    Serve,
    Server,
    Space,
    every,
    family_run,
    marker_program,
    once,
    percentile,
    settle,
)

ROUNDS = 1_000  # the flood's concurrency; the idle connections are twice as many
QUICK = 200
MARK = "faults:mark@v1"
FLOOD_S = 10.0
IDLE_S = 15.0
LAG_P99_LIMIT_MS = 50.0
IDLE_COUNT: int | None = None  # idle connections; twice the flood's concurrency unless set


async def flood(base: str, concurrency: int, seconds: float) -> Counter[str]:
    """GET /triggers from `concurrency` workers for `seconds`; count the outcomes."""
    outcomes: Counter[str] = Counter()
    loop = asyncio.get_running_loop()
    stop = loop.time() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while loop.time() < stop:
                try:
                    async with session.get(f"{base}/triggers") as resp:
                        await resp.read()
                        outcomes[str(resp.status)] += 1
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    outcomes[type(exc).__name__] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


async def idle(
    host: str, port: int, count: int, seconds: float, probe: Any
) -> tuple[Counter[str], list[float]]:
    """Hold `count` half-sent requests open for `seconds` while `probe` asks /healthz."""
    outcomes: Counter[str] = Counter()
    held: list[asyncio.StreamWriter] = []
    readers: list[asyncio.StreamReader] = []
    latencies: list[float] = []
    try:
        opening = asyncio.get_running_loop().time() + 20.0  # a daemon that stops accepting
        for _ in range(count):
            if asyncio.get_running_loop().time() > opening:
                outcomes["not opened in 20 s"] += 1
                continue
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
            except (OSError, TimeoutError) as exc:
                outcomes[f"connect {type(exc).__name__}"] += 1
                continue
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            held.append(writer)
            readers.append(reader)
        outcomes["opened"] = len(held)
        loop = asyncio.get_running_loop()
        stop = loop.time() + seconds
        while loop.time() < stop:
            latencies.append(await asyncio.to_thread(probe))
            await asyncio.sleep(0.2)
        outcomes["dropped by the daemon"] = sum(1 for r in readers if r.at_eof())
    finally:
        for writer in held:
            writer.close()
        for writer in held:
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    return outcomes, latencies


def run(work: Path, rounds: int) -> Result:
    result = Result("flood")
    concurrency = rounds
    idle_count = IDLE_COUNT if IDLE_COUNT is not None else 2 * concurrency
    tag = f"flood-{time.time_ns()}"
    started = work / "started"
    server = Server(work).start()
    serve = Serve(
        work,
        server.url,
        programs={MARK: marker_program(started)},
        env={"ANYRTD_FAULTS_TAG": tag},
        listen="127.0.0.1:0",
        tick=0.5,
    )
    space = Space(server.url)
    onces: list[str] = []
    phases: dict[str, tuple[float, float]] = {}
    figures: dict[str, Any] = {}
    with family_run(result, serve, server, tag):
        for n in range(80):  # enough records that each GET /triggers does some work
            space.put({f"idle-{n:02d}": every(3600, MARK)})
        space.put({"tick1": every(1, MARK, maxConsecutiveFailures=3)})
        serve.start()
        host, _, port = serve.listen.rpartition(":")
        base = f"http://{serve.listen}"
        calm = time.time()
        time.sleep(5.0)  # the baseline: the same machine, no flood
        phases["baseline"] = (calm, time.time())

        def probe() -> float:
            began = time.monotonic()
            try:
                httpx.get(f"{base}/healthz", timeout=5)
            except httpx.HTTPError:
                return -1.0
            return time.monotonic() - began

        for name, seconds in (("flood", FLOOD_S), ("idle", IDLE_S)):
            now = time.time()
            batch = {f"once-{name}-{k}": once(now + 1 + k * 2, MARK) for k in range(4)}
            space.put(batch)
            onces += batch
            began = time.time()
            if name == "flood":
                outcomes = asyncio.run(flood(base, concurrency, seconds))
                figures["flood_answers"] = dict(outcomes)
            else:
                outcomes, latencies = asyncio.run(idle(host, int(port), idle_count, seconds, probe))
                figures["idle_connections"] = dict(outcomes)
                answered = [s for s in latencies if s >= 0]
                figures["idle_healthz_failed"] = len(latencies) - len(answered)
                figures["idle_healthz_max_ms"] = round(max(answered, default=0.0) * 1000, 1)
            phases[name] = (began, time.time())
            serve.check_alive()
        figures["log_bytes"] = serve.log.stat().st_size
        figures["log_tracebacks"] = serve.log_text().count("Traceback (most recent call last)")
        tick1 = serve.get("/triggers/tick1")
        runs, missing = settle(space, started, onces, timeout=60)
        if missing:
            result.notes.append(missing)
        serve.stop()
    if result.error is not None:
        return result

    def lags(phase: str) -> list[float]:
        lo, hi = phases[phase]
        return [
            float(r["startedAt"]) - float(r["scheduledAt"])
            for r in runs
            if r.get("triggerId") == "tick1"
            and r.get("scheduledAt") is not None
            and lo <= float(r["scheduledAt"]) <= hi
        ]

    per_once = Counter(r.get("triggerId") for r in runs)
    for phase in ("flood", "idle"):
        got = lags(phase)
        lo, hi = phases[phase]
        result.at_most(
            f"{phase}: fire lag p99 (ms)", round(percentile(got, 0.99) * 1000), LAG_P99_LIMIT_MS
        )
        result.zero(f"{phase}: occurrences missed", max(0, int(hi - lo) - 1 - len(got)))
        figures[f"{phase}_lag_max_ms"] = round(max(got, default=0.0) * 1000)
    failed = [r for r in runs if r.get("status") == "FAILED"]
    result.zero("failed runs", len(failed))
    result.zero("triggers auto-disabled", int(tick1.get("lastStatus") == "auto_disabled"))
    result.zero("once fired twice", sum(1 for rid in onces if per_once[rid] > 1))
    result.zero("once never fired", sum(1 for rid in onces if per_once[rid] == 0))
    result.zero("idle: /healthz unanswered", figures.get("idle_healthz_failed", 0))
    base_lags = lags("baseline")
    figures.update(
        concurrency=concurrency,
        idle_count=idle_count,
        baseline_lag_p99_ms=round(percentile(base_lags, 0.99) * 1000, 1),
        failed_error_types=dict(Counter(str(r.get("errorType")) for r in failed)),
    )
    result.figures.update(figures)
    return result
