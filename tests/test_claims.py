"""Claims across replicas: the term read from the registry, the takeover hold, the fencing
tokens and the stand-down beat, as table tests of `anyrtd/claims.py` and of the reconcile."""

from __future__ import annotations

from typing import Any

import pytest

from anyrtd.claims import (
    CLAIM_FIELD,
    HANDOFF_FIELD,
    Fence,
    Term,
    Token,
    claim_token,
    handoff_field,
    outranks,
    read_token,
    term_of,
)
from anyrtd.model import TriggerDef, parse_record
from anyrtd.reconcile import Adopt, Context, EntryView, Evict, reconcile
from anyrtd.vocab import CHAT_WATCH_PROGRAM

A, B, C = "12D3KooWA", "12D3KooWB", "12D3KooWC"
NOW = 1_800_000_000.0


def row(peer: str, seq: int | None = None, deleted: bool = False) -> tuple[str, bool, Any]:
    entry: dict[str, Any] = {"version": "1"}
    if seq is not None:
        entry["seq"] = seq
    return (peer, deleted, entry)


# the term, from the registry


@pytest.mark.parametrize(
    ("rows", "me", "winner", "expected"),
    [
        pytest.param(
            [row(A, 1), row(B), row(C)],
            A,
            A,
            Term(Token(1, A), None, False, Token(1, A), 1),
            id="the first holder has no predecessor",
        ),
        pytest.param(
            [row(A, 1), row(B, 2), row(C)],
            B,
            B,
            Term(Token(2, B), Token(1, A), True, Token(2, B), 2, others=((Token(1, A), True),)),
            id="the predecessor is the highest claim below the winner's",
        ),
        pytest.param(
            [row(A, 3), row(B, 2), row(C, 4)],
            A,
            C,
            Term(
                Token(4, C),
                Token(3, A),
                True,
                Token(3, A),
                4,
                others=((Token(2, B), True), (Token(3, A), True)),
            ),
            id="a standby device sees its own claim apart from the winner's",
        ),
        pytest.param(
            [row(A, 1, deleted=True), row(B, 2)],
            B,
            B,
            Term(Token(2, B), Token(1, A), False, Token(2, B), 2, others=((Token(1, A), False),)),
            id="a pruned predecessor is not live",
        ),
        pytest.param(
            [row(A), row(B)],
            A,
            None,
            Term(None, None, False, None, 0),
            id="nobody holds the role",
        ),
    ],
)
def test_the_term_is_read_from_the_registry_rows(
    rows: list[tuple[str, bool, Any]], me: str, winner: str | None, expected: Term
) -> None:
    assert term_of(rows, me, winner) == expected


# tokens


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"seq": 3, "peer": A, "at": NOW}, Token(3, A)),
        ({"seq": 3, "peer": A}, Token(3, A)),
        ({"seq": "3", "peer": A}, None),
        ({"seq": True, "peer": A}, None),
        ({"seq": 3, "peer": ""}, None),
        ("3", None),
        (None, None),
    ],
)
def test_a_token_is_read_only_from_a_well_formed_field(value: Any, expected: Token | None) -> None:
    assert read_token(value) == expected


def test_a_claim_counts_only_when_its_claimant_is_the_owner() -> None:
    claimed = {"id": "t", "owner": A, CLAIM_FIELD: {"seq": 2, "peer": A, "at": NOW}}
    assert claim_token(claimed) == Token(2, A)
    # A user repinned it to B: the old claim field stays, but it is a pin now, not a claim.
    assert claim_token({**claimed, "owner": B}) is None
    assert claim_token({"id": "t", "owner": ""}) is None


@pytest.mark.parametrize(
    ("mine", "other", "stands"),
    [
        (Token(2, B), Token(3, A), True),  # the earlier term claimed first: it stands
        (Token(3, A), Token(2, B), False),
        (Token(3, A), Token(3, B), True),  # same seq (a replicated registry): peer id breaks it
        (Token(3, A), None, False),
        (None, Token(3, A), False),
    ],
)
def test_the_lower_token_stands(mine: Token | None, other: Token | None, stands: bool) -> None:
    assert outranks(mine, other) is stands


