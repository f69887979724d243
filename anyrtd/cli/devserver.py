"""The `anyrtd devserver` command: the local edition of the any server, on its own.

The devserver (aiohttp, its SQLite store) is imported when the command runs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from anyrtd.cli.shared import Seconds, echo
from anyrtd.config import default_state_dir

LINE = "anyrtd devserver: device {index} {peer} {url}"
"""The line printed per device on start; tests and scripts parse it."""

_SPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=7001,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port of device 1; device i listens on port+i-1 (0: a free port each).",
)
@click.option(
    "--devices",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="How many device endpoints, each with its own peer id.",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="SQLite file with all state [default: <state dir>/devserver.sqlite3].",
)
@click.option("--space", default="bao", show_default=True, help="Space to create when missing.")
@click.option(
    "--replicated",
    is_flag=True,
    help="Give each device its own replica, synced like separate servers.",
)
@click.option(
    "--sync-delay",
    type=Seconds(0, 3600),
    default=None,
    help="Seconds before a write reaches the other replicas (implies --replicated).",
)
def devserver(
    host: str,
    port: int,
    devices: int,
    db: Path | None,
    space: str,
    replicated: bool,
    sync_delay: float | None,
) -> None:
    """Run the local edition of the any server."""
    import asyncio
    import logging

    from anyrtd.devserver.server import DevServerError
    from anyrtd.devserver.store import StoreError

    if not _SPACE.fullmatch(space):
        raise click.BadParameter(
            "use letters, digits, '.', '_' and '-', up to 64", param_hint="--space"
        )
    if port and port + devices - 1 > 65535:
        raise click.BadParameter(
            f"with --devices {devices} the last port would pass 65535", param_hint="--port"
        )
    path = db if db is not None else default_state_dir() / "devserver.sqlite3"
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    try:
        asyncio.run(
            _serve(
                path,
                host,
                port,
                devices,
                space,
                replicated or sync_delay is not None,
                sync_delay or 0.0,
            )
        )
    except (DevServerError, StoreError) as exc:
        raise click.ClickException(str(exc)) from None


async def _serve(
    path: Path, host: str, port: int, devices: int, space: str, replicated: bool, sync_delay: float
) -> None:
    import asyncio
    import logging
    import signal

    from anyrtd.devserver.server import start_devserver

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await start_devserver(
        path,
        host,
        port,
        devices,
        space,
        replicated=replicated,
        sync_delay=sync_delay,
        access_log=True,
    )
    try:
        for index, (peer, url) in enumerate(zip(server.peers, server.urls, strict=True), 1):
            echo(LINE.format(index=index, peer=peer, url=url))
        sys.stdout.flush()
        mode = f"replicated, sync delay {sync_delay}s" if replicated else "one shared store"
        logging.getLogger("anyrtd.devserver").info("serving %s (%s); stop with Ctrl-C", path, mode)
        await stop.wait()
    finally:
        await server.close()
