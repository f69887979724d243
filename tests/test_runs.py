"""What a finished run writes: the `agent_runs` record and the rollup, as tables."""

from __future__ import annotations

from typing import Any

import pytest
from support import AGENT_RUNS_FIELDS

from anyrtd.rows import RunRow
from anyrtd.runs import REPLACED, normalize_result, rollup, run_record, valid_text


def row(status: str, **result: Any) -> RunRow:
    return RunRow(
        run_id="r1",
        trigger_id="t",
        program="agent:remind@v1",
        device="12D3KooWdevice",
        scheduled_at=1_800_000_000.0,
        started_at=1_800_000_000.25,
        status=status,
        ended_at=1_800_000_001.5,
        duration_ms=1250,
        result=result,
    )


def test_the_run_record_carries_every_field_of_the_seeds_and_scheduled_at() -> None:
    rec = run_record(row("ok", title="digest", fuel=3, costUsd=0.02, turns=2))
    assert AGENT_RUNS_FIELDS | {"scheduledAt", "fuel"} == set(rec)
    assert rec["startedAt"] == 1_800_000_000.25 and rec["scheduledAt"] == 1_800_000_000.0
    assert rec["title"] == "digest" and rec["fuel"] == 3 and rec["turns"] == 2
    assert rec["tokens"] == {"in": 0, "out": 0, "cacheRead": 0, "cacheWrite": 0}
    assert rec["model"] is None


@pytest.mark.parametrize(
    ("status", "before", "after", "last_status"),
    [
        ("ok", 2, 0, "ok"),
        ("FAILED", 1, 2, "error"),
        ("incomplete", 0, 1, "error"),
        ("interrupted", 2, 2, "interrupted"),
    ],
)
def test_each_outcome_moves_the_breaker_as_runtime_md_says(
    status: str, before: int, after: int, last_status: str
) -> None:
    write = rollup(row(status), failures=before, run_count=4, limit=5, armed=True)
    assert write.failures == after and write.run_count == 5 and not write.tripped
    assert write.fields["lastStatus"] == last_status
    assert write.fields["consecutiveFailures"] == after
    assert write.fields["lastRunRef"] == "r1" and write.fields["runCount"] == 5


@pytest.mark.parametrize("before", [0, 2])
def test_a_run_the_server_failed_is_an_error_but_moves_the_breaker_neither_way(before: int) -> None:
    failed = row("FAILED")
    failed.error_type = "ServerUnavailable"
    write = rollup(failed, failures=before, run_count=4, limit=3, armed=True)
    assert write.failures == before and not write.tripped and "enabled" not in write.fields
    assert write.fields["lastStatus"] == "error" and write.fields["consecutiveFailures"] == before
    assert write.fields["runCount"] == 5


def test_the_breaker_trips_at_the_limit() -> None:
    write = rollup(row("FAILED"), failures=2, run_count=2, limit=3, armed=True)
    assert write.tripped and write.fields["enabled"] is False
    assert write.fields["lastStatus"] == "auto_disabled"


def test_a_trigger_no_longer_armed_here_never_trips() -> None:
    write = rollup(row("FAILED"), failures=2, run_count=2, limit=3, armed=False)
    assert not write.tripped and "enabled" not in write.fields


@pytest.mark.parametrize("status", ["FAILED", "ok", "interrupted"])
def test_a_run_ending_after_the_trip_leaves_the_verdict_as_it_was(status: str) -> None:
    write = rollup(row(status), failures=2, run_count=2, limit=2, armed=False, tripped_before=True)
    assert not write.tripped and "enabled" not in write.fields
    assert write.fields["lastStatus"] == "auto_disabled"
    assert write.failures == 2 and write.fields["consecutiveFailures"] == 2
    assert write.fields["runCount"] == 3 and write.fields["lastRunRef"] == "r1"


def test_the_rollup_carries_fuel_cost_and_duration() -> None:
    write = rollup(row("ok", fuel=7, costUsd=0.5), failures=0, run_count=0, limit=3, armed=True)
    assert write.fields["lastFuel"] == 7 and write.fields["lastCostUsd"] == 0.5
    assert write.fields["lastDurationMs"] == 1250 and write.fields["lastRunAt"] == 1_800_000_000.25


@pytest.mark.parametrize(
    ("text", "valid", "replaced"),
    [
        ("plain", "plain", False),
        ("émoji 😀", "émoji 😀", False),
        ("\ud800", "\ufffd", True),
        ("cut \ud83d", "cut \ufffd", True),
        ("x\udfffy\ud800", "x\ufffdy\ufffd", True),
        ("a\ud83d\ude00b", "a😀b", True),  # a pair split in two code points is joined
        ("", "", False),
    ],
)
def test_text_is_made_valid_unicode(text: str, valid: str, replaced: bool) -> None:
    assert valid_text(text) == (valid, replaced)
    valid.encode("utf-8")


def test_a_result_with_a_lone_surrogate_keeps_the_field_and_notes_the_replacement() -> None:
    fields, notes = normalize_result({"title": "\ud800", "model": "gpt", "turns": 2})
    assert fields == {"title": "\ufffd", "model": "gpt", "turns": 2}
    assert notes == [f"result key 'title': {REPLACED}"]
