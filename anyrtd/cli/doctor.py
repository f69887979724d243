"""`anyrtd doctor`: check the set-up part by part and say how to fix what is wrong."""

from __future__ import annotations

import time

import click

from anyrtd.cli import format as fmt
from anyrtd.cli.shared import client_command, echo, emit_json, json_option
from anyrtd.config import Config


@click.command()
@client_command
@json_option
def doctor(config: Config, as_json: bool) -> None:
    """Check the set-up, part by part, and say how to fix what is wrong."""
    import asyncio
    import os

    from anyrtd.cli.checks import Check, diagnose
    from anyrtd.cli.service import service_config
    from anyrtd.cli.shared import shared

    # The installed service's configuration, when no file and state directory were given.
    config, read = service_config(config, shared(click.get_current_context()), os.environ)
    checks = [Check("config", "ok", read)] if read else []
    checks += asyncio.run(diagnose(config, time.time()))
    if as_json:
        emit_json([c.to_json() for c in checks])
    else:
        colours = {"ok": "green", "warn": "yellow", "fail": "red", "skip": None}
        for c in checks:
            mark = click.style(c.status.ljust(4), fg=colours.get(c.status))
            echo(f"  {c.name.ljust(8)} {fmt.field(c.detail)}", raw_prefix=mark)
            if c.fix and c.status in ("warn", "fail"):
                echo(f"{'':14} fix: {fmt.field(c.fix)}")
    if any(c.status == "fail" for c in checks):
        raise SystemExit(1)
