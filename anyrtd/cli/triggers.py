"""`anyrtd triggers`: see and change triggers.

Reads and the daemon's own actions (list, show, enable, disable, run) go through the
daemon's control API; record writes (create, edit, pin, unpin, delete) go straight to
the server, where the record is the source of truth. Every error is one line on
stderr that says what to do, with exit status 1.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from anyrtd.cli import format as fmt
from anyrtd.cli.caution import confirm
from anyrtd.cli.runs import print_run, runs_table, source_note
from anyrtd.cli.shared import (
    Seconds,
    client_command,
    complete_trigger,
    control,
    echo,
    emit_json,
    json_option,
    on_server,
    one_line,
    path_id,
)
from anyrtd.config import Config
from anyrtd.vocab import (
    SOURCE_HEADER,
    Cause,
    Kind,
    RollupField,
    RunStatus,
    Severity,
    TriggerState,
    is_unassigned,
)

if TYPE_CHECKING:
    from anyrtd.cli.control import ControlClient
    from anyrtd.control.writes import Records

F = TypeVar("F", bound=Callable[..., Any])


def _trigger_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Refuse an id no record can have (too long, a control character) before any look-up."""
    from anyrtd.model import id_problem

    problem = id_problem(value)
    if problem is not None:
        raise click.ClickException(f"trigger id refused: {problem}")
    return value


TRIGGER_ID = click.argument(
    "trigger_id", metavar="ID", shell_complete=complete_trigger, callback=_trigger_id
)


@click.group()
def triggers() -> None:
    """See and change triggers."""


def _peer_of(ctl: ControlClient) -> str | None:
    election = ctl.get("/election")
    peer = election.get("peerId") if isinstance(election, dict) else None
    return peer if isinstance(peer, str) else None


def _by_next_fire(t: Mapping[str, Any]) -> tuple[int, float, str]:
    nxt = t.get("nextFire")
    if isinstance(nxt, int | float) and not isinstance(nxt, bool):
        return (0, float(nxt), str(t.get("id")))
    return (1, 0.0, str(t.get("id")))


def triggers_table(items: list[dict[str, Any]], me: str | None, now: float, sort: str) -> str:
    """Return the triggers as a table, soonest next fire first (or in id order)."""
    key: Callable[[Mapping[str, Any]], tuple[int, float, str]] = (
        _by_next_fire if sort == "next" else (lambda t: (0, 0.0, str(t.get("id"))))
    )
    rows = [
        [
            t["id"],
            str(t.get("kind")),
            fmt.schedule(t.get("kind"), t.get("spec")),
            fmt.owner(t.get("owner"), me),
            "yes" if t.get("enabled") else "no",
            state_word(t),
            fmt.when(t["nextFire"], now) if t.get("nextFire") and _fires(t) else "-",
            str(t.get(RollupField.LAST_STATUS) or "-") + _missed_mark(t.get("missed")),
        ]
        for t in sorted(items, key=key)
    ]
    headers = ["ID", "KIND", "SCHEDULE", "OWNER", "ENABLED", "STATE", "NEXT FIRE", "LAST STATUS"]
    return fmt.table(headers, rows)


def state_word(t: Mapping[str, Any]) -> str:
    """Return a trigger's state as the list, `show` and `why` print it: `cannot_run
    (not_installed)`, the reason in a word after the state where there is one."""
    state, reason = t.get("state"), t.get("stateReason")
    return f"{state} ({reason})" if reason else str(state)


def _fires(t: Mapping[str, Any]) -> bool:
    """Tell whether a trigger's next fire is one (a trigger that cannot run has none to show)."""
    return t.get("severity") not in (Severity.BAD, Severity.QUIET)


def _missed_mark(missed: Any) -> str:
    """Return the mark of a trigger that missed occurrences: `, missed 3` (empty: none)."""
    if not isinstance(missed, Mapping) or not missed.get("count"):
        return ""
    return f", missed {missed['count']}{'+' if missed.get('capped') else ''}"


def _listing(ctl: ControlClient, everything: bool, sort: str) -> str:
    items = ctl.get("/triggers", all="true" if everything else None)
    if not items:
        hint = "" if everything else " (--all shows records held elsewhere)"
        return f"no triggers on this device{hint}"
    return triggers_table(items, _peer_of(ctl), time.time(), sort)


CLEAR = "\x1b[H\x1b[2J"
"""ANSI: cursor home, then erase the screen (a redraw in place on a terminal)."""


