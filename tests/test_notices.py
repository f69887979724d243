"""Notices on real daemons, a real devserver and a real notice command: one per event, sent
by the active device only, never repeated when the role moves (docs/notices.md).

The fleet (tests/fleet.py) runs each device's daemon in this process on one fake clock; each
test takes the notices' passes itself (`Notices.step`), so nothing waits on a bare sleep.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet, Node

from anyrtd.config import CommandProgram, NoticeSettings
from anyrtd.notices import NOTICED_FIELD, mark_id, message_id
from anyrtd.vocab import MissCause, NoticeKind

pytestmark = pytest.mark.process  # the notice command is a real process

GRACE_S = 30.0


def command(out: Path) -> CommandProgram:
    """A notice command that keeps each notice it is given in a file of `out`."""
    script = (
        "import sys, uuid, pathlib; "
        f"pathlib.Path({str(out)!r}, uuid.uuid4().hex + '.json')"
        ".write_bytes(sys.stdin.buffer.read())"
    )
    return CommandProgram(argv=(sys.executable, "-c", script))


async def node(fleet: Fleet, index: int, out: Path, **settings: Any) -> Node:
    """Boot a device whose notices go to the general chat and to the command."""
    n = Node(fleet, index)
    notices = NoticeSettings(chat=True, command=command(out), **settings)
    n.config = replace(n.config, missed_grace_s=GRACE_S, notices=notices, takeover_hold_s=10.0)
    n.daemon = n.make_daemon()
    fleet.nodes.append(n)
    await n.boot()
    return n


def delivered(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


async def chat_notices(fleet: Fleet) -> list[dict[str, Any]]:
    return [m for m in await fleet.messages() if m.get("notice")]


async def look(*nodes: Node) -> None:
    for n in nodes:
        if n.daemon.db is not None:
            await n.daemon.notices.step()


@pytest.mark.devices(3)
async def test_a_silent_owner_makes_one_notice_and_a_role_move_repeats_none(
    fleet: Fleet, tmp_path: Path
) -> None:
    out = tmp_path / "notices"
    out.mkdir()
    a = await node(fleet, 1, out)
    b = await node(fleet, 2, out)
    c = await fleet.node(3)  # the owner: no notices configured there
    await fleet.step(1, poll=True)
    await fleet.put("beat", kind="cron", spec={"every_s": 10}, program="test:ok@v1", owner=c.me)
    for _ in range(3):
        await fleet.step(10)
    assert (await fleet.record("beat"))["lastRunAt"] is not None
    await look(a, b)
    assert delivered(out) == [] and await chat_notices(fleet) == []

    await c.stop()
    await fleet.step(GRACE_S + 15, poll=True)  # two occurrences are a grace old now
    await look(a, b)
    notes = delivered(out)
    assert len(notes) == 1, notes
    note = notes[0]
    assert note["kind"] == NoticeKind.MISSED and note["triggerId"] == "beat"
    assert note["facts"]["cause"] == MissCause.OWNER_NOT_RUNNING
    assert "not running" in note["why"] and c.me in note["why"]
    assert note["fix"].startswith("start anyrtd on")
    said = await chat_notices(fleet)
    assert [m["id"] for m in said] == [message_id(note["key"])]
    assert said[0]["agent"] == "bao" and "Fix: " in said[0]["text"]
    assert NOTICED_FIELD not in (await fleet.record("beat"))  # its mark is a record of its own
    assert a.daemon.places is not None
    marks, _ = await fleet.user.query(a.daemon.places.notices, filter={"key": note["key"]})
    assert [(m["id"], m["kind"], m["triggerId"]) for m in marks] == [
        (mark_id(note["key"]), NoticeKind.MISSED, "beat")
    ]

    for _ in range(3):  # more occurrences missed: the same episode, no new notice
        await fleet.step(10, poll=True)
        await look(a, b)
    assert len(delivered(out)) == 1 and len(await chat_notices(fleet)) == 1

    await fleet.activate(b)
    await fleet.step(1, poll=True)
    assert b.daemon.gate.verdict == "active" and a.daemon.gate.verdict == "standby"
    for _ in range(4):  # past B's takeover hold: it may make notices now
        await fleet.step(5, poll=True)
        await look(a, b)
    assert b.daemon.fence.may_claim(fleet.clock.now())
    await fleet.activate(a)
    for _ in range(4):
        await fleet.step(5, poll=True)
        await look(a, b)
    assert a.daemon.gate.verdict == "active"
    assert len(delivered(out)) == 1 and len(await chat_notices(fleet)) == 1

    answer = await a.daemon.port.missed("beat")
    assert answer.missed is not None and answer.missed.last.cause == MissCause.OWNER_NOT_RUNNING


async def test_an_auto_disable_and_a_failed_once_each_make_one_notice(
    fleet: Fleet, tmp_path: Path
) -> None:
    out = tmp_path / "notices"
    out.mkdir()
    a = await node(fleet, 1, out)
    await fleet.put(
        "flaky",
        kind="cron",
        spec={"every_s": 60},
        program="test:fail@v1",
        owner=a.me,
        maxConsecutiveFailures=2,
    )
    at = fleet.clock.now() + 30
    await fleet.put("shot", kind="once", spec={"at": at}, program="test:fail@v1", owner=a.me)
    for _ in range(4):
        await fleet.step(40, poll=True)
        await look(a)
    record = await fleet.record("flaky")
    assert record["enabled"] is False and record["lastStatus"] == "auto_disabled"
    for _ in range(3):
        await fleet.step(5, poll=True)
        await look(a)
    kinds = sorted((n["kind"], n["triggerId"]) for n in delivered(out))
    assert kinds == [(NoticeKind.AUTO_DISABLED, "flaky"), (NoticeKind.ONCE_FAILED, "shot")]
    assert len(await chat_notices(fleet)) == 2
    by_kind = {n["kind"]: n for n in delivered(out)}
    assert by_kind[NoticeKind.AUTO_DISABLED]["fix"] == "anyrtd triggers enable flaky"


async def test_a_failing_command_is_tried_again_a_bounded_number_of_times(
    fleet: Fleet, tmp_path: Path
) -> None:
    tries = tmp_path / "tries"
    tries.mkdir()
    script = (
        "import sys, uuid, pathlib; "
        f"pathlib.Path({str(tries)!r}, uuid.uuid4().hex).write_text('x'); sys.exit(3)"
    )
    a = Node(fleet, 1)
    notices = NoticeSettings(command=CommandProgram(argv=(sys.executable, "-c", script)), retries=2)
    a.config = replace(a.config, notices=notices)
    a.daemon = a.make_daemon()
    fleet.nodes.append(a)
    await a.boot()
    await fleet.put("shot", kind="once", spec={"at": fleet.clock.now() + 5}, program="test:fail@v1")
    await fleet.step(10, poll=True)
    for _ in range(8):
        await look(a)
        await fleet.step(70, poll=True)  # past any wait between tries
    assert len(list(tries.iterdir())) == 3  # the first try and two more
    assert await chat_notices(fleet) == []  # the chat channel is off


async def test_a_write_set_aside_makes_one_notice_on_its_own_device(
    fleet: Fleet, tmp_path: Path
) -> None:
    out = tmp_path / "notices"
    out.mkdir()
    a = await node(fleet, 1, out)
    b = await node(fleet, 2, out)  # standby: it makes notices of its own writes only
    await fleet.step(1, poll=True)
    assert b.daemon.gate.verdict == "standby"
    await fleet.put("plain", kind="cron", spec={"every_s": 3600}, program="test:ok@v1", owner=b.me)
    await fleet.step(1, poll=True)
    b.daemon.unit.write_trigger("plain", {"score": float("nan")})  # no server takes a NaN
    await b.daemon.unit.commit(fleet.clock.now())
    await b.daemon.drain_outbox()
    await look(a, b)
    await look(a, b)
    notes = delivered(out)
    assert [n["kind"] for n in notes] == [NoticeKind.SET_ASIDE], notes
    assert notes[0]["facts"]["device"] == b.me and notes[0]["fix"] == "anyrtd doctor"
    assert len(await chat_notices(fleet)) == 1


async def test_a_stall_skip_makes_one_notice_on_the_device_that_skipped(
    fleet: Fleet, tmp_path: Path
) -> None:
    out = tmp_path / "notices"
    out.mkdir()
    a = await node(fleet, 1, out)
    b = await node(fleet, 2, out)  # standby: only it knows what its own daemon skipped
    await fleet.step(1, poll=True)
    assert b.daemon.gate.verdict == "standby"
    await fleet.put("beat", kind="cron", spec={"every_s": 10}, program="test:ok@v1", owner=b.me)
    for _ in range(2):
        await fleet.step(10, poll=True)
    entry = b.daemon.registry.get("beat")
    assert entry is not None and entry.row.next_fire is not None
    due = entry.row.next_fire
    # As the firing finds it after a stop: re-armed past it, the occurrence came 20 s late.
    b.daemon.registry.arm(entry, due)
    assert b.daemon.firing.missed(entry, due, 20.0)
    for _ in range(5):  # it runs on after the stall, a grace passes
        await fleet.step(10, poll=True)
        await look(a, b)
    notes = delivered(out)
    assert [(n["kind"], n["facts"]["cause"]) for n in notes] == [
        (NoticeKind.MISSED, MissCause.STALL_SKIP)
    ], notes
    assert notes[0]["key"].startswith(f"{NoticeKind.MISSED}:beat:skipped:")
    assert "skipped it" in notes[0]["why"]
    answer = await b.daemon.port.missed("beat")
    assert answer.missed is not None and answer.missed.last.cause == MissCause.STALL_SKIP
    for _ in range(2):
        await fleet.step(10, poll=True)
        await look(a, b)
    assert len(delivered(out)) == 1 and len(await chat_notices(fleet)) == 1


async def test_a_pass_with_nothing_new_asks_the_mirror_nothing(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two queries each tick (writes set aside, notices due) were most of what an idle
    # daemon's CPU grew by since the notices came.
    out = tmp_path / "notices"
    out.mkdir()
    a = await node(fleet, 1, out)
    await fleet.put("plain", kind="cron", spec={"every_s": 3600}, program="test:ok@v1", owner=a.me)
    await fleet.step(1, poll=True)
    await look(a)  # the first pass reads what is due
    db = a.daemon.db
    assert db is not None
    asked: list[object] = []
    real = db.call

    async def counted(fn: Any) -> Any:
        asked.append(fn)
        return await real(fn)

    monkeypatch.setattr(db, "call", counted)
    await look(a)
    await look(a)
    assert asked == []
    a.daemon.unit.write_trigger("plain", {"score": float("nan")})  # no server takes a NaN
    await a.daemon.unit.commit(fleet.clock.now())
    await a.daemon.drain_outbox()
    asked.clear()
    await look(a)  # a write set aside: read, and its notice made and delivered
    assert asked
    assert [n["kind"] for n in delivered(out)] == [NoticeKind.SET_ASIDE]
    asked.clear()
    await look(a)
    assert asked == []


async def test_past_the_hourly_limit_notices_wait_their_turn(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "notices"
    out.mkdir()
    a = await node(fleet, 1, out, per_hour=1)
    at = fleet.clock.now() + 5
    for rid in ("shot-1", "shot-2"):
        await fleet.put(rid, kind="once", spec={"at": at}, program="test:fail@v1", owner=a.me)
    await fleet.step(10, poll=True)
    for _ in range(3):
        await look(a)
        await fleet.step(60, poll=True)
    assert [n["triggerId"] for n in delivered(out)] == ["shot-1"]
    for _ in range(30):  # an hour later, the second one goes out
        await fleet.step(120, poll=True)
        await look(a)
    assert sorted(n["triggerId"] for n in delivered(out)) == ["shot-1", "shot-2"]
