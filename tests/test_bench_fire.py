"""A smoke run of the fire-lag benchmark: its smallest scenario produces sane figures.

Never a timing threshold: the figures are measured on a shared machine; what this checks
is that every run started, was measured from the program's side and was recorded, and
that the records' claims agree with what the programs saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_quick_burst_measures_every_start_and_record(tmp_path: Path) -> None:
    out = tmp_path / "fire.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_fire",
            "--quick",
            "--scenario",
            "burst-1k",
            "--scheduler",
            "anyrtd",
            "--json",
            str(out),
        ],
        cwd=REPO,
        check=True,
        timeout=120,
        capture_output=True,
    )
    figures = json.loads(out.read_text())["burst-1k"]["anyrtd"]
    n = figures["triggers"]
    assert n > 0
    assert figures["started"] == n
    lag = figures["lag"]
    assert lag["samples"] == n
    assert 0 <= lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"] < 60_000
    assert figures["cpu_ms_per_fire_until_last_start"] > 0
    records = figures["records"]
    assert records["recorded"] == n
    # A record's startedAt is stamped as its program starts (to the millisecond), so no
    # record claims a later start than its program saw; the last record reaches the server
    # after the last start (both figures rounded to 10 ms at most).
    assert records["largest_claimed_lag_ms"] <= lag["max_ms"] + 1.0
    assert records["all_recorded_s"] >= lag["max_ms"] / 1000 - 0.01
