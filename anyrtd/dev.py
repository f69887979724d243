"""`anyrtd dev`: the devserver, the daemon and the control API in one process, with a sample.

The command itself and the how-to it prints live in `anyrtd.cli.serve`.

Like `temporal server start-dev`: one command gives a working local set-up. The
devserver keeps its SQLite file and the daemon its mirror under the state
directory, so running it again picks up where the last run stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anyrtd.address import Address
from anyrtd.client import ServerClient, ServerError, ServerUnavailable
from anyrtd.config import Config
from anyrtd.control.writes import Records, WriteError
from anyrtd.devserver import DevServerError, start_devserver
from anyrtd.missed import iso
from anyrtd.serve import StartError, start_daemon
from anyrtd.statedir import StateDirError, lock_state_dir
from anyrtd.vocab import Kind, RollupField

log = logging.getLogger("anyrtd.dev")

SAMPLE_ID = "dev-reminder"
SAMPLE: dict[str, Any] = {
    "name": "Dev reminder",
    "kind": Kind.CRON.value,
    "spec": {"cron": "* * * * *"},
    "program": "agent:remind@v1",
    "args": {"text": "Reminder from anyrtd dev: this trigger fires every minute."},
    "owner": "",
    "enabled": True,
}
CHAT_POLL_S = 25.0
FIRST_ID = "dev-first"
FIRST_IN_S = 3.0
"""How long after the daemon is ready the first fire comes: a `once` this far ahead, so a
newcomer sees a run within seconds, not up to a minute later (the sample is every minute)."""


def first_fields(at: float, owner: str) -> dict[str, Any]:
    """Return the record of the first fire: a reminder once, `at`, pinned to this device."""
    return {
        "name": "First fire of anyrtd dev",
        "kind": Kind.ONCE.value,
        "spec": {"at": round(at, 3)},
        "program": "agent:remind@v1",
        "args": {"text": "First fire from anyrtd dev: the daemon is running your triggers."},
        "owner": owner,
        "enabled": True,
    }


async def arm_first(client: ServerClient, space: str, at: float, owner: str) -> bool:
    """Write (or re-arm) the first fire for `at` on this device, unless its id was deleted;
    return whether it is there. Pinned here, it needs no claim: the next tick arms it."""
    records = Records(client, space)
    fields = first_fields(at, owner)
    try:
        stored = await records.get(FIRST_ID)
    except WriteError:
        log.info("the first-fire trigger %s was deleted; not creating it again", FIRST_ID)
        return False
    if stored is None:
        await records.create(FIRST_ID, fields)
    else:
        # A new `at` without lastRunAt re-arms the shot (seeds: a once's consumed state).
        gone = [k for k in (RollupField.LAST_RUN_AT.value,) if k in stored.fields]
        await records.update(FIRST_ID, fields, gone)
    log.info("the first fire: %s runs at %s, in %.0f s", FIRST_ID, iso(at), at - time.time())
    return True


class DevError(Exception):
    """`anyrtd dev` cannot start; the message says why and what to do."""


async def ensure_sample(client: ServerClient, space: str, *, create: bool = True) -> bool:
    """Create the sample trigger unless it exists (or was deleted, or `create` is False);
    return whether it is there."""
    records = Records(client, space)
    try:
        if await records.get(SAMPLE_ID) is not None:
            return True
    except WriteError:
        if create:
            log.info("the sample trigger %s was deleted; not creating it again", SAMPLE_ID)
        return False
    if not create:
        return False
    await records.create(SAMPLE_ID, SAMPLE)
    log.info("created the sample trigger %s: a reminder every minute", SAMPLE_ID)
    return True


async def _free_id(records: Records, base: str) -> tuple[str, bool]:
    """Return `base` and whether it exists, or the first `base-N` id not taken or tombstoned."""
    for n in range(1, 100):
        candidate = base if n == 1 else f"{base}-{n}"
        try:
            stored = await records.get(candidate)
        except WriteError:  # tombstoned: the id cannot be used again
            continue
        return candidate, stored is not None
    return f"{base}-{os.getpid()}", False


@dataclass(frozen=True)
class DevReady:
    """What `anyrtd dev` started, for the how-to the command line prints."""

    server_url: str
    control: Address
    state_dir: Path
    space: str
    peer: str | None
    sample_id: str | None
    """The sample trigger, when it is there to try (None with --no-sample or once deleted)."""
    new_id: str
    """An id to suggest to `triggers create`: `hello`, or a free one when that is tombstoned."""
    new_exists: bool
    """Whether `new_id` names a live trigger already (made by an earlier session)."""
    first_at: float | None = None
    """When the first fire (`FIRST_ID`) runs, when it was armed (None with --no-sample)."""


async def _watch_chat(client: ServerClient, space: str) -> None:
    """Log each new message of the general chat, so the sample's effect shows in the log."""
    chat = await Records(client, space).general_chat()
    page = await client.changes(space, since=2**53, wait=0)
    if page is None:
        return
    since = page.seq
    while True:
        try:
            page = await client.changes(space, since=since, wait=CHAT_POLL_S)
        except (ServerUnavailable, ServerError):
            await asyncio.sleep(1.0)
            continue
        if page is None:
            return
        since = page.seq
        for change in page.changes:
            if change.object_id == chat and change.op == "create" and change.record:
                who = change.record.get("agent") or change.record.get("author") or "someone"
                log.info("general chat: %s: %s", who, str(change.record.get("text", ""))[:200])


