"""Local-time crons across DST changes: cron(8) rules, each local occurrence fires exactly once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anyrtd.schedule import compile_schedule, preview


def at(zone: str, text: str, fold: int = 0) -> float:
    """Return unix seconds of a local wall time in `zone` (fold=1: the second of a repeat)."""
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone), fold=fold).timestamp()


def fires(expr: str, zone: str, start: str, end: str) -> list[str]:
    """Return the fire times in (start, end] as local ISO strings with their offsets."""
    schedule = compile_schedule("cron", {"cron": expr, "tz": zone})
    assert schedule.is_valid, schedule.error
    out: list[str] = []
    t = at(zone, start)
    limit = at(zone, end)
    while True:
        nxt = schedule.next_after(t, 0.0)
        assert nxt is not None and nxt > t
        if nxt > limit:
            return out
        out.append(datetime.fromtimestamp(nxt, ZoneInfo(zone)).isoformat())
        t = nxt


# Transition days in 2026: Berlin 29 Mar 02:00->03:00 and 25 Oct 03:00->02:00; New York
# 8 Mar 02:00->03:00 and 1 Nov 02:00->01:00; Santiago 4/5 Apr 24:00->23:00 and 6 Sep
# 00:00->01:00; Lord Howe 5 Apr 02:00->01:30 and 4 Oct 02:00->02:30.


def test_berlin_spring_forward_fires_a_skipped_time_once_right_after_the_gap() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00", "2026-03-30T12:00") == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]


def test_berlin_fall_back_fires_a_repeated_time_once_the_first_time() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00", "2026-10-26T12:00") == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]


def test_berlin_fall_back_every_half_hour_skips_the_second_pass() -> None:
    assert fires("*/30 * * * *", "Europe/Berlin", "2026-10-25T01:40", "2026-10-25T03:40") == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T03:00:00+01:00",
        "2026-10-25T03:30:00+01:00",
    ]


def test_berlin_spring_forward_every_quarter_hour_runs_on_the_new_time() -> None:
    assert fires("*/15 * * * *", "Europe/Berlin", "2026-03-29T01:40", "2026-03-29T03:20") == [
        "2026-03-29T01:45:00+01:00",
        "2026-03-29T03:00:00+02:00",  # a wildcard job: 02:00 to 02:45 do not exist, no catch-up
        "2026-03-29T03:15:00+02:00",
    ]


def test_new_york_spring_forward_and_fall_back() -> None:
    assert fires("30 2 * * *", "America/New_York", "2026-03-07T12:00", "2026-03-09T12:00") == [
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
    ]
    assert fires("30 1 * * *", "America/New_York", "2026-10-31T12:00", "2026-11-02T12:00") == [
        "2026-11-01T01:30:00-04:00",
        "2026-11-02T01:30:00-05:00",
    ]


def test_new_york_hourly_over_fall_back_fires_each_local_hour_once() -> None:
    assert fires("0 * * * *", "America/New_York", "2026-11-01T00:30", "2026-11-01T03:30") == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T02:00:00-05:00",
        "2026-11-01T03:00:00-05:00",
    ]


def test_santiago_midnight_that_does_not_exist_fires_at_one() -> None:
    assert fires("0 0 * * *", "America/Santiago", "2026-09-05T12:00", "2026-09-07T12:00") == [
        "2026-09-06T01:00:00-03:00",
        "2026-09-07T00:00:00-03:00",
    ]


def test_santiago_repeated_hour_before_midnight_fires_once() -> None:
    assert fires("30 23 * * *", "America/Santiago", "2026-04-04T12:00", "2026-04-05T23:59") == [
        "2026-04-04T23:30:00-03:00",
        "2026-04-05T23:30:00-04:00",
    ]
    assert fires("0 0 * * *", "America/Santiago", "2026-04-03T12:00", "2026-04-05T12:00") == [
        "2026-04-04T00:00:00-03:00",
        "2026-04-05T00:00:00-04:00",
    ]


def test_lord_howe_half_hour_shifts() -> None:
    # Fall back 02:00 -> 01:30: 01:30 and 01:45 occur twice and fire once each.
    assert fires(
        "*/15 1-2 * * *", "Australia/Lord_Howe", "2026-04-05T00:50", "2026-04-05T02:20"
    ) == [
        "2026-04-05T01:00:00+11:00",
        "2026-04-05T01:15:00+11:00",
        "2026-04-05T01:30:00+11:00",
        "2026-04-05T01:45:00+11:00",
        "2026-04-05T02:00:00+10:30",
        "2026-04-05T02:15:00+10:30",
    ]
    # Spring forward 02:00 -> 02:30: 02:00 and 02:15 do not exist; a wildcard minute does
    # not catch them up, a fixed time (15 2) fires once at 02:30.
    assert fires("*/15 2 * * *", "Australia/Lord_Howe", "2026-10-04T01:00", "2026-10-04T03:00") == [
        "2026-10-04T02:30:00+11:00",
        "2026-10-04T02:45:00+11:00",
    ]
    assert fires("15 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00", "2026-10-05T12:00") == [
        "2026-10-04T02:30:00+11:00",
        "2026-10-05T02:15:00+11:00",
    ]


def test_arming_during_the_second_pass_of_a_repeat_does_not_refire() -> None:
    schedule = compile_schedule("cron", {"cron": "*/10 * * * *", "tz": "Europe/Berlin"})
    second_pass = at("Europe/Berlin", "2026-10-25T02:05", fold=1)
    assert schedule.next_after(second_pass, 0.0) == at("Europe/Berlin", "2026-10-25T03:00")
    every_second = compile_schedule("cron", {"cron": "* * * * * *", "tz": "Europe/Berlin"})
    assert every_second.next_after(second_pass, 0.0) == at("Europe/Berlin", "2026-10-25T03:00")


def test_arming_at_the_instant_after_a_gap_does_not_refire_it() -> None:
    schedule = compile_schedule("cron", {"cron": "30 2 * * *", "tz": "Europe/Berlin"})
    gap_end = at("Europe/Berlin", "2026-03-29T03:00")
    assert schedule.next_after(gap_end - 0.5, 0.0) == gap_end
    assert schedule.next_after(gap_end, 0.0) == at("Europe/Berlin", "2026-03-30T02:30")


# --------------------------------------------------------------------------- the property

TRANSITIONS = [
    ("Europe/Berlin", "2026-03-29"),
    ("Europe/Berlin", "2026-10-25"),
    ("America/New_York", "2026-03-08"),
    ("America/New_York", "2026-11-01"),
    ("America/Santiago", "2026-04-04"),
    ("America/Santiago", "2026-09-06"),
    ("Australia/Lord_Howe", "2026-04-05"),
    ("Australia/Lord_Howe", "2026-10-04"),
]


def expected_fires(
    zone_name: str, hours: set[int], minutes: set[int], start: float, end: float
) -> list[float]:
    """Map every matching local minute to its instant the slow way and deduplicate."""
    zone = ZoneInfo(zone_name)
    local = datetime.fromtimestamp(start, zone).replace(tzinfo=None, second=0, microsecond=0)
    local -= timedelta(hours=4)
    stop = datetime.fromtimestamp(end, zone).replace(tzinfo=None) + timedelta(hours=4)
    out: set[float] = set()
    while local <= stop:
        if local.hour in hours and local.minute in minutes:
            first = local.replace(tzinfo=zone)
            round_trip = datetime.fromtimestamp(first.timestamp(), zone).replace(tzinfo=None)
            if round_trip == local:
                instant = first.timestamp()  # exists; fold=0 is the first of a repeat
            else:
                later = local  # in a gap: the first local minute that exists after it
                while True:
                    later += timedelta(minutes=1)
                    z = later.replace(tzinfo=zone)
                    if datetime.fromtimestamp(z.timestamp(), zone).replace(tzinfo=None) == later:
                        instant = z.timestamp()
                        break
            if start < instant <= end:
                out.add(instant)
        local += timedelta(minutes=1)
    return sorted(out)


@settings(deadline=None, max_examples=60)
@given(
    transition=st.sampled_from(TRANSITIONS),
    hours=st.sets(st.integers(0, 23), min_size=1, max_size=4),
    minutes=st.sets(st.sampled_from([0, 1, 14, 15, 29, 30, 31, 45, 59]), min_size=1, max_size=3),
    offset_min=st.integers(-30 * 60, 30 * 60),
)
def test_each_local_occurrence_fires_exactly_once(
    transition: tuple[str, str], hours: set[int], minutes: set[int], offset_min: int
) -> None:
    zone, day = transition
    expr = f"{','.join(map(str, sorted(minutes)))} {','.join(map(str, sorted(hours)))} * * *"
    schedule = compile_schedule("cron", {"cron": expr, "tz": zone})
    noon = datetime.fromisoformat(day + "T12:00").replace(tzinfo=ZoneInfo(zone)).timestamp()
    start = noon + offset_min * 60 - 0.5
    end = start + 36 * 3600
    got = [t for t in preview(schedule, start, 200) if t <= end]
    assert got == expected_fires(zone, hours, minutes, start, end), expr


def test_utc_is_the_default_zone() -> None:
    schedule = compile_schedule("cron", {"cron": "0 8 * * *"})
    start = datetime(2026, 3, 29, tzinfo=UTC).timestamp()
    assert schedule.next_after(start, 0.0) == datetime(2026, 3, 29, 8, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("zone", ["Asia/Kolkata", "Asia/Kathmandu", "Pacific/Chatham"])
def test_fixed_and_odd_offsets_work(zone: str) -> None:
    schedule = compile_schedule("cron", {"cron": "0 8 * * *", "tz": zone})
    start = at(zone, "2026-06-01T00:00")
    assert schedule.next_after(start, 0.0) == at(zone, "2026-06-01T08:00")
