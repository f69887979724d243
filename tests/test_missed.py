"""Missed occurrences as a pure function: a table of records and facts, each with its answer."""

from __future__ import annotations

from typing import Any

import pytest

from anyrtd.missed import (
    MAX_WALKED,
    Scene,
    Sightings,
    Skips,
    Watched,
    default_grace,
    find_missed,
    first_due,
    last_recorded,
    missed_of,
)
from anyrtd.model import TriggerDef, parse_record
from anyrtd.vocab import DeviceState, LastStatus, MissCause

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
ME = "12D3KooWme"
B = "12D3KooWbbb"
MIN = 60.0


def defn(**fields: Any) -> TriggerDef:
    record = {
        "id": "t1",
        "kind": "cron",
        "spec": {"cron": "* * * * *"},
        "program": "test:ok@v1",
        "owner": B,
        "enabled": True,
        "_v": 1,
        **fields,
    }
    parsed = parse_record(record)
    assert isinstance(parsed, TriggerDef), parsed
    return parsed


def scene(**kw: Any) -> Scene:
    base: dict[str, Any] = {
        "now": NOW,
        "grace_s": MIN,
        "peer_id": ME,
        "up_since": NOW - 3600,
        "devices": {ME: DeviceState.LIVE, B: DeviceState.LIVE},
        "names": {B: "home-server"},
    }
    return Scene(**{**base, **kw})


def one(w: Watched, s: Scene | None = None) -> Any:
    s = s or scene()
    return missed_of(w, s, last_recorded([w.defn], s.device_seen))


# (what, the trigger, the scene's changes, how many missed, the newest one's cause)
CASES: list[tuple[str, Watched, dict[str, Any], int, MissCause | None]] = [
    (
        "ran at its last occurrence: nothing missed",
        Watched(defn(lastRunAt=NOW - 2 * MIN + 0.01), NOW - 7200),
        {},
        0,
        None,
    ),
    (
        "owner silent for 5 minutes: the occurrences past the grace are missed",
        Watched(defn(lastRunAt=NOW - 5 * MIN), NOW - 7200),
        {},
        3,  # -4, -3, -2 min; -1 min is within the grace
        MissCause.OWNER_NOT_RUNNING,
    ),
    (
        "owner pruned",
        Watched(defn(lastRunAt=NOW - 5 * MIN), NOW - 7200),
        {"devices": {ME: DeviceState.LIVE, B: DeviceState.PRUNED}},
        3,
        MissCause.OWNER_PRUNED,
    ),
    (
        "owner not in the registry",
        Watched(defn(lastRunAt=NOW - 5 * MIN), NOW - 7200),
        {"devices": {ME: DeviceState.LIVE}},
        3,
        MissCause.OWNER_UNKNOWN,
    ),
    (
        "registry unread: the owner's silence still tells",
        Watched(defn(lastRunAt=NOW - 5 * MIN), NOW - 7200),
        {"devices": None},
        3,
        MissCause.OWNER_NOT_RUNNING,
    ),
    (
        "owner recorded other runs since: cause unknown, ask it",
        Watched(defn(lastRunAt=NOW - 5 * MIN), NOW - 7200),
        {"device_seen": {B: NOW - 10}},
        3,
        MissCause.UNKNOWN,
    ),
    (
        "unassigned",
        Watched(defn(owner="", lastRunAt=NOW - 5 * MIN), NOW - 7200),
        {},
        3,
        MissCause.UNASSIGNED,
    ),
    (
        "pinned here, before this daemon started: this device was down",
        Watched(defn(owner=ME, lastRunAt=NOW - 5 * MIN), NOW - 7200),
        {"up_since": NOW - 30},
        3,
        MissCause.THIS_DEVICE_DOWN,
    ),
    (
        "pinned here while up: unknown",
        Watched(defn(owner=ME, lastRunAt=NOW - 5 * MIN), NOW - 7200),
        {},
        3,
        MissCause.UNKNOWN,
    ),
    (
        "the last run outlasted the next occurrences: overlap skips",
        Watched(defn(lastRunAt=NOW - 5 * MIN, lastDurationMs=10 * MIN * 1000), NOW - 7200),
        {},
        3,
        MissCause.OVERLAP_SKIP,
    ),
    (
        "disabled: nothing is missed",
        Watched(defn(enabled=False, lastRunAt=NOW - 5 * MIN), NOW - 7200),
        {},
        0,
        None,
    ),
    (
        "enabled again after the breaker: the occurrences before are the breaker's",
        Watched(defn(lastRunAt=NOW - 5 * MIN), NOW - 30, True, MissCause.AUTO_DISABLED),
        {},
        3,
        MissCause.AUTO_DISABLED,
    ),
    (
        "edited since its last run: only the new schedule's occurrences count",
        Watched(defn(lastRunAt=NOW - 50 * MIN), NOW - 2.5 * MIN, True),
        {},
        1,  # -2 min
        MissCause.OWNER_NOT_RUNNING,
    ),
    (
        "never ran: counted from when this device first saw it",
        Watched(defn(), NOW - 3.5 * MIN),
        {},
        2,
        MissCause.OWNER_NOT_RUNNING,
    ),
    (
        "a run record answers an occurrence the rollup does not",
        Watched(defn(lastRunAt=NOW - 5 * MIN), NOW - 7200, scheduled=(NOW - 4 * MIN,)),
        {},
        2,
        MissCause.OWNER_NOT_RUNNING,
    ),
    (
        "every_s, anchored on the last run",
        Watched(defn(spec={"every_s": 30}, lastRunAt=NOW - 100), NOW - 7200),
        {},
        1,  # -70 s; -40 s is within the grace
        MissCause.OWNER_NOT_RUNNING,
    ),
    (
        "a once that never fired, past the grace",
        Watched(defn(kind="once", spec={"at": NOW - 5 * MIN}), NOW - 7200),
        {},
        1,
        MissCause.OWNER_NOT_RUNNING,
    ),
    (
        "a once within the grace: not yet",
        Watched(defn(kind="once", spec={"at": NOW - 30}), NOW - 7200),
        {},
        0,
        None,
    ),
    (
        "a once that fired",
        Watched(defn(kind="once", spec={"at": NOW - 5 * MIN}, lastRunAt=NOW - 5 * MIN), NOW),
        {},
        0,
        None,
    ),
    (
        "an event trigger never misses",
        Watched(defn(kind="event", spec={"dataset": "chat_messages", "objectId": "c"}), NOW),
        {},
        0,
        None,
    ),
]


