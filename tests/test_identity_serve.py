"""This device's identity through `anyrtd serve` processes on a devserver (docs/election.md,
"Identity"): a fresh init while the daemon runs, a devices registry that keeps failing at
boot, and the `anyrt-<pid>` stamp of a process that is gone."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import anyrtd_command
from control_support import ServeProcess
from support import World, wait_until

from anyrtd.vocab import stamp

MARK = "test:mark@v1"
LINES = ("election_poll_s = 0.5", f'[programs."{MARK}"]\nargv = {json.dumps(["/bin/true"])}')
EVERY_SECOND = {"kind": "cron", "spec": {"every_s": 1}, "program": MARK}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[[str, str], ServeProcess]]:
    """Make `anyrtd serve` processes (not started); each is stopped at teardown."""
    made: list[ServeProcess] = []

    def make(url: str, name: str) -> ServeProcess:
        made.append(ServeProcess(tmp_path, url, name=name, config_lines=LINES))
        return made[-1]

    yield make
    for proc in made:
        proc.stop()


def get(proc: ServeProcess, path: str) -> dict[str, Any]:
    with proc.http() as client:
        body: dict[str, Any] = client.get(path).json()
    return body


def pid(proc: ServeProcess) -> int:
    assert proc.proc is not None
    return proc.proc.pid


def test_a_fresh_init_while_serving_follows_the_new_peer_id_and_stays_standby(
    devserver_factory: Callable[..., Any],
    served: Callable[[str, str], ServeProcess],
) -> None:
    server = devserver_factory(devices=2)
    world = World(server.url)
    one, two = served(server.urls[0], "one"), served(server.urls[1], "two")
    old, other = server.peers
    one.start()
    wait_until(lambda: get(one, "/election")["verdict"] == "active", timeout=30, what="one active")
    two.start()
    wait_until(lambda: get(two, "/election")["winner"] == old, timeout=30, what="two to see one")
    # Device one's row is pruned (from device two, as `anyrtd devices prune` would): two takes over.
    httpx.delete(f"{server.urls[1]}/v1/devices/{old}", timeout=10).raise_for_status()
    wait_until(
        lambda: (
            get(one, "/election")["verdict"] == "pruned"
            and get(two, "/election")["verdict"] == "active"
        ),
        timeout=30,
        what="one pruned and two active",
    )
    new = server.admin("reinit", {"device": 1})["peerId"]
    assert new not in (old, other)
    wait_until(
        lambda: get(one, "/election")["peerId"] == new and get(one, "/healthz")["peerId"] == new,
        timeout=30,
        what="one to follow its new peer id",
    )
    # A live winner elsewhere: one stands by, poll after poll.
    first = get(one, "/election")["lastPollAt"]

    def polled_standby() -> bool:
        mine, theirs = get(one, "/election"), get(two, "/election")
        assert (mine["verdict"], theirs["verdict"]) == ("standby", "active"), (mine, theirs)
        return bool(mine["lastPollAt"] >= first + 2.0)

    wait_until(polled_standby, timeout=30, what="four more polls of device one")
    # Unassigned: the winner claims it. Pinned to the new id: it fires on device one.
    world.put("free", owner="", **EVERY_SECOND)
    world.put("pinned", owner=new, **EVERY_SECOND)
    wait_until(lambda: world.owner("free") == other, timeout=30, what="two to claim free")
    wait_until(lambda: new in world.run_devices("pinned"), timeout=30, what="pinned to fire")
    wait_until(lambda: other in world.run_devices("free"), timeout=30, what="free to fire")
    assert old not in world.owners()
    assert old not in world.run_devices("pinned") + world.run_devices("free")
    assert get(one, "/election")["verdict"] == "standby"


def test_a_registry_failing_at_boot_means_single_device_mode_with_a_stamp(
    devserver: Any,
    served: Callable[[str, str], ServeProcess],
) -> None:
    world = World(devserver.url)
    devserver.admin("faults", {"devices": "error"})
    serve = served(devserver.url, "serve").start()
    me = stamp(pid(serve))
    world.put("free", owner="", **EVERY_SECOND)
    wait_until(lambda: world.owner("free") == me, timeout=30, what="free claimed with the stamp")
    wait_until(lambda: me in world.run_devices("free"), timeout=30, what="free to fire")
    election = get(serve, "/election")
    assert election["enabled"] is False and election["verdict"] == "active"
    with serve.http() as client:
        resp = client.get("/healthz")
    assert resp.status_code == 200  # degraded, not dead: a supervisor keeps it running
    health = resp.json()
    assert health["status"] == "degraded" and health["peerId"] == me
    assert len(health["reasons"]) == 1 and "devices registry" in health["reasons"][0]
    log = serve.log.read_text()
    assert log.count("election disabled for this run") == 1, log
    env = {**os.environ, "ANYRTD_SERVER": devserver.url, "ANYRTD_LISTEN": serve.listen}
    env["ANYRTD_STATE_DIR"] = str(serve.state)
    done = subprocess.run(
        [*anyrtd_command(), "doctor", "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    control = next(c for c in json.loads(done.stdout) if c["name"] == "control")
    assert control["status"] == "warn" and "degraded" in control["detail"], control


def test_a_registry_failing_at_boot_keeps_the_peer_id_it_gave_so_pins_fire(
    devserver: Any,
    served: Callable[[str, str], ServeProcess],
) -> None:
    world = World(devserver.url)
    serve = served(devserver.url, "serve").start()
    peer = devserver.peers[0]
    wait_until(lambda: get(serve, "/healthz")["peerId"] == peer, timeout=30, what="the peer id")
    serve.stop()
    devserver.admin("faults", {"devices": "error"})
    world.put("pinned", owner=peer, **EVERY_SECOND)
    world.put("free", owner="", **EVERY_SECOND)
    serve.start()
    wait_until(lambda: peer in world.run_devices("pinned"), timeout=30, what="the pin to fire")
    wait_until(lambda: world.owner("free") == peer, timeout=30, what="free to be claimed")
    wait_until(lambda: peer in world.run_devices("free"), timeout=30, what="free to fire")
    assert get(serve, "/healthz")["status"] == "degraded"


def test_a_restart_in_single_device_mode_claims_the_old_stamp_afresh(
    devserver: Any,
    served: Callable[[str, str], ServeProcess],
) -> None:
    world = World(devserver.url)
    devserver.admin("faults", {"devices": "missing"})  # no registry: single-device mode
    serve = served(devserver.url, "serve").start()
    first = stamp(pid(serve))
    world.put("free", owner="", **EVERY_SECOND)
    wait_until(lambda: world.owner("free") == first, timeout=30, what="the first claim")
    wait_until(lambda: first in world.run_devices("free"), timeout=30, what="a first run")
    assert serve.stop() == 0
    serve.start()
    second = stamp(pid(serve))
    assert second != first
    assert get(serve, "/healthz")["peerId"] == second
    wait_until(lambda: world.owner("free") == second, timeout=30, what="the claim afresh")
    wait_until(lambda: second in world.run_devices("free"), timeout=30, what="a run as second")
    # The registry is absent, not failing: nothing is degraded.
    assert get(serve, "/healthz")["status"] == "ok"
