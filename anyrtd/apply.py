"""Apply: a reconcile plan → the registry and the unit of work.

`reconcile` (pure) says what to do with each trigger; `Apply` does it: adopts, claims,
confirms, refreshes, toggles, evicts and marks entries, and queues the writes each of
those owes (entry rows, owner stamps, markers) in the step's unit of work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from anyrtd.claims import Fence
from anyrtd.heap import collector_held
from anyrtd.metrics import Stats
from anyrtd.model import TriggerDef, health_marker
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

log = logging.getLogger("anyrtd.daemon")


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
        unfenced: Callable[[str], bool] = lambda _rid: False,
        cancel: Callable[[str], None] = lambda _rid: None,
    ) -> None:
        self.registry = registry
        self.records = records
        self.unit = unit
        self.stats = stats
        self.confirm_after = confirm_after
        self.fence = fence
        """The takeover hold and the claims' fencing tokens (anyrtd/claims.py), when set."""
        self.unfenced = unfenced
        """Ids whose stamp carries no fencing token: chat-watch moves with the role on purpose."""
        self.cancel = cancel
        """Cancels the run prepared ahead for a trigger, if any, before its entry changes."""
        self.unconfirmed: set[str] = set()
        """Claimed entries waiting for their stamp to come back: reconciled every tick."""
        self._malformed_logged: dict[str, int | None] = {}

    @collector_held()  # 100,000 entries at start: anyrtd/heap.py
    def restore(
        self, rows: Iterable[EntryRow], now: float, last_fired: Mapping[str, float] = {}
    ) -> None:
        """Put the mirror's entry rows back in the registry; evict those without a record.

        A recurring entry whose stored next fire is further ahead than its schedule allows
        from `now` (armed under a wall clock since stepped back) is re-armed from `now`; the
        last occurrence each fired (`last_fired`) is not fired again."""
        for row in rows:
            defn = self.records.parsed.get(row.trigger_id)
            if not isinstance(defn, TriggerDef):
                self.unit.evict(row.trigger_id)
                continue
            if defn.kind == Kind.ONCE and row.consumed and defn.rollup.last_run_at is None:
                # The mirror's record predates this device's consumption write, which the
                # server took (the outbox no longer holds it) but which was not read back
                # before the restart: hold it until the server shows a newer version, or the
                # reconcile would take the stale record for a rewrite and fire the shot again.
                consumed = {RollupField.LAST_RUN_AT.value: row.armed_at, "enabled": False}
                self.records.hold(defn.id, consumed)
                held = self.records.parsed.get(defn.id)
                defn = held if isinstance(held, TriggerDef) else defn
            # Share the definition's strings rather than keep the row's copies of them.
            row.trigger_id, row.kind = defn.id, defn.kind
            if row.fingerprint == defn.fingerprint:
                row.fingerprint = defn.fingerprint
            entry = Entry(defn, row)
            if row.claimed_at is not None:
                self.unconfirmed.add(entry.id)
            self.registry.put(entry)
            stored = row.next_fire
            missed = defn.kind == Kind.CRON and (row.next_fire is None or row.next_fire <= now)
            if missed or (defn.kind == Kind.ONCE and not row.consumed):
                # A missed cron occurrence does not exist: re-arm strictly forward, no burst,
                # and say so in the mirror at once (its `scheduled_next` view reads the row).
                before = row.next_fire
                self.registry.arm(entry, now)
                if row.next_fire != before:
                    self.unit.save(row)
            elif self.registry.pull_back(entry, now):
                log.warning(
                    "%s was armed %.0f s ahead of its schedule (the wall clock stepped back): "
                    "re-armed from now",
                    defn.id,
                    (stored or now) - (row.next_fire or now),
                    extra={"trigger": defn.id},
                )
                self.unit.save(row)
            if defn.kind == Kind.CRON and (at := last_fired.get(defn.id)) is not None:
                self.registry.last_fired[defn.id] = at

    @collector_held()  # every id after a restart or a new verdict: anyrtd/heap.py
    def reconcile(self, ids: Iterable[str], now: float, verdict: str, peer_id: str) -> None:
        """Reconcile `ids` and apply the plan."""
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
        plan = reconcile(ids, self.records.parsed, views, ctx, self.records.pending_owner())
        for action in plan:
            self.apply(action, now, peer_id)

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
                entry = Entry(defn, new_row(defn, now, claimed=False), old.running if old else 0)
                self.registry.put(entry)
                self.registry.arm(entry, now)
                self.unit.save(entry.row)
                why = (
                    "definition changed"
                    if old is None or old.defn.fingerprint != defn.fingerprint
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
            if self.fence is not None and not self.unfenced(defn.id):
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
            auto_disabled = defn.rollup.last_status == LastStatus.AUTO_DISABLED
            unset = [RollupField.LAST_STATUS] if auto_disabled else []
            if defn.rollup.consecutive_failures or unset:
                self.unit.write_trigger(defn.id, {RollupField.CONSECUTIVE_FAILURES: 0}, unset=unset)
        self.registry.arm(entry, now)
        self.unit.save(entry.row)
        log.info("%s %s", "enabled" if enabled else "disabled", defn.id, extra={"trigger": defn.id})


__all__ = ["Apply"]
