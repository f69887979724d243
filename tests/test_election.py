"""The election against a real devserver: registration, the verdicts, claims and the degrade."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from anyrtd.client import ServerClient
from anyrtd.clock import FakeClock
from anyrtd.devserver import start_devserver
from anyrtd.election import APP, AlwaysActive, Election

T0 = 1_800_000_000.0


class Devices:
    """Elections on the devices of one devserver, and a way to poke the server's admin routes."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.clock = FakeClock(T0)
        self.clients: list[ServerClient] = []

    def election(self, device: int, **kwargs: Any) -> Election:
        client = ServerClient(self.server.urls[device - 1])
        self.clients.append(client)
        return Election(client, poll_s=10.0, clock=self.clock, name=f"device{device}", **kwargs)

    def peer(self, device: int) -> str:
        return str(self.server.peers[device - 1])

    async def admin(self, path: str, body: dict[str, Any] | None = None, device: int = 1) -> Any:
        async with httpx.AsyncClient(base_url=self.server.urls[device - 1]) as http:
            resp = await http.post(path, json=body) if body is not None else await http.post(path)
            resp.raise_for_status()
            return resp.json()

    async def prune(self, device: int) -> None:
        async with httpx.AsyncClient(base_url=self.server.url) as http:
            resp = await http.delete(f"/v1/devices/{self.peer(device)}")
            resp.raise_for_status()

    async def activate(self, device: int) -> None:
        async with httpx.AsyncClient(base_url=self.server.urls[device - 1]) as http:
            resp = await http.post("/v1/devices/activate", json={"app": APP})
            resp.raise_for_status()

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()


@pytest.fixture
async def devices(tmp_path: Path) -> AsyncIterator[Devices]:
    """Elections on a three-device devserver in the test's event loop."""
    server = await start_devserver(tmp_path / "dev.sqlite3", devices=3)
    d = Devices(server)
    try:
        yield d
    finally:
        await d.close()
        await server.close()


async def test_a_lone_device_claims_the_role_at_boot(devices: Devices) -> None:
    e1 = devices.election(1)
    await e1.boot()
    assert e1.verdict == "active"
    assert e1.describe(devices.peer(1)) == {
        "app": "bao",
        "enabled": True,
        "active": True,
        "peerId": devices.peer(1),
        "winner": devices.peer(1),
        "verdict": "active",
        "lastPollAt": T0,
    }


async def test_the_last_poll_s_view_is_recent_within_the_bound_asked(devices: Devices) -> None:
    """The missed watch takes its devices from here instead of reading them again."""
    e1, e2 = devices.election(1), devices.election(2)
    await e1.boot()
    await e2.boot()
    view = e2.recent_view(30.0)
    assert view is not None and view.self_id == devices.peer(2)
    assert {devices.peer(1), devices.peer(2)} <= {d.peer_id for d in view.devices}
    devices.clock.advance(30)
    assert e2.recent_view(30.0) is None and e2.recent_view(31.0) is view
    await devices.prune(1)
    await e2.poll()
    again = e2.recent_view(30.0)
    assert again is not None and again.row(devices.peer(1)) is not None
    assert again.row(devices.peer(1)).deleted  # type: ignore[union-attr]
    await devices.admin("/_dev/faults", {"device": 2, "devices": "error"})
    devices.clock.advance(30)
    await e2.poll()
    assert e2.recent_view(30.0) is None  # a failed read leaves nothing recent
    assert AlwaysActive().recent_view(30.0) is None


async def test_a_second_device_boots_as_standby(devices: Devices) -> None:
    e1, e2 = devices.election(1), devices.election(2)
    await e1.boot()
    await e2.boot()
    assert (e1.verdict, e2.verdict) == ("active", "standby")
    view = e2.describe(None)
    assert view["peerId"] == devices.peer(2) and view["winner"] == devices.peer(1)
    assert view["active"] is False and view["verdict"] == "standby"


async def test_devices_booting_together_converge_on_one_winner(devices: Devices) -> None:
    elections = [devices.election(i) for i in (1, 2, 3)]
    await asyncio.gather(*(e.boot() for e in elections))
    for e in elections:
        await e.poll()
    verdicts = sorted(e.verdict for e in elections)
    assert verdicts == ["active", "standby", "standby"]
    assert len({e.winner for e in elections}) == 1


async def test_a_manual_activate_moves_the_role_within_one_poll(devices: Devices) -> None:
    e1, e2 = devices.election(1), devices.election(2)
    await e1.boot()
    await e2.boot()
    assert (e1.verdict, e2.verdict) == ("active", "standby")
    await devices.activate(2)
    assert await e1.poll() == "standby"
    assert await e2.poll() == "active"
    assert e1.winner == e2.winner == devices.peer(2)


async def test_a_pruned_device_reads_pruned_and_stays_pruned(devices: Devices) -> None:
    e1, e2 = devices.election(1), devices.election(2)
    await e1.boot()
    await e2.boot()
    await devices.prune(2)
    assert await e2.poll() == "pruned"
    assert await e2.poll() == "pruned"  # no re-registration brings it back
    assert e2.describe(None)["active"] is False
    assert await e1.poll() == "active"


async def test_a_device_pruned_before_boot_boots_pruned(devices: Devices) -> None:
    await devices.prune(3)
    e3 = devices.election(3)
    await e3.boot()
    assert e3.verdict == "pruned" and e3.enabled


async def test_the_standbys_take_over_when_the_winner_is_pruned(devices: Devices) -> None:
    e1, e2 = devices.election(1), devices.election(2)
    await e1.boot()
    await e2.boot()
    await devices.prune(1)
    assert await e2.poll() == "active"
    assert await e1.poll() == "pruned"


