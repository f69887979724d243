"""The compiled cron expression and its matcher: bit sets per field, and a forward search
over naive wall-clock fields (year, month, day, hour, minute, second) to the first match.

Pure calendar arithmetic on whole numbers; no zone and no clock (`zones` maps wall times to
instants).
"""

from __future__ import annotations

from dataclasses import dataclass

#: How far a cron search looks ahead before it gives up. Any expression that can match at all
#: matches within 28 years (the weekday/leap-year cycle), except around the skipped leap day
#: of 2100, so 60 years never gives a false "never fires" and still bounds the work.
_SEARCH_YEARS = 60

EPOCH_WEEKDAY = 4  # 1970-01-01 was a Thursday; weekdays count from Sunday = 0 as in cron


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
    fixed_time: bool  # neither minute nor hour starts with `*`: cron(8) catches it up in a gap


def days_from_civil(y: int, m: int, d: int) -> int:
    """Return days since 1970-01-01 for a proleptic Gregorian date (Hinnant's algorithm)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def month_length(y: int, m: int) -> int:
    if m == 2:
        return 29 if (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)) else 28
    return 30 if m in (4, 6, 9, 11) else 31


def next_bit(mask: int, start: int) -> int:
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


def day_mask(c: CronExpr, first_weekday: int, length: int) -> int:
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


class CronMatcher:
    """The forward search over naive wall-clock fields; day masks memoised per month shape."""

    __slots__ = ("_c", "_masks")

    def __init__(self, c: CronExpr) -> None:
        self._c = c
        self._masks: list[int | None] = [None] * 28  # index first_weekday * 4 + (length - 28)

    def _month_days(self, y: int, m: int) -> int:
        length = month_length(y, m)
        fw = (days_from_civil(y, m, 1) + EPOCH_WEEKDAY) % 7
        i = fw * 4 + length - 28
        mask = self._masks[i]
        if mask is None:
            mask = self._masks[i] = day_mask(self._c, fw, length)
        return mask

    def first_at_or_after(
        self, y: int, mo: int, d: int, h: int, mi: int, s: int
    ) -> tuple[int, int, int, int, int, int] | None:
        """Return the first matching naive time at or after the given one, or None."""
        c = self._c
        limit = 2099 if c.years is not None else y + _SEARCH_YEARS
        while y <= limit:
            if c.years is not None and not c.years >> (y - 1970) & 1:
                nxt = next_bit(c.years, y - 1970) if y >= 1970 else next_bit(c.years, 0)
                if nxt < 0:
                    return None
                y, mo, d, h, mi, s = nxt + 1970, 1, 1, 0, 0, 0
                continue
            nm = next_bit(c.months, mo)
            if nm < 0:
                y, mo, d, h, mi, s = y + 1, 1, 1, 0, 0, 0
                continue
            if nm != mo:
                mo, d, h, mi, s = nm, 1, 0, 0, 0
            nd = next_bit(self._month_days(y, mo), d)
            if nd < 0:
                if mo == 12:
                    y, mo, d, h, mi, s = y + 1, 1, 1, 0, 0, 0
                else:
                    mo, d, h, mi, s = mo + 1, 1, 0, 0, 0
                continue
            if nd != d:
                d, h, mi, s = nd, 0, 0, 0
            nh = next_bit(c.hours, h)
            if nh < 0:
                d, h, mi, s = d + 1, 0, 0, 0
                continue
            if nh != h:
                h, mi, s = nh, 0, 0
            nmi = next_bit(c.minutes, mi)
            if nmi < 0:
                h, mi, s = h + 1, 0, 0
                continue
            if nmi != mi:
                mi, s = nmi, 0
            ns = next_bit(c.seconds, s)
            if ns < 0:
                mi, s = mi + 1, 0
                continue
            return y, mo, d, h, mi, ns
        return None


def civil(t: int) -> tuple[int, int, int, int, int, int]:
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


def epoch(y: int, mo: int, d: int, h: int, mi: int, s: int) -> int:
    return days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s
