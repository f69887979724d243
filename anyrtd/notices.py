"""Notices: one message per event that the user should know of, where they already look.

The events: a trigger missed occurrences (anyrtd/missed.py, an episode per silence), the
breaker auto-disabled a trigger, a `once` failed, the outbox set a write aside. The
channels, each off by default (the `[notices]` table of the config): a message to a chat of
the space under the agent's name, and a declared local command that gets the notice as JSON
on stdin. Only the active device makes the notices about triggers, once it may claim (the
takeover hold is over); a set-aside write is this device's own, so it makes that one.

Once across devices and restarts: a notice is made under a key that every device computes
alike; the device that makes it first writes the key on the trigger's record (its
`noticed` field, which no definition reads) and keeps the notice in its mirror (the
`notices` table), then delivers it. A device that finds the key on the record, or in its
mirror, makes nothing. A delivery that fails is tried again, `retries` more times, 1 s,
2 s, 4 s, ... apart (a restart resumes it), then given up with a log line. At most
`per_hour` notices are made in any hour; the others wait their turn (docs/notices.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from anyrtd import agenda as agendas
from anyrtd.claims import Fence
from anyrtd.client import Dataset, ServerClient, ServerError, ServerUnavailable, Upsert
from anyrtd.clock import Clock, Ticks
from anyrtd.config import CommandProgram, Config, NoticeSettings
from anyrtd.election import Gate
from anyrtd.mirror import AsyncMirror, Mirror
from anyrtd.missed import SAME_OCCURRENCE_S, Missed, Skips, default_grace, iso
from anyrtd.model import TriggerDef
from anyrtd.places import Places
from anyrtd.programs.chat import AGENT_BUNDLE, GENERAL_CHAT_SEED, MESSAGES
from anyrtd.records import RecordCache
from anyrtd.rows import NoticeRow, SetAside
from anyrtd.timer import Timer
from anyrtd.vocab import Kind, LastStatus, MissCause, NoticeChannel, NoticeKind, Verdict
from anyrtd.watch import Watch

log = logging.getLogger("anyrtd.notices")

NOTICED_FIELD = "noticed"
"""The trigger record's field that holds, per kind of notice, the key of the last one made."""
COMMAND_TIMEOUT_S = 30.0
"""The longest a notice command may run; then it is killed and the delivery failed."""
RETRY_MAX_S = 60.0
QUIET = (MissCause.DISABLED, MissCause.AUTO_DISABLED)
"""Missed occurrences no notice is made for: the user chose it, or the breaker's own notice
said it."""


@dataclass(frozen=True)
class Notice:
    """One event to tell: what happened, why, and the command that fixes it."""

    key: str
    kind: NoticeKind
    trigger_id: str | None
    at: float
    text: str
    why: str
    fix: str | None
    facts: Mapping[str, Any] = field(default_factory=dict)
    thread: str | None = None
    """The key of the notice this one follows up (its chat message is the reply to that
    one's); None for a notice that starts a thread."""

    def to_json(self) -> dict[str, Any]:
        """Return the notice as the command reads it on stdin."""
        return {
            "key": self.key,
            "kind": self.kind,
            "triggerId": self.trigger_id,
            "at": self.at,
            "text": self.text,
            "why": self.why,
            "fix": self.fix,
            "facts": dict(self.facts),
            **({"thread": self.thread} if self.thread is not None else {}),
        }


def _missed_notice(m: Missed) -> Notice | None:
    loud = [o for o in m.occurrences if o.cause not in QUIET]
    if not loud:
        return None
    last, n = loud[0], m.count
    runs = f"{n}{'+' if m.capped else ''} occurrence{'s' if n != 1 else ''}"
    episode = m.episode
    if last.cause == MissCause.STALL_SKIP:
        # A stall is its own episode: a run after it, then a silence, is another one.
        episode = f"{m.trigger_id}:skipped:{last.facts['skippedAt']!r}"
    return Notice(
        key=f"{NoticeKind.MISSED}:{episode}",
        kind=NoticeKind.MISSED,
        trigger_id=m.trigger_id,
        at=last.at,
        text=f"{m.trigger_id} did not run at {iso(last.at)} ({runs} missed since {iso(m.since)})",
        why=last.text,
        fix=last.fix,
        facts={"cause": last.cause, "missed": n, "since": m.since, "owner": m.owner},
    )


