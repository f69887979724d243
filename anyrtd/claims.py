"""Claims across devices: the fencing token a claim carries, and when a device may claim.

Each device syncs its own replica of the records, with a delay the daemon does not
control. Two rules keep an unassigned `once` to one run (docs/election.md, "Exactly once
across replicas"):

- **The takeover hold.** A device that gains the active role claims nothing until the
  stand-down beat (the device's own `handoff:<peer id>` field, written on the chat-watch
  record after its last claim) of every other device whose row claimed the role before
  has reached its own replica, or a beat that covers that claim: from then on every
  claim those devices made is visible here, and a record they claimed is no longer
  unassigned. Each device writes its beat as soon as it sees it no longer holds the
  role, whether or not its own hold was over (the beat vouches for its own claims;
  `covers` says up to which term it vouches for everyone's), so a role that moved faster
  than the poll settles within a poll and the replication lag. A device that is gone
  cannot write one: the hold then lasts twice the replication lag measured on the change
  feed. A live device that sent no beat (stopped, or cut off from the server) claims
  nothing once its lease has run out, so the hold lasts at most that lease, a tick and
  twice the lag (`Fence.believed_s`); `takeover_hold_s` bounds it too.
- **The fencing token.** A claim writes, with `owner`, the field `claim` =
  `{"seq", "peer", "at"}`: the claimant's election `seq` (its row's claim on the role).
  When two claims on one record meet, the lower `(seq, peer)` stands on every device:
  the earlier term claimed first and may have fired; the later claimant evicts without
  firing. After a hold that ended without the beat, the new holder confirms its claims
  only after a round trip (twice the measured lag, two ticks), so an earlier claim still
  on its way meets its own before it fires. A device that sees a token above any the
  registry has shown it knows the role has moved and claims nothing more.
- **The lease.** A holder claims only within `LEASE_POLLS` polls of its last good
  registry read, so a holder cut off from the registry stops on its own.

Pure: times are passed in; the daemon calls `Fence.follow` once a tick, `note` for every
record it reads, `claim_fields` when it stamps a claim, and `handoff_due` for the beat.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from anyrtd.config import Config
from anyrtd.vocab import CHAT_WATCH_PROGRAM

log = logging.getLogger("anyrtd.claims")

CLAIM_FIELD = "claim"
"""The runtime-owned field a claim writes beside `owner`: `{"seq", "peer", "at"}`."""
HANDOFF_FIELD = "handoff"
"""The runtime-owned field of the stand-down beat, on the chat-watch record: each device
writes its own, `handoff:<peer id>` (`handoff_field`). The server merges a record's
top-level fields last writer wins, so one field shared by every device let an older beat
sent later overwrite a newer one of another device, and the successor waiting for the
newer one held its claims for `takeover_hold_s`. A plain `handoff` (written by an earlier
anyrtd) is still read."""
COVERS = "covers"
"""The key of a beat that says up to which term it vouches for every device's claims."""
DEFAULT_HOLD_S = 60.0
LEASE_POLLS = 3
"""A holder claims only within this many election polls of its last good registry read."""
LAG_SAMPLES = 64


class Token(NamedTuple):
    """A claim's fencing token: the claimant's election seq, then its peer id (the tie-break)."""

    seq: int
    peer: str


@dataclass(frozen=True, slots=True)
class Term:
    """The active role as the registry shows it, from this device's side."""

    winner: Token | None
    """The winner's claim on the role, or None when nobody holds it."""
    previous: Token | None
    """The highest claim of another device below the winner's: its predecessor."""
    previous_live: bool
    """Whether the predecessor's row is live (a pruned or removed row writes no beat)."""
    mine: Token | None
    """This device's own row's claim, whether or not it wins."""
    top: int = 0
    """The highest seq of any row, pruned ones included: the newest term the registry knows."""
    read_at: float | None = None
    """When the registry was read (the lease of a holder runs from its last good read)."""
    others: tuple[tuple[Token, bool], ...] = ()
    """Every other row's claim below the winner's, with whether the row is live: the claims
    a new holder must see covered before it claims (empty: only `previous`, if any)."""

    def before(self) -> tuple[tuple[Token, bool], ...]:
        """Return the other rows' claims below the winner's, with whether each row is live."""
        if self.others:
            return self.others
        return ((self.previous, self.previous_live),) if self.previous is not None else ()


