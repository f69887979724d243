"""The daemon's port: what the control API and the chat responder ask of the daemon.

`DaemonPort` implements `anyrtd.port.Port` on the daemon's stages, which it is given when
it is built: it answers the queries from what the stages hold and hands the two commands
to the stages (run-now) and to the daemon's steps (write-through). A trigger's "why" is
gathered through it too (`anyrtd.why_facts`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, cast

from anyrtd import agenda as agendas
from anyrtd import history
from anyrtd.chain import ChainIndex
from anyrtd.claims import Fence
from anyrtd.client import DevicesView, ServerClient
from anyrtd.clock import Clock
from anyrtd.config import Config
from anyrtd.election import Gate
from anyrtd.firing import Firing
from anyrtd.history import TRIGGER_RUNS
from anyrtd.metrics import Stats
from anyrtd.mirror import Mirror
from anyrtd.missed import Missed
from anyrtd.model import TriggerDef
from anyrtd.notices import Notices
from anyrtd.port import Health, Metrics, TriggerFacts, Triggers, server_reasons
from anyrtd.records import RecordCache
from anyrtd.registry import Registry
from anyrtd.rows import RunRow
from anyrtd.runner import Runner
from anyrtd.sync import Sync
from anyrtd.unit import Unit
from anyrtd.vocab import RunStatus, Verdict
from anyrtd.watch import MissedFacts
from anyrtd.why import Answer, Here
from anyrtd.why_facts import Claiming, ask, here_of


class Loops(Protocol):
    """What the port reads of the daemon's loops, and the step it hands a write-through to."""

    @property
    def config(self) -> Config:
        """The configuration in force (a reload replaces it)."""
        ...

    @property
    def last_tick_at(self) -> float | None: ...

    @property
    def outbox_depth(self) -> int:
        """The outbox's depth as last counted."""
        ...

    def tick_age(self) -> float | None:
        """Return the seconds since the last tick ended (monotonic); None before the first."""
        ...

    async def count_outbox(self) -> tuple[int, int]:
        """Count the outbox again; return its depth and the writes set aside."""
        ...

    async def give_way(self) -> None:
        """Let a start due soon pass, then the event loop's other work take a turn."""
        ...

    async def write_through(
        self, trigger_id: str, fields: Mapping[str, Any], unset: Iterable[str] = ()
    ) -> TriggerDef | None: ...


