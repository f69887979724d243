"""The daemon: wires the stages together and owns the loops (tick, timer, sync, outbox, poll).

The stages (`unit`, `sync`, `apply`, `firing`, `timer`, `role`; docs/architecture.md) are
each given what they call when they are built. Each loop step is
a method a test can call once: `sync()`, `tick()`, `fire_due(now)`, `drain_outbox()`. The
control API and the chat responder use the daemon's `port` (`anyrtd.daemon_port`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from anyrtd import standing
from anyrtd.apply import SPREAD_STALL_S, Apply
from anyrtd.chat import CHAT_WATCH_ONLY, ChatWatch
from anyrtd.claims import Fence
from anyrtd.client import ServerClient, ServerError, ServerUnavailable, Upsert
from anyrtd.clock import Clock, Slice, SystemClock, Ticks
from anyrtd.config import Config
from anyrtd.daemon_port import DaemonPort
from anyrtd.election import AlwaysActive, Gate
from anyrtd.firing import Firing
from anyrtd.metrics import Stats
from anyrtd.mirror import AsyncMirror, Mirror
from anyrtd.mirror_guard import MirrorFault
from anyrtd.missed import Skips
from anyrtd.model import TriggerDef
from anyrtd.notices import Notices
from anyrtd.outbox import RETRY_S, RUNS, TRIGGERS, WINDOW_S, DrainResult, DrainWake, drain
from anyrtd.places import Places
from anyrtd.records import ACK_SLICE, RecordCache
from anyrtd.registry import Registry
from anyrtd.role import Role
from anyrtd.runner import Runner
from anyrtd.runner.marks import MARKS_DIR, Marks
from anyrtd.sync import TICK_CHANGES, Sync
from anyrtd.timer import CLEAR_STALL_S, Ahead, Timer
from anyrtd.unit import CommitFailed, Unit, is_disk_full
from anyrtd.vocab import CHAT_WATCH_PROGRAM, Verdict

log = logging.getLogger("anyrtd.daemon")

FEED_WAIT_S = 25.0
REFUSED = "reload refused: "
"""The start of `last_error` after a refused reload; a good reload clears it."""


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
        hurry: asyncio.Event | None = None,
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
            marks=Marks(config.mirror_path.parent / MARKS_DIR),
        )
        self.records = RecordCache()
        self.registry = Registry()
        self.stats = Stats()
        self.last_tick_at: float | None = None
        self.last_tick_mono: float | None = None
        self.outbox_depth = 0
        self.runs_today = 0
        self._reconciled_as: tuple[str | None, str | None] = (None, None)  # (verdict, peer id)
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self.ticks = Ticks()
        """The ends of the ticks, which the notices' pass and the spaces loop wait for."""
        self._outbox_wake = DrainWake()
        self._drain_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.hurry = hurry or asyncio.Event()
        """Set by a second stop signal: interrupt the runs in flight at once."""
        # The stages, each built with what it calls (docs/architecture.md).
        self.unit = Unit(self.records, on_outbox=self._outbox_wake.queued)
        self.fence = Fence.of(config)
        self.skips = Skips()  # noted by the firing, listed by the missed watch
        self.firing = Firing(
            registry=self.registry,
            records=self.records,
            unit=self.unit,
            runner=self.runner,
            stats=self.stats,
            clock=self.clock,
            skips=self.skips,
            by_hand=self.runner.by_hand,
        )
        # The batches prepared ahead: a tick, the drain and a large feed page wait for their
        # starts to pass (`clear_of`); a changed trigger's prepared run is cancelled there.
        self.ahead = Ahead(self.registry, self.firing, self.clock)
        self.sync_stage = sync = Sync(
            self.client,
            config.space,
            self.records,
            self.unit,
            self.stats,
            self.fence,
            pace=self.ahead,
        )
        self.apply = Apply(
            registry=self.registry,
            records=self.records,
            unit=self.unit,
            stats=self.stats,
            # A claim is confirmed once its stamp is seen back (the fence adds a round trip
            # after a hold without the beat): waiting a tick more made it a tick late.
            confirm_after=0.0 if confirm_after is None else confirm_after,
            fence=self.fence,
            cancel=self.ahead.cancel,  # a prepared run of a changed trigger
            clock=self.clock,
        )
        gate = self.gate
        self.timer = Timer(  # prepares each due batch ahead, starts it on time
            self.registry,
            self.firing,
            self.clock,
            lambda: (sync.peer_id, gate.verdict),
            unit=self.unit,
            ahead=self.ahead,
            settle=self.apply,  # what a spread reconcile has not reached yet, as it comes due
        )
        self.notices = Notices(self)  # missed occurrences and notices (docs/notices.md)
        self.port = DaemonPort(  # what the control API and the chat responder use
            self,
            notices=self.notices,
            clock=self.clock,
            client=self.client,
            gate=self.gate,
            fence=self.fence,
            registry=self.registry,
            records=self.records,
            sync=self.sync_stage,
            unit=self.unit,
            firing=self.firing,
            runner=self.runner,
            stats=self.stats,
            chains=self.apply.chains,
        )
        # Event triggers, the chat responder, the standing built-ins (docs/events.md).
        self.role = Role(
            agent_name=config.agent_name,
            space=config.space,
            client=self.client,
            clock=self.clock,
            gate=self.gate,
            sync=self.sync_stage,
            registry=self.registry,
            records=self.records,
            unit=self.unit,
            apply=self.apply,
            firing=self.firing,
            runner=self.runner,
            stats=self.stats,
            port=self.port,
            ticks=self.ticks,
            pace=self.ahead,
        )
        self.runner.install(CHAT_WATCH_PROGRAM, self.role.chat.converse, event_only=CHAT_WATCH_ONLY)
        self.runner.install(
            standing.DECAY_PROGRAM,
            standing.decay_program(
                runs=lambda: self.places.runs if self.places is not None else None,
                prune_mirror=lambda before: self.db_call(lambda m: m.prune_runs(before)),
                days=lambda: self.config.decay_days,
            ),
            idempotent=True,  # a deletion by age: a second run deletes nothing more
        )

    # what the stages hold, read through the daemon

    @property
    def db(self) -> AsyncMirror | None:
        """The mirror, while it is open."""
        return self.unit.db

    @property
    def peer_id(self) -> str | None:
        return self.sync_stage.peer_id

    @property
    def places(self) -> Places | None:
        return self.sync_stage.places

    @property
    def chat(self) -> ChatWatch:
        return self.role.chat

    # start and stop

    async def open(self) -> None:
        """Open the mirror, close runs a crash left open, and restore the registry from it."""
        kept = lambda: self.config.runs_kept_per_trigger  # noqa: E731 - read at each commit
        db = self.unit.open(AsyncMirror(Mirror(self.config.mirror_path, runs_kept=kept)))
        await db.call(lambda m: m.ensure_schema(create=True))
        snap = await db.call(Mirror.snapshot)
        now = self.clock.now()
        # The mirror holds a whole reconcile under this verdict and peer id: changes only now.
        self._reconciled_as = (snap.meta.get("verdict"), snap.meta.get("peer_id"))
        # Before anything fires: discard what a crash left prepared, close what it left running.
        left = await self.db_call(Mirror.open_runs)
        left = await self.timer.settle_open(left, snap.entries, snap.last_fired, now)
        self.sync_stage.restore(snap.meta, snap.tombstones)
        await self.sync_stage.load(db)
        self.apply.restore(snap.entries, now, snap.last_fired)
        again = await self.firing.close_interrupted(left, now)
        await self.unit.commit(now)
        if (marks := self.runner.marks) is not None:
            marks.sweep(())  # every open run's outcome is in the mirror now
        self.firing.rerun(again, now)
        log.info(
            "mirror %s opened: %d records, %d entries restored, peer %s",
            self.config.mirror_path,
            len(self.records),
            len(self.registry),
            self.peer_id or "(unknown yet)",
        )

    async def start(self) -> None:
        """Open, run the first reconcile, and start the loops."""
        if self.db is None:
            await self.open()
        await self.gate.boot()
        self.role.begin(self.clock.now())
        # The first reconcile works on the server's records when it answers (READY=1 waits
        # for it); when it does not, it works on the mirror's and the sync loop keeps trying.
        with contextlib.suppress(ServerUnavailable, ServerError):
            await self.sync()
        await self.tick()
        while self.sync_stage.pending:  # the first full read to its end, a slice a tick
            await asyncio.sleep(0)  # the control API's turn between them
            await self.tick()
        self._tasks = [
            asyncio.create_task(self._loop(self._tick_loop), name="anyrtd-tick"),
            asyncio.create_task(self._loop(self.timer.step), name="anyrtd-timer"),
            asyncio.create_task(self._loop(self._sync_loop), name="anyrtd-sync"),
            asyncio.create_task(self._loop(self._outbox_loop), name="anyrtd-outbox"),
            asyncio.create_task(self._loop(self.role.follow_spaces), name="anyrtd-spaces"),
            asyncio.create_task(self._loop(self.notices.loop), name="anyrtd-notices"),
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
        await self.timer.close("the daemon stops")
        await self.chat.stop()
        if runs := self.firing.in_flight:
            grace = self.config.grace_s
            log.info("waiting up to %.1fs for %d runs (stop again: now)", grace, len(runs))
            if pending := await self.firing.settle(grace, self.hurry):
                log.warning("interrupting %d runs still in flight", len(pending))
                await self.runner.interrupt_all()
                await asyncio.wait(pending, timeout=10.0)
        with contextlib.suppress(CommitFailed):  # the unit logged why
            await self.unit.commit(self.clock.now())
        if self.places is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.drain_outbox(), timeout=5.0)
        await self.unit.close()
        await self.client.aclose()

    async def wait_idle(self) -> None:
        """Return once no run is in flight."""
        await self.firing.wait_idle()

    async def _loop(self, body: Callable[[], Awaitable[None]]) -> None:
        while not self._stopping:
            try:
                await body()
            except asyncio.CancelledError:
                raise
            except MirrorFault as exc:  # serve stops on it with the one error: a warning here
                self.stats.last_error = str(exc)
                log.warning("loop %s stopped: %s", body.__name__, exc)
                return
            except Exception as exc:
                self.stats.last_error = f"{exc.__class__.__name__}: {exc}"
                if isinstance(exc, CommitFailed) or is_disk_full(exc):
                    self.unit.note_failed(exc, self.clock.now())  # logged once an episode
                else:
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
        if self.stats.last_error and self.stats.last_error.startswith(REFUSED):
            self.stats.last_error = None

    def refuse_config(self, error: Exception) -> None:
        """Keep the running configuration: a reload read a bad one (`last_error` says why)."""
        self.stats.last_error = f"{REFUSED}{error}"

    async def refresh_summary(self, *, runs: bool = True) -> None:
        """Read the outbox depth (which `/healthz` reports too) and, with `runs`, today's run
        count from the mirror, for the status line."""
        now = self.clock.now()
        assert self.db is not None
        self.outbox_depth = await self.db.outbox_depth()
        if runs:
            counts = await self.db_call(lambda m: m.run_counts(since=now - now % 86400))
            self.runs_today = sum(counts.values())

    async def count_outbox(self) -> tuple[int, int]:
        """Count the outbox again (the status line shows the depth too); return its depth and
        the writes set aside."""
        self.outbox_depth, aside = await self.db_call(Mirror.outbox_counts)
        return self.outbox_depth, aside

    def tick_age(self) -> float | None:
        """Return the seconds since the last tick ended (monotonic); None before the first."""
        if self.last_tick_mono is None:
            return None
        return max(0.0, self.clock.monotonic() - self.last_tick_mono)

    # the steps

    async def tick(self) -> None:
        """Apply what sync read, reconcile the registry on it, and persist what changed."""
        started = time.perf_counter()
        now = self.clock.now()
        # One slice of the loop's time for the tick's work: the changes sync read, then
        # what the reconcile reaches (each takes at least one piece, so both go on).
        within = Slice()
        self._dirty |= self.sync_stage.apply_buffered(TICK_CHANGES, within)
        verdict = self.gate.verdict
        if self.fence.follow(verdict == Verdict.ACTIVE, self.gate.term, now):
            self._reconciled_as = (None, None)  # claiming may start or resume: reconcile all
        if (verdict, self.peer_id) != self._reconciled_as:  # every id, over the next ticks
            self._reconciled_as = (verdict, self.peer_id)
            self.apply.spread([*self.records.ids(), *self.registry.entries], verdict)
        ids, self._dirty = self._dirty, set()
        if (peer := self.peer_id) is not None:
            self.role.follow_verdict(verdict, now, peer)
            ids = self.apply.step(ids, now, verdict, peer, within)
            self.role.refresh_standing(ids, now, peer)
            self.role.hand_off(self.fence, now)
        await self.unit.commit_step(now)  # a full disk is waited out; a lock stalls the tick
        self.role.tend_chat_watch()  # what the tick reconciled may be its record
        self.timer.rearm.set()
        self._outbox_wake.tick()
        if self.sync_stage.pending or self.apply.spreading:  # the next tick, after the timer's
            self._wake.set()
        self.stats.ticks += 1
        self.last_tick_at = now
        self.last_tick_mono = self.clock.monotonic()
        self.stats.tick_duration.observe(time.perf_counter() - started)
        self.ticks.end()  # the notices' pass and the spaces loop, in this wake of the process

    async def sync(self, wait: float = 0.0) -> int:
        """Take one step of the sync loop; return how many buffered changes a tick should
        apply soon. Resolve the server when not yet done, re-read every record when due
        (the first time, every `full_resync_s`, or every step without a change feed), else
        follow the feed (long-polling up to `wait` s) and route new chat messages."""
        now = self.clock.now()
        sync = self.sync_stage
        if not sync.resolved:
            await sync.resolve(now, self.gate.self_id)
            if not sync.resolved:
                return 0
        if sync.full_read_due(now, self.config.full_resync_s):
            await sync.full_read(now)
            self._wake.set()
            return 1
        if sync.places is None or not sync.following:
            return 0
        space = sync.places.space
        if self.role.chat_watch_id is None and await self.role.seed_chat_watch():
            self._wake.set()
        await self.role.listen(space)
        page = await sync.read_feed(wait)
        if page is None:
            return 0
        await self.role.route_events(page.changes, space)
        taken = sync.take(page, self.clock.now())
        if taken:
            self._wake.set()
        return taken

    async def fire_due(self, now: float) -> list[str]:
        """Fire every entry due at or before `now`; return the run ids started."""
        return await self.timer.fire_now(now)

    async def drain_outbox(self) -> DrainResult | None:
        """Send what the outbox holds; note in the cache the trigger writes the server took, and
        those it dropped (a claim that met a newer owner: the server's record shows again)."""
        async with self._drain_lock:
            return await self._drain()

    async def clear_of_commit(self, work_s: float = CLEAR_STALL_S) -> None:
        """Wait for a start due sooner than `work_s` of the event loop, then a commit, would
        hold it up: twice the mirror's recent slowest call (`AsyncMirror.slow_s`), the work's
        commit and the fire's that would queue behind it."""
        await self.timer.clear_of(work_s + 2 * self.unit.wait_s())

    async def give_way(self) -> None:
        """Let a start due soon pass, then the event loop's other work take a turn (between
        two slices of work that would hold the loop)."""
        await self.timer.clear_of()
        await asyncio.sleep(0)

    async def _drain(self) -> DrainResult | None:
        if (places := self.places) is None or self.db is None:
            return None
        datasets = {TRIGGERS: places.triggers, RUNS: places.runs}
        # Each round's encoding and commit must not hold up a start.
        pace = self.clear_of_commit
        result = await drain(self.db, self.client, datasets.get, now=self.clock.now, pace=pace)
        writes = result.trigger_writes()  # a drain's rounds can take thousands
        at = 0
        acked_claim = False
        while at < len(writes):
            if at:
                await self.give_way()
            within = Slice()  # an acknowledgement parses the record again: a huge one costs
            for rid, version in writes[at : at + ACK_SLICE]:
                self.sync_stage.acked(rid, version)
                self._dirty.add(rid)
                acked_claim = acked_claim or rid in self.apply.unconfirmed
                at += 1
                if within.over():
                    break
        if result.lost or acked_claim:
            self._wake.set()  # a claim the server took is confirmed at once, not a tick on
        return result

    # the loops

    async def _tick_loop(self) -> None:
        # A wake set during the last tick counts. `asyncio.timeout`, not `wait_for`, which
        # in 3.11 makes a task of the wait each tick.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.tick_s):
                await self._wake.wait()
        self._wake.clear()
        # A tick holds the loop for milliseconds (with a slice of a spread or of a burst of
        # changes, tens), then the mirror for its commit, which a fire's commit would wait
        # behind (a disk another process keeps busy: up to 0.5 s): not over a start.
        sliced = self.apply.spreading or self.sync_stage.pending
        await self.clear_of_commit(SPREAD_STALL_S if sliced else CLEAR_STALL_S)
        await self.tick()

    async def _sync_loop(self) -> None:
        try:
            await self.sync(wait=FEED_WAIT_S)
        except (ServerUnavailable, ServerError) as exc:
            log.debug("sync: %s", exc)
            wait = exc.retry_after if isinstance(exc, ServerUnavailable) else None
            await asyncio.sleep(max(min(self.config.tick_s, 2.0), wait or 0.0))
            return
        if not self.sync_stage.resolved or not self.sync_stage.feed_available:
            await asyncio.sleep(self.config.tick_s)
        elif self.sync_stage.feed_backoff_s:  # a misbehaving feed (anyrtd/sync.py)
            # ... but not past a read of every record wanted at once (versions went back)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sync_stage.feed_backoff_s):
                    await self.sync_stage.reread.wait()

    async def _election_loop(self) -> None:
        await asyncio.sleep(self.gate.poll_interval_s or 60.0)
        before = self.gate.verdict
        if any([await self.gate.poll() != before, self.sync_stage.follow(self.gate.self_id)]):
            self._wake.set()  # a new verdict or peer id (both read): the next tick reconciles all

    async def _outbox_loop(self) -> None:
        await self._outbox_wake.wait(retry_s=5.0)
        await asyncio.sleep(WINDOW_S)  # let the writes of several batches gather
        result = await self.drain_outbox()
        self._outbox_wake.drained(result)
        if result is not None and result.error:  # the wait a 429 or a 503 asked for, if longer
            await asyncio.sleep(max(RETRY_S, result.retry_after or 0.0))

    # the commands the port hands to the daemon's steps (anyrtd.daemon_port)

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
            before = self.records.version(trigger_id)
            versions = await self.client.upsert(
                self.places.triggers, [Upsert(trigger_id, fields, unset=list(unset))]
            )
        self.sync_stage.written(trigger_id, before, versions.get(trigger_id))
        records, _ = await self.client.query(self.places.triggers, filter={"id": trigger_id})
        for record in records:
            if (rid := self.sync_stage.remember(record)) is not None:
                self._dirty.add(rid)
        now = self.clock.now()
        if self.peer_id is not None:
            self.apply.reconcile([trigger_id], now, self.gate.verdict, self.peer_id)
        with contextlib.suppress(CommitFailed):  # the server took it; ours wait for the mirror
            await self.unit.commit(now)
        self.timer.rearm.set()
        parsed = self.records.parsed.get(trigger_id)
        return parsed if isinstance(parsed, TriggerDef) else None


__all__ = ["REFUSED", "Daemon"]