async def test_a_server_without_the_registry_disables_the_election(
    devices: Devices, caplog: pytest.LogCaptureFixture
) -> None:
    await devices.admin("/_dev/faults", {"device": 1, "devices": "missing"})
    e1 = devices.election(1)
    with caplog.at_level(logging.INFO, logger="anyrtd.election"):
        await e1.boot()
        await e1.poll()
    assert e1.verdict == "active" and not e1.enabled and e1.poll_interval_s is None
    assert e1.describe("me") == {
        "app": "bao",
        "enabled": False,
        "active": True,
        "peerId": "me",
        "winner": "me",
        "verdict": "active",
        "lastPollAt": None,
    }
    lines = [r for r in caplog.records if r.name == "anyrtd.election"]
    assert len(lines) == 1 and "no devices registry" in lines[0].getMessage()


async def test_a_registration_that_keeps_failing_disables_the_election(
    devices: Devices, caplog: pytest.LogCaptureFixture
) -> None:
    await devices.admin("/_dev/faults", {"device": 2, "devices": "error"})
    e2 = devices.election(2, boot_tries=3, retry_s=0.01)
    with caplog.at_level(logging.INFO, logger="anyrtd.election"):
        await e2.boot()
    assert e2.verdict == "active" and not e2.enabled
    lines = [r.getMessage() for r in caplog.records if r.name == "anyrtd.election"]
    assert len(lines) == 1 and "registration failed 3 times" in lines[0]


async def test_a_registration_that_recovers_within_the_tries_keeps_the_election(
    devices: Devices,
) -> None:
    await devices.admin("/_dev/faults", {"device": 1, "devices": "error"})
    e1 = devices.election(1, boot_tries=50, retry_s=0.02)
    boot = asyncio.create_task(e1.boot())
    await asyncio.sleep(0.1)  # let a few tries fail
    await devices.admin("/_dev/faults", {"device": 1, "devices": None})
    await asyncio.wait_for(boot, timeout=10)
    assert e1.enabled and e1.verdict == "active"


async def test_a_read_error_keeps_the_verdict(
    devices: Devices, caplog: pytest.LogCaptureFixture
) -> None:
    e1, e2 = devices.election(1), devices.election(2)
    await e1.boot()
    await e2.boot()
    polled = e1.last_poll_at
    devices.clock.advance(10)
    await devices.admin("/_dev/faults", {"device": 1, "devices": "error"})
    await devices.admin("/_dev/faults", {"device": 2, "devices": "missing"})
    with caplog.at_level(logging.INFO, logger="anyrtd.election"):
        for _ in range(3):
            assert await e1.poll() == "active"
            assert await e2.poll() == "standby"
    assert e1.enabled and e2.enabled
    assert e1.last_poll_at == polled
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2  # one line per device per failing streak, not one per poll
    await devices.admin("/_dev/faults", {"device": 1, "devices": None})
    assert await e1.poll() == "active"
    assert e1.last_poll_at == T0 + 10


async def test_a_fresh_init_registers_the_new_peer_and_takes_over_once_the_old_is_pruned(
    devices: Devices,
) -> None:
    e1 = devices.election(1)
    await e1.boot()
    old = devices.peer(1)
    fresh = (await devices.admin("/_dev/reinit", {"device": 1}))["peerId"]
    # The old row still holds the role: the new peer id registers and stands by.
    assert await e1.poll() == "standby"
    assert (e1.peer_id, e1.winner) == (fresh, old)
    view = await devices.clients[0].devices()
    assert view is not None and APP in (view.row(fresh) or view.devices[0]).apps
    async with httpx.AsyncClient(base_url=devices.server.url) as http:
        (await http.delete(f"/v1/devices/{old}")).raise_for_status()
    assert await e1.poll() == "active"
    assert e1.winner == fresh


async def test_a_fresh_init_after_its_row_was_pruned_stands_by_behind_a_live_winner(
    devices: Devices,
) -> None:
    e1, e2 = devices.election(1), devices.election(2)
    await e1.boot()
    await e2.boot()
    await devices.prune(1)
    assert await e2.poll() == "active"
    assert await e1.poll() == "pruned"
    fresh = (await devices.admin("/_dev/reinit", {"device": 1}))["peerId"]
    # The pruned row was this device, not a winner that went away: nothing to take over.
    assert await e1.poll() == "standby"
    assert await e1.poll() == "standby"
    assert (e1.self_id, e1.winner) == (fresh, devices.peer(2))
    assert await e2.poll() == "active"


async def test_degraded_names_a_failing_registry_and_clears_when_it_answers(
    devices: Devices,
) -> None:
    await devices.admin("/_dev/faults", {"device": 1, "devices": "missing"})
    await devices.admin("/_dev/faults", {"device": 2, "devices": "error"})
    absent, failing, e3 = (
        devices.election(1),
        devices.election(2, boot_tries=2, retry_s=0.01),
        devices.election(3),
    )
    await absent.boot()
    await failing.boot()
    await e3.boot()
    assert absent.degraded is None and absent.self_id is None  # no registry is not a failure
    assert failing.self_id is None
    assert "single-device mode" in (failing.degraded or "")
    assert e3.degraded is None and e3.self_id == devices.peer(3)
    await devices.admin("/_dev/faults", {"device": 3, "devices": "error"})
    assert await e3.poll() == "active"
    assert "devices registry unavailable since" in (e3.degraded or "")
    await devices.admin("/_dev/faults", {"device": 3, "devices": None})
    await e3.poll()
    assert e3.degraded is None
