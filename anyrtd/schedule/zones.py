"""IANA zones: a spec's `tz` looked up, and a local wall time mapped to one instant by the
cron(8) rules (a time in a spring-forward gap maps to the gap's end, where a job at a fixed
time fires; a repeated time fires the first time)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from anyrtd.schedule.match import epoch

MAX_TZ_LENGTH = 255
"""The longest `tz` looked up: a zone name is a path under the zone database (one file name)."""


def zone_of(name: Any) -> tuple[tzinfo | None, str | None]:
    """Return (zone, error) for a spec's tz value; UTC spellings become None (the fast path)."""
    if not isinstance(name, str) or not name:
        return None, f'tz must be an IANA zone name like "Europe/Berlin", not {name!r}'
    if name in ("UTC", "Etc/UTC", "Z"):
        return None, None
    try:
        return ZoneInfo(name), None
    except Exception:  # ZoneInfoNotFoundError, ValueError for odd keys, OSError for directories
        return None, f'tz "{name}" is not a known IANA zone name; use one like "Europe/Berlin"'


def local_text(ts: float, name: str | None) -> str:
    """Return an instant as the wall time of zone `name` (UTC when None or unknown)."""
    zone, _ = zone_of(name) if name else (None, None)
    dt = datetime.fromtimestamp(ts, zone or UTC)
    return dt.strftime("%Y-%m-%d %H:%M:%S ") + (dt.tzname() or "UTC")


def offset_s(dt: datetime) -> int:
    off = dt.utcoffset()
    return int(off.total_seconds()) if off is not None else 0


def to_instant(fields: tuple[int, int, int, int, int, int], zone: tzinfo) -> tuple[int, bool]:
    """Map a local wall time to unix seconds and whether it lies in a spring-forward gap.

    A time in a gap maps to the gap's end (the first instant after it); a repeated time maps
    to its first occurrence.
    """
    y, mo, d, h, mi, s = fields
    naive = epoch(y, mo, d, h, mi, s)
    first = datetime(y, mo, d, h, mi, s, tzinfo=zone)
    o0 = offset_s(first)
    o1 = offset_s(first.replace(fold=1))
    if o0 >= o1:
        return naive - o0, False  # normal, or ambiguous where fold=0 is the first occurrence
    # A gap (PEP 495: fold=0 uses the offset before the transition). The transition instant
    # lies between the two readings; find it by bisection on the zone's offset.
    lo, hi = naive - o1, naive - o0  # offset(lo) == o0 side, offset(hi) == o1 side
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offset_s(datetime.fromtimestamp(mid, zone)) == o1:
            hi = mid
        else:
            lo = mid
    return hi, True


def fold_end_wall(after: float, zone: tzinfo, local: datetime) -> int:
    """Return the naive wall second at which the repeated interval containing `local` ends."""
    post = offset_s(local)
    pre = offset_s(local.replace(fold=0))
    # The fall-back transition lies within (after - (pre - post), after]; bisect for it.
    lo, hi = math.floor(after) - (pre - post), math.floor(after)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offset_s(datetime.fromtimestamp(mid, zone)) == post:
            hi = mid
        else:
            lo = mid
    return hi + pre