def _watch(config: Config, everything: bool, sort: str, every: float) -> None:
    """Redraw the listing every `every` seconds until Ctrl-C."""
    from anyrtd.cli.control import ControlError, ControlUnreachable

    tty = sys.stdout.isatty()
    try:
        with control(config) as ctl:
            while True:
                try:
                    body = _listing(ctl, everything, sort)
                except (ControlUnreachable, ControlError) as exc:
                    body = f"(not this time: {one_line(str(exc))})"
                stamp = fmt.clock(time.time())
                head = f"every {every:g}s, Ctrl-C stops; {stamp}"
                if tty:
                    echo(head + "\n\n" + body, raw_prefix=CLEAR)
                else:
                    echo(head + "\n" + body + "\n")
                time.sleep(every)
    except KeyboardInterrupt:
        return


@triggers.command("list")
@client_command
@click.option("--all", "everything", is_flag=True, help="Also records this device does not hold.")
@click.option(
    "--sort",
    type=click.Choice(["next", "id"]),
    default="next",
    show_default=True,
    help="Soonest next fire first, or id order.",
)
@click.option("--watch", is_flag=True, help="Redraw the list every --interval s until Ctrl-C.")
@click.option(
    "--interval",
    type=Seconds(min=0.1, max=86400),
    default=2.0,
    show_default=True,
    help="Seconds between redraws with --watch.",
)
@json_option
def triggers_list(
    config: Config, everything: bool, sort: str, watch: bool, interval: float, as_json: bool
) -> None:
    """List the triggers in this device's registry, soonest next fire first."""
    if watch:
        if as_json:
            raise click.UsageError("--watch draws a table: drop --json")
        _watch(config, everything, sort, interval)
        return
    with control(config) as ctl:
        if as_json:
            emit_json(ctl.get("/triggers", all="true" if everything else None))
            return
        echo(_listing(ctl, everything, sort))


@triggers.command("show")
@client_command
@TRIGGER_ID
@json_option
def triggers_show(config: Config, trigger_id: str, as_json: bool) -> None:
    """Show a trigger: its definition, next fire times and recent runs."""
    with control(config) as ctl:
        trigger = ctl.get(f"/triggers/{path_id(trigger_id)}")
        runs = ctl.get(f"/triggers/{path_id(trigger_id)}/runs")
        source = ctl.last_headers.get(SOURCE_HEADER)
        me = _peer_of(ctl)
    if as_json:
        emit_json({"trigger": trigger, "runs": runs})
        return
    now = time.time()
    t = trigger
    lines = [
        ("id", t["id"]),
        ("name", t.get("name")),
        ("kind", t.get("kind")),
        ("schedule", fmt.schedule(t.get("kind"), t.get("spec"))),
        ("spec", fmt.compact(t.get("spec"))),
        ("program", t.get("program")),
        ("args", fmt.compact(t.get("args") or {})),
        ("owner", fmt.owner_line(t.get("owner"), me)),
        ("enabled", "yes" if t.get("enabled") else "no"),
        ("state", state_word(t)),
    ]
    if isinstance(chain := t.get("chain"), dict):
        ups = chain.get("upstream")
        lines.append(("upstream", ", ".join(ups) if ups else "every trigger (no chain's run)"))
        fired = chain.get("lastFiredBy")
        lines.append(("last fired by", f"run {fired}" if fired else "- (not fired yet)"))
    if t.get("malformed"):
        lines.append(("malformed", t["malformed"]))
    if t.get("markerReason"):
        lines.append(("marker", f"{t.get('marker')}: {t['markerReason']}"))
    if t.get("limits"):
        lines.append(("limits", fmt.compact(t["limits"])))
    lines += [
        ("last run", f"{fmt.when(t.get('lastRunAt'), now)} {t.get('lastStatus') or ''}".strip()),
        (
            "failures",
            f"{t.get('consecutiveFailures', 0)} in a row "
            f"(auto-disables at {t.get('maxConsecutiveFailures', 3)})",
        ),
        ("runs", str(t.get(RollupField.RUN_COUNT, 0))),
    ]
    fires = t.get("nextFires") or []
    lines.append(("next fires", fmt.when(fires[0], now) if fires else "-"))
    width = max(len(k) for k, _ in lines) + 1
    for key, value in lines:
        echo(f"{(key + ':').ljust(width)} {fmt.field(value)}")
    for at in fires[1:]:
        echo(f"{''.ljust(width)} {fmt.when(at, now)}")
    echo("")
    echo(f"recent {source_note(source)}:")
    echo(runs_table(runs[:10], now) if runs else "none yet")


@triggers.command("why")
@client_command
@TRIGGER_ID
@json_option
def triggers_why(config: Config, trigger_id: str, as_json: bool) -> None:
    """Tell whether a trigger fires on this device; if not, every reason and its fix."""
    with control(config) as ctl:
        answer = ctl.get(f"/triggers/{path_id(trigger_id)}/why")
        me = _peer_of(ctl)
    if as_json:
        emit_json(answer)
    else:
        echo(why_text(answer, me, time.time()))
    if any(r.get("cause") == Cause.UNKNOWN for r in answer.get("reasons", [])):
        raise SystemExit(1)  # no such trigger: as `show` does, say so in the exit status


