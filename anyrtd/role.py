"""The active role: the standing built-ins, the chat-watch, and event routing.

The device the election makes active arms the standing built-ins and holds the
chat-watch record; a device that stands down gives both up (docs/election.md). New chat
messages the change feed brings fire the event triggers that listen to them, and are
offered to the chat watch; the run records it brings fire the chains (`chaining.py`,
docs/events.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from anyrtd import standing
from anyrtd.apply import Apply
from anyrtd.chaining import Chaining
from anyrtd.chat import ChatWatch, current_generation, ensure_chat_watch
from anyrtd.claims import Fence
from anyrtd.client import Change, Dataset, Pace, ServerClient, ServerError, ServerUnavailable
from anyrtd.clock import Clock, Ticks
from anyrtd.election import Gate
from anyrtd.events import CHAT_DATASET, ChatMessage, LiveGate, event_target, fires, new_message
from anyrtd.firing import Firing
from anyrtd.metrics import Stats
from anyrtd.model import TriggerDef
from anyrtd.port import Port
from anyrtd.records import RecordCache
from anyrtd.registry import Registry
from anyrtd.runner import Runner
from anyrtd.sync import FEED_HEAD, Sync
from anyrtd.unit import Unit
from anyrtd.vocab import CHAT_WATCH_PROGRAM, Kind, Verdict

log = logging.getLogger("anyrtd.role")

FOLLOW_WAIT_S = 5.0
"""How long one long-poll of another space's feed waits: a space an event trigger starts
naming meanwhile is followed from the next poll."""
FOLLOW_IDLE_S = 60.0
"""The longest the spaces loop sleeps while no event trigger names a space to follow: the
set of spaces changes only in a tick, and each tick's end wakes it (`Ticks`)."""
NO_FEED = "the server shows no change feed for it: no such space, or no feed there"