async def run_dev(
    config: Config,
    *,
    port: int,
    sample: bool,
    stop: asyncio.Event,
    ready: Callable[[DevReady], None],
    hurry: asyncio.Event | None = None,
) -> None:
    """Run the devserver, the daemon and the control API until `stop` is set (and, once
    `hurry` is set, interrupt the runs in flight); call `ready` with what runs where once
    everything answers."""
    try:
        lock_state_dir(config.state_dir)  # before anything is opened: one daemon per mirror
    except StateDirError as exc:
        raise DevError(str(exc)) from None
    config.state_dir.mkdir(parents=True, exist_ok=True)
    db = config.state_dir / "devserver.sqlite3"
    try:
        devserver = await start_devserver(db, port=port, space=config.space)
    except DevServerError as exc:
        raise DevError(f"{exc} (is another `anyrtd dev` or `anyrtd devserver` running?)") from None
    tasks: list[asyncio.Task[None]] = []
    try:
        config = config.with_overrides(server=devserver.url)
        async with ServerClient(devserver.url) as client:
            has_sample = await ensure_sample(client, config.space, create=sample)
            new_id, new_exists = await _free_id(Records(client, config.space), "hello")
        try:
            daemon, control = await start_daemon(config, hurry)
        except StartError as exc:
            raise DevError(str(exc)) from None
        try:
            watcher = ServerClient(devserver.url)
            tasks.append(asyncio.create_task(_watch_chat(watcher, config.space)))
            assert control.address is not None
            first_at: float | None = None
            if sample:
                at = time.time() + FIRST_IN_S
                if await arm_first(watcher, config.space, at, daemon.peer_id or ""):
                    first_at = at
            ready(
                DevReady(
                    server_url=devserver.url,
                    control=control.address,
                    state_dir=config.state_dir,
                    space=config.space,
                    peer=daemon.peer_id,
                    sample_id=SAMPLE_ID if has_sample else None,
                    new_id=new_id,
                    new_exists=new_exists,
                    first_at=first_at,
                )
            )
            await stop.wait()
            log.info("stopping: letting in-flight runs finish")
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if tasks:
                await watcher.aclose()
            await control.stop()
            await daemon.stop()
    finally:
        await devserver.close()
    log.info("stopped; the state is in %s", config.state_dir)
