"""The daemon: wires the stages together and owns the loops (tick, timer, sync, outbox, poll).

The stages (`unit`, `sync`, `apply`, `firing`, `role`; docs/architecture.md) take what they
need as arguments. Each loop step is a method a test can call once: `sync()`, `tick()`,
`fire_due(now)`, `drain_outbox()`. The daemon implements `anyrtd.port.Port`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from anyrtd import history, standing
from anyrtd.apply import SPREAD_STALL_S, Apply
from anyrtd.chat import CHAT_WATCH_ONLY, CHAT_WATCH_PROGRAM, ChatWatch
from anyrtd.claims import Fence
from anyrtd.client import ServerClient, ServerError, ServerUnavailable, Upsert
from anyrtd.clock import Clock, SystemClock
from anyrtd.config import Config
from anyrtd.election import AlwaysActive, Gate
from anyrtd.firing import Firing
from anyrtd.metrics import Stats
from anyrtd.mirror import AsyncMirror, Mirror
from anyrtd.mirror_guard import MirrorFault
from anyrtd.model import TriggerDef
from anyrtd.outbox import RUNS, TRIGGERS, WINDOW_S, DrainResult, DrainWake, drain
from anyrtd.places import Places
from anyrtd.port import Health, Metrics, TriggerFacts, Triggers, server_reasons
from anyrtd.records import RecordCache
from anyrtd.registry import Registry
from anyrtd.role import Role
from anyrtd.rows import RunRow
from anyrtd.runner import Runner
from anyrtd.sync import TICK_CHANGES, Sync
from anyrtd.timer import CLEAR_STALL_S, Timer
from anyrtd.unit import CommitFailed, Unit, is_disk_full
from anyrtd.vocab import Verdict
from anyrtd.why_facts import Explains

log = logging.getLogger("anyrtd.daemon")

FEED_WAIT_S = 25.0


class Daemon(Explains):  # `why` is anyrtd.why_facts.ask
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
        self._client = client or ServerClient(config.server)
        self.gate: Gate = gate or AlwaysActive()
        self.runner = runner or Runner(
            client=self.client,
            clock=self.clock,
            agent_name=config.agent_name,
            space=config.space,
            commands=config.programs,
            timeout_s=config.run_timeout_s,
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
        self._outbox_wake = DrainWake()
        self._drain_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.hurry = asyncio.Event()  # set by a second stop signal: interrupt runs at once
        self.unit = Unit(self.records, on_outbox=self._outbox_wake.queued)  # the stages, in order
        self.fence = Fence.of(config)
        self.sync_stage = Sync(
            self.client, config.space, self.records, self.unit, self.stats, self.fence
        )
        self.apply = Apply(
            registry=self.registry,
            records=self.records,
            unit=self.unit,
            stats=self.stats,
            confirm_after=config.tick_s if confirm_after is None else confirm_after,
            fence=self.fence,
            unfenced=lambda rid: rid == self.role.chat_watch_id,
            cancel=lambda rid: self.timer.cancel(rid),  # a prepared run of a changed trigger
            clock=self.clock,
        )
        self.firing = Firing(
            registry=self.registry,
            records=self.records,
            unit=self.unit,
            runner=self.runner,
            stats=self.stats,
            clock=self.clock,
            by_hand=self.runner.by_hand,
        )
        self.timer = Timer(  # prepares each due batch ahead, starts it on time
            self.registry, self.firing, self.clock, lambda: (self.peer_id, self.gate.verdict)
        )
        self.client.pace = self.timer.clear_of  # a large feed page waits for a start to pass
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
            port=self,
        )
        self.runner.install(CHAT_WATCH_PROGRAM, self.role.chat.converse, event_only=CHAT_WATCH_ONLY)
        self.runner.install(
            standing.DECAY_PROGRAM,
            standing.decay_program(
                runs=lambda: self.places.runs if self.places is not None else None,
                prune_mirror=lambda before: self.db_call(lambda m: m.prune_runs(before)),
                days=lambda: self.config.decay_days,
            ),
        )

    # what the stages hold, read through the daemon

    @property
    def client(self) -> ServerClient:
        """The server's client; set it to make every stage talk to a server's new address."""
        return self._client

    @client.setter
    def client(self, client: ServerClient) -> None:
        self._client = client
        self.sync_stage.client = self.role.client = self.role.chat.client = client

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
        db = self.unit.db = AsyncMirror(Mirror(self.config.mirror_path))
        await db.call(lambda m: m.ensure_schema(create=True))
        snap = await db.call(Mirror.snapshot)
        now = self.clock.now()
        # The mirror holds a whole reconcile under this verdict and peer id: changes only now.
        self._reconciled_as = (snap.meta.get("verdict"), snap.meta.get("peer_id"))
        # Before anything fires: discard what a crash left prepared, close what it left running.
        left = await self.db_call(Mirror.open_runs)
        left = await self.timer.discard_prepared(left, snap.entries, snap.last_fired, now)
        self.sync_stage.restore(snap.meta, snap.tombstones)
        await self.sync_stage.load(db)
        self.apply.restore(snap.entries, now, snap.last_fired)
        await self.firing.close_interrupted(left, now)
        await self.unit.commit(now)
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
        self.role.live.since = self.clock.now()
        # The first reconcile works on the server's records when it answers (READY=1 waits
        # for it); when it does not, it works on the mirror's and the sync loop keeps trying.
        with contextlib.suppress(ServerUnavailable, ServerError):
            await self.sync()
        await self.tick()
        self._tasks = [
            asyncio.create_task(self._loop(self._tick_loop), name="anyrtd-tick"),
            asyncio.create_task(self._loop(self.timer.step), name="anyrtd-timer"),
            asyncio.create_task(self._loop(self._sync_loop), name="anyrtd-sync"),
            asyncio.create_task(self._loop(self._outbox_loop), name="anyrtd-outbox"),
            asyncio.create_task(self._loop(self.role.follow_spaces), name="anyrtd-spaces"),
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
        if self.db is not None:
            await self.db.close()
            self.unit.db = None
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
            except MirrorFault as exc:  # serve stops the process on it: no retry, no traceback
                self.stats.last_error = str(exc)
                log.error("loop %s stopped: %s", body.__name__, exc)
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

    # the steps

    async def tick(self) -> None:
        """Apply what sync read, reconcile the registry on it, and persist what changed."""
        started = time.perf_counter()
        now = self.clock.now()
        self._dirty |= self.sync_stage.apply_buffered(TICK_CHANGES)
        verdict = self.gate.verdict
        if self.fence.follow(verdict == Verdict.ACTIVE, self.gate.term, now):
            self._reconciled_as = (None, None)  # claiming may start or resume: reconcile all
        if (verdict, self.peer_id) != self._reconciled_as:  # every id, over the next ticks
            self._reconciled_as = (verdict, self.peer_id)
            self.apply.spread([*self.records.ids(), *self.registry.entries], verdict)
        ids, self._dirty = self._dirty | self.apply.unconfirmed, set()
        if (peer := self.peer_id) is not None:
            self.role.follow_verdict(verdict, now, peer)
            ids = self.apply.step(ids, now, verdict, peer)  # and a slice of every id
            self.role.refresh_standing(ids, now, peer)
            self.role.hand_off(self.fence, now)
        await self.unit.commit_step(now)  # a full disk is waited out; a lock stalls the tick
        self.role.after_tick()  # the chat watch, and the spaces event triggers follow
        self.timer.rearm.set()
        self._outbox_wake.tick()
        if self.sync_stage.pending or self.apply.spreading:  # the next tick, after the timer's
            self._wake.set()
        self.stats.ticks += 1
        self.last_tick_at = now
        self.last_tick_mono = self.clock.monotonic()
        self.stats.tick_duration.observe(time.perf_counter() - started)

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

    async def _drain(self) -> DrainResult | None:
        if (places := self.places) is None or self.db is None:
            return None
        datasets = {TRIGGERS: places.triggers, RUNS: places.runs}
        result = await drain(self.db, self.client, datasets.get, now=self.clock.now)
        for rid, version in result.trigger_writes():
            self.records.acked(rid, version)
            self._dirty.add(rid)
        if result.lost:
            self._wake.set()
        return result

    # the loops

    async def _tick_loop(self) -> None:
        with contextlib.suppress(TimeoutError):  # a wake set during the last tick counts
            await asyncio.wait_for(self._wake.wait(), timeout=self.config.tick_s)
        self._wake.clear()
        # A tick holds the loop for milliseconds (with a spread's slice, tens): not over a start.
        await self.timer.clear_of(SPREAD_STALL_S if self.apply.spreading else CLEAR_STALL_S)
        await self.tick()

    async def _sync_loop(self) -> None:
        try:
            await self.sync(wait=FEED_WAIT_S)
        except (ServerUnavailable, ServerError) as exc:
            log.debug("sync: %s", exc)
            await asyncio.sleep(min(self.config.tick_s, 2.0))
            return
        if not self.sync_stage.resolved or not self.sync_stage.feed_available:
            await asyncio.sleep(self.config.tick_s)

    async def _election_loop(self) -> None:
        await asyncio.sleep(self.gate.poll_interval_s or 60.0)
        before = self.gate.verdict
        if any([await self.gate.poll() != before, self.sync_stage.follow(self.gate.self_id)]):
            self._wake.set()  # a new verdict or peer id (both read): the next tick reconciles all

    async def _outbox_loop(self) -> None:
        if not await self._outbox_wake.wait(timeout=5.0):
            return  # nothing queued since the last drain took all there was
        await asyncio.sleep(WINDOW_S)  # let the writes of several batches gather
        await self.timer.clear_of()  # encoding them must not hold up a start
        result = await self.drain_outbox()
        self._outbox_wake.drained(result)
        if result is not None and result.error:
            await asyncio.sleep(1.0)

    # the port (anyrtd.port.Port, which documents each): what the control API and the chat
    # responder use

    def triggers(self) -> Triggers:
        r, now, refuse = self.records, self.clock.now(), self.firing.refusal
        return Triggers(self.registry.entries, r.parsed, r.raw, self.peer_id, now, refuse)

    def trigger(self, trigger_id: str) -> TriggerFacts | None:
        entry = self.registry.get(trigger_id)
        parsed = self.records.parsed.get(trigger_id)
        if entry is None and parsed is None:
            return None
        raw = None if isinstance(parsed, TriggerDef) else self.records.raw(trigger_id)
        now, refuse = self.clock.now(), self.firing.refusal
        return TriggerFacts(trigger_id, entry, parsed, raw, self.peer_id, now, refuse)

    async def runs(self, **query: Any) -> Sequence[RunRow]:
        return cast(list[RunRow], await self.db_call(lambda m: m.runs(**query)))

    async def trigger_runs(self, tid: str, /, **query: Any) -> history.RunHistory:
        return await history.trigger_runs(self.client, self.places, self.db_call, tid, **query)

    async def run(self, run_id: str) -> RunRow | None:
        return cast(RunRow | None, await self.db_call(lambda m: m.run(run_id)))

    def health(self) -> Health:
        reach, registry = self.client.reach, self.gate.degraded  # an unreachable server says all
        registry_reasons = (registry,) if registry and reach.unreachable_since is None else ()
        mirror = () if self.unit.failing is None else (self.unit.failing.reason(),)
        return Health(
            now=self.clock.now(),
            last_tick_at=self.last_tick_at,
            last_tick_age=self._tick_age(),
            tick_s=self.config.tick_s,
            peer_id=self.peer_id,
            verdict=self.gate.verdict,
            triggers=len(self.registry),
            server_resolved=self.places is not None,
            last_error=self.stats.last_error,
            degraded=(*server_reasons(reach, self.outbox_depth), *registry_reasons, *mirror),
            state_dir=str(self.config.state_dir),
        )

    async def metrics(self) -> Metrics:
        # The depth read here also feeds the status line.
        self.outbox_depth, aside = await self.db_call(Mirror.outbox_counts)
        age = self._tick_age()
        return Metrics(self.stats, self.outbox_depth, self.gate.verdict, age, self.peer_id, aside)

    def election(self) -> dict[str, Any]:
        return self.gate.describe(self.peer_id)

    def _tick_age(self) -> float | None:
        if self.last_tick_mono is None:
            return None
        return max(0.0, self.clock.monotonic() - self.last_tick_mono)

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

    async def run_now(self, trigger_id: str) -> str | None:
        """Run a registry entry now, outside its schedule; return the run id."""
        return await self.firing.run_now(trigger_id, self.peer_id, self.gate.verdict)


__all__ = ["Daemon"]
