"""The pure pieces behind the CLI's warnings and columns: what a six-field cron means here,
when a `once` is in the past, and how late a run started."""

from __future__ import annotations

import pytest

from anyrtd.cli.caution import schedule_warnings, seconds_first
from anyrtd.cli.format import lateness, schedule


@pytest.mark.parametrize(
    ("expr", "said"),
    [
        (
            "*/15 * * * * *",
            "fires every second for 4 minutes of each hour (minutes 0, 15, 30, 45): 240 fires an "
            'hour; if you meant seconds first (Quartz/Spring order), write "* * * * * */15"',
        ),
        (
            "0 */5 * * * *",
            "fires every second for 1 minute of each hour (minute 0), in hours 0, 5, 10, 15, 20; "
            'if you meant seconds first (Quartz/Spring order), write "*/5 * * * * 0"',
        ),
        (
            "0 0 8 * * 1-5",
            "fires at seconds 1, 2, 3, 4, 5 for 1 minute of each hour (minute 0), in hour 0, on "
            'the days it names; if you meant seconds first (Quartz/Spring order), write "0 8 * * '
            '1-5 0"',
        ),
        (
            "* * * * * */10 2030",
            "fires at seconds 0, 10, 20, 30, 40, 50 of every minute, in the years it names; if you "
            'meant seconds first (Quartz/Spring order), write "* * * * */10 * 2030"',
        ),
    ],
)
def test_a_six_field_cron_that_fires_many_times_a_minute_is_explained(expr: str, said: str) -> None:
    text = seconds_first(expr)
    assert text is not None and said in text


@pytest.mark.parametrize("expr", ["0 8 * * *", "0 8 * * * 30", "@daily", "61 * * * *", "x"])
def test_other_crons_are_not_warned_about(expr: str) -> None:
    assert seconds_first(expr) is None


def test_an_at_before_now_is_warned_about_and_one_after_is_not() -> None:
    now = 1_800_000_000.0
    assert schedule_warnings("once", {"at": now + 60}, now) == []
    [said] = schedule_warnings("once", {"at": now - 3600}, now)
    assert "is in the past (1h ago)" in said
    assert schedule_warnings("cron", {"every_s": 5}, now) == []
    assert schedule_warnings("once", {"at": "soon"}, now) == []


def test_lateness_is_started_minus_scheduled_and_blank_by_hand() -> None:
    assert lateness(100.25, 100.0) == "250ms"
    assert lateness(112.5, 100.0) == "12.5s"
    assert lateness(100.0 + 3 * 3600 + 125, 100.0) == "3h 2m"
    assert lateness(100.0 + 125, 100.0) == "2m 5s"
    assert lateness(99.5, 100.0) == "-500ms"
    assert lateness(100.0, None) == ""


def test_a_cron_names_its_zone() -> None:
    assert schedule("cron", {"cron": "0 8 * * *"}) == "0 8 * * * (UTC)"
    assert schedule("cron", {"cron": "0 8 * * *", "tz": "Asia/Tokyo"}) == "0 8 * * * (Asia/Tokyo)"
