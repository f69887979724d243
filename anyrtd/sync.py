"""Sync: the trigger records on the server → the record cache (docs/architecture.md, the loops).

Resolves the agent's places and this device's peer id, reads every trigger record (at
start, every `full_resync_s`, or every step without a change feed) and otherwise follows
the change feed. What it reads is buffered; the tick applies the buffer to the record
cache (`apply_buffered`), so a tick itself never waits on the network. Sync fires nothing:
the daemon hands the feed's pages to the event routing itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from anyrtd.claims import Fence
from anyrtd.client import (
    Change,
    ChangePage,
    Pace,
    Record,
    ServerClient,
    ServerError,
    ServerUnavailable,
)
from anyrtd.clock import Slice
from anyrtd.escape import printable
from anyrtd.heap import gc_paused, keep_built
from anyrtd.metrics import Stats
from anyrtd.mirror import AsyncMirror, Mirror
from anyrtd.outbox import TRIGGERS
from anyrtd.places import Places, resolve_places
from anyrtd.records import RecordCache
from anyrtd.unit import Unit
from anyrtd.vocab import Verdict, is_stamp, stamp

log = logging.getLogger("anyrtd.sync")

RESYNC_S_PER_RECORD = 0.06
"""The safety net's full read comes at most every this many seconds per record: about
6.5 µs of CPU a record (decoding, comparing), so about 0.1 ms/s spread over its period
whatever the count (10,000 records: every 600 s; 100,000: every 6,000 s)."""

FULL_READ_PAGE = 5000
"""Records per page of a full read: a request costs the daemon more CPU than a thousand of
the records in it, and the server answers up to 10,000 (docs/server-api.md).
Chosen (e4ea674): a full read of 100,000 records, 0.79/0.97 s of CPU in pages of 1,000, 0.71/0.81 s
in 5,000."""

FULL_READ_KEEP = 20_000
"""A full read of at least this many records keeps what each slice built out of the
collector's full passes (`heap.keep_built`), as a spread reconcile does.
Chosen: applying 100,000 new records, the passes held single slices up to 0.28 s."""

CHANGES_KEEP = 2_000
"""After this many changed records applied from the feed, what they built is kept out of
the collector's full passes (`heap.keep_built`), as a large full read's is: 10,000 new
records written in seven seconds (the records fault family) brought full passes of 40-77
ms over what they built, on top of the ticks that applied them.
Chosen: a keep costs a young collection, about 10-25 ms there; every 2,000 records keeps
a full pass's walk short."""

FEED_HEAD = 2**53
"""A `since` past any sequence number: the feed answers with its head and no changes."""

FEED_BACKOFF_FIRST_S = 0.5
FEED_BACKOFF_MAX_S = 10.0
"""While the change feed misbehaves (answers an older head, repeats entries already read, or
answers a long poll at once with nothing new), the next poll waits `FEED_BACKOFF_FIRST_S`,
then twice as long each time up to this; a page that behaves ends it. Without it such a feed
was asked about 99 times a second (issue 36).
Chosen: a design back-off, as the outbox's for a 429: the feed's records come late by at
most this while it misbehaves, and a feed that behaves again is followed within it."""

EARLY_ANSWER = 0.5
"""A long poll answered with nothing new before this share of its wait is an early answer
(a sound feed waits until a change or the wait's end)."""


TICK_CHANGES = 100
"""The most changes one tick applies, feed changes and a full read's changed records
alike; a burst's rest waits for the next tick, which follows at once (tens of
milliseconds of parsing and reconciling per slice).
Chosen (10834ec): tens of milliseconds of parsing a slice, so the timer keeps its turn."""

TICK_SCAN = 5000
"""The most records of a full read one tick looks at, changed or not: one unchanged costs
a version comparison and its claim token, about 2 µs (10 ms a slice)."""

FIRST_FULL_AFTER_S = 30.0
"""After a restart from a mirror that follows the change feed, how long after the start the
first full read comes: the feed from the mirror's cursor brings what changed while the
daemon was down, so the safety net need not hold up readiness (docs/architecture.md).
Chosen (89b594d): the first full read cost 1.5-2.5 s of start at 100,000 records
(docs/benchmarks.md)."""


