"""`anyrtd programs`: what this device can run, and where each program comes from.

The answer is the runner's own lookup (`anyrtd.runner.Runner.resolve`) over this device's
config, so the list says what the daemon started with the same config would run. The
runner is imported only when a command asks, never for `anyrtd --help`.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import click

from anyrtd.cli import format as fmt
from anyrtd.cli.shared import echo, emit_json, json_option, pass_config
from anyrtd.config import Config

if TYPE_CHECKING:
    from anyrtd.client import ServerClient
    from anyrtd.runner import Runner

SOURCE_WORDS = {"builtin": "built-in", "entry_point": "entry point", "command": "command"}


@dataclass(frozen=True)
class Listed:
    """One program this device knows of: where it comes from, and whether it can run here."""

    spec: str
    source: str  # builtin, entry_point or command
    origin: str  # the function, the entry point's object, or the command's argv[0]
    distribution: str | None = None
    problem: str | None = None  # why it does not run here (broken, or shadowed by another)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def local_runner(config: Config, client: ServerClient) -> Runner:
    """Return a runner with this device's program table, as `anyrtd serve` would build it."""
    from anyrtd.clock import SystemClock
    from anyrtd.runner import Runner

    return Runner(
        client=client,
        clock=SystemClock(),
        agent_name=config.agent_name,
        space=config.space,
        commands=config.programs,
    )


@contextmanager
def _load_errors() -> Iterator[list[str]]:
    """Collect the runner's own warnings about programs that fail to load."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logger = logging.getLogger("anyrtd.runner")
    handler, propagate = Keep(logging.WARNING), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield said
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def listing(config: Config, runner: Runner) -> list[Listed]:
    """Return every program a source offers here, each resolved by the runner."""
    from anyrtd.programs import BUILTINS
    from anyrtd.runner import ENTRY_POINT_GROUP

    offered: list[tuple[str, str, str | None]] = [(s, "builtin", None) for s in sorted(BUILTINS)]
    seen: set[str] = set()
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in seen:
            continue  # the first distribution on sys.path wins, as in the runner
        seen.add(ep.name)
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else None
        offered.append((ep.name, "entry_point", dist))
    offered += [(s, "command", None) for s in sorted(config.programs)]
    rows: list[Listed] = []
    for spec, source, dist in offered:
        with _load_errors() as said:
            found = runner.resolve(spec)
        if found is not None and found.source == source:
            rows.append(Listed(spec, source, found.origin, dist))
            continue
        origin = _origin(config, spec, source)
        if found is not None:
            problem = f"shadowed by the {SOURCE_WORDS[found.source]} of the same name"
        else:
            problem = said[-1].split(": ", 1)[-1] if said else "cannot be loaded"
        rows.append(Listed(spec, source, origin, dist, problem))
    return rows


def _origin(config: Config, spec: str, source: str) -> str:
    if source == "command":
        return config.programs[spec].argv[0]
    if source == "entry_point":
        from anyrtd.runner import ENTRY_POINT_GROUP

        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=spec)
        return next((ep.value for ep in eps), "?")
    return "?"


def runs_here(runner: Runner, spec: str) -> bool:
    """Return whether the runner finds `spec` on this device."""
    with _load_errors():
        return runner.is_installed(spec)


@click.group()
def programs() -> None:
    """See the programs this device can run."""


@programs.command("list")
@pass_config
@json_option
def programs_list(config: Config, as_json: bool) -> None:
    """List the programs this device can run: built-ins, entry points and declared commands."""
    import asyncio

    from anyrtd.client import ServerClient

    async def main() -> list[Listed]:
        # The runner holds a server client for the runs it starts; nothing is sent here.
        async with ServerClient(config.server) as client:
            return listing(config, local_runner(config, client))

    rows = asyncio.run(main())
    if as_json:
        emit_json([row.to_json() for row in rows])
        return
    table = []
    for row in rows:
        where = row.origin
        if row.distribution:
            where += f" (distribution {row.distribution})"
        if row.source == "command" and config.source is not None:
            where += f" (config {config.source})"
        table.append(
            [
                row.spec,
                SOURCE_WORDS[row.source],
                "no: " + row.problem if row.problem else "yes",
                where,
            ]
        )
    echo(fmt.table(["PROGRAM", "SOURCE", "RUNS HERE", "FROM"], table))
    if not config.programs:
        where = str(config.source or "the config file")
        echo(f'\nno [programs."…"] table in {where}: no declared commands')
