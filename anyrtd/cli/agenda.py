"""`anyrtd agenda`: what the space's triggers will run, where, in the next hours, and what
is at risk of being missed (the daemon's `GET /agenda`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import click

from anyrtd.agenda import DEFAULT_HOURS, MAX_HOURS
from anyrtd.cli import format as fmt
from anyrtd.cli.shared import client_command, control, echo, emit_json, json_option
from anyrtd.config import Config


def _device(o: Mapping[str, Any]) -> str:
    device = o.get("device") or "(no active device)"
    name = o.get("deviceName")
    return f"{name} ({device})" if name else str(device)


def _state(o: Mapping[str, Any], now: float) -> str:
    state = str(o.get("deviceState") or "").replace("_", " ")
    since = o.get("deviceSince")
    if o.get("deviceState") == "not_running":
        return f"{state} since {fmt.when(since, now)}" if since is not None else f"{state} at all"
    return state


def agenda_table(items: Sequence[Mapping[str, Any]], now: float) -> str:
    """Return the occurrences as a table: WHEN in the schedule's zone, AT RISK with its cause."""
    rows = [
        [
            str(o.get("local") or "(on each event)"),
            str(o["triggerId"]) + (f" (after {o['after']})" if o.get("after") else ""),
            _device(o),
            _state(o, now),
            f"at risk: {o.get('cause')}" if o.get("atRisk") else "-",
        ]
        for o in items
    ]
    return fmt.table(["WHEN", "TRIGGER", "DEVICE", "STATE", "RISK"], rows)


def risks(items: Sequence[Mapping[str, Any]]) -> list[str]:
    """Return one line per trigger at risk (its first occurrence), with the reason and fix."""
    seen: set[str] = set()
    lines: list[str] = []
    for o in items:
        tid = str(o["triggerId"])
        if not o.get("atRisk") or tid in seen:
            continue
        seen.add(tid)
        lines.append(f"- {tid}: {o.get('reason')}")
        if o.get("fix"):
            lines.append(f"  fix:  {o['fix']}")
    return lines


@click.command()
@client_command
@click.option(
    "--hours",
    type=click.FloatRange(0, MAX_HOURS, min_open=True),
    default=DEFAULT_HOURS,
    show_default=True,
    help=f"How far ahead to look (at most {MAX_HOURS:g}: a week).",
)
@click.option("--device", metavar="PEER", help="Only this device's (a peer id or a device name).")
@json_option
def agenda(config: Config, hours: float, device: str | None, as_json: bool) -> None:
    """List what every device of the space will run in the next hours, the ones at risk
    of being missed marked, each with its fix."""
    with control(config) as ctl:
        body = ctl.get("/agenda", hours=f"{hours:g}", device=device)
    if as_json:
        emit_json(body)
        return
    now = time.time()
    items = [*body.get("occurrences", []), *body.get("listening", [])]
    if not items:
        echo(f"nothing in the next {hours:g} h")
        return
    echo(agenda_table(items, now))
    if body.get("capped"):
        capped = ", ".join(body["capped"])
        echo(f"(more than 100 occurrences in the window, not all listed: {capped})")
    if body.get("truncated"):
        echo("(the list stops at 10,000 occurrences)")
    lines = risks(items)
    if lines:
        echo()
        echo(f"at risk ({body.get('atRisk', 0)} occurrences):")
        for line in lines:
            echo(line)
