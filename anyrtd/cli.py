"""The `anyrtd` command line: the only module (with its helpers) that prints."""

from __future__ import annotations

import click

from anyrtd import __version__
from anyrtd.devserver.cli import devserver


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="anyrtd")
def main() -> None:
    """anyrtd: run your agent's triggers on the device that holds the pin."""


main.add_command(devserver)
