"""`anyrtd serve`, `anyrtd dev` and `anyrtd db`: the daemon, the local set-up, the schema.

The daemon, the devserver and the mirror are imported inside the commands, so that
the client commands never load SQLAlchemy, Alembic or the aiohttp server.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from anyrtd.address import TcpAddress
from anyrtd.cli.shared import (
    CONFIG_OPTION,
    LISTEN_OPTION,
    SPACE_OPTION,
    echo,
    pass_config,
    shared,
    shared_option,
    shared_options,
)
from anyrtd.config import DEFAULT_LISTEN, DEFAULT_SERVER, Config
from anyrtd.mirror_guard import EXIT_BROKEN_STATE

if TYPE_CHECKING:
    from anyrtd.dev import DevReady

LOG_LEVEL_OPTION = click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)


@click.command()
@shared_options
@click.option(
    "--tick", "tick_s", metavar="SECONDS", help="Seconds between reconciles [default: 5]."
)
@click.option(
    "--election-poll",
    "election_poll_s",
    metavar="SECONDS",
    help="Seconds between election polls [default: 10].",
)
@click.option(
    "--runs-kept-per-trigger",
    "runs_kept_per_trigger",
    metavar="COUNT",
    help="Finished runs of each trigger the mirror keeps, newest first [default: 1000].",
)
@click.option(
    "--rebuild-mirror",
    is_flag=True,
    help="If the mirror is missing, emptied, damaged or not anyrtd's, move it aside and "
    "start afresh (as `anyrtd db rebuild`); a good mirror is kept.",
)
@LOG_LEVEL_OPTION
def serve(
    tick_s: str | None,
    election_poll_s: str | None,
    runs_kept_per_trigger: str | None,
    rebuild_mirror: bool,
    log_level: str,
) -> None:
    """Run the scheduler daemon."""
    import asyncio

    from anyrtd.logs import setup_logging
    from anyrtd.serve import StartError
    from anyrtd.serve import serve as run_daemon

    given = shared(click.get_current_context())
    # The loop flags are config keys like the others: checked on the same path.
    flags = {
        "tick_s": tick_s,
        "election_poll_s": election_poll_s,
        "runs_kept_per_trigger": runs_kept_per_trigger,
    }
    config = given.config(**flags)
    setup_logging(log_level)

    def reload() -> Config:
        return given.load(**flags)

    try:
        asyncio.run(run_daemon(config, reload=reload, rebuild_mirror=rebuild_mirror))
    except StartError as exc:
        raise failure(str(exc), exc.exit_status) from None


class BrokenState(click.ClickException):
    """The mirror cannot be used as it is: a restart would fail the same way."""

    exit_code = EXIT_BROKEN_STATE


def failure(message: str, exit_status: int) -> click.ClickException:
    """Return the one-line error that exits with `exit_status` (1 or `EXIT_BROKEN_STATE`)."""
    if exit_status == EXIT_BROKEN_STATE:
        return BrokenState(message)
    return click.ClickException(message)


@click.group()
def db() -> None:
    """Manage the mirror's schema (SQLite, Alembic)."""


@db.command("upgrade")
@pass_config
def db_upgrade(config: Config) -> None:
    """Bring the mirror's schema to the revision this anyrtd needs."""
    from anyrtd.mirror import Mirror

    lock_state(config)  # not under a running daemon
    path = config.mirror_path
    with mirror_faults(path):
        mirror = Mirror(path)
        try:
            before = mirror.upgrade_checked()
            _, head = mirror.revisions()
        finally:
            mirror.close()
    if before == head:
        echo(f"{path}: already at {head}")
    else:
        echo(f"{path}: upgraded {before or 'empty'} -> {head}")


@db.command("current")
@pass_config
def db_current(config: Config) -> None:
    """Show the mirror's schema revision and the one this anyrtd needs."""
    from anyrtd.mirror import Mirror, SchemaNotAtHead
    from anyrtd.mirror_guard import lost, read_marker

    path = config.mirror_path
    with mirror_faults(path):
        if not path.exists():
            if read_marker(path) is not None:
                raise lost(path, "is missing")
            raise click.ClickException(
                f"no mirror at {path}: run `anyrtd db upgrade` or start `anyrtd serve`"
            )
        mirror = Mirror(path)
        try:
            empty = mirror.is_empty()
            if empty and read_marker(path) is not None:
                raise lost(path, "is empty")
            current, head = mirror.revisions()
            try:
                if not empty:
                    mirror.check_revision()
                state = "at head" if current == head else "behind: run `anyrtd db upgrade`"
            except SchemaNotAtHead as exc:
                state = str(exc)
        finally:
            mirror.close()
    echo(f"{path}: {current or 'empty'} (head {head}, {state})")


@db.command("rebuild")
@pass_config
def db_rebuild(config: Config) -> None:
    """Start the mirror afresh: move the old one aside (kept, renamed) and forget it was here.

    What only the old mirror held is lost: runs not yet recorded on the server, the outbox,
    and `once` consumption not yet synced (so a `once` may fire twice).
    """
    from anyrtd.mirror_guard import rebuild

    lock_state(config)  # not under a running daemon
    with mirror_faults(config.mirror_path):
        echo(rebuild(config.mirror_path, "asked by `anyrtd db rebuild`"))


def lock_state(config: Config) -> None:
    """Lock the state directory for this command, or exit with the one line that says why."""
    from anyrtd.statedir import StateDirError, lock_state_dir

    try:
        lock_state_dir(config.state_dir)
    except StateDirError as exc:
        raise click.ClickException(str(exc)) from None


