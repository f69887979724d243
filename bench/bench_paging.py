"""A full read of many trigger records through the devserver's paging, as a daemon's start does.

Run from the repository's root:

    python -m bench.bench_paging [--records 100000] [--page 1000] [--rounds 2] [--src DIR]

Starts `anyrtd devserver` in a process of its own (from `--src`, a tree unpacked with
`git archive`, to measure another version), writes `--records` trigger records, then reads
them all with `ServerClient.query_all` (pages of `--page`, the daemon's full read) `--rounds`
times: the wall time of each read and the devserver's CPU time during it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from anyrtd.client import ServerClient, Upsert
from anyrtd.places import resolve_places

LINE = re.compile(r"^anyrtd devserver: device (\d+) (\S+) (http://\S+)$")


def cpu_s(pid: int) -> float:
    """Return the user and system CPU time of process `pid` so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(db: Path, src: Path | None) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    proc = subprocess.Popen(
        [sys.executable, "-m", "anyrtd", "devserver", "--port", "0", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=src or None,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if match := LINE.match(line.strip()):
            return proc, match.group(3)
    raise SystemExit("the devserver did not start")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start(Path(tmp) / "server.sqlite3", args.src)
        try:
            async with ServerClient(url, timeout=600.0) as client:
                places = await resolve_places(client, "bao")
                t0 = time.perf_counter()
                for first in range(0, args.records, 1000):
                    await client.upsert(
                        places.triggers,
                        [
                            Upsert(
                                f"t{i:06d}",
                                {"kind": "cron", "spec": {"every_s": 86_400}, "program": "p"},
                            )
                            for i in range(first, min(args.records, first + 1000))
                        ],
                    )
                out: dict[str, Any] = {
                    "records": args.records,
                    "page": args.page,
                    "seeding_s": round(time.perf_counter() - t0, 1),
                    "reads": [],
                }
                for _ in range(args.rounds):
                    c0, t0 = cpu_s(proc.pid), time.perf_counter()
                    got = await client.query_all(places.triggers, page_size=args.page)
                    wall, cpu = time.perf_counter() - t0, cpu_s(proc.pid) - c0
                    assert len(got) == args.records, len(got)
                    out["reads"].append({"wall_s": round(wall, 2), "server_cpu_s": round(cpu, 2)})
                out["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
                return out
        finally:
            proc.terminate()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--src", type=Path, help="the tree to run the devserver from")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args))))


if __name__ == "__main__":
    main()