def why_text(answer: Mapping[str, Any], me: str | None, now: float) -> str:
    """Return the answer of `triggers why`: the verdict, the reasons in order, the notes."""
    tid, device = fmt.field(answer["id"]), answer.get("device")
    fires = answer.get("nextFires") or []
    blocking = [r for r in answer.get("reasons", []) if r.get("blocking")]
    notes = [r for r in answer.get("reasons", []) if not r.get("blocking")]
    here = f"this device ({me})" if me else "this device"
    if answer.get("fires"):
        head = f"{tid} fires on {here}"
    else:
        head = f"{tid} will not fire on {here}"
        if device:
            head += f"; it fires on {fmt.field(device)}"
    if fires:
        head += f": next {fmt.when(fires[0], now)}"
    lines = [head + ("" if blocking else ".")]
    lines += [f"  then {fmt.when(at, now)}" for at in fires[1:]]
    if answer.get("state"):
        lines.append(f"state: {fmt.field(state_word(answer))}")
    if blocking:
        lines.append("")
        lines.append("why, in the order to fix it:" if len(blocking) > 1 else "why:")
    for n, reason in enumerate(blocking, 1):
        lines += _reason_lines(f"{n}.", reason)
    if notes:
        lines.append("")
        lines.append("to know:")
    for reason in notes:
        lines += _reason_lines("-", reason)
    return "\n".join(lines)


def _reason_lines(bullet: str, reason: Mapping[str, Any]) -> list[str]:
    pad = " " * (len(bullet) + 1)
    lines = [f"{bullet} {fmt.field(reason.get('text'))}"]
    facts = {k: v for k, v in (reason.get("facts") or {}).items() if v not in (None, [], {})}
    errors = facts.pop("lastErrors", None)
    missed = facts.pop("occurrences", None)
    if facts:
        lines.append(f"{pad}fact: " + ", ".join(f"{k}={fmt.compact(v)}" for k, v in facts.items()))
    for error in errors or []:
        text = one_line(str(error.get("error") or "(no error text)"))
        at = fmt.clock(error.get("startedAt"))
        lines.append(f"{pad}error: run {error.get('runId')} at {at}: {text}")
    for occurrence in missed or []:
        at = fmt.clock(occurrence.get("at"))
        text = one_line(str(occurrence.get("text") or ""))
        lines.append(f"{pad}missed: {at} ({occurrence.get('cause')}): {text}")
    if reason.get("fix"):
        lines.append(f"{pad}fix:  {fmt.field(reason['fix'])}")
    return lines


def spec_number(value: float) -> int | float:
    """Return a number from a flag as a spec holds it: a whole one as an int, anything else
    (a fraction, NaN, infinity) as given, so that the spec check judges it as it judges
    the same number in JSON."""
    if isinstance(value, int) or not math.isfinite(value):
        return value
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def parse_at(text: str, now: float, zone: tzinfo | None = None) -> float:
    """Read `--at`: epoch seconds, an ISO 8601 time (in `zone`, else local, when it has no
    offset), or `+10m`."""
    relative = re.fullmatch(r"\+(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if relative:
        unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[relative.group(2)]
        return round(now + float(relative.group(1)) * unit)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: give epoch seconds, an ISO 8601 time (2027-01-15T08:00) or +10m",
            param_hint="--at",
        ) from None
    if moment.tzinfo is None and zone is not None:
        moment = moment.replace(tzinfo=zone)
    return moment.timestamp()


def _parse_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{text!r}: use KEY=VALUE", param_hint="--arg")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _json_object(text: str, hint: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=hint) from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint=hint)
    return value