# the takeover hold


def term(winner: Token | None, previous: Token | None = None, **kw: Any) -> Term:
    values: dict[str, Any] = {"previous_live": True, "mine": winner, "top": 0}
    values.update(kw)
    top = max([t.seq for t in (winner, previous, values["mine"]) if t is not None], default=0)
    values["top"] = max(values["top"], top)
    return Term(winner, previous, **values)


CHAT_WATCH = {"id": "chat-watch", "program": CHAT_WATCH_PROGRAM, "owner": ""}


def beat(token: Token, at: float = NOW) -> dict[str, Any]:
    return CHAT_WATCH | {handoff_field(token.peer): {**token._asdict(), "at": at}}


def test_a_first_holder_claims_at_once() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    assert fence.follow(True, term(Token(1, A)), NOW) is True  # claiming starts: reconcile all
    assert fence.may_claim(NOW)
    assert fence.claim_fields("t", NOW) == {CLAIM_FIELD: {"seq": 1, "peer": A, "at": NOW}}
    assert fence.mine == {"t": Token(1, A)}


def test_a_new_holder_claims_only_once_its_predecessors_beat_has_arrived() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW)
    assert not fence.may_claim(NOW)
    assert fence.follow(True, term(Token(2, B), Token(1, A)), NOW + 5) is False
    fence.note({"id": "x", "owner": A, CLAIM_FIELD: {"seq": 1, "peer": A, "at": NOW}})
    assert not fence.may_claim(NOW)  # a claim of the predecessor is no beat: more may follow
    fence.note(beat(Token(1, A)))
    assert fence.follow(True, term(Token(2, B), Token(1, A)), NOW + 6) is True
    assert fence.may_claim(NOW)
    assert fence.follow(True, term(Token(2, B), Token(1, A)), NOW + 7) is False  # once only


def test_a_beat_that_arrived_before_the_takeover_ends_the_hold_at_once() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.note(beat(Token(1, A)))
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW)
    assert fence.may_claim(NOW)


def test_an_older_beat_does_not_end_the_hold() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.note(beat(Token(1, A)))
    fence.follow(True, term(Token(3, C), Token(2, B)), NOW)
    assert not fence.may_claim(NOW)


def test_the_hold_ends_at_takeover_hold_s_without_a_beat() -> None:
    fence = Fence(hold_max_s=30, tick_s=1)
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW)
    assert fence.follow(True, term(Token(2, B), Token(1, A)), NOW + 29.9) is False
    assert fence.follow(True, term(Token(2, B), Token(1, A)), NOW + 30) is True
    assert fence.may_claim(NOW)


def test_after_a_hold_without_the_beat_claims_confirm_after_a_round_trip() -> None:
    fence = Fence(hold_max_s=30, tick_s=1)
    fence.sample_lag(
        [{"id": "y", "owner": C, CLAIM_FIELD: {"seq": 1, "peer": C, "at": NOW - 4}}], B, NOW
    )
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW)
    assert fence.confirm_after(1.0, NOW) == 1.0  # holding: nothing to confirm anyway
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW + 30)
    assert fence.confirm_after(1.0, NOW + 30) == 10.0  # 2 x 4 s of lag and 2 ticks
    # The predecessor's beat shows up late: the claims made before it still get their
    # round trip, the ones after it confirm at the usual pace.
    fence.note(beat(Token(1, A)))
    assert fence.confirm_after(1.0, NOW + 32) == 10.0
    assert fence.confirm_after(1.0, NOW + 41.9) == 10.0
    assert fence.confirm_after(1.0, NOW + 42) == 1.0


def test_the_slow_confirmation_lasts_one_more_bound_at_most() -> None:
    fence = Fence(hold_max_s=10, tick_s=1)
    fence.sample_lag(
        [{"id": "y", "owner": C, CLAIM_FIELD: {"seq": 1, "peer": C, "at": NOW - 4}}], B, NOW
    )
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW)
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW + 10)
    # Claims may meet a late claim of the predecessor until one more bound has passed;
    # the last of them still gets its round trip.
    assert fence.confirm_after(1.0, NOW + 29.9) == 10.0
    assert fence.confirm_after(1.0, NOW + 30) == 1.0


