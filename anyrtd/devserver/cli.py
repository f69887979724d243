"""The `anyrtd devserver` command."""

import click


@click.command()
def devserver() -> None:
    """Run the local edition of the any server."""
    raise click.ClickException("devserver: being built (issue 2)")
