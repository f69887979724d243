"""The reconcile's lifecycle rules as table tests: records and a registry in, a plan out."""

from __future__ import annotations

from typing import Any

import pytest

from anyrtd.model import Malformed, TriggerDef, parse_record
from anyrtd.reconcile import (
    Action,
    Adopt,
    Confirm,
    Context,
    EntryView,
    Evict,
    Mark,
    Refresh,
    Skip,
    Toggle,
    Track,
    reconcile,
)

ME = "12D3KooWMe"
OTHER = "12D3KooWOther"
NOW = 1_800_000_000.0


def rec(rid: str = "t", **fields: Any) -> TriggerDef | Malformed:
    base: dict[str, Any] = {
        "id": rid,
        "kind": "cron",
        "spec": {"cron": "0 8 * * *"},
        "program": "agent:remind@v1",
        "owner": ME,
        "_v": 1,
    }
    base.update(fields)
    return parse_record(base)


def view(r: TriggerDef | Malformed, **kw: Any) -> EntryView:
    assert isinstance(r, TriggerDef)
    values: dict[str, Any] = {
        "fingerprint": r.fingerprint,
        "enabled": r.enabled,
        "marker": None,
        "claimed_at": None,
    }
    values.update(kw)
    return EntryView(**values)


def plan(
    r: TriggerDef | Malformed | None,
    entry: EntryView | None = None,
    *,
    active: bool = True,
    pending: frozenset[str] = frozenset(),
    now: float = NOW,
    confirm_after: float = 5.0,
    rid: str = "t",
) -> list[Action]:
    records = {} if r is None else {rid: r}
    registry = {} if entry is None else {rid: entry}
    ctx = Context(peer_id=ME, active=active, now=now, confirm_after=confirm_after)
    return reconcile([rid], records, registry, ctx, pending)


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_a_record_pinned_here_is_adopted_without_a_claim() -> None:
    actions = plan(rec())
    assert actions == [Adopt(rec(), claim=False)]  # type: ignore[arg-type]


@pytest.mark.parametrize("owner", ["", "anyrt-4242"])
def test_an_unassigned_record_is_claimed_by_the_active_device(owner: str) -> None:
    r = rec(owner=owner)
    assert plan(r, active=True) == [Adopt(r, claim=True)]  # type: ignore[arg-type]


@pytest.mark.parametrize("owner", ["", "anyrt-4242"])
def test_a_standby_device_claims_nothing(owner: str) -> None:
    assert plan(rec(owner=owner), active=False) == []


def test_a_standby_device_lets_go_of_a_reassigned_entry() -> None:
    r = rec(owner="")
    assert plan(r, view(r), active=False) == [Evict("t", "unassigned")]


def test_a_standby_device_still_adopts_its_pins() -> None:
    assert kinds(plan(rec(), active=False)) == ["Adopt"]


def test_a_foreign_pinned_record_is_left_alone() -> None:
    assert plan(rec(owner=OTHER)) == []


def test_a_repinned_entry_is_evicted() -> None:
    r = rec(owner=OTHER)
    assert plan(r, view(rec())) == [Evict("t", "repinned")]


def test_a_deleted_record_is_evicted() -> None:
    assert plan(None, view(rec())) == [Evict("t", "deleted")]


def test_a_deleted_record_never_seen_is_nothing() -> None:
    assert plan(None) == []


def test_a_definition_edit_refreshes_the_entry() -> None:
    old, new = rec(), rec(spec={"cron": "0 9 * * *"}, _v=2)
    assert plan(new, view(old)) == [Refresh(new)]  # type: ignore[arg-type]


def test_an_enabled_flip_applies_in_place() -> None:
    old, new = rec(), rec(enabled=False, _v=2)
    assert plan(new, view(old)) == [Toggle(new, False)]  # type: ignore[arg-type]