def skip_notices(missed: Iterable[Missed]) -> list[Notice]:
    """Return the notices of the occurrences this daemon skipped after a stall, which only
    it knows of: it makes them itself, active or not, as a write set aside (pure)."""
    out = [n for m in missed if (n := _missed_notice(m)) is not None]
    return [n for n in out if n.facts["cause"] == MissCause.STALL_SKIP]


def _trigger_notice(d: TriggerDef, bound: float) -> Notice | None:
    r = d.rollup
    if r.last_run_at is None or r.last_run_at < bound:
        return None
    facts = {"lastRunAt": r.last_run_at, "lastRunRef": r.last_run_ref, "owner": d.owner}
    if d.kind == Kind.ONCE and r.last_status in (LastStatus.ERROR, LastStatus.AUTO_DISABLED):
        return Notice(
            key=f"{NoticeKind.ONCE_FAILED}:{d.id}:{r.last_run_at!r}",
            kind=NoticeKind.ONCE_FAILED,
            trigger_id=d.id,
            at=r.last_run_at,
            text=f"{d.id} (once) failed at {iso(r.last_run_at)}",
            why=f"its run {r.last_run_ref or ''} ended with status {r.last_status}".replace(
                "  ", " "
            ),
            fix=f"anyrtd runs list --trigger {d.id}",
            facts=facts,
        )
    if not d.enabled and r.last_status == LastStatus.AUTO_DISABLED:
        return Notice(
            key=f"{NoticeKind.AUTO_DISABLED}:{d.id}:{r.last_run_at!r}",
            kind=NoticeKind.AUTO_DISABLED,
            trigger_id=d.id,
            at=r.last_run_at,
            text=f"{d.id} was switched off by the breaker at {iso(r.last_run_at)}",
            why=f"its last {r.consecutive_failures} runs failed (limit "
            f"{d.max_consecutive_failures})",
            fix=f"anyrtd triggers enable {d.id}",
            facts={**facts, "consecutiveFailures": r.consecutive_failures},
        )
    return None


def _set_aside_notice(item: SetAside, peer_id: str | None) -> Notice:
    return Notice(
        key=f"{NoticeKind.SET_ASIDE}:{peer_id or ''}:{item.seq}",
        kind=NoticeKind.SET_ASIDE,
        trigger_id=None,
        at=item.set_aside_at,
        text=f"a write of record {item.record_id} was set aside by the outbox at "
        f"{iso(item.set_aside_at)}: the server will never take it",
        why=item.error or "the server refused it",
        fix="anyrtd doctor",
        facts={"seq": item.seq, "recordId": item.record_id, "device": peer_id},
    )


@dataclass(frozen=True)
class Watching:
    """An occurrence found at risk, followed until the risk went away or it was missed."""

    key: str
    """The key of its `at_risk` notice (the thread the follow-up goes to)."""
    trigger_id: str
    at: float
    device: str
    """Its device as the notice named it."""


def risk_key(trigger_id: str, at: float) -> str:
    """Return the key of the `at_risk` notice of one occurrence: the same on every device."""
    return f"{NoticeKind.AT_RISK}:{trigger_id}:{at!r}"


def over_key(trigger_id: str, at: float) -> str:
    """Return the key of the follow-up of an `at_risk` notice."""
    return f"{NoticeKind.AT_RISK_OVER}:{trigger_id}:{at!r}"


def _in(seconds: float) -> str:
    s = max(0.0, seconds)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


def at_risk_notice(o: agendas.Occurrence, now: float) -> Notice:
    """Return the notice before the miss of one occurrence at risk (pure)."""
    assert o.at is not None and o.risk is not None
    owner = o.owner
    return Notice(
        key=risk_key(o.trigger_id, o.at),
        kind=NoticeKind.AT_RISK,
        trigger_id=o.trigger_id,
        at=o.at,
        text=f"{o.trigger_id} is due at {iso(o.at)} (in {_in(o.at - now)}) and will be "
        "missed as things stand",
        why=o.risk.text,
        fix=o.risk.fix,
        facts={
            "cause": o.risk.cause,
            "owner": owner.peer,
            "device": owner.device,
            "deviceState": owner.state,
            "deviceSince": owner.since,
            "tz": o.tz,
        },
    )


