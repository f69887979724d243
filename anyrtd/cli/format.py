"""Text for the terminal: tables, times, schedules. Pure: `now` is passed in.

Each cell of a table and each value of a `key: value` listing is one line: its control
characters, newlines and tabs included, are escaped (`field`, `anyrtd.escape`)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, tzinfo
from typing import Any

from anyrtd.chain import describe, is_runs_dataset, parse_filter
from anyrtd.escape import printable, printable_json
from anyrtd.vocab import Kind, is_stamp, is_unassigned


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Return rows as aligned columns under their headers, each cell on one line."""
    rows = [[field(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *rows]
    ]
    return "\n".join(lines)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def clock(ts: Any) -> str:
    """Return a local time with its zone: `2026-11-30 08:00:00 CET`."""
    if not _number(ts):
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return str(ts)


def when(ts: Any, now: float) -> str:
    """Return a local time, its zone and how far off it is: `2026-11-30 08:00:00 CET (in 3h)`."""
    text = clock(ts)
    return f"{text} ({relative(ts - now)})" if _number(ts) and text != str(ts) else text


def zoned(ts: float, zone: tzinfo | None) -> str:
    """Return a time in `zone` (None: this machine's) with its weekday, abbreviation and offset."""
    if zone is None:
        moment = datetime.fromtimestamp(ts).astimezone()
    else:
        moment = datetime.fromtimestamp(ts, zone)
    offset = moment.strftime("%z")
    return moment.strftime("%a %Y-%m-%d %H:%M:%S %Z ") + f"{offset[:3]}:{offset[3:]}"


def lateness(started: Any, scheduled: Any) -> str:
    """Return how late a run started (`startedAt - scheduledAt`); blank for a manual run."""
    if not _number(started) or not _number(scheduled):
        return ""
    late = started - scheduled
    text = _span(abs(late))
    # Signed after rounding: a start 0.3 ms early shows `0ms`, not `-0ms`.
    return "-" + text if late < 0 and any(c in "123456789" for c in text) else text


def _span(late: float) -> str:
    """Return a non-negative number of seconds as `250ms`, `12.5s` or `3h 2m`."""
    if late < 60:
        return duration(late * 1000)
    parts: list[str] = []
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s")):
        if late >= size or parts:
            parts.append(f"{int(late // size)}{unit}")
            late %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def relative(delta: float) -> str:
    """Return `in 3m` / `5s ago` for a signed number of seconds."""
    span = abs(delta)
    if span < 1:
        return "now"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s")):
        if span >= size:
            amount = f"{int(span // size)}{unit}"
            return f"in {amount}" if delta > 0 else f"{amount} ago"
    return "now"  # unreachable: span >= 1


def duration(ms: Any) -> str:
    """Return a run's duration for a table."""
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return "-"
    if ms < 1000:
        return f"{int(ms)}ms"
    return f"{ms / 1000:.1f}s"


def schedule(kind: Any, spec: Any) -> str:
    """Return a trigger's schedule in a few words."""
    if not isinstance(spec, Mapping):
        return "-"
    if kind == Kind.CRON:
        if "cron" in spec:
            tz = spec.get("tz")
            return f"{spec['cron']} ({tz or 'UTC'})"
        if "every_s" in spec:
            return f"every {spec['every_s']}s"
    if kind == Kind.ONCE and "at" in spec:
        return f"at {clock(spec['at']) if _number(spec['at']) else spec['at']}"
    if kind == Kind.EVENT:
        dataset = spec.get("dataset")
        if isinstance(dataset, str) and is_runs_dataset(dataset):
            f = parse_filter(spec.get("filter"))
            return describe(f) if not isinstance(f, str) else f"on {dataset} (bad filter)"
        return f"on {spec.get('dataset', '?')} of {short(str(spec.get('objectId', '?')))}"
    return json.dumps(spec, separators=(",", ":"))[:40]


def short(peer: str, keep: int = 6) -> str:
    """Return a long id clipped in the middle: `12D3Ko…b6oC`."""
    if len(peer) <= 2 * keep + 1:
        return peer
    return f"{peer[:keep]}…{peer[-keep:]}"


def owner(value: Any, me: str | None) -> str:
    """Return a trigger's owner for a table: `(here)`, `(unassigned)` or a clipped peer id."""
    if not isinstance(value, str):
        return "-"
    if me is not None and value == me:
        return "(here)"
    if is_unassigned(value):
        return "(unassigned)"
    return short(value)


def owner_line(value: Any, me: str | None) -> str:
    """Return a trigger's owner in full for `show`: the peer id, then `(here)` if it is us."""
    if not isinstance(value, str):
        return "-"
    if value == "":
        return "(unassigned)"
    if is_stamp(value):
        return f"{value} (unassigned: the stamp of a daemon without a peer id)"
    return f"{value} (here)" if me is not None and value == me else value


def compact(value: Any) -> str:
    """Return JSON on one line."""
    text = json.dumps(value, separators=(", ", ": "), ensure_ascii=False, sort_keys=True)
    return printable_json(text)


def field(value: Any) -> str:
    """Return a value for one cell or one `key: value` line: its control characters,
    newlines and tabs escaped (`\\x1b`, `\\n`, `\\u202e`)."""
    return printable(str(value))
