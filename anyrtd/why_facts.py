"""The facts behind a trigger's "why", gathered through the daemon's port (anyrtd/why.py judges).

The devices registry is read once per question (`GET /v1/devices`, bounded by
`REGISTRY_WAIT_S`); a registry that does not answer leaves every other device `unknown`.
The port's method `why` is this module's `ask`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from anyrtd.client import DevicesView
from anyrtd.missed import Missed
from anyrtd.model import STANDING_BUILTINS, TriggerDef, chain_of
from anyrtd.port import TriggerFacts
from anyrtd.registry import Entry
from anyrtd.rows import RunRow
from anyrtd.schedule import preview
from anyrtd.vocab import Kind, RunStatus
from anyrtd.watch import read_devices
from anyrtd.why import Answer, Failure, Here, WhyFacts, explain

NEXT_FIRES = 5
LAST_ERRORS = 3
RUNS_READ = 50


@dataclass(frozen=True)
class Claiming:
    """Whether this device may claim now, and the takeover hold it waits out, if any."""

    may_claim: bool = True
    waiting_for: str | None = None
    """The term the hold waits for, as `term <seq> (<peer>)`; None when there is no hold."""
    since: float = 0.0
    max_s: float = 0.0
    confirm_s: float = 0.0
    """How long after a claim this device confirms it (a tick: the owner stamp seen back)."""


class Parts(Protocol):
    """What the facts are read from: the daemon's port (`anyrtd.daemon_port.DaemonPort`)."""

    @property
    def peer_id(self) -> str | None: ...

    def now(self) -> float: ...

    def verdict(self) -> str: ...

    def trigger(self, trigger_id: str) -> TriggerFacts | None: ...

    async def runs(
        self, *, trigger_id: str | None = None, status: str | None = None, limit: int = 50
    ) -> Sequence[RunRow]: ...

    async def devices(self) -> DevicesView | None: ...

    def election(self) -> dict[str, Any]: ...

    def claiming(self, now: float) -> Claiming: ...

    def tombstoned(self, trigger_id: str) -> bool: ...

    def installed(self, program: str) -> bool: ...

    def overlap_skips(self, trigger_id: str) -> int: ...

    def chain_loop(self, trigger_id: str) -> Sequence[str] | None:
        """Return the loop of chains `trigger_id` is in (anyrtd/chain.py), or None."""
        ...

    def missed_of(
        self, trigger_id: str, now: float, scheduled: Sequence[float]
    ) -> Missed | None: ...


def hold_of(claiming: Claiming) -> dict[str, Any] | None:
    """Return the takeover hold as `why` shows it (`waitingFor`, `since`, `maxS`), or None."""
    if claiming.waiting_for is None:
        return None
    return {"waitingFor": claiming.waiting_for, "since": claiming.since, "maxS": claiming.max_s}


def here_of(claiming: Claiming, verdict: str, installed: Callable[[str], bool]) -> Here:
    """Return what this device is, as a list's trigger states read it."""
    return Here(verdict, claiming.may_claim, hold_of(claiming), installed, claiming.confirm_s)


async def ask(parts: Parts, trigger_id: str) -> Answer:
    """Gather what this device knows of `trigger_id` and return the answer."""
    return explain(await gather(parts, trigger_id))


async def gather(parts: Parts, trigger_id: str) -> WhyFacts:
    """Return the facts of one trigger, as of now."""
    now = parts.now()
    peer = parts.peer_id
    known = parts.trigger(trigger_id)
    entry = known.entry if known is not None else None
    parsed = known.parsed if known is not None else None
    defn = parsed if isinstance(parsed, TriggerDef) else entry.defn if entry else None
    devices, names = await read_devices(parts)
    verdict = parts.verdict()
    claiming = parts.claiming(now)
    hold = hold_of(claiming)
    failures: list[Failure] = []
    consumed_run: str | None = None
    rows: Sequence[RunRow] = ()
    if defn is not None:
        rows = await parts.runs(trigger_id=trigger_id, limit=RUNS_READ)
        failures = [
            Failure(r.run_id, r.started_at, r.error, r.error_type)
            for r in rows
            if r.status == RunStatus.FAILED
        ][:LAST_ERRORS]
        if defn is not None and defn.kind == Kind.ONCE:
            scheduled = [r for r in rows if r.scheduled_at is not None]
            consumed_run = scheduled[0].run_id if scheduled else None
    chain = chain_of(defn) if defn is not None else None
    last_fired_by: str | None = None
    if chain is not None:
        # The upstream run its last run answered: the newest of its runs here that names one.
        answered = [r for r in rows if r.upstream_run_id is not None]
        last_fired_by = answered[0].upstream_run_id if answered else None
    return WhyFacts(
        id=trigger_id,
        now=now,
        peer_id=peer,
        verdict=verdict,
        parsed=parsed,
        entry=entry,
        tombstoned=parts.tombstoned(trigger_id),
        devices=devices,
        names=names,
        winner=parts.election().get("winner"),
        hold=hold,
        may_claim=claiming.may_claim,
        installed=defn is None or parts.installed(defn.program),
        failures=failures,
        consumed_run=consumed_run,
        overlap_skips=parts.overlap_skips(trigger_id),
        chain=chain,
        chain_loop=parts.chain_loop(trigger_id) if chain is not None else None,
        last_fired_by=last_fired_by,
        next_fires=_next_fires(entry),
        spec_fires=preview(defn, now, NEXT_FIRES) if defn is not None and defn.enabled else (),
        missed=parts.missed_of(
            trigger_id, now, [r.scheduled_at for r in rows if r.scheduled_at is not None]
        ),
        confirm_s=claiming.confirm_s,
        standing=trigger_id in STANDING_BUILTINS,
    )


def _next_fires(entry: Entry | None) -> list[float]:
    """Return the next fires of an armed entry, starting with the armed one."""
    if entry is None or entry.row.next_fire is None:
        return []
    first = entry.row.next_fire
    if entry.defn.kind != Kind.CRON:
        return [first]
    return [first, *preview(entry.defn, first, NEXT_FIRES - 1, anchor=entry.row.armed_at)]


__all__ = ["Claiming", "Parts", "ask", "gather", "here_of", "hold_of"]
