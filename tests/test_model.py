"""The trigger model: records from the seeds parse to definitions; broken ones are malformed."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anyrtd.model import (
    STANDING_BUILTINS,
    Malformed,
    Rollup,
    TriggerDef,
    _jsonable,
    fingerprint,
    health_marker,
    marker_reason,
    parse_record,
    spec_error,
)
from anyrtd.schedule import CronSchedule, EventSchedule, InvalidSchedule, OnceSchedule, preview
from anyrtd.vocab import Marker, is_unassigned

DAILY_DIGEST = {
    "id": "daily-digest",
    "name": "daily digest",
    "kind": "cron",
    "spec": {"cron": "0 8 * * *"},
    "program": "agent:rollup@v1",
    "args": {"space": "bao", "chatId": "<chatId>"},
    "owner": "",
    "enabled": True,
    "maxConsecutiveFailures": 3,
    "_v": 7,
    "_updatedAt": 1787000000.5,
}
STANDUP = {
    "id": "remind-standup",
    "name": "Standup reminder",
    "kind": "once",
    "spec": {"at": 1787000000},
    "program": "agent:remind@v1",
    "args": {"space": "bao", "chatId": "chat-1", "text": "standup in 5"},
    "enabled": True,
}
CHAT_EVENT = {
    "id": "chat-watch",
    "kind": "event",
    "spec": {"dataset": "chat_messages", "objectId": "chat-general"},
    "program": "internal:chat-watch",
    "owner": "peer-laptop",
}


def parsed(record: dict[str, Any]) -> TriggerDef:
    result = parse_record(record)
    assert isinstance(result, TriggerDef), result
    return result


def test_the_daily_digest_parses() -> None:
    d = parsed(DAILY_DIGEST)
    assert (d.id, d.name, d.kind, d.program) == (
        "daily-digest",
        "daily digest",
        "cron",
        "agent:rollup@v1",
    )
    assert dict(d.spec) == {"cron": "0 8 * * *"}
    assert dict(d.args) == {"space": "bao", "chatId": "<chatId>"}
    assert (d.owner, d.enabled, d.max_consecutive_failures, d.version) == ("", True, 3, 7)
    assert dict(d.limits) == {}
    assert d.rollup == Rollup()
    assert isinstance(d.schedule, CronSchedule)
    assert health_marker(d) is None
    assert preview(d, 1787000000.0, 1) == [1787040000.0]  # 2026-08-18 08:00 UTC


def test_the_standup_reminder_parses_with_defaults() -> None:
    d = parsed(STANDUP)
    assert (d.kind, d.name, d.owner, d.version) == ("once", "Standup reminder", "", None)
    assert d.schedule == OnceSchedule(1787000000.0)
    assert d.max_consecutive_failures == 3
    assert preview(d, 1788000000.0, 3) == [1787000000.0]  # past and not run: due now
    consumed = parsed({**STANDUP, "lastRunAt": 1787000001.2, "enabled": False})
    assert consumed.rollup.last_run_at == 1787000001.2
    assert preview(consumed, 1786000000.0, 3) == []


def test_an_event_on_a_chat_parses() -> None:
    d = parsed(CHAT_EVENT)
    assert d.name == "chat-watch"  # absent name = the record id
    assert d.schedule == EventSchedule("chat_messages", "chat-general", None)
    assert dict(d.args) == {}
    assert d.owner == "peer-laptop"
    assert health_marker(d) is None
    assert preview(d, 0.0, 3) == []


def test_the_rollup_fields_are_read() -> None:
    d = parsed(
        {
            **DAILY_DIGEST,
            "lastRunAt": 1787000000,
            "lastStatus": "ok",
            "lastDurationMs": 12.5,
            "lastFuel": 100,
            "lastCostUsd": 0.002,
            "runCount": 4.0,
            "consecutiveFailures": 1,
            "lastRunRef": "run-abc",
            "limits": {"fuelPerRun": 1000, "timeoutS": 30, "other": "kept"},
        }
    )
    assert d.rollup == Rollup(1787000000.0, "ok", 12.5, 100.0, 0.002, 4, 1, "run-abc")
    assert dict(d.limits) == {"fuelPerRun": 1000, "timeoutS": 30, "other": "kept"}


def test_nulls_read_as_absent() -> None:
    d = parsed({**STANDUP, "name": None, "args": None, "owner": None, "enabled": None})
    assert (d.name, dict(d.args), d.owner, d.enabled) == ("remind-standup", {}, "", True)


BROKEN: list[tuple[Any, str]] = [
    ([1, 2], "record must be an object, not an array"),
    ({"kind": "cron"}, "record id must be a non-empty string"),
    ({**DAILY_DIGEST, "id": ""}, "record id must be a non-empty string"),
    ({**DAILY_DIGEST, "_deleted": True}, "tombstone"),
    ({**DAILY_DIGEST, "_v": "7"}, "_v must be a whole number"),
    ({**DAILY_DIGEST, "kind": None}, 'kind is missing; set it to "cron", "once" or "event"'),
    ({**DAILY_DIGEST, "kind": "interval"}, 'kind "interval" is not one of "cron", "once", "event"'),
    ({**DAILY_DIGEST, "kind": 3}, 'kind a number (3) is not one of "cron"'),
    ({k: v for k, v in DAILY_DIGEST.items() if k != "program"}, "program is missing"),
    ({**DAILY_DIGEST, "program": 5}, "program must be a program spec"),
    ({**DAILY_DIGEST, "program": "  "}, "program must be a program spec"),
    ({**DAILY_DIGEST, "spec": "0 8 * * *"}, "spec must be an object"),
    ({**DAILY_DIGEST, "spec": ["0 8 * * *"]}, "spec must be an object"),
    ({**DAILY_DIGEST, "args": ["x"]}, "args must be an object, not an array"),
    ({**DAILY_DIGEST, "limits": "none"}, "limits must be an object"),
    ({**DAILY_DIGEST, "limits": {"timeoutS": "30"}}, "limits.timeoutS must be a number"),
    ({**DAILY_DIGEST, "owner": 42}, "owner must be a string"),
    ({**DAILY_DIGEST, "name": ["x"]}, "name must be a string"),
    ({**DAILY_DIGEST, "enabled": "yes"}, "enabled must be true or false"),
    ({**DAILY_DIGEST, "enabled": 1}, "enabled must be true or false"),
    ({**DAILY_DIGEST, "maxConsecutiveFailures": 0}, "maxConsecutiveFailures must be at least 1"),
    ({**DAILY_DIGEST, "maxConsecutiveFailures": 2.5}, "maxConsecutiveFailures must be a whole"),
    ({**DAILY_DIGEST, "maxConsecutiveFailures": "3"}, "maxConsecutiveFailures must be a whole"),
    ({**DAILY_DIGEST, "maxConsecutiveFailures": True}, "maxConsecutiveFailures must be a whole"),
    ({**STANDUP, "lastRunAt": "yesterday"}, "lastRunAt must be a number"),
    ({**STANDUP, "lastRunAt": math.nan}, "lastRunAt must be a finite number"),
    ({**STANDUP, "lastRunAt": 10**400}, "lastRunAt 1000"),
    ({**STANDUP, "lastStatus": 1}, "lastStatus must be a string"),
    ({**STANDUP, "runCount": -1}, "runCount must be at least 0"),
    ({**STANDUP, "consecutiveFailures": "2"}, "consecutiveFailures must be a whole number"),
]


@pytest.mark.parametrize(("record", "reason"), BROKEN)
def test_broken_records_are_malformed_with_a_reason(record: Any, reason: str) -> None:
    result = parse_record(record)
    assert isinstance(result, Malformed)
    assert reason in result.reason
    if isinstance(record, dict) and isinstance(record.get("id"), str):
        assert result.id == record["id"]
        assert result.version == (record["_v"] if isinstance(record.get("_v"), int) else None)


# --------------------------------------------------------------------------- markers


@pytest.mark.parametrize(
    ("kind", "spec", "marker"),
    [
        ("cron", {"cron": "0 0 30 2 *"}, Marker.INVALID_SPEC),  # no next occurrence
        ("cron", {"cron": "61 * * * *"}, Marker.INVALID_SPEC),
        ("cron", {"cron": "0 8 * * *", "tz": "Nowhere/Land"}, Marker.INVALID_SPEC),
        ("cron", {"every_s": 0}, Marker.INVALID_SPEC),
        ("cron", {"every_s": -1}, Marker.INVALID_SPEC),
        ("cron", {}, Marker.INVALID_SPEC),
        ("once", {}, Marker.INVALID_SPEC),
        ("once", {"at": "tomorrow"}, Marker.INVALID_SPEC),
        ("event", {"dataset": "chat_messages"}, Marker.INVALID_SPEC),
        ("event", {"objectId": "chat-1"}, Marker.INVALID_SPEC),
        ("event", {"dataset": "notes", "objectId": "n-1"}, Marker.UNSUPPORTED_SOURCE),
        ("cron", {"cron": "0 8 * * *", "tz": "Europe/Berlin"}, None),
        ("cron", {"every_s": 300}, None),
        ("once", {"at": 0}, None),
    ],
)
def test_unusable_specs_get_a_health_marker(
    kind: str, spec: dict[str, Any], marker: str | None
) -> None:
    d = parsed({"id": "t", "kind": kind, "spec": spec, "program": "agent:remind@v1"})
    assert health_marker(d) == marker
    reason = marker_reason(d)
    assert (reason is None) == (marker is None)
    assert spec_error(kind, spec) == reason


def test_a_missing_spec_is_a_marker_not_malformed() -> None:
    d = parsed({"id": "t", "kind": "once", "program": "agent:remind@v1"})
    assert health_marker(d) == Marker.INVALID_SPEC
    assert marker_reason(d) == 'spec is missing; a once trigger needs one like {"at": 1787000000}'


def test_a_marker_appears_and_clears_when_the_record_is_fixed() -> None:
    broken = parsed({**DAILY_DIGEST, "spec": {"cron": "0 0 30 2 *"}})
    fixed = parsed({**DAILY_DIGEST, "spec": {"cron": "0 0 28 2 *"}})
    assert health_marker(broken) == Marker.INVALID_SPEC
    assert health_marker(fixed) is None
    assert broken.fingerprint != fixed.fingerprint  # the fix is a refresh


def test_a_disabled_trigger_has_no_marker() -> None:
    d = parsed({**DAILY_DIGEST, "spec": {"cron": "nonsense"}, "enabled": False})
    assert isinstance(d.schedule, InvalidSchedule)
    assert health_marker(d) is None


def test_a_cron_past_its_last_year_is_marked_when_now_is_known() -> None:
    d = parsed({**DAILY_DIGEST, "spec": {"cron": "0 0 1 1 * 0 2027"}})
    assert health_marker(d) is None
    assert health_marker(d, now=1_700_000_000.0) is None
    assert health_marker(d, now=1_900_000_000.0) == Marker.INVALID_SPEC
    assert marker_reason(d, now=1_900_000_000.0) == (
        'cron "0 0 1 1 * 0 2027" has no occurrence after now: the last year of its year field '
        "has passed"
    )


NOW = 1_800_000_000.0  # 2027-01-15


@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        ("cron", {"cron": "0 0 1 1 * 0 2020"}),  # its last year has passed
        ("cron", {"cron": "0 0 1 1 * 0 2020-2026"}),
        ("cron", {"cron": "0 0 1 1 * 0 2020-2030"}),  # still ahead
        ("cron", {"cron": "0 0 1 1 * 0 2027"}),  # this year's only occurrence is behind
        ("cron", {"cron": "0 0 31 12 * 0 2027"}),
        ("cron", {"cron": ",".join(["1"] * 100_000) + " * * * *"}),  # over the size limit
        ("cron", {"cron": ",".join(["1"] * 65) + " * * * *"}),  # over the list limit
        ("cron", {"cron": ",".join(["1"] * 64) + " * * * *"}),
        ("cron", {"cron": "61 * * * *"}),
        ("cron", {"cron": "0 8 * * *", "tz": "Mars/Olympus"}),
        ("cron", {"every_s": 0.5}),
        ("cron", {"every_s": 1e-9}),
        ("cron", {"every_s": 1}),
        ("once", {"at": 1.0}),  # a past `at` fires late: not a marker
        ("event", {"dataset": "notes", "objectId": "n-1"}),
        ("event", {"dataset": "chat_messages", "objectId": "c-1"}),
    ],
)
def test_spec_error_refuses_exactly_what_the_daemon_marks(kind: str, spec: dict[str, Any]) -> None:
    # One check: what a PATCH or the CLI is refused with is what the daemon marks the
    # record with, for the same spec at the same time.
    d = parsed({"id": "t", "kind": kind, "spec": spec, "program": "agent:remind@v1"})
    error = spec_error(kind, spec, now=NOW)
    assert (error is None) == (health_marker(d, NOW) is None)
    assert error == marker_reason(d, NOW)


def test_spec_error_judges_a_year_limited_cron_at_the_time_of_the_write() -> None:
    # The CLI and PATCH pass no time: a write is judged by the wall clock when it is made.
    past = spec_error("cron", {"cron": "0 0 1 1 * 0 2020"})
    assert past is not None and "has no occurrence after now" in past
    assert spec_error("cron", {"cron": "0 0 1 1 * 0 2099"}) is None
    assert spec_error("cron", {"cron": "0 0 1 1 * 0 2020"}, now=1_500_000_000.0) is None


def test_spec_error_refuses_bad_patches_with_a_message() -> None:
    assert spec_error("cron", {"cron": "61 * * * *"}) == (
        'cron "61 * * * *": minute 61 is out of range 0-59'
    )
    assert spec_error("cron", "0 8 * * *") is not None
    assert spec_error("sometimes", {}) == 'kind "sometimes" is not one of "cron", "once", "event"'
    assert spec_error("cron", {"cron": "*/5 * * * *"}) is None


# --------------------------------------------------------------------------- fingerprint


def test_the_fingerprint_covers_exactly_the_definition_core() -> None:
    base = parsed(DAILY_DIGEST).fingerprint
    reordered = dict(reversed(list(DAILY_DIGEST.items())))
    assert parsed(reordered).fingerprint == base
    outside_core = [
        {"enabled": False},
        {"owner": "peer-x"},
        {"lastRunAt": 5, "lastStatus": "ok", "runCount": 3, "consecutiveFailures": 1},
        {"_v": 99, "_updatedAt": 1.0},
        {"unknownField": 1},
    ]
    for change in outside_core:
        assert parsed({**DAILY_DIGEST, **change}).fingerprint == base, change
    core = [
        {"kind": "once", "spec": {"at": 5}},
        {"spec": {"cron": "0 9 * * *"}},
        {"spec": {"cron": "0 8 * * *", "tz": "Europe/Berlin"}},
        {"program": "agent:remind@v1"},
        {"args": {"space": "bao"}},
        {"name": "digest"},
        {"limits": {"timeoutS": 5}},
        {"maxConsecutiveFailures": 4},
    ]
    prints = {parsed({**DAILY_DIGEST, **change}).fingerprint for change in core}
    assert base not in prints
    assert len(prints) == len(core)


def test_the_fingerprint_stays_what_earlier_versions_computed() -> None:
    # A different fingerprint after an upgrade would refresh every entry: these are the
    # values the first releases computed, pinned.
    assert parsed(DAILY_DIGEST).fingerprint == "63c6f1d3ae5000ead9a7fd47be6ae85a"
    odd = {
        "id": "x",
        "kind": "cron",
        "spec": {"every_s": 86400.5, "z": [1, 2.5, None, True], "é": "\ud800"},
        "program": "a:b@v1",
        "args": {"n": float("nan"), "big": 10**30, "u": "ü\u2028"},
        "limits": {"timeoutS": 5},
    }
    assert parsed(odd).fingerprint == "1c4f674fc4cd405d8d9fbc9d2f09ecec"


def test_absent_name_and_the_id_as_name_are_the_same_definition() -> None:
    a = parsed({k: v for k, v in DAILY_DIGEST.items() if k != "name"})
    b = parsed({**DAILY_DIGEST, "name": "daily-digest"})
    assert a.fingerprint == b.fingerprint


# --------------------------------------------------------------------------- owners, built-ins


@pytest.mark.parametrize(
    ("owner", "unassigned"),
    [("", True), ("anyrt-1234", True), ("anyrt-", False), ("anyrt-12x", False), ("peer", False)],
)
def test_is_unassigned(owner: str, unassigned: bool) -> None:
    assert is_unassigned(owner) is unassigned


def test_standing_builtins() -> None:
    assert {"rollup", "extraction", "linkgen", "evolution", "decay", "reflection"} == set(
        STANDING_BUILTINS
    )


# --------------------------------------------------------------------------- never raises

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "id",
    "name",
    "kind",
    "spec",
    "program",
    "args",
    "owner",
    "enabled",
    "limits",
    "maxConsecutiveFailures",
    "lastRunAt",
    "lastStatus",
    "lastDurationMs",
    "lastFuel",
    "lastCostUsd",
    "runCount",
    "consecutiveFailures",
    "lastRunRef",
    "_v",
    "_deleted",
]
field_values = {
    "kind": st.sampled_from(["cron", "once", "event", "", "CRON"]) | json_values,
    "spec": st.fixed_dictionaries(
        {},
        optional={
            "cron": st.text(alphabet="0123456789*/,-? LW#", max_size=20) | json_values,
            "every_s": json_values,
            "at": json_values,
            "tz": st.sampled_from(["Europe/Berlin", "Bad/Zone", ""]) | json_values,
            "dataset": st.sampled_from(["chat_messages", "notes"]) | json_values,
            "objectId": json_values,
        },
    )
    | json_values,
    "program": st.sampled_from(["agent:remind@v1"]) | json_values,
}
records = (
    st.fixed_dictionaries(
        {},
        optional={f: field_values.get(f, json_values) for f in FIELDS},
    )
    | st.dictionaries(json_values.filter(lambda k: isinstance(k, str | int)), json_values)
    | json_values
)  # type: ignore[arg-type]


@settings(deadline=None, max_examples=250)
@given(record=records)
def test_parse_record_never_raises(record: Any) -> None:
    result = parse_record(record)
    assert isinstance(result, TriggerDef | Malformed)
    if isinstance(result, TriggerDef):
        assert isinstance(result.fingerprint, str) and len(result.fingerprint) == 32
        health_marker(result, now=1_800_000_000.0)
        marker_reason(result)
        preview(result, 1_800_000_000.0, 3)
    else:
        assert result.reason


def test_parse_record_survives_hostile_objects() -> None:
    class Exploding(dict[str, Any]):
        def get(self, *args: Any) -> Any:
            raise RuntimeError("boom")

    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    for record in [Exploding(id="x"), {**DAILY_DIGEST, "args": cyclic}, object(), None]:
        assert isinstance(parse_record(record), Malformed | TriggerDef)  # type: ignore[arg-type]


@given(
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    st.text(max_size=10),
)
@settings(max_examples=300, deadline=None)
def test_the_fingerprint_is_the_blake2b_of_the_sorted_compact_json_of_the_core(
    spec: dict[str, Any], args: dict[str, Any], name: str
) -> None:
    core = {
        "kind": "cron",
        "spec": spec,
        "program": "a:b@v1",
        "args": args,
        "name": name,
        "limits": {},
        "maxConsecutiveFailures": 3,
    }
    text = json.dumps(
        core, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_jsonable
    )
    expected = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
    assert (
        fingerprint(
            **{k: core[k] for k in ("kind", "spec", "program", "args", "name", "limits")},
            max_consecutive_failures=3,
        )
        == expected.hexdigest()
    )


@pytest.mark.parametrize("every", [60, 60.0, 0.5, 0, -5, 10**400, True, "60", None, 1e300])
def test_an_every_s_schedule_shared_by_period_is_the_one_its_spec_compiles_to(
    every: Any,
) -> None:
    from anyrtd.schedule import compile_schedule

    spec = {"every_s": every}
    first = parsed({"id": "a", "kind": "cron", "spec": spec, "program": "p"}).schedule
    again = parsed({"id": "b", "kind": "cron", "spec": dict(spec), "program": "p"}).schedule
    assert first == again == compile_schedule("cron", spec)
    assert type(first) is type(compile_schedule("cron", spec))