@dataclass(frozen=True, slots=True)
class _Cursor:
    """In the buffer, after what was read up to `seq`: once applied, the mirror's cursor."""

    seq: int


@dataclass(slots=True)
class _FullRead:
    """In the buffer, every trigger record read at once, applied a slice per tick: the
    records in the order read, then the eviction of the ids the read did not show."""

    left: list[Record]
    """The records not applied yet, last first: each is let go of as it is applied."""
    size: int
    after_back: bool = False
    """Read after the server's versions went back: once applied, the cache holds the
    server's records as they are now (`Sync.went_back`)."""
    unseen: set[str] | None = None
    """The ids the cache held when the first slice came, less those the read showed since:
    only those may be evicted (an id put by a write made since was not there to read)."""
    gone: list[str] | None = None
    """The ids to evict, once every record is applied (taken from the end)."""

    @classmethod
    def of(cls, records: list[Record], after_back: bool = False) -> _FullRead:
        records.reverse()
        return cls(records, len(records), after_back)


class Sync:
    """One device's view of the server: where its records live, and what was read of them."""

    def __init__(
        self,
        client: ServerClient,
        space: str,
        records: RecordCache,
        unit: Unit,
        stats: Stats,
        fence: Fence | None = None,
        pace: Pace | None = None,
    ) -> None:
        self.client = client
        self.pace = pace
        """What a large feed page waits for before it is decoded (the timer's next start)."""
        self.space = space
        self.records = records
        self.unit = unit
        self.stats = stats
        self.places: Places | None = None
        self.peer_id: str | None = None
        self.cursor: int | None = None
        self.feed_available = True
        self.resolved = False
        self.tombstones: set[str] = set()
        self._buffer: list[Change | _FullRead | _Cursor] = []
        self._last_full: float | None = None
        self._cut = False
        """The last `apply_buffered` stopped at its slice's end (`pending`)."""
        self._resumed = False
        """The mirror held a feed cursor: the first full read may wait (`full_read_due`)."""
        self._server_away = False
        self._went_back = False
        """The change feed went back behind the cursor, and has not moved forward since."""
        self._built = 0
        """Changed records applied from the feed since what they built was last kept."""
        self._covered: int | None = None
        """The feed's head once the last full read was answered: an entry at or below it
        may be older than a record that read showed; one above it is newer than any record
        the cache holds, unless the server's versions went back. None: not known yet."""
        self._back = False
        """The server's versions went back, and no full read since has been applied whole."""
        self.feed_backoff_s = 0.0
        """How long the sync loop waits before the next poll of the feed: 0 while it behaves."""
        self.reread = asyncio.Event()
        """Set when every record is to be read again at once (the server's versions went
        back): the sync loop's back-off from a misbehaving feed ends for it."""
        self._early = False
        """The last poll was answered before `EARLY_ANSWER` of its wait."""
        self._direct: set[str] = set()
        """The ids put in the cache outside the buffer (`written`) since the last full read
        was asked for: a read may show those at a lower version without anything wrong."""
        self.fence = fence
        """Notes the claims' tokens and the replication lag (anyrtd/claims.py), when set."""

    def restore(self, meta: Mapping[str, str], tombstones: Iterable[str]) -> None:
        """Take the peer id, places, cursor and tombstones the mirror kept.

        Another process's `anyrt-<pid>` stamp is not this process's identity (every reader
        treats it as unassigned), and a peer id the registry had pruned is nobody's: this
        process starts from its own stamp instead.
        """
        peer = meta.get("peer_id")
        if (is_stamp(peer) and peer != stamp(os.getpid())) or meta.get("verdict") == Verdict.PRUNED:
            peer = stamp(os.getpid())
        self.peer_id = peer
        self.places = Places.from_meta(meta)
        cursor = meta.get("cursor")
        self.cursor = int(cursor) if cursor is not None else None
        self._resumed = self.cursor is not None
        self.tombstones = set(tombstones)

    async def load(self, db: AsyncMirror) -> None:
        """Fill the record cache from the mirror: the records' texts, then this device's own
        trigger writes still queued in the outbox, laid over them."""
        ahead = asyncio.create_task(db.call(Mirror.record_texts))
        try:
            while page := await ahead:
                # A page at a time; the mirror's thread reads the next page while this one
                # is stored. Each record is parsed when first read (anyrtd/records.py).
                ahead = asyncio.create_task(
                    db.call(functools.partial(Mirror.record_texts, after=page[-1][0]))
                )
                await asyncio.sleep(0)  # let the read start
                with gc_paused():  # the cache outlives the start: see anyrtd/heap.py
                    self.records.load_texts(page)
        finally:
            ahead.cancel()  # done unless the parse failed
        for item in await db.call(lambda m: m.outbox_pending(1_000_000)):
            if item.dataset == TRIGGERS:
                self.records.write(item.id, item.fields, item.unset)

    # reading

    async def resolve(self, now: float, self_id: str | None = None) -> None:
        """Resolve the places and the peer id (`self_id`: the election's, when it knows it);
        note when the server stops or starts answering."""
        try:
            places, peer = await self._resolve(self_id)
        except (ServerUnavailable, ServerError) as exc:
            self.stats.last_error = f"server: {exc}"
            if not self._server_away:
                self._server_away = True
                log.warning("the server is not answering (%s); running from the mirror", exc)
            return
        self.resolved = True
        if self._server_away:
            self._server_away = False
            log.info("the server answers again")
        if peer != self.peer_id:
            log.info("this device's peer id is %s", peer)
        self.places, self.peer_id = places, peer
        self.unit.meta({**places.to_meta(), "peer_id": peer})

    async def _resolve(self, self_id: str | None) -> tuple[Places, str]:
        places = await resolve_places(self.client, self.space)
        return places, self_id or await self._own_peer()

    async def _own_peer(self) -> str:
        """The registry's `self`; while the registry fails (5xx, though the places just
        resolved), the peer id the mirror remembers from it; else (no registry, or nothing
        remembered) this process's stamp."""
        try:
            devices = await self.client.devices()
        except ServerUnavailable:
            if self.peer_id and not is_stamp(self.peer_id):
                return self.peer_id
        else:
            if devices is not None and devices.self_id:
                return devices.self_id
        return stamp(os.getpid())

    def follow(self, self_id: str | None) -> bool:
        """Take the registry's `self` as this device's peer id once it changes (a fresh init);
        return whether it changed."""
        if not self.resolved or not self_id or self_id == self.peer_id:
            return False
        log.info("this device's peer id is now %s (was %s)", self_id, self.peer_id)
        self.peer_id = self_id
        self.unit.meta({"peer_id": self_id})
        return True

    def full_read_due(self, now: float, full_resync_s: float) -> bool:
        """Return whether the next step re-reads every record.

        At start that is at once, unless the mirror holds a feed cursor: then the feed from
        that cursor brings what changed meanwhile, and the first full read (the safety net
        against a change the feed missed) comes `FIRST_FULL_AFTER_S` later, after readiness.
        """
        if self._last_full is None and self._resumed and self.feed_available:
            self._resumed = False
            period = self.resync_every(full_resync_s)
            self._last_full = now - period + min(FIRST_FULL_AFTER_S, period)
            return False
        return (
            self._last_full is None
            or not self.feed_available
            or now - self._last_full >= self.resync_every(full_resync_s)
        )

    def resync_every(self, full_resync_s: float) -> float:
        """Return the period of the safety net's full read: `full_resync_s`, or longer for
        a large record set, so that its cost spread over its period does not grow with the
        number of records (docs/architecture.md, "The loops")."""
        return max(full_resync_s, len(self.records) * RESYNC_S_PER_RECORD)

    async def full_read(self, now: float) -> None:
        """Read every trigger record (deleted ones too) into the buffer."""
        assert self.places is not None
        if self.cursor is None and self.feed_available:
            # Follow the feed from here on; what the full read below returns covers the rest.
            page = await self.client.changes(
                self.places.space, since=FEED_HEAD, wait=0, pace=self.pace
            )
            if page is None:
                self._feed_missing()
            else:
                self.cursor = page.seq
        self._direct.clear()
        self.reread.clear()
        after_back = self._back
        records = await self.client.query_all(
            self.places.triggers, include_deleted=True, page_size=FULL_READ_PAGE
        )
        if self.cursor is not None and self.feed_available:
            await self._read_head()
        # A full read not applied to its end yet is superseded: this one shows every record
        # after it (and without a feed, one comes every step, faster than one is applied).
        self._buffer = [item for item in self._buffer if not isinstance(item, _FullRead)]
        self._buffer.append(_FullRead.of(records, after_back))
        if self.cursor is not None:
            self._mark_cursor()
        self._last_full = now

    @property
    def following(self) -> bool:
        """Return whether the next step can read the change feed."""
        return self.places is not None and self.cursor is not None and self.feed_available

    async def read_feed(self, wait: float) -> ChangePage | None:
        """Long-poll the change feed past the cursor, up to `wait` s; None without a feed."""
        assert self.places is not None and self.cursor is not None
        if self._covered is None and not await self._read_head():
            return None
        if self.reread.is_set():
            return None  # every record is read again first (the server's versions went back)
        asked = time.monotonic()
        poll = asyncio.ensure_future(
            self.client.changes(self.places.space, self.cursor, wait=wait, pace=self.pace)
        )
        woke = asyncio.ensure_future(self.reread.wait())
        try:
            await asyncio.wait((poll, woke), return_when=asyncio.FIRST_COMPLETED)
        finally:
            woke.cancel()
            cut = not poll.done()
            if cut:  # a long poll cut short: every record is to be read again first
                poll.cancel()
        if cut:
            return None
        page = poll.result()
        self._early = time.monotonic() - asked < EARLY_ANSWER * wait
        if page is None:
            self._feed_missing()
        return page

    async def _read_head(self) -> bool:
        """Note the feed's head as what the records read so far may be newer than (every
        write they show is at or below it); return whether there is a feed."""
        assert self.places is not None
        page = await self.client.changes(self.places.space, FEED_HEAD, wait=0, pace=self.pace)
        if page is None:
            self._feed_missing()
            return False
        self._covered = page.seq
        return True

    def went_back(self, why: str, shown: Iterable[str] = (), *, again: bool = False) -> None:
        """Note that the server's versions went back (`why` says how it showed): one warning
        an episode; every record it shows next is taken as it is, and every record is read
        again at the next step (docs/reliability.md, "When the server's versions go back")."""
        self.records.went_back(shown)
        if self._back and not again:
            return
        self._back = True
        self._last_full = None
        self._resumed = False  # read at once, not `FIRST_FULL_AFTER_S` after a resume
        self.reread.set()
        log.warning(
            "the server's versions went back (%s: a restore from a backup, or a reset): "
            "taking its records as they are now, with one read of every record; this "
            "device's writes it has not taken stay queued",
            why,
        )

    def acked(self, rid: str, version: int | None) -> None:
        """Note that the server took one of this device's queued writes to `rid` at
        `version` (the cache lets the write's overlay go once the server shows it)."""
        if self.records.acked(rid, version):
            self.went_back(
                f"it took a write of {printable(rid)} at version {version}, not above the "
                "one it had shown before the write"
            )

    def written(self, rid: str, before: int | None, version: int | None) -> None:
        """Note this device's write of `rid`, made through at once (the control API): the
        cache held `before`, the server took it at `version`."""
        self._direct.add(rid)
        if version is not None and before and version <= before:
            self.went_back(
                f"it took a write of {printable(rid)} at version {version}, not above the "
                f"{before} it had shown"
            )

    def take(self, page: ChangePage, now: float) -> int:
        """Buffer the page's trigger changes and move the cursor past it; return how many of
        them a tick should apply soon.

        A change of a record this device has its own fire writes on (a rollup, a once's
        consumption) is most likely those writes shown back: it waits for the next tick
        rather than waking one, so that a busy device does not tick for its own echoes.
        """
        assert self.places is not None and self.cursor is not None
        behind = page.seq < self.cursor
        # Entries at or below the cursor were read already, unless the feed went back (another
        # numbering: every entry is news).
        fresh = page.changes if behind else [c for c in page.changes if c.seq > self.cursor]
        self._pace_feed(page, fresh, behind)
        relevant = [c for c in fresh if self.places.matches_triggers(c)]
        if self.fence is not None:  # the lag as the page arrives, not when a tick applies it
            arrived = (c.record for c in relevant if c.record is not None)
            self.fence.sample_lag(arrived, self.peer_id, now)
        if page.seq < self.cursor:
            # The feed is behind what this mirror followed: another server, or one restored
            # from a backup. Follow it from its head, and read every record at the next step;
            # once an episode: a feed that keeps going back costs neither a line nor a full
            # read a poll.
            if not self._went_back:
                self._went_back = True
                self._covered = page.seq
                self.went_back(
                    f"the change feed is at {page.seq}, behind the mirror's cursor "
                    f"{self.cursor}; following it from there, noted once until it moves forward",
                    again=True,
                )
                self._last_full = None
        elif page.seq > self.cursor:
            self._went_back = False
        self.cursor = page.seq
        self._buffer.extend(relevant)
        self._mark_cursor()
        echo = self.records.echo
        return sum(1 for c in relevant if c.op == "delete" or c.record is None or not echo(c.id))

    def _pace_feed(self, page: ChangePage, fresh: list[Change], behind: bool) -> None:
        """Back off while the feed misbehaves (`FEED_BACKOFF_MAX_S`); noted once an episode."""
        assert self.cursor is not None
        if behind:
            fault = f"its head {page.seq} is behind the cursor {self.cursor}"
        elif page.changes and not fresh:
            fault = f"it repeats {len(page.changes)} entries already read"
        elif not page.changes and page.seq == self.cursor and self._early:
            fault = "it answers a long poll at once with nothing new"
        else:
            if self.feed_backoff_s:
                log.info("the change feed behaves again: following it without waiting")
            self.feed_backoff_s = 0.0
            return
        if not self.feed_backoff_s:
            log.warning(
                "the change feed misbehaves (%s): polling it less often, up to every %g s, "
                "until it behaves",
                fault,
                FEED_BACKOFF_MAX_S,
            )
        self.feed_backoff_s = min(
            FEED_BACKOFF_MAX_S, 2 * self.feed_backoff_s or FEED_BACKOFF_FIRST_S
        )

    def buffer(self, change: Change) -> None:
        """Buffer a change read outside the feed (a record this device just seeded)."""
        self._buffer.append(change)

    def _mark_cursor(self) -> None:
        """Buffer the cursor after what was buffered: the mirror keeps it once that is applied
        (and committed with it), so a restart resumes the feed from what it holds."""
        assert self.cursor is not None
        if self._buffer and isinstance(self._buffer[-1], _Cursor):
            self._buffer[-1] = _Cursor(self.cursor)
        else:
            self._buffer.append(_Cursor(self.cursor))

    def _feed_missing(self) -> None:
        if self.feed_available:
            log.info("the server has no change feed: full queries every tick")
        self.feed_available = False

    # applying

    @property
    def pending(self) -> bool:
        """True when the last tick applied a slice of a burst and its rest is buffered (what
        arrived since, this device's own writes shown back say, waits for its tick)."""
        return self._cut and bool(self._buffer)

    @gc_paused()  # a full read of 100,000 records: anyrtd/heap.py
    def apply_buffered(self, changes: int | None = None, within: Slice | None = None) -> set[str]:
        """Apply what was read since the last tick, in the order it was read, but at most
        `changes` changes (feed changes and a full read's changed records, evictions
        included) and `TICK_SCAN` records of a full read (None: all), and once `within`
        is over no more than the change under way; return the ids it touched. What is
        left waits for the next tick, so a burst of changes, of huge records, or a full
        read of many changed records is applied in slices and never holds the loop (and
        the timer) for long."""
        touched: set[str] = set()
        left = changes
        took = False
        for n, item in enumerate(self._buffer):
            if isinstance(item, _Cursor):
                self.unit.meta({"cursor": str(item.seq)})
                continue
            if (left is not None and left <= 0) or (took and within is not None and within.over()):
                return self._cut_at(n, touched)
            took = True
            if isinstance(item, Change):
                touched |= self._apply_change(item)
                self._built += 1
                left = None if left is None else left - 1
            else:
                left = self._apply_full_read(item, touched, left, within)
                if left is not None and (item.gone is None or item.gone):
                    return self._cut_at(n, touched)  # the rest of the read: the next slice
        self._buffer = []
        self._cut = False
        return self._kept(touched)

    def _kept(self, touched: set[str]) -> set[str]:
        """Keep what the changes applied so far built out of full passes, once enough."""
        if self._built >= CHANGES_KEEP:
            self._built = 0
            keep_built()
        return touched

    def _cut_at(self, n: int, touched: set[str]) -> set[str]:
        """Keep the buffer from its `n`th item for the next tick."""
        del self._buffer[:n]
        self._cut = True
        return self._kept(touched)

    def _apply_full_read(
        self, read: _FullRead, touched: set[str], left: int | None, within: Slice | None
    ) -> int | None:
        """Apply the next slice of a full read, at most `left` changes and `TICK_SCAN`
        records (None: all of it), and none once `within` is over; add the ids it touched
        to `touched` and return the changes left (0 when `within` ran out)."""
        if read.unseen is None:
            read.unseen = set(self.records.ids())
        records, unseen = read.left, read.unseen
        scan = start = len(records) if left is None else TICK_SCAN
        while records and scan and (left is None or left > 0):
            if within is not None and scan < start and within.over():
                return 0
            record = records.pop()
            scan -= 1
            rid = str(record.get("id", ""))
            unseen.discard(rid)
            if self._behind(rid, record):
                self.went_back(
                    f"a read of every record shows {printable(rid)} at version "
                    f"{record.get('_v')}, behind the {self.records.version(rid)} held",
                    # what this read showed already is as the server has it now
                    shown=set(self.records.ids()) - unseen - {rid},
                )
            if record.get("_deleted"):
                touched.add(self.forget(rid))
            elif (kept := self.remember(record)) is not None:
                touched.add(kept)
            else:
                continue
            left = None if left is None else left - 1
        if read.gone is None and not records:
            # Every record applied: what the read did not show (and the cache still holds)
            # is gone from the server.
            read.gone = [rid for rid in unseen if rid in self.records]
            read.unseen = set()
        gone = read.gone or []
        while gone and (left is None or left > 0):
            touched.add(self.forget(gone.pop()))
            left = None if left is None else left - 1
        if not records and not gone and self._back:
            self._settle(read)
        if read.size >= FULL_READ_KEEP and left is not None:
            keep_built()  # what the slice built: a full pass would walk it at every slice
        return left

    def _behind(self, rid: str, record: Mapping[str, Any]) -> bool:
        """Return whether `record` (read in order) shows `rid` at a lower version than the
        cache holds from what the server showed before: its versions went back."""
        v, held = record.get("_v"), self.records.version(rid)
        return (
            isinstance(v, int)
            and not isinstance(v, bool)
            and held is not None
            and 0 < v < held
            and rid not in self._direct
            and not self.records.is_stale(rid)
        )

    def _settle(self, read: _FullRead) -> None:
        """End the episode of versions gone back once a read made after it is applied whole
        and every record was taken as the server has it now; else read again."""
        if read.after_back and not self.records.stale:
            self._back = False
            log.info("took the server's records as they are now, after its versions went back")
        elif not any(isinstance(item, _FullRead) and item is not read for item in self._buffer):
            self._last_full = None

    def _apply_change(self, change: Change) -> set[str]:
        if change.op == "delete":
            return {self.forget(change.id)}
        if change.record is not None:
            record = {"id": change.id, **change.record}
            if (
                self._covered is not None
                and change.seq > self._covered
                and self._behind(change.id, record)
            ):
                self.went_back(
                    f"the change feed shows {printable(change.id)} at version "
                    f"{record.get('_v')}, behind the {self.records.version(change.id)} held"
                )
            kept = self.remember(record)
            return set() if kept is None else {kept}
        return set()

    def remember(self, record: Mapping[str, Any]) -> str | None:
        """Put a record in the cache and the mirror; return its id (None if not kept)."""
        if self.fence is not None:
            self.fence.note(record)
        rid = self.records.put(record)
        if rid is not None:
            self.unit.keep_record(rid, self.records.version(rid), record)
        return rid

    def forget(self, rid: str) -> str:
        """Drop a deleted record from the cache and the mirror, and tombstone its id."""
        if rid not in self.tombstones:
            self.tombstones.add(rid)
            self.unit.tombstone(rid)
        if self.records.drop(rid):
            self.unit.drop_record(rid)
        return rid


__all__ = ["FIRST_FULL_AFTER_S", "TICK_CHANGES", "Sync"]