class Role:
    """What this device does while it is active, and gives up when it is not."""

    def __init__(
        self,
        *,
        agent_name: str,
        space: str,
        client: ServerClient,
        clock: Clock,
        gate: Gate,
        sync: Sync,
        registry: Registry,
        records: RecordCache,
        unit: Unit,
        apply: Apply,
        firing: Firing,
        runner: Runner,
        stats: Stats,
        port: Port,
        ticks: Ticks,
        pace: Pace | None = None,
    ) -> None:
        self.agent_name = agent_name
        self.space = space
        self.client = client
        self.clock = clock
        self.gate = gate
        self.sync = sync
        self.registry = registry
        self.records = records
        self.unit = unit
        self.apply = apply
        self.firing = firing
        self.runner = runner
        self.stats = stats
        self.pace = pace
        """What a large feed page waits for before it is decoded (the timer's next start)."""
        self.live = LiveGate(since=clock.now())
        self.chat = ChatWatch(
            agent_name=agent_name, client=client, clock=clock, scheduler=port, fire=self.converse
        )
        self.chains = Chaining(
            client=client,
            clock=clock,
            sync=sync,
            registry=registry,
            firing=firing,
            index=apply.chains,
            live=self.live,
        )
        """Chains: the runs that answer the run records the feed brings (docs/events.md)."""
        self._chat_watch_found: str | None = None
        """The chat-watch generation boot found (or seeded); None until the server answered."""
        self._stamped: str | None = None
        """The generation this device re-stamped since it took the active role."""
        self.has_role = False
        self.cursors: dict[str, int] = {}
        """Per other space an event trigger listens on, how far its change feed was read."""
        self._unfollowed: set[str] = set()
        self.ticks = ticks
        """The ends of the daemon's ticks: the spaces loop waits for one while it follows no
        space."""

    @property
    def chat_watch_id(self) -> str | None:
        """The chat-watch generation in use: the one boot found, or the next one not deleted
        since (None until boot found one)."""
        found = self._chat_watch_found
        return None if found is None else current_generation(found, self.sync.tombstones)

    def begin(self, now: float) -> None:
        """Let event triggers fire on the messages that arrive from `now` on (the daemon
        starts its loops)."""
        self.live.since = now

    # standing built-ins and the chat-watch claim (docs/election.md)

    def hand_off(self, fence: Fence, now: float) -> None:
        """Write the stand-down beat on chat-watch, after this device's last claim; while
        the generation in use has no record (deleted, the next not seeded yet), keep it owed:
        a write there would fail or make a record of the beat alone."""
        cw = self.chat_watch_id
        if cw is None or cw not in self.records.parsed:
            return
        if (beat := fence.handoff_due(now)) is not None:
            self.unit.write_trigger(cw, beat)

    def follow_verdict(self, verdict: str, now: float, peer_id: str) -> None:
        """Take the active role's set (standing built-ins, chat-watch) or give it up."""
        if verdict == Verdict.ACTIVE:
            if not self.has_role:
                self.has_role = True
                self._take_over(now, peer_id)
            elif self.chat_watch_id != self._stamped:
                self._stamp_chat_watch(now, peer_id)  # a generation seeded since the takeover
            return
        if self.has_role:
            self.has_role = False
            self._stand_down(verdict, peer_id)
        for s in standing.STANDING:
            # Entries restored from the mirror on a device that is not active.
            if self.registry.remove(s.id) is not None:
                self.unit.evict(s.id)

    def _take_over(self, now: float, peer_id: str) -> None:
        fresh = standing.entries(peer_id, self.records.raw, self.runner.is_installed, now)
        for entry in fresh:
            self.registry.put(entry)
            self.registry.arm(entry, now)  # strictly forward: no wake-and-replay burst
            self.unit.save(entry.row)
            self.unit.write_trigger(entry.id, standing.STANDING_BY_ID[entry.id].fields(peer_id))
        listed = [e.id for e in fresh if e.row.marker is not None]
        log.info(
            "took the active role: standing built-ins armed%s",
            f" ({', '.join(listed)} not installed)" if listed else "",
        )
        self._stamped = None
        self._stamp_chat_watch(now, peer_id)

    def _stamp_chat_watch(self, now: float, peer_id: str) -> None:
        """Re-stamp the chat-watch generation in use with this device's peer id, once a term
        (at the takeover, or when its record first shows up); it confirms like any claim."""
        cw = self.chat_watch_id
        defn = self.records.parsed.get(cw) if cw is not None else None
        if not isinstance(defn, TriggerDef):
            return  # not here yet (or malformed): stamped when a valid record shows up
        self._stamped = cw
        if defn.owner != peer_id:
            self.apply.adopt(defn, claim=True, now=now, peer_id=peer_id)

    def _stand_down(self, verdict: str, peer_id: str) -> None:
        for s in standing.STANDING:
            if self.registry.remove(s.id) is not None:
                self.unit.evict(s.id)
        cw = self.chat_watch_id
        defn = self.records.parsed.get(cw) if cw is not None else None
        if isinstance(defn, TriggerDef) and defn.owner == peer_id:
            self.unit.write_trigger(defn.id, {"owner": ""})  # so the new winner can take it
        dropped = self.chat.disconnect(f"this device is {verdict} now")
        log.info(
            "stood down (%s): standing built-ins stopped, chat-watch released%s",
            verdict,
            f", {dropped} deferred conversations dropped" if dropped else "",
        )

    def refresh_standing(self, ids: Iterable[str], now: float, peer_id: str) -> None:
        """Apply an `enabled` edit of a standing built-in's record to its entry."""
        if not self.has_role:
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
                    standing.STANDING_BY_ID[rid], peer_id, self.records.raw(rid)
                )
                self.apply.toggle(defn, rec.enabled, now)

    # the chat-watch (docs/events.md)

    async def seed_chat_watch(self) -> bool:
        """Find the chat-watch record, or seed it when none exists (once per boot); buffer it
        for the next tick. Return whether it is known now."""
        places = self.sync.places
        assert places is not None
        try:
            rid, record = await ensure_chat_watch(self.client, places.triggers, places.space)
        except (ServerUnavailable, ServerError) as exc:
            log.debug("chat-watch not seeded yet: %s", exc)
            return False
        self._chat_watch_found = rid
        self.apply.unfence(self.chat_watch_id or rid)
        triggers = places.triggers
        self.sync.buffer(Change(0, triggers.object_id, triggers.name, rid, "update", dict(record)))
        return True

    def tend_chat_watch(self) -> None:
        """Connect the chat watch while this device holds an enabled, confirmed chat-watch."""
        cw = self.chat_watch_id
        if cw is not None:
            self.apply.unfence(cw)  # the generation in use moves on when its record is deleted
        entry = self.registry.get(cw) if cw is not None else None
        target = None
        if (
            entry is not None
            and entry.confirmed
            and entry.row.enabled
            and entry.row.marker is None
            and entry.defn.program == CHAT_WATCH_PROGRAM
            and self.gate.verdict != Verdict.PRUNED
        ):
            target = event_target(entry.defn, self.space)
        if target is None:
            if self.chat.connected:
                self.chat.disconnect("this device no longer holds an enabled chat-watch")
            return
        assert cw is not None
        self.chat.connect(cw, Dataset(target[0], target[1], CHAT_DATASET))

    # event triggers (docs/events.md)

    async def listen(self, space: str) -> None:
        """Note the feed's head, once: messages up to it arrived before this process listened."""
        if space in self.live.heads:
            return
        page = await self.client.changes(space, since=FEED_HEAD, wait=0, pace=self.pace)
        if page is not None:
            self.live.heads.setdefault(space, page.seq)

    async def follow_spaces(self, wait: float = FOLLOW_WAIT_S) -> None:
        """Take one step of following the change feeds of the other spaces this device's event
        triggers name (`spec.spaceId`), long-polling each up to `wait` s; the agent space's
        feed is the sync loop's."""
        places = self.sync.places
        here = {self.space, places.space if places is not None else self.space}
        spaces = {
            target[0]
            for rid in self.registry.events
            if (e := self.registry.entries[rid]).confirmed
            and e.row.enabled
            and e.row.marker is None
            and (target := event_target(e.defn, self.space)) is not None
            and target[0] not in here
        }
        for gone in set(self.cursors) - spaces:
            # Followed again later, it starts from that moment: event triggers are live-only.
            del self.cursors[gone]
            self.live.heads.pop(gone, None)
        self._unfollowed &= spaces
        if not spaces:
            await self.ticks.next(within=FOLLOW_IDLE_S)  # a tick may name a space
            return
        await asyncio.gather(*(self._follow(space, wait) for space in sorted(spaces)))

    async def _follow(self, space: str, wait: float) -> None:
        try:
            if space not in self.cursors:
                await self.listen(space)
                if space not in self.live.heads:
                    raise ServerError(404, "no_feed", NO_FEED)
                self.cursors[space] = self.live.heads[space]
            page = await self.client.changes(space, self.cursors[space], wait=wait, pace=self.pace)
            if page is None:
                raise ServerError(404, "no_feed", NO_FEED)
        except (ServerUnavailable, ServerError) as exc:
            self.stats.last_error = f"space {space}: {exc}"
            if space not in self._unfollowed:
                self._unfollowed.add(space)
                log.warning(
                    "cannot follow space %s, where event triggers listen (%s): they fire "
                    "once its change feed answers",
                    space,
                    exc,
                )
            await asyncio.sleep(wait)
            return
        if space in self._unfollowed:
            self._unfollowed.discard(space)
            log.info("following space %s again", space)
        await self.route_events(page.changes, space)
        self.cursors[space] = max(self.cursors.get(space, page.seq), page.seq)

    async def route_events(self, changes: Iterable[Change], space: str) -> None:
        """Fire the event triggers (and offer chat-watch) the new messages among `changes`."""
        peer_id = self.sync.peer_id
        if self.gate.verdict == Verdict.PRUNED or peer_id is None:
            return
        if not isinstance(changes, list | tuple):
            changes = list(changes)
        await self.chains.route(changes, space, peer_id, self.gate.verdict)
        messages = [
            m for c in changes if (m := new_message(c, space)) is not None and self.live.admits(m)
        ]
        if not messages:
            return
        listening = [
            e.defn
            for rid in self.registry.events
            if (e := self.registry.entries[rid]).defn.kind == Kind.EVENT
            and e.confirmed
            and e.row.enabled
            and e.row.marker is None
        ]
        now = self.clock.now()
        cw = self.chat_watch_id
        for message in messages:
            agent = self.agent_name
            for defn in fires(message, listening, agent_space=self.space, agent_name=agent):
                if defn.id == cw and defn.program == CHAT_WATCH_PROGRAM:
                    self.chat.offer(message)
                elif (entry := self.registry.get(defn.id)) is not None:
                    await self.firing.fire_event(entry, message, now, peer_id, self.gate.verdict)

    async def converse(self, trigger_id: str, message: ChatMessage) -> asyncio.Task[None] | None:
        """Start the chat-watch conversation run for `message`; return its task."""
        entry = self.registry.get(trigger_id)
        if entry is None or not (entry.confirmed and entry.row.enabled):
            return None
        return await self.firing.fire_event(
            entry, message, self.clock.now(), self.sync.peer_id, self.gate.verdict
        )


__all__ = ["Role"]
