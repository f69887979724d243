"""Schedule arithmetic: when a cron, every_s or once trigger fires next, without reading the clock.

Everything here is pure: times are unix seconds (floats) passed in, never read. A spec is
compiled once into a `Schedule`; arming is then `schedule.next_after(after, anchor)`.

Cron expressions are parsed and matched by a compiled matcher of our own (bit sets per field,
a forward search over months, days, hours, minutes and seconds) because croniter is too slow
to re-arm tens of thousands of definitions, gets DST fall-back wrong for our rules (it fires a
repeated local time twice) and its error messages do not say which field is wrong. The
accepted syntax and field meanings are croniter's (7.0), verified against croniter in the tests;
the few places where we deliberately differ are listed in docs/schedule.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable
from zoneinfo import ZoneInfo

__all__ = [
    "MAX_EVERY_S",
    "CronExpr",
    "CronSchedule",
    "CronSyntaxError",
    "EventSchedule",
    "EverySchedule",
    "InvalidSchedule",
    "OnceSchedule",
    "Schedule",
    "compile_schedule",
    "once_due",
    "parse_cron",
    "preview",
]

#: The largest accepted `every_s`: a hundred years. Larger intervals are almost certainly typos
#: (milliseconds for seconds) and would arm beyond any date the tools can show.
MAX_EVERY_S = 100 * 365.25 * 86400.0

#: How far a cron search looks ahead before it gives up. Any expression that can match at all
#: matches within 28 years (the weekday/leap-year cycle), except around the skipped leap day
#: of 2100, so 60 years never gives a false "never fires" and still bounds the work.
_SEARCH_YEARS = 60

_EPOCH_WEEKDAY = 4  # 1970-01-01 was a Thursday; weekdays count from Sunday = 0 as in cron


# --------------------------------------------------------------------------- the Schedule API


@runtime_checkable
class Schedule(Protocol):
    """A compiled schedule: the next fire time strictly after a given time, or None for never."""

    @property
    def error(self) -> str | None: ...

    @property
    def is_valid(self) -> bool: ...

    def next_after(self, after: float, anchor: float) -> float | None: ...


@dataclass(frozen=True, slots=True)
class InvalidSchedule:
    """A spec that can never fire; `error` says why and what to write instead."""

    error: str

    @property
    def is_valid(self) -> bool:
        return False

    def next_after(self, after: float, anchor: float) -> float | None:
        """Return None: an invalid spec never fires."""
        return None


@dataclass(frozen=True, slots=True)
class EverySchedule:
    """`{"every_s": n}`: fire on the grid anchor + k*n, k >= 1."""

    every_s: float
    error: None = None

    @property
    def is_valid(self) -> bool:
        return True

    def next_after(self, after: float, anchor: float) -> float | None:
        """Return the first grid point anchor + k*n (k >= 1) strictly after `after`."""
        n = self.every_s
        k = max(1, math.floor((after - anchor) / n) + 1)
        t = anchor + k * n
        # Float rounding can land the product on or just below `after`; step until strictly past.
        while t <= after:
            k += 1
            t = anchor + k * n
        return t


@dataclass(frozen=True, slots=True)
class OnceSchedule:
    """`{"at": epoch}`: one fire at `at`. See `once_due` for how a once is armed."""

    at: float
    error: None = None

    @property
    def is_valid(self) -> bool:
        return True

    def next_after(self, after: float, anchor: float) -> float | None:
        """Return `at` if it lies strictly after `after`, else None."""
        return self.at if self.at > after else None


@dataclass(frozen=True, slots=True)
class EventSchedule:
    """An event trigger: it fires on a change, never on a time, so `next_after` is None."""

    dataset: str
    object_id: str
    space_id: str | None
    error: None = None

    @property
    def is_valid(self) -> bool:
        return True

    def next_after(self, after: float, anchor: float) -> float | None:
        """Return None: event triggers are not armed on the clock."""
        return None


def once_due(at: float | None, last_run_at: float | None) -> float | None:
    """Return a once's due time (`at`, even if past: late beats lost); None if consumed."""
    if at is None or last_run_at is not None:
        return None
    return at


# --------------------------------------------------------------------------- cron parsing


