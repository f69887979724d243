"""Exactly once across replicas slower than a tick: three `anyrtd serve` (tick 1 s, election
poll 1 s) on a replicated devserver, while the replication delay grows to five ticks, the
holder of the role is partitioned, and the role moves three times (docs/election.md)."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import DevserverProcess
from control_support import LISTENING, ServeProcess
from support import put_triggers, replica_runs, wait_until

TICK = 1.0
PROGRAM = "test:ok@v1"
CONFIG = (
    "election_poll_s = 1.0",
    "takeover_hold_s = 30.0",
    f'[programs."{PROGRAM}"]',
    'argv = ["true"]',
)
CRON_EVERY_S = 2


class Device(ServeProcess):
    """`anyrtd serve` with a one-second tick (the control tests' helper uses a faster one)."""

    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("--tick") + 1] = str(TICK)
        return argv

    def wait_ticking(self) -> None:
        """Wait for a spawned daemon to tick (what `start` does after spawning)."""

        def bound() -> str | None:
            self._check_alive()
            match = LISTENING.search(self.log.read_text(errors="replace"))
            return match.group(1) if match else None

        self.listen = wait_until(bound, timeout=60, what=f"{self.state.name} to listen")
        wait_until(self._ticking, timeout=60, what=f"{self.state.name} to tick")

    def last_tick(self) -> float:
        with self.http() as client:
            return float(client.get("/healthz").json().get("lastTickAt") or 0.0)


@pytest.fixture
def cluster(
    devserver_factory: Callable[..., DevserverProcess], tmp_path: Path
) -> Iterator[tuple[DevserverProcess, list[Device]]]:
    server = devserver_factory(devices=3, replicated=True, sync_delay=0.5 * TICK)
    devices = [
        Device(tmp_path, url, name=f"d{i}", config_lines=CONFIG)
        for i, url in enumerate(server.urls, 1)
    ]
    try:
        for device in devices:
            device.spawn()
        for device in devices:
            device.wait_ticking()
        yield server, devices
    finally:
        for device in devices:
            device.stop()


def election(device: Device) -> dict[str, Any]:
    with device.http() as client:
        body: dict[str, Any] = client.get("/election").json()
    return body


def winner(server: DevserverProcess) -> int:
    with httpx.Client(base_url=server.url, timeout=10) as http:
        active = http.get("/v1/devices").json()["active"].get("bao")
    return server.peers.index(active) if active in server.peers else -1


def once(rid: str) -> dict[str, Any]:
    return {"name": rid, "kind": "once", "spec": {"at": time.time()}, "program": PROGRAM}


def test_each_unassigned_once_fires_once_while_replication_lags_and_the_role_moves(
    cluster: tuple[DevserverProcess, list[Device]],
) -> None:
    server, devices = cluster
    wait_until(lambda: winner(server) >= 0, timeout=30, what="a device to hold the role")
    wait_until(
        lambda: sum(election(d)["verdict"] == "active" for d in devices) == 1,
        timeout=30,
        what="exactly one active daemon",
    )
    pins = {f"pin-{i}": server.peers[i] for i in range(3)}
    for i, (rid, peer) in enumerate(pins.items()):
        spec = {"cron": f"* * * * * */{CRON_EVERY_S}"}
        put_triggers(
            server.urls[i],
            {rid: {"name": rid, "kind": "cron", "spec": spec, "program": PROGRAM, "owner": peer}},
        )
    ids: list[str] = []

    def write(n: int, *, on: int | None = None) -> None:
        for _ in range(n):
            rid = f"once-{len(ids):02d}"
            replica = on if on is not None else len(ids) % 3
            put_triggers(server.urls[replica], {rid: once(rid)})
            ids.append(rid)

    def move() -> int:
        """Activate the next device, writing onces on every replica around the move."""
        before = winner(server)
        target = (before + 1) % 3
        write(3)
        with httpx.Client(base_url=server.urls[target], timeout=10) as http:
            http.post("/v1/devices/activate", json={"app": "bao"}).raise_for_status()
        write(3)
        wait_until(
            lambda: election(devices[target])["verdict"] == "active",
            timeout=15,
            what=f"device {target + 1} to take the role",
        )
        return target

    # Half a tick: the delay the old promise rested on.
    move()
    # Two ticks, and the holder is cut off from the other replicas as the role leaves it.
    server.admin("sync-delay", {"seconds": 2 * TICK})
    holder = winner(server)
    server.admin("partition", {"device": holder + 1})
    write(3, on=holder)
    move()
    write(3)
    server.admin("heal")
    # Five ticks.
    server.admin("sync-delay", {"seconds": 5 * TICK})
    move()
    write(3)

    def fired() -> bool:
        seen = {r.get("triggerId") for r in replica_runs(server.urls)}
        return all(rid in seen for rid in ids)

    wait_until(fired, timeout=90, interval=0.5, what="every once to fire")
    # Deliver what is still queued, and give every daemon three ticks to act on it: a double
    # would fire now, when the last claims meet.
    server.admin("sync")
    synced = time.time()
    for device in devices:
        wait_until(
            lambda d=device: d.last_tick() > synced + 3 * TICK,  # type: ignore[misc]
            timeout=30,
            interval=0.2,
            what="three ticks after the sync",
        )
    runs = replica_runs(server.urls)
    per = Counter(r.get("triggerId") for r in runs)
    assert len(ids) == 27
    assert [rid for rid in ids if per[rid] != 1] == [], {rid: per[rid] for rid in ids}
    occurrences = Counter(
        (r["triggerId"], r.get("scheduledAt")) for r in runs if r["triggerId"] in pins
    )
    assert [k for k, n in occurrences.items() if n > 1] == []
    for rid in pins:
        times = sorted(float(at) for (t, at) in occurrences if t == rid)
        assert len(times) >= 5, (rid, times)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(abs(g - CRON_EVERY_S) < 0.01 for g in gaps), (rid, gaps)
