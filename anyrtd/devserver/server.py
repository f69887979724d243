"""Start and stop the devserver: its devices' listeners, the store and the replication loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
from pathlib import Path

from aiohttp import web

from anyrtd.clock import Clock, SystemClock
from anyrtd.devserver.app import Device, Hub, make_app
from anyrtd.devserver.store import Store, Topology

log = logging.getLogger("anyrtd.devserver")


class DevServerError(Exception):
    """The devserver could not start; the message says why and what to do."""


class DevServer:
    """A running devserver: one HTTP endpoint per device over one SQLite file."""

    def __init__(self, hub: Hub, db: Path) -> None:
        self.hub = hub
        self.db = db
        self._runners: list[web.AppRunner] = []
        self._sync_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def urls(self) -> list[str]:
        """Return the base URL of each device, device 1 first."""
        return [d.url for d in self.hub.devices]

    @property
    def url(self) -> str:
        """Return the base URL of device 1."""
        return self.urls[0]

    @property
    def peers(self) -> list[str]:
        """Return the peer id of each device, device 1 first."""
        return [d.peer for d in self.hub.devices]

    async def close(self) -> None:
        """Stop listening, wake waiting readers, stop replicating and close the file."""
        if self._closed:
            return
        self._closed = True
        self.hub.closing.set()
        self.hub.wake_all()
        if self._sync_task is not None:
            self._sync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sync_task
        for runner in self._runners:
            await runner.cleanup()
        await self.hub.run(self.hub.store.close)
        self.hub.shutdown_executor()

    async def __aenter__(self) -> DevServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _sync_loop(self) -> None:
        hub = self.hub
        while True:
            hub.sync_wake.clear()
            try:
                applied, touched = await hub.run(hub.store.deliver, hub.clock.now())
                hub.notify(touched)
                due = None if applied else await hub.run(hub.store.next_due)
            except Exception:
                # Keep replicating after a failed round; the queue still holds the writes.
                log.exception("replication round failed; retrying in a second")
                applied, due = 0, hub.clock.now() + 1.0
            if applied:
                continue
            timeout = None if due is None else due - hub.clock.now()
            if timeout is not None and timeout <= 0:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hub.sync_wake.wait(), timeout)


async def start_devserver(
    db_path: Path | str,
    host: str = "127.0.0.1",
    port: int = 0,
    devices: int = 1,
    space: str = "bao",
    *,
    replicated: bool = False,
    sync_delay: float = 0.0,
    clock: Clock | None = None,
    access_log: bool = False,
) -> DevServer:
    """Start a devserver with `devices` endpoints on port, port+1, ... (each ephemeral if 0)."""
    if devices < 1:
        raise DevServerError(f"--devices {devices}: need at least one device")
    if port and port + devices - 1 > 65535:
        raise DevServerError(f"--port {port} with --devices {devices} runs past port 65535")
    store = Store(db_path)
    os_name = platform.system().lower() or "unknown"
    hub = Hub(store, clock or SystemClock(), replicated=replicated, os_name=os_name)
    server = DevServer(hub, Path(db_path))
    try:
        await hub.run(store.open)
        await hub.run(store.ensure_space, space)
        peers = await hub.run(store.ensure_devices, devices, os_name)
        replicas = list(range(1, devices + 1)) if replicated else [1]
        touched = await hub.run(store.ensure_replicas, replicas, hub.clock.now())
        hub.notify(touched)
        store.topology = Topology(replicas, sync_delay if replicated else 0.0, set())
        for index in range(1, devices + 1):
            device = Device(index, peers[index], index if replicated else 1)
            hub.devices.append(device)
            access = logging.getLogger(f"anyrtd.devserver.device{index}") if access_log else None
            runner = web.AppRunner(
                make_app(hub, device),
                access_log=access,
                access_log_format="%r %s %Tfs",
                shutdown_timeout=1.0,
            )
            await runner.setup()
            server._runners.append(runner)
            want = port + index - 1 if port else 0
            site = web.TCPSite(runner, host, want)
            try:
                await site.start()
            except OSError as exc:
                raise DevServerError(
                    f"device {index}: cannot listen on {host}:{want}: {exc.strerror or exc}; "
                    "pick another --port, or --port 0 for free ports"
                ) from None
            bound = runner.addresses[-1]
            shown = f"[{host}]" if ":" in host else host
            device.url = f"http://{shown}:{bound[1]}"
        if replicated:
            server._sync_task = asyncio.create_task(server._sync_loop())
    except BaseException:
        await server.close()
        raise
    return server
