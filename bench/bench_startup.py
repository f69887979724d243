"""Start-up from a mirror, timed again and again from the same mirror (issue 13's target).

    python -m bench.bench_startup --n 100000 --rounds 2 [--work DIR] [--code DIR ...]
        [--py-spy DIR]

Seeds `n` daily interval triggers pinned to the device on a devserver, lets a daemon adopt
them once (the mirror they leave is kept), then restarts a daemon from a fresh copy of that
mirror `rounds` times for each `--code` tree (a checkout of anyrtd: its `anyrtd` and
`bench`; default this one), the trees taken in turn within each round, so that a before and
an after are measured in the same minutes. Each restart reports, as `bench.bench_fire`'s
idle scenario does, `open_s` (`Daemon.open`) and `start_s` (open + `Daemon.start`: the
first sync and tick, until the daemon is ready), and beside them the time from the
process's spawn until it answered ready, the CPU the process had used by then (imports
included) and the load average; then how long after readiness the reconcile of every id,
spread over the ticks, took (its wall time and CPU, and the event loop's longest stall
meanwhile; none on a tree without it), and the resident memory then and at its peak.
With `--work` the devserver's records and the seeded mirror are kept there and reused by
the next run. With `--py-spy DIR` each restart is sampled from its spawn until it is ready
(`DIR/restart-ROUND-TREE.txt`, raw collapsed stacks for `python -m bench.profile_summary`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench.bench_fire import (
    IDLE_EVERY_S,
    REPO,
    Child,
    Setup,
    every_record,
    start_py_spy,
    stop_py_spy,
)


def cpu_s(pid: int) -> float:
    """Return the user + system CPU seconds process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CodeChild(Child):
    """A bench child run from another anyrtd tree (`code`)."""

    def __init__(self, code: Path, *args: Any, py_spy: Path | None = None) -> None:
        super().__init__(*args)
        self.code = code
        self.py_spy = py_spy

    async def start(self, limit_s: float = 600.0) -> dict[str, Any]:
        t0 = time.perf_counter()
        starting = asyncio.create_task(super().start(limit_s))
        spy = None
        if self.py_spy is not None:
            while self.proc is None and not starting.done():  # noqa: ASYNC110 (a turn or two)
                await asyncio.sleep(0.001)
            if self.proc is not None:
                spy = start_py_spy(self.pid, self.py_spy)
        try:
            ready = await starting
        finally:
            if spy is not None:
                stop_py_spy(spy)
        ready["spawn_to_ready_s"] = round(time.perf_counter() - t0, 3)
        ready["cpu_to_ready_s"] = round(cpu_s(self.pid), 2)
        return ready


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    work = Path(args.work)
    seed = work / "state.seed"
    results: list[dict[str, Any]] = []
    codes, trees = args.code, args.trees
    async with Setup("anyrtd", work) as setup:
        if not seed.exists():
            recs = [(f"idle{i:06d}", every_record(IDLE_EVERY_S + i % 1000)) for i in range(args.n)]
            await setup.write(recs, 1000)
            first = setup.child()
            await first.start()
            await first.wait_size(args.n, limit_s=900.0)
            await first.stop()
            shutil.copytree(setup.state, seed)
        for round_ in range(args.rounds):
            for code, tree in zip(codes, trees, strict=True):
                shutil.rmtree(setup.state)
                shutil.copytree(seed, setup.state)
                load = os.getloadavg()[0]
                child = CodeChild(
                    Path(code),
                    "anyrtd",
                    {"url": setup.url, "state": str(setup.state)},
                    work / f"restart-{round_}-{Path(code).name}.log",
                    py_spy=Path(args.py_spy) / f"restart-{round_}-{tree}.txt"
                    if args.py_spy
                    else None,
                )
                setup.children.append(child)
                ready = await child.start()
                held = await child.wait_size(args.n, limit_s=300.0)
                try:
                    settled = await child.ask("settled", limit_s=300.0)
                except RuntimeError:  # a tree from before the spread reconcile
                    settled = {}
                row = {
                    "round": round_,
                    "code": code,
                    "open_s": ready["open_s"],
                    "start_s": ready["start_s"],
                    "spawn_to_ready_s": ready["spawn_to_ready_s"],
                    "cpu_to_ready_s": ready["cpu_to_ready_s"],
                    "held_at_start": ready["size"],
                    "held": held["size"],
                    "spread_after_ready_s": settled.get("spread_s"),
                    "spread_cpu_s": settled.get("spread_cpu_s"),
                    "worst_stall_ms": settled.get("worst_stall_ms"),
                    "rss_mb_at_ready": round(held.get("rss_kb", 0) / 1024, 1),
                    "rss_mb_after_spread": round(settled.get("rss_kb", 0) / 1024, 1),
                    "peak_rss_mb": round(settled.get("hwm_kb", 0) / 1024, 1),
                    "load_1m_before": round(load, 2),
                    "load_1m_after": round(os.getloadavg()[0], 2),
                }
                await child.stop()
                print(json.dumps(row), flush=True)
                results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", default="/tmp/anyrtd-bench-startup")
    parser.add_argument("--code", action="append", help="an anyrtd tree to start (repeatable)")
    parser.add_argument("--py-spy", help="sample each restart until ready into this folder")
    args = parser.parse_args()
    args.code = args.code or [str(REPO)]
    args.trees = [Path(code).resolve().name for code in args.code]  # "." named by its folder
    Path(args.work).mkdir(parents=True, exist_ok=True)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
