"""The `anyrtd` command line: the only module (with its helpers) that prints."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from anyrtd import __version__
from anyrtd.config import Config, ConfigError, load_config
from anyrtd.devserver.cli import devserver

F = TypeVar("F", bound=Callable[..., Any])


def config_options(fn: F) -> F:
    """Add the options every command shares to find the server, the daemon and the state."""
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(dir_okay=False),
            help="Config file (default: ~/.config/anyrtd/anyrtd.toml, /etc/anyrtd/anyrtd.toml).",
        ),
        click.option("--server", help="URL of the any server [default: http://127.0.0.1:7001]."),
        click.option("--space", help="The agent space id [default: bao]."),
        click.option(
            "--listen",
            help="Control API address: HOST:PORT or unix:/path [default: 127.0.0.1:7010].",
        ),
        click.option(
            "--state-dir",
            type=click.Path(file_okay=False, path_type=Path),
            help="Where the mirror lives [default: $STATE_DIRECTORY or ~/.local/state/anyrtd].",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def build_config(
    config_path: str | None,
    **flags: Any,
) -> Config:
    """Load the config, turning a bad value into a one-line CLI error."""
    try:
        return load_config(config_path, **flags)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def pop_config(kwargs: dict[str, Any]) -> Config:
    """Take the shared options out of a command's kwargs and build the config from them."""
    shared = ("config_path", "server", "space", "listen", "state_dir")
    values = {k: kwargs.pop(k, None) for k in shared}
    return build_config(values.pop("config_path"), **values)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="anyrtd")
def main() -> None:
    """anyrtd: run your agent's triggers on the device that holds the pin."""


main.add_command(devserver)


@main.command()
@config_options
@click.option("--tick", "tick_s", type=float, help="Seconds between reconciles [default: 5].")
@click.option(
    "--election-poll",
    "election_poll_s",
    type=float,
    help="Seconds between election polls [default: 10].",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
def serve(log_level: str, **kwargs: Any) -> None:
    """Run the scheduler daemon."""
    from anyrtd.logs import setup_logging
    from anyrtd.serve import StartError
    from anyrtd.serve import serve as run_daemon

    tick_s, poll_s = kwargs.pop("tick_s"), kwargs.pop("election_poll_s")
    config_path = kwargs.get("config_path")
    shared = dict(kwargs)
    config = pop_config(kwargs).with_overrides(tick_s=tick_s, election_poll_s=poll_s)
    setup_logging(log_level)

    def reload() -> Config:
        values = {k: v for k, v in shared.items() if k != "config_path"}
        return load_config(config_path, **values).with_overrides(
            tick_s=tick_s, election_poll_s=poll_s
        )

    try:
        asyncio.run(run_daemon(config, reload=reload))
    except StartError as exc:
        raise click.ClickException(str(exc)) from None


@main.group()
def db() -> None:
    """Manage the mirror's schema (SQLite, Alembic)."""


def _db_options(fn: F) -> F:
    @config_options
    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        return fn(pop_config(kwargs))

    return wrapper  # type: ignore[return-value]


@db.command("upgrade")
@_db_options
def db_upgrade(config: Config) -> None:
    """Bring the mirror's schema to the revision this anyrtd needs."""
    from anyrtd.mirror import Mirror
    from anyrtd.statedir import StateDirError, hold_state_dir

    try:
        hold_state_dir(config.state_dir)  # not under a running daemon
    except StateDirError as exc:
        raise click.ClickException(str(exc)) from None
    mirror = Mirror(config.mirror_path)
    try:
        before, head = mirror.revisions()
        mirror.upgrade()
    finally:
        mirror.close()
    if before == head:
        click.echo(f"{config.mirror_path}: already at {head}")
    else:
        click.echo(f"{config.mirror_path}: upgraded {before or 'empty'} -> {head}")


@db.command("current")
@_db_options
def db_current(config: Config) -> None:
    """Show the mirror's schema revision and the one this anyrtd needs."""
    from anyrtd.mirror import Mirror

    if not config.mirror_path.exists():
        raise click.ClickException(
            f"no mirror at {config.mirror_path}: run `anyrtd db upgrade` or start `anyrtd serve`"
        )
    mirror = Mirror(config.mirror_path)
    try:
        current, head = mirror.revisions()
    finally:
        mirror.close()
    state = "at head" if current == head else "behind: run `anyrtd db upgrade`"
    click.echo(f"{config.mirror_path}: {current or 'empty'} (head {head}, {state})")


from anyrtd.control.cli import COMMANDS  # noqa: E402 - needs config_options defined above
from anyrtd.dev import dev  # noqa: E402

for _command in [dev, *COMMANDS]:
    main.add_command(_command)
