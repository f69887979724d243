"""Schedule arithmetic: cron syntax and errors, every_s and once edges, preview."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from anyrtd.schedule import (
    MAX_CRON_LENGTH,
    MAX_EVERY_S,
    MAX_LIST_ITEMS,
    MAX_TZ_LENGTH,
    MIN_EVERY_S,
    CronSchedule,
    CronSyntaxError,
    EventSchedule,
    EverySchedule,
    InvalidSchedule,
    OnceSchedule,
    Schedule,
    compile_schedule,
    once_due,
    parse_cron,
    preview,
)
from anyrtd.schedule.specs import _compile_cron


def utc(text: str) -> float:
    """Return unix seconds for an ISO time in UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def cron(expr: str, tz: str | None = None) -> Schedule:
    spec: dict[str, object] = {"cron": expr}
    if tz is not None:
        spec["tz"] = tz
    return compile_schedule("cron", spec)


START = utc("2026-03-01T00:00:00")  # a Sunday


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("0 8 * * *", ["2026-03-01 08:00:00", "2026-03-02 08:00:00"]),
        ("*/20 * * * *", ["2026-03-01 00:20:00", "2026-03-01 00:40:00"]),
        ("0 9 * * mon-fri", ["2026-03-02 09:00:00", "2026-03-03 09:00:00"]),
        ("0 0 1 */3 *", ["2026-04-01 00:00:00", "2026-07-01 00:00:00"]),
        ("0 22-2 * * *", ["2026-03-01 01:00:00", "2026-03-01 02:00:00"]),
        ("30 4 1,15 * 5", ["2026-03-01 04:30:00", "2026-03-06 04:30:00"]),  # 1st, 15th or Friday
        ("0 0 L * *", ["2026-03-31 00:00:00", "2026-04-30 00:00:00"]),
        ("0 0 * * 5#3", ["2026-03-20 00:00:00", "2026-04-17 00:00:00"]),
        ("0 0 * * L1", ["2026-03-30 00:00:00", "2026-04-27 00:00:00"]),
        ("0 0 14W * *", ["2026-03-13 00:00:00", "2026-04-14 00:00:00"]),  # 14 Mar is a Saturday
        ("0 0 29 2 *", ["2028-02-29 00:00:00", "2032-02-29 00:00:00"]),
        ("0 12 * * 7", ["2026-03-01 12:00:00", "2026-03-08 12:00:00"]),  # 7 is Sunday
        ("@hourly", ["2026-03-01 01:00:00", "2026-03-01 02:00:00"]),
        ("@weekly", ["2026-03-08 00:00:00", "2026-03-15 00:00:00"]),
        ("0 0 ? * sat", ["2026-03-07 00:00:00", "2026-03-14 00:00:00"]),
        ("0 8 * * * 30", ["2026-03-01 08:00:30", "2026-03-02 08:00:30"]),  # 6th field: second
        ("0 0 1 1 * 15 */10", ["2030-01-01 00:00:15", "2040-01-01 00:00:15"]),  # 7th: year
        ("0 0 1 1 * 0 2030,2040", ["2030-01-01 00:00:00", "2040-01-01 00:00:00"]),
        ("  0   8 * *\t* ", ["2026-03-01 08:00:00", "2026-03-02 08:00:00"]),
        ("0 8 * JAN,Mar SUN", ["2026-03-01 08:00:00", "2026-03-08 08:00:00"]),
    ],
)
def test_cron_expressions_fire_at_their_next_occurrences(expr: str, expected: list[str]) -> None:
    schedule = cron(expr)
    assert schedule.is_valid, schedule.error
    assert [iso(t) for t in preview(schedule, START, 2)] == expected


