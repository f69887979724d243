"""The harness of the in-process daemon tests: a fleet of daemons, one per device of a
devserver, for the tick, election, event, chat-watch and standing tests.

Each node is a real `Daemon` (with a real `Election`, or always active) on its own device's
server; the clock is one shared `FakeClock`, and each test steps the fleet or its one node
itself (`await fleet.step(s)`, `await node.step(s)`), so nothing waits on a bare sleep and
hours of schedule pass in milliseconds. The `fleet` fixture lives in conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from anyrtd.client import Dataset, ServerClient, ServerUnavailable, Upsert
from anyrtd.clock import FakeClock
from anyrtd.config import Config
from anyrtd.daemon import Daemon
from anyrtd.election import APP, AlwaysActive, Election, Gate
from anyrtd.program import ProgramContext
from anyrtd.programs.chat import AGENT_BUNDLE, GENERAL_CHAT_SEED
from anyrtd.runner import Runner

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC, a Friday


class Programs:
    """In-process test programs that note each call: (program, trigger id, device, args)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, str, Mapping[str, Any]]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.started = asyncio.Event()

    def _note(self, name: str, args: Mapping[str, Any], ctx: ProgramContext) -> None:
        self.calls.append((name, ctx.trigger_id, ctx.device, args))
        self.started.set()

    async def ok(self, args: Mapping[str, Any], ctx: ProgramContext) -> Mapping[str, Any]:
        self._note("ok", args, ctx)
        await self.release.wait()
        return {"title": "fine", "costUsd": 0.01}

    async def fail(self, args: Mapping[str, Any], ctx: ProgramContext) -> None:
        self._note("fail", args, ctx)
        raise RuntimeError("boom")

    def table(self) -> dict[str, Callable[[Mapping[str, Any], ProgramContext], Awaitable[Any]]]:
        return {"test:ok@v1": self.ok, "test:fail@v1": self.fail}

    def of(self, trigger_id: str) -> list[tuple[str, str | None, str, Mapping[str, Any]]]:
        return [c for c in self.calls if c[1] == trigger_id]


# The run budget runs on the fleet's fake clock, which the tests move by hours at a time:
# a budget shorter than a step would end runs still in flight as `incomplete`.
BUDGET_S = 86_400.0


class Node:
    """One device: a daemon and its election on that device's own server."""

    def __init__(self, fleet: Fleet, index: int, *, election: bool = True) -> None:
        self.fleet = fleet
        self.index = index
        self.url = fleet.server.urls[index - 1]
        self.state = fleet.tmp / f"device{index}"
        self.use_election = election
        self.config = Config(
            server=self.url,
            state_dir=self.state,
            tick_s=5.0,
            run_timeout_s=BUDGET_S,
            election_poll_s=10.0,
        )
        self.user = ServerClient(self.url)
        self.daemon = self.make_daemon()

    def make_daemon(self) -> Daemon:
        """Return a fresh daemon for this device (on its state directory, not opened)."""
        client = ServerClient(self.url)
        gate: Gate = (
            Election(client, clock=self.fleet.clock, name=f"device{self.index}", retry_s=0.01)
            if self.use_election
            else AlwaysActive()
        )
        runner = Runner(
            client=client,
            clock=self.fleet.clock,
            agent_name="bao",
            space="bao",
            commands={},
            timeout_s=BUDGET_S,
            extra_builtins=self.fleet.programs.table(),
        )
        return Daemon(self.config, clock=self.fleet.clock, client=client, gate=gate, runner=runner)

    @property
    def election(self) -> Election:
        assert isinstance(self.daemon.gate, Election)
        return self.daemon.gate

    @property
    def me(self) -> str:
        assert self.daemon.peer_id is not None
        return self.daemon.peer_id

    @property
    def clock(self) -> FakeClock:
        return self.fleet.clock

    @property
    def programs(self) -> Programs:
        return self.fleet.programs

    @property
    def triggers(self) -> Dataset:
        assert self.daemon.places is not None
        return self.daemon.places.triggers

    async def put(self, rid: str, **fields: Any) -> None:
        """Write a trigger record through this device's server, as a user would."""
        await self.fleet.put(rid, via=self, **fields)

    async def record(self, rid: str) -> dict[str, Any]:
        """Return a trigger record as this device's server shows it (it must exist)."""
        record = await self.fleet.record(rid, via=self)
        assert record is not None, f"no record {rid}"
        return record

    async def runs(self, trigger_id: str) -> list[dict[str, Any]]:
        """Return the `agent_runs` records of a trigger on this device's server."""
        _, runs, _ = await self.fleet.places()
        return await self.user.query_all(runs, filter={"triggerId": trigger_id})

    async def step(self, seconds: float) -> list[str]:
        """Move the clock forward, tick, fire what is due and let the runs end."""
        return await self.fleet.step(seconds)

    async def boot(self) -> None:
        """Open the mirror, boot the election, and run the first sync and tick."""
        await self.daemon.open()
        await self.daemon.gate.boot()
        self.daemon.role.live.since = self.fleet.clock.now()
        await self.tick()
        await self.tick()

    async def tick(self) -> None:
        with contextlib.suppress(ServerUnavailable):
            await self.daemon.sync()
        await self.daemon.tick()
        while self.daemon.sync_stage.pending:  # a burst's rest, as the tick loop does at once
            await self.daemon.tick()

    async def settle(self) -> None:
        """Let in-flight runs end, drain the outbox, and tick."""
        async with asyncio.timeout(10):
            await self.daemon.wait_idle()
        await self.daemon.drain_outbox()
        await self.tick()

    async def stop(self) -> None:
        if self.daemon.db is not None:
            await self.daemon.stop()

    async def restart(self) -> None:
        await self.stop()
        self.daemon = self.make_daemon()
        await self.boot()

    async def repoint(self, url: str) -> None:
        """Talk to this device's server at a new address (a restarted devserver)."""
        self.url = url
        await self.daemon.client.aclose()  # reopened on its next request, at the new address
        await self.user.aclose()
        self.daemon.client.base_url = url
        self.user = ServerClient(url)

    async def close(self) -> None:
        await self.stop()
        await self.user.aclose()