def test_a_hold_ended_by_the_beat_confirms_at_the_usual_pace() -> None:
    fence = Fence(hold_max_s=10, tick_s=1)
    fence.sample_lag(
        [{"id": "y", "owner": C, CLAIM_FIELD: {"seq": 1, "peer": C, "at": NOW - 4}}], B, NOW
    )
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW)
    fence.note(beat(Token(1, A)))
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW + 5)
    assert fence.confirm_after(1.0, NOW + 5) == 1.0


def test_a_gone_predecessor_is_waited_for_twice_the_measured_lag() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.note({"id": "y", "owner": C})
    fence.sample_lag(
        [{"id": "y", "owner": C, CLAIM_FIELD: {"seq": 1, "peer": C, "at": NOW - 3}}], B, NOW
    )
    assert fence.lag() == 3
    gone = term(Token(2, B), Token(1, A), previous_live=False)
    fence.follow(True, gone, NOW)
    assert fence.follow(True, gone, NOW + 5.9) is False
    assert fence.follow(True, gone, NOW + 6) is True


def test_without_a_lag_sample_a_gone_predecessor_is_waited_for_the_whole_bound() -> None:
    fence = Fence(hold_max_s=20, tick_s=1)
    gone = term(Token(2, B), Token(1, A), previous_live=False)
    fence.follow(True, gone, NOW)
    assert fence.follow(True, gone, NOW + 19) is False
    assert fence.follow(True, gone, NOW + 20) is True


def test_the_lag_is_sampled_from_other_devices_new_stamps_only() -> None:
    fence = Fence()
    own = {"id": "a", "owner": B, CLAIM_FIELD: {"seq": 2, "peer": B, "at": NOW - 9}}
    old = {"id": "b", "owner": A, CLAIM_FIELD: {"seq": 1, "peer": A, "at": NOW - 50}}
    fence.note(old)  # seen before: a later change of this record is about another field
    fresh = {"id": "c", "owner": A, CLAIM_FIELD: {"seq": 1, "peer": A, "at": NOW - 1.5}}
    fence.sample_lag([own, old, fresh], B, NOW)
    assert list(fence.lags) == [1.5]


def test_the_election_off_means_no_hold_and_no_token() -> None:
    fence = Fence()
    assert fence.follow(True, None, NOW) is True
    assert fence.may_claim(NOW)
    assert fence.claim_fields("t", NOW) == {}


def test_a_role_that_moved_and_came_back_between_polls_is_a_new_takeover() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.follow(True, term(Token(1, A)), NOW)
    # B held term 2 in between; A is active again under term 3 without a standby verdict.
    fence.follow(True, term(Token(3, A), Token(2, B)), NOW + 10)
    assert not fence.may_claim(NOW)
    assert fence.claim_fields("t", NOW) == {CLAIM_FIELD: {"seq": 3, "peer": A, "at": NOW}}


# the lease: a holder that cannot read the registry stops claiming


def test_a_holder_claims_only_within_its_lease_of_the_last_registry_read() -> None:
    fence = Fence(hold_max_s=60, tick_s=1, lease_s=3)
    fence.follow(True, term(Token(1, A), read_at=NOW), NOW)
    assert fence.may_claim(NOW + 3)
    assert fence.follow(True, term(Token(1, A), read_at=NOW), NOW + 3.5) is False
    assert not fence.may_claim(NOW + 3.5)
    # The registry answers again (still the winner): claiming resumes, all records again.
    assert fence.follow(True, term(Token(1, A), read_at=NOW + 4), NOW + 4) is True
    assert fence.may_claim(NOW + 4)


def test_without_a_lease_the_last_read_does_not_matter() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.follow(True, term(Token(1, A), read_at=NOW), NOW)
    assert fence.may_claim(NOW + 3600)


# the role has moved: a token above anything the registry showed


