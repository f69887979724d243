"""Likely mistakes in a trigger definition, said before it is written, and the yes they need.

A definition can be valid and still not what was meant: a `once` whose `at` has passed, a
six-field cron read the other way round from the Quartz habit, a program the device that
will run it does not have, an event on a chat that does not exist. `anyrtd triggers
create`, `edit` and `apply` print each as a warning and write only after a yes: asked on a
terminal, `--yes` otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from anyrtd.cli import format as fmt
from anyrtd.cli.shared import echo
from anyrtd.config import Config
from anyrtd.vocab import Kind, is_unassigned

if TYPE_CHECKING:
    from anyrtd.control.writes import Records


def _bits(mask: int, low: int, high: int) -> list[int]:
    return [i for i in range(low, high + 1) if mask >> i & 1]


def _few(values: list[int]) -> str:
    shown = ", ".join(str(v) for v in values[:8])
    return shown + (", …" if len(values) > 8 else "")


def seconds_first(expr: str) -> str | None:
    """Return what a six- or seven-field cron that fires several times a minute means here.

    The sixth field is the second (croniter's order); a Quartz/Spring habit puts seconds
    first, so `*/15 * * * * *` reads here as every second of four minutes an hour.
    """
    from anyrtd.schedule import CronSyntaxError, parse_cron

    try:
        parsed = parse_cron(expr)
    except CronSyntaxError:
        return None
    seconds = _bits(parsed.seconds, 0, 59)
    if not parsed.has_seconds or len(seconds) < 2:
        return None
    minutes = _bits(parsed.minutes, 0, 59)
    hours = _bits(parsed.hours, 0, 23)
    said = "every second" if len(seconds) == 60 else f"at seconds {_few(seconds)}"
    if len(minutes) == 60:
        said += " of every minute"
    else:
        plural = "s" if len(minutes) > 1 else ""
        said += f" for {len(minutes)} minute{plural} of each hour (minute{plural} {_few(minutes)})"
    if len(hours) < 24:
        said += f", in hour{'s' if len(hours) > 1 else ''} {_few(hours)}"
    if not (parsed.dom_any and parsed.dow_any) or parsed.months != 0b1111111111110:
        said += ", on the days it names"
    elif parsed.years is not None:
        said += ", in the years it names"
    elif len(hours) == 24:
        said += f": {len(seconds) * len(minutes)} fires an hour"
    fields = expr.split()
    meant = " ".join([*fields[1:6], fields[0], *fields[6:]])
    try:
        parse_cron(meant)
        hint = f'; if you meant seconds first (Quartz/Spring order), write "{meant}"'
    except CronSyntaxError:
        hint = "; seconds come sixth here, not first (Quartz/Spring order)"
    return f'cron "{expr}" has the second as its sixth field, so it fires {said}{hint}'


def schedule_warnings(kind: Any, spec: Any, now: float) -> list[str]:
    """Return the likely mistakes in a schedule that is valid."""
    if not isinstance(spec, Mapping):
        return []
    said: list[str] = []
    at = spec.get("at")
    if kind == Kind.ONCE and isinstance(at, int | float) and not isinstance(at, bool) and at < now:
        said.append(
            f"at {fmt.clock(at)} is in the past ({fmt.relative(at - now)}): "
            "the once fires late, on the owning device's next tick"
        )
    expr = spec.get("cron")
    if kind == Kind.CRON and isinstance(expr, str):
        meaning = seconds_first(expr)
        if meaning is not None:
            said.append(meaning)
    return said


async def placement(
    records: Records, config: Config, owner: str, program: str
) -> tuple[list[str], list[str]]:
    """Return (warnings, notes) on whether the device that will run `program` has it.

    The CLI sees only this device's programs (its config and installed packages): a trigger
    that runs elsewhere gets a note saying so, not a warning.
    """
    from anyrtd.cli.programs import local_runner, runs_here
    from anyrtd.election import APP

    view = await records.client.devices()
    if view is None:
        here = is_unassigned(owner)  # one device: its daemon claims what is unassigned
        elsewhere = f"the device {owner}"
    elif owner == view.self_id:
        here, elsewhere = True, ""
    elif is_unassigned(owner):
        active = view.active.get(APP)
        here = active == view.self_id
        elsewhere = f"the active device {active}" if active else "no device (none is active)"
    else:
        here, elsewhere = False, f"the device {owner}"
    if not here:
        return [], [
            f"program {program} runs on {elsewhere}: this command sees only this device's "
            "programs, so it cannot tell whether that device has it"
        ]
    if runs_here(local_runner(config, records.client), program):
        return [], []
    return [
        f"program {program} is not installed on this device, which will run it: "
        "the run would fail (`anyrtd programs list` shows what this device can run)"
    ], []


async def _no_chat(records: Records, space: Any, chat: Any) -> bool:
    """Tell whether the server says the chat `chat` of `space` does not exist."""
    from anyrtd.client import Dataset, ServerError

    if not isinstance(chat, str) or not chat or not isinstance(space, str) or not space:
        return False
    try:
        await records.client.query(Dataset(space, chat, "chat_messages"), limit=1)
    except ServerError as exc:
        return exc.status == 404  # another answer says nothing about the chat
    return False


async def event_source(records: Records, spec: Any) -> list[str]:
    """Return a warning when the chat an event trigger watches does not exist on the server."""
    from anyrtd.model import SUPPORTED_EVENT_DATASETS

    if not isinstance(spec, Mapping) or spec.get("dataset") not in SUPPORTED_EVENT_DATASETS:
        return []
    chat, space = spec.get("objectId"), spec.get("spaceId") or records.space
    if not await _no_chat(records, space, chat):
        return []
    return [
        f"chat {chat} does not exist in space {space}: the trigger would never fire; "
        "${GENERAL_CHAT} names the space's general chat"
    ]


CHAT_PROGRAMS = frozenset({"agent:remind@v1", "agent:rollup@v1"})
"""The built-ins that post to a chat: args.chatId of args.space (default: the general chat)."""


async def program_chat(records: Records, program: Any, args: Any) -> list[str]:
    """Return a warning when the chat a built-in posts to does not exist on the server."""
    if program not in CHAT_PROGRAMS or not isinstance(args, Mapping):
        return []
    chat, space = args.get("chatId"), args.get("space") or records.space
    if not await _no_chat(records, space, chat):
        return []
    return [
        f"chat {chat} does not exist in space {space}: every run of {program} would fail; "
        "set args.chatId to a chat of the space, or drop it to post to the general chat"
    ]


def confirm(warnings: list[str], notes: list[str], yes: bool) -> None:
    """Print the warnings and notes; go on only with a yes (asked on a terminal, or --yes)."""
    for note in notes:
        echo(f"note: {note}", err=True)
    if not warnings:
        return
    for warning in warnings:
        echo(f"warning: {warning}", err=True)
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException(
            "nothing was written: there is no terminal to ask on, so give --yes to write it anyway"
        )
    click.confirm("write it anyway?", abort=True, err=True)