class CronSyntaxError(ValueError):
    """A cron expression that cannot be parsed; the message names the field and the fix."""


_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week", "second", "year")
_FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7), (0, 59), (1970, 2099))
_MINUTE, _HOUR, _DOM, _MONTH, _DOW, _SECOND, _YEAR = range(7)
_MONTH_NAMES = {
    n: i + 1
    for i, n in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
    )
}
_DOW_NAMES = {n: i for i, n in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_ALIASES = {
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
# Only ASCII whitespace separates fields, as in croniter: a no-break space is not a separator.
_FIELD_SPLIT = re.compile(r"[^ \t\n\r\f\v]+")
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_MONTH_LABELS = (
    "",
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed cron expression: one bit set per field, plus the L/W/# day rules."""

    text: str
    seconds: int  # bit s set = second s matches
    minutes: int
    hours: int
    dom: int  # bits 1..31
    dom_last: bool  # `L`: the last day of the month
    dom_nearest: tuple[int, ...]  # `15W`: the weekday nearest to the 15th
    months: int  # bits 1..12
    dow: int  # bits 0..6, Sunday = 0
    dow_nth: tuple[tuple[int, int], ...]  # (weekday, n) with n in 1..5, or -1 for `L`
    years: int | None  # bit (year - 1970) set; None = every year
    dom_any: bool  # the day-of-month field does not restrict
    dow_any: bool  # the day-of-week field does not restrict
    has_seconds: bool


def _err(expr: str, message: str) -> CronSyntaxError:
    return CronSyntaxError(f'cron "{expr}": {message}')


def _value(expr: str, field: int, token: str) -> int:
    """Return the number a token names in `field` (digits, or a month/day name)."""
    name = _FIELD_NAMES[field]
    lo, hi = _FIELD_RANGES[field]
    if _DIGITS.fullmatch(token):
        v = int(token)
    elif field == _MONTH and token in _MONTH_NAMES:
        return _MONTH_NAMES[token]
    elif field == _DOW and token in _DOW_NAMES:
        return _DOW_NAMES[token]
    else:
        hint = ""
        if field == _MONTH:
            hint = " or a month name (jan-dec)"
        elif field == _DOW:
            hint = " or a day name (sun-sat)"
        raise _err(expr, f'{name} "{token}" is not a number{hint}')
    if not lo <= v <= hi:
        shown = f"{lo}-{hi}" if field != _DOW else "0-7 (0 and 7 are Sunday)"
        raise _err(expr, f"{name} {v} is out of range {shown}")
    return v


def _range_values(expr: str, field: int, base: str, step: int | None) -> list[int]:
    """Expand `*`, `a`, `a-b` (wrapping when a > b) with an optional step into values."""
    name = _FIELD_NAMES[field]
    lo, hi = _FIELD_RANGES[field]
    # Day-of-week runs 0-7 with 7 = Sunday: ranges may end on 7 (`5-7`), but `*` and `a/step`
    # stop at Saturday so that 7 does not add a second Sunday (`1/2` is Mon, Wed, Fri).
    open_hi = 6 if field == _DOW else hi
    if base == "*":
        start, end = lo, open_hi
    elif "-" in base:
        a, _, b = base.partition("-")
        if not a or not b:
            raise _err(expr, f'{name} range "{base}" needs a start and an end, like 1-5')
        start, end = _value(expr, field, a), _value(expr, field, b)
        if field == _DOW and start == 7:
            start = 0  # `7-1` is Sunday to Monday, not a wrap from Sunday round to Monday
        if start > end:
            if step is not None:
                raise _err(
                    expr,
                    f'{name} range "{base}" wraps around and has a step; write it as two '
                    f"ranges, e.g. {start}-{hi}/{step},{lo}-{end}/{step}",
                )
            return [*range(start, hi + 1), *range(lo, end + 1)]
    else:
        start = _value(expr, field, base)
        end = open_hi if step is not None else start  # `a/step` runs from a to the field's end
    return list(range(start, end + 1, step or 1))


def _parse_field(
    expr: str, field: int, text: str
) -> tuple[int, bool, tuple[int, ...], tuple[tuple[int, int], ...], bool]:
    """Parse one field into (bits, last-day, nearest-weekday days, nth weekdays, unrestricted)."""
    name = _FIELD_NAMES[field]
    lo = _FIELD_RANGES[field][0]
    if text == "?":
        if field not in (_DOM, _DOW):
            raise _err(expr, f'"?" is only allowed in day-of-month and day-of-week, not in {name}')
        text = "*"
    bits = 0
    last = False
    nearest: list[int] = []
    nth: list[tuple[int, int]] = []
    items = text.split(",")
    for item in items:
        if not item:
            raise _err(expr, f'{name} "{text}" has an empty list item')
        if item[0] in "hr":
            raise _err(
                expr,
                f'{name} "{item}": hashed (H) and random (R) values are not supported, because '
                "devices would pick different times; write the value explicitly",
            )
        if "?" in item:
            raise _err(expr, f'{name} "{text}": "?" must be the whole field')
        if field == _DOM and item == "l":
            last = True
            continue
        if field == _DOM and "w" in item:
            day = item[:-1] if item.endswith("w") else item[1:] if item.startswith("w") else ""
            if len(items) > 1 or not _DIGITS.fullmatch(day):
                raise _err(
                    expr,
                    f'day-of-month "{text}": W takes a single day, like 15W (the weekday nearest '
                    "the 15th), not a list or range",
                )
            v = int(day)
            if not 1 <= v <= 31:
                raise _err(expr, f"day-of-month {v}W is out of range 1-31")
            nearest.append(v)
            continue
        if field == _DOW and "#" in item:
            base, _, n_text = item.partition("#")
            if not _DIGITS.fullmatch(n_text) or not 1 <= int(n_text) <= 5:
                raise _err(
                    expr,
                    f'day-of-week "{item}": the number after # must be 1-5 (the nth weekday '
                    "of the month)",
                )
            for d in _range_values(expr, field, base, None):
                nth.append((d % 7, int(n_text)))
            continue
        if field == _DOW and item == "l":
            raise _err(expr, 'day-of-week "L" needs a weekday: L5 is the last Friday of the month')
        if field == _DOW and item.startswith("l"):
            nth.append((_value(expr, field, item[1:]) % 7, -1))
            continue
        if field == _DOW and item.endswith("l"):
            raise _err(
                expr, f'day-of-week "{item}": write the last weekday of a month as L5, not 5L'
            )
        base, slash, step_text = item.partition("/")
        step: int | None = None
        if slash:
            if not _DIGITS.fullmatch(step_text):
                raise _err(expr, f'{name} step "{step_text}" in "{item}" is not a number')
            step = int(step_text)
            if step < 1:
                raise _err(expr, f'{name} step 0 in "{item}" must be at least 1')
        if not base:
            raise _err(expr, f'{name} "{item}" has nothing before the "/"')
        for v in _range_values(expr, field, base, step):
            bits |= 1 << ((v % 7) if field == _DOW else (v - lo if field == _YEAR else v))
    if nth and (bits or field != _DOW):
        raise _err(
            expr,
            f'day-of-week "{text}" mixes plain days and nth days (#, L); use one kind per field',
        )
    # As in croniter (and Vixie cron, except for `*/n`): only a bare `*` or `?` leaves the
    # field unrestricted; `0-6` or `1-31` restrict it, which matters when day-of-month and
    # day-of-week are both restricted and a day then matches either one.
    unrestricted = text == "*"
    return bits, last, tuple(nearest), tuple(nth), unrestricted


def parse_cron(expr: str) -> CronExpr:
    """Parse a 5-, 6- or 7-field cron expression (croniter's field order); raise CronSyntaxError."""
    text = expr.strip().lower()
    text = _ALIASES.get(text, text)
    if text.startswith("@"):
        raise _err(
            expr,
            f'unknown shortcut "{text}"; use @hourly, @daily, @midnight, @weekly, @monthly, '
            "@yearly or @annually, or five fields",
        )
    fields = _FIELD_SPLIT.findall(text)
    if len(fields) not in (5, 6, 7):
        raise _err(
            expr,
            f"expected 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds "
            f"last, or 7 with seconds and year last; got {len(fields)}",
        )
    parsed = [_parse_field(expr, i, f) for i, f in enumerate(fields)]
    seconds = parsed[_SECOND][0] if len(fields) > 5 else 1
    years = parsed[_YEAR][0] if len(fields) == 7 and not parsed[_YEAR][4] else None
    compiled = CronExpr(
        text=expr,
        seconds=seconds,
        minutes=parsed[_MINUTE][0],
        hours=parsed[_HOUR][0],
        dom=parsed[_DOM][0],
        dom_last=parsed[_DOM][1],
        dom_nearest=parsed[_DOM][2],
        months=parsed[_MONTH][0],
        dow=parsed[_DOW][0],
        dow_nth=parsed[_DOW][3],
        years=years,
        dom_any=parsed[_DOM][4],
        dow_any=parsed[_DOW][4],
        has_seconds=len(fields) > 5,
    )
    problem = _never_matching_reason(compiled)
    if problem is not None:
        raise _err(expr, problem)
    return compiled


# --------------------------------------------------------------------------- calendar helpers


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Return days since 1970-01-01 for a proleptic Gregorian date (Hinnant's algorithm)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _month_length(y: int, m: int) -> int:
    if m == 2:
        return 29 if (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)) else 28
    return 30 if m in (4, 6, 9, 11) else 31


def _next_bit(mask: int, start: int) -> int:
    """Return the lowest set bit index >= start, or -1."""
    m = mask >> start
    if not m:
        return -1
    return start + (m & -m).bit_length() - 1


def _nearest_weekday(day: int, first_weekday: int, length: int) -> int:
    """Return the weekday (Mon-Fri) nearest to `day` within its month, as croniter does."""
    day = min(day, length)
    wd = (first_weekday + day - 1) % 7  # Sunday = 0
    if 1 <= wd <= 5:
        return day
    if wd == 6:  # Saturday: the Friday before, unless that leaves the month
        return day - 1 if day > 1 else day + 2
    return day + 1 if day < length else day - 2  # Sunday: the Monday after, or the Friday before


def _day_mask(c: CronExpr, first_weekday: int, length: int) -> int:
    """Return the bit set of matching days in a month that starts on `first_weekday`."""
    days = ((1 << (length + 1)) - 1) & ~1
    if c.dom_any and c.dow_any:
        return days
    dom_side = c.dom & days
    if c.dom_last:
        dom_side |= 1 << length
    for n in c.dom_nearest:
        dom_side |= 1 << _nearest_weekday(n, first_weekday, length)
    dow_side = 0
    for wd in range(7):
        first = 1 + (wd - first_weekday) % 7  # the first day of the month that is weekday wd
        if c.dow >> wd & 1:
            for day in range(first, length + 1, 7):
                dow_side |= 1 << day
    for wd, n in c.dow_nth:
        first = 1 + (wd - first_weekday) % 7
        day = first + 7 * ((length - first) // 7) if n == -1 else first + 7 * (n - 1)
        if day <= length:
            dow_side |= 1 << day
    if c.dom_any:
        return dow_side
    if c.dow_any:
        return dom_side
    # Both restricted: a day matches either field, as in Vixie cron and croniter.
    return dom_side | dow_side


def _never_matching_reason(c: CronExpr) -> str | None:
    """Return why no date can ever match, or None; checks every month shape that exists."""
    for month in range(1, 13):
        if not c.months >> month & 1:
            continue
        for length in (28, 29) if month == 2 else (_month_length(2001, month),):
            for fw in range(7):
                if _day_mask(c, fw, length):
                    if c.years is None:
                        return None
                    if any(
                        c.years >> (y - 1970) & 1
                        and _month_length(y, month) == length
                        and (_days_from_civil(y, month, 1) + _EPOCH_WEEKDAY) % 7 == fw
                        for y in range(1970, 2100)
                    ):
                        return None
    if c.dow_any and not c.dom_last and not c.dom_nearest:
        days = [d for d in range(1, 32) if c.dom >> d & 1]
        months = [_MONTH_LABELS[m] for m in range(1, 13) if c.months >> m & 1]
        if c.years is None:
            return (
                f"never fires: {', '.join(months)} {'has' if len(months) == 1 else 'have'} no "
                f"day {' or '.join(map(str, days))}"
            )
    return "never fires: no date matches its day, month, weekday and year fields together"


# --------------------------------------------------------------------------- the cron matcher


class _CronMatcher:
    """The forward search over naive wall-clock fields; day masks memoised per month shape."""

    __slots__ = ("_c", "_masks")

    def __init__(self, c: CronExpr) -> None:
        self._c = c
        self._masks: list[int | None] = [None] * 28  # index first_weekday * 4 + (length - 28)

    def _month_days(self, y: int, m: int) -> int:
        length = _month_length(y, m)
        fw = (_days_from_civil(y, m, 1) + _EPOCH_WEEKDAY) % 7
        i = fw * 4 + length - 28
        mask = self._masks[i]
        if mask is None:
            mask = self._masks[i] = _day_mask(self._c, fw, length)
        return mask

    def first_at_or_after(
        self, y: int, mo: int, d: int, h: int, mi: int, s: int
    ) -> tuple[int, int, int, int, int, int] | None:
        """Return the first matching naive time at or after the given one, or None."""
        c = self._c
        limit = 2099 if c.years is not None else y + _SEARCH_YEARS
        while y <= limit:
            if c.years is not None and not c.years >> (y - 1970) & 1:
                nxt = _next_bit(c.years, y - 1970) if y >= 1970 else _next_bit(c.years, 0)
                if nxt < 0:
                    return None
                y, mo, d, h, mi, s = nxt + 1970, 1, 1, 0, 0, 0
                continue
            nm = _next_bit(c.months, mo)
            if nm < 0:
                y, mo, d, h, mi, s = y + 1, 1, 1, 0, 0, 0
                continue
            if nm != mo:
                mo, d, h, mi, s = nm, 1, 0, 0, 0
            nd = _next_bit(self._month_days(y, mo), d)
            if nd < 0:
                if mo == 12:
                    y, mo, d, h, mi, s = y + 1, 1, 1, 0, 0, 0
                else:
                    mo, d, h, mi, s = mo + 1, 1, 0, 0, 0
                continue
            if nd != d:
                d, h, mi, s = nd, 0, 0, 0
            nh = _next_bit(c.hours, h)
            if nh < 0:
                d, h, mi, s = d + 1, 0, 0, 0
                continue
            if nh != h:
                h, mi, s = nh, 0, 0
            nmi = _next_bit(c.minutes, mi)
            if nmi < 0:
                h, mi, s = h + 1, 0, 0
                continue
            if nmi != mi:
                mi, s = nmi, 0
            ns = _next_bit(c.seconds, s)
            if ns < 0:
                mi, s = mi + 1, 0
                continue
            return y, mo, d, h, mi, ns
        return None


def _civil(t: int) -> tuple[int, int, int, int, int, int]:
    """Split whole unix seconds into UTC (year, month, day, hour, minute, second)."""
    days, rem = divmod(t, 86400)
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    y = yoe + era * 400 + (m <= 2)
    h, rem = divmod(rem, 3600)
    mi, s = divmod(rem, 60)
    return y, m, d, h, mi, s


def _epoch(y: int, mo: int, d: int, h: int, mi: int, s: int) -> int:
    return _days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s


class CronSchedule:
    """A compiled cron expression in UTC or an IANA zone, with cron(8) DST rules."""

    __slots__ = ("_matcher", "_step", "_zone", "expr", "tz")

    def __init__(self, expr: CronExpr, tz: str | None, zone: tzinfo | None) -> None:
        self.expr = expr
        self.tz = tz
        self._zone = zone
        self._matcher = _CronMatcher(expr)
        self._step = 1 if expr.has_seconds else 60

    @property
    def error(self) -> str | None:
        return None

    @property
    def is_valid(self) -> bool:
        return True

    def __repr__(self) -> str:
        zone = f", tz={self.tz!r}" if self.tz else ""
        return f"CronSchedule({self.expr.text!r}{zone})"

    def _start(self, wall: int) -> tuple[int, int, int, int, int, int]:
        """Return the naive fields of the first candidate strictly after `wall` (whole seconds)."""
        step = self._step
        return _civil(wall - wall % step + step)

    def next_after(self, after: float, anchor: float) -> float | None:
        """Return the first occurrence strictly after `after`; `anchor` is ignored for cron."""
        if not math.isfinite(after) or not -62135596800.0 < after < 253402300799.0:
            return None
        zone = self._zone
        if zone is None:
            found = self._matcher.first_at_or_after(*self._start(math.floor(after)))
            return None if found is None else float(_epoch(*found))
        try:
            return self._next_in_zone(after, zone)
        except (OverflowError, ValueError):  # a match past year 9999 has no local time
            return None

    def _next_in_zone(self, after: float, zone: tzinfo) -> float | None:
        """Search in local wall time, then map each local match to one instant (cron(8) rules).

        A local time inside a spring-forward gap maps to the instant the gap ends (so it fires
        right after the gap); a local time that occurs twice maps to its first occurrence. The
        map is monotonic, so the first local match whose instant is after `after` is the answer.
        """
        local = datetime.fromtimestamp(after, zone)
        offset = local.utcoffset() or timedelta(0)
        wall = math.floor(after) + int(offset.total_seconds())
        if local.fold == 1:
            # In the second pass of a repeated hour: every local time up to the end of the
            # repetition already fired during the first pass, so search from its end.
            wall = max(wall, _fold_end_wall(after, zone, local) - 1)
        start = self._start(wall)
        while True:
            found = self._matcher.first_at_or_after(*start)
            if found is None:
                return None
            instant = _instant(found, zone)
            if instant > after:
                return float(instant)
            # Only reachable at the edges of a transition; continue just past this match.
            start = _civil(_epoch(*found) + 1)


def _offset_s(dt: datetime) -> int:
    off = dt.utcoffset()
    return int(off.total_seconds()) if off is not None else 0


def _instant(fields: tuple[int, int, int, int, int, int], zone: tzinfo) -> int:
    """Map a local wall time to unix seconds: gaps to the gap's end, repeats to the first."""
    y, mo, d, h, mi, s = fields
    naive = _epoch(y, mo, d, h, mi, s)
    first = datetime(y, mo, d, h, mi, s, tzinfo=zone)
    o0 = _offset_s(first)
    o1 = _offset_s(first.replace(fold=1))
    if o0 >= o1:
        return naive - o0  # normal, or ambiguous where fold=0 is the first occurrence
    # A gap (PEP 495: fold=0 uses the offset before the transition). The transition instant
    # lies between the two readings; find it by bisection on the zone's offset.
    lo, hi = naive - o1, naive - o0  # offset(lo) == o0 side, offset(hi) == o1 side
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset_s(datetime.fromtimestamp(mid, zone)) == o1:
            hi = mid
        else:
            lo = mid
    return hi


def _fold_end_wall(after: float, zone: tzinfo, local: datetime) -> int:
    """Return the naive wall second at which the repeated interval containing `local` ends."""
    post = _offset_s(local)
    pre = _offset_s(local.replace(fold=0))
    # The fall-back transition lies within (after - (pre - post), after]; bisect for it.
    lo, hi = math.floor(after) - (pre - post), math.floor(after)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset_s(datetime.fromtimestamp(mid, zone)) == post:
            hi = mid
        else:
            lo = mid
    return hi + pre


# --------------------------------------------------------------------------- compiling specs


def _zone(name: Any) -> tuple[tzinfo | None, str | None]:
    """Return (zone, error) for a spec's tz value; UTC spellings become None (the fast path)."""
    if not isinstance(name, str) or not name:
        return None, f'tz must be an IANA zone name like "Europe/Berlin", not {name!r}'
    if name in ("UTC", "Etc/UTC", "Z"):
        return None, None
    try:
        return ZoneInfo(name), None
    except Exception:  # ZoneInfoNotFoundError, ValueError for odd keys, OSError for directories
        return None, f'tz "{name}" is not a known IANA zone name; use one like "Europe/Berlin"'


@lru_cache(maxsize=8192)
def _compile_cron(expr: str, tz: str | None) -> CronSchedule | InvalidSchedule:
    """Compile a cron expression in a zone once; the LRU shares it across definitions."""
    zone: tzinfo | None = None
    if tz is not None:
        zone, problem = _zone(tz)
        if problem is not None:
            return InvalidSchedule(problem)
    try:
        parsed = parse_cron(expr)
    except CronSyntaxError as exc:
        return InvalidSchedule(str(exc))
    return CronSchedule(parsed, tz, zone)


def _number(v: Any) -> float | None:
    """Return v as a finite float if it is a JSON number (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def compile_schedule(kind: str, spec: Mapping[str, Any]) -> Schedule:
    """Compile a trigger's spec into a Schedule; an unusable spec gives an InvalidSchedule."""
    try:
        return _compile(kind, spec)
    except Exception as exc:  # never let a strange spec escape as an exception
        return InvalidSchedule(f"{kind} spec could not be read: {exc}")


def _compile(kind: str, spec: Mapping[str, Any]) -> Schedule:
    if not isinstance(spec, Mapping):
        return InvalidSchedule(f"spec must be an object, not {type(spec).__name__}")
    if kind == "cron":
        has_cron, has_every = "cron" in spec, "every_s" in spec
        if has_cron and has_every:
            return InvalidSchedule('cron spec has both "cron" and "every_s"; keep one')
        if has_every:
            raw = spec["every_s"]
            n = _number(raw)
            if n is None:
                return InvalidSchedule(f"every_s must be a number of seconds, not {raw!r}")
            if n <= 0:
                return InvalidSchedule(f"every_s {raw!r} must be greater than 0")
            if n > MAX_EVERY_S:
                return InvalidSchedule(
                    f"every_s {raw!r} is more than 100 years; give the interval in seconds"
                )
            return EverySchedule(n)
        if not has_cron:
            return InvalidSchedule(
                'cron spec needs "cron" (like {"cron": "0 8 * * *"}) or "every_s" '
                '(like {"every_s": 300})'
            )
        expr = spec["cron"]
        if not isinstance(expr, str):
            return InvalidSchedule(
                f'cron expression must be a string like "0 8 * * *", not {expr!r}'
            )
        tz = spec.get("tz")
        if tz is not None and not isinstance(tz, str):
            return InvalidSchedule(f'tz must be an IANA zone name like "Europe/Berlin", not {tz!r}')
        return _compile_cron(expr, tz)
    if kind == "once":
        raw = spec.get("at")
        at = _number(raw)
        if at is None:
            return InvalidSchedule(
                f'once spec needs a numeric "at" (unix seconds, like {{"at": 1787000000}}), '
                f"not {raw!r}"
            )
        return OnceSchedule(at)
    if kind == "event":
        dataset, object_id, space_id = (
            spec.get("dataset"),
            spec.get("objectId"),
            spec.get("spaceId"),
        )
        missing = [
            k
            for k, v in (("dataset", dataset), ("objectId", object_id))
            if not isinstance(v, str) or not v
        ]
        if missing:
            return InvalidSchedule(
                f"event spec needs {' and '.join(missing)} as non-empty strings, like "
                '{"dataset": "chat_messages", "objectId": "<chat id>"}'
            )
        if space_id is not None and not isinstance(space_id, str):
            return InvalidSchedule(f"event spaceId must be a string, not {space_id!r}")
        assert isinstance(dataset, str) and isinstance(object_id, str)
        return EventSchedule(dataset, object_id, space_id)
    return InvalidSchedule(f'kind "{kind}" is not one of cron, once, event')


# --------------------------------------------------------------------------- preview


class _HasSchedule(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def schedule(self) -> Schedule: ...


def preview(
    defn_or_schedule: Schedule | Any, after: float, n: int, anchor: float | None = None
) -> list[float]:
    """Return the next `n` fire times after `after` of a definition or schedule.

    For a definition, a once that has not run shows its due time even when it is in the past
    (it fires on the next tick); a consumed once and an event trigger show nothing.
    """
    anchor = after if anchor is None else anchor
    schedule = getattr(defn_or_schedule, "schedule", defn_or_schedule)
    if isinstance(schedule, OnceSchedule) and hasattr(defn_or_schedule, "rollup"):
        due = once_due(schedule.at, defn_or_schedule.rollup.last_run_at)
        return [] if due is None or n < 1 else [due]
    times: list[float] = []
    t = after
    while len(times) < n:
        nxt = schedule.next_after(t, anchor)
        if nxt is None:
            break
        times.append(nxt)
        t = nxt
    return times