def test_an_edit_that_also_re_enables_refreshes_and_resets_the_breaker() -> None:
    old, new = rec(enabled=False), rec(spec={"cron": "0 9 * * *"}, _v=2)
    assert plan(new, view(old)) == [Refresh(new), Toggle(new, True)]  # type: ignore[arg-type]


def test_a_rollup_write_only_tracks_the_record() -> None:
    old, new = rec(), rec(lastRunAt=NOW, lastStatus="ok", runCount=3, _v=2)
    assert plan(new, view(old)) == [Track(new)]  # type: ignore[arg-type]


def test_a_malformed_record_is_skipped_with_its_reason_and_version() -> None:
    bad = rec(kind="weekly", _v=7)
    actions = plan(bad)
    assert len(actions) == 1 and isinstance(actions[0], Skip)
    assert actions[0].version == 7 and "weekly" in actions[0].reason


def test_an_entry_whose_record_turns_malformed_is_evicted_and_skipped() -> None:
    assert kinds(plan(rec(program=5, _v=2), view(rec()))) == ["Evict", "Skip"]


@pytest.mark.parametrize(
    "rid", ["rollup", "extraction", "linkgen", "evolution", "decay", "reflection"]
)
def test_standing_built_in_records_are_ignored(rid: str) -> None:
    assert plan(rec(rid, owner=""), rid=rid) == []


def test_an_invalid_spec_is_adopted_and_marked() -> None:
    r = rec(spec={"cron": "0 0 30 2 *"})
    assert plan(r) == [Adopt(r, claim=False), Mark("t", "invalid_spec")]  # type: ignore[arg-type]


def test_an_unsupported_source_is_marked() -> None:
    r = rec(kind="event", spec={"dataset": "mail", "objectId": "o"})
    assert Mark("t", "unsupported_source") in plan(r)


def test_a_marker_already_shown_is_not_written_again() -> None:
    r = rec(spec={"cron": "0 0 30 2 *"}, lastStatus="invalid_spec")
    assert plan(r, view(r, marker="invalid_spec")) == [Track(r)]  # type: ignore[arg-type]


def test_a_fixed_spec_clears_the_marker() -> None:
    broken = rec(spec={"cron": "0 0 30 2 *"}, lastStatus="invalid_spec")
    fixed = rec(spec={"cron": "0 0 28 2 *"}, lastStatus="invalid_spec", _v=2)
    assert plan(fixed, view(broken, marker="invalid_spec")) == [
        Refresh(fixed),  # type: ignore[arg-type]
        Mark("t", None),
    ]


def test_a_disabled_invalid_trigger_carries_no_marker() -> None:
    r = rec(spec={"cron": "0 0 30 2 *"}, enabled=False, lastStatus="invalid_spec")
    assert Mark("t", None) in plan(r, view(r, marker="invalid_spec"))


def test_a_claim_is_not_confirmed_while_the_stamp_is_unseen() -> None:
    r = rec()
    entry = view(r, claimed_at=NOW - 60)
    assert plan(r, entry, pending=frozenset({"t"})) == [Track(r)]  # type: ignore[arg-type]


def test_a_claim_is_not_confirmed_before_a_full_tick_has_passed() -> None:
    r = rec()
    assert plan(r, view(r, claimed_at=NOW - 1)) == [Track(r)]  # type: ignore[arg-type]


def test_a_claim_still_standing_after_a_tick_is_confirmed() -> None:
    r = rec()
    assert plan(r, view(r, claimed_at=NOW - 6)) == [Confirm(r)]  # type: ignore[arg-type]


def test_a_claim_lost_to_another_device_is_evicted() -> None:
    assert plan(rec(owner=OTHER), view(rec(), claimed_at=NOW - 1)) == [Evict("t", "repinned")]


def test_the_plan_covers_only_the_ids_asked_for() -> None:
    records = {"a": rec("a"), "b": rec("b")}
    ctx = Context(peer_id=ME, active=True, now=NOW)
    assert [a.defn.id for a in reconcile(["b"], records, {}, ctx)] == ["b"]  # type: ignore[union-attr]