def test_six_fields_mean_seconds_last_not_first() -> None:
    # "30 * * * * *" in croniter's order is minute 30, every second — not Quartz's second 30.
    times = preview(cron("30 * * * * *"), START, 3)
    assert [iso(t) for t in times] == [
        "2026-03-01 00:30:00",
        "2026-03-01 00:30:01",
        "2026-03-01 00:30:02",
    ]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", 'cron "61 * * * *": minute 61 is out of range 0-59'),
        ("0 24 * * *", 'cron "0 24 * * *": hour 24 is out of range 0-23'),
        ("0 0 0 * *", 'cron "0 0 0 * *": day-of-month 0 is out of range 1-31'),
        ("0 0 * 13 *", 'cron "0 0 * 13 *": month 13 is out of range 1-12'),
        ("0 0 * * 8", 'cron "0 0 * * 8": day-of-week 8 is out of range 0-7 (0 and 7 are Sunday)'),
        ("0 0 * * * 60", 'cron "0 0 * * * 60": second 60 is out of range 0-59'),
        ("0 0 1 1 * 0 2100", 'cron "0 0 1 1 * 0 2100": year 2100 is out of range 1970-2099'),
        ("0 0 30 2 *", 'cron "0 0 30 2 *": never fires: February has no day 30'),
        ("0 0 31 4,6 *", 'cron "0 0 31 4,6 *": never fires: April, June have no day 31'),
        ("0 0 30 2 * 0 2030", "never fires"),
        ("1 2 3", "expected 5 fields"),
        ("", "got 0"),
        ("* * * * * * * *", "got 8"),
        ("*/0 * * * *", "step 0"),
        ("1-60 * * * *", "minute 60 is out of range 0-59"),
        ("-5 * * * *", "needs a start and an end"),
        ("1,,2 * * * *", "empty list item"),
        ("a * * * *", 'minute "a" is not a number'),
        ("0 0 * foo *", 'month "foo" is not a number or a month name (jan-dec)'),
        ("0 0 * * fry", 'day-of-week "fry" is not a number or a day name (sun-sat)'),
        ("H * * * *", "hashed (H) and random (R) values are not supported"),
        ("R * * * *", "hashed (H) and random (R) values are not supported"),
        ("? * * * *", '"?" is only allowed in day-of-month and day-of-week'),
        ("0 0 * * 5#6", "must be 1-5"),
        ("0 0 * * mon#2,fri", "mixes plain days and nth days"),
        ("0 0 1W,15 * *", "W takes a single day"),
        ("0 0 * * L", "L5 is the last Friday"),
        ("0 0 * * 5L", "write the last weekday of a month as L5"),
        ("50-10/5 * * * *", "wraps around and has a step"),
        ("@reboot", 'unknown shortcut "@reboot"'),
        ("0\u00a00 * * *", "expected 5 fields"),  # a no-break space does not separate fields
    ],
)
def test_bad_cron_expressions_say_what_is_wrong(expr: str, message: str) -> None:
    schedule = cron(expr)
    assert isinstance(schedule, InvalidSchedule)
    assert not schedule.is_valid
    assert message in schedule.error
    assert schedule.next_after(START, START) is None
    assert preview(schedule, START, 5) == []


def test_a_year_limited_cron_stops_after_its_last_year() -> None:
    schedule = cron("0 0 1 1 * 0 2027")
    assert schedule.is_valid
    assert schedule.next_after(START, START) == utc("2027-01-01T00:00:00")
    assert schedule.next_after(utc("2027-01-01T00:00:00"), START) is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, 'cron spec needs "cron"'),
        ({"cron": 5}, "cron expression must be a string"),
        ({"cron": "* * * * *", "every_s": 5}, 'both "cron" and "every_s"'),
        ({"cron": "0 8 * * *", "tz": "Mars/Olympus"}, 'tz "Mars/Olympus" is not a known IANA zone'),
        ({"cron": "0 8 * * *", "tz": "../../etc/passwd"}, "is not a known IANA zone"),
        ({"cron": "0 8 * * *", "tz": "Europe"}, "is not a known IANA zone"),
        ({"cron": "0 8 * * *", "tz": ""}, "tz must be an IANA zone name"),
        ({"cron": "0 8 * * *", "tz": 1}, "tz must be an IANA zone name"),
        ({"every_s": 0}, "every_s 0 is less than the minimum of 1 second"),
        ({"every_s": -5}, "every_s -5 is less than the minimum of 1 second"),
        ({"every_s": 0.001}, "every_s 0.001 is less than the minimum of 1 second"),
        ({"every_s": 1e-9}, "every_s 1e-09 is less than the minimum of 1 second"),
        ({"every_s": 0.999}, "(cron's finest grain)"),
        ({"every_s": "60"}, "every_s must be a number"),
        ({"every_s": True}, "every_s must be a number"),
        ({"every_s": float("inf")}, "every_s must be a number"),
        ({"every_s": float("nan")}, "every_s must be a number"),
        ({"every_s": 10**400}, "every_s must be a number"),
        ({"every_s": MAX_EVERY_S * 2}, "more than 100 years"),
    ],
)
def test_bad_cron_specs_are_invalid(spec: dict[str, object], message: str) -> None:
    schedule = compile_schedule("cron", spec)
    assert isinstance(schedule, InvalidSchedule)
    assert message in schedule.error


