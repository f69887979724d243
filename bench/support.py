"""What the benchmarks share: a devserver subprocess and percentiles."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

LINE = re.compile(r"^anyrtd devserver: device (\d+) (\S+) (http://\S+)$")


def start_devserver(db: Path) -> tuple[subprocess.Popen[str], str]:
    """Start `anyrtd devserver` on a free port; return the process and its URL."""
    exe = shutil.which("anyrtd")
    cmd = [exe] if exe else [sys.executable, "-m", "anyrtd"]
    proc = subprocess.Popen(
        [*cmd, "devserver", "--port", "0", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        match = LINE.match(line.strip())
        if match:
            return proc, match.group(3)
    raise SystemExit("the devserver did not start")


def percentile(values: list[float], q: float) -> float:
    """Return the `q` quantile (0 to 1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
