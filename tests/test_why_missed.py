"""A trigger's "why" with its missed occurrences (pure): the note that lists them, and the
owner that is live in the registry but silent."""

from __future__ import annotations

from typing import Any

from anyrtd.missed import Scene, Watched, last_recorded, missed_of
from anyrtd.model import TriggerDef, parse_record
from anyrtd.vocab import Cause, DeviceState, MissCause, Verdict
from anyrtd.why import WhyFacts, explain

NOW = 1_800_000_000.0
ME = "12D3KooWme"
B = "12D3KooWbbb"


def defn(**fields: Any) -> TriggerDef:
    record = {
        "id": "tick",
        "kind": "cron",
        "spec": {"cron": "* * * * *"},
        "program": "test:ok@v1",
        "owner": B,
        "enabled": True,
        "lastRunAt": NOW - 600,
        "_v": 1,
        **fields,
    }
    parsed = parse_record(record)
    assert isinstance(parsed, TriggerDef)
    return parsed


def answer(d: TriggerDef) -> Any:
    scene = Scene(now=NOW, grace_s=60.0, peer_id=ME, devices={B: DeviceState.LIVE, ME: "live"})
    missed = missed_of(Watched(d, NOW - 7200), scene, last_recorded([d], {}))
    facts = WhyFacts(
        id="tick",
        now=NOW,
        peer_id=ME,
        verdict=Verdict.ACTIVE,
        parsed=d,
        devices={B: DeviceState.LIVE, ME: DeviceState.LIVE},
        missed=missed,
    )
    return explain(facts)


def test_a_silent_owner_is_named_so_and_the_missed_occurrences_are_a_note() -> None:
    got = answer(defn())
    placement = next(r for r in got.reasons if r.cause == Cause.PINNED_ELSEWHERE)
    assert "has recorded nothing since 2027-01-15 07:50:00 UTC" in placement.text
    note = next(r for r in got.reasons if r.cause == Cause.MISSED)
    assert not note.blocking and note.facts["missed"] == 8
    listed = note.facts["occurrences"]
    assert len(listed) == 5 and listed[0]["cause"] == MissCause.OWNER_NOT_RUNNING
    assert listed[0]["at"] == NOW - 120 and note.fix is not None


def test_an_owner_that_ran_lately_is_just_live() -> None:
    got = answer(defn(lastRunAt=NOW - 30))
    placement = next(r for r in got.reasons if r.cause == Cause.PINNED_ELSEWHERE)
    assert placement.text.endswith("which is live: it fires there")
    assert all(r.cause != Cause.MISSED for r in got.reasons)