def test_a_cron_longer_than_the_limit_is_refused_before_it_is_parsed() -> None:
    # A valid but huge list: a million items once took 2.7 s of the event loop to parse.
    huge = ",".join(["1"] * 1_000_000) + " * * * *"
    cached = _compile_cron.cache_info().currsize
    schedule = compile_schedule("cron", {"cron": huge})
    assert isinstance(schedule, InvalidSchedule)
    assert f"is {len(huge):,} characters long, more than the limit of 1024" in schedule.error
    assert len(schedule.error) < 300, "the message quotes the start of the expression only"
    assert _compile_cron.cache_info().currsize == cached, "it never reached the parser"
    with pytest.raises(CronSyntaxError, match="characters long"):
        parse_cron(huge)
    at_limit = "0 8 * * *" + " " * (MAX_CRON_LENGTH - 9)
    assert cron(at_limit).is_valid


@pytest.mark.parametrize("field", range(7))
def test_every_field_lists_at_most_the_limit_of_items(field: int) -> None:
    values = ("5", "5", "5", "5", "5", "5", "2030")
    names = ("minute", "hour", "day-of-month", "month", "day-of-week", "second", "year")

    def expr(items: int) -> str:
        fields = list(values)
        fields[field] = ",".join([values[field]] * items)
        return " ".join(fields)

    assert cron(expr(MAX_LIST_ITEMS)).is_valid
    refused = cron(expr(MAX_LIST_ITEMS + 1))
    assert isinstance(refused, InvalidSchedule)
    assert f"{names[field]} lists 65 items, more than the limit of 64" in refused.error


def test_a_zone_name_longer_than_the_limit_is_refused_before_the_lookup() -> None:
    schedule = cron("0 8 * * *", "Europe/" + "x" * MAX_TZ_LENGTH)
    assert isinstance(schedule, InvalidSchedule)
    assert f"has at most {MAX_TZ_LENGTH}" in schedule.error


def test_utc_spellings_of_tz_are_plain_utc() -> None:
    for tz in ("UTC", "Etc/UTC"):
        schedule = cron("0 8 * * *", tz)
        assert schedule.next_after(START, START) == utc("2026-03-01T08:00:00")


def test_the_same_expression_is_compiled_once_and_shared() -> None:
    a, b = cron("7 7 * * *", "Europe/Berlin"), cron("7 7 * * *", "Europe/Berlin")
    assert isinstance(a, CronSchedule)
    assert a is b
    assert a is not cron("7 7 * * *")


def test_cron_ignores_the_anchor_and_is_strictly_forward() -> None:
    schedule = cron("0 8 * * *")
    at_eight = utc("2026-03-01T08:00:00")
    assert schedule.next_after(at_eight, 0.0) == utc("2026-03-02T08:00:00")
    assert schedule.next_after(at_eight - 0.001, 12345.0) == at_eight
    assert schedule.next_after(at_eight + 0.5, at_eight) == utc("2026-03-02T08:00:00")


def test_a_missed_cron_occurrence_does_not_exist() -> None:
    # After a week of downtime the next fire is the next occurrence after now: no burst.
    schedule = cron("*/5 * * * *")
    now = utc("2026-03-08T10:02:17")
    assert preview(schedule, now, 3) == [
        utc("2026-03-08T10:05:00"),
        utc("2026-03-08T10:10:00"),
        utc("2026-03-08T10:15:00"),
    ]


def test_cron_outside_the_calendar_never_fires() -> None:
    schedule = cron("0 8 * * *")
    assert schedule.next_after(float("nan"), 0.0) is None
    assert schedule.next_after(float("inf"), 0.0) is None
    assert schedule.next_after(1e18, 0.0) is None
    assert cron("0 8 * * *", "Europe/Berlin").next_after(253402300000.0, 0.0) is None


# --------------------------------------------------------------------------- every_s


def test_every_s_fires_on_the_grid_from_the_arming_time() -> None:
    schedule = compile_schedule("cron", {"every_s": 60})
    assert isinstance(schedule, EverySchedule)
    armed = 1000.0
    assert schedule.next_after(armed, armed) == 1060.0
    assert schedule.next_after(1060.0, armed) == 1120.0
    assert schedule.next_after(1059.999, armed) == 1060.0
    # After a long gap the next fire is the next grid point after now, not a burst.
    assert schedule.next_after(5000.5, armed) == 5020.0
    # A time before the arming time still gives the first grid point.
    assert schedule.next_after(10.0, armed) == 1060.0
    assert preview(schedule, armed, 3, anchor=armed) == [1060.0, 1120.0, 1180.0]


