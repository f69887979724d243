"""Chains at work: the run records the agent space's change feed brings, and the runs of the
chains this device holds that answer them (docs/events.md, "Chains").

Exactly once per upstream run, on whichever device and however often the record is seen:

- the chain's run for upstream run U has the id `chained_run_id(chain, U)`, the same on
  every device;
- before it starts, this device creates that run's record on the server as a conditional
  write (`ifVersion: 0`): the server takes the first create and refuses every other one
  (409 `version_conflict`), so of two devices that both hold the chain during an overlap
  window, or of a replayed feed page, one run starts;
- this process remembers the runs it answered, so a page seen twice costs no request.

Live-only as chat events are (`LiveGate`): a record at or before the feed's head when this
process started listening, or of a run that ended before then, fires nothing. Without a
chain among the records (`ChainIndex` empty), `route` returns at its first line.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from anyrtd.chain import (
    CHAIN_DEPTH_LIMIT,
    Answer,
    ChainIndex,
    RunFilter,
    UpstreamRun,
    is_runs_dataset,
    matches,
    show_cycle,
    upstream_run,
)
from anyrtd.client import Change, ServerClient, ServerError, ServerUnavailable, Upsert
from anyrtd.clock import Clock
from anyrtd.events import LiveGate
from anyrtd.firing import Firing
from anyrtd.logs import iso_time
from anyrtd.model import chain_of
from anyrtd.registry import Entry, Registry
from anyrtd.runs import DAEMON_FAULT
from anyrtd.sync import Sync
from anyrtd.vocab import RunStatus

log = logging.getLogger("anyrtd.chains")

ANSWERED_KEPT = 10_000
"""How many answered run ids this process remembers: a replayed page of the last ones costs
no request; an older one is refused by the server's conditional create."""
OWED_FOR_S = 300.0
"""How long an answer whose claim could not reach the server is tried again (at each feed
page) before it is given up with a warning."""


@dataclass
class _Owed:
    chain_id: str
    upstream: UpstreamRun
    answer: Answer
    until: float


