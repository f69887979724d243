"""The agenda as a pure function: records and facts in, the occurrences of a window out, each
with its device's state and, where it will be missed as things stand, its risk."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from anyrtd.agenda import (
    MAX_HOURS,
    PER_TRIGGER,
    Scene,
    agenda,
    parse_hours,
    silences,
)
from anyrtd.missed import Missed, Watched, last_recorded, missed_of
from anyrtd.missed import Scene as MissedScene
from anyrtd.model import TriggerDef, parse_record
from anyrtd.vocab import DeviceState, LastStatus, MissCause, OwnerState

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
ME, B, C = "12D3KooWme", "12D3KooWbbb", "12D3KooWccc"
HOUR = 3600.0


def defn(tid: str = "t1", **fields: Any) -> TriggerDef:
    record = {
        "id": tid,
        "kind": "cron",
        "spec": {"cron": "0 * * * *"},
        "program": "test:ok@v1",
        "owner": B,
        "enabled": True,
        "_v": 1,
        **fields,
    }
    parsed = parse_record(record)
    assert isinstance(parsed, TriggerDef), parsed
    return parsed


def silent_c() -> Missed:
    """A missed answer that says device C has recorded nothing since an hour ago."""
    d = defn("c-tick", owner=C, spec={"every_s": 60}, lastRunAt=NOW - HOUR)
    s = MissedScene(now=NOW, grace_s=60, peer_id=ME, devices={C: DeviceState.LIVE})
    m = missed_of(Watched(d, NOW - 2 * HOUR), s, last_recorded([d], {}))
    assert m is not None and m.last.cause == MissCause.OWNER_NOT_RUNNING
    return m


def scene(**kw: Any) -> Scene:
    base: dict[str, Any] = {
        "now": NOW,
        "peer_id": ME,
        "devices": {ME: DeviceState.LIVE, B: DeviceState.LIVE, C: DeviceState.LIVE},
        "names": {B: "nas"},
        "winner": ME,
    }
    return Scene(**{**base, **kw})


# (what, the definition, the scene's changes, the device state, the risk's cause or None)
CASES: list[tuple[str, TriggerDef, dict[str, Any], OwnerState, MissCause | None]] = [
    ("pinned here: running", defn(owner=ME), {}, OwnerState.RUNNING, None),
    ("pinned to the active device: running", defn(), {"winner": B}, OwnerState.RUNNING, None),
    ("pinned to a live standby device", defn(), {}, OwnerState.STANDBY, None),
    (
        "pinned to a device the missed watch found silent",
        defn(owner=C),
        {"silent": silences([silent_c()])},
        OwnerState.NOT_RUNNING,
        MissCause.OWNER_NOT_RUNNING,
    ),
    (
        "pinned to a pruned device",
        defn(),
        {"devices": {ME: DeviceState.LIVE, B: DeviceState.PRUNED}},
        OwnerState.PRUNED,
        MissCause.OWNER_PRUNED,
    ),
    (
        "pinned to a device the registry does not list",
        defn(owner="12D3KooWgone"),
        {},
        OwnerState.UNKNOWN,
        MissCause.OWNER_UNKNOWN,
    ),
    (
        "the registry was not read: unknown, not at risk",
        defn(),
        {"devices": None, "winner": None},
        OwnerState.UNKNOWN,
        None,
    ),
    ("unassigned, a device is active", defn(owner=""), {}, OwnerState.UNASSIGNED, None),
    (
        "unassigned, no device is active",
        defn(owner=""),
        {"winner": None},
        OwnerState.UNASSIGNED,
        MissCause.UNASSIGNED,
    ),
    (
        "auto-disabled by the breaker",
        defn(enabled=False, lastStatus=LastStatus.AUTO_DISABLED, consecutiveFailures=3),
        {},
        OwnerState.STANDBY,
        MissCause.AUTO_DISABLED,
    ),
]


@pytest.mark.parametrize(
    ("what", "d", "changes", "state", "cause"), CASES, ids=[c[0] for c in CASES]
)
def test_each_occurrence_gets_its_device_state_and_risk(
    what: str, d: TriggerDef, changes: dict[str, Any], state: OwnerState, cause: MissCause | None
) -> None:
    ag = agenda([d], scene(**changes), hours=3)
    assert [o.at for o in ag.occurrences] == [NOW + HOUR, NOW + 2 * HOUR, NOW + 3 * HOUR]
    o = ag.occurrences[0]
    assert o.owner.state == state
    assert (o.risk.cause if o.risk else None) == cause
    if o.risk is not None:
        assert o.risk.fix  # every risk names the command that helps


def test_a_silent_device_says_since_when_and_the_fix_names_it() -> None:
    ag = agenda([defn(owner=C)], scene(silent=silences([silent_c()])), hours=1)
    (o,) = ag.occurrences
    assert o.owner.since == NOW - HOUR
    assert o.owner.state_text == "not running since 2027-01-15 07:00:00 UTC"
    assert o.risk is not None and o.risk.text.startswith(f"device {C} not running")
    assert o.risk.fix == f"start anyrtd on {C}, or move it: anyrtd triggers pin t1 PEER"


def test_plain_disabled_triggers_and_consumed_onces_are_not_listed() -> None:
    defs = [
        defn("off", enabled=False),
        defn("shot", kind="once", spec={"at": NOW + 60}, lastRunAt=NOW - 5),
        defn("past", kind="once", spec={"at": NOW - 60}),
    ]
    assert agenda(defs, scene(), hours=1).occurrences == []


def test_occurrences_of_many_triggers_are_merged_in_time_order_with_their_zone() -> None:
    defs = [
        defn("hourly"),
        defn("berlin", spec={"cron": "30 9 * * *", "tz": "Europe/Berlin"}),  # 08:30 UTC
        defn("shot", kind="once", spec={"at": NOW + 10}),
        defn("grid", spec={"every_s": 1200}, lastRunAt=NOW - 600),
    ]
    ag = agenda(defs, scene(), hours=1)
    got = [(o.trigger_id, o.at - NOW) for o in ag.occurrences]
    assert got == [
        ("shot", 10),
        ("grid", 600),  # anchored at the last run: -600 + 1200
        ("berlin", 1800),
        ("grid", 1800),
        ("grid", 3000),
        ("hourly", 3600),
    ]
    assert {o.trigger_id: o.tz for o in ag.occurrences}["berlin"] == "Europe/Berlin"
    assert ag.until == NOW + HOUR and not ag.truncated


def test_the_window_is_half_open_and_a_frequent_trigger_is_capped() -> None:
    ag = agenda([defn(spec={"every_s": 1})], scene(), hours=1)
    assert len(ag.occurrences) == PER_TRIGGER and ag.capped == ["t1"]
    at = agenda([defn(kind="once", spec={"at": NOW + HOUR})], scene(), hours=1)
    assert [o.at for o in at.occurrences] == [NOW + HOUR]
    assert agenda([defn(kind="once", spec={"at": NOW})], scene(), hours=1).occurrences == []


def test_device_keeps_one_devices_occurrences_by_peer_id_or_name() -> None:
    defs = [defn("on-b"), defn("on-c", owner=C), defn("free", owner="")]
    names = {o.trigger_id for o in agenda(defs, scene(), hours=1, device="nas").occurrences}
    assert names == {"on-b"}
    mine = agenda(defs, scene(), hours=1, device=ME).occurrences  # the active one claims "free"
    assert {o.trigger_id for o in mine} == {"free"}


def test_event_triggers_are_listed_without_times() -> None:
    chat = defn(
        "on-chat", kind="event", spec={"dataset": "chat_messages", "objectId": "c1"}, owner=C
    )
    ag = agenda([chat, defn()], scene(silent=silences([silent_c()])), hours=1)
    assert [o.trigger_id for o in ag.occurrences] == ["t1"]
    (listening,) = ag.listening
    assert listening.at is None and listening.trigger_id == "on-chat"
    assert listening.risk is not None and listening.risk.cause == MissCause.OWNER_NOT_RUNNING


def test_a_chain_follows_each_of_its_upstreams_occurrences() -> None:
    """The extension point for chains: an event trigger whose `follows` names upstreams."""
    upstream = defn("backup", owner=C)
    report = defn("report", kind="event", spec={"dataset": "agent_runs", "objectId": "r"})
    after = defn("after-report", kind="event", spec={"dataset": "agent_runs", "objectId": "r"})
    links = {"report": ["backup"], "after-report": ["report"]}

    def follows(d: TriggerDef) -> Sequence[str] | None:
        return links.get(d.id)

    ag = agenda(
        [after, report, upstream, defn("other", spec={"cron": "30 * * * *"})],
        scene(silent=silences([silent_c()])),
        hours=1.25,
        follows=follows,
    )
    got = [(o.trigger_id, o.at - NOW if o.at else None, o.after) for o in ag.occurrences]
    assert got == [
        ("other", 1800, None),
        ("backup", 3600, None),
        ("report", 3600, "backup"),
        ("after-report", 3600, "report"),
    ]
    assert ag.listening == []
    report_occ = ag.occurrences[2]
    assert report_occ.owner.state == OwnerState.STANDBY  # its own device is fine ...
    assert report_occ.risk is not None  # ... but its upstream's is not running
    assert report_occ.risk.text.startswith("it follows backup, which is at risk")


def test_at_risk_only_walks_only_the_triggers_at_risk() -> None:
    defs = [defn("fine"), defn("risky", owner=C)]
    ag = agenda(defs, scene(silent=silences([silent_c()])), hours=2, at_risk_only=True)
    assert {o.trigger_id for o in ag.occurrences} == {"risky"}


@pytest.mark.parametrize(
    ("text", "hours", "problem"),
    [
        (None, 24.0, None),
        ("", 24.0, None),
        ("1.5", 1.5, None),
        (str(MAX_HOURS), MAX_HOURS, None),
        ("0", None, "more than 0 and at most 168"),
        ("-2", None, "more than 0 and at most 168"),
        ("169", None, "more than 0 and at most 168"),
        ("nan", None, "more than 0 and at most 168"),
        ("inf", None, "more than 0 and at most 168"),
        ("soon", None, "must be a number of hours"),
    ],
)
def test_hours_are_checked(text: str | None, hours: float | None, problem: str | None) -> None:
    if problem is None:
        assert parse_hours(text) == hours
    else:
        with pytest.raises(ValueError, match=problem):
            parse_hours(text)


def test_a_chain_record_follows_its_upstream_by_default() -> None:
    """A chain's filter names its upstreams (docs/events.md): the agenda reads it as is."""
    upstream = defn("backup", owner=C)
    spec = {"dataset": "agent_runs", "filter": {"triggerId": "backup"}}
    chain = defn("report", kind="event", spec=spec)
    everything = defn("cleanup", kind="event", spec={"dataset": "agent_runs", "filter": {}})
    ag = agenda([chain, everything, upstream], scene(silent=silences([silent_c()])), hours=1)
    got = [(o.trigger_id, o.at - NOW if o.at else None, o.after) for o in ag.occurrences]
    assert got == [("backup", 3600, None), ("report", 3600, "backup")]
    assert [o.trigger_id for o in ag.listening] == ["cleanup"]