def test_every_s_accepts_fractions_and_huge_intervals() -> None:
    assert compile_schedule("cron", {"every_s": MIN_EVERY_S}) == EverySchedule(1.0)
    one_and_a_half = compile_schedule("cron", {"every_s": 1.5})
    times = preview(one_and_a_half, 0.0, 30, anchor=0.0)
    assert all(b > a for a, b in zip([0.0, *times], times, strict=False))
    assert times[-1] == pytest.approx(45.0)
    huge = compile_schedule("cron", {"every_s": MAX_EVERY_S})
    assert huge.next_after(1.8e9, 1.8e9) == 1.8e9 + MAX_EVERY_S


def test_every_s_is_strictly_after_despite_float_rounding() -> None:
    schedule = compile_schedule("cron", {"every_s": 1.1})
    anchor = 1_800_000_000.3
    t = anchor
    for _ in range(1000):
        nxt = schedule.next_after(t, anchor)
        assert nxt is not None and nxt > t
        t = nxt


# --------------------------------------------------------------------------- once


def test_once_is_due_at_at_even_in_the_past_until_consumed() -> None:
    assert once_due(1787000000.0, None) == 1787000000.0
    assert once_due(5.0, None) == 5.0  # far in the past: fires late, on the next tick
    assert once_due(1787000000.0, 1787000001.0) is None  # lastRunAt set: consumed
    assert once_due(None, None) is None


@pytest.mark.parametrize(
    ("spec", "ok"),
    [
        ({"at": 1787000000}, True),
        ({"at": 1787000000.25}, True),
        ({"at": 0}, True),
        ({"at": 2.5e11}, True),  # the year 9892; past 9999 is refused (test_cli_flag_numbers)
        ({"at": "1787000000"}, False),
        ({"at": None}, False),
        ({"at": True}, False),
        ({}, False),
    ],
)
def test_once_needs_a_numeric_at(spec: dict[str, object], ok: bool) -> None:
    schedule = compile_schedule("once", spec)
    assert schedule.is_valid is ok
    if not ok:
        assert 'once spec needs a numeric "at"' in str(schedule.error)


def test_once_next_after_is_strictly_after() -> None:
    schedule = OnceSchedule(100.0)
    assert schedule.next_after(99.9, 0.0) == 100.0
    assert schedule.next_after(100.0, 0.0) is None  # `at` exactly now is not *after* now
    assert once_due(100.0, None) == 100.0  # ... but it is due: now >= at


# --------------------------------------------------------------------------- event


def test_event_specs_need_dataset_and_object_id() -> None:
    ok = compile_schedule("event", {"dataset": "chat_messages", "objectId": "c1", "spaceId": "s"})
    assert isinstance(ok, EventSchedule)
    assert ok.next_after(START, START) is None  # events never fire on the clock
    missing = compile_schedule("event", {"dataset": "chat_messages"})
    assert missing.error is not None and "objectId" in missing.error
    both = compile_schedule("event", {})
    assert both.error is not None and "dataset and objectId" in both.error
    assert compile_schedule("event", {"dataset": 1, "objectId": "c"}).is_valid is False
    assert compile_schedule("event", {"dataset": "d", "objectId": "c", "spaceId": 3}).error


def test_compile_schedule_never_raises_on_odd_input() -> None:
    assert compile_schedule("cron", "0 8 * * *").error == "spec must be an object, not str"  # type: ignore[arg-type]
    assert compile_schedule("weird", {}).error is not None


def test_preview_of_a_schedule_stops_when_it_ends() -> None:
    assert preview(OnceSchedule(100.0), 0.0, 5) == [100.0]
    assert preview(cron("0 0 1 1 * 0 2030-2031"), START, 5) == [
        utc("2030-01-01T00:00:00"),
        utc("2031-01-01T00:00:00"),
    ]
    assert preview(cron("0 8 * * *"), START, 0) == []


def test_parse_cron_reports_the_field_sets() -> None:
    c = parse_cron("0,30 9-17 * * mon-fri")
    assert c.minutes == (1 << 0) | (1 << 30)
    assert c.hours == sum(1 << h for h in range(9, 18))
    assert c.dow == sum(1 << d for d in range(1, 6))
    assert c.dom_any and not c.dow_any and not c.has_seconds