class Chaining:
    """Fires the chains this device holds for the run records the feed brings."""

    def __init__(
        self,
        *,
        client: ServerClient,
        clock: Clock,
        sync: Sync,
        registry: Registry,
        firing: Firing,
        index: ChainIndex,
        live: LiveGate,
    ) -> None:
        self.client = client
        self.clock = clock
        self.sync = sync
        self.registry = registry
        self.firing = firing
        self.index = index
        self.live = live
        self.answered: OrderedDict[str, None] = OrderedDict()
        self.owed: list[_Owed] = []
        self._loop_logged: dict[str, str] = {}

    def held(self) -> list[tuple[Entry, RunFilter]]:
        """Return the chains this device may fire now, with their filters."""
        out = []
        entries = self.registry.entries
        for rid in self.registry.events:
            e = entries[rid]
            if not (e.confirmed and e.row.enabled and e.row.marker is None):
                continue
            f = chain_of(e.defn)
            if f is None:
                continue
            loop = self.index.cycles.get(rid)
            if loop is not None:
                if self._loop_logged.get(rid) != (shown := show_cycle(loop)):
                    self._loop_logged[rid] = shown
                    log.warning(
                        "not firing chain %s: it is in a loop (%s); change one of its filters",
                        rid,
                        shown,
                        extra={"trigger": rid},
                    )
                continue
            out.append((e, f))
        return out

    def _live(self, run: UpstreamRun, space: str) -> bool:
        head = self.live.heads.get(space)
        if head is None or run.seq <= head:
            return False
        return run.ended_at is None or run.ended_at >= self.live.since

    async def route(
        self, changes: Iterable[Change], space: str, peer_id: str, verdict: str
    ) -> None:
        """Fire the chains this device holds that the ended runs among `changes` match."""
        if not self.index and not self.owed:
            return  # no chain anywhere: nothing to look at
        places = self.sync.places
        if places is None or space != places.space:
            return
        held = self.held()
        if not held:
            self.owed.clear()
            return
        now = self.clock.now()
        if self.owed:
            await self._settle_owed(held, now, peer_id, verdict)
        runs_object = places.runs.object_id
        for c in changes:
            if (
                c.record is None
                or c.object_id != runs_object
                or not is_runs_dataset(c.dataset)
                or c.op not in ("create", "update")
            ):
                continue
            run = upstream_run(c.record, c.id, c.seq)
            if run is None or not self._live(run, space):
                continue
            for entry, f in held:
                if matches(f, run):
                    await self._answer(entry, run, Answer.to(entry.id, run), now, peer_id, verdict)

    async def _settle_owed(
        self, held: list[tuple[Entry, RunFilter]], now: float, peer_id: str, verdict: str
    ) -> None:
        owed, self.owed = self.owed, []
        by_id = {e.id: e for e, _f in held}
        for o in owed:
            entry = by_id.get(o.chain_id)
            if entry is None:
                continue  # no longer held here
            if now > o.until:
                log.warning(
                    "gave up answering run %s with chain %s: the server could not be reached "
                    "for %.0f s",
                    o.upstream.run_id,
                    o.chain_id,
                    OWED_FOR_S,
                    extra={"trigger": o.chain_id},
                )
                continue
            await self._answer(entry, o.upstream, o.answer, now, peer_id, verdict, o.until)

    async def _answer(
        self,
        entry: Entry,
        upstream: UpstreamRun,
        answer: Answer,
        now: float,
        peer_id: str,
        verdict: str,
        until: float | None = None,
    ) -> None:
        """Claim the run of `entry` answering `upstream` on the server, then start it."""
        if answer.run_id in self.answered:
            return
        if answer.depth > CHAIN_DEPTH_LIMIT:
            self._remember(answer.run_id)
            log.warning(
                "not firing chain %s for run %s: it would be the %d-th chained run in a row, "
                "past the limit of %d (a loop the cycle check could not see?)",
                entry.id,
                upstream.run_id,
                answer.depth,
                CHAIN_DEPTH_LIMIT,
                extra={"trigger": entry.id},
            )
            return
        places = self.sync.places
        assert places is not None
        claim = {
            "runId": answer.run_id,
            "triggerId": entry.id,
            "program": entry.defn.program,
            "device": peer_id,
            "startedAt": round(now, 3),
            "status": RunStatus.RUNNING.value,
            "scheduledAt": round(upstream.ended_at, 3) if upstream.ended_at is not None else None,
            "upstreamRunId": answer.upstream_run_id,
            "chainDepth": answer.depth,
        }
        try:
            await self.client.upsert(places.runs, [Upsert(answer.run_id, claim, if_version=0)])
        except ServerUnavailable as exc:
            self.owed.append(
                _Owed(entry.id, upstream, answer, now + OWED_FOR_S if until is None else until)
            )
            log.info(
                "chain %s waits to answer run %s: the server is not answering (%s)",
                entry.id,
                upstream.run_id,
                exc,
                extra={"trigger": entry.id},
            )
            return
        except ServerError as exc:
            self._remember(answer.run_id)
            if exc.status == 409:
                log.info(
                    "not firing chain %s for run %s: it was answered already (run %s)",
                    entry.id,
                    upstream.run_id,
                    answer.run_id,
                    extra={"trigger": entry.id, "run": answer.run_id},
                )
            else:
                log.warning(
                    "not firing chain %s for run %s: the server refused its run record (%s)",
                    entry.id,
                    upstream.run_id,
                    exc,
                    extra={"trigger": entry.id},
                )
            return
        self._remember(answer.run_id)
        ref = {
            "space": places.space,
            "objectId": places.runs.object_id,
            "dataset": places.runs.name,
        }
        log.info(
            "chain %s answers run %s of %s (%s, ended %s)",
            entry.id,
            upstream.run_id,
            upstream.trigger_id,
            upstream.status,
            iso_time(upstream.ended_at) if upstream.ended_at is not None else "?",
            extra={"trigger": entry.id, "run": answer.run_id},
        )
        task = await self.firing.fire_chain(
            entry, upstream, answer, upstream.payload(ref), now, peer_id, verdict
        )
        if task is None:
            # Claimed but not started (the mirror could not be written, or pruned): say so
            # on the record, so it does not read as running for ever.
            ended = {
                "status": RunStatus.FAILED.value,
                "errorType": DAEMON_FAULT,
                "endedAt": round(self.clock.now(), 3),
            }
            try:
                await self.client.upsert(places.runs, [Upsert(answer.run_id, ended)])
            except (ServerUnavailable, ServerError) as exc:
                log.warning(
                    "run %s of chain %s stays open on the server: %s",
                    answer.run_id,
                    entry.id,
                    exc,
                    extra={"trigger": entry.id},
                )

    def _remember(self, run_id: str) -> None:
        self.answered[run_id] = None
        while len(self.answered) > ANSWERED_KEPT:
            self.answered.popitem(last=False)


__all__ = ["ANSWERED_KEPT", "OWED_FOR_S", "Chaining"]