def test_a_token_newer_than_the_registry_knows_stops_claiming_until_it_catches_up() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.follow(True, term(Token(1, A)), NOW)
    fence.note({"id": "x", "owner": B, CLAIM_FIELD: {"seq": 2, "peer": B, "at": NOW}})
    assert not fence.may_claim(NOW)
    # The registry still answers with the old view (say its reads fail): still no claims.
    fence.follow(True, term(Token(1, A)), NOW + 1)
    assert not fence.may_claim(NOW)
    # It shows term 2 now, and this device wins again under term 3.
    fence.note(beat(Token(2, B)))
    fence.follow(True, term(Token(3, A), Token(2, B)), NOW + 2)
    assert fence.may_claim(NOW)


def test_a_token_the_registry_already_knows_does_not_stop_the_winner() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    # B (seq 2) was pruned; A is the winner again with its old seq 1.
    fence.follow(True, term(Token(1, A), None, top=2), NOW)
    fence.note({"id": "x", "owner": B, CLAIM_FIELD: {"seq": 2, "peer": B, "at": NOW}})
    assert fence.may_claim(NOW)


# the stand-down beat


def test_a_claim_is_defended_with_the_token_it_was_made_under() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.follow(True, term(Token(1, A)), NOW)
    fence.claim_fields("t", NOW)
    fence.follow(False, term(Token(2, B), Token(1, A), mine=Token(1, A)), NOW + 1)
    # B's later claim met A's on A's replica: A, standing by now, stamps its own again.
    fence.note({"id": "t", "owner": B, CLAIM_FIELD: {"seq": 2, "peer": B, "at": NOW}})
    assert fence.outranks("t")
    assert fence.claim_fields("t", NOW + 2) == {CLAIM_FIELD: {"seq": 1, "peer": A, "at": NOW + 2}}


def test_a_holder_that_stands_down_owes_one_beat_for_its_term() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.follow(True, term(Token(1, A)), NOW)
    assert fence.handoff_due(NOW) is None  # active: nothing owed yet
    fence.follow(False, term(Token(2, B), Token(1, A), mine=Token(1, A)), NOW + 1)
    due = {handoff_field(A): {"seq": 1, "peer": A, "at": NOW + 1, "covers": 1}}
    assert fence.handoff_due(NOW + 1) == due
    fence.follow(False, term(Token(2, B), Token(1, A), mine=Token(1, A)), NOW + 2)
    assert fence.handoff_due(NOW + 2) is None


def test_a_holder_still_on_hold_beats_at_once_for_its_own_claims_only() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW)
    moved = term(Token(3, C), Token(2, B), mine=Token(2, B))
    fence.follow(False, moved, NOW + 1)
    # A's claims may not have reached here yet: the beat covers no term beyond B's own.
    due = {handoff_field(B): {"seq": 2, "peer": B, "at": NOW + 1, "covers": 0}}
    assert fence.handoff_due(NOW + 1) == due
    assert fence.waiting is None  # standing by: no hold left to wait out


def test_a_beat_vouches_for_every_term_its_device_saw_covered() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW)
    fence.note(beat(Token(1, A)))
    fence.follow(True, term(Token(2, B), Token(1, A)), NOW + 1)  # the hold is over
    fence.follow(False, term(Token(3, C), Token(2, B), mine=Token(2, B)), NOW + 2)
    due = {handoff_field(B): {"seq": 2, "peer": B, "at": NOW + 2, "covers": 2}}
    assert fence.handoff_due(NOW + 2) == due


def test_the_hold_waits_for_every_earlier_holder_not_covered() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    earlier = ((Token(1, A), True), (Token(2, B), True))
    fence.follow(True, term(Token(3, C), Token(2, B), others=earlier), NOW)
    fence.note(CHAT_WATCH | {handoff_field(B): {"seq": 2, "peer": B, "at": NOW, "covers": 0}})
    fence.follow(True, term(Token(3, C), Token(2, B), others=earlier), NOW + 1)
    assert not fence.may_claim(NOW + 1)  # B vouches for its own claims, not for A's
    assert fence.waiting == Token(1, A)
    fence.note(beat(Token(1, A)))
    assert fence.follow(True, term(Token(3, C), Token(2, B), others=earlier), NOW + 2) is True
    assert fence.may_claim(NOW + 2)


