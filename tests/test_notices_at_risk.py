"""The notice before the miss: made by the active device once per occurrence at risk, the
lead time before it is due, never repeated when the role moves, and followed up in the same
thread when the risk went away or the occurrence was missed (docs/notices.md).

The fleet (tests/fleet.py) runs each device's daemon in this process on one fake clock; each
test takes the notices' passes itself (`Notices.step`), so nothing waits on a bare sleep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet
from test_notices import chat_notices, delivered, look, node

from anyrtd import agenda
from anyrtd.missed import Missed, Occurrence
from anyrtd.model import TriggerDef, parse_record
from anyrtd.notices import NOTICED_FIELD, Watching, mark_id, message_id, risk_key, risk_over
from anyrtd.vocab import LastStatus, MissCause, NoticeKind, OwnerState

pytestmark = pytest.mark.process  # the notice command is a real process

LEAD_S = 600.0
GRACE_S = 30.0  # test_notices' node() sets it


def kinds(items: list[dict[str, Any]], kind: str, key: str = "kind") -> list[dict[str, Any]]:
    return [n for n in items if n.get(key) == kind]


@pytest.mark.devices(3)
async def test_one_notice_before_the_miss_survives_role_moves_and_is_followed_up(
    fleet: Fleet, tmp_path: Path
) -> None:
    out = tmp_path / "notices"
    out.mkdir()
    settings = {"at_risk": True, "at_risk_lead_s": LEAD_S}
    a = await node(fleet, 1, out, **settings)
    b = await node(fleet, 2, out, **settings)
    c = await fleet.node(3)  # the owner: no notices configured there
    await fleet.step(1, poll=True)
    await fleet.put("beat", kind="cron", spec={"every_s": 10}, program="test:ok@v1", owner=c.me)
    for _ in range(3):
        await fleet.step(10)
    await c.stop()
    await fleet.step(GRACE_S + 15, poll=True)
    await look(a, b)
    assert [n["kind"] for n in delivered(out)] == [NoticeKind.MISSED]  # beat's silence

    due = fleet.clock.now() + 900
    await fleet.put("backup", kind="once", spec={"at": due}, program="test:ok@v1", owner=c.me)
    await fleet.step(1, poll=True)
    await look(a, b)
    await fleet.step(200, poll=True)  # due in 699 s: not yet within the lead
    await look(a, b)
    assert kinds(delivered(out), NoticeKind.AT_RISK) == []
    await fleet.step(150, poll=True)  # due in 549 s: within the lead
    await look(a, b)
    (note,) = kinds(delivered(out), NoticeKind.AT_RISK)
    assert note["key"] == risk_key("backup", due) and note["at"] == due
    assert note["facts"]["cause"] == MissCause.OWNER_NOT_RUNNING
    assert note["facts"]["deviceState"] == OwnerState.NOT_RUNNING
    assert "will be missed as things stand" in note["text"] and "(in 9 min)" in note["text"]
    assert note["fix"].startswith("start anyrtd on")
    assert NOTICED_FIELD not in (await fleet.record("backup"))  # its mark is a record
    assert a.daemon.places is not None
    marks, _ = await fleet.user.query(a.daemon.places.notices, filter={"triggerId": "backup"})
    assert [(m["id"], m["kind"]) for m in marks] == [(mark_id(note["key"]), NoticeKind.AT_RISK)]

    await fleet.activate(b)  # the role moves to B and back: nothing is said again
    for _ in range(4):
        await fleet.step(5, poll=True)
        await look(a, b)
    assert b.daemon.gate.verdict == "active" and b.daemon.fence.may_claim(fleet.clock.now())
    await fleet.activate(a)
    for _ in range(4):
        await fleet.step(5, poll=True)
        await look(a, b)
    assert a.daemon.gate.verdict == "active"
    assert len(kinds(delivered(out), NoticeKind.AT_RISK)) == 1
    assert len(kinds(await chat_notices(fleet), NoticeKind.AT_RISK, "notice")) == 1

    await c.restart()  # the device comes back before the occurrence is due
    for _ in range(3):
        await fleet.step(10, poll=True)
        await look(a, b)
    assert fleet.clock.now() < due
    (over,) = kinds(delivered(out), NoticeKind.AT_RISK_OVER)
    assert over["thread"] == note["key"] and over["facts"]["outcome"] == "cleared"
    assert "no longer at risk" in over["text"] and "is back (standby)" in over["why"]
    said = await chat_notices(fleet)
    (reply,) = kinds(said, NoticeKind.AT_RISK_OVER, "notice")
    assert reply["replyTo"] == message_id(note["key"])
    for _ in range(3):
        await fleet.step(10, poll=True)
        await look(a, b)
    assert len(kinds(delivered(out), NoticeKind.AT_RISK_OVER)) == 1
    assert len(kinds(delivered(out), NoticeKind.AT_RISK)) == 1


async def test_the_notice_before_the_miss_is_off_by_default(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "notices"
    out.mkdir()
    a = await node(fleet, 1, out)  # chat and command on, at_risk left as it is
    await fleet.put(
        "gone",
        kind="once",
        spec={"at": fleet.clock.now() + 60},
        program="test:ok@v1",
        owner="12D3KooWgone",
    )
    for _ in range(3):
        await fleet.step(5)
        await look(a)
    assert a.daemon.port.agenda(1.0).occurrences[0].at_risk  # at risk: the registry lacks it
    assert kinds(delivered(out), NoticeKind.AT_RISK) == []


# --------------------------------------------------------------------------- pure

NOW = 1_800_000_000.0
AT = NOW + 300
C = "12D3KooWccc"


def defn(**fields: Any) -> TriggerDef:
    record = {
        "id": "backup",
        "kind": "once",
        "spec": {"at": AT},
        "program": "test:ok@v1",
        "owner": C,
        "enabled": True,
        **fields,
    }
    parsed = parse_record(record)
    assert isinstance(parsed, TriggerDef)
    return parsed


RUNNING = agenda.Owner(C, C, OwnerState.STANDBY)
MISSED = Missed(
    "backup",
    C,
    1,
    False,
    [Occurrence(AT, MissCause.OWNER_NOT_RUNNING, "device C not running: it has ...", None, {})],
    AT,
    "e",
)

# (what, the definition, at risk now, now, the outcome or None while still open)
OUTCOMES: list[tuple[str, TriggerDef | None, bool, float, str | None]] = [
    ("still at risk before its time", defn(), True, NOW, None),
    ("the device came back before its time", defn(), False, NOW, "cleared"),
    ("due, within the grace: still open", defn(), False, AT + 10, None),
    ("a grace after its time without a run", defn(), False, AT + 61, "missed"),
    ("it ran", defn(lastRunAt=AT + 0.2), False, AT + 5, "ran"),
    ("disabled by hand since", defn(enabled=False), False, NOW, "gone"),
    ("deleted since", None, False, NOW, "gone"),
    (
        "auto-disabled: still at risk, not gone",
        defn(enabled=False, lastStatus=LastStatus.AUTO_DISABLED),
        True,
        NOW,
        None,
    ),
]


@pytest.mark.parametrize(
    ("what", "d", "at_risk", "now", "outcome"), OUTCOMES, ids=[o[0] for o in OUTCOMES]
)
def test_what_became_of_an_occurrence_at_risk(
    what: str, d: TriggerDef | None, at_risk: bool, now: float, outcome: str | None
) -> None:
    w = Watching(risk_key("backup", AT), "backup", AT, C)
    n = risk_over(w, d, at_risk=at_risk, owner=RUNNING, missed=MISSED, now=now, grace_s=60.0)
    if outcome is None:
        assert n is None
        return
    assert n is not None
    assert n.kind == NoticeKind.AT_RISK_OVER and n.thread == w.key
    assert n.facts["outcome"] == outcome
    if outcome == "missed":
        assert n.why == MISSED.last.text and n.fix == "anyrtd triggers why backup"