class DaemonPort:
    """The queries and commands of `anyrtd.port.Port`, on the daemon's stages."""

    def __init__(
        self,
        loops: Loops,
        *,
        clock: Clock,
        client: ServerClient,
        gate: Gate,
        fence: Fence,
        registry: Registry,
        records: RecordCache,
        sync: Sync,
        unit: Unit,
        firing: Firing,
        runner: Runner,
        stats: Stats,
        notices: Notices,
        chains: ChainIndex | None = None,
    ) -> None:
        self.loops = loops
        self.clock = clock
        self.client = client
        self.gate = gate
        self.fence = fence
        self.registry = registry
        self.records = records
        self.sync = sync
        self.unit = unit
        self.firing = firing
        self.runner = runner
        self.stats = stats
        self.notices = notices
        self.chains = ChainIndex() if chains is None else chains

    @property
    def peer_id(self) -> str | None:
        return self.sync.peer_id

    def triggers(self) -> Triggers:
        r, e, now = self.records, self.registry.entries, self.clock.now()
        missed, totals = self.notices.found
        here = self._here(now)
        refusal = self.firing.refusal
        return Triggers(e, r.parsed, r.raw, self.peer_id, now, missed, totals, refusal, here)

    def trigger(self, trigger_id: str) -> TriggerFacts | None:
        entry = self.registry.get(trigger_id)
        parsed = self.records.parsed.get(trigger_id)
        if entry is None and parsed is None:
            return None
        raw = None if isinstance(parsed, TriggerDef) else self.records.raw(trigger_id)
        now, refuse = self.clock.now(), self.firing.refusal
        here = self._here(now)
        return TriggerFacts(trigger_id, entry, parsed, raw, self.peer_id, now, refuse, here)

    def _here(self, now: float) -> Here:
        return here_of(self.claiming(now), self.gate.verdict, self.runner.is_installed)

    async def runs(self, **query: Any) -> Sequence[RunRow]:
        return cast(list[RunRow], await self._db_call(lambda m: m.runs(**query)))

    async def trigger_runs(self, tid: str, /, **query: Any) -> history.RunHistory:
        return await history.trigger_runs(
            self.client, self.sync.places, self._db_call, tid, **query
        )

    async def run(self, run_id: str) -> RunRow | None:
        row = cast(RunRow | None, await self._db_call(lambda m: m.run(run_id)))
        if row is not None and row.status == RunStatus.RUNNING:
            # The mirror gets a run's output at its end: until then it is the runner's.
            live = self.runner.output(run_id)
            if live is not None:
                row = replace(row, output=live[0], output_dropped=live[1])
        return row

    async def why(self, trigger_id: str) -> Answer:
        return await ask(self, trigger_id)

    async def missed(self, trigger_id: str) -> MissedFacts:
        runs = await self.trigger_runs(trigger_id, limit=TRIGGER_RUNS)
        scheduled = [r.scheduled_at for r in runs.runs if r.scheduled_at is not None]
        now, w = self.clock.now(), self.notices.watch
        found = w.of(trigger_id, now, self.peer_id, scheduled)
        return MissedFacts(trigger_id, found, w.grace_s, w.lookback_s, now)

    def agenda(self, hours: float, device: str | None = None) -> agendas.Agenda:
        now = self.clock.now()
        scene = self.notices.agenda_scene(now)
        return agendas.agenda(self.notices.definitions(), scene, hours=hours, device=device)

    async def give_way(self) -> None:
        await self.loops.give_way()

    def health(self) -> Health:
        reach, registry = self.client.reach, self.gate.degraded  # an unreachable server says all
        registry_reasons = (registry,) if registry and reach.unreachable_since is None else ()
        mirror = () if self.unit.failing is None else (self.unit.failing.reason(),)
        loops = self.loops
        return Health(
            now=self.clock.now(),
            last_tick_at=loops.last_tick_at,
            last_tick_age=loops.tick_age(),
            tick_s=loops.config.tick_s,
            peer_id=self.peer_id,
            verdict=self.gate.verdict,
            triggers=len(self.registry),
            server_resolved=self.sync.places is not None,
            last_error=self.stats.last_error,
            degraded=(*server_reasons(reach, loops.outbox_depth), *registry_reasons, *mirror),
            state_dir=str(loops.config.state_dir),
        )

    async def metrics(self) -> Metrics:
        depth, aside = await self.loops.count_outbox()  # the status line shows it too
        age = self.loops.tick_age()
        return Metrics(self.stats, depth, self.gate.verdict, age, self.peer_id, aside)

    def election(self) -> dict[str, Any]:
        return self.gate.describe(self.peer_id)

    async def write_through(
        self, trigger_id: str, fields: Mapping[str, Any], unset: Iterable[str] = ()
    ) -> TriggerDef | None:
        return await self.loops.write_through(trigger_id, fields, unset)

    async def run_now(self, trigger_id: str) -> str | None:
        return await self.firing.run_now(trigger_id, self.peer_id, self.gate.verdict)

    # what a trigger's "why" reads besides (anyrtd.why_facts.Parts)

    def now(self) -> float:
        return self.clock.now()

    def verdict(self) -> str:
        return self.gate.verdict

    async def devices(self) -> DevicesView | None:
        return await self.client.devices()

    def claiming(self, now: float) -> Claiming:
        confirm_s = self.fence.confirm_wait_s()  # from the server's acknowledgement
        if self.gate.verdict != Verdict.ACTIVE:
            return Claiming(confirm_s=confirm_s)
        fence, waiting = self.fence, self.fence.waiting
        if waiting is None:
            return Claiming(fence.may_claim(now), confirm_s=confirm_s)
        held = f"term {waiting.seq} ({waiting.peer})", fence.hold_from, fence.hold_max_s
        return Claiming(fence.may_claim(now), *held, confirm_s=confirm_s)

    def tombstoned(self, trigger_id: str) -> bool:
        return trigger_id in self.sync.tombstones

    def installed(self, program: str) -> bool:
        return self.runner.is_installed(program)

    def overlap_skips(self, trigger_id: str) -> int:
        return self.stats.overlap_by_trigger.get(trigger_id, 0)

    def chain_loop(self, trigger_id: str) -> Sequence[str] | None:
        return self.chains.cycles.get(trigger_id)

    def missed_of(self, trigger_id: str, now: float, scheduled: Sequence[float]) -> Missed | None:
        return self.notices.watch.of(trigger_id, now, self.peer_id, scheduled)

    async def _db_call(self, fn: Callable[[Mirror], Any]) -> Any:
        assert self.unit.db is not None, "the mirror is not open"
        return await self.unit.db.call(fn)


__all__ = ["DaemonPort", "Loops"]
