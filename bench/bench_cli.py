"""How long the `anyrtd` command takes to start, against `python -c pass`.

    python bench/bench_cli.py [--runs 20] [--src DIR] [--json out.json]

Each command runs `--runs` times as a fresh process (as `python -m anyrtd ...`, and the
installed `anyrtd` script when it is on PATH); the figures are the minimum and the median
wall time, and the minimum of Python's own `-X importtime` total for `import anyrtd.cli`.
`--src DIR` puts another checkout first on the module path (e.g. an older commit unpacked
with `git archive`) to compare before and after on the same interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def wall(argv: list[str], env: dict[str, str], runs: int) -> dict[str, float]:
    """Return the min and median wall seconds of `runs` fresh runs of `argv`."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return {"min_s": min(times), "median_s": statistics.median(times)}


def import_us(python: str, module: str, env: dict[str, str], runs: int) -> int:
    """Return the smallest cumulative `-X importtime` of `module`, in microseconds."""
    best = None
    for _ in range(runs):
        out = subprocess.run(
            [python, "-X", "importtime", "-c", f"import {module}"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        line = next(x for x in reversed(out.splitlines()) if x.rstrip().endswith(f"| {module}"))
        total = int(line.split("|")[1])
        best = total if best is None else min(best, total)
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--src", type=Path, help="a checkout to import anyrtd from instead")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    env = {**os.environ, "ANYRTD_CONFIG": os.devnull}
    if args.src is not None:
        env["PYTHONPATH"] = str(args.src.resolve())
    sock = Path(tempfile.mkdtemp()) / "nobody.sock"
    env["ANYRTD_LISTEN"] = f"unix:{sock}"  # nothing listens: `triggers list` fails fast
    py = sys.executable
    where = subprocess.run(
        [py, "-c", "import anyrtd; print(anyrtd.__file__)"], env=env, capture_output=True, text=True
    ).stdout.strip()

    results: dict[str, Any] = {"anyrtd": where, "runs": args.runs}
    cases = {
        "python -c pass": [py, "-c", "pass"],
        "python -m anyrtd --help": [py, "-m", "anyrtd", "--help"],
        "python -m anyrtd triggers list": [py, "-m", "anyrtd", "triggers", "list"],
    }
    script = shutil.which("anyrtd")
    if script is not None and args.src is None:
        cases["anyrtd --help"] = [script, "--help"]
        cases["anyrtd triggers list"] = [script, "triggers", "list"]
    for name, argv in cases.items():
        results[name] = wall(argv, env, args.runs)
    results["import anyrtd.cli (importtime, us)"] = import_us(py, "anyrtd.cli", env, args.runs)

    base = results["python -c pass"]["min_s"]
    print(f"anyrtd from {where}, {args.runs} runs each")
    for name in cases:
        r = results[name]
        extra = f"  (+{r['min_s'] - base:.3f} s)" if name != "python -c pass" else ""
        print(f"{name:34} min {r['min_s']:.3f} s  median {r['median_s']:.3f} s{extra}")
    print(f"import anyrtd.cli: {results['import anyrtd.cli (importtime, us)'] / 1000:.1f} ms")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
