"""`anyrtd schedule preview`: when a schedule would fire, before anything is written.

The times come from the schedule module (`compile_schedule`, `preview`), the same
arithmetic the daemon arms with; this module only reads the spec and prints.
"""

from __future__ import annotations

import json
import os
import time
from datetime import tzinfo
from pathlib import Path
from typing import Any

import click

from anyrtd.chain import describe, is_runs_dataset
from anyrtd.cli import format as fmt
from anyrtd.cli.caution import schedule_warnings
from anyrtd.cli.shared import echo, emit_json, json_option
from anyrtd.cli.triggers import parse_at, spec_number
from anyrtd.vocab import Kind


@click.group()
def schedule() -> None:
    """Try a schedule out before writing it."""


def _zone(name: str) -> tzinfo:
    from zoneinfo import ZoneInfo

    try:
        return ZoneInfo(name)
    except Exception:  # ZoneInfoNotFoundError, ValueError for odd keys
        raise click.BadParameter(
            f'"{name}" is not a known IANA zone name; use one like "Europe/Berlin"',
            param_hint="--tz",
        ) from None


def local_zone_name() -> str:
    """Return this machine's zone by name where it can be found, else its abbreviation."""
    tz = os.environ.get("TZ", "").lstrip(":")
    if tz:
        return tz
    try:
        target = str(Path("/etc/localtime").resolve())
    except OSError:
        target = ""
    if "zoneinfo/" in target:
        return target.split("zoneinfo/", 1)[1]
    return time.strftime("%Z")


def _spec(
    spec: str | None, every_s: float | None, at: str | None, tz: str | None, now: float
) -> tuple[str, dict[str, Any]]:
    """Return the (kind, spec) that SPEC, --every or --at describe."""
    if sum(x is not None for x in (spec, every_s, at)) != 1:
        raise click.UsageError("give one schedule: a cron SPEC, a JSON spec, --every or --at")
    if every_s is not None:
        return Kind.CRON.value, {"every_s": spec_number(every_s)}
    if at is not None:
        return Kind.ONCE.value, {"at": spec_number(parse_at(at, now, _zone(tz) if tz else None))}
    assert spec is not None
    if not spec.lstrip().startswith("{"):
        return Kind.CRON.value, {"cron": spec, **({"tz": tz} if tz else {})}
    try:
        value = json.loads(spec)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="SPEC") from None
    if not isinstance(value, dict):
        raise click.BadParameter("a JSON spec is an object", param_hint="SPEC")
    dataset = value.get("dataset")
    if isinstance(dataset, str) and is_runs_dataset(dataset):
        return Kind.EVENT.value, value  # a chain: it fires after runs, said in words
    if "dataset" in value or "objectId" in value:
        raise click.UsageError("an event trigger fires on a chat message, never on the clock")
    kind = Kind.ONCE.value if "at" in value else Kind.CRON.value
    if tz and "cron" in value:
        if value.get("tz") not in (None, tz):
            raise click.UsageError(f'the spec says "tz": {json.dumps(value["tz"])}; drop --tz')
        value = {**value, "tz": tz}
    return kind, value


@schedule.command("preview")
@click.argument("spec", required=False, metavar="SPEC")
@click.option("--every", "every_s", type=float, metavar="SECONDS", help="A fixed period.")
@click.option("--at", "at", metavar="TIME", help="A once: epoch s, ISO time, or +10m.")
@click.option(
    "--tz",
    metavar="ZONE",
    help="IANA zone: the cron's own (as spec.tz), an --at without offset, and the times shown "
    "[default: UTC for a cron, this machine's zone otherwise].",
)
@click.option(
    "-n", "count", type=click.IntRange(1, 1000), default=10, show_default=True, help="How many."
)
@json_option
def schedule_preview(
    spec: str | None,
    every_s: float | None,
    at: str | None,
    tz: str | None,
    count: int,
    as_json: bool,
) -> None:
    """Print the next fire times of a cron SPEC, a JSON spec, --every or --at."""
    from anyrtd.schedule import compile_schedule, preview

    now = time.time()
    kind, body = _spec(spec, every_s, at, tz, now)
    compiled = compile_schedule(kind, body)
    if compiled.error is not None:
        raise click.ClickException(compiled.error)
    chain = getattr(compiled, "chain", None)
    if chain is not None:
        said = describe(chain)
        if as_json:
            emit_json({"kind": kind, "spec": body, "after": said, "fires": [], "warnings": []})
        else:
            echo(f"{said}: a chain fires on run records, never on the clock")
        return
    cron_tz = body.get("tz") if "cron" in body else None
    shown_tz = cron_tz if isinstance(cron_tz, str) else tz
    if shown_tz is None and "cron" in body:
        shown_tz = "UTC"
    zone = _zone(shown_tz) if shown_tz else None
    zone_name = shown_tz or f"this machine's zone ({local_zone_name()})"
    fires = preview(compiled, now, count, anchor=now)
    past = kind == Kind.ONCE and not fires
    if past:
        fires = [float(body["at"])]  # a once in the past fires late, on the next tick
    warnings = schedule_warnings(kind, body, now)
    if as_json:
        emit_json(
            {
                "kind": kind,
                "spec": body,
                "zone": shown_tz or local_zone_name(),
                "fires": fires,
                "warnings": warnings,
            }
        )
        return
    for warning in warnings:
        echo(f"warning: {warning}", err=True)
    if "cron" in body:
        what = f'cron "{body["cron"]}"'
    elif "every_s" in body:
        what = f"every {fmt.compact(body['every_s'])}s, counted from now"
    else:
        what = "once"
    if not fires:
        raise click.ClickException(f"{what} has no fire time after now")
    many = f"the next {len(fires)} fire times" if len(fires) > 1 else "its fire time"
    echo(f"{what}, in {zone_name}: {many}")
    for ts in fires:
        line = f"  {fmt.zoned(ts, zone)}  ({fmt.relative(ts - now)})"
        here = fmt.clock(ts)
        if zone is not None and fmt.zoned(ts, zone)[4:23] != here[:19]:
            line += f"  = {here} here"
        echo(line)
    if "every_s" in body:
        echo("  (the daemon counts from when it arms the trigger: adoption or an edit)")
    if past:
        echo("  (in the past: written now, the once fires at once, on the next tick)")