def term_of(
    rows: Iterable[tuple[str, bool, Mapping[str, Any]]],
    me: str,
    winner: str | None,
    read_at: float | None = None,
) -> Term:
    """Return the term from registry rows given as (peer id, deleted, the app's entry)."""
    claims: dict[str, tuple[Token, bool]] = {}
    for peer, deleted, entry in rows:
        seq = entry.get("seq") if isinstance(entry, Mapping) else None
        if isinstance(seq, int | float) and not isinstance(seq, bool):
            claims[peer] = (Token(int(seq), peer), not deleted)
    held = claims.get(winner) if winner is not None else None
    won = held[0] if held is not None else None
    below = [
        (tok, live)
        for peer, (tok, live) in claims.items()
        if peer != winner and (won is None or tok < won)
    ]
    previous = max(below, default=None)
    mine = claims.get(me)
    return Term(
        winner=won,
        previous=previous[0] if previous else None,
        previous_live=previous[1] if previous else False,
        mine=mine[0] if mine else None,
        top=max((tok.seq for tok, _ in claims.values()), default=0),
        read_at=read_at,
        others=tuple(sorted(below)),
    )


def read_token(value: Any) -> Token | None:
    """Return the token of a `claim` or `handoff` field value, or None when it is not one."""
    if not isinstance(value, Mapping):
        return None
    seq, peer = value.get("seq"), value.get("peer")
    if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(peer, str) or not peer:
        return None
    return Token(seq, sys.intern(peer))  # one copy of each peer id, however many records


def claim_token(record: Mapping[str, Any]) -> Token | None:
    """Return the fencing token of the record's claim, if its owner wrote one (a pin has none)."""
    token = read_token(record.get(CLAIM_FIELD))
    return token if token is not None and token.peer == record.get("owner") else None


def outranks(mine: Token | None, other: Token | None) -> bool:
    """Tell whether this device's claim stands over the other one: the lower token stands.

    The claim of the earlier term was made first and may have fired already; the later
    claimant is the one that can still wait (see `Fence.confirm_after`).
    """
    return mine is not None and other is not None and mine < other


def handoff_field(peer: str) -> str:
    """Return the name of the field that holds `peer`'s stand-down beat."""
    return f"{HANDOFF_FIELD}:{peer}"


def beats_of(record: Mapping[str, Any]) -> Iterator[tuple[Token, Any]]:
    """Yield each stand-down beat the record carries, with its value: the chat-watch
    record's `handoff:<peer id>` fields whose beat is that device's, and a plain `handoff`.
    Any other record carries none (and costs one lookup)."""
    if record.get("program") != CHAT_WATCH_PROGRAM:
        return
    for key, value in record.items():
        if not key.startswith(HANDOFF_FIELD):
            continue
        token = read_token(value)
        if token is None:
            continue
        if key == HANDOFF_FIELD or key == handoff_field(token.peer):
            yield token, value


def _field(token: Token, now: float) -> dict[str, Any]:
    return {"seq": token.seq, "peer": token.peer, "at": now}


def beat_covers(value: Any, token: Token) -> int:
    """Return the term up to which a stand-down beat vouches for every device's claims.

    A beat written without `covers` (by an anyrtd that beat only once its own hold was
    over) vouches for every claim up to its own term.
    """
    covers = value.get(COVERS) if isinstance(value, Mapping) else None
    if isinstance(covers, int) and not isinstance(covers, bool):
        return covers
    return token.seq