class Fleet:
    """Nodes on one devserver, a shared fake clock, and helpers to write and read records."""

    def __init__(self, server: Any, tmp: Path) -> None:
        self.server = server
        self.tmp = tmp
        self.clock = FakeClock(T0)
        self.programs = Programs()
        self.nodes: list[Node] = []
        self.user = ServerClient(server.url)
        self._triggers: Dataset | None = None
        self._runs: Dataset | None = None
        self._chat: Dataset | None = None

    async def node(self, index: int, *, election: bool = True) -> Node:
        node = Node(self, index, election=election)
        self.nodes.append(node)
        await node.boot()
        return node

    async def places(self) -> tuple[Dataset, Dataset, Dataset]:
        if self._triggers is None or self._runs is None or self._chat is None:
            from anyrtd.places import resolve_places

            places = await resolve_places(self.user, "bao")
            self._triggers, self._runs = places.triggers, places.runs
            chat = await self.user.child("bao", AGENT_BUNDLE, GENERAL_CHAT_SEED)
            self._chat = Dataset("bao", chat, "chat_messages")
        return self._triggers, self._runs, self._chat

    async def put(self, rid: str, via: Node | None = None, **fields: Any) -> None:
        triggers, _, _ = await self.places()
        client = via.user if via is not None else self.user
        await client.upsert(triggers, [Upsert(rid, fields)])

    async def record(self, rid: str, via: Node | None = None) -> dict[str, Any] | None:
        triggers, _, _ = await self.places()
        client = via.user if via is not None else self.user
        records, _ = await client.query(triggers, filter={"id": rid})
        return records[0] if records else None

    async def runs(self, trigger_id: str | None = None) -> list[dict[str, Any]]:
        _, runs, _ = await self.places()
        flt = {"triggerId": trigger_id} if trigger_id is not None else None
        return await self.user.query_all(runs, filter=flt)

    async def say(
        self, text: str, *, via: Node | None = None, chat: Dataset | None = None, **fields: Any
    ) -> str:
        """Post a chat message (as a person unless `agent` is given); return its id."""
        _, _, general = await self.places()
        mid = f"m-{uuid.uuid4().hex[:12]}"
        client = via.user if via is not None else self.user
        body = {"text": text, "author": "ana", "createdAt": self.clock.now(), **fields}
        await client.upsert(chat or general, [Upsert(mid, body)])
        return mid

    async def messages(self, via: Node | None = None) -> list[dict[str, Any]]:
        _, _, general = await self.places()
        client = via.user if via is not None else self.user
        return await client.query_all(general, sort=["createdAt"])

    async def replies(self, via: Node | None = None) -> dict[str, list[dict[str, Any]]]:
        """Return the agent's replies by the message id they answer."""
        out: dict[str, list[dict[str, Any]]] = {}
        for m in await self.messages(via):
            if isinstance(m.get("replyTo"), str):
                out.setdefault(m["replyTo"], []).append(m)
        return out

    async def admin(self, path: str, body: dict[str, Any] | None = None) -> Any:
        async with httpx.AsyncClient(base_url=self.server.url) as http:
            resp = await http.post(path, json=body if body is not None else {})
            resp.raise_for_status()
            return resp.json()

    async def activate(self, node: Node) -> None:
        async with httpx.AsyncClient(base_url=node.url) as http:
            (await http.post("/v1/devices/activate", json={"app": APP})).raise_for_status()

    async def prune(self, node: Node) -> None:
        async with httpx.AsyncClient(base_url=self.server.url) as http:
            (await http.delete(f"/v1/devices/{node.me}")).raise_for_status()

    async def replicated(self) -> None:
        """Wait until every queued replication write has been delivered."""
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            async with httpx.AsyncClient(base_url=self.server.url) as http:
                state = (await http.get("/_dev/state")).json()
            if state["pending"] == 0:
                return
            assert asyncio.get_running_loop().time() < deadline, "replication did not settle"
            await asyncio.sleep(0.02)

    async def poll(self) -> None:
        for node in self.nodes:
            if node.use_election and node.daemon.db is not None:
                await node.election.poll()

    async def step(self, seconds: float = 0.0, *, poll: bool = False) -> list[str]:
        """Advance the clock; poll the elections if asked; then on every running node
        sync, tick, fire what is due, and settle. Return the run ids started."""
        self.clock.advance(seconds)
        if poll:
            await self.poll()
        started: list[str] = []
        live = [n for n in self.nodes if n.daemon.db is not None]
        for node in live:
            await node.tick()
        for node in live:
            started += await node.daemon.fire_due(self.clock.now())
        for node in live:
            await node.settle()
        if "--replicated" in getattr(self.server, "args", []):
            await self.replicated()
        return started

    async def close(self) -> None:
        for node in self.nodes:
            await node.close()
        await self.user.aclose()
