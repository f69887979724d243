"""Cron text into a `CronExpr`: croniter's syntax and field order, with errors that name the
field and the fix, and expressions that can never fire refused when they are parsed."""

from __future__ import annotations

import re

from anyrtd.schedule.match import (
    EPOCH_WEEKDAY,
    CronExpr,
    day_mask,
    days_from_civil,
    month_length,
)

MAX_CRON_LENGTH = 1024
"""The longest cron expression read, in characters; checked before anything else is done."""
MAX_LIST_ITEMS = 64
"""The most comma-separated items one field may list (every minute, listed, is 60)."""


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
        if field == _DOW and start == 7 and end < 7:
            start = 0  # `7-1` is Sunday to Monday, not a wrap from Sunday round to Monday
        if start > end:
            if step is not None:
                raise _err(
                    expr,
                    f'{name} range "{base}" wraps around and has a step; '
                    + _wrap_rewrite(start, end, step, lo, open_hi),
                )
            return [*range(start, hi + 1), *range(lo, end + 1)]
    else:
        start = _value(expr, field, base)
        # `a/step` runs from a to the field's end; `7/2` in day-of-week is Sunday alone.
        end = max(start, open_hi) if step is not None else start
    return list(range(start, end + 1, step or 1))


def _wrap_rewrite(start: int, end: int, step: int, lo: int, hi: int) -> str:
    """Return the advice for a wrapping range with a step: a rewrite that keeps its values.

    The range counts every `step`-th value from `start` round the wrap to `end` (`50-10/7` is
    50, 57, 4), so the rewrite is the part up to the field's end and the part after the wrap
    from the first value it reaches, not from the field's start.
    """
    first = f"{start}-{hi}/{step}" if start + step <= hi else f"{start}"
    after_wrap = start + step * -(-(hi + 1 - start) // step) - (hi + 1 - lo)
    if after_wrap > end:
        return f"it means only {first}; write that instead"
    second = f"{after_wrap}-{end}/{step}" if after_wrap + step <= end else f"{after_wrap}"
    return f"write it as two items that keep its values: {first},{second}"


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
        if field == _DOM and item == "lw":
            raise _err(
                expr,
                'day-of-month "LW" (the last weekday of the month) is not supported; L is the '
                "last day of the month and 15W the weekday nearest the 15th",
            )
        if field == _DOM and "l" in item:
            base, slash, step_text = item.partition("/")
            a, dash, b = base.partition("-")
            if dash and b == "l" and _DIGITS.fullmatch(a):
                raise _err(
                    expr,
                    f'day-of-month "{item}": L cannot end a range; write {a}-31{slash}{step_text} '
                    "(a month skips the days it does not have)",
                )
            raise _err(
                expr,
                f'day-of-month "{item}": L is the last day of the month and cannot be part of a '
                "range, a step or an offset; write L alone as a list item",
            )
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
    # As in croniter: only a bare `*` or `?` leaves the field unrestricted; `*/2`, `0-6` or
    # `1-31` restrict it, which matters when day-of-month and day-of-week are both restricted
    # and a day then matches either one. (Vixie cron ANDs the two when one starts with `*`.)
    unrestricted = text == "*"
    return bits, last, tuple(nearest), tuple(nth), unrestricted


def cron_size_error(expr: str) -> str | None:
    """Return why `expr` is too long to be read at all, or None; costs nothing to ask."""
    if len(expr) <= MAX_CRON_LENGTH:
        return None
    return (
        f'cron "{expr[:40]}…" is {len(expr):,} characters long, more than the limit of '
        f"{MAX_CRON_LENGTH}; write long lists as ranges (1-5) or steps (*/5)"
    )


def parse_cron(expr: str) -> CronExpr:
    """Parse a 5-, 6- or 7-field cron expression (croniter's field order); raise CronSyntaxError.

    The size limits (`MAX_CRON_LENGTH`, `MAX_LIST_ITEMS` in every field) are checked first,
    so that no expression costs more than a bounded amount of work to refuse.
    """
    too_long = cron_size_error(expr)
    if too_long is not None:
        raise CronSyntaxError(too_long)
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
    for i, field in enumerate(fields):
        items = field.count(",") + 1
        if items > MAX_LIST_ITEMS:
            raise _err(
                expr,
                f"{_FIELD_NAMES[i]} lists {items} items, more than the limit of {MAX_LIST_ITEMS}; "
                "write long lists as ranges (1-5) or steps (*/5)",
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
        # cron(8)'s test for a job "at a fixed time": its minute and hour fields do not start
        # with `*` (`*/15` and `*` are wildcards; `0-59` and `5` are fixed).
        fixed_time=not fields[_MINUTE].startswith("*") and not fields[_HOUR].startswith("*"),
    )
    problem = _never_matching_reason(compiled)
    if problem is not None:
        raise _err(expr, problem)
    return compiled


def _never_matching_reason(c: CronExpr) -> str | None:
    """Return why no date can ever match, or None; checks every month shape that exists."""
    for month in range(1, 13):
        if not c.months >> month & 1:
            continue
        for length in (28, 29) if month == 2 else (month_length(2001, month),):
            for fw in range(7):
                if day_mask(c, fw, length):
                    if c.years is None:
                        return None
                    if any(
                        c.years >> (y - 1970) & 1
                        and month_length(y, month) == length
                        and (days_from_civil(y, month, 1) + EPOCH_WEEKDAY) % 7 == fw
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
