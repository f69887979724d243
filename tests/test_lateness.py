"""How late a run started, as the records carry it and as the command line shows it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from anyrtd.cli.format import lateness
from anyrtd.rows import RunRow
from anyrtd.runs import run_record


def started(scheduled_at: float, started_at: float) -> RunRow:
    return RunRow(
        run_id="r1",
        trigger_id="t",
        program="agent:remind@v1",
        device="12D3KooWdevice",
        scheduled_at=scheduled_at,
        started_at=started_at,
    )


def test_a_start_a_fraction_of_a_millisecond_late_is_not_recorded_as_early() -> None:
    # An `every_s` occurrence counted from its arming falls anywhere in a millisecond; the
    # program started 0.3 ms after it, in the same millisecond.
    rec = run_record(started(1_800_000_000.1231, 1_800_000_000.1234))
    assert rec["startedAt"] >= rec["scheduledAt"]
    assert lateness(rec["startedAt"], rec["scheduledAt"]) == "0ms"


@given(
    due=st.floats(min_value=1.7e9, max_value=1.9e9, allow_nan=False),
    lag=st.floats(min_value=0.0, max_value=2.0),
)
def test_a_recorded_start_never_precedes_its_recorded_due_time(due: float, lag: float) -> None:
    rec = run_record(started(due, due + lag))
    assert rec["startedAt"] >= rec["scheduledAt"]
    assert not lateness(rec["startedAt"], rec["scheduledAt"]).startswith("-")


def test_a_manual_run_records_no_due_time_and_shows_no_lateness() -> None:
    manual = started(0.0, 1_800_000_000.5)
    manual.scheduled_at = None
    rec = run_record(manual)
    assert rec["scheduledAt"] is None
    assert lateness(rec["startedAt"], rec["scheduledAt"]) == ""


def test_lateness_signs_after_it_rounds() -> None:
    assert lateness(99.9997, 100.0) == "0ms"
    assert lateness(99.9989, 100.0) == "-1ms"
    assert lateness(99.5, 100.0) == "-500ms"
    assert lateness(100.0, 100.0) == "0ms"
    assert lateness(100.0003, 100.0) == "0ms"
    assert lateness(100.0 - 125, 100.0) == "-2m 5s"
