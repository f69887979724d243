"""Text for the terminal: tables, times, schedules. Pure: `now` is passed in."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from anyrtd.vocab import Kind, is_stamp, is_unassigned


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Return rows as aligned columns under their headers."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *rows]
    ]
    return "\n".join(lines)


def when(ts: Any, now: float) -> str:
    """Return a local time with how far it is from now: `2026-11-30 08:00:00 (in 3h)`."""
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return "-"
    try:
        text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return str(ts)
    return f"{text} ({relative(ts - now)})"


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
            return f"{spec['cron']}" + (f" ({tz})" if tz else "")
        if "every_s" in spec:
            return f"every {spec['every_s']}s"
    if kind == Kind.ONCE and "at" in spec:
        at = spec["at"]
        if isinstance(at, int | float) and not isinstance(at, bool):
            try:
                return "at " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
            except (OverflowError, OSError, ValueError):
                pass
        return f"at {at}"
    if kind == Kind.EVENT:
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
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False, sort_keys=True)
