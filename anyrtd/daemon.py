"""The daemon: wires the client, the mirror, the reconcile, the registry and the runner,
and owns the loops (tick, timer, change feed, outbox).

Each loop step is a method a test can call once: `tick()`, `fire_due(now)`,
`drain_outbox()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from anyrtd import claims, standing
from anyrtd.chat import CHAT_WATCH_PROGRAM, ChatWatch, ensure_chat_watch
from anyrtd.client import (
    Change,
    Dataset,
    Record,
    ServerClient,
    ServerError,
    ServerUnavailable,
    Upsert,
)
from anyrtd.clock import Clock, SystemClock
from anyrtd.config import Config
from anyrtd.election import AlwaysActive, Gate
from anyrtd.events import CHAT_DATASET, ChatMessage, LiveGate, event_target, fires, new_message
from anyrtd.metrics import Stats
from anyrtd.mirror import AsyncMirror, Mirror
from anyrtd.model import TriggerDef, health_marker
from anyrtd.outbox import RUNS, TRIGGERS, drain
from anyrtd.places import Places, resolve_places
from anyrtd.program import RunOutcome, RunRequest
from anyrtd.reconcile import (
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
from anyrtd.records import RecordCache
from anyrtd.registry import Entry, Registry, new_row
from anyrtd.rows import Batch, RunRow
from anyrtd.runner import Runner
from anyrtd.runs import rollup, run_record
from anyrtd.vocab import is_stamp, stamp

log = logging.getLogger("anyrtd.daemon")

FEED_WAIT_S = 25.0


def new_run_id() -> str:
    """Return a fresh run id."""
    return uuid.uuid4().hex


class Daemon:
    """One device's scheduler."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        client: ServerClient | None = None,
        gate: Gate | None = None,
        runner: Runner | None = None,
        confirm_after: float | None = None,
    ) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.client = client or ServerClient(config.server)
        self.gate: Gate = gate or AlwaysActive()
        self.runner = runner or Runner(
            client=self.client,
            clock=self.clock,
            agent_name=config.agent_name,
            space=config.space,
            commands=config.programs,
            timeout_s=config.run_timeout_s,
        )
        self.confirm_after = config.tick_s if confirm_after is None else confirm_after
        # Exactly once across replicas: the takeover hold and the claims' fencing tokens.
        self.fence = claims.Fence(
            hold_max_s=config.takeover_hold_s,
            tick_s=config.tick_s,
            lease_s=claims.LEASE_POLLS * config.election_poll_s,
        )
        self.records = RecordCache()
        self.registry = Registry()
        self.stats = Stats()
        self.places: Places | None = None
        self.peer_id: str | None = None
        self.db: AsyncMirror | None = None
        self.feed_available = True
        self.last_tick_at: float | None = None
        self.last_tick_mono: float | None = None
        self._batch = Batch()
        self._commit_lock = asyncio.Lock()
        self._dirty: set[str] = set()
        self._unconfirmed: set[str] = set()
        self._tombstones: set[str] = set()
        self._malformed_logged: dict[str, int | None] = {}
        self._cursor: int | None = None
        self._feed_buffer: list[Change | list[Record]] = []
        self._resolved = False
        self._last_full: float | None = None
        self._last_verdict: str | None = None
        self._wake = asyncio.Event()
        self._rearm = asyncio.Event()
        self._outbox_kick = asyncio.Event()
        self._drain_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._runs: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._server_away = False
        self.outbox_depth = 0
        self.runs_today = 0
        # Event triggers, the chat responder and the standing built-ins (docs/events.md,
        # docs/election.md).
        self.live = LiveGate(since=self.clock.now())
        self.chat = ChatWatch(
            agent_name=config.agent_name,
            client=self.client,
            clock=self.clock,
            scheduler=self,
            fire=self.converse,
        )
        self.chat_watch_id: str | None = None
        self._holding_role = False
        self.runner.install(CHAT_WATCH_PROGRAM, self.chat.converse)
        self.runner.install(
            standing.DECAY_PROGRAM,
            standing.decay_program(
                runs=lambda: self.places.runs if self.places is not None else None,
                prune_mirror=self._prune_runs,
                days=lambda: self.config.decay_days,
            ),
        )

    # start and stop

    async def open(self) -> None:
        """Open the mirror, close runs a crash left open, and restore the registry from it."""
        mirror = Mirror(self.config.mirror_path)
        self.db = AsyncMirror(mirror)
        await self.db.call(lambda m: m.ensure_schema(create=True))
        snap = await self.db.call(Mirror.snapshot)
        now = self.clock.now()
        self.peer_id = snap.meta.get("peer_id")
        # The mirror holds the outcome of a whole reconcile under this verdict: a restart
        # under the same verdict needs to reconcile only what changes from here on.
        self._last_verdict = snap.meta.get("verdict")
        self.places = Places.from_meta(snap.meta)
        cursor = snap.meta.get("cursor")
        self._cursor = int(cursor) if cursor is not None else None
        self._tombstones = set(snap.tombstones)
        after = ""
        while page := await self.db_call(functools.partial(Mirror.record_texts, after=after)):
            # A page at a time: the texts of 100,000 records never sit in memory together.
            for _, text in page:
                self.records.load(text)
            after = page[-1][0]
        for item in await self.db.call(lambda m: m.outbox_pending(1_000_000)):
            if item.dataset == TRIGGERS:
                self.records.write(item.record_id, item.fields, item.unset)
        for row in snap.entries:
            defn = self.records.parsed.get(row.trigger_id)
            if not isinstance(defn, TriggerDef):
                self._batch.evict.append(row.trigger_id)
                continue
            # Share the definition's strings rather than keep the row's copies of them.
            row.trigger_id, row.kind = defn.id, defn.kind
            if row.fingerprint == defn.fingerprint:
                row.fingerprint = defn.fingerprint
            entry = Entry(defn, row)
            if row.claimed_at is not None:
                self._unconfirmed.add(entry.id)
            self.registry.put(entry)
            missed = defn.kind == "cron" and (row.next_fire is None or row.next_fire <= now)
            if missed or (defn.kind == "once" and not row.consumed):
                # A missed cron occurrence does not exist: re-arm strictly forward, no burst.
                self.registry.arm(entry, now)
        # Before anything fires: close what a crash left running.
        await self._close_interrupted_runs(now)
        await self._commit(now)
        log.info(
            "mirror %s opened: %d records, %d entries restored, peer %s",
            self.config.mirror_path,
            len(self.records),
            len(self.registry),
            self.peer_id or "(unknown yet)",
        )

    async def _close_interrupted_runs(self, now: float) -> None:
        for row in await self.db_call(Mirror.open_runs):
            outcome = RunOutcome(
                status="interrupted",
                error_type=None,
                error="the daemon stopped while the run was in flight",
                started_at=row.started_at,
                ended_at=now,
                duration_ms=int(max(0.0, now - row.started_at) * 1000),
                result={},
                output=row.output,
                output_dropped=row.output_dropped,
            )
            log.warning(
                "run %s of %s was left running by a crash: closed as interrupted",
                row.run_id,
                row.trigger_id,
                extra={"trigger": row.trigger_id, "run": row.run_id},
            )
            entry = self.registry.get(row.trigger_id) if row.trigger_id is not None else None
            self._record_outcome(row, outcome, entry=entry)

    async def start(self) -> None:
        """Open, run the first reconcile, and start the loops."""
        if self.db is None:
            await self.open()
        await self.gate.boot()
        self.live.since = self.clock.now()
        # The first reconcile works on the server's records when it answers (READY=1 waits
        # for it); when it does not, it works on the mirror's and the sync loop keeps trying.
        with contextlib.suppress(ServerUnavailable, ServerError):
            await self.sync()
        await self.tick()
        self._tasks = [
            asyncio.create_task(self._loop(self._tick_loop), name="anyrtd-tick"),
            asyncio.create_task(self._loop(self._timer_loop), name="anyrtd-timer"),
            asyncio.create_task(self._loop(self._sync_loop), name="anyrtd-sync"),
            asyncio.create_task(self._loop(self._outbox_loop), name="anyrtd-outbox"),
        ]
        if self.gate.poll_interval_s is not None:
            self._tasks.append(
                asyncio.create_task(self._loop(self._election_loop), name="anyrtd-election")
            )

    async def stop(self) -> None:
        """Stop firing, let in-flight runs finish within the grace period, then interrupt them."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.chat.stop()
        if self._runs:
            log.info("waiting up to %.1fs for %d runs", self.config.grace_s, len(self._runs))
            _, pending = await asyncio.wait(set(self._runs), timeout=self.config.grace_s)
            if pending:
                log.warning("interrupting %d runs still in flight", len(pending))
                await self.runner.interrupt_all()
                await asyncio.wait(pending, timeout=10.0)
        await self._commit(self.clock.now())
        if self.places is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.drain_outbox(), timeout=5.0)
        if self.db is not None:
            await self.db.close()
            self.db = None
        await self.client.aclose()

    async def _loop(self, body: Callable[[], Awaitable[None]]) -> None:
        while not self._stopping:
            try:
                await body()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats.last_error = f"{exc.__class__.__name__}: {exc}"
                log.exception("loop %s failed; retrying", body.__name__)
                await asyncio.sleep(1.0)

    async def db_call(self, fn: Callable[[Mirror], Any]) -> Any:
        assert self.db is not None, "the mirror is not open"
        return await self.db.call(fn)

    def apply_config(self, new: Config) -> None:
        """Take the reloadable part of a new configuration; say what needs a restart."""
        fixed = ("server", "space", "agent_name", "listen", "state_dir", "token_file")
        changed = [k for k in fixed if getattr(new, k) != getattr(self.config, k)]
        if changed:
            log.warning("reload: %s changed; restart anyrtd to apply", ", ".join(changed))
        self.config = replace(new, **{k: getattr(self.config, k) for k in fixed})
        self.runner.configure(commands=new.programs, timeout_s=new.run_timeout_s)

    async def refresh_summary(self) -> None:
        """Read the outbox depth and today's run count from the mirror, for the status line."""
        now = self.clock.now()
        self.outbox_depth = await self.db_call(Mirror.outbox_depth)
        counts = await self.db_call(lambda m: m.run_counts(since=now - now % 86400))
        self.runs_today = sum(counts.values())

    async def write_through(
        self, trigger_id: str, fields: Mapping[str, Any], unset: Iterable[str] = ()
    ) -> TriggerDef | None:
        """Write fields of a trigger record on the server now, then reconcile it here.

        Used by the control API: the record is the source of truth, so a change made
        only in the registry would be reverted by the next reconcile. Raises
        `ServerUnavailable` or `ServerError` when the server does not take the write.
        """
        if self.places is None:
            raise ServerUnavailable("the server's datasets are not resolved yet")
        async with self._drain_lock:
            # This device's own writes still queued (a breaker trip, say) go first: sent
            # after the user's write, they would revert it.
            pending = await self._drain()
            if pending is not None and pending.error is not None:
                raise ServerUnavailable(pending.error)
            await self.client.upsert(
                self.places.triggers, [Upsert(id=trigger_id, fields=fields, unset=list(unset))]
            )
        records, _ = await self.client.query(self.places.triggers, filter={"id": trigger_id})
        for record in records:
            self._remember(record)
        now = self.clock.now()
        if self.peer_id is not None:
            self._reconcile([trigger_id], now, self.gate.verdict)
        await self._commit(now)
        self._rearm.set()
        parsed = self.records.parsed.get(trigger_id)
        return parsed if isinstance(parsed, TriggerDef) else None

    # the tick

    async def tick(self) -> None:
        """Sync the records, reconcile the registry on them, and persist what changed."""
        started = time.perf_counter()
        now = self.clock.now()
        self._apply_buffered()
        verdict = self.gate.verdict
        if self.fence.follow(verdict == "active", self.gate.term, now):
            self._last_verdict = None  # claiming may start or resume: reconcile every record
        ids: Iterable[str]
        if verdict != self._last_verdict:
            self._last_verdict = verdict
            self._batch.meta["verdict"] = verdict
            ids = set(self.records.ids()) | set(self.registry.entries)
            self._dirty.clear()
        else:
            ids = self._dirty | self._unconfirmed
            self._dirty = set()
        if self.peer_id is not None:
            self._sync_role(verdict, now)
            self._reconcile(ids, now, verdict)
            self._refresh_standing(ids, now)
            # The stand-down beat goes after this device's last claim (docs/election.md).
            cw = self.chat_watch_id
            beat = self.fence.handoff_due(now) if cw is not None else None
            if cw is not None and beat is not None:
                self.write_trigger(cw, beat)
        await self._commit(now)
        self._tend_chat_watch()
        self._rearm.set()
        self._outbox_kick.set()
        self.stats.ticks += 1
        self.last_tick_at = now
        self.last_tick_mono = self.clock.monotonic()
        self.stats.tick_duration.observe(time.perf_counter() - started)

    async def _try_resolve(self, now: float) -> None:
        try:
            places, peer = await self._resolve()
        except (ServerUnavailable, ServerError) as exc:
            self.stats.last_error = f"server: {exc}"
            if not self._server_away:
                self._server_away = True
                log.warning("the server is not answering (%s); running from the mirror", exc)
            return
        self._resolved = True
        if self._server_away:
            self._server_away = False
            log.info("the server answers again")
        if peer != self.peer_id:
            log.info("this device's peer id is %s", peer)
        self.places, self.peer_id = places, peer
        self._batch.meta.update({**places.to_meta(), "peer_id": peer})

    async def _resolve(self) -> tuple[Places, str]:
        places = await resolve_places(self.client, self.config.space)
        devices = await self.client.devices()
        peer = devices.self_id if devices is not None and devices.self_id else None
        if peer is None:
            peer = self.peer_id if self.peer_id and is_stamp(self.peer_id) else None
        if peer is None:
            peer = stamp(os.getpid())
        return places, peer

    def _apply_buffered(self) -> None:
        """Apply what the sync loop read since the last tick, in the order it was read."""
        buffered, self._feed_buffer = self._feed_buffer, []
        for item in buffered:
            if isinstance(item, Change):
                self._apply_change(item)
            else:
                self._apply_full_read(item)

    def _full_read_due(self, now: float) -> bool:
        return (
            self._last_full is None
            or not self.feed_available
            or now - self._last_full >= self.config.full_resync_s
        )

    async def _full_read(self, now: float) -> None:
        assert self.places is not None
        if self._cursor is None and self.feed_available:
            # Follow the feed from here on; what the full read below returns covers the rest.
            page = await self.client.changes(self.places.space, since=2**53, wait=0)
            if page is None:
                self._feature_feed_missing()
            else:
                self._cursor = page.seq
                self._batch.meta["cursor"] = str(page.seq)
        records = await self.client.query_all(self.places.triggers, include_deleted=True)
        self._feed_buffer.append(records)
        self._last_full = now

    def _apply_full_read(self, records: list[Record]) -> None:
        seen: set[str] = set()
        for record in records:
            rid = str(record.get("id", ""))
            seen.add(rid)
            if record.get("_deleted"):
                self._forget(rid)
            else:
                self._remember(record)
        for rid in [r for r in self.records.ids() if r not in seen]:
            self._forget(rid)

    def _feature_feed_missing(self) -> None:
        if self.feed_available:
            log.info("the server has no change feed: full queries every tick")
        self.feed_available = False

    def _remember(self, record: Mapping[str, Any]) -> None:
        self.fence.note(record)
        rid = self.records.put(record)
        if rid is not None:
            self._dirty.add(rid)
            self._batch.records.append((rid, self.records.version(rid), dict(record)))

    def _forget(self, rid: str) -> None:
        if rid not in self._tombstones:
            self._tombstones.add(rid)
            self._batch.tombstones.append(rid)
        if self.records.drop(rid):
            self._batch.forget_records.append(rid)
        self._dirty.add(rid)

    def _apply_change(self, change: Change) -> None:
        if change.op == "delete":
            self._forget(change.id)
        elif change.record is not None:
            self._remember({"id": change.id, **change.record})

    # reconcile and apply

    def _reconcile(self, ids: Iterable[str], now: float, verdict: str) -> None:
        assert self.peer_id is not None
        views = {
            rid: EntryView(e.row.fingerprint, e.row.enabled, e.row.marker, e.row.claimed_at)
            for rid in ids
            if (e := self.registry.get(rid)) is not None
        }
        ctx = Context(
            peer_id=self.peer_id,
            active=verdict == "active",
            now=now,
            confirm_after=self.fence.confirm_after(self.confirm_after, now),
            may_claim=self.fence.may_claim(now),
            mine=self.fence.mine,
            seen=self.fence.seen,
        )
        plan = reconcile(ids, self.records.parsed, views, ctx, self.records.pending_owner())
        for action in plan:
            self._apply(action, now)

    def _apply(self, action: object, now: float) -> None:
        match action:
            case Adopt(defn=defn, claim=claim):
                self._adopt(defn, claim, now)
            case Confirm(defn=defn):
                entry = self.registry.get(defn.id)
                if entry is not None:
                    entry.row.claimed_at = None
                    entry.defn = defn
                    self._unconfirmed.discard(defn.id)
                    self.registry.arm(entry, now)
                    self._save(entry)
                    log.info("claim of %s confirmed", defn.id, extra={"trigger": defn.id})
            case Refresh(defn=defn):
                old = self.registry.get(defn.id)
                entry = Entry(defn, new_row(defn, now, claimed=False), old.running if old else 0)
                self.registry.put(entry)
                self.registry.arm(entry, now)
                self._save(entry)
                log.info("refreshed %s: definition changed", defn.id, extra={"trigger": defn.id})
            case Toggle(defn=defn, enabled=enabled):
                self._toggle(defn, enabled, now)
            case Track(defn=defn):
                entry = self.registry.get(defn.id)
                if entry is not None:
                    entry.defn = defn
            case Evict(id=rid, reason=reason):
                if self.registry.remove(rid) is not None:
                    self._batch.evict.append(rid)
                    self._unconfirmed.discard(rid)
                    log.info("evicted %s: %s", rid, reason, extra={"trigger": rid})
            case Mark(id=rid, marker=marker):
                if marker is None:
                    self.write_trigger(rid, {}, unset=["lastStatus"])
                    log.info("health marker of %s cleared", rid, extra={"trigger": rid})
                else:
                    self.write_trigger(rid, {"lastStatus": marker})
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

    def _adopt(self, defn: TriggerDef, claim: bool, now: float) -> None:
        existing = self.registry.get(defn.id)
        if existing is not None:
            # Reassigned while in our registry: stamp it again and wait for the confirmation.
            existing.defn = defn
            existing.row.claimed_at = now if claim else None
            self.registry.put(existing)
            self.registry.arm(existing, now)
            entry = existing
        else:
            entry = Entry(defn, new_row(defn, now, claimed=claim))
            self.registry.put(entry)
            self.registry.arm(entry, now)
        if claim:
            assert self.peer_id is not None
            self._unconfirmed.add(defn.id)
            # chat-watch moves with the role on purpose: its stamp is a move, not a claim.
            cw = defn.id == self.chat_watch_id
            fencing = {} if cw else self.fence.claim_fields(defn.id, now)
            self.write_trigger(defn.id, {"owner": self.peer_id, **fencing})
            log.info("claimed %s", defn.id, extra={"trigger": defn.id})
        else:
            log.info("adopted %s (%s)", defn.id, defn.kind, extra={"trigger": defn.id})
        self._save(entry)

    def _toggle(self, defn: TriggerDef, enabled: bool, now: float) -> None:
        entry = self.registry.get(defn.id)
        if entry is None:
            return
        entry.defn = defn
        entry.row.enabled = enabled
        entry.row.marker = health_marker(defn, now)
        if enabled:
            entry.row.consecutive_failures = 0
            entry.row.armed_at = now
            unset = ["lastStatus"] if defn.rollup.last_status == "auto_disabled" else []
            if defn.rollup.consecutive_failures or unset:
                self.write_trigger(defn.id, {"consecutiveFailures": 0}, unset=unset)
        self.registry.arm(entry, now)
        self._save(entry)
        log.info("%s %s", "enabled" if enabled else "disabled", defn.id, extra={"trigger": defn.id})

    def _save(self, entry: Entry) -> None:
        self._batch.entries.append(entry.row)

    def write_trigger(self, rid: str, fields: Mapping[str, Any], unset: Iterable[str] = ()) -> None:
        """Queue a field-level write of a trigger record and lay it over the cache."""
        unset = list(unset)
        self._batch.write(TRIGGERS, rid, fields, unset)
        self.records.write(rid, fields, unset)

    async def _commit(self, now: float) -> None:
        """Write what is pending in one transaction; return once it is durable.

        Callers that arrive while a commit is in flight wait for it, and the first of them
        then writes everything pending at once (a group commit): a thousand runs ending
        together cost a few transactions, not a thousand.
        """
        if not self._batch:
            return
        async with self._commit_lock:
            await self._commit_pending(now)

    async def _commit_pending(self, now: float) -> None:
        batch, self._batch = self._batch, Batch()
        if batch and self.db is not None:
            try:
                await self.db.call(lambda m: m.commit(batch, now))
            except Exception:
                # One transaction, so nothing of it was written (say the mirror stayed locked
                # past busy_timeout): keep it for the next commit, ahead of what came since.
                self._batch = _merged(batch, self._batch)
                raise
            if batch.outbox:
                self._outbox_kick.set()

    # the active role: standing built-ins and chat-watch (docs/election.md)

    def _sync_role(self, verdict: str, now: float) -> None:
        """Take the active role's set (standing built-ins, chat-watch) or give it up."""
        if verdict == "active":
            if not self._holding_role:
                self._holding_role = True
                self._take_over(now)
            return
        if self._holding_role:
            self._holding_role = False
            self._stand_down(verdict)
        for s in standing.STANDING:
            # Entries restored from the mirror on a device that is not active.
            if self.registry.remove(s.id) is not None:
                self._batch.evict.append(s.id)

    def _take_over(self, now: float) -> None:
        assert self.peer_id is not None
        fresh = standing.entries(self.peer_id, self.records.raw, self.runner.is_installed, now)
        for entry in fresh:
            old = self.registry.get(entry.id)
            entry.running = old.running if old is not None else 0
            self.registry.put(entry)
            self.registry.arm(entry, now)  # strictly forward: no wake-and-replay burst
            self._save(entry)
            self.write_trigger(entry.id, standing.STANDING_BY_ID[entry.id].fields(self.peer_id))
        listed = [e.id for e in fresh if e.row.marker is not None]
        log.info(
            "took the active role: standing built-ins armed%s",
            f" ({', '.join(listed)} not installed)" if listed else "",
        )
        cw = self.chat_watch_id
        defn = self.records.parsed.get(cw) if cw is not None else None
        if isinstance(defn, TriggerDef) and defn.owner != self.peer_id:
            self._adopt(defn, claim=True, now=now)  # re-stamp it; it confirms like any claim

    def _stand_down(self, verdict: str) -> None:
        for s in standing.STANDING:
            if self.registry.remove(s.id) is not None:
                self._batch.evict.append(s.id)
        cw = self.chat_watch_id
        defn = self.records.parsed.get(cw) if cw is not None else None
        if isinstance(defn, TriggerDef) and defn.owner == self.peer_id:
            self.write_trigger(defn.id, {"owner": ""})  # so the new winner can take it
        dropped = self.chat.disconnect(f"this device is {verdict} now")
        log.info(
            "stood down (%s): standing built-ins stopped, chat-watch released%s",
            verdict,
            f", {dropped} deferred conversations dropped" if dropped else "",
        )

    def _refresh_standing(self, ids: Iterable[str], now: float) -> None:
        """Apply an `enabled` edit of a standing built-in's record to its entry."""
        if not self._holding_role or self.peer_id is None:
            return
        for rid in set(ids) & standing.STANDING_BUILTINS:
            entry = self.registry.get(rid)
            rec = self.records.parsed.get(rid)
            if (
                entry is not None
                and isinstance(rec, TriggerDef)
                and rec.enabled != entry.row.enabled
            ):
                defn = standing.definition(
                    standing.STANDING_BY_ID[rid], self.peer_id, self.records.raw(rid)
                )
                self._toggle(defn, rec.enabled, now)

    async def _seed_chat_watch(self) -> None:
        """Find the chat-watch record, or seed it when none exists (once per boot)."""
        assert self.places is not None
        try:
            rid, record = await ensure_chat_watch(
                self.client, self.places.triggers, self.places.space
            )
        except (ServerUnavailable, ServerError) as exc:
            log.debug("chat-watch not seeded yet: %s", exc)
            return
        self.chat_watch_id = rid
        triggers = self.places.triggers
        self._feed_buffer.append(
            Change(0, triggers.object_id, triggers.name, rid, "update", dict(record))
        )
        self._wake.set()

    def _tend_chat_watch(self) -> None:
        """Connect the chat watch while this device holds an enabled, confirmed chat-watch."""
        cw = self.chat_watch_id
        entry = self.registry.get(cw) if cw is not None else None
        target = None
        if (
            entry is not None
            and entry.confirmed
            and entry.row.enabled
            and entry.row.marker is None
            and entry.defn.program == CHAT_WATCH_PROGRAM
            and self.gate.verdict != "pruned"
        ):
            target = event_target(entry.defn, self.config.space)
        if target is None:
            if self.chat.connected:
                self.chat.disconnect("this device no longer holds an enabled chat-watch")
            return
        assert cw is not None
        self.chat.connect(cw, Dataset(target[0], target[1], CHAT_DATASET))

    # event triggers (docs/events.md)

    async def _listen(self, space: str) -> None:
        """Note the feed's head: messages up to it arrived before this process listened."""
        page = await self.client.changes(space, since=2**53, wait=0)
        if page is not None:
            self.live.heads.setdefault(space, page.seq)

    async def _route_events(self, changes: Iterable[Change], space: str) -> None:
        """Fire the event triggers (and offer chat-watch) the new messages among `changes`."""
        if self.gate.verdict == "pruned" or self.peer_id is None:
            return
        messages = [
            m for c in changes if (m := new_message(c, space)) is not None and self.live.admits(m)
        ]
        if not messages:
            return
        listening = [
            e.defn
            for rid in self.registry.events
            if (e := self.registry.entries[rid]).defn.kind == "event"
            and e.confirmed
            and e.row.enabled
            and e.row.marker is None
        ]
        now = self.clock.now()
        for message in messages:
            agent = self.config.agent_name
            for defn in fires(message, listening, agent_space=self.config.space, agent_name=agent):
                if defn.id == self.chat_watch_id and defn.program == CHAT_WATCH_PROGRAM:
                    self.chat.offer(message)
                elif (entry := self.registry.get(defn.id)) is not None:
                    await self._fire_event(entry, message, now)

    async def converse(self, trigger_id: str, message: ChatMessage) -> asyncio.Task[None] | None:
        """Start the chat-watch conversation run for `message`; return its task."""
        entry = self.registry.get(trigger_id)
        if entry is None or not (entry.confirmed and entry.row.enabled):
            return None
        return await self._fire_event(entry, message, self.clock.now())

    async def _fire_event(
        self, entry: Entry, message: ChatMessage, now: float
    ) -> asyncio.Task[None] | None:
        # The run serves the message: its scheduledAt is the message's createdAt.
        at = message.created_at if message.created_at is not None else now
        start = self._prepare(entry, at, now)
        if start is None:
            return None
        _, row, args = start
        args["event"] = message.payload()
        await self._commit(now)
        return self._spawn(entry, row, args)

    async def _prune_runs(self, before: float) -> int:
        return int(await self.db_call(lambda m: m.prune_runs(before)))

    # firing

    async def fire_due(self, now: float) -> list[str]:
        """Fire every entry due at or before `now`; return the run ids started."""
        due = self.registry.pop_due(now)
        if not due:
            return []
        starts = [s for entry, at in due if (s := self._prepare(entry, at, now)) is not None]
        await self._commit(now)
        for entry, row, args in starts:
            self._spawn(entry, row, args)
        return [row.run_id for _, row, _ in starts]

    async def run_now(self, trigger_id: str) -> str | None:
        """Run a registry entry now, outside its schedule; return the run id."""
        entry = self.registry.get(trigger_id)
        if entry is None:
            return None
        now = self.clock.now()
        start = self._prepare(entry, None, now)
        if start is None:
            return None
        await self._commit(now)
        self._spawn(*start)
        return start[1].run_id

    def _prepare(
        self, entry: Entry, due: float | None, now: float
    ) -> tuple[Entry, RunRow, dict[str, Any]] | None:
        defn = entry.defn
        assert self.peer_id is not None
        if due is not None:
            if self.gate.verdict == "pruned":
                log.info(
                    "not firing %s: this device is pruned", defn.id, extra={"trigger": defn.id}
                )
                entry.row.next_fire = None
                return None
            if defn.kind == "cron":
                self.registry.arm(entry, max(now, due))
                self._save(entry)
                if entry.running:
                    self.stats.overlap_skips += 1
                    log.info(
                        "skipped %s at %.3f: the previous run is still running",
                        defn.id,
                        due,
                        extra={"trigger": defn.id},
                    )
                    return None
            elif defn.kind == "once":
                # Consumed durably before the program starts: a crash never fires it twice.
                entry.row.consumed = True
                entry.row.enabled = False
                entry.row.next_fire = None
                self._save(entry)
                self.write_trigger(defn.id, {"enabled": False, "lastRunAt": now})
            self.stats.fire_lag.observe(max(0.0, now - due))
        self.stats.fires += 1
        row = RunRow(
            run_id=new_run_id(),
            trigger_id=defn.id,
            program=defn.program,
            device=self.peer_id,
            scheduled_at=due,
            started_at=now,
        )
        self._batch.runs.append(row)
        log.info(
            "firing %s (%s)%s",
            defn.id,
            defn.program,
            "" if due is not None else " by hand",
            extra={"trigger": defn.id, "run": row.run_id},
        )
        return entry, row, dict(defn.args)

    def _spawn(self, entry: Entry, row: RunRow, args: dict[str, Any]) -> asyncio.Task[None]:
        entry.running += 1
        task = asyncio.create_task(self._run(entry, row, args), name=f"run-{row.run_id}")
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)
        return task

    async def _run(self, entry: Entry, row: RunRow, args: dict[str, Any]) -> None:
        request = RunRequest(
            run_id=row.run_id,
            trigger_id=row.trigger_id,
            program=row.program,
            args=args,
            scheduled_at=row.scheduled_at,
            device=row.device,
        )
        try:
            outcome = await self.runner.run(request)
        finally:
            entry.running -= 1
        self._record_outcome(row, outcome, entry=self.registry.get(entry.id))
        await self._commit(self.clock.now())
        log.info(
            "run %s of %s ended %s%s",
            row.run_id,
            row.trigger_id,
            outcome.status,
            f" ({outcome.error_type}: {outcome.error})" if outcome.error_type else "",
            extra={"trigger": row.trigger_id, "run": row.run_id},
        )

    def _record_outcome(self, row: RunRow, outcome: RunOutcome, entry: Entry | None) -> None:
        """Close a run: its summary in the mirror, its record and the rollup in the outbox."""
        row.status = outcome.status
        row.ended_at = outcome.ended_at
        row.duration_ms = outcome.duration_ms
        row.error_type = outcome.error_type
        row.error = outcome.error
        row.result = dict(outcome.result)
        row.output = outcome.output
        row.output_dropped = outcome.output_dropped
        self._batch.runs.append(row)
        self._batch.write(RUNS, row.run_id, run_record(row))
        self.stats.runs_finished[outcome.status] += 1
        if row.trigger_id is None:
            return
        defn = entry.defn if entry is not None else None
        if defn is None and isinstance(
            parsed := self.records.parsed.get(row.trigger_id), TriggerDef
        ):
            defn = parsed
        if entry is not None:
            before = (entry.row.consecutive_failures, entry.row.run_count)
        elif defn is not None:
            before = (defn.rollup.consecutive_failures, defn.rollup.run_count)
        else:
            before = (0, 0)
        write = rollup(
            row,
            failures=before[0],
            run_count=before[1],
            limit=defn.max_consecutive_failures if defn is not None else 0,
            armed=entry is not None and entry.row.enabled,
        )
        if entry is not None:
            entry.row.consecutive_failures = write.failures
            entry.row.run_count = write.run_count
            if write.tripped:
                entry.row.enabled = False
                entry.row.next_fire = None
                log.warning(
                    "%s auto-disabled after %d consecutive failures",
                    row.trigger_id,
                    write.failures,
                    extra={"trigger": row.trigger_id, "run": row.run_id},
                )
            self._save(entry)
        self.write_trigger(row.trigger_id, write.fields)

    # the loops

    async def _tick_loop(self) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=self.config.tick_s)
        await self.tick()

    async def _timer_loop(self) -> None:
        due = self.registry.next_due()
        now = self.clock.now()
        if due is not None and due <= now:
            await self.fire_due(now)
            return
        self._rearm.clear()
        timeout = 60.0 if due is None else min(60.0, due - now)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._rearm.wait(), timeout=timeout)

    async def _sync_loop(self) -> None:
        try:
            await self.sync(wait=FEED_WAIT_S)
        except (ServerUnavailable, ServerError) as exc:
            log.debug("sync: %s", exc)
            await asyncio.sleep(min(self.config.tick_s, 2.0))
            return
        if not self._resolved or not self.feed_available:
            await asyncio.sleep(self.config.tick_s)

    async def sync(self, wait: float = 0.0) -> int:
        """Take one step of the sync loop; return how many trigger changes it buffered.

        Resolve the server when not yet done, re-read every record when a full read is
        due (the first one, every `full_resync_s`, or every step without a change feed),
        else follow the change feed, long-polling up to `wait` s. The tick applies what
        was buffered, so a tick itself never waits on the network.
        """
        now = self.clock.now()
        if not self._resolved:
            await self._try_resolve(now)
            if not self._resolved:
                return 0
        if self._full_read_due(now):
            await self._full_read(now)
            self._wake.set()
            return 1
        if self.places is None or self._cursor is None or not self.feed_available:
            return 0
        if self.chat_watch_id is None:
            await self._seed_chat_watch()
        if self.places.space not in self.live.heads:
            await self._listen(self.places.space)
        page = await self.client.changes(self.places.space, self._cursor, wait=wait)
        if page is None:
            self._feature_feed_missing()
            return 0
        await self._route_events(page.changes, self.places.space)
        relevant = [c for c in page.changes if self.places.matches_triggers(c)]
        arrived = (c.record for c in relevant if c.record is not None)
        self.fence.sample_lag(arrived, self.peer_id, self.clock.now())
        self._cursor = max(self._cursor, page.seq)
        self._batch.meta["cursor"] = str(self._cursor)
        if relevant:
            self._feed_buffer.extend(relevant)
            self._wake.set()
        return len(relevant)

    async def _election_loop(self) -> None:
        await asyncio.sleep(self.gate.poll_interval_s or 60.0)
        before = self.gate.verdict
        if await self.gate.poll() != before:
            self._wake.set()  # the next tick reconciles every id under the new verdict

    async def _outbox_loop(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._outbox_kick.wait(), timeout=5.0)
        self._outbox_kick.clear()
        result = await self.drain_outbox()
        if result is not None and result.error:
            await asyncio.sleep(1.0)

    async def drain_outbox(self) -> Any:
        """Send what the outbox holds; note the acknowledged trigger writes in the cache."""
        async with self._drain_lock:
            return await self._drain()

    async def _drain(self) -> Any:
        if self.places is None or self.db is None:
            return None
        result = await drain(self.db, self.client, self._locate)
        for dataset, rid, version in result.acked:
            if dataset == TRIGGERS:
                self.records.acked(rid, version)
                self._dirty.add(rid)
        return result

    def _locate(self, dataset: str) -> Dataset | None:
        if self.places is None:
            return None
        return {TRIGGERS: self.places.triggers, RUNS: self.places.runs}.get(dataset)


def _merged(first: Batch, then: Batch) -> Batch:
    """Return one batch holding the writes of `first`, then those of `then`."""
    out = Batch(meta={**first.meta, **then.meta})
    for f in dataclasses.fields(Batch):
        if f.name != "meta":
            setattr(out, f.name, [*getattr(first, f.name), *getattr(then, f.name)])
    return out


__all__ = ["Daemon"]
