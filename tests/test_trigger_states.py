"""One state per trigger, the same on every surface: a table over every reason `why` knows.

For each cause, the facts `why` gathers and the facts a list has at hand (anyrtd.why's
`list_facts`: no run history, no devices registry) give the same state, reason and
severity in `GET /triggers/:id/why` (and `anyrtd triggers why`), in the control API's
trigger view (what the status page draws), and in `anyrtd triggers list`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from anyrtd.cli.triggers import triggers_table, why_text
from anyrtd.control.views import trigger_view, why_view
from anyrtd.missed import Missed, Occurrence
from anyrtd.model import Malformed, TriggerDef, chain_of, parse_record
from anyrtd.registry import Entry, Registry, new_row
from anyrtd.vocab import (
    Cause,
    LastStatus,
    Marker,
    MissCause,
    Severity,
    StateReason,
    TriggerState,
    Verdict,
)
from anyrtd.why import LIVE, Here, WhyFacts, explain, list_facts

NOW = 1_800_000_000.0
ME = "12D3KooWme"
OTHER = "12D3KooWother"


def defn(**fields: Any) -> TriggerDef:
    record = {
        "id": "t1",
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


def entry(d: TriggerDef, *, running: int = 0, **row: Any) -> Entry:
    e = Entry(d, new_row(d, NOW, claimed=False))
    e.row.next_fire = NOW + 3600 if d.kind != "event" else None
    for key, value in row.items():
        setattr(e.row, key, value)
    if running:
        registry = Registry()
        registry.put(e)
        registry.running[d.id] = running
    return e


@dataclass
class Case:
    """The facts of one trigger; what every surface must show for it."""

    parsed: TriggerDef | Malformed | None
    entry: Entry | None
    expect: tuple[TriggerState, str | None, Severity]
    peer: str | None = ME
    here: Here = field(default_factory=Here)
    more: dict[str, Any] = field(default_factory=dict)
    """Facts only `why` gathers (run history, devices registry, tombstones)."""
    tid: str = "t1"


def _missed() -> Missed:
    o = Occurrence(NOW - 60, MissCause.UNKNOWN, "it did not run", None, {})
    return Missed("t1", ME, 1, False, (o,), NOW - 60, "episode-1")


ONCE_RAN = defn(kind="once", spec={"at": NOW - 100}, enabled=False, lastRunAt=NOW - 99)
AUTO = defn(enabled=False, lastStatus=LastStatus.AUTO_DISABLED, consecutiveFailures=3)
BAD_SPEC = defn(spec={"cron": "61 * * * *"})
BUILTIN = defn(id="extraction", spec={"cron": "*/30 * * * *"}, program="agent:extraction@v1")
A = defn()
CHAIN = defn(kind="event", spec={"dataset": "agent_runs", "filter": {"triggerId": "up"}})
FREE = defn(owner="")
OK, BUSY, QUIET, WARN, BAD = Severity.OK, Severity.BUSY, Severity.QUIET, Severity.WARN, Severity.BAD
S, R = TriggerState, StateReason
NOT_HERE = Here(installed=lambda _program: False)

CASES: dict[str, Case] = {
    # the record
    Cause.UNKNOWN: Case(None, None, (S.UNKNOWN, None, BAD)),
    Cause.TOMBSTONED: Case(None, None, (S.DELETED, None, QUIET), more={"tombstoned": True}),
    Cause.MALFORMED: Case(Malformed("t1", "kind is missing", 1), None, (S.MALFORMED, None, BAD)),
    # this device
    Cause.NO_PEER_ID: Case(FREE, None, (S.UNASSIGNED, R.NO_PEER_ID, WARN), peer=None),
    Cause.DEVICE_PRUNED: Case(
        A, entry(A), (S.CANNOT_RUN, R.DEVICE_PRUNED, BAD), here=Here(verdict=Verdict.PRUNED)
    ),
    # where it belongs
    Cause.PINNED_ELSEWHERE: Case(defn(owner=OTHER), None, (S.PINNED_ELSEWHERE, None, QUIET)),
    Cause.STANDBY: Case(FREE, None, (S.UNASSIGNED, R.STANDBY, QUIET), here=Here(Verdict.STANDBY)),
    Cause.TAKEOVER_HOLD: Case(
        FREE, None, (S.UNASSIGNED, R.TAKEOVER_HOLD, BUSY), here=Here(may_claim=False)
    ),
    # its definition
    Cause.NOT_ADOPTED: Case(FREE, None, (S.UNASSIGNED, R.NOT_ADOPTED, BUSY)),
    Cause.CLAIMING: Case(
        FREE, entry(FREE, claimed_at=NOW - 1, next_fire=None), (S.CLAIMING, None, BUSY)
    ),
    Cause.MARKER: Case(
        BAD_SPEC,
        entry(BAD_SPEC, marker=Marker.INVALID_SPEC, next_fire=None),
        (S.CANNOT_RUN, Marker.INVALID_SPEC, BAD),
    ),
    "marker of a built-in": Case(
        BUILTIN,
        entry(BUILTIN, marker=Marker.NOT_INSTALLED, next_fire=None),
        (S.UNAVAILABLE, Marker.NOT_INSTALLED, QUIET),
        tid="extraction",
    ),
    Cause.NOT_INSTALLED: Case(A, entry(A), (S.CANNOT_RUN, R.NOT_INSTALLED, BAD), here=NOT_HERE),
    # its state
    Cause.AUTO_DISABLED: Case(AUTO, entry(AUTO, enabled=False), (S.AUTO_DISABLED, None, BAD)),
    Cause.CONSUMED: Case(
        ONCE_RAN,
        entry(ONCE_RAN, enabled=False, consumed=True, next_fire=None),
        (S.CONSUMED, None, QUIET),
    ),
    Cause.DISABLED: Case(
        defn(enabled=False), entry(defn(enabled=False), enabled=False), (S.DISABLED, None, QUIET)
    ),
    Cause.NO_NEXT_FIRE: Case(A, entry(A, next_fire=None), (S.IDLE, R.NO_NEXT_FIRE, WARN)),
    # notes that do not stop it
    Cause.FAILING: Case(
        defn(consecutiveFailures=2), entry(defn(), consecutive_failures=2), (S.SCHEDULED, None, OK)
    ),
    Cause.RUNNING: Case(A, entry(A, running=1), (S.RUNNING, None, BUSY)),
    Cause.OVERLAP_SKIPS: Case(A, entry(A), (S.SCHEDULED, None, OK), more={"overlap_skips": 3}),
    Cause.MISSED: Case(A, entry(A), (S.SCHEDULED, None, OK), more={"missed": _missed()}),
    Cause.CHAIN: Case(
        CHAIN,
        entry(CHAIN),
        (S.LISTENING, None, OK),
        more={"chain": chain_of(CHAIN), "last_fired_by": "up-1"},
    ),
    "a chain in a loop": Case(
        CHAIN,
        entry(CHAIN, marker=Marker.INVALID_SPEC),
        (S.CANNOT_RUN, Marker.INVALID_SPEC, BAD),
        more={"chain": chain_of(CHAIN), "chain_loop": ("t1", "up", "t1")},
    ),
    "listening": Case(
        ev := defn(kind="event", spec={"dataset": "chat_messages", "objectId": "c"}),
        entry(ev),
        (S.LISTENING, None, OK),
    ),
}


def test_the_table_covers_every_reason_why_knows() -> None:
    assert set(Cause) <= set(CASES)


def gathered(case: Case) -> WhyFacts:
    """Return the facts as `why` gathers them: the list's, and the devices registry and the
    run history besides."""
    base = list_facts(
        case.tid, case.entry, case.parsed, case.peer, case.here, NOW,
        standing=case.tid == "extraction",
    )  # fmt: skip
    more = {"devices": {ME: LIVE, OTHER: LIVE}, "winner": ME, "spec_fires": (NOW + 60,)}
    return replace(base, **{**more, **case.more})


@pytest.mark.parametrize("name", list(CASES))
def test_list_control_api_and_why_show_the_same_state(name: str) -> None:
    case = CASES[name]
    answer = explain(gathered(case))
    if name == Cause.CLAIMING:
        assert not [r for r in answer.reasons if r.blocking] and answer.fires
    if name in CASES and name in {c.value for c in Cause}:
        assert Cause(name) in {r.cause for r in answer.reasons}, answer.reasons
    why = why_view(answer)
    expect = case.expect
    assert (why["state"], why["stateReason"], why["severity"]) == expect
    text = why_text(why, ME, NOW)
    word = f"{expect[0]} ({expect[1]})" if expect[1] else str(expect[0])
    assert f"\nstate: {word}" in text, text
    if case.parsed is None and case.entry is None:
        return  # no record: no row in a list, only `why` answers
    view = trigger_view(case.tid, case.entry, case.parsed, None, case.peer, NOW, here=case.here)
    assert (view["state"], view["stateReason"], view["severity"]) == expect
    table = triggers_table([view], ME, NOW, "next").splitlines()
    assert "STATE" in table[0].split()
    assert f"  {word}  " in table[1], table
    if expect[2] in (BAD, QUIET):
        # a trigger that cannot (or does not) fire here shows no next fire in the list
        assert table[1].split(f"  {word}  ", 1)[1].split()[0] == "-", table


def test_a_program_not_installed_here_is_not_shown_scheduled() -> None:
    d = defn(program="mine:backup@v1")
    view = trigger_view("t1", entry(d), d, None, ME, NOW, here=NOT_HERE)
    assert view["nextFire"] is not None  # the registry's own fact: it is armed
    assert view["state"] == TriggerState.CANNOT_RUN and view["stateReason"] == "not_installed"
    row = triggers_table([view], ME, NOW, "next").splitlines()[1]
    assert "scheduled" not in row and "cannot_run (not_installed)" in row