def risk_over(
    w: Watching,
    defn: TriggerDef | None,
    *,
    at_risk: bool,
    owner: agendas.Owner | None,
    missed: Missed | None,
    now: float,
    grace_s: float,
) -> Notice | None:
    """Return the follow-up of an `at_risk` notice once its outcome is known: the risk went
    away (the device came back, the trigger ran or changed), or the occurrence was missed
    (a grace after it was due, with no run); None while it is still open (pure)."""
    tid, at = w.trigger_id, w.at
    ran = defn.rollup.last_run_at if defn is not None else None
    outcome: str | None = None
    why = ""
    if defn is None or not agendas.listed(defn):
        outcome, why = "gone", "the trigger was disabled, deleted or edited since"
    elif ran is not None and ran >= at - SAME_OCCURRENCE_S:
        outcome, why = "ran", f"it ran at {iso(ran)}"
    elif now < at and not at_risk:
        device = owner.label if owner is not None and owner.device else w.device
        state = f" ({owner.state_text})" if owner is not None else ""
        outcome, why = "cleared", f"device {device} is back{state}"
    elif now >= at + grace_s:
        outcome = "missed"
        why = missed.last.text if missed is not None else f"device {w.device} did not run it"
    if outcome is None:
        return None
    text = {
        "gone": f"{tid}'s occurrence at {iso(at)} is no longer at risk",
        "ran": f"{tid}'s occurrence at {iso(at)} is no longer at risk",
        "cleared": f"{tid}'s occurrence at {iso(at)} is no longer at risk",
        "missed": f"{tid} did not run at {iso(at)}, as the notice before said",
    }[outcome]
    return Notice(
        key=over_key(tid, at),
        kind=NoticeKind.AT_RISK_OVER,
        trigger_id=tid,
        at=at,
        text=text,
        why=why,
        fix=None if outcome != "missed" else f"anyrtd triggers why {tid}",
        facts={"outcome": outcome, "device": w.device},
        thread=w.key,
    )


def trigger_notices(
    missed: Iterable[Missed], defs: Iterable[TriggerDef], *, now: float, lookback_s: float
) -> list[Notice]:
    """Return the notices the triggers call for (missed, auto-disabled, failed once) (pure)."""
    out = [n for m in missed if (n := _missed_notice(m)) is not None]
    bound = now - lookback_s
    out += [n for d in defs if (n := _trigger_notice(d, bound)) is not None]
    return sorted(out, key=lambda n: (n.at, n.key))


def chat_text(n: Notice) -> str:
    """Return a notice as the agent says it in a chat: one short message."""
    lines = [f"{n.text}.", f"Why: {n.why}."]
    if n.fix:
        lines.append(f"Fix: {n.fix}")
    if n.trigger_id is not None:
        lines.append(f"More: anyrtd triggers why {n.trigger_id}")
    return "\n".join(lines)


def message_id(key: str) -> str:
    """Return the chat message id of a notice: the same on every device, so a resend is one."""
    return "notice-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def mark_id(key: str) -> str:
    """Return the id of a notice's mark (`Places.notices`): the same on every device."""
    return "noticed-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def grace_of(config: Config) -> float:
    """Return the grace an occurrence is judged with: `missed_grace_s`, or the default."""
    return config.missed_grace_s or default_grace(config.tick_s, config.run_timeout_s)


def printable(text: str) -> str:
    """Return synced text (ids, device names) fit for a log line: control characters escaped."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


class Parts(Protocol):
    """What the notices read and write: the daemon's stages (`Daemon` has them all)."""

    config: Config
    clock: Clock
    gate: Gate
    fence: Fence
    records: RecordCache
    timer: Timer
    ticks: Ticks
    skips: Skips

    @property
    def client(self) -> ServerClient: ...

    @property
    def peer_id(self) -> str | None: ...

    @property
    def places(self) -> Places | None: ...

    @property
    def db(self) -> AsyncMirror | None: ...


