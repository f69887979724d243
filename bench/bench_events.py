"""Measure event-trigger latency: a chat message written to the server → its program started.

    python bench/bench_events.py [--messages 300] [--burst 50] [--json out.json]

A real devserver subprocess (`anyrtd devserver --port 0`) and a real daemon (in this
process, system clock, the change feed long-polled as in production). One event trigger
is pinned to the daemon's device; its in-process program notes the wall time it starts.
Each message is timed from just before the write request is sent, so the figure includes
the write itself, the feed's wake-up, the matching, the mirror commit and the spawn.
Sequential: one message at a time, each waited for. Burst: `--burst` messages written
back to back, every one timed the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support import percentile, start_devserver

from anyrtd.client import Dataset, ServerClient, Upsert
from anyrtd.clock import SystemClock
from anyrtd.config import Config
from anyrtd.daemon import Daemon
from anyrtd.program import ProgramContext
from anyrtd.runner import Runner


def summary(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p95_ms": round(percentile(ms, 0.95), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
    }


async def bench(messages: int, burst: int) -> dict[str, Any]:
    started: dict[str, float] = {}
    arrived = asyncio.Event()

    async def mark(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        started[str(args["event"]["messageId"])] = time.time()
        arrived.set()

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_devserver(Path(tmp) / "dev.sqlite3")
        client = ServerClient(url)
        user = ServerClient(url)
        runner = Runner(
            client=client,
            clock=SystemClock(),
            agent_name="bao",
            space="bao",
            commands={},
            extra_builtins={"bench:mark@v1": mark},
        )
        daemon = Daemon(
            Config(server=url, state_dir=Path(tmp) / "state", tick_s=1.0),
            client=client,
            runner=runner,
        )
        try:
            await daemon.start()
            while daemon.places is None or daemon.peer_id is None:
                await daemon.ticks.next(within=2.0)
            chat_id = await user.child("bao", "bao/v1", "bao/chat/general")
            chat = Dataset("bao", chat_id, "chat_messages")
            fields = {
                "kind": "event",
                "spec": {"dataset": "chat_messages", "objectId": chat_id},
                "program": "bench:mark@v1",
                "owner": daemon.peer_id,
                "maxConsecutiveFailures": 1000,
            }
            await user.upsert(daemon.places.triggers, [Upsert("bench-events", fields)])
            while "bench-events" not in daemon.registry or not daemon.role.live.heads:
                await daemon.ticks.next(within=2.0)

            async def send(mid: str) -> float:
                sent = time.time()
                body = {"text": f"message {mid}", "author": "bench", "createdAt": sent}
                await user.upsert(chat, [Upsert(mid, body)])
                return sent

            sequential: list[float] = []
            for i in range(messages):
                mid = f"s{i:05d}"
                arrived.clear()
                sent = await send(mid)
                async with asyncio.timeout(10):
                    while mid not in started:
                        await arrived.wait()
                        arrived.clear()
                sequential.append((started[mid] - sent) * 1000)
            sends = {}
            for i in range(burst):
                mid = f"b{i:05d}"
                sends[mid] = await send(mid)
            async with asyncio.timeout(30):
                while not all(m in started for m in sends):
                    await arrived.wait()
                    arrived.clear()
            bursty = [(started[m] - t) * 1000 for m, t in sends.items()]
        finally:
            await daemon.stop()
            await user.aclose()
            proc.terminate()
            proc.wait(timeout=10)
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "load": os.getloadavg()[0],
        "sequential": summary(sequential),
        "burst": summary(bursty),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    result = asyncio.run(bench(opts.messages, opts.burst))
    text = json.dumps(result, indent=2)
    print(text)
    if opts.json:
        opts.json.write_text(text + "\n")
    p99 = result["sequential"]["p99_ms"]
    print(f"message written → program started, p99 {p99} ms (target < 200 ms)")


if __name__ == "__main__":
    main()
