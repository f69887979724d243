"""What a command's supervisor (`anyrtd/runner/marks.py`) adds to its start: the time from
the spawn to the command's first instruction, alone and under the supervisor.

    python bench/bench_supervisor.py --runs 50

Each run spawns `date +%s.%N`, which prints (the command's own start) the way
the runner does (`spawn_in_group`), and takes the median and p90 of start - spawn for each
way. Small counts check that it works; the lead takes the figures on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from anyrtd.runner.marks import SUPERVISOR, Marks
from anyrtd.runner.process import spawn_in_group

PROBE = ("/usr/bin/env", "date", "+%s.%N")


async def one(argv: tuple[str, ...]) -> float:
    stop: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    began = 0.0

    def mark() -> None:
        nonlocal began
        began = time.time()

    proc, out_r, err_r = await spawn_in_group(
        argv, cwd=None, env=dict(os.environ), before_spawn=mark, stop=stop
    )
    assert proc.stdin is not None
    proc.stdin.close()
    await proc.wait()
    with os.fdopen(out_r, "rb") as out:
        started = float(out.read().split()[0])
    os.close(err_r)
    return started - began


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        marks = Marks(Path(tmp) / "anyrtd.runs")
        marks.open()
        ways = {
            "alone": lambda i: PROBE,
            "supervised": lambda i: (
                ("/bin/sh", "-c", SUPERVISOR, "anyrtd-run", marks.prefix(f"r{i}"), *PROBE)
            ),
        }
        for name, argv in ways.items():
            lags = sorted([await one(argv(i)) for i in range(runs)])
            p90 = lags[int(0.9 * (len(lags) - 1))]
            print(
                f"{name:>10}: spawn to the command's start, median "
                f"{statistics.median(lags) * 1000:.2f} ms, p90 {p90 * 1000:.2f} ms ({runs} runs)"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    asyncio.run(main(parser.parse_args().runs))
    sys.exit(0)
