"""Property tests: the compiled cron matcher against a brute-force matcher and against croniter."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from anyrtd.schedule import CronSchedule, compile_schedule

MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
PROPS = settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Field:
    text: str
    values: frozenset[int]
    plain_star: bool  # written as a bare "*": the only way to leave a day field unrestricted


@st.composite
def field(draw: st.DrawFn, lo: int, hi: int, names: list[str] | None = None) -> Field:
    """Draw a cron field and the set of values it means, worked out independently here."""

    def show(v: int) -> str:
        if names and draw(st.booleans()):
            name = names[v - lo]
            return draw(st.sampled_from([name, name.upper(), name.title()]))
        if names is DAYS and v == 0 and draw(st.booleans()):
            return "7"
        return str(v)

    if draw(st.integers(0, 9)) == 0:
        return Field("*", frozenset(range(lo, hi + 1)), True)
    items: list[str] = []
    values: set[int] = set()
    for _ in range(draw(st.integers(1, 3))):
        form = draw(
            st.sampled_from(["value", "range", "range_step", "star_step", "value_step", "wrap"])
        )
        a = draw(st.integers(lo, hi))
        b = draw(st.integers(lo, hi))
        step = draw(st.integers(1, hi - lo + 2))
        if form == "value":
            items.append(show(a))
            values.add(a)
        elif form == "star_step":
            items.append(f"*/{step}")
            values.update(range(lo, hi + 1, step))
        elif form == "value_step":
            items.append(f"{a}/{step}")
            values.update(range(a, hi + 1, step))
        elif a == b:
            items.append(show(a))
            values.add(a)
        elif form == "wrap":
            a, b = max(a, b), min(a, b)
            items.append(f"{show(a)}-{show(b)}")
            values.update(range(a, hi + 1))
            values.update(range(lo, b + 1))
        else:
            a, b = min(a, b), max(a, b)
            if form == "range":
                items.append(f"{show(a)}-{show(b)}")
                values.update(range(a, b + 1))
            else:
                items.append(f"{show(a)}-{show(b)}/{step}")
                values.update(range(a, b + 1, step))
    return Field(",".join(items), frozenset(values), False)


@dataclass(frozen=True)
class Expr:
    text: str
    minute: Field
    hour: Field
    dom: Field
    month: Field
    dow: Field
    second: Field | None


@st.composite
def expressions(draw: st.DrawFn, seconds: bool = False) -> Expr:
    fs = [
        draw(field(0, 59)),
        draw(field(0, 23)),
        draw(field(1, 31)),
        draw(field(1, 12, MONTHS)),
        draw(field(0, 6, DAYS)),
    ]
    sec = draw(field(0, 59)) if seconds else None
    text = " ".join(f.text for f in [*fs, *([sec] if sec else [])])
    return Expr(text, *fs, sec)


def brute_next(e: Expr, start: float) -> float | None:
    """Find the first match strictly after `start` by walking days, then every time of day."""
    seconds = sorted(e.second.values) if e.second else [0]
    unit = 1 if e.second else 60
    first = (math.floor(start) // unit) * unit + unit
    day0 = datetime.fromtimestamp(first, UTC).date()
    # Only a bare "*" leaves day-of-month or day-of-week unrestricted (croniter's rule).
    dom_any = e.dom.plain_star
    dow_any = e.dow.plain_star
    for i in range(366 * 12):
        d: date = day0 + timedelta(days=i)
        if d.month not in e.month.values:
            continue
        dom_ok = d.day in e.dom.values
        dow_ok = d.isoweekday() % 7 in e.dow.values
        if dom_any and dow_any:
            ok = True
        elif dom_any:
            ok = dow_ok
        elif dow_any:
            ok = dom_ok
        else:
            ok = dom_ok or dow_ok
        if not ok:
            continue
        midnight = datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()
        for h in sorted(e.hour.values):
            for m in sorted(e.minute.values):
                for s in seconds:
                    t = midnight + h * 3600 + m * 60 + s
                    if t >= first:
                        return t
    return None


starts = st.integers(0, 4_000_000_000_000).map(lambda ms: ms / 1000)  # 1970 .. 2096


@PROPS
@given(e=expressions(), start=starts)
def test_next_fire_equals_the_brute_force_match(e: Expr, start: float) -> None:
    schedule = compile_schedule("cron", {"cron": e.text})
    expected = brute_next(e, start)
    if not schedule.is_valid:
        # Only an expression that can never match may be refused.
        assert expected is None, schedule.error
        assert "never fires" in str(schedule.error)
        return
    got = schedule.next_after(start, 0.0)
    assert got == expected
    if got is not None:
        assert got > start


@settings(deadline=None, max_examples=150)
@given(e=expressions(seconds=True), start=starts)
def test_six_field_next_fire_equals_the_brute_force_match(e: Expr, start: float) -> None:
    schedule = compile_schedule("cron", {"cron": e.text})
    expected = brute_next(e, start)
    got = schedule.next_after(start, 0.0) if schedule.is_valid else None
    assert got == expected


@PROPS
@given(e=expressions(), start=starts)
def test_next_fire_agrees_with_croniter(e: Expr, start: float) -> None:
    # A day field that lists every value without being a bare "*" is read inconsistently by
    # croniter 7 ("*/1,0,0" counts as "*", "*/1,0" does not); anyrtd always reads it as a
    # restriction. Those cases are covered by the brute-force property instead.
    assume(e.dom.plain_star or e.dom.values != frozenset(range(1, 32)))
    assume(e.dow.plain_star or e.dow.values != frozenset(range(7)))
    schedule = compile_schedule("cron", {"cron": e.text})
    try:
        theirs: float | None = croniter(e.text, start).get_next(float)
    except Exception:  # croniter raises when it finds no date within 50 years
        theirs = None
    assert (schedule.next_after(start, 0.0) if schedule.is_valid else None) == theirs


@PROPS
@given(e=expressions(), start=starts, n=st.integers(2, 6))
def test_consecutive_fires_are_strictly_increasing_and_all_match(
    e: Expr, start: float, n: int
) -> None:
    schedule = compile_schedule("cron", {"cron": e.text})
    assume(isinstance(schedule, CronSchedule))
    t = start
    for _ in range(n):
        nxt = schedule.next_after(t, 0.0)
        if nxt is None:
            break
        assert nxt == brute_next(e, t)
        t = nxt


CRON_CHARS = "0123456789*/,-?#LWHR@ abcdefghijklmnopqrstuvwxyz\t"
ZONES = [None, "Europe/Berlin", "America/New_York", "America/Santiago", "Australia/Lord_Howe"]


@settings(deadline=None, max_examples=400)
@given(
    text=st.one_of(st.text(alphabet=CRON_CHARS, max_size=40), st.text(max_size=30)),
    tz=st.sampled_from(ZONES),
    start=starts,
)
def test_no_expression_loops_or_is_slow(text: str, tz: str | None, start: float) -> None:
    spec: dict[str, object] = {"cron": text}
    if tz:
        spec["tz"] = tz
    compile_schedule("cron", spec)  # load the zone outside the timed part
    began = time.thread_time()  # CPU time: a loaded machine's preemptions are not the code's
    schedule = compile_schedule("cron", spec)
    t: float | None = start
    for _ in range(3):
        assert t is not None
        t = schedule.next_after(t, 0.0)
        if t is None:
            break
    # A sanity bound for a loaded CI machine; the real figures are in bench/bench_schedule.py.
    assert time.thread_time() - began < 0.05


@settings(deadline=None, max_examples=300)
@given(e=expressions(), tz=st.sampled_from(ZONES), start=starts)
def test_valid_expressions_arm_quickly(e: Expr, tz: str | None, start: float) -> None:
    spec: dict[str, object] = {"cron": e.text}
    if tz:
        spec["tz"] = tz
    schedule = compile_schedule("cron", spec)
    began = time.thread_time()  # CPU time: a loaded machine's preemptions are not the code's
    schedule.next_after(start, 0.0)
    assert time.thread_time() - began < 0.05
