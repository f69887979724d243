"""Apply: a reconcile plan → the registry and the unit of work.

`reconcile` (pure) says what to do with each trigger; `Apply` does it: adopts, claims,
confirms, refreshes, toggles, evicts and marks entries, and queues the writes each of
those owes (entry rows, owner stamps, markers) in the step's unit of work.

A reconcile of every id (after a start, a new verdict or peer id, or when claiming
resumes) is spread over the ticks that follow, `SPREAD_SLICE` ids a tick (`spread`,
`step`); the ids that changed are reconciled at once, and an entry that comes due before
the spread reached it is reconciled as it comes due (`settle_due`, from the timer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from anyrtd.chain import ChainIndex
from anyrtd.claims import Fence
from anyrtd.clock import Clock, Slice, SystemClock, rise_at_once
from anyrtd.heap import gc_paused, keep_built
from anyrtd.metrics import Stats
from anyrtd.model import Malformed, TriggerDef, chain_of, health_marker, stand_in
from anyrtd.reconcile import (
    Adopt,
    Confirm,
    Context,
    EntryFacts,
    Evict,
    Mark,
    Refresh,
    Skip,
    Toggle,
    Track,
    reconcile,
)
from anyrtd.records import RecordCache
from anyrtd.registry import Entry, Registry, new_row
from anyrtd.rows import EntryRow
from anyrtd.unit import Unit
from anyrtd.vocab import Kind, LastStatus, RollupField, Verdict

log = logging.getLogger("anyrtd.apply")

SPREAD_SLICE = 1000
"""Ids a tick reconciles of a reconcile of every id: at 100,000 records, whose definitions
are parsed as they are reconciled, about 25 ms a tick (docs/benchmarks.md)."""
SPREAD_KEEP = 20_000
"""A spread over at least this many ids keeps what each slice parsed out of the collector's
full passes (`heap.keep_built`): they would walk the definitions of every slice before,
for up to 0.1 s at 100,000 records.
Chosen (e2f91ad): docs/benchmarks.md, start-up from 100,000 records."""
CONFIRM_SLICE = 500
"""Unconfirmed claims a step reconciles while more wait (`Apply.step`): those whose stamp
came back first, the others in turn. Chosen: 6,667 claims of broken records, reconciled
every step, cost 55 ms a tick while their stamps were on their way and 0.3 s in one tick
once they came back; 1,000 confirmed in a step, about 55 ms."""
STEP_CHUNK = 100
"""The most ids a step reconciles between two looks at its slice of the loop's time
(`clock.LOOP_SLICE_S`): a hundred ordinary ones take about 2.5 ms."""
CHUNK_S = 0.005
"""About how long a chunk of a step's ids takes: fewer than `STEP_CHUNK` ids when each costs
more (`Apply.per_id_s`). A hundred records of megabytes take far longer (the records fault
family: 16-37 ms a hundred claims of broken records, so that a tick held the loop for up to
75 ms); chunks of about 5 ms keep a step within its slice by that much at most."""
SPREAD_STALL_S = 0.06
"""About the longest a tick with a slice holds the event loop: it waits for a start due
sooner to pass (`Timer.clear_of`).
Chosen (e2f91ad): a slice of `SPREAD_SLICE` ids takes about 25 ms, with a margin."""


class Apply:
    """Carries out reconcile plans on the registry; remembers the claims not yet confirmed."""

    def __init__(
        self,
        *,
        registry: Registry,
        records: RecordCache,
        unit: Unit,
        stats: Stats,
        confirm_after: float,
        fence: Fence | None = None,
        cancel: Callable[[str], None] = lambda _rid: None,
        clock: Clock | None = None,
        chains: ChainIndex | None = None,
    ) -> None:
        self.registry = registry
        self.records = records
        self.unit = unit
        self.stats = stats
        self.confirm_after = confirm_after
        self.fence = fence
        """The takeover hold and the claims' fencing tokens (anyrtd/claims.py), when set."""
        self.unfenced: set[str] = set()
        """Ids whose stamp carries no fencing token: chat-watch moves with the role on purpose
        (`unfence`)."""
        self.cancel = cancel
        """Cancels the run prepared ahead for a trigger, if any, before its entry changes."""
        self.clock: Clock = clock or SystemClock()
        self.chains = ChainIndex() if chains is None else chains
        """The chains among every record reconciled, and their loops (anyrtd/chain.py)."""
        self.unconfirmed: set[str] = set()
        """Claimed entries waiting for their stamp to come back: reconciled every step, a
        slice of them while many wait (`_claims`)."""
        self.unsettled: set[str] = set()
        """Ids whose reconcile of every id, spread over the ticks after a start or a new
        verdict, has not come yet (`spread`); an entry due among them is reconciled as it
        comes due (`settle_due`)."""
        self._malformed_logged: dict[str, int | None] = {}
        self._todo: list[str] = []
        """The ids of a spread reconcile of every id not reconciled yet (last first)."""
        self._spread_verdict: str | None = None
        self._spread_size = 0
        self._as: tuple[str, str] | None = None
        """The verdict and peer id of the last step: what an entry due is settled under."""
        self._claims_turn: list[str] = []
        """Unconfirmed claims not reconciled yet in this turn through them (`_claims`)."""
        self._claims_ready = False
        """More claims were ready to confirm than the last step took."""
        self._pull_back: set[str] = set()
        """Restored recurring entries whose check for a clock stepped back is owed: made at
        their first reconcile, which reads their definitions."""
        self.per_id_s = 0.0
        """How long reconciling an id takes, measured on the last chunks (`_reconcile_within`):
        it rises at once to a chunk that cost more and falls back a fifth of the way."""

    @gc_paused()  # 100,000 entries at start: anyrtd/heap.py
    def restore(
        self, rows: Iterable[EntryRow], now: float, last_fired: Mapping[str, float] = {}
    ) -> None:
        """Put the mirror's entry rows back in the registry; evict those without a record.

        A recurring entry whose stored next fire is further ahead than its schedule allows
        from `now` (armed under a wall clock since stepped back) is re-armed from `now`; the
        last occurrence each fired (`last_fired`) is not fired again."""
        known, restored, rearm = self.records.known(), [], []
        for row in rows:
            rid = known.get(row.trigger_id)
            if rid is None:
                self.unit.evict(row.trigger_id)
                continue
            row.trigger_id = rid  # the record cache's own string: one per id
            if row.kind == Kind.ONCE and row.consumed:
                defn = self.records.parsed.get(rid)
                if not isinstance(defn, TriggerDef):
                    self.unit.evict(rid)
                    continue
                if defn.rollup.last_run_at is None:
                    # The mirror's record predates this device's consumption write, which
                    # the server took (the outbox no longer holds it) but which was not read
                    # back before the restart: lay it over until the server shows a newer
                    # version, or the reconcile would take the stale record for a rewrite
                    # and fire the shot again.
                    consumed = {RollupField.LAST_RUN_AT.value: row.armed_at, "enabled": False}
                    self.records.overlay_until_newer(rid, consumed)
            # Its definition is parsed when first needed (a fire, a reconcile, a view).
            entry = Entry.restored(row, self._definition)
            restored.append(entry)
            if row.claimed_at is not None:
                self.unconfirmed.add(rid)
            if row.kind == Kind.CRON:
                if row.next_fire is None or row.next_fire <= now:
                    rearm.append(entry)
                else:
                    self._pull_back.add(rid)
                if (at := last_fired.get(rid)) is not None:
                    self.registry.last_fired[rid] = at
            elif row.kind == Kind.ONCE and not row.consumed:
                rearm.append(entry)
        self.registry.put_all(restored)
        for entry in rearm:
            # A missed cron occurrence does not exist: re-arm strictly forward, no burst, and
            # say so in the mirror at once (its `scheduled_next` view reads the row).
            before = entry.row.next_fire
            self.registry.arm(entry, now)  # reads the definition only if it may fire
            if entry.row.next_fire != before:
                self.unit.save(entry.row)

    def _definition(self, row: EntryRow) -> TriggerDef:
        """Return the definition of a restored entry's record, parsed now."""
        defn = self.records.parsed.get(row.trigger_id)
        if not isinstance(defn, TriggerDef):
            # Its reconcile evicts it, before it comes due (`settle_due`).
            why = defn.reason if isinstance(defn, Malformed) else "its record is gone"
            return stand_in(row.trigger_id, row.kind, row.fingerprint, why)
        _share(row, defn)
        return defn

    def _pulled_back(self, ids: Iterable[str], now: float) -> None:
        """Re-arm from `now` the restored entries among `ids` armed further ahead than their
        schedule allows (under a wall clock since stepped back)."""
        for rid in ids:
            entry = self.registry.get(rid)
            if entry is None:
                continue
            stored = entry.row.next_fire
            if self.registry.pull_back(entry, now):
                log.warning(
                    "%s was armed %.0f s ahead of its schedule (the wall clock stepped back): "
                    "re-armed from now",
                    rid,
                    (stored or now) - (entry.row.next_fire or now),
                    extra={"trigger": rid},
                )
                self.unit.save(entry.row)

    def spread(self, ids: Iterable[str], verdict: str) -> None:
        """Begin a reconcile of every id in `ids` (one begun before starts again), spread
        over the coming steps in their order (the record cache's: the records read back
        from the mirror are parsed, and their texts let go, in the order they were read);
        the event entries come first (a chat message fires them)."""
        order = list(ids)
        todo = set(order)
        self.unsettled = todo
        order.reverse()  # taken from the end
        self._todo = [*order, *(todo & self.registry.events)]
        self._spread_verdict, self._spread_size = verdict, len(todo)
        if verdict == Verdict.PRUNED:  # the next start takes a new identity (`Sync.restore`)
            self.unit.meta({"verdict": verdict})

    @property
    def spreading(self) -> bool:
        """Whether a spread reconcile, or claims ready to confirm, have ids left for the
        next step (there is a peer id)."""
        return (bool(self._todo) or self._claims_ready) and self._as is not None

    def _defer(self, ids: set[str]) -> None:
        """Leave `CONFIRM_SLICE` of `ids` to this step; the others join the spread
        reconcile's ids, reconciled in the next steps, or as they come due."""
        later = list(ids)[CONFIRM_SLICE:]
        ids.difference_update(later)
        unsettled = self.unsettled
        later = [rid for rid in later if rid not in unsettled]
        unsettled.update(later)
        self._todo.extend(later)  # taken from the end: before the rest of a spread

    def _claims(self, now: float) -> set[str]:
        """Return the unconfirmed claims this step reconciles: every one while at most
        `CONFIRM_SLICE` wait; else that many, first those whose stamp came back and whose
        confirmation time came, then the others in turn."""
        unconfirmed = self.unconfirmed
        self._claims_ready = False
        if len(unconfirmed) <= CONFIRM_SLICE:
            return set(unconfirmed)
        pending, entries = self.records.pending_owner(unconfirmed), self.registry.entries
        due = now - self.confirm_after
        ready = [
            rid
            for rid in unconfirmed
            if rid not in pending
            and (entry := entries.get(rid)) is not None
            and (entry.row.claimed_at or 0.0) <= due
        ]
        taken = set(ready[:CONFIRM_SLICE])
        self._claims_ready = len(ready) > CONFIRM_SLICE
        turn = self._claims_turn
        while len(taken) < CONFIRM_SLICE:
            if not turn:
                turn.extend(unconfirmed - taken)
                if not turn:
                    break
            rid = turn.pop()
            if rid in unconfirmed:
                taken.add(rid)
        return taken

    def step(
        self,
        ids: Iterable[str],
        now: float,
        verdict: str,
        peer_id: str,
        within: Slice | None = None,
    ) -> set[str]:
        """Reconcile `ids` (what changed; past `CONFIRM_SLICE` of them, the rest joins the
        spread reconcile), the claims not confirmed yet (`_claims`) and the next slice of a
        spread reconcile, a chunk at a time until `within` is over (what is left
        joins the spread reconcile too); return every id reconciled. The verdict is noted
        in the mirror once a spread is done: the mirror then holds a whole reconcile under
        it (`Daemon.open`)."""
        ids = set(ids)
        if len(ids) > CONFIRM_SLICE:  # thousands of acknowledgements, say
            self._defer(ids)
        ids |= self._claims(now)
        self._as = (verdict, peer_id)
        todo, unsettled, taken = self._todo, self.unsettled, 0
        while todo and taken < SPREAD_SLICE:
            rid = todo.pop()
            if rid in unsettled and rid not in ids:
                ids.add(rid)
                taken += 1
        ids = self._reconcile_within(ids, now, verdict, peer_id, within)
        if self._spread_verdict is not None and self._spread_size >= SPREAD_KEEP:
            keep_built()  # each slice's definitions: a full pass would walk them all again
        if not todo and self._spread_verdict is not None:
            self.unsettled = set()  # new, small ones: a set keeps the size it had
            self._pull_back = set(self._pull_back)
            self.records.compact()
            self.unit.meta({"verdict": self._spread_verdict})
            self._spread_verdict = None
        return ids

    def _reconcile_within(
        self, ids: set[str], now: float, verdict: str, peer_id: str, within: Slice | None
    ) -> set[str]:
        """Reconcile `ids` a chunk at a time (`CHUNK_S` of them at the measured cost of an
        id, at most `STEP_CHUNK`) until `within` is over; the ids not reached join the
        spread reconcile, reconciled in the next steps, or as they come due. Return the ids
        reconciled."""
        if within is None:
            self.records.parse_many(ids)
            self.reconcile(ids, now, verdict, peer_id)
            return ids
        order, at = list(ids), 0
        while at < len(order):
            if at and within.over():
                rest = order[at:]  # some may have left the spread's ids this step: put back
                self.unsettled.update(rest)
                self._todo.extend(rest)
                return set(order[:at])
            size = STEP_CHUNK if self.per_id_s <= 0.0 else int(CHUNK_S / self.per_id_s)
            chunk = order[at : at + min(STEP_CHUNK, max(1, size))]
            began = time.perf_counter()
            self.records.parse_many(chunk)
            self.reconcile(chunk, now, verdict, peer_id)
            took = (time.perf_counter() - began) / len(chunk)
            self.per_id_s = rise_at_once(self.per_id_s, took)
            at += len(chunk)
        return ids

    def settle_due(self, due: float) -> None:
        """Reconcile the entries due at or before `due` that a spread reconcile has not
        reached yet (the timer asks before it takes them from the registry)."""
        if not self.unsettled or self._as is None:
            return
        ids = [tid for tid in self.registry.due_ids(due) if tid in self.unsettled]
        if ids:
            self.reconcile(ids, min(due, self.clock.now()), *self._as)

    def unfence(self, trigger_id: str) -> None:
        """Stamp `trigger_id` without a fencing token from now on (the chat watch's record)."""
        if trigger_id not in self.unfenced:
            self.unfenced = {trigger_id}

    @gc_paused()  # every id after a restart or a new verdict: anyrtd/heap.py
    def reconcile(self, ids: Iterable[str], now: float, verdict: str, peer_id: str) -> None:
        """Reconcile `ids` and apply the plan."""
        ids = ids if isinstance(ids, set | frozenset | list | tuple) else list(ids)
        looped = self._note_chains(ids)
        if looped:
            ids = [*ids, *sorted(looped.difference(ids))]  # their marker changes too
        # The rows themselves, not copies: the plan is made before any action changes one.
        entries = self.registry.entries
        views: dict[str, EntryFacts] = {rid: entries[rid].row for rid in ids if rid in entries}
        fence = self.fence
        ctx = Context(
            peer_id=peer_id,
            active=verdict == Verdict.ACTIVE,
            now=now,
            confirm_after=self.confirm_after
            if fence is None
            else fence.confirm_after(self.confirm_after, now),
        )
        if fence is not None:
            ctx = replace(ctx, may_claim=fence.may_claim(now), mine=fence.mine, seen=fence.seen)
        if self.chains:
            ctx = replace(ctx, loops=self.chains.cycles)
        pending = self.records.pending_owner(ids)
        plan = reconcile(ids, self.records.parsed, views, ctx, pending)
        for action in plan:
            self.apply(action, now, peer_id)
        if self.unsettled:
            self.unsettled.difference_update(ids)
        if owed := self._pull_back.intersection(ids):
            self._pull_back -= owed
            self._pulled_back(owed, now)

    def _note_chains(self, ids: Iterable[str]) -> set[str]:
        """Note the chains among the records of `ids`; return the chains that joined or left
        a loop. Without a chain anywhere, one look-up and a kind compare per id."""
        index, parsed = self.chains, self.records.parsed
        for rid in ids:
            defn = parsed.get(rid)
            if type(defn) is TriggerDef and defn.kind == Kind.EVENT:
                index.note(rid, chain_of(defn) if defn.enabled else None)
            elif index and rid in index.filters:
                index.note(rid, None)
        return index.settle()

    def apply(self, action: object, now: float, peer_id: str) -> None:
        """Carry out one action of a plan."""
        match action:
            case Adopt(defn=defn, claim=claim):
                self.adopt(defn, claim, now, peer_id)
            case Confirm(defn=defn):
                entry = self.registry.get(defn.id)
                if entry is not None:
                    entry.row.claimed_at = None
                    entry.defn = defn
                    self.unconfirmed.discard(defn.id)
                    self.registry.arm(entry, now)
                    self.unit.save(entry.row)
                    log.info("claim of %s confirmed", defn.id, extra={"trigger": defn.id})
            case Refresh(defn=defn):
                self.cancel(defn.id)
                old = self.registry.get(defn.id)
                entry = Entry(defn, new_row(defn, now, claimed=False))
                if old is not None and _keeps_phase(old, defn):
                    # An edit that leaves the schedule alone keeps its phase: an every_s grid
                    # re-anchored at each edit would never fire under edits more frequent
                    # than its period.
                    entry.row.armed_at = old.row.armed_at
                self.registry.put(entry)
                self.registry.arm(entry, now)
                self.unit.save(entry.row)
                why = (
                    "definition changed"
                    if old is None or old.row.fingerprint != defn.fingerprint
                    else (
                        "consumed" if entry.row.consumed else "lastRunAt cleared, the shot re-armed"
                    )
                )
                log.info("refreshed %s: %s", defn.id, why, extra={"trigger": defn.id})
            case Toggle(defn=defn, enabled=enabled):
                self.toggle(defn, enabled, now)
            case Track(defn=defn):
                entry = self.registry.get(defn.id)
                if entry is not None:
                    entry.defn = defn
                    _share(entry.row, defn)
            case Evict(id=rid, reason=reason):
                self.cancel(rid)
                if self.registry.remove(rid) is not None:
                    self.unit.evict(rid)
                    self.unconfirmed.discard(rid)
                    log.info("evicted %s: %s", rid, reason, extra={"trigger": rid})
            case Mark(id=rid, marker=marker):
                if marker is None:
                    self.unit.write_trigger(rid, {}, unset=[RollupField.LAST_STATUS])
                    log.info("health marker of %s cleared", rid, extra={"trigger": rid})
                else:
                    self.unit.write_trigger(rid, {RollupField.LAST_STATUS: marker})
                    log.warning("%s can never fire: %s", rid, marker, extra={"trigger": rid})
            case Skip(id=rid, reason=reason, version=version):
                if self._malformed_logged.get(rid, -1) != version:
                    self._malformed_logged[rid] = version
                    self.stats.malformed_skips += 1
                    log.warning(
                        "skipped malformed record %s (version %s): %s",
                        rid,
                        version,
                        reason,
                        extra={"trigger": rid},
                    )

    def adopt(self, defn: TriggerDef, claim: bool, now: float, peer_id: str) -> None:
        """Put a record in the registry; with `claim`, stamp it as this device's first."""
        existing = self.registry.get(defn.id)
        if existing is not None:
            # Reassigned while in our registry: stamp it again and wait for the confirmation.
            self.cancel(defn.id)
            existing.defn = defn
            existing.row.claimed_at = now if claim else None
            if defn.kind == Kind.ONCE:
                existing.row.consumed = defn.rollup.last_run_at is not None
            self.registry.put(existing)
            self.registry.arm(existing, now)
            entry = existing
        else:
            entry = Entry(defn, new_row(defn, now, claimed=claim))
            self.registry.put(entry)
            self.registry.arm(entry, now)
        if claim:
            self.unconfirmed.add(defn.id)
            fencing = {}
            if self.fence is not None and defn.id not in self.unfenced:
                fencing = self.fence.claim_fields(defn.id, now)
            # Against the version read: an owner written on the server since (a pin) stands,
            # and the refused claim is dropped (anyrtd/outbox.py, `DrainResult.lost`).
            version = self.records.version(defn.id) or None
            self.unit.write_trigger(defn.id, {"owner": peer_id, **fencing}, if_version=version)
            log.info("claimed %s", defn.id, extra={"trigger": defn.id})
        else:
            log.info("adopted %s (%s)", defn.id, defn.kind, extra={"trigger": defn.id})
        self.unit.save(entry.row)

    def toggle(self, defn: TriggerDef, enabled: bool, now: float) -> None:
        """Enable or disable an entry as its record says; enabling resets the breaker."""
        entry = self.registry.get(defn.id)
        if entry is None:
            return
        self.cancel(defn.id)
        entry.defn = defn
        entry.row.enabled = enabled
        entry.row.marker = health_marker(defn, now)
        if enabled:
            entry.row.consecutive_failures = 0
            entry.row.armed_at = now
            reset: dict[str, object] = {RollupField.CONSECUTIVE_FAILURES: 0}
            if defn.rollup.last_status == LastStatus.AUTO_DISABLED:
                # The trip goes; the status of the failed run that tripped it stays.
                reset[RollupField.LAST_STATUS] = LastStatus.ERROR
            if defn.rollup.consecutive_failures or len(reset) > 1:
                self.unit.write_trigger(defn.id, reset)
        self.registry.arm(entry, now)
        self.unit.save(entry.row)
        log.info("%s %s", "enabled" if enabled else "disabled", defn.id, extra={"trigger": defn.id})


def _keeps_phase(old: Entry, defn: TriggerDef) -> bool:
    """Return whether the entry rebuilt for `defn` keeps `old`'s anchor: both enabled, with
    the same schedule. A restored entry whose definition was not read yet, or was read from
    the new record already (its fingerprint is not its row's), does not know its old
    schedule and takes the new anchor."""
    before = old.known_defn
    return (
        before is not None
        and before.fingerprint == old.row.fingerprint
        and old.row.enabled
        and defn.enabled
        and before.kind == defn.kind
        and before.schedule == defn.schedule
    )


def _share(row: EntryRow, defn: TriggerDef) -> None:
    """Let `row` share the definition's strings rather than keep its own copies of them."""
    if row.trigger_id == defn.id and row.kind == defn.kind:
        row.trigger_id, row.kind = defn.id, defn.kind
    if row.fingerprint == defn.fingerprint:
        row.fingerprint = defn.fingerprint


__all__ = ["CHUNK_S", "CONFIRM_SLICE", "SPREAD_SLICE", "SPREAD_STALL_S", "STEP_CHUNK", "Apply"]