class Fence:
    """One device's side of the rules: its term, the takeover hold, and the tokens it has seen."""

    @classmethod
    def of(cls, config: Config) -> Fence:
        """Return a device's fence with the bounds its configuration sets."""
        lease_s = LEASE_POLLS * config.election_poll_s
        return cls(hold_max_s=config.takeover_hold_s, tick_s=config.tick_s, lease_s=lease_s)

    def __init__(
        self,
        *,
        hold_max_s: float = DEFAULT_HOLD_S,
        tick_s: float = 5.0,
        lease_s: float | None = None,
    ) -> None:
        self.hold_max_s = hold_max_s
        self.tick_s = tick_s
        self.lease_s = lease_s
        """How long after its last good registry read a holder still claims (None: for ever)."""
        self.read_at: float | None = None
        self.term: Token | None = None
        """This device's token while it holds the active role."""
        self.waiting: Token | None = None
        """The latest earlier claim on the role whose beat the hold waits for (None: no hold)."""
        self.before: tuple[tuple[Token, bool], ...] = ()
        """The other rows' claims below this device's term when it took the role, with
        whether each row was live: what the hold waits to see covered."""
        self.predecessor_gone = False
        self.hold_from = 0.0
        self.shadow_until: float | None = None
        """Until when a claim may meet a predecessor's still on its way (the hold ended
        without the beat); claims confirm after a round trip until a trip past it."""
        self.top = 0
        """The highest seq the registry has shown this device."""
        self.stale: Token | None = None
        """A token above any seq the registry has shown, seen on a record: the role moved."""
        self.beats: dict[str, int] = {}
        """The highest beat's seq of each device seen on this replica: every claim that
        device made up to that term is visible here."""
        self.covered = 0
        """The highest term whose claims, every device's, a beat seen here covers."""
        self.vouch = 0
        """The highest term whose claims, every device's, this replica shows: `covered`, or
        a term of this device whose hold ended. This device's beat says it (`covers`)."""
        self.mine: dict[str, Token] = {}
        """The token of each claim this device stamped (and has not seen superseded)."""
        self.seen: dict[str, Token] = {}
        """The token on each record as this replica shows it, where the record carries one."""
        self.lags: deque[float] = deque(maxlen=LAG_SAMPLES)
        self._owed: Token | None = None
        self._beaten: Token | None = None
        self._could = False
        self._lapsed = False

    # what the device observes

    def note(self, record: Mapping[str, Any]) -> None:
        """Take the claim token and the stand-down beat of a record read from the server."""
        rid = record.get("id")
        if not isinstance(rid, str):
            return
        token = claim_token(record)
        if token is None:
            self.seen.pop(rid, None)
            self.mine.pop(rid, None)  # unassigned or pinned: no claim left to defend
        else:
            self.seen[rid] = token
            if token.seq > self.top and (self.stale is None or token > self.stale):
                if self.term is not None and self.stale is None:
                    log.info(
                        "a claim with seq %d by %s is newer than any term the registry "
                        "has shown (seq %d): the active role has moved; claiming nothing more",
                        token.seq,
                        token.peer,
                        self.top,
                    )
                self.stale = token
        for beat, value in beats_of(record):
            self.beats[beat.peer] = max(self.beats.get(beat.peer, 0), beat.seq)
            self.covered = max(self.covered, beat_covers(value, beat))

    def sample_lag(self, records: Iterable[Mapping[str, Any]], me: str | None, now: float) -> None:
        """Measure the replication lag from the stamps other devices wrote, as they arrive."""
        for record in records:
            value = record.get(CLAIM_FIELD)
            token = read_token(value)
            known = self.seen.get(str(record.get("id", "")))
            if token is not None and (known is None or token > known):
                self._sample(token, value, me, now)
            for beat, value in beats_of(record):
                if beat.seq > self.beats.get(beat.peer, 0):
                    self._sample(beat, value, me, now)

    def _sample(self, token: Token, value: Any, me: str | None, now: float) -> None:
        """Take the lag of a stamp written by another device that is new here (an older
        one is in the change because another field changed)."""
        at = value.get("at")
        if token.peer != me and isinstance(at, int | float) and not isinstance(at, bool):
            self.lags.append(max(0.0, now - float(at)))

    def lag(self) -> float | None:
        """Return the highest replication lag among the recent samples, or None without any."""
        return max(self.lags) if self.lags else None

    def accounted(self, token: Token, *, beats_only: bool = False) -> bool:
        """Tell whether every claim made under `token` (and before it, by its device) is
        visible on this replica: its device's beat for that term, a beat covering it, or
        (unless `beats_only`) a hold of this device that ended after it."""
        covered = self.covered if beats_only else max(self.covered, self.vouch)
        return self.beats.get(token.peer, 0) >= token.seq or covered >= token.seq

    def _pending(self, *, beats_only: bool = False) -> list[tuple[Token, bool]]:
        return [
            (tok, live)
            for tok, live in self.before
            if not self.accounted(tok, beats_only=beats_only)
        ]

    # the role

    def follow(self, active: bool, term: Term | None, now: float) -> bool:
        """Take this tick's verdict and term; return True when claiming may resume.

        That is once a takeover hold ends, and again whenever a pause ends (a token newer
        than the registry showed, or a lapsed lease): the unassigned records passed over
        meanwhile must be reconciled again.
        """
        winner = term.winner if term is not None else None
        self.read_at = term.read_at if term is not None else None
        if term is not None:
            self.top = max(self.top, term.top)
            if self.stale is not None and self.stale.seq <= self.top:
                self.stale = None  # the registry has caught up: its verdict speaks again
        if active and winner is not None and winner != self.term:
            self._take_over(winner, term, now)
        elif not active and self.term is not None:
            log.info("stood down from term %d: claiming nothing more", self.term.seq)
            # A hold still running is moot: this device claims nothing now, and its beat
            # vouches for its own claims whether or not the hold was over (`handoff_due`).
            self.term, self.waiting, self.before = None, None, ()
        elif active and term is None:
            self.term, self.waiting = None, None  # the election is off: one device, no fence
        if not active and term is not None and term.mine is not None:
            self._owe(term.mine)
        if self.waiting is not None and self._hold_over(now):
            self.waiting = None
        can = active and self.may_claim(now)
        resumed = can and not self._could
        self._could = can
        return resumed

    def _take_over(self, winner: Token, term: Term | None, now: float) -> None:
        self.term, self.hold_from = winner, now
        self.before = term.before() if term is not None else ()
        self.shadow_until = None
        pending = self._pending()
        self.waiting = max(tok for tok, _ in pending) if pending else None
        self.predecessor_gone = bool(pending) and not any(live for _, live in pending)
        if not self.before:
            self.vouch = max(self.vouch, winner.seq)
            log.info("took term %d: no predecessor, claiming at once", winner.seq)
        elif self.waiting is None:
            self.vouch = max(self.vouch, winner.seq)
            log.info(
                "took term %d: the beat of term %d is already here, claiming at once",
                winner.seq,
                max(tok for tok, _ in self.before).seq,
            )
        else:
            log.info(
                "took term %d: holding claims until term %d's stand-down beat arrives "
                "(%s, at most %.0fs)",
                winner.seq,
                self.waiting.seq,
                "its device is gone" if self.predecessor_gone else "from " + self.waiting.peer,
                self.hold_max_s,
            )

    def _hold_over(self, now: float) -> bool:
        if self.waiting is None:
            return True
        held = now - self.hold_from
        pending = self._pending()
        if not pending:
            self._ended("its stand-down beat arrived", held)
            return True
        self.waiting = max(tok for tok, _ in pending)
        why = None
        if not any(live for _, live in pending):
            # Only devices that are gone are left: they write no beat.
            lag = self.lag()
            quiet = self.hold_max_s if lag is None else max(self.tick_s, 2 * lag)
            if held >= min(quiet, self.hold_max_s):
                why = "its device is gone and the feed has been quiet"
        if why is None and (believed := self.believed_s()) is not None and held >= believed:
            why = (
                f"no beat, but no device can still believe it holds the role after "
                f"{believed:.0f}s (its lease of {self.lease_s:.0f}s, a tick and the lag)"
            )
        if why is None and held >= self.hold_max_s:
            why = f"no beat within takeover_hold_s ({self.hold_max_s:.0f}s)"
        if why is None:
            return False
        # Without the beat, a claim of the predecessor may still be on its way: confirm
        # claims slowly until it shows up (or for another bound).
        self.shadow_until = now + self.hold_max_s
        self._ended(why, held)
        return True

    def believed_s(self) -> float | None:
        """Return how long after this device took the role a predecessor that stands
        down without a beat (stopped, or cut off) may still claim, and its claims take to
        arrive: its lease (it claims only that long after its last good registry read,
        which showed it the role before the move), a tick for the claim's write, and twice
        the measured replication lag. None without a lease (no election polls)."""
        if self.lease_s is None:
            return None
        return self.lease_s + self.tick_s + 2 * (self.lag() or 0.0)

    def confirm_wait_s(self) -> float:
        """Return how long a claim made now waits to be confirmed once the server has
        acknowledged its stamp, as far as a reader can tell (nothing changes): no wait, or
        the round trip of `confirm_after` after a hold that ended without a beat."""
        if self.shadow_until is None:
            return 0.0
        return 2 * (self.lag() or 0.0) + 2 * self.tick_s

    def confirm_after(self, base: float, now: float) -> float:
        """Return how long a claim must stand before it is confirmed: `base`, or a round
        trip (twice the measured lag and two ticks) after a hold that ended without the
        predecessor's beat.

        Last-writer-wins hides an earlier claim from a replica that has written its own
        later claim; the earlier claimant answers with its claim again, and that answer
        takes the round trip to arrive. When the beat does arrive late, the claims made
        before it still get their round trip.
        """
        if self.shadow_until is None:
            return base
        lag = self.lag()
        trip = max(base, 2 * (lag or 0.0) + 2 * self.tick_s)
        if self.term is not None and self.before and not self._pending(beats_only=True):
            self.shadow_until = min(self.shadow_until, now)  # noted at most a tick late
        if now >= self.shadow_until + trip:  # the last claim made in the shadow had its trip
            self.shadow_until = None
            return base
        return trip

    def _ended(self, why: str, held: float) -> None:
        if self.term is not None:
            # What this device claims from now on comes after every earlier term's claims.
            self.vouch = max(self.vouch, self.term.seq)
        lag = self.lag()
        log.info(
            "takeover hold over after %.1fs: %s (replication lag measured: %s)",
            held,
            why,
            "none yet" if lag is None else f"{lag:.2f}s",
        )

    def may_claim(self, now: float) -> bool:
        """Tell whether this device may stamp new claims now (the verdict aside)."""
        if self.waiting is not None:
            return False
        if self.term is None:
            return True  # the election is off: one device, nothing to fence
        if self.stale is not None:
            return False
        lapsed = (
            self.lease_s is not None
            and self.read_at is not None
            and now - self.read_at > self.lease_s
        )
        if lapsed != self._lapsed:
            self._lapsed = lapsed
            if lapsed:
                log.warning(
                    "no devices registry read for %.0fs (lease %.0fs): claiming nothing "
                    "until it answers, another device may hold the role by now",
                    now - (self.read_at or now),
                    self.lease_s,
                )
        return not lapsed

    def claim_fields(self, rid: str, now: float) -> dict[str, Any]:
        """Return the fencing field to write with a claim of `rid`, and remember the token.

        A claim this device defends is stamped again with the token it was made under,
        whatever its term is now.
        """
        token = self.mine.get(rid) or self.term
        if token is None:
            return {}
        self.mine[rid] = token
        return {CLAIM_FIELD: _field(token, now)}

    def outranks(self, rid: str) -> bool:
        """Tell whether this device's claim of `rid` stands over the one the record shows."""
        return outranks(self.mine.get(rid), self.seen.get(rid))

    def forget(self, rid: str) -> None:
        """Drop what is known of a record this device no longer holds."""
        self.mine.pop(rid, None)

    # the stand-down beat

    def _owe(self, token: Token) -> None:
        if token == self._beaten or token == self._owed:
            return
        if self.accounted(token, beats_only=True):
            return  # a beat already vouches for this term's claims
        self._owed = token

    def handoff_due(self, now: float) -> dict[str, Any] | None:
        """Return the beat to write once standing by, or None when none is owed.

        The beat vouches for this device's own claims (its writes go out in order, the
        claims first) and, in `covers`, for every claim up to the highest term this
        replica shows covered. It does not wait for this device's own hold: a successor
        looks for each earlier holder's beat, so none has to vouch for the others.
        """
        token = self._owed
        if token is None or self.term is not None:
            return None
        self._owed, self._beaten = None, token
        if self.accounted(token, beats_only=True):
            return None
        self.beats[token.peer] = max(self.beats.get(token.peer, 0), token.seq)
        beat = {**_field(token, now), COVERS: max(self.covered, self.vouch)}
        return {handoff_field(token.peer): beat}


__all__ = [
    "CLAIM_FIELD",
    "COVERS",
    "DEFAULT_HOLD_S",
    "HANDOFF_FIELD",
    "LEASE_POLLS",
    "Fence",
    "Term",
    "Token",
    "beat_covers",
    "beats_of",
    "claim_token",
    "handoff_field",
    "outranks",
    "read_token",
    "term_of",
]
