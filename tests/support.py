"""Helpers shared by the tests: waiting on conditions with deadlines, never bare sleeps."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sqlalchemy import Engine, event

from anyrtd.client import ServerClient, Upsert
from anyrtd.clock import SystemClock
from anyrtd.config import Config
from anyrtd.daemon import Daemon
from anyrtd.places import Places, resolve_places
from anyrtd.program import ProgramFn, RunOutcome
from anyrtd.rows import RunRow
from anyrtd.runner import Runner

T = TypeVar("T")

AGENT_RUNS_FIELDS = frozenset(
    {
        "runId",
        "triggerId",
        "program",
        "device",
        "startedAt",
        "endedAt",
        "durationMs",
        "status",
        "errorType",
        "turns",
        "cells",
        "effects",
        "mutations",
        "tokens",
        "costUsd",
        "model",
        "title",
    }
)
"""The fields of an `agent_runs` record, as the seeds' table lists them."""

SEED_KEYS = frozenset(
    {
        "id",
        "name",
        "kind",
        "owner",
        "enabled",
        "lastRunAt",
        "lastStatus",
        "consecutiveFailures",
        "limits",
    }
)
"""The keys of a `GET /triggers` entry, as the seeds' control-plane table lists them."""


def wait_until(
    check: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = "condition"
) -> T:
    """Poll `check` until it returns a truthy value; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # the condition may not be checkable yet
            last_exc = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}") from last_exc
        time.sleep(interval)


async def async_wait_until(
    check: Callable[[], Awaitable[T]],
    timeout: float = 10.0,  # noqa: ASYNC109 - a polling deadline, like wait_until's
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Await `check` until it returns a truthy value; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = await check()
            if value:
                return value
        except Exception as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}") from last_exc
        await asyncio.sleep(interval)


def put_triggers(url: str, records: dict[str, dict[str, Any]]) -> None:
    """Write trigger records on the server, as a user would."""

    async def go() -> None:
        client = ServerClient(url)
        try:
            places = await resolve_places(client, "bao")
            await client.upsert(places.triggers, [Upsert(rid, f) for rid, f in records.items()])
        finally:
            await client.aclose()

    asyncio.run(go())


def server_runs(url: str, trigger_id: str) -> list[dict[str, Any]]:
    """Return the `agent_runs` records of a trigger on the server."""

    async def go() -> list[dict[str, Any]]:
        client = ServerClient(url)
        try:
            places = await resolve_places(client, "bao")
            return await client.query_all(places.runs, filter={"triggerId": trigger_id})
        finally:
            await client.aclose()

    return asyncio.run(go())


def daemon_with(
    url: str, state_dir: Path, programs: Mapping[str, ProgramFn], tick_s: float = 0.2
) -> Daemon:
    """Return a daemon (not started) on the server at `url` that runs `programs` in process."""
    client = ServerClient(url)
    runner = Runner(
        client=client,
        clock=SystemClock(),
        agent_name="bao",
        space="bao",
        commands={},
        extra_builtins=dict(programs),
    )
    config = Config(server=url, state_dir=state_dir, tick_s=tick_s)
    return Daemon(config, client=client, runner=runner)


class World:
    """The server as a user sees it: write and read trigger records (synchronously)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, fn: Callable[[ServerClient, Places], Awaitable[T]]) -> T:
        async def main() -> T:
            async with ServerClient(self.url) as client:
                return await fn(client, await resolve_places(client, "bao"))

        return asyncio.run(main())

    def put(self, rid: str, **fields: Any) -> None:
        """A field-level write."""
        self.call(lambda c, p: c.upsert(p.triggers, [Upsert(rid, fields)]))

    def record(self, rid: str) -> dict[str, Any]:
        records, _ = self.call(lambda c, p: c.query(p.triggers, filter={"id": rid}))
        assert records, f"no record {rid}"
        return records[0]

    def owner(self, rid: str) -> str | None:
        """The record's `owner` ("" when unset), or None when there is no such record."""
        records, _ = self.call(lambda c, p: c.query(p.triggers, filter={"id": rid}))
        return str(records[0].get("owner", "")) if records else None

    def owners(self) -> set[str]:
        """The `owner` of every trigger record."""
        records = self.call(lambda c, p: c.query_all(p.triggers))
        return {str(r.get("owner", "")) for r in records}

    def runs(self, trigger_id: str) -> list[dict[str, Any]]:
        """The `agent_runs` records of a trigger."""
        return self.call(lambda c, p: c.query_all(p.runs, filter={"triggerId": trigger_id}))

    def run_devices(self, trigger_id: str) -> list[str]:
        """The `device` of each `agent_runs` record of the trigger."""
        return [str(r.get("device")) for r in self.runs(trigger_id)]