@pytest.mark.parametrize(
    ("what", "w", "changes", "count", "cause"), CASES, ids=[c[0] for c in CASES]
)
def test_missed_occurrences_and_their_causes(
    what: str, w: Watched, changes: dict[str, Any], count: int, cause: MissCause | None
) -> None:
    found = one(w, scene(**changes))
    if count == 0:
        assert found is None, what
        return
    assert found is not None, what
    assert found.count == count, what
    assert found.last.cause == cause, what
    assert all(
        b.at < a.at for a, b in zip(found.occurrences, found.occurrences[1:], strict=False)
    ), what


def test_the_owner_silence_names_the_device_and_since_when() -> None:
    found = one(Watched(defn(lastRunAt=NOW - 5 * MIN), NOW - 7200))
    assert found is not None
    text = found.last.text
    assert text.startswith("device home-server (12D3KooWbbb) not running")
    assert "2027-01-15 07:55:00 UTC" in text
    assert found.last.fix is not None and "anyrtd triggers pin t1" in found.last.fix


def test_a_year_off_walks_a_bounded_number_of_occurrences() -> None:
    found = one(Watched(defn(lastRunAt=NOW - 365 * 86400.0), NOW - 400 * 86400.0))
    assert found is not None
    assert found.count == MAX_WALKED and found.capped
    assert found.since == NOW - 86400.0  # the look-back bound
    assert len(found.occurrences) == 20


def test_the_episode_is_the_same_on_every_device_and_pass_until_it_runs() -> None:
    d = defn(lastRunAt=NOW - 5 * MIN)
    a = one(Watched(d, NOW - 7200))
    b = one(Watched(d, NOW - 60), scene(now=NOW + 3600, peer_id=B, up_since=NOW))
    assert a is not None and b is not None and a.episode == b.episode
    ran = one(Watched(defn(lastRunAt=NOW + 10 * MIN), NOW), scene(now=NOW + 20 * MIN))
    assert ran is not None and ran.episode != a.episode


