"""Run the fault suite: `python -m bench.faults [--only NAME ...] [--rounds N] [--quick]`.

Prints one table (every promise of every family, its figure and whether it held) and
writes the figures as JSON (`--json`, default `faults.json`). A family whose harness
cannot run here (no permission to mount a tmpfs, say) is listed as skipped with the reason.
Exits 1 when a promise broke, so CI can run the quick mode.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.faults.common import Result, load
from bench.faults.suite import FAMILIES, run_family


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def table(results: list[Result]) -> str:
    rows = [("family", "promise", "figure", "expected", "")]
    for r in results:
        if r.skipped:
            rows.append((r.family, "skipped", r.skipped, "", "SKIP"))
            continue
        if r.error:
            rows.append((r.family, "harness error", r.error[:70], "", "ERROR"))
        for c in r.checks:
            rows.append((r.family, c.name, str(c.value), c.expect, "ok" if c.ok else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    parser.add_argument(
        "--only", action="append", choices=list(FAMILIES), help="Run this family (repeatable)."
    )
    parser.add_argument("--rounds", type=int, help="Rounds (or count) for every family run.")
    parser.add_argument("--quick", action="store_true", help="Each family's small count.")
    parser.add_argument("--json", default="faults.json", help="Where to write the figures.")
    parser.add_argument("--keep", help="Keep each family's logs and state under this directory.")
    ns = parser.parse_args(argv)
    # SIGTERM (and SIGINT, even in a background job) end the run through its clean-ups
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    names = ns.only or list(FAMILIES)
    started = dt.datetime.now(dt.UTC)
    report: dict[str, Any] = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "load_at_start": load(),
        "cpus": os.cpu_count(),
        "quick": ns.quick,
        "families": [],
    }
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="anyrtd-faults-") as scratch:
        root = Path(ns.keep) if ns.keep else Path(scratch)
        for name in names:
            print(f"== {name}", file=sys.stderr, flush=True)
            result = run_family(name, root / name, ns.rounds, ns.quick)
            results.append(result)
            report["families"].append(result.as_json())
            Path(ns.json).write_text(json.dumps(report, indent=2) + "\n")
            status = "skipped" if result.skipped else ("ok" if result.ok else "FAILED")
            print(f"   {status} in {result.seconds:.0f} s", file=sys.stderr, flush=True)
    report["load_at_end"] = load()
    Path(ns.json).write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(
        f"\n{report['date']}, commit {report['commit']}, load {report['load_at_start']} -> "
        f"{report['load_at_end']}; figures in {ns.json}"
    )
    return 0 if all(r.ok or r.skipped for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