def sigint_default() -> None:
    """Give a child the default SIGINT (a `preexec_fn`): a runner that starts the tests in the
    background ignores SIGINT, and a child inherits that, so Ctrl-C would never reach it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def replica_runs(urls: list[str]) -> list[dict[str, Any]]:
    """Return every `agent_runs` record on any of the replicas at `urls`, once each (a run is
    on its device's replica first)."""

    async def go() -> list[dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for url in urls:
            async with ServerClient(url) as client:
                places = await resolve_places(client, "bao")
                for run in await client.query_all(places.runs):
                    found[str(run.get("runId") or run["id"])] = run
        return list(found.values())

    return asyncio.run(go())


def run_of(
    program: str,
    args: Mapping[str, Any] | None = None,
    *,
    run_id: str = "run-1",
    trigger_id: str | None = "trig-1",
    scheduled_at: float | None = None,
    device: str = "12D3KooWdevice",
) -> tuple[RunRow, dict[str, Any]]:
    """Return a run to hand a runner (`Runner.run`): its row, as `lifecycle.begin` makes it
    for a run by hand or an event's, and its program's args."""
    at = scheduled_at if scheduled_at is not None else time.time()
    return RunRow(run_id, trigger_id, program, device, scheduled_at, at), dict(args or {})


class StandInLaunch:
    """What a stand-in runner's `ready` returns: the run, its args and its callbacks."""

    def __init__(
        self,
        row: RunRow,
        args: Mapping[str, Any],
        on_start: Callable[[float], None] | None,
        on_spawn: Callable[[int], Awaitable[None]] | None,
    ) -> None:
        self.row, self.args, self.on_start, self.on_spawn = row, args, on_start, on_spawn


class Starts(Protocol):
    """A stand-in runner's own `start` (`Runner.start`)."""

    def start(
        self,
        row: RunRow,
        args: Mapping[str, Any],
        *,
        on_start: Callable[[float], None] | None = None,
        on_spawn: Callable[[int], Awaitable[None]] | None = None,
    ) -> Coroutine[Any, Any, RunOutcome]: ...


class ReadyByStart:
    """A stand-in runner's `ready` and `go` (`Runner.ready`, `Runner.go`), mixed into one
    that has its own `start` (`Starts`): a run made ready is started by it when it goes.
    It runs no command under a supervisor (`marks`) and resolves no program."""

    marks = None

    def resolve(self, spec: str) -> None:
        return None

    def ready(
        self,
        row: RunRow,
        args: Mapping[str, Any],
        *,
        on_start: Callable[[float], None] | None = None,
        on_spawn: Callable[[int], Awaitable[None]] | None = None,
    ) -> StandInLaunch:
        return StandInLaunch(row, args, on_start, on_spawn)

    def go(self: Starts, launch: StandInLaunch) -> Coroutine[Any, Any, RunOutcome]:
        return self.start(
            launch.row, launch.args, on_start=launch.on_start, on_spawn=launch.on_spawn
        )


class Turns:
    """A task that counts its turns on the event loop while it runs (`async with`): `n`
    read inside a piece of work says whether other tasks ran since it was read last."""

    def __init__(self) -> None:
        self.n = 0
        self._task: asyncio.Task[None] | None = None

    async def _count(self) -> None:
        while True:
            self.n += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> Turns:
        self._task = asyncio.create_task(self._count())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class Traced:
    """The statements SQLite runs on the connections an engine hands out from now on, as
    they ran (their values written in): one line a statement, and one a row for a
    statement run row by row (`executemany`)."""

    def __init__(self, engine: Engine) -> None:
        self.statements: list[str] = []
        event.listen(engine, "checkout", self._trace)

    def _trace(self, dbapi_conn: Any, record: Any, proxy: Any) -> None:
        dbapi_conn.set_trace_callback(self.statements.append)

    def inserts(self, into: str = "") -> list[str]:
        """Return the INSERT statements (into the table `into`, when given)."""
        return [s for s in self.statements if s.startswith(f"INSERT INTO {into}")]
