"""Cron arithmetic found wrong by cronsim's and croniter's suites: day-of-week 7, the cron(8)
spring-forward rule for wildcard jobs, the rewrite offered for a wrapping range with a step,
and the `L` forms that are refused."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from anyrtd.schedule import CronSyntaxError, compile_schedule, parse_cron, preview

MONDAY = datetime(2026, 1, 5, tzinfo=UTC).timestamp()  # a Monday, 00:00 UTC


def weekdays(expr: str, n: int = 7) -> list[str]:
    """Return the weekday names of the first `n` fires from MONDAY on."""
    schedule = compile_schedule("cron", {"cron": expr})
    assert schedule.is_valid, schedule.error
    return [datetime.fromtimestamp(t, UTC).strftime("%a") for t in preview(schedule, MONDAY - 1, n)]


@pytest.mark.parametrize(
    ("expr", "days"),
    [
        ("0 0 * * 7-7", ["Sun", "Sun", "Sun"]),
        ("0 0 * * 7", ["Sun", "Sun", "Sun"]),
        ("0 0 * * 7/2", ["Sun", "Sun", "Sun"]),
        ("0 0 * * 7-7/2", ["Sun", "Sun", "Sun"]),
        ("0 0 * * 5-7", ["Fri", "Sat", "Sun"]),
        ("0 0 * * 5-7/2", ["Fri", "Sun", "Fri"]),
        ("0 0 * * 7-1", ["Mon", "Sun", "Mon"]),
        ("0 0 * * 6/2", ["Sat", "Sat", "Sat"]),
        ("0 0 * * 1/2", ["Mon", "Wed", "Fri"]),
    ],
)
def test_day_of_week_7_is_sunday_in_ranges_and_steps(expr: str, days: list[str]) -> None:
    assert weekdays(expr, len(days)) == days


@settings(deadline=None, max_examples=200)
@given(
    a=st.integers(0, 7),
    b=st.integers(0, 7),
    step=st.integers(1, 8),
    form=st.sampled_from(["value", "range", "range_step", "value_step"]),
)
def test_day_of_week_7_means_sunday_in_every_form(a: int, b: int, step: int, form: str) -> None:
    # The meaning, worked out here: a range runs a..b (7 may end it; `7-b` starts at Sunday),
    # `a/s` runs from a to the end of the week, and 7 is Sunday wherever it lands.
    if form in ("range", "range_step") and a > b and a != 7:
        return  # a wrapping range: its own tests above
    lo = 0 if a == 7 and b < 7 else a
    s = step if form.endswith("step") else 1
    if form == "value":
        text, values = str(a), {a}
    elif form == "value_step":
        text, values = f"{a}/{step}", set(range(a, max(a, 6) + 1, step))
    else:
        text = f"{a}-{b}" + (f"/{step}" if form == "range_step" else "")
        values = set(range(lo, b + 1, s))
    names = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    expected = {names[v % 7] for v in values}
    assert set(weekdays(f"0 0 * * {text}", 14)) == expected, text


def fires(expr: str, zone: str, start: str, end: str) -> list[str]:
    """Return the fire times in (start, end] as local ISO strings with their offsets."""
    schedule = compile_schedule("cron", {"cron": expr, "tz": zone})
    assert schedule.is_valid, schedule.error
    t = datetime.fromisoformat(start).replace(tzinfo=ZoneInfo(zone)).timestamp()
    limit = datetime.fromisoformat(end).replace(tzinfo=ZoneInfo(zone)).timestamp()
    return [
        datetime.fromtimestamp(x, ZoneInfo(zone)).isoformat()
        for x in preview(schedule, t, 50)
        if x <= limit
    ]


@pytest.mark.parametrize(
    ("expr", "zone", "start", "end", "expected"),
    [
        # Wildcard hour: 01:07 does not exist; runs on the new time (02:07), never at 02:00.
        (
            "7 * * * *",
            "Europe/London",
            "2025-03-30T00:00",
            "2025-03-30T02:30",
            ["2025-03-30T00:07:00+00:00", "2025-03-30T02:07:00+01:00"],
        ),
        # Wildcard hour, a 30-minute gap (02:00 -> 02:30): no fire at 02:30.
        (
            "0 * * * *",
            "Australia/Lord_Howe",
            "2019-10-06T00:30",
            "2019-10-06T03:30",
            ["2019-10-06T01:00:00+10:30", "2019-10-06T03:00:00+11:00"],
        ),
        # Wildcard minute at a fixed hour: the gap's times are skipped, no catch-up.
        (
            "*/15 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00",
            "2026-03-30T02:20",
            ["2026-03-30T02:00:00+02:00", "2026-03-30T02:15:00+02:00"],
        ),
        # Fixed hour and minute: caught up once, right after the gap.
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00",
            "2026-03-30T12:00",
            ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
        ),
        (
            "0,30 2 * * *",
            "Australia/Lord_Howe",
            "2019-10-05T12:00",
            "2019-10-06T12:00",
            ["2019-10-06T02:30:00+11:00"],
        ),
        (
            "7 1 * * *",
            "Europe/London",
            "2025-03-29T12:00",
            "2025-03-30T12:00",
            ["2025-03-30T02:00:00+01:00"],
        ),
    ],
)
def test_spring_forward_catches_up_only_jobs_at_a_fixed_time(
    expr: str, zone: str, start: str, end: str, expected: list[str]
) -> None:
    assert fires(expr, zone, start, end) == expected


GAPS = [
    ("Europe/Berlin", "2026-03-29"),
    ("Europe/London", "2025-03-30"),
    ("America/New_York", "2026-03-08"),
    ("America/Santiago", "2026-09-06"),
    ("Australia/Lord_Howe", "2019-10-06"),
]


def wildcard_fires(zone_name: str, minutes: set[int], start: float, end: float) -> list[float]:
    """Every local minute in `minutes` of every hour that exists, the slow way; a time in a
    gap does not fire at all (cron(8)'s rule for a wildcard job)."""
    zone = ZoneInfo(zone_name)
    local = datetime.fromtimestamp(start, zone).replace(tzinfo=None, second=0, microsecond=0)
    stop = datetime.fromtimestamp(end, zone).replace(tzinfo=None) + timedelta(hours=4)
    out: set[float] = set()
    while local <= stop:
        if local.minute in minutes:
            instant = local.replace(tzinfo=zone).timestamp()
            exists = datetime.fromtimestamp(instant, zone).replace(tzinfo=None) == local
            if exists and start < instant <= end:
                out.add(instant)
        local += timedelta(minutes=1)
    return sorted(out)


@settings(deadline=None, max_examples=60)
@given(
    gap=st.sampled_from(GAPS),
    minutes=st.sets(st.sampled_from([0, 1, 7, 14, 15, 29, 30, 31, 45, 59]), min_size=1, max_size=3),
    offset_min=st.integers(-3 * 60, 3 * 60),
)
def test_a_wildcard_hour_never_fires_in_a_gap_nor_at_its_end(
    gap: tuple[str, str], minutes: set[int], offset_min: int
) -> None:
    zone, day = gap
    expr = f"{','.join(map(str, sorted(minutes)))} * * * *"
    schedule = compile_schedule("cron", {"cron": expr, "tz": zone})
    midnight = datetime.fromisoformat(day + "T02:00").replace(tzinfo=ZoneInfo(zone)).timestamp()
    start = midnight + offset_min * 60 - 0.5
    end = start + 6 * 3600
    got = [t for t in preview(schedule, start, 40) if t <= end]
    assert got == wildcard_fires(zone, minutes, start, end), expr


@settings(deadline=None, max_examples=40)
@given(
    gap=st.sampled_from(GAPS),
    minutes=st.sets(st.sampled_from([0, 7, 15, 30, 45, 59]), min_size=1, max_size=3),
    hours=st.none() | st.sets(st.integers(0, 23), min_size=1, max_size=3),
)
def test_spring_forward_agrees_with_croniter(
    gap: tuple[str, str], minutes: set[int], hours: set[int] | None
) -> None:
    # croniter is the oracle where it follows cron(8): a wildcard hour runs on the new time,
    # a fixed hour and minute is caught up at the gap's end. (It also catches up `*/15 2`,
    # a wildcard minute at a fixed hour, which cron(8) and cronsim do not: not drawn here.)
    zone, day = gap
    hour_text = "*" if hours is None else ",".join(map(str, sorted(hours)))
    expr = f"{','.join(map(str, sorted(minutes)))} {hour_text} * * *"
    start = datetime.fromisoformat(day + "T12:00").replace(tzinfo=ZoneInfo(zone)) - timedelta(
        days=1
    )
    end = start.timestamp() + 48 * 3600
    oracle = croniter(expr, start)
    theirs: list[float] = []
    while (t := oracle.get_next(float)) <= end:
        theirs.append(t)
    schedule = compile_schedule("cron", {"cron": expr, "tz": zone})
    ours = [t for t in preview(schedule, start.timestamp(), 200) if t <= end]
    assert ours == theirs, expr


def values_of(field: str, lo: int, hi: int) -> set[int]:
    """Return the minutes of an hour (or hours of a day) a field means, from its fires."""
    expr = f"{field} * * * *" if hi == 59 else f"0 {field} * * *"
    schedule = compile_schedule("cron", {"cron": expr})
    assert schedule.is_valid, schedule.error
    unit = 60 if hi == 59 else 3600
    day = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    first_cycle = [
        t for t in preview(schedule, day - 1, hi - lo + 1) if t < day + (hi - lo + 1) * unit
    ]
    return {int((t - day) // unit) for t in first_cycle}


def walk(start: int, end: int, step: int, lo: int, hi: int) -> set[int]:
    """Return every step-th value from start round the wrap to end (the range's meaning)."""
    span = (hi - start + 1) + (end - lo + 1)
    return {lo + (start - lo + k) % (hi - lo + 1) for k in range(0, span, step)}


def suggestion(expr: str) -> str:
    with pytest.raises(CronSyntaxError) as caught:
        parse_cron(expr)
    found = re.search(
        r"(?:two items that keep its values: |it means only )([0-9,/-]+)", str(caught.value)
    )
    assert found is not None, str(caught.value)
    return found.group(1)


@pytest.mark.parametrize(
    ("field", "lo", "hi", "rewrite"),
    [
        ("50-10/7", 0, 59, "50-59/7,4"),
        ("50-20/7", 0, 59, "50-59/7,4-20/7"),
        ("58-1/2", 0, 59, "58,0"),
        ("22-2/3", 0, 23, "22,1"),
        ("50-3/7", 0, 59, "50-59/7"),
    ],
)
def test_a_wrapping_range_with_a_step_suggests_a_rewrite_that_keeps_its_values(
    field: str, lo: int, hi: int, rewrite: str
) -> None:
    expr = f"{field} * * * *" if hi == 59 else f"0 {field} * * *"
    assert suggestion(expr) == rewrite
    start, end = (int(x) for x in field.split("/")[0].split("-"))
    step = int(field.split("/")[1])
    assert values_of(rewrite, lo, hi) == walk(start, end, step, lo, hi)


@settings(deadline=None, max_examples=200)
@given(st.integers(0, 59), st.integers(0, 59), st.integers(1, 61))
def test_every_wrapping_minute_rewrite_keeps_the_values(start: int, end: int, step: int) -> None:
    if start <= end:
        return
    rewrite = suggestion(f"{start}-{end}/{step} * * * *")
    assert values_of(rewrite, 0, 59) == walk(start, end, step, 0, 59)


def test_a_wrapping_weekday_range_with_a_step_does_not_gain_a_day() -> None:
    rewrite = suggestion("0 0 * * thu-tue/2")
    assert rewrite == "4-6/2,1"
    assert weekdays(f"0 0 * * {rewrite}") == ["Mon", "Thu", "Sat", "Mon", "Thu", "Sat", "Mon"]
    assert suggestion("0 0 * * 5-1/2") == "5,0"


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("0 0 * * 5L", "write the last weekday of a month as L5"),
        ("0 0 LW * *", '"LW" (the last weekday of the month) is not supported'),
        ("0 0 29-L * *", "L cannot end a range; write 29-31"),
        ("0 0 L-3 * *", "L is the last day of the month and cannot be part of a range"),
    ],
)
def test_l_forms_cronsim_accepts_are_refused_with_the_reason(expr: str, message: str) -> None:
    with pytest.raises(CronSyntaxError, match=re.escape(message)):
        parse_cron(expr)
