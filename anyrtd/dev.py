"""`anyrtd dev`: the devserver, the daemon and the control API in one process, with a sample.

Like `temporal server start-dev`: one command gives a working local set-up. The
devserver keeps its SQLite file and the daemon its mirror under the state
directory, so running it again picks up where the last run stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Any

import click

from anyrtd.client import ServerClient, ServerError, ServerUnavailable
from anyrtd.config import Config, ConfigError, load_config
from anyrtd.control.address import TcpAddress
from anyrtd.control.server import ControlServer
from anyrtd.control.writes import Records, WriteError
from anyrtd.devserver import DevServerError, start_devserver
from anyrtd.serve import StartError, start_daemon
from anyrtd.statedir import StateDirError, hold_state_dir

log = logging.getLogger("anyrtd.dev")

SAMPLE_ID = "dev-reminder"
SAMPLE: dict[str, Any] = {
    "name": "Dev reminder",
    "kind": "cron",
    "spec": {"cron": "* * * * *"},
    "program": "agent:remind@v1",
    "args": {"text": "Reminder from anyrtd dev: this trigger fires every minute."},
    "owner": "",
    "enabled": True,
}
CHAT_POLL_S = 25.0


class DevError(Exception):
    """`anyrtd dev` cannot start; the message says why and what to do."""


async def ensure_sample(client: ServerClient, space: str) -> bool:
    """Create the sample trigger unless it exists (or was deleted); return True if created."""
    records = Records(client, space)
    try:
        if await records.get(SAMPLE_ID) is not None:
            return False
    except WriteError:
        log.info("the sample trigger %s was deleted; not creating it again", SAMPLE_ID)
        return False
    await records.create(SAMPLE_ID, SAMPLE)
    log.info("created the sample trigger %s: a reminder every minute", SAMPLE_ID)
    return True


def how_to(server_url: str, control: ControlServer, state_dir: Path, peer: str | None) -> str:
    """Return the printed how-to: what runs where, and the next commands to try."""
    address = control.address
    assert address is not None
    env = []
    if server_url != "http://127.0.0.1:7001":
        env.append(f"ANYRTD_SERVER={server_url}")
    if str(address) != "127.0.0.1:7010":
        env.append(f"ANYRTD_LISTEN={address}")
    prefix = f"export {' '.join(env)}\n  " if env else ""
    if isinstance(address, TcpAddress):
        curl = f"curl -s {address.url}"
    else:
        curl = f"curl -s --unix-socket {address.path} http://localhost"
    post = curl.replace("curl -s", "curl -X POST", 1)
    return f"""
anyrtd dev is running
  any server (devserver)  {server_url}   (data: {state_dir / "devserver.sqlite3"})
  control API             {address}
  this device             {peer or "(resolving)"}
  status page             {address.url + "/" if isinstance(address, TcpAddress) else "(TCP only)"}
  sample trigger          {SAMPLE_ID}: a reminder in the general chat every minute

Try, in another terminal:
  {prefix}anyrtd triggers list
  anyrtd triggers show {SAMPLE_ID}
  anyrtd triggers run {SAMPLE_ID} --wait
  anyrtd runs list
  anyrtd triggers create --id hello --every 30 --program agent:remind@v1 --arg text=hello
  anyrtd triggers disable {SAMPLE_ID}
  anyrtd doctor
  {curl}/triggers | jq '.[] | {{id, kind, owner, enabled, lastStatus}}'
  {post}/triggers/{SAMPLE_ID}/disable
  {curl}/metrics

Ctrl-C stops everything; the state stays in {state_dir} for the next `anyrtd dev`.
"""


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


async def run_dev(config: Config, *, port: int, sample: bool, stop: asyncio.Event) -> None:
    """Run the devserver, the daemon and the control API until `stop` is set."""
    try:
        hold_state_dir(config.state_dir)  # before anything is opened: one daemon per mirror
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
            if sample:
                await ensure_sample(client, config.space)
        try:
            daemon, control = await start_daemon(config)
        except StartError as exc:
            raise DevError(str(exc)) from None
        try:
            watcher = ServerClient(devserver.url)
            tasks.append(asyncio.create_task(_watch_chat(watcher, config.space)))
            click.echo(how_to(devserver.url, control, config.state_dir, daemon.peer_id))
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


@click.command()
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the devserver's data and the mirror live [default: ~/.local/state/anyrtd].",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=7001,
    show_default=True,
    help="The devserver's port (0: a free one).",
)
@click.option(
    "--listen",
    help="Control API address: HOST:PORT or unix:/path [default: 127.0.0.1:7010].",
)
@click.option("--space", help="The agent space [default: bao].")
@click.option("--tick", "tick_s", type=click.FloatRange(min=0.05), help="Seconds between ticks.")
@click.option("--no-sample", is_flag=True, help="Do not create the sample trigger.")
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
def dev(
    state_dir: Path | None,
    port: int,
    listen: str | None,
    space: str | None,
    tick_s: float | None,
    no_sample: bool,
    log_level: str,
) -> None:
    """Run a local any server, the daemon and the control API, with a sample trigger."""
    from anyrtd.logs import setup_logging

    try:
        config = load_config(None, state_dir=state_dir, listen=listen, space=space)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    config = config.with_overrides(tick_s=tick_s)
    setup_logging(log_level)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_dev(config, port=port, sample=not no_sample, stop=stop)

    try:
        asyncio.run(main())
    except DevError as exc:
        raise click.ClickException(str(exc)) from None
