"""The scheduler under test of `bench/bench_fire.py`, alone in a process of its own.

Started as `python -c "from bench.fire_child import main; main()" KIND PARAMS` from the
repository's root, where KIND is `anyrtd`, `aps-memory` or `aps-sqlite` and PARAMS a JSON
object. It answers one JSON line on stdout for each JSON command line on stdin, so that
the CPU time and memory it reports are this scheduler's alone (the devserver, the writer
of the records and the bench itself are other processes).

Every fire is measured from the program's side: the program notes `time.time()` the
moment it is called and compares it with the time it was due (`ctx.scheduled_at` for
anyrtd; for APScheduler, the due time the job's own trigger implies).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

PROBE = "bench:probe@v1"
"""The in-process program every benchmark trigger of anyrtd runs."""

SAMPLES: list[tuple[float, float]] = []
"""(due time, real start lag) of every probe call, in call order."""


def note(due: float) -> None:
    """Note one start: how late the program was called, measured now."""
    SAMPLES.append((due, time.time() - due))


async def anyrtd_probe(args: Mapping[str, Any], ctx: Any) -> None:
    """The anyrtd program: note the start against `ctx.scheduled_at`."""
    if ctx.scheduled_at is not None:
        note(ctx.scheduled_at)


async def aps_once_probe(due: float) -> None:
    """The APScheduler job of a burst: due at `due` (its DateTrigger's run date)."""
    note(due)


async def aps_interval_probe(anchor: float, every: float) -> None:
    """The APScheduler job of a spread: due at the last point of its grid anchor + k*every."""
    now = time.time()
    due = anchor + math.floor((now - anchor) / every) * every
    SAMPLES.append((due, now - due))


def memory_kb() -> dict[str, int]:
    """Return the resident set now and its peak (VmRSS, VmHWM) in KiB."""
    out = {"rss_kb": 0, "hwm_kb": 0}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            out["rss_kb"] = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            out["hwm_kb"] = int(line.split()[1])
    return out


def log_stream(path: str) -> TextIO:
    """Return a line-buffered stream to `path`, as stderr is to a serving scheduler."""
    return open(path, "a", buffering=1)  # open for the life of the process


def setup_log(path: str) -> None:
    """Log at INFO to `path` (APScheduler only when asked: `aps_log_info`)."""
    handler = logging.StreamHandler(log_stream(path))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


class AnyrtdUnderTest:
    """A real anyrtd daemon as `anyrtd serve` builds it (election gate, default tick)."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        from anyrtd.client import ServerClient
        from anyrtd.config import Config
        from anyrtd.daemon import Daemon
        from anyrtd.election import Election
        from anyrtd.logs import setup_logging

        setup_logging(params.get("log_level", "INFO"), env={}, stream=log_stream(params["log"]))
        if params.get("timer_log"):
            # The timer's line per batch prepared and started: its times, nothing else at DEBUG.
            logging.getLogger("anyrtd.timer").setLevel(logging.DEBUG)
        overrides = {k: params[k] for k in ("tick_s", "election_poll_s") if params.get(k)}
        config = Config(server=params["url"], state_dir=Path(params["state"]), **overrides)
        client = ServerClient(config.server)
        self.daemon = Daemon(
            config, client=client, gate=Election(client, poll_s=config.election_poll_s)
        )
        self.daemon.runner.install(PROBE, anyrtd_probe)
        import anyrtd

        self.code = str(Path(anyrtd.__file__).resolve().parent)
        """The anyrtd package this child runs (`bench_fire --anyrtd` checks it)."""

    async def start(self) -> dict[str, Any]:
        from anyrtd.serve import settle_heap

        t0 = time.perf_counter()
        await self.daemon.open()
        opened = time.perf_counter() - t0
        await self.daemon.start()
        started = time.perf_counter() - t0
        settle_heap()
        return {
            "anyrtd": self.code,
            "open_s": round(opened, 3),
            "start_s": round(started, 3),
            "peer": self.daemon.peer_id,
            "verdict": self.daemon.gate.verdict,
        }

    def size(self) -> int:
        return len(self.daemon.registry)

    async def command(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        if cmd["op"] == "resync":
            # The safety net's full read of every record (every `full_resync_s`), now: the
            # CPU it costs, to spread over its period in the idle figures.
            self.daemon.sync_stage._last_full = None  # due now, as at start
            c0, t0 = time.process_time(), time.perf_counter()
            await self.daemon.sync(0)
            await self.daemon.tick()
            return {
                "cpu_s": time.process_time() - c0,
                "wall_s": time.perf_counter() - t0,
                "every_s": self.daemon.sync_stage.resync_every(self.daemon.config.full_resync_s),
            }
        if cmd["op"] == "settled":
            # Until the reconcile of every id that a start spreads over the ticks after
            # readiness is done: its wall time and CPU, and the event loop's worst stall.
            c0, t0, worst = time.process_time(), time.perf_counter(), 0.0
            while getattr(self.daemon.apply, "spreading", False):
                t = time.perf_counter()
                await asyncio.sleep(0.001)
                worst = max(worst, time.perf_counter() - t - 0.001)
            return {
                "spread_s": round(time.perf_counter() - t0, 3),
                "spread_cpu_s": round(time.process_time() - c0, 3),
                "worst_stall_ms": round(worst * 1000, 1),
                **memory_kb(),
            }
        raise ValueError(f"anyrtd takes its triggers from the server, not {cmd['op']!r}")

    async def stop(self) -> None:
        await self.daemon.stop()


class ApschedulerUnderTest:
    """APScheduler 3's AsyncIOScheduler, with its memory store or SQLAlchemyJobStore."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        # As a user runs it: Python's logging unconfigured, so APScheduler's INFO lines (three
        # a job: added, running, executed) go nowhere; only a warning reaches stderr (the
        # log file). `aps_log_info` logs them at INFO to the file, to measure what they cost.
        if params.get("aps_log_info"):
            setup_log(params["log"])
        stores: dict[str, Any] = {}
        if params.get("sqlite"):
            from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore

            stores["default"] = SQLAlchemyJobStore(url=f"sqlite:///{params['sqlite']}")
        # Every job runs however late it is (no misfire skip, no coalescing), so that a
        # scheduler that falls behind shows it in the lag instead of dropping the runs.
        self.sched = AsyncIOScheduler(
            jobstores=stores,
            timezone="UTC",
            job_defaults={"misfire_grace_time": None, "coalesce": False, "max_instances": 1},
        )

    async def start(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.sched.start()
        return {"start_s": round(time.perf_counter() - t0, 3)}

    def size(self) -> int:
        return len(self.sched.get_jobs())

    async def command(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        from apscheduler.triggers.date import DateTrigger
        from apscheduler.triggers.interval import IntervalTrigger

        prefix, first, n = cmd["prefix"], int(cmd.get("first", 0)), int(cmd["n"])
        if cmd["op"] == "add_every":
            every = float(cmd["every"])
            for i in range(first, first + n):
                period = every + (i if cmd.get("stagger") else 0)
                anchor = time.time() + period
                self.sched.add_job(
                    aps_interval_probe,
                    IntervalTrigger(seconds=period, start_date=datetime.fromtimestamp(anchor, UTC)),
                    args=(anchor, period),
                    id=f"{prefix}{i:06d}",
                )
        elif cmd["op"] == "add_once":
            at = float(cmd["at"])
            when = datetime.fromtimestamp(at, UTC)
            for i in range(first, first + n):
                self.sched.add_job(
                    aps_once_probe, DateTrigger(when), args=(at,), id=f"{prefix}{i:06d}"
                )
        elif cmd["op"] == "calibrate":
            # Time adding `n` once jobs (due a day later), then take them out again.
            t0 = time.perf_counter()
            later = datetime.fromtimestamp(time.time() + 86_400, UTC)
            for i in range(first, first + n):
                self.sched.add_job(
                    aps_once_probe, DateTrigger(later), args=(0.0,), id=f"{prefix}{i}"
                )
            spent = time.perf_counter() - t0
            self.sched.remove_all_jobs()
            return {"add_s": spent}
        else:
            raise ValueError(f"unknown command {cmd['op']!r}")
        return {"added": n, "t": time.time()}

    async def stop(self) -> None:
        self.sched.shutdown(wait=False)


def stat(under_test: Any, size: bool = True) -> dict[str, Any]:
    """Return the process's CPU time, the probe's start count, the memory and the size.

    The size only when asked: APScheduler's SQLite store reads every job back to count them.
    """
    out = {
        "t": time.time(),
        "cpu_s": time.process_time(),
        "fires": len(SAMPLES),
        "last_due": max((due for due, _ in SAMPLES[-100:]), default=0.0),
        **memory_kb(),
    }
    if size:
        out["size"] = under_test.size()
    return out


async def serve(kind: str, params: Mapping[str, Any]) -> None:
    """Start the scheduler, answer commands until `stop`, then report every sample."""
    under_test: Any = AnyrtdUnderTest(params) if kind == "anyrtd" else ApschedulerUnderTest(params)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    reply({"ready": True, **(await under_test.start()), **stat(under_test)})
    while line := await reader.readline():
        cmd = json.loads(line)
        seq = cmd.get("seq")
        if cmd["op"] == "stat":
            reply(stat(under_test, cmd.get("size", True)), seq)
        elif cmd["op"] == "gc":
            gc.collect()
            reply(stat(under_test), seq)
        elif cmd["op"] == "stop":
            await under_test.stop()
            reply({"samples": SAMPLES, **stat(under_test)}, seq)
            return
        else:
            try:
                reply(await under_test.command(cmd), seq)
            except Exception as exc:
                reply({"error": f"{exc.__class__.__name__}: {exc}"}, seq)


def reply(body: Mapping[str, Any], seq: int | None = None) -> None:
    sys.stdout.write(json.dumps({**body, "seq": seq}) + "\n")
    sys.stdout.flush()


def main() -> None:
    kind, params = sys.argv[1], json.loads(sys.argv[2])
    if kind not in ("anyrtd", "aps-memory", "aps-sqlite"):
        raise SystemExit(f"unknown scheduler {kind!r}: expected anyrtd, aps-memory or aps-sqlite")
    asyncio.run(serve(kind, params))
