"""`anyrtd election` and `anyrtd devices`: who is active, the devices registry, the role."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from anyrtd.cli import format as fmt
from anyrtd.cli.shared import client_command, control, echo, emit_json, json_option, on_server
from anyrtd.config import Config
from anyrtd.vocab import Verdict

if TYPE_CHECKING:
    from anyrtd.control.writes import Records


@click.command()
@client_command
@json_option
def election(config: Config, as_json: bool) -> None:
    """Show this device's election verdict (as the daemon holds it)."""
    with control(config) as ctl:
        body = ctl.get("/election")
    if as_json:
        emit_json(body)
        return
    verdict = body.get("verdict") or (Verdict.ACTIVE if body.get("active") else Verdict.STANDBY)
    state = "on" if body.get("enabled") else "off (single-device: always active)"
    echo(f"this device: {fmt.field(body.get('peerId'))}")
    echo(f"verdict:     {fmt.field(verdict)}")
    echo(f"winner:      {fmt.field(body.get('winner') or '(none)')}")
    echo(f"election:    {state}")


@click.group()
def devices() -> None:
    """See the devices and move the active role."""


@devices.command("list")
@client_command
@json_option
def devices_list(config: Config, as_json: bool) -> None:
    """List the devices registry of the server."""

    async def work(records: Records) -> Any:
        return await records.client.devices()

    view = on_server(config, work)
    if view is None:
        raise click.ClickException(
            f"the server at {config.server} has no devices registry: the election is off"
        )
    from anyrtd.election import APP

    winner = view.active.get(APP)
    if as_json:
        emit_json(
            {
                "self": view.self_id,
                "active": dict(view.active),
                "devices": [
                    {
                        "peerId": d.peer_id,
                        "name": d.name,
                        "os": d.os,
                        "apps": d.apps,
                        "deleted": d.deleted,
                    }
                    for d in view.devices
                ],
            }
        )
        return
    rows = []
    for d in view.devices:
        flags = (
            ("self", d.peer_id == view.self_id),
            ("active", d.peer_id == winner),
            ("pruned", d.deleted),
        )
        marks = [m for m, on in flags if on]
        claim = d.apps.get(APP)
        version = claim.get("version", "-") if isinstance(claim, Mapping) else "-"
        rows.append([d.peer_id, d.name or "-", d.os or "-", str(version), ", ".join(marks)])
    echo(fmt.table(["PEER", "NAME", "OS", APP.upper(), ""], rows))


@devices.command("activate")
@client_command
@click.option(
    "--app",
    metavar="SLUG",
    help="The app slug whose role moves [default: anyrtd's own, as in `anyrtd election`].",
)
def devices_activate(config: Config, app: str | None) -> None:
    """Make this device (the one whose server --server names) the active one."""
    from anyrtd.election import APP

    slug = app or APP

    async def work(records: Records) -> Any:
        return await records.client.activate(slug)

    row = on_server(config, work)
    echo(
        f"{row.peer_id} now holds the newest claim for {slug!r}; "
        "the daemons follow within one election poll"
    )