def definition_options(fn: F) -> F:
    """Add the flags that set the parts of a trigger definition."""
    options = [
        click.option("--name", help="Display name."),
        click.option("--cron", "cron_expr", metavar="EXPR", help="A cron trigger: 5 fields, UTC."),
        click.option("--every", "every_s", type=float, metavar="SECONDS", help="A cron every N s."),
        click.option("--tz", help="IANA zone for --cron (e.g. Europe/Paris)."),
        click.option("--at", "at", metavar="TIME", help="A once trigger: epoch s, ISO time, +10m."),
        click.option("--event-chat", metavar="CHAT", help="An event trigger on a chat's messages."),
        click.option("--event-space", metavar="SPACE", help="The space of --event-chat."),
        click.option(
            "--after",
            "after_ids",
            multiple=True,
            metavar="ID",
            help="A chain: fire after each run of trigger ID (repeat for several).",
        ),
        click.option(
            "--after-status",
            "after_statuses",
            multiple=True,
            metavar="STATUS",
            help="With --after: the run statuses that fire it: ok (default), failed, "
            "incomplete, interrupted, any.",
        ),
        click.option("--after-device", metavar="PEER", help="With --after: only runs of PEER."),
        click.option("--program", help="Program spec, e.g. agent:remind@v1."),
        click.option("--arg", "arg_pairs", multiple=True, metavar="K=V", help="One arg (JSON)."),
        click.option("--args-json", metavar="JSON", help="All args as a JSON object."),
        click.option("--owner", metavar="PEER", help="Pin to a device (peer id, name or here)."),
        click.option(
            "--max-failures",
            type=click.IntRange(min=1),
            help="Breaker threshold (at most 1,000,000).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _definition(opts: Mapping[str, Any], now: float) -> dict[str, Any]:
    """Return the record fields the definition flags set."""
    fields: dict[str, Any] = {}
    kinds = [k for k in ("cron_expr", "every_s", "at", "event_chat") if opts.get(k) is not None]
    if opts.get("after_ids"):
        kinds.append("after_ids")
    if len(kinds) > 1:
        raise click.UsageError("give one schedule: --cron, --every, --at, --event-chat or --after")
    if (opts.get("after_statuses") or opts.get("after_device")) and not opts.get("after_ids"):
        raise click.UsageError("--after-status and --after-device go with --after")
    if opts.get("tz") is not None and opts.get("cron_expr") is None:
        raise click.UsageError("--tz goes with --cron")
    if opts.get("event_space") and opts.get("event_chat") is None:
        raise click.UsageError("--event-space goes with --event-chat")
    if opts.get("cron_expr") is not None:
        spec: dict[str, Any] = {"cron": opts["cron_expr"]}
        if opts.get("tz") is not None:
            spec["tz"] = opts["tz"]  # an empty one too: the spec check refuses it
        fields.update(kind=Kind.CRON.value, spec=spec)
    elif opts.get("every_s") is not None:
        fields.update(kind=Kind.CRON.value, spec={"every_s": spec_number(opts["every_s"])})
    elif opts.get("at") is not None:
        fields.update(kind=Kind.ONCE.value, spec={"at": spec_number(parse_at(opts["at"], now))})
    elif opts.get("event_chat") is not None:
        spec = {"dataset": "chat_messages", "objectId": opts["event_chat"]}
        if opts.get("event_space"):
            spec["spaceId"] = opts["event_space"]
        fields.update(kind=Kind.EVENT.value, spec=spec)
    elif opts.get("after_ids"):
        ids, statuses = list(opts["after_ids"]), list(opts.get("after_statuses") or ())
        flt: dict[str, Any] = {"triggerId": ids[0] if len(ids) == 1 else ids}
        if statuses:
            flt["status"] = statuses[0] if len(statuses) == 1 else statuses
        if opts.get("after_device"):
            flt["device"] = opts["after_device"]
        fields.update(kind=Kind.EVENT.value, spec={"dataset": "agent_runs", "filter": flt})
    if opts.get("name") is not None:
        fields["name"] = opts["name"]
    if opts.get("program") is not None:
        fields["program"] = opts["program"]
    if opts.get("args_json") is not None or opts.get("arg_pairs"):
        args = _json_object(opts["args_json"], "--args-json") if opts.get("args_json") else {}
        args.update(dict(_parse_arg(a) for a in opts.get("arg_pairs") or ()))
        fields["args"] = args
    if opts.get("max_failures") is not None:
        fields["maxConsecutiveFailures"] = opts["max_failures"]
    return fields


async def _owner(records: Records, owner: str | None, force: bool) -> str | None:
    from anyrtd.control.writes import resolve_peer

    if owner is None:
        return None
    if force and owner not in ("here", "self"):
        return owner
    return resolve_peer(await records.client.devices(), owner)


async def _placeholders(records: Records, fields: dict[str, Any]) -> dict[str, Any]:
    """Fill `${SPACE}`, `${GENERAL_CHAT}` and `${SELF}` in the record's string values."""
    from anyrtd.control.writes import WriteError, fill_placeholders, placeholders_in

    names = placeholders_in(fields)
    if not names:
        return dict(fields)
    known: dict[str, str] = {"SPACE": records.space}
    if "GENERAL_CHAT" in names:
        known["GENERAL_CHAT"] = await records.general_chat()
    if "SELF" in names:
        devices = await records.client.devices()
        if devices is None:
            raise WriteError("${SELF}: the server has no devices registry; put a peer id there")
        known["SELF"] = devices.self_id
    unknown = sorted(names - set(known))
    if unknown:
        raise WriteError(
            f"unknown placeholder ${{{unknown[0]}}}: use ${{SPACE}}, ${{GENERAL_CHAT}} or ${{SELF}}"
        )
    return {k: fill_placeholders(v, known) for k, v in fields.items()}


YES_OPTION = click.option(
    "--yes", "-y", is_flag=True, help="Write even if it looks like a mistake (do not ask)."
)


async def _concerns(
    records: Records,
    config: Config,
    stored: Mapping[str, Any] | None,
    changed: Mapping[str, Any],
) -> tuple[list[str], list[str]]:
    """Return (warnings, notes) on the likely mistakes in what a write changes."""
    from anyrtd.cli.caution import event_source, placement, program_chat, schedule_warnings

    merged = {**(stored or {}), **changed}
    warnings: list[str] = []
    notes: list[str] = []
    if stored is None or {"kind", "spec"} & set(changed):
        warnings += schedule_warnings(merged.get("kind"), merged.get("spec"), time.time())
        if merged.get("kind") == Kind.EVENT:
            warnings += await event_source(records, merged.get("spec"))
    program, owner = merged.get("program"), merged.get("owner")
    if stored is None or {"program", "args"} & set(changed):
        warnings += await program_chat(records, program, merged.get("args"))
    if (stored is None or {"program", "owner"} & set(changed)) and isinstance(program, str):
        more, notes = await placement(
            records, config, owner if isinstance(owner, str) else "", program
        )
        warnings += more
    return warnings, notes


def _adopt_hint(owner: str) -> str:
    if not is_unassigned(owner):
        return f"the device {fmt.short(owner)} adopts it within one tick"
    return "the active device claims it within one tick"


@triggers.command("create")
@client_command
@click.option("--id", "trigger_id", help="Record id (a slug) [default: from --name or the file].")
@click.option(
    "--file",
    "file",
    type=click.Path(dir_okay=False, path_type=Path, allow_dash=True),
    help="A JSON record to start from (see contrib/triggers/); flags override its fields.",
)
@definition_options
@click.option("--disabled", is_flag=True, help="Create it disabled.")
@click.option("--force", is_flag=True, help="Pin to --owner even if no such device is listed.")
@YES_OPTION
@json_option
def triggers_create(
    config: Config,
    trigger_id: str | None,
    file: Path | None,
    disabled: bool,
    force: bool,
    yes: bool,
    as_json: bool,
    **opts: Any,
) -> None:
    """Create a trigger (cron, once or event) from flags or a JSON file."""
    from anyrtd.control.writes import check_id, slug

    base: dict[str, Any] = {}
    if file is not None:
        try:
            with click.open_file(str(file), encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise click.BadParameter(f"{file}: {exc.strerror}", param_hint="--file") from None
        base = _json_object(text, "--file")
    fields = {**base, **_definition(opts, time.time())}
    file_id = fields.pop("id", None)
    rid = trigger_id or (file_id if isinstance(file_id, str) else None)
    if rid is None and isinstance(fields.get("name"), str):
        rid = slug(fields["name"]) or None
    if rid is None:
        raise click.UsageError("name the trigger: --id ID (or --name, or an id in the file)")
    check_id(rid)
    if disabled:
        fields["enabled"] = False
    if "program" not in fields:
        raise click.UsageError("name the program: --program agent:remind@v1")
    if "kind" not in fields:
        raise click.UsageError("give a schedule: --cron, --every, --at or --event-chat")

    async def work(records: Records) -> dict[str, Any]:
        filled = await _placeholders(records, fields)
        owner = await _owner(records, opts.get("owner"), force)
        if owner is not None:
            filled["owner"] = owner
        filled.setdefault("owner", "")
        await records.create(rid, filled, dry_run=True)
        confirm(*await _concerns(records, config, None, filled), yes)
        await records.create(rid, filled)
        return filled

    written = on_server(config, work)
    if as_json:
        emit_json({"id": rid, **written})
        return
    what = fmt.schedule(written.get("kind"), written.get("spec"))
    echo(f"created {fmt.field(rid)} ({written['kind']}, {what}); {_adopt_hint(written['owner'])}")


def _rearm(before: Mapping[str, Any], fields: dict[str, Any]) -> None:
    """Enable again a fired `once` (it disabled itself) that a new `at` arms again, unless
    the write says otherwise (`--disabled`)."""
    fired = before.get("kind") == Kind.ONCE and before.get(RollupField.LAST_RUN_AT) is not None
    if fired and before.get("enabled") is False and "enabled" not in fields:
        fields["enabled"] = True


@triggers.command("edit")
@client_command
@TRIGGER_ID
@definition_options
@click.option("--set", "set_pairs", multiple=True, metavar="FIELD=JSON", help="Set any field.")
@click.option("--unset", "unset_fields", multiple=True, metavar="FIELD", help="Remove a field.")
@click.option("--force", is_flag=True, help="Pin to --owner even if no such device is listed.")
@YES_OPTION
@json_option
def triggers_edit(
    config: Config,
    trigger_id: str,
    set_pairs: tuple[str, ...],
    unset_fields: tuple[str, ...],
    force: bool,
    yes: bool,
    as_json: bool,
    **opts: Any,
) -> None:
    """Change fields of a trigger record (only the fields given change)."""
    fields = _definition(opts, time.time())
    for pair in set_pairs:
        key, value = _parse_arg(pair)
        if key == "id":
            raise click.BadParameter(
                "the id cannot change: create a new trigger", param_hint="--set"
            )
        fields[key] = value
    if "id" in unset_fields:
        raise click.BadParameter("the id cannot be removed", param_hint="--unset")
    if not fields and not unset_fields and opts.get("owner") is None:
        raise click.UsageError("nothing to change: give flags such as --cron, --name or --set")
    unset_fields_list = list(unset_fields)

    async def work(records: Records) -> dict[str, Any]:
        owner = await _owner(records, opts.get("owner"), force)
        if owner is not None:
            fields["owner"] = owner
        filled = await _placeholders(records, fields)
        from anyrtd.control.writes import WriteError

        stored = await records.need(trigger_id)
        missing = [k for k in unset_fields if k not in stored.fields]
        if missing:
            have = ", ".join(sorted(stored.fields)) or "none"
            raise WriteError(
                f"trigger {trigger_id} has no field {', '.join(missing)} to unset, so nothing "
                f"was written (its fields: {have})"
            )
        if filled.get("spec") is not None and "kind" not in filled:
            if stored.fields.get("kind") == Kind.ONCE:
                # A once takes lastRunAt as its consumed state: a new `at` re-arms the shot.
                unset_fields_list.append(RollupField.LAST_RUN_AT.value)
                _rearm(stored.fields, filled)
        elif filled.get("kind") == Kind.ONCE:
            unset_fields_list.append(RollupField.LAST_RUN_AT.value)
            _rearm(stored.fields, filled)
        await records.update(trigger_id, filled, unset_fields_list, dry_run=True)
        confirm(*await _concerns(records, config, stored.fields, filled), yes)
        await records.update(trigger_id, filled, unset_fields_list)
        return filled

    changed = on_server(config, work)
    if as_json:
        emit_json({"id": trigger_id, "set": changed, "unset": unset_fields_list})
        return
    names = ", ".join(sorted(changed) + [f"-{k}" for k in unset_fields_list])
    echo(f"updated {fmt.field(trigger_id)} ({names}); the owning device applies it within one tick")


@dataclass
class Planned:
    """What `apply` does to one record: create, update or nothing, field by field."""

    id: str
    action: str  # create, update or unchanged
    fields: dict[str, Any]
    before: dict[str, Any] | None
    unset: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        before = self.before or {}
        return {
            "id": self.id,
            "action": self.action,
            "changes": [
                {"field": k, "from": before.get(k), "to": v} for k, v in sorted(self.fields.items())
            ],
            "unset": [{"field": k, "from": before.get(k)} for k in self.unset],
        }

    def lines(self) -> list[str]:
        said = [f"{self.action} {self.id}"]
        before = self.before or {}
        for key, value in sorted(self.fields.items()):
            if key in before:
                said.append(f"  ~ {key}: {fmt.compact(before[key])} -> {fmt.compact(value)}")
            else:
                said.append(f"  + {key}: {fmt.compact(value)}")
        for key in self.unset:
            said.append(f"  - {key}: {fmt.compact(before.get(key))} (a new at re-arms the once)")
        return said


def _read_json(file: Path, hint: str) -> Any:
    try:
        with click.open_file(str(file), encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise click.BadParameter(f"{file}: {exc.strerror}", param_hint=hint) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"{file}: not valid JSON: {exc}", param_hint=hint) from None


def _wanted(value: Any) -> list[tuple[str, dict[str, Any]]]:
    """Return (id, fields) for each record of an `apply` file; refuse what cannot be applied."""
    items = value if isinstance(value, list) else [value]
    wanted: list[tuple[str, dict[str, Any]]] = []
    for n, item in enumerate(items, 1):
        where = f"record {n}" if isinstance(value, list) else "the record"
        if not isinstance(item, dict):
            raise click.BadParameter(f"{where} is not a JSON object", param_hint="--file")
        rid = item.get("id")
        if not isinstance(rid, str) or not rid:
            raise click.BadParameter(
                f'{where} has no "id": apply finds the record to create or update by its id',
                param_hint="--file",
            )
        runtime = sorted(set(item) & {f.value for f in RollupField})
        if runtime:
            raise click.BadParameter(
                f"{rid}: {', '.join(runtime)} {'is' if len(runtime) == 1 else 'are'} written "
                "by the owning device after each run: drop them from the file",
                param_hint="--file",
            )
        if any(rid == other for other, _ in wanted):
            raise click.BadParameter(f"{rid} is in the file twice", param_hint="--file")
        fields = {k: v for k, v in item.items() if k != "id" and not k.startswith("_")}
        wanted.append((rid, fields))
    if not wanted:
        raise click.BadParameter("the list is empty: nothing to apply", param_hint="--file")
    return wanted


async def _plan(records: Records, rid: str, fields: dict[str, Any], force: bool) -> Planned:
    """Return what applying `fields` to the record `rid` changes, checked as the write would be."""
    from anyrtd.control.writes import check_id

    check_id(rid)
    filled = await _placeholders(records, fields)
    owner = filled.get("owner")
    if isinstance(owner, str) and owner and not is_unassigned(owner):
        filled["owner"] = await _owner(records, owner, force)
    stored = await records.get(rid)
    if stored is None:
        filled.setdefault("owner", "")
        await records.create(rid, filled, dry_run=True)
        return Planned(rid, "create", filled, None)
    before = stored.fields
    if isinstance(owner, str) and is_unassigned(owner):
        # "owner": "" in a file asks for no pin: a claim by the active device stays.
        filled.pop("owner")
    changed = {k: v for k, v in filled.items() if k not in before or before[k] != v}
    unset: list[str] = []
    kind = filled.get("kind", before.get("kind"))
    last_run = RollupField.LAST_RUN_AT.value
    if {"spec", "kind"} & set(changed) and kind == Kind.ONCE and last_run in before:
        # A once takes lastRunAt as its consumed state: a new `at` re-arms the shot.
        unset.append(last_run)
        if "enabled" not in filled:
            _rearm(before, changed)
    if not changed and not unset:
        return Planned(rid, "unchanged", {}, before)
    await records.update(rid, changed, unset, dry_run=True)
    return Planned(rid, "update", changed, before, unset)


@triggers.command("apply")
@client_command
@click.option(
    "-f",
    "--file",
    "file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path, allow_dash=True),
    help="A JSON record, or a list of them ('-' reads stdin).",
)
@click.option("--dry-run", is_flag=True, help="Show what would change; write nothing.")
@click.option("--force", is_flag=True, help="Pin to an owner no device in the registry has.")
@YES_OPTION
@json_option
def triggers_apply(
    config: Config, file: Path, dry_run: bool, force: bool, yes: bool, as_json: bool
) -> None:
    """Create or update triggers from a JSON file, showing what changes field by field."""
    wanted = _wanted(_read_json(file, "--file"))

    async def work(records: Records) -> list[Planned]:
        plan = [await _plan(records, rid, fields, force) for rid, fields in wanted]
        warnings: list[str] = []
        notes: list[str] = []
        for item in plan:
            if item.action == "unchanged":
                continue
            more, also = await _concerns(records, config, item.before, item.fields)
            warnings += [f"{item.id}: {w}" for w in more]
            notes += [f"{item.id}: {n}" for n in also]
        if not as_json:
            for item in plan:
                echo("\n".join(item.lines()))
        if dry_run:
            confirm(warnings, notes, yes=True)  # said, not asked: nothing is written
            return plan
        confirm(warnings, notes, yes)
        for item in plan:
            if item.action == "create":
                await records.create(item.id, item.fields)
            elif item.action == "update":
                await records.update(item.id, item.fields, item.unset)
        return plan

    plan = on_server(config, work)
    if as_json:
        emit_json({"dryRun": dry_run, "records": [item.to_json() for item in plan]})
        return
    counts = {a: sum(1 for p in plan if p.action == a) for a in ("create", "update", "unchanged")}
    if dry_run:
        echo(
            f"dry run: {counts['create']} to create, {counts['update']} to update, "
            f"{counts['unchanged']} unchanged; nothing was written"
        )
    elif counts["create"] or counts["update"]:
        echo(
            f"applied: {counts['create']} created, {counts['update']} updated, "
            f"{counts['unchanged']} unchanged; the owning devices pick it up within one tick"
        )
    else:
        echo(f"nothing to change: {counts['unchanged']} unchanged")


def state_line(t: Mapping[str, Any], now: float, asked: bool | None = None) -> str:
    """Return `ID: enabled (scheduled), next fire …`; the state only where it adds a word.

    With `asked` (the switch just written to the record), a device that has not applied it
    yet says when it will, rather than the state it is leaving: a claim in flight applies
    the record's `enabled` once it is confirmed."""
    switch = "enabled" if t.get("enabled") else "disabled"
    state = t.get("state")
    if asked is not None and bool(t.get("enabled")) != asked:
        want = "enabled" if asked else "disabled"
        if state == TriggerState.CLAIMING:
            when = "once this device's claim on it is confirmed (within a few ticks)"
        else:
            when = f"when this device applies the record (now {state})"
        return f"{fmt.field(t['id'])}: {want} in its record; {want} here {when}"
    said = f" ({state})" if state and state != switch and state != TriggerState.DISABLED else ""
    extra = f", next fire {fmt.when(t['nextFire'], now)}" if t.get("nextFire") else ""
    return f"{fmt.field(t['id'])}: {switch}{said}{extra}"


@triggers.command("enable")
@client_command
@TRIGGER_ID
@json_option
def triggers_enable(config: Config, trigger_id: str, as_json: bool) -> None:
    """Enable a trigger and reset its breaker (through the daemon, written to the record)."""
    _switch(config, trigger_id, "enable", as_json)


@triggers.command("disable")
@client_command
@TRIGGER_ID
@json_option
def triggers_disable(config: Config, trigger_id: str, as_json: bool) -> None:
    """Disable a trigger (through the daemon, written to the record)."""
    _switch(config, trigger_id, "disable", as_json)


def _switch(config: Config, trigger_id: str, verb: str, as_json: bool) -> None:
    with control(config) as ctl:
        trigger = ctl.post(f"/triggers/{path_id(trigger_id)}/{verb}")
    if as_json:
        emit_json(trigger)
    else:
        echo(state_line(trigger, time.time(), asked=verb == "enable"))


@triggers.command("pin")
@client_command
@TRIGGER_ID
@click.argument("peer", metavar="PEER")
@click.option("--force", is_flag=True, help="Pin even if no such device is listed.")
def triggers_pin(config: Config, trigger_id: str, peer: str, force: bool) -> None:
    """Pin a trigger to a device: a peer id, a device name, or `here`."""

    async def work(records: Records) -> str:
        owner = await _owner(records, peer, force)
        assert owner is not None
        await records.update(trigger_id, {"owner": owner})
        return owner

    owner = on_server(config, work)
    echo(f"pinned {fmt.field(trigger_id)} to {fmt.field(owner)}; {_adopt_hint(owner)}")


@triggers.command("unpin")
@client_command
@TRIGGER_ID
def triggers_unpin(config: Config, trigger_id: str) -> None:
    """Clear a trigger's pin: the device active now claims it."""
    on_server(config, lambda records: records.update(trigger_id, {"owner": ""}))
    echo(f"unpinned {fmt.field(trigger_id)}; {_adopt_hint('')}")


@triggers.command("run")
@client_command
@TRIGGER_ID
@click.option("--wait", is_flag=True, help="Wait for the run to end and print its output.")
@click.option(
    "--timeout", type=Seconds(min=0), default=300.0, show_default=True, help="With --wait."
)
@json_option
def triggers_run(
    config: Config, trigger_id: str, wait: bool, timeout: float, as_json: bool
) -> None:
    """Run a trigger now, outside its schedule."""
    with control(config) as ctl:
        started = ctl.post(f"/triggers/{path_id(trigger_id)}/run")
        run_id = started["runId"]
        if not wait:
            if as_json:
                emit_json(started)
            else:
                echo(
                    f"started run {run_id} of {fmt.field(trigger_id)}: `anyrtd runs show {run_id}`"
                )
            return
        deadline = time.monotonic() + timeout
        while True:
            run = ctl.get(f"/runs/{path_id(run_id)}")
            if run.get("status") != RunStatus.RUNNING:
                break
            if time.monotonic() > deadline:
                raise click.ClickException(
                    f"run {run_id} still running after {timeout:.0f}s: "
                    f"`anyrtd runs show {run_id}` later"
                )
            time.sleep(0.1)
    if as_json:
        emit_json(run)
    else:
        print_run(run)
    if run.get("status") != RunStatus.OK:
        raise SystemExit(1)


@triggers.command("delete")
@client_command
@TRIGGER_ID
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
def triggers_delete(config: Config, trigger_id: str, yes: bool) -> None:
    """Delete a trigger record (its id stays tombstoned: it cannot be reused)."""
    from anyrtd.control.writes import check_deletable

    check_deletable(trigger_id)  # before the question: the answer would not matter
    if not yes:
        click.confirm(
            f"delete {trigger_id}? its id cannot be reused afterwards", abort=True, err=True
        )
    on_server(config, lambda records: records.delete(trigger_id))
    echo(f"deleted {fmt.field(trigger_id)}; every device evicts it within one tick")
