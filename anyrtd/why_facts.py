"""The facts behind a trigger's "why", gathered from the daemon's stages (anyrtd/why.py judges).

The devices registry is read once per question (`GET /v1/devices`, bounded by
`REGISTRY_WAIT_S`); a registry that does not answer leaves every other device `unknown`.
The daemon's port method `why` is this module's `ask`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from anyrtd.claims import Fence
from anyrtd.client import ServerClient
from anyrtd.clock import Clock
from anyrtd.election import Gate
from anyrtd.metrics import Stats
from anyrtd.model import TriggerDef
from anyrtd.records import RecordCache
from anyrtd.registry import Entry, Registry
from anyrtd.rows import RunRow
from anyrtd.runner import Runner
from anyrtd.schedule import preview
from anyrtd.sync import Sync
from anyrtd.vocab import Kind, RunStatus, Verdict
from anyrtd.watch import Watch, read_devices
from anyrtd.why import Answer, Failure, WhyFacts, explain

NEXT_FIRES = 5
LAST_ERRORS = 3
RUNS_READ = 50


class Watching(Protocol):
    """What holds the missed watch (anyrtd/notices.py's `Notices`)."""

    @property
    def watch(self) -> Watch: ...


class Parts(Protocol):
    """What the facts are read from: the daemon's stages (`Daemon` has them all)."""

    registry: Registry
    records: RecordCache
    sync_stage: Sync
    gate: Gate
    fence: Fence
    runner: Runner
    stats: Stats
    clock: Clock
    notices: Watching

    @property
    def client(self) -> ServerClient: ...

    @property
    def peer_id(self) -> str | None: ...

    async def runs(
        self, *, trigger_id: str | None = None, status: str | None = None, limit: int = 50
    ) -> Sequence[RunRow]: ...


class Explains:
    """The port's `why` (anyrtd.port.Port), for the class that has the parts: the daemon."""

    async def why(self: Parts, trigger_id: str) -> Answer:
        """Return whether a trigger fires on this device and, if not, every reason."""
        return await ask(self, trigger_id)


async def ask(parts: Parts, trigger_id: str) -> Answer:
    """Gather what this device knows of `trigger_id` and return the answer."""
    return explain(await gather(parts, trigger_id))


async def gather(parts: Parts, trigger_id: str) -> WhyFacts:
    """Return the facts of one trigger, as of now."""
    now = parts.clock.now()
    peer = parts.peer_id
    entry = parts.registry.get(trigger_id)
    parsed = parts.records.parsed.get(trigger_id)
    defn = parsed if isinstance(parsed, TriggerDef) else entry.defn if entry else None
    devices, names = await read_devices(parts.client)
    verdict = parts.gate.verdict
    fence = parts.fence
    hold: dict[str, Any] | None = None
    may_claim = True
    if verdict == Verdict.ACTIVE:
        if fence.waiting is not None:
            hold = {
                "waitingFor": f"term {fence.waiting.seq} ({fence.waiting.peer})",
                "since": fence.hold_from,
                "maxS": fence.hold_max_s,
            }
        may_claim = fence.may_claim(now)
    failures: list[Failure] = []
    consumed_run: str | None = None
    rows: Sequence[RunRow] = ()
    if defn is not None:
        rows = await parts.runs(trigger_id=trigger_id, limit=RUNS_READ)
        failures = [
            Failure(r.run_id, r.started_at, r.error) for r in rows if r.status == RunStatus.FAILED
        ][:LAST_ERRORS]
        if defn is not None and defn.kind == Kind.ONCE:
            scheduled = [r for r in rows if r.scheduled_at is not None]
            consumed_run = scheduled[0].run_id if scheduled else None
    return WhyFacts(
        id=trigger_id,
        now=now,
        peer_id=peer,
        verdict=verdict,
        parsed=parsed,
        entry=entry,
        tombstoned=trigger_id in parts.sync_stage.tombstones,
        devices=devices,
        names=names,
        winner=parts.gate.describe(peer).get("winner"),
        hold=hold,
        may_claim=may_claim,
        installed=defn is None or parts.runner.is_installed(defn.program),
        failures=failures,
        consumed_run=consumed_run,
        overlap_skips=parts.stats.overlap_by_trigger.get(trigger_id, 0),
        next_fires=_next_fires(entry),
        spec_fires=preview(defn, now, NEXT_FIRES) if defn is not None and defn.enabled else (),
        missed=parts.notices.watch.of(
            trigger_id, now, peer, [r.scheduled_at for r in rows if r.scheduled_at is not None]
        ),
    )


def _next_fires(entry: Entry | None) -> list[float]:
    """Return the next fires of an armed entry, starting with the armed one."""
    if entry is None or entry.row.next_fire is None:
        return []
    first = entry.row.next_fire
    if entry.defn.kind != Kind.CRON:
        return [first]
    return [first, *preview(entry.defn, first, NEXT_FIRES - 1, anchor=entry.row.armed_at)]


__all__ = ["Explains", "Parts", "ask", "gather"]
