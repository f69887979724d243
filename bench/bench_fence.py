"""Exactly once across devices when replication is slower than a tick (issue 16).

Starts `anyrtd devserver --devices 3 --replicated --sync-delay D` and three real
`anyrtd serve` daemons (tick 1 s, election poll 1 s), then writes unassigned `once`
records across the three replicas while the active role moves three times and the
device holding the role is partitioned for a while. Each device also has a pinned
cron every 5 s. At the end it counts the `agent_runs` records per trigger:
fired twice, never fired, and pinned cron occurrences fired more than once or missed.

    python bench/bench_fence.py --delays 0.5,1,2,5 --count 90 --json out.json

`--cut registry` cuts the holder off from the devices registry instead (its reads fail,
so it keeps believing it is active); `--hold S` sets the daemons' `takeover_hold_s`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from anyrtd.client import ServerClient, Upsert
from anyrtd.places import resolve_places

LINE = re.compile(r"^anyrtd devserver: device (\d+) (\S+) (http://\S+)$")
PROGRAM = "bench:ok@v1"
CRON_EVERY_S = 5


def command() -> list[str]:
    exe = shutil.which("anyrtd")
    return [exe] if exe else [sys.executable, "-m", "anyrtd"]


class Cluster:
    """A replicated devserver and one `anyrtd serve` per device, in a scratch directory."""

    def __init__(
        self, tmp: Path, delay: float, tick: float, poll: float, hold: float | None = None
    ) -> None:
        self.tmp = tmp
        self.hold = hold
        self.delay = delay
        self.tick = tick
        self.poll = poll
        self.server: subprocess.Popen[str] | None = None
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        self.peers: list[str] = []

    def start(self) -> None:
        self.server = subprocess.Popen(
            [
                *command(),
                "devserver",
                "--port",
                "0",
                "--devices",
                "3",
                "--db",
                str(self.tmp / "dev.sqlite3"),
                "--sync-delay",
                str(self.delay),
            ],
            stdout=subprocess.PIPE,
            stderr=(self.tmp / "devserver.log").open("w"),
            text=True,
            start_new_session=True,
        )
        assert self.server.stdout is not None
        for line in self.server.stdout:
            match = LINE.match(line.strip())
            if match:
                self.peers.append(match.group(2))
                self.urls.append(match.group(3))
            if len(self.urls) == 3:
                break
        if len(self.urls) != 3:
            raise SystemExit("the devserver did not start")
        for i, url in enumerate(self.urls, 1):
            self.daemons.append(self._serve(i, url))

    def _serve(self, index: int, url: str) -> subprocess.Popen[bytes]:
        config = self.tmp / f"d{index}.toml"
        config.write_text(
            f"grace_s = 1.0\nelection_poll_s = {self.poll}\n"
            + (f"takeover_hold_s = {self.hold}\n" if self.hold is not None else "")
            + f'[programs."{PROGRAM}"]\nargv = ["true"]\n'
        )
        return subprocess.Popen(
            [
                *command(),
                "serve",
                "--config",
                str(config),
                "--server",
                url,
                "--state-dir",
                str(self.tmp / f"d{index}"),
                "--tick",
                str(self.tick),
                "--listen",
                f"unix:{self.tmp / f'd{index}.sock'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.tmp / f"d{index}.log").open("w"),
            start_new_session=True,
        )

    def stop(self) -> None:
        for proc in [*self.daemons, *([self.server] if self.server else [])]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.daemons, *([self.server] if self.server else [])]:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


async def registry(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        body: dict[str, Any] = (await http.get("/v1/devices")).json()
        return body


async def admin(url: str, path: str, body: dict[str, Any] | None = None) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        (await http.post(f"/_dev/{path}", json=body or {})).raise_for_status()


async def activate(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        (await http.post("/v1/devices/activate", json={"app": "bao"})).raise_for_status()


async def wait_for(check: Any, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def scenario(
    cluster: Cluster,
    count: int,
    window: float,
    cut: str,
    cut_lead: float | None = None,
    cut_for: float | None = None,
) -> dict[str, Any]:
    urls, peers = cluster.urls, cluster.peers

    async def all_registered() -> bool:
        view = await registry(urls[0])
        rows = [d for d in view["devices"] if "bao" in d.get("apps", {})]
        return len(rows) == 3 and view["active"].get("bao") is not None

    await wait_for(all_registered, 60, "three registered devices and a winner")
    clients = [ServerClient(u) for u in urls]
    places = [await resolve_places(c, "bao") for c in clients]
    crons = {f"pin-{i}": peers[i] for i in range(3)}
    for i, (rid, peer) in enumerate(crons.items()):
        fields = {
            "name": rid,
            "kind": "cron",
            "spec": {"cron": f"* * * * * */{CRON_EVERY_S}"},
            "program": PROGRAM,
            "owner": peer,
        }
        await clients[i].upsert(places[i].triggers, [Upsert(rid, fields)])
    # Let the first holder's takeover settle before the clock of the scenario starts.
    await asyncio.sleep(3 * cluster.tick + cluster.delay)
    started = time.time()
    moves: list[tuple[float, str]] = []
    partition: dict[str, Any] = {}
    ids: list[str] = []
    every = window / count
    move_at = [window * f for f in (0.22, 0.5, 0.78)]
    lead = window * (0.5 - 0.33) if cut_lead is None else cut_lead
    cut_at = window * 0.5 - lead
    heal_at = window * 0.61 if cut_for is None else cut_at + cut_for

    async def cut_off(device: int, on: bool) -> None:
        if cut == "records":
            await admin(urls[0], "partition" if on else "heal", {"device": device})
        else:  # the device's registry reads fail: it keeps its last verdict
            await admin(urls[0], "faults", {"device": device, "devices": "error" if on else None})

    async def winner() -> int:
        for url in urls:  # the device cut off from the registry cannot say
            view = await registry(url)
            if "active" in view:
                return peers.index(view["active"]["bao"])
        raise SystemExit("no device can read the registry")

    for k in range(count):
        now = time.time() - started
        if move_at and now >= move_at[0]:
            move_at.pop(0)
            current = await winner()
            target = (current + 1) % 3
            await activate(urls[target])
            moves.append((round(now, 1), f"device {current + 1} -> device {target + 1}"))
        if not partition and now >= cut_at:
            current = await winner()
            await cut_off(current + 1, True)
            partition = {"device": current + 1, "from": round(now, 1), "cut": cut}
        if partition and "to" not in partition and now >= heal_at:
            await cut_off(partition["device"], False)
            partition["to"] = round(now, 1)
        rid = f"once-{k:03d}"
        at = time.time() + (k % 4) * 0.5 * cluster.tick
        fields = {
            "name": rid,
            "kind": "once",
            "spec": {"at": at},
            "program": PROGRAM,
            "owner": "",
        }
        replica = k % 3
        await clients[replica].upsert(places[replica].triggers, [Upsert(rid, fields)])
        ids.append(rid)
        await asyncio.sleep(max(0.0, started + (k + 1) * every - time.time()))
    if partition and "to" not in partition:
        await cut_off(partition["device"], False)
        partition["to"] = round(time.time() - started, 1)
    written = time.time()

    async def runs() -> list[dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for client, place in zip(clients, places, strict=True):
            for run in await client.query_all(place.runs):
                out[str(run.get("runId") or run.get("id"))] = run
        return list(out.values())

    async def all_fired() -> bool:
        fired = {r.get("triggerId") for r in await runs()}
        return all(rid in fired for rid in ids)

    with contextlib.suppress(SystemExit):
        await wait_for(all_fired, 120 + 4 * cluster.delay, "every once to fire")
    fired_at = time.time()
    # Time for a late double to surface, then deliver everything still queued.
    await asyncio.sleep(4 * cluster.delay + 3 * cluster.tick)
    await admin(urls[0], "sync")
    await asyncio.sleep(2 * cluster.tick)
    all_runs = await runs()
    per = Counter(r.get("triggerId") for r in all_runs)
    doubles = sorted(rid for rid in ids if per[rid] > 1)
    never = sorted(rid for rid in ids if per[rid] == 0)
    occurrences = Counter(
        (r.get("triggerId"), r.get("scheduledAt")) for r in all_runs if r.get("triggerId") in crons
    )
    cron_doubles = sum(1 for n in occurrences.values() if n > 1)
    missed = 0
    for rid in crons:
        times = sorted(float(s) for (t, s) in occurrences if t == rid and s is not None)
        if len(times) >= 2:
            missed += round((times[-1] - times[0]) / CRON_EVERY_S) + 1 - len(times)
    waits = []
    for r in all_runs:
        if str(r.get("triggerId", "")).startswith("once-") and r.get("scheduledAt"):
            waits.append(float(r["startedAt"]) - float(r["scheduledAt"]))
    for c in clients:
        await c.aclose()
    waits.sort()
    return {
        "delay_s": cluster.delay,
        "onces": count,
        "fired_twice": len(doubles),
        "never_fired": len(never),
        "doubles": doubles[:10],
        "never": never[:10],
        "moves": moves,
        "partition": partition,
        "cron_occurrences": len(occurrences),
        "cron_fired_twice": cron_doubles,
        "cron_missed": missed,
        "once_wait_p50_s": round(waits[len(waits) // 2], 2) if waits else None,
        "once_wait_max_s": round(waits[-1], 2) if waits else None,
        "settle_s": round(fired_at - written, 1),
    }


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for delay in [float(d) for d in args.delays.split(",")]:
        with tempfile.TemporaryDirectory(prefix="bench-fence-") as scratch:
            tmp = Path(args.keep) / f"delay-{delay}" if args.keep else Path(scratch)
            if args.keep:
                shutil.rmtree(tmp, ignore_errors=True)  # a fresh devserver and fresh mirrors
            tmp.mkdir(parents=True, exist_ok=True)
            cluster = Cluster(tmp, delay, args.tick, args.poll, args.hold)
            try:
                cluster.start()
                result = await scenario(
                    cluster, args.count, args.window, args.cut, args.cut_lead, args.cut_for
                )
            finally:
                cluster.stop()
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", default="0.5,1,2,5", help="Replication delays, seconds.")
    parser.add_argument("--count", type=int, default=90, help="Unassigned onces to write.")
    parser.add_argument("--window", type=float, default=36.0, help="Seconds to write them over.")
    parser.add_argument("--tick", type=float, default=1.0)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument(
        "--cut",
        choices=["records", "registry"],
        default="records",
        help="Cut the holder off from the other replicas, or from the devices registry.",
    )
    parser.add_argument(
        "--cut-lead",
        type=float,
        help="Seconds between the cut and the second role move [default: 0.17 of the window].",
    )
    parser.add_argument(
        "--cut-for", type=float, help="Seconds the cut lasts [default: to 0.61 of the window]."
    )
    parser.add_argument("--hold", type=float, help="takeover_hold_s for the daemons.")
    parser.add_argument("--keep", help="Keep the logs and state under this directory.")
    parser.add_argument("--json", help="Write the results to this file.")
    ns = parser.parse_args()
    out = asyncio.run(main(ns))
    if ns.json:
        Path(ns.json).write_text(json.dumps(out, indent=2) + "\n")
