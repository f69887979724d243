"""The "why" of a trigger as a pure function: a table of facts, each with the answer it gives."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from anyrtd.model import Malformed, TriggerDef, parse_record
from anyrtd.registry import Entry, Registry, new_row
from anyrtd.vocab import Cause, LastStatus, Marker, Verdict
from anyrtd.why import (
    LIVE,
    PRUNED,
    UNKNOWN,
    Failure,
    WhyFacts,
    device_state,
    explain,
    malformed_field,
)

NOW = 1_800_000_000.0
ME = "12D3KooWme"
OTHER = "12D3KooWother"


def defn(**fields: Any) -> TriggerDef:
    record = {
        "id": "t1",
        "name": "t1",
        "kind": "cron",
        "spec": {"cron": "0 8 * * *"},
        "program": "test:ok@v1",
        "owner": ME,
        "enabled": True,
        "_v": 1,
        **fields,
    }
    parsed = parse_record(record)
    assert isinstance(parsed, TriggerDef), parsed
    return parsed


def entry(d: TriggerDef, **row: Any) -> Entry:
    e = Entry(d, new_row(d, NOW, claimed=False))
    e.row.next_fire = NOW + 3600 if d.kind != "event" else None
    for key, value in row.items():
        setattr(e.row, key, value)
    return e


def facts(d: TriggerDef | Malformed | None = None, e: Entry | None = None, **kw: Any) -> WhyFacts:
    base = WhyFacts(
        id="t1",
        now=NOW,
        peer_id=ME,
        verdict=Verdict.ACTIVE,
        parsed=d,
        entry=e,
        devices={ME: LIVE, OTHER: LIVE},
        winner=ME,
        next_fires=(NOW + 3600, NOW + 90000),
        spec_fires=(NOW + 3600,),
    )
    return replace(base, **kw)


def causes(f: WhyFacts) -> list[Cause]:
    return [r.cause for r in explain(f).reasons if r.blocking]


def test_an_armed_entry_fires_here_with_its_next_fires() -> None:
    d = defn()
    answer = explain(facts(d, entry(d)))
    assert answer.fires and answer.device == ME
    assert answer.next_fires == [NOW + 3600, NOW + 90000]
    assert answer.reasons == []


def test_unknown_id() -> None:
    answer = explain(facts(None, None))
    assert not answer.fires and answer.device is None
    (reason,) = answer.reasons
    assert reason.cause == Cause.UNKNOWN and reason.fix == "anyrtd triggers list --all"


def test_tombstoned_id() -> None:
    (reason,) = explain(facts(None, None, tombstoned=True)).reasons
    assert reason.cause == Cause.TOMBSTONED and reason.facts["tombstoned"] is True


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"id": "t1", "program": "x"}, "kind"),
        ({"id": "t1", "kind": "cron", "spec": {"cron": "* * * * *"}}, "program"),
        ({"id": "t1", "kind": "cron", "program": "p", "spec": 5}, "spec"),
        ({"id": "t1", "kind": "cron", "program": "p", "spec": {}, "enabled": "yes"}, "enabled"),
    ],
)
def test_malformed_names_the_field_at_fault(record: dict[str, Any], field: str) -> None:
    bad = parse_record(record)
    assert isinstance(bad, Malformed)
    (reason,) = explain(facts(bad, None)).reasons
    assert reason.cause == Cause.MALFORMED
    assert reason.facts["field"] == field
    assert reason.fix == f"anyrtd triggers edit t1 --set {field}=JSON"


def test_malformed_field_of_a_sentence_without_one() -> None:
    assert malformed_field("record could not be read: oops") is None
    assert malformed_field("limits.timeoutS must be a number, not 'x'") == "limits.timeoutS"


@pytest.mark.parametrize(
    ("state", "words", "device"),
    [
        (LIVE, "which is live", OTHER),
        (PRUNED, "which is pruned", None),
        (UNKNOWN, "does not list", None),
    ],
)
def test_pinned_elsewhere_names_the_owner_and_its_state(
    state: str, words: str, device: str | None
) -> None:
    d = defn(owner=OTHER)
    devices = {ME: LIVE} if state == UNKNOWN else {ME: LIVE, OTHER: state}
    answer = explain(facts(d, None, devices=devices))
    (reason,) = answer.reasons
    assert reason.cause == Cause.PINNED_ELSEWHERE and words in reason.text
    assert reason.facts["owner"] == OTHER and reason.facts["ownerState"] == state
    assert reason.fix == f"anyrtd triggers pin t1 {ME}"
    assert answer.device == device
    assert answer.next_fires == ([NOW + 3600] if device else [])


def test_owner_state_is_unknown_when_the_registry_was_not_read() -> None:
    f = facts(defn(owner=OTHER), None, devices=None)
    assert device_state(f, OTHER) == UNKNOWN
    assert explain(f).reasons[0].facts["ownerState"] == UNKNOWN


def test_standby_may_not_claim_and_names_the_winner() -> None:
    d = defn(owner="")
    answer = explain(facts(d, None, verdict=Verdict.STANDBY, winner=OTHER))
    (reason,) = answer.reasons
    assert reason.cause == Cause.STANDBY and reason.facts["winner"] == OTHER
    assert answer.device == OTHER and not answer.fires


def test_standby_still_fires_its_pins() -> None:
    d = defn()
    assert explain(facts(d, entry(d), verdict=Verdict.STANDBY, winner=OTHER)).fires


def test_this_device_pruned_comes_first_and_blocks_pins_too() -> None:
    d = defn(enabled=False)
    answer = explain(facts(d, entry(d), verdict=Verdict.PRUNED, winner=OTHER))
    assert causes(facts(d, entry(d), verdict=Verdict.PRUNED, winner=OTHER)) == [
        Cause.DEVICE_PRUNED,
        Cause.DISABLED,
    ]
    assert answer.reasons[0].fix == f"anyrtd triggers pin t1 {OTHER}"


def test_no_peer_id_yet() -> None:
    d = defn(owner="")
    assert causes(facts(d, None, peer_id=None)) == [Cause.NO_PEER_ID]


def test_takeover_hold() -> None:
    hold = {"waitingFor": f"term 1 ({OTHER})", "since": NOW - 5, "maxS": 60.0}
    f = facts(defn(owner=""), None, hold=hold, may_claim=False)
    (reason,) = explain(f).reasons
    assert reason.cause == Cause.TAKEOVER_HOLD and reason.facts["waitingFor"] == hold["waitingFor"]


def test_a_lapsed_lease_holds_claims_too() -> None:
    assert causes(facts(defn(owner=""), None, may_claim=False)) == [Cause.TAKEOVER_HOLD]


def test_a_record_that_belongs_here_but_is_not_adopted_yet_fires_from_the_next_tick() -> None:
    answer = explain(facts(defn(owner=""), None, spec_fires=(NOW + 60,)))
    (reason,) = answer.reasons
    assert reason.cause == Cause.NOT_ADOPTED and not reason.blocking
    assert answer.fires and answer.next_fires == [NOW + 60]


def test_a_claim_awaiting_confirmation_says_when_it_is_armed_and_fires() -> None:
    d = defn(owner=ME)
    f = facts(
        d, entry(d, claimed_at=NOW - 1, next_fire=None), confirm_s=5.0,
        spec_fires=(NOW + 2, NOW + 62),
    )  # fmt: skip
    answer = explain(f)
    (reason,) = answer.reasons
    assert reason.cause == Cause.CLAIMING and reason.facts["claimedAt"] == NOW - 1
    assert not reason.blocking and reason.facts["confirmBy"] == NOW + 4
    assert "confirms the claim by about" in reason.text and "fires here" in reason.text
    # it fires: a cron from its first occurrence after the claim is confirmed
    assert answer.fires and answer.next_fires == [NOW + 62]


def test_a_marker_names_the_field_and_the_spec() -> None:
    d = defn(spec={"cron": "0 0 30 2 *"})
    e = entry(d, marker=Marker.INVALID_SPEC, next_fire=None)
    (reason,) = explain(facts(d, e)).reasons
    assert reason.cause == Cause.MARKER
    assert reason.facts["marker"] == Marker.INVALID_SPEC and reason.facts["field"] == "spec"
    assert reason.fix == "anyrtd triggers edit t1 --set spec=JSON"


def test_a_program_not_installed_here() -> None:
    d = defn()
    (reason,) = explain(facts(d, entry(d), installed=False)).reasons
    assert reason.cause == Cause.NOT_INSTALLED and reason.fix == "anyrtd programs list"


def test_a_program_missing_here_does_not_matter_when_it_runs_elsewhere() -> None:
    assert causes(facts(defn(owner=OTHER), None, installed=False)) == [Cause.PINNED_ELSEWHERE]


def test_auto_disabled_shows_the_breaker_and_the_last_errors() -> None:
    d = defn(enabled=False, lastStatus=LastStatus.AUTO_DISABLED, consecutiveFailures=3)
    failures = [Failure("r2", NOW - 60, "boom"), Failure("r1", NOW - 120, "boom")]
    (reason,) = explain(facts(d, entry(d), failures=failures)).reasons
    assert reason.cause == Cause.AUTO_DISABLED
    assert reason.facts["consecutiveFailures"] == 3
    assert [e["runId"] for e in reason.facts["lastErrors"]] == ["r2", "r1"]
    assert reason.fix == "anyrtd triggers enable t1"


def test_a_consumed_once_names_its_run() -> None:
    d = defn(kind="once", spec={"at": NOW - 100}, enabled=False, lastRunAt=NOW - 99)
    e = entry(d, consumed=True, next_fire=None)
    (reason,) = explain(facts(d, e, consumed_run="run-1")).reasons
    assert reason.cause == Cause.CONSUMED and reason.facts["run"] == "run-1"
    assert "run-1" in reason.text and reason.fix == "anyrtd triggers edit t1 --at TIME"


def test_disabled() -> None:
    d = defn(enabled=False)
    (reason,) = explain(facts(d, entry(d))).reasons
    assert reason.cause == Cause.DISABLED and reason.fix == "anyrtd triggers enable t1"


def test_no_occurrence_ahead() -> None:
    d = defn()
    assert causes(facts(d, entry(d, next_fire=None))) == [Cause.NO_NEXT_FIRE]


def test_notes_do_not_stop_it() -> None:
    d = defn(consecutiveFailures=2)
    e = entry(d, consecutive_failures=2)
    registry = Registry()
    registry.put(e)
    registry.began(e.id)
    answer = explain(facts(d, e, overlap_skips=4, failures=[Failure("r9", NOW, "boom")]))
    assert answer.fires
    assert [(r.cause, r.blocking) for r in answer.reasons] == [
        (Cause.FAILING, False),
        (Cause.RUNNING, False),
        (Cause.OVERLAP_SKIPS, False),
    ]
    assert answer.reasons[2].facts["overlapSkips"] == 4


def test_every_reason_in_the_order_to_fix_it() -> None:
    d = defn(owner=OTHER, enabled=False)
    f = facts(d, None, verdict=Verdict.PRUNED, devices={OTHER: PRUNED}, winner=None)
    assert causes(f) == [Cause.DEVICE_PRUNED, Cause.PINNED_ELSEWHERE, Cause.DISABLED]
    assert explain(f).device is None


def test_an_event_trigger_listens_without_fire_times() -> None:
    d = defn(kind="event", spec={"dataset": "chat_messages", "objectId": "chat1"})
    answer = explain(facts(d, entry(d), next_fires=()))
    assert answer.fires and answer.next_fires == []
