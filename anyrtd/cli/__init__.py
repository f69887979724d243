"""The `anyrtd` command line: every module that prints lives in this package.

One module per command family (`serve`: serve, dev and db; `triggers`; `runs`; `agenda`;
`devices`: election and devices; `doctor`; `devserver`), the options they share
(`shared`), the control API's client (`control`) and the text they print (`format`).
No module imports this one: the group only gathers them.
"""

from __future__ import annotations

import click

from anyrtd import __version__
from anyrtd.cli.agenda import agenda
from anyrtd.cli.devices import devices, election
from anyrtd.cli.devserver import devserver
from anyrtd.cli.doctor import doctor
from anyrtd.cli.programs import programs
from anyrtd.cli.runs import runs
from anyrtd.cli.schedule import schedule
from anyrtd.cli.serve import db, dev, serve
from anyrtd.cli.service import service
from anyrtd.cli.shared import EscapingGroup, Shared, shared_options
from anyrtd.cli.triggers import triggers


@click.group(cls=EscapingGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="anyrtd")
@shared_options
@click.pass_context
def main(ctx: click.Context) -> None:
    """anyrtd: run your agent's triggers on the device that holds the pin."""
    ctx.ensure_object(Shared)


for _command in (serve, db, devserver, dev, triggers, runs, election, devices, doctor, service):
    main.add_command(_command)
for _command in (schedule, programs, agenda):
    main.add_command(_command)

__all__ = ["main"]
