"""Measure the daemon's own CPU per fire in the pieces a fire always passes through, alone.

    python bench/bench_perfire.py [--fires 5000] [--rounds 5]

No server: (1) the record cache taking a `once`'s consumption and then the run's rollup, as
the daemon writes them; (2) the runner starting and finishing a no-op in-process program
with typical args (resolve, logger, args copy, budget, outcome); (3) the two INFO lines of
a fire (`firing …`, `run … ended ok`) formatted and written to /dev/null; (4) a fire's
transactions on a mirror in a temporary directory, ten runs each as in `spread-10k`: their
prepare, their note with their entries, their end with their two writes for the server,
and the outbox's acknowledgement of those. Each figure is CPU time (`time.process_time`)
per fire, the median of the rounds. Run it against two trees with `PYTHONPATH=TREE` to
compare them in one sitting.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from anyrtd.client import ServerClient
from anyrtd.clock import SystemClock
from anyrtd.logs import setup_logging
from anyrtd.mirror import Mirror
from anyrtd.program import ProgramContext
from anyrtd.records import RecordCache
from anyrtd.rows import Batch, EntryRow, RunRow
from anyrtd.runner import Runner
from anyrtd.vocab import RollupField

ARGS: dict[str, Any] = {"what": "water the plants", "n": 3, "tags": ["home", "daily"]}


def once_record(i: int) -> dict[str, Any]:
    return {
        "id": f"once-{i:06d}",
        "kind": "once",
        "spec": {"at": 1_900_000_000 + i},
        "program": "bench:noop@v1",
        "args": dict(ARGS),
        "owner": "anyrt-1",
        "_v": 1,
    }


def cache_round(n: int) -> float:
    cache = RecordCache()
    for i in range(n):
        cache.put(once_record(i))
    t0 = time.process_time()
    for i in range(n):
        rid = f"once-{i:06d}"
        cache.write(rid, {"enabled": False, RollupField.LAST_RUN_AT: 1_900_000_000.0 + i})
        cache.write(
            rid,
            {
                RollupField.LAST_RUN_AT: 1_900_000_000.0 + i,
                RollupField.LAST_STATUS: "ok",
                RollupField.LAST_DURATION_MS: 3,
                RollupField.RUN_COUNT: 1,
                RollupField.CONSECUTIVE_FAILURES: 0,
                RollupField.LAST_RUN_REF: str(uuid.uuid4()),
            },
        )
    return (time.process_time() - t0) / n


async def noop(args: Mapping[str, Any], ctx: ProgramContext) -> Mapping[str, Any]:
    return {"title": "noop"}


async def runner_round(n: int) -> float:
    transport = httpx.MockTransport(lambda request: httpx.Response(503))
    async with ServerClient("http://127.0.0.1:9", transport=transport) as client:
        runner = Runner(
            client=client,
            clock=SystemClock(),
            agent_name="bao",
            space="bench",
            commands={},
            timeout_s=60,
            extra_builtins={"bench:noop@v1": noop},
        )
        runs = [
            (
                RunRow(
                    str(uuid.uuid4()),
                    f"once-{i:06d}",
                    "bench:noop@v1",
                    "bench-device",
                    1_900_000_000.0,
                    1_900_000_000.0,
                ),
                {**ARGS, "i": i},
            )
            for i in range(n)
        ]
        t0 = time.process_time()
        await asyncio.gather(*(runner.start(row, args) for row, args in runs))
        return (time.process_time() - t0) / n


def log_round(n: int) -> float:
    with open(os.devnull, "w") as sink:
        setup_logging("INFO", env={}, stream=sink)
        fire, runs = logging.getLogger("anyrtd.firing"), logging.getLogger("anyrtd.runs")
        ids = [str(uuid.uuid4()) for _ in range(n)]
        t0 = time.process_time()
        for i, run_id in enumerate(ids):
            rid = f"once-{i:06d}"
            fire.info(
                "firing %s (%s)%s", rid, "bench:noop@v1", "", extra={"trigger": rid, "run": run_id}
            )
            runs.info(
                "run %s ended %s",
                run_id,
                "ok",
                extra={"trigger": rid, "run": run_id, "program": "bench:noop@v1"},
            )
        spent = time.process_time() - t0
        logging.getLogger().handlers.clear()
        return spent / n


def mirror_round(n: int, per_commit: int = 10) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        mirror = Mirror(Path(tmp) / "anyrtd.sqlite3")
        mirror.ensure_schema(create=True)
        seq, now = 1, 1_900_000_000.0
        t0 = time.process_time()
        for at in range(0, n, per_commit):
            ids = [f"cron-{i:06d}" for i in range(at, at + per_commit)]
            runs = [RunRow(uuid.uuid4().hex, t, "bench:noop@v1", "bench", now, now) for t in ids]
            mirror.commit(Batch(runs=runs), now)  # prepared
            entries = [EntryRow(t, "fp", "cron", True, now, now + 60.0) for t in ids]
            mirror.commit(Batch(runs=runs, entries=entries), now)  # noted started
            ended = Batch(runs=runs)
            for row in runs:
                row.status, row.ended_at = "ok", now + 0.001
                ended.write("agent_runs", row.run_id, {"runId": row.run_id, "status": "ok"})
                ended.write("agent_triggers", row.trigger_id or "", {"lastStatus": "ok"})
            mirror.commit(ended, now)
            mirror.ack_outbox(range(seq, seq + 2 * per_commit))
            seq += 2 * per_commit
        spent = time.process_time() - t0
        mirror.close()
        return spent / n


def median_us(rounds: int, one: Callable[[], float]) -> str:
    values = [one() * 1e6 for _ in range(rounds)]
    return f"{statistics.median(values):.1f} µs (rounds {min(values):.1f} to {max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fires", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args()
    n = ns.fires
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        "record cache, a once's consumption + its rollup:",
        median_us(ns.rounds, lambda: cache_round(n)),
    )
    print(
        "runner, a no-op in-process run start to outcome:",
        median_us(ns.rounds, lambda: asyncio.run(runner_round(n))),
    )
    print("the two INFO lines of a fire:", median_us(ns.rounds, lambda: log_round(n)))
    print(
        "mirror, a fire's transactions (10 runs each):",
        median_us(ns.rounds, lambda: mirror_round(n)),
    )


if __name__ == "__main__":
    main()