def test_two_devices_on_hold_from_a_fast_flap_release_each_other_with_their_beats() -> None:
    a, b = Fence(hold_max_s=60, tick_s=1), Fence(hold_max_s=60, tick_s=1)
    # The role moved A (1) -> B (2) -> A (3) -> B (4) -> A (5) between polls: each device
    # saw itself take a term and never saw its predecessor stand down.
    a.follow(True, term(Token(1, A)), NOW)
    b.follow(True, term(Token(4, B), Token(3, A)), NOW + 1)
    a.follow(True, term(Token(5, A), Token(4, B)), NOW + 2)
    assert not a.may_claim(NOW + 2) and not b.may_claim(NOW + 2)
    # The role settles on A; B sees it at its next poll and beats at once.
    b.follow(False, term(Token(5, A), Token(4, B), mine=Token(4, B)), NOW + 3)
    sent = b.handoff_due(NOW + 3)
    assert sent is not None
    a.note(CHAT_WATCH | {"owner": A, **sent})
    assert a.follow(True, term(Token(5, A), Token(4, B)), NOW + 4) is True
    assert a.may_claim(NOW + 4)


def test_beats_of_two_devices_sent_in_any_order_both_stand() -> None:
    # The role went A (11) -> B (12) -> A (13): B stood down at once and beat for 12, while
    # A's beat for 11 was still on its way. The server merges a record's top-level fields
    # last writer wins: in one shared field A's older beat, arriving later, erased B's, and
    # A held its claims for takeover_hold_s waiting for it.
    a, b = Fence(hold_max_s=60, tick_s=1), Fence(hold_max_s=60, tick_s=1)
    a.follow(False, term(Token(12, B), Token(11, A), mine=Token(11, A)), NOW)
    b.follow(False, term(Token(13, A), Token(12, B), mine=Token(12, B)), NOW + 1)
    sent_a, sent_b = a.handoff_due(NOW), b.handoff_due(NOW + 1)
    assert sent_a is not None and sent_b is not None
    assert sent_a.keys().isdisjoint(sent_b.keys())
    for first, last in ((sent_a, sent_b), (sent_b, sent_a)):
        merged = CHAT_WATCH | first | last  # upsert merges the top-level fields sent
        seen = Fence(hold_max_s=60, tick_s=1)
        earlier = ((Token(11, A), True), (Token(12, B), True))
        seen.follow(True, term(Token(13, A), Token(12, B), others=earlier), NOW + 2)
        seen.note(merged)
        assert seen.follow(True, term(Token(13, A), Token(12, B), others=earlier), NOW + 3)
        assert seen.may_claim(NOW + 3)


@pytest.mark.parametrize(
    ("record", "beats"),
    [
        pytest.param(beat(Token(4, A)), {A: 4}, id="a device's own field"),
        pytest.param(
            CHAT_WATCH | {HANDOFF_FIELD: {"seq": 4, "peer": A, "at": NOW}},
            {A: 4},
            id="the plain field an earlier anyrtd wrote",
        ),
        pytest.param(
            CHAT_WATCH | {handoff_field(B): {"seq": 4, "peer": A, "at": NOW}},
            {},
            id="a beat in another device's field",
        ),
        pytest.param(
            {"id": "t", "program": "p", handoff_field(A): {"seq": 4, "peer": A, "at": NOW}},
            {},
            id="a record that is not the chat-watch",
        ),
        pytest.param(
            CHAT_WATCH | {handoff_field(A): {"seq": "4", "peer": A}, "handoffs": 3},
            {},
            id="malformed",
        ),
    ],
)
def test_the_beats_a_record_carries(record: dict[str, Any], beats: dict[str, int]) -> None:
    fence = Fence()
    fence.note(record)
    assert fence.beats == beats


