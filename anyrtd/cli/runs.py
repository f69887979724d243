"""`anyrtd runs`: the runs on this device, as a table or one run in full."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from anyrtd.cli import format as fmt
from anyrtd.cli.shared import (
    client_command,
    complete_run,
    complete_trigger,
    control,
    echo,
    emit_json,
    json_option,
    one_line,
    path_id,
)
from anyrtd.config import Config
from anyrtd.vocab import SOURCE_HEADER, HistorySource, RunStatus

if TYPE_CHECKING:
    from anyrtd.cli.control import ControlClient


@click.group()
def runs() -> None:
    """See the runs on this device."""


def runs_table(items: list[dict[str, Any]], now: float) -> str:
    """Return runs as a table; LATE is `startedAt - scheduledAt`, blank for a manual run;
    AFTER RUN, when a chain's run is among them, the upstream run each answers."""
    rows = [
        [
            r["runId"],
            str(r.get("triggerId") or "-"),
            fmt.when(r.get("startedAt"), now),
            fmt.lateness(r.get("startedAt"), r.get("scheduledAt")),
            str(r.get("status")),
            fmt.duration(r.get("durationMs")),
            one_line(str(r.get("errorType") or r.get("title") or ""))[:40],
        ]
        for r in items
    ]
    headers = ["RUN", "TRIGGER", "STARTED", "LATE", "STATUS", "DURATION", "NOTE"]
    if any(r.get("upstreamRunId") for r in items):
        # A chain's run answers an upstream run (docs/events.md): say which fired which.
        headers.append("AFTER RUN")
        for row, r in zip(rows, items, strict=True):
            row.append(str(r.get("upstreamRunId") or ""))
    return fmt.table(headers, rows)


@runs.command("list")
@client_command
@click.option(
    "--trigger",
    "trigger_id",
    metavar="ID",
    shell_complete=complete_trigger,
    help="Only runs of this trigger.",
)
@click.option(
    "--status", type=click.Choice([s.value for s in RunStatus]), help="Only runs with this status."
)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@json_option
def runs_list(
    config: Config, trigger_id: str | None, status: str | None, limit: int, as_json: bool
) -> None:
    """List the newest runs on this device (with --trigger, that trigger's on every device)."""
    with control(config) as ctl:
        items = ctl.get("/runs", trigger=trigger_id, status=status, limit=limit)
        source = ctl.last_headers.get(SOURCE_HEADER)
    note = source_note(source) if trigger_id is not None else None
    if as_json:
        emit_json(items)
        if note is not None and source == HistorySource.MIRROR:
            echo(note, err=True)
        return
    echo(runs_table(items, time.time()) if items else "no runs")
    if note is not None:
        echo(f"({note})")  # after the table, whose first line stays its header


def source_note(source: str | None) -> str:
    """Return the line that says where a trigger's runs were read."""
    if source == HistorySource.SERVER:
        return "runs on every device (the server's agent_runs)"
    return "runs on this device only (the server is not reachable; from the mirror)"


def print_run(run: Mapping[str, Any], *, with_output: bool = True) -> None:
    """Print a run's summary and (unless `with_output` is false) its captured output."""
    now = time.time()
    lines = [
        ("run", run["runId"]),
        ("trigger", run.get("triggerId") or "-"),
        ("program", run.get("program")),
        ("device", run.get("device")),
        ("scheduled", fmt.when(run["scheduledAt"], now) if run.get("scheduledAt") else "by hand"),
        ("started", fmt.when(run.get("startedAt"), now)),
        ("late", fmt.lateness(run.get("startedAt"), run.get("scheduledAt")) or "-"),
        ("ended", fmt.when(run.get("endedAt"), now)),
        ("duration", fmt.duration(run.get("durationMs"))),
        ("status", run.get("status")),
    ]
    error = ": ".join(str(part) for part in (run.get("errorType"), run.get("error")) if part)
    if error:
        lines.append(("error", error))
    if run.get("title"):
        lines.append(("title", run["title"]))
    width = max(len(k) for k, _ in lines) + 1
    for key, value in lines:
        echo(f"{(key + ':').ljust(width)} {fmt.field(value)}")
    if not with_output:
        return
    output = run.get("output")
    if output:
        echo("output:")
        echo(str(output).rstrip("\n"))
        print_dropped(run.get("outputDropped"))
    elif output is not None:
        echo("output:   (none)")


def print_dropped(dropped: Any) -> None:
    """Print how many bytes of output were dropped past the cap, if any."""
    if dropped:
        echo(f"[{dropped} more bytes dropped]")


FOLLOW_POLL_S = 0.5
"""How often `runs show --follow` asks for the output a running run wrote since."""


@runs.command("show")
@client_command
@click.argument("run_id", metavar="RUNID", shell_complete=complete_run)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Print the output as it grows until the run ends, then its outcome.",
)
@json_option
def runs_show(config: Config, run_id: str, follow: bool, as_json: bool) -> None:
    """Show a run: its summary and captured output."""
    if follow and as_json:
        raise click.UsageError("--follow prints the output as it grows; drop --json or --follow")
    with control(config) as ctl:
        run = ctl.get(f"/runs/{path_id(run_id)}")
        if follow:
            follow_run(ctl, run)
            return
    if as_json:
        emit_json(run)
    else:
        print_run(run)


def follow_run(ctl: ControlClient, run: Mapping[str, Any]) -> None:
    """Print a run's output as it grows (GET /runs/:runId/output) until the run ends; then
    its outcome, as `runs show` prints it."""
    path = f"/runs/{path_id(run['runId'])}"
    echo("output:")
    start, partial = 0, False
    while True:
        part = ctl.get(f"{path}/output", **{"from": start})
        text = str(part["text"])
        if text:
            # Printed as it comes: a line still being written is finished by the next part.
            echo(text, nl=False)
            sys.stdout.flush()
            partial = not text.endswith("\n")
        start = int(part["next"])
        if not part["running"]:
            break
        time.sleep(FOLLOW_POLL_S)
    if partial:
        echo()
    print_dropped(part.get("outputDropped"))
    print_run(ctl.get(path), with_output=False)