def test_the_owner_is_judged_on_every_trigger_it_holds() -> None:
    busy = defn(id="t2", lastRunAt=NOW - 5)
    stuck = defn(lastRunAt=NOW - 5 * MIN)
    found = find_missed([Watched(busy, NOW - 7200), Watched(stuck, NOW - 7200)], scene())
    assert [m.trigger_id for m in found] == ["t1"]
    assert found[0].last.cause == MissCause.UNKNOWN  # B ran t2 since: B is running


def test_sightings_note_edits_and_what_a_trigger_was_before_it_was_enabled() -> None:
    seen = Sightings()
    first = seen.observe([defn()], NOW)
    assert first[0].first_seen == NOW and not first[0].changed
    assert seen.observe([defn()], NOW + 5)[0].first_seen == NOW
    tripped = defn(enabled=False, lastStatus=LastStatus.AUTO_DISABLED)
    assert seen.observe([tripped], NOW + 10) == []
    again = seen.observe([defn()], NOW + 20)[0]
    assert again.first_seen == NOW + 20 and again.changed
    assert again.off == MissCause.AUTO_DISABLED
    edited = seen.observe([defn(spec={"cron": "*/5 * * * *"})], NOW + 30)[0]
    assert edited.first_seen == NOW + 30 and edited.changed and edited.off is None


def test_the_default_grace_covers_a_tick_and_the_run_budget() -> None:
    assert default_grace(5.0, 300.0) == 305.0
    assert default_grace(1.0, 10.0) == 60.0


def test_nothing_is_missed_before_the_first_due_occurrence_is_a_grace_old() -> None:
    w = Watched(defn(lastRunAt=NOW - 5 * MIN), NOW - 7200)
    due = first_due(w)
    assert due == NOW - 4 * MIN
    assert one(w, scene(now=due + MIN)) is None
    found = one(w, scene(now=due + MIN + 0.5))
    assert found is not None and found.count == 1


def test_a_disabled_stretch_stays_missed_as_disabled_after_the_next_run() -> None:
    every = {"spec": {"every_s": 1}, "owner": ME}
    seen = Sightings()
    start = NOW - 600
    seen.observe([defn(lastRunAt=start - 1, **every)], start - 1)
    assert seen.observe([defn(enabled=False, lastRunAt=start - 1, **every)], start) == []
    seen.observe([defn(lastRunAt=start - 1, **every)], start + 7)
    # It ran again right after the enable: that run answers none of the stretch.
    [w] = seen.observe([defn(lastRunAt=start + 8, **every)], start + 8)
    assert first_due(w) is not None and first_due(w) <= start + 1
    at = scene(now=start + 8 + MIN, up_since=start - 100)
    found = one(w, at)
    # Strictly inside the stretch seen: the occurrences at its two ends may have run.
    assert found is not None and found.count == 6
    assert {o.cause for o in found.occurrences} == {MissCause.DISABLED}
    assert [o.at for o in found.occurrences] == [start + k for k in range(6, 0, -1)]
    assert found.last.facts == {"enabledAt": start + 7}
    # An edit drops the stretch: the old schedule's occurrences say nothing of the new one.
    [edited] = seen.observe([defn(lastRunAt=start + 8, spec={"every_s": 2}, owner=ME)], NOW - 1)
    assert one(edited, at) is None


def test_occurrences_skipped_after_a_stall_are_missed_whatever_ran_after() -> None:
    skips = Skips()
    due = NOW - 600
    skips.note("t1", due, due + 130)  # the minute grid at due, due+60 and due+120 skipped
    assert skips.take_changed() == {"t1"} and skips.take_changed() == set()
    w = Watched(defn(lastRunAt=NOW - 30, owner=ME), NOW - 7200, skips=skips.of("t1"))
    found = one(w, scene(up_since=NOW - 3600))
    assert found is not None and found.count == 3
    assert [o.at for o in found.occurrences] == [due + 120, due + 60, due]
    assert {o.cause for o in found.occurrences} == {MissCause.STALL_SKIP}
    assert found.last.facts == {"skippedAt": due + 130}
    assert "skipped it" in found.last.text
    assert first_due(w) == due