def test_the_lag_is_sampled_from_another_devices_new_beat() -> None:
    fence = Fence()
    fence.note(beat(Token(1, A), at=NOW - 40))  # seen before: no sample when it shows again
    fence.sample_lag([beat(Token(1, A), at=NOW - 40) | beat(Token(3, C), at=NOW - 2)], B, NOW)
    fence.sample_lag([beat(Token(2, B), at=NOW - 7)], B, NOW)  # this device's own
    assert list(fence.lags) == [2.0]


def test_no_beat_over_a_later_one() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    fence.note(beat(Token(5, C)))
    fence.follow(False, term(Token(6, C), Token(5, C), mine=Token(2, A)), NOW)
    assert fence.handoff_due(NOW) is None


def test_a_device_that_never_held_its_claim_still_beats_for_it() -> None:
    fence = Fence(hold_max_s=60, tick_s=1)
    # A activated (seq 2) at the same moment as B (seq 3) and lost: its successor waits on 2.
    fence.follow(False, term(Token(3, B), Token(2, A), mine=Token(2, A)), NOW)
    due = {handoff_field(A): {"seq": 2, "peer": A, "at": NOW, "covers": 0}}
    assert fence.handoff_due(NOW) == due


# the reconcile: where claims meet


ME, OTHER = A, B


def once(owner: str, **fields: Any) -> TriggerDef:
    parsed = parse_record(
        {
            "id": "t",
            "kind": "once",
            "spec": {"at": NOW + 60},
            "program": "agent:remind@v1",
            "owner": owner,
            "_v": 2,
            **fields,
        }
    )
    assert isinstance(parsed, TriggerDef)
    return parsed


def entry(defn: TriggerDef) -> EntryView:
    return EntryView(defn.fingerprint, defn.enabled, None, claimed_at=NOW - 1)


def plan(defn: TriggerDef, has_entry: bool, **ctx: Any) -> list[Any]:
    context = Context(peer_id=ME, active=True, now=NOW, confirm_after=1.0, **ctx)
    registry = {"t": entry(defn)} if has_entry else {}
    return reconcile(["t"], {"t": defn}, registry, context)


def test_an_unassigned_record_is_not_claimed_during_the_hold() -> None:
    assert plan(once(""), False, may_claim=False) == []
    assert plan(once(""), True, may_claim=False) == [Evict("t", "unassigned")]
    assert plan(once(""), False)[0] == Adopt(once(""), claim=True)


def test_a_claim_of_a_later_term_does_not_stand_over_ours() -> None:
    theirs = once(OTHER)
    actions = plan(theirs, True, mine={"t": Token(2, ME)}, seen={"t": Token(3, OTHER)})
    assert actions == [Adopt(theirs, claim=True)]


def test_our_claim_of_a_later_term_is_evicted_unfired() -> None:
    actions = plan(once(OTHER), True, mine={"t": Token(3, ME)}, seen={"t": Token(2, OTHER)})
    assert actions == [Evict("t", "superseded")]


def test_a_pin_over_a_claim_is_a_repin_whatever_the_tokens() -> None:
    assert plan(once(OTHER), True, mine={"t": Token(3, ME)}) == [Evict("t", "repinned")]


def test_a_live_predecessor_without_a_beat_is_waited_for_its_lease_a_tick_and_the_lag() -> None:
    # A stopped device keeps its registry row, so it is live, but it sends no beat; it
    # claims nothing once its lease has run out (3 polls of 2 s here).
    fence = Fence(hold_max_s=60, tick_s=1, lease_s=6)
    fence.sample_lag(
        [{"id": "y", "owner": C, CLAIM_FIELD: {"seq": 1, "peer": C, "at": NOW - 0.5}}], B, NOW
    )
    assert fence.believed_s() == 8.0  # 6 s of lease, a tick, twice 0.5 s of lag
    stopped = term(Token(2, B), Token(1, A))
    fence.follow(True, stopped, NOW)
    assert fence.follow(True, stopped, NOW + 7.9) is False
    assert fence.follow(True, stopped, NOW + 8) is True
    assert fence.may_claim(NOW + 8)
    assert fence.confirm_after(0.0, NOW + 8) == 3.0  # and its claims then take a round trip