@contextlib.contextmanager
def mirror_faults(path: Path) -> Iterator[None]:
    """Turn what goes wrong with the mirror at `path` into one line and a non-zero exit.

    A `MirrorFault` exits `EXIT_BROKEN_STATE`; any other database or file error names the
    file and its first line, never a traceback.
    """
    from alembic.util import CommandError
    from sqlalchemy.exc import DBAPIError, SQLAlchemyError

    from anyrtd.mirror_guard import MirrorFault

    try:
        yield
    except MirrorFault as exc:
        raise failure(str(exc), exc.exit_status) from None
    except (SQLAlchemyError, CommandError, OSError) as exc:
        cause = exc.orig if isinstance(exc, DBAPIError) else exc
        first = (str(cause).splitlines() or [cause.__class__.__name__])[0]
        raise failure(f"the mirror {path} cannot be used: {first}", EXIT_BROKEN_STATE) from None


@click.command()
@CONFIG_OPTION
@shared_option(
    "--state-dir",
    name="state_dir",
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
@LISTEN_OPTION
@SPACE_OPTION
@click.option("--tick", "tick_s", metavar="SECONDS", help="Seconds between ticks [default: 5].")
@click.option("--no-sample", is_flag=True, help="Do not create the sample trigger.")
@LOG_LEVEL_OPTION
def dev(port: int, tick_s: str | None, no_sample: bool, log_level: str) -> None:
    """Run a local any server, the daemon and the control API, with a sample trigger."""
    import asyncio

    from anyrtd.dev import DevError, run_dev
    from anyrtd.logs import setup_logging

    given = shared(click.get_current_context())
    config = given.config(tick_s=tick_s)
    setup_logging(log_level)
    invoked = invocation()

    def ready(what: DevReady) -> None:
        echo(how_to(what, invoked))

    async def main() -> None:

        from anyrtd.serve import on_stop_signals

        stop, hurry = asyncio.Event(), asyncio.Event()
        on_stop_signals(asyncio.get_running_loop(), stop, hurry)
        await run_dev(config, port=port, sample=not no_sample, stop=stop, hurry=hurry, ready=ready)

    try:
        asyncio.run(main())
    except DevError as exc:
        raise click.ClickException(str(exc)) from None


def invocation(argv0: str | None = None, path: str | None = None) -> str:
    """Return how to run anyrtd again from a shell: `anyrtd` if that is the one on PATH,
    else the command as it was invoked (`.venv/bin/anyrtd`, `python -m anyrtd`)."""
    import shutil

    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) == "__main__.py":
        return f"{shlex.quote(sys.executable)} -m anyrtd"
    found = shutil.which("anyrtd", path=path)
    if found is not None:
        try:
            if os.path.samefile(found, argv0):
                return "anyrtd"
        except OSError:
            pass
    return shlex.quote(argv0)


def how_to(ready: DevReady, anyrtd: str = "anyrtd") -> str:
    """Return the printed how-to: what runs where, and the next commands to try."""
    from anyrtd.cli import format as fmt
    from anyrtd.dev import FIRST_ID

    address = ready.control
    env = []
    if ready.server_url != DEFAULT_SERVER:
        env.append(f"ANYRTD_SERVER={ready.server_url}")
    if str(address) != DEFAULT_LISTEN:
        env.append(f"ANYRTD_LISTEN={address}")
    if ready.space != Config().space:
        env.append(f"ANYRTD_SPACE={shlex.quote(ready.space)}")
    if isinstance(address, TcpAddress):
        curl = f"curl -s {address.url}"
    else:
        curl = f"curl -s --unix-socket {address.path} http://localhost"
    post = curl.replace("curl -s", "curl -X POST", 1)
    sample = ready.sample_id
    if sample is not None:
        sample_line = f"{sample}: a reminder in the general chat every minute"
        target = sample
    else:
        sample_line = "none (--no-sample, or it was deleted)"
        target = ready.new_id
    tries = [f"{anyrtd} triggers list"]
    if ready.first_at is not None:
        tries.insert(0, f"{anyrtd} runs list --trigger {FIRST_ID}")
    if sample is not None:
        tries += [
            f"{anyrtd} triggers show {sample}",
            f"{anyrtd} triggers run {sample} --wait",
            f"{anyrtd} runs list",
        ]
    if ready.new_exists:
        tries.append(f"{anyrtd} triggers show {ready.new_id}")
    else:
        tries.append(
            f"{anyrtd} triggers create --id {ready.new_id} --every 30 "
            "--program agent:remind@v1 --arg text=hello"
        )
    tries += [
        f"{anyrtd} triggers disable {target}",
        f"{anyrtd} doctor",
        f"{curl}/triggers | jq '.[] | {{id, kind, owner, enabled, lastStatus}}'",
        f"{post}/triggers/{target}/disable",
        f"{curl}/metrics",
    ]
    if env:
        tries.insert(0, f"export {' '.join(env)}")
    commands = "\n".join(f"  {line}" for line in tries)
    page = f"{address.url}/" if isinstance(address, TcpAddress) else "(TCP only)"
    first_line = ""
    if ready.first_at is not None:
        seen = f"on the status page, {page}" if isinstance(address, TcpAddress) else "below"
        first_line = (
            f"\n  first fire              {FIRST_ID} at {fmt.clock(ready.first_at)} "
            f"(a few seconds from now): a reminder in the general chat; see it {seen}, "
            f"or `{anyrtd} runs list --trigger {FIRST_ID}`"
        )
    return f"""
anyrtd dev is running
  any server (devserver)  {ready.server_url}   (data: {ready.state_dir / "devserver.sqlite3"})
  control API             {address}
  this device             {ready.peer or "(resolving)"}
  status page             {page}
  sample trigger          {sample_line}{first_line}

Try, in another terminal:
{commands}

Ctrl-C stops everything; the state stays in {ready.state_dir} for the next `{anyrtd} dev`.
"""