class Notices:
    """The missed watch's passes, and the notices they and the records call for."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        config = parts.config
        self.watch = Watch(
            records=parts.records,
            polls=parts.gate,
            server=parts.client,
            grace_s=grace_of(config),
            skips=parts.skips,
            lookback_s=config.missed_lookback_s,
        )
        self._chat: Dataset | None = None
        self._waiting = 0  # notices held back by the hourly limit, last said in the log
        self._known: set[str] = set()
        """Keys the mirror has a notice for (it keeps every one): not asked again."""
        self._look = True
        """Whether the next pass reads the notices due (one was made, or it is the first)."""
        self._retry_at: float | None = None
        """When the earliest notice left to deliver is tried again (None: none is left)."""
        self._risks: dict[str, Watching] = {}
        """The occurrences found at risk and not settled yet, by their notice's key: every
        device follows them, the active one makes the notices."""

    @property
    def found(self) -> tuple[Mapping[str, Missed], Mapping[str, int]]:
        """Return the watch's last answer: the triggers that missed occurrences, and the
        occurrences counted since the start, by trigger id."""
        return self.watch.missed, self.watch.totals

    @property
    def settings(self) -> NoticeSettings:
        return self.parts.config.notices

    def definitions(self) -> list[TriggerDef]:
        """Return the space's definitions as the missed watch's last pass saw them."""
        return self.watch.definitions()

    def agenda_scene(self, now: float) -> agendas.Scene:
        """Return the facts of an agenda as of `now`: the devices as the missed watch knows
        them, the active device, and the devices its last pass found silent."""
        p = self.parts
        devices, names = self.watch.devices
        winner = self.watch.winner
        if winner is None and p.gate.verdict == Verdict.ACTIVE:
            winner = p.peer_id
        silent = agendas.silences(self.watch.missed.values())
        return agendas.Scene(now, p.peer_id, devices, names, winner, silent)

    def risk_notices(self, now: float, active: bool) -> list[Notice]:
        """Follow the occurrences at risk within the lead; return the notices they call for
        (when `active`): one before each miss, then what became of it."""
        s = self.settings
        scene = self.agenda_scene(now)
        ag = agendas.agenda(
            self.definitions(), scene, hours=s.at_risk_lead_s / 3600.0, at_risk_only=True
        )
        missing = self.watch.missed
        current: dict[str, agendas.Occurrence] = {}
        for o in ag.occurrences:
            # A trigger that misses already has its `missed` notice: none before each miss.
            if o.at is None or o.trigger_id in missing:
                continue
            key = risk_key(o.trigger_id, o.at)
            current[key] = o
            if key not in self._risks:
                self._risks[key] = Watching(key, o.trigger_id, o.at, o.owner.label)
        out = [at_risk_notice(o, now) for o in current.values()] if active else []
        parsed = self.parts.records.parsed
        for key, w in list(self._risks.items()):
            found = parsed.get(w.trigger_id)
            d = found if isinstance(found, TriggerDef) else None
            n = risk_over(
                w,
                d,
                at_risk=key in current,
                owner=agendas.owner_of(d, scene) if d is not None else None,
                missed=missing.get(w.trigger_id),
                now=now,
                grace_s=self.watch.grace_s,
            )
            if n is None:
                continue
            if active:
                out.append(n)
            else:
                del self._risks[key]  # the active device tells it; this one forgets it
        return out

    async def loop(self) -> None:
        """One turn of the loop: a pass at the end of the first tick half a tick period or
        more after the last pass, in the tick's wake of the process (at most twice a period
        while ticks come faster); or, when no tick ends for two periods (a tick held by the
        mirror), on its own."""
        tick_s = self.parts.config.tick_s
        loop = asyncio.get_running_loop()  # its real time, as the tick's own wait
        since = loop.time()
        while await self.parts.ticks.next(within=2 * tick_s):
            if loop.time() - since >= tick_s / 2:
                break
        await self.step()

    async def step(self) -> None:
        """Take one pass: find what was missed; make and deliver the notices due."""
        p = self.parts
        now = p.clock.now()
        config = p.config  # a reload may have changed the bounds
        self.watch.grace_s = grace_of(config)
        self.watch.lookback_s = config.missed_lookback_s
        found = await self.watch.step(now, p.peer_id, p.timer.clear_of)
        db = p.db
        if not self.settings.enabled or db is None:
            return
        made: list[Notice] = []
        active = p.gate.verdict == Verdict.ACTIVE and p.fence.may_claim(now)
        if active:
            made += trigger_notices(
                found, self.watch.notable, now=now, lookback_s=self.watch.lookback_s
            )
        else:
            made += skip_notices(found)
        if self.settings.at_risk:
            await p.timer.clear_of()  # one walk over the definitions: not over a start
            made += self.risk_notices(now, active)
        aside = await db.outbox_set_aside()
        made += [_set_aside_notice(item, p.peer_id) for item in aside]
        made = [n for n in made if n.key not in self._known]
        if made:
            await self._make(db, made, now)
            self._look = True
        for key, w in list(self._risks.items()):
            if over_key(w.trigger_id, w.at) in self._known:
                del self._risks[key]  # settled: its follow-up is made
        # An idle daemon asks the mirror nothing: only a notice made, or a retry come due,
        # sends this pass to it.
        if self._look or (self._retry_at is not None and now >= self._retry_at):
            self._look = False
            for row in await db.call(lambda m: m.notices_due(now)):
                await self._deliver(db, row, now)
            self._retry_at = await db.call(Mirror.notices_retry_at)

    async def _make(self, db: AsyncMirror, notices: Sequence[Notice], now: float) -> None:
        keys = [n.key for n in notices]
        known = await db.call(lambda m: m.notices_known(keys))
        self._known |= known
        fresh = [n for n in notices if n.key not in known]
        if not fresh:
            return
        room = self.settings.per_hour - await db.call(lambda m: m.notices_since(now - 3600.0))
        if len(fresh) > room and self._waiting != len(fresh) - max(room, 0):
            self._waiting = len(fresh) - max(room, 0)
            log.warning(
                "%d notices wait: at most %d are sent in an hour (per_hour in [notices])",
                self._waiting,
                self.settings.per_hour,
            )
        channels = self._channels()
        for n in fresh[: max(room, 0)]:
            claimed = True if n.trigger_id is None else await self._claim(n)
            if claimed is None:
                continue  # the record could not be read or written: the next pass tries
            elsewhere = not claimed
            row = NoticeRow(
                key=n.key,
                kind=n.kind,
                trigger_id=n.trigger_id,
                created_at=now,
                notice=n.to_json(),
                pending=() if elsewhere else channels,
            )
            await db.call(_saving(row))
            self._known.add(n.key)
            if not elsewhere:
                log.info("notice %s: %s (%s)", n.kind, printable(n.text), printable(n.why))

    async def _claim(self, n: Notice) -> bool | None:
        """Create the notice's mark (a record of its own, `Places.notices`); return False when
        it exists already or the trigger's record has the key (another device made it),
        None when the server cannot be asked."""
        places = self.parts.places
        if places is None or n.trigger_id is None:
            return None
        client = self.parts.client
        try:
            records, _ = await client.query(places.triggers, filter={"id": n.trigger_id})
            if not records and n.thread is None:
                return False  # deleted meanwhile: nothing to tell of
            noticed = records[0].get(NOTICED_FIELD) if records else None
            old = noticed if isinstance(noticed, Mapping) else {}  # an earlier anyrtd's marks
            if old.get(n.kind) == n.key:
                return False
            if n.thread is not None and n.thread not in self._known:
                # A follow-up: only where a notice started its thread (its mark says so).
                started, _ = await client.query(places.notices, filter={"id": mark_id(n.thread)})
                if not started and old.get(NoticeKind.AT_RISK) != n.thread:
                    return False  # no notice started its thread: nothing to follow up
            fields = {"key": n.key, "kind": n.kind, "triggerId": n.trigger_id}
            # Created only if missing: two devices that both think they are active make one.
            mark = Upsert(mark_id(n.key), {**fields, "by": self.parts.peer_id}, if_version=0)
            await client.upsert(places.notices, [mark])
        except ServerError as exc:
            if exc.code == "version_conflict":
                return False
            log.debug("notice %s waits for the server: %s", printable(n.key), exc)
            return None
        except ServerUnavailable as exc:
            log.debug("notice %s waits for the server: %s", printable(n.key), exc)
            return None
        return True

    def _channels(self) -> tuple[str, ...]:
        s = self.settings
        return tuple(
            c for c, on in ((NoticeChannel.CHAT, s.chat), (NoticeChannel.COMMAND, s.command)) if on
        )

    async def _deliver(self, db: AsyncMirror, row: NoticeRow, now: float) -> None:
        """Try each channel left; note what is left, or give it up after the retries."""
        wanted = set(self._channels())
        left: list[str] = []
        errors: list[str] = []
        for channel in row.pending:
            if channel not in wanted:
                continue  # switched off since: nothing to deliver there
            try:
                if channel == NoticeChannel.CHAT:
                    await self._post(row)
                else:
                    assert self.settings.command is not None
                    await run_command(self.settings.command, row.notice)
            except Exception as exc:  # every failure is the same to a notice: log, retry
                left.append(channel)
                errors.append(f"{channel}: {exc}")
        attempts = row.attempts + 1
        error = "; ".join(errors) or None
        wait = min(RETRY_MAX_S, 2.0 ** (attempts - 1))
        if left and attempts > self.settings.retries:
            log.error(
                "notice %s not delivered after %d tries, given up: %s",
                printable(row.key),
                attempts,
                printable(error or ""),
            )
            left = []
        elif left:
            log.warning(
                "notice %s not delivered (try %d of %d), again in %gs: %s",
                printable(row.key),
                attempts,
                self.settings.retries + 1,
                wait,
                printable(error or ""),
            )
        done = NoticeRow(
            key=row.key,
            kind=row.kind,
            trigger_id=row.trigger_id,
            created_at=row.created_at,
            notice=row.notice,
            pending=tuple(left),
            attempts=attempts,
            next_try_at=now + wait if left else None,
            last_error=error,
        )
        await db.call(lambda m: m.save_notice(done))

    async def _post(self, row: NoticeRow) -> None:
        """Post the notice to the chat under the agent's name (its id makes a resend one)."""
        p = self.parts
        places = p.places
        if places is None:
            raise ServerUnavailable("the server's datasets are not resolved yet")
        if self._chat is None:
            chat = self.settings.chat_id or await p.client.child(
                places.space, AGENT_BUNDLE, GENERAL_CHAT_SEED
            )
            self._chat = Dataset(places.space, chat, MESSAGES)
        n = row.notice
        notice = Notice(
            key=row.key,
            kind=NoticeKind(row.kind),
            trigger_id=row.trigger_id,
            at=float(n.get("at") or 0.0),
            text=str(n.get("text")),
            why=str(n.get("why")),
            fix=n.get("fix"),
        )
        fields = {
            "text": chat_text(notice),
            "agent": p.config.agent_name,
            "createdAt": round(p.clock.now(), 3),
            "notice": row.kind,
        }
        thread = n.get("thread")
        if isinstance(thread, str):
            fields["replyTo"] = message_id(thread)  # in the thread of the notice it follows
        await p.client.upsert(self._chat, [Upsert(message_id(row.key), fields)])


def _saving(row: NoticeRow) -> Callable[[Mirror], None]:
    return lambda m: m.save_notice(row)


async def run_command(command: CommandProgram, notice: Mapping[str, Any]) -> None:
    """Run the notice command with the notice as JSON on stdin; raise when it fails."""
    env = {**os.environ, **command.env}
    proc = await asyncio.create_subprocess_exec(
        *command.argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=command.cwd,
        env=env,
        start_new_session=True,
    )
    body = (json.dumps(notice, ensure_ascii=False) + "\n").encode()
    try:
        _, err = await asyncio.wait_for(proc.communicate(body), timeout=COMMAND_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise RuntimeError(f"{command.argv[0]} ran over {COMMAND_TIMEOUT_S:g}s: killed") from None
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] if err else []
        said = f": {tail[0][:200]!r}" if tail else ""
        raise RuntimeError(f"{command.argv[0]} exited with status {proc.returncode}{said}")


__all__ = [
    "NOTICED_FIELD",
    "Notice",
    "Notices",
    "Watching",
    "at_risk_notice",
    "chat_text",
    "message_id",
    "risk_key",
    "risk_over",
    "run_command",
    "skip_notices",
    "trigger_notices",
]
