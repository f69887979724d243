"""The chat responder (`chat-watch`): answers new messages of the general chat, one at a time.

The reserved `chat-watch` record is an event trigger on the general chat with the program
`internal:chat-watch`. The device that holds it (claimed by the active device, or pinned)
connects the watch: each new message is offered to the responders, and a message one of
them accepts becomes a conversation, a run of `internal:chat-watch` recorded in
`agent_runs` under the record's id. Connecting answers the backlog: the messages of the
last hour that are still unanswered. A message is answered when the chat holds a message
whose `replyTo` is its id; the reply to message `m` is always the record `reply-m`, so two
devices that both answer in an overlap window write one reply, not two. See docs/events.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from anyrtd.client import Dataset, ServerClient, ServerError, Upsert
from anyrtd.clock import Clock
from anyrtd.events import CHAT_DATASET, ChatMessage, is_own, message_of
from anyrtd.model import TriggerDef
from anyrtd.port import Port
from anyrtd.program import ProgramContext
from anyrtd.programs.chat import AGENT_BUNDLE, GENERAL_CHAT_SEED
from anyrtd.rows import RunRow
from anyrtd.vocab import CHAT_WATCH_PROGRAM, is_unassigned

log = logging.getLogger("anyrtd.chat")

CHAT_WATCH_ID = "chat-watch"
CHAT_WATCH_ONLY = (
    f"{CHAT_WATCH_PROGRAM} runs only as the chat-watch record, on a new message in the chat "
    "it watches: post one there to run it"
)
"""Why a run by hand of the chat responder could only fail (it answers a message)."""
RESPONDER_GROUP = "anyrtd.responders"
BACKLOG_WINDOW_S = 3600.0
REPLY_PREFIX = "reply-"
MAX_GENERATIONS = 1000
_SEEN_LIMIT = 10_000
_LISTED = 30


def generation_id(n: int) -> str:
    """Return the id of the n-th generation of the chat-watch record (1 is the bare id)."""
    return CHAT_WATCH_ID if n <= 1 else f"{CHAT_WATCH_ID}-g{n}"


def generation_of(rid: str) -> int | None:
    """Return the generation of a chat-watch id (1 for the bare id), or None for another id."""
    if rid == CHAT_WATCH_ID:
        return 1
    prefix = f"{CHAT_WATCH_ID}-g"
    digits = rid[len(prefix) :] if rid.startswith(prefix) else ""
    if not (digits.isascii() and digits.isdigit()) or digits.startswith("0"):
        return None
    n = int(digits)
    return n if 2 <= n <= MAX_GENERATIONS else None


def current_generation(found: str, tombstones: Container[str]) -> str:
    """Return the chat-watch generation in use: the first from `found` (the one boot found
    or seeded) on that is not known deleted. Its record may not exist yet: the next boot
    of any device seeds it."""
    n = generation_of(found) or 1
    while n < MAX_GENERATIONS and generation_id(n) in tombstones:
        n += 1
    return generation_id(n)


def chat_watch_fields(chat_object_id: str) -> dict[str, Any]:
    """Return the fields of a freshly seeded chat-watch record (unassigned)."""
    return {
        "name": "Chat responder",
        "kind": "event",
        "spec": {"dataset": CHAT_DATASET, "objectId": chat_object_id},
        "program": CHAT_WATCH_PROGRAM,
        "owner": "",
        "enabled": True,
    }


async def ensure_chat_watch(
    client: ServerClient, triggers: Dataset, space: str
) -> tuple[str, Mapping[str, Any]]:
    """Return the chat-watch record in use, seeding it when none exists.

    The id is the first generation (`chat-watch`, `chat-watch-g2`, ...) that is not
    tombstoned. Creation is conditional (`ifVersion: 0`): an existing record, perhaps
    pinned by its user or seeded by another device a moment ago, is never overwritten.
    """
    chat: str | None = None
    for n in range(1, MAX_GENERATIONS + 1):
        rid = generation_id(n)
        found, _ = await client.query(triggers, filter={"id": rid}, include_deleted=True)
        if found and found[0].get("_deleted"):
            continue
        if found:
            return rid, found[0]
        if chat is None:
            chat = await client.child(space, AGENT_BUNDLE, GENERAL_CHAT_SEED)
        try:
            await client.upsert(triggers, [Upsert(rid, chat_watch_fields(chat), if_version=0)])
        except ServerError as exc:
            if exc.code == "tombstoned":
                continue
            if exc.code != "version_conflict":  # a conflict: another device seeded it first
                raise
        else:
            log.info("seeded the chat responder record %s on chat %s", rid, chat)
        found, _ = await client.query(triggers, filter={"id": rid})
        if found:
            return rid, found[0]
    raise RuntimeError(f"every chat-watch generation up to {MAX_GENERATIONS} is tombstoned")


# responders


@dataclass(frozen=True)
class ResponderContext:
    """What a responder gets besides the message."""

    agent_name: str
    now: float
    client: ServerClient
    scheduler: Port
    """What the responder may read of the scheduler it answers for (`anyrtd.port.Port`)."""
    log: logging.Logger


@runtime_checkable
class Responder(Protocol):
    """Something that answers chat messages: `accepts` decides cheaply, `respond` answers."""

    def accepts(self, message: ChatMessage) -> bool: ...

    async def respond(self, message: ChatMessage, ctx: ResponderContext) -> str | None: ...


def load_responders(group: str = RESPONDER_GROUP) -> list[Responder]:
    """Return the responders installed in the entry-point group, in name order.

    An entry point names a responder object, or a class (or factory) that makes one with no
    arguments. One that fails to load is logged and skipped.
    """
    out: list[Responder] = []
    for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
        try:
            obj = ep.load()
            responder = obj if isinstance(obj, Responder) else obj()
        except Exception as exc:
            log.warning(
                "responder %s (%s) failed to load: %s: %s",
                ep.name,
                ep.value,
                type(exc).__name__,
                exc,
            )
            continue
        if not isinstance(responder, Responder):
            log.warning(
                "responder %s (%s) is a %s, not an object with accepts(message) and "
                "async respond(message, ctx); skipped",
                ep.name,
                ep.value,
                type(responder).__name__,
            )
            continue
        out.append(responder)
    return out


class SchedulerResponder:
    """The shipped responder: answers `/help`, `/triggers`, `/runs` and `/next` about this
    scheduler."""

    COMMANDS: Mapping[str, str] = {
        "/help": "this list",
        "/triggers": "every trigger record: kind, where it runs, status",
        "/runs": "the last runs on the device that answers",
        "/next": "the next fires on the device that answers",
    }

    def accepts(self, message: ChatMessage) -> bool:
        return _command(message.text) in self.COMMANDS

    async def respond(self, message: ChatMessage, ctx: ResponderContext) -> str | None:
        command = _command(message.text)
        if command == "/help":
            lines = ["I answer these commands about the scheduler:"]
            lines += [f"{name} — {what}" for name, what in self.COMMANDS.items()]
            return "\n".join(lines)
        if command == "/triggers":
            return _triggers_text(ctx)
        if command == "/runs":
            rows = await ctx.scheduler.runs(limit=10)
            return _runs_text(rows, ctx.scheduler.peer_id)
        if command == "/next":
            return _next_text(ctx)
        return None


def _command(text: str) -> str:
    words = text.strip().split()
    return words[0].lower() if words and words[0].startswith("/") else ""


def _when(ts: float | None) -> str:
    if ts is None:
        return "never"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _in(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _triggers_text(ctx: ResponderContext) -> str:
    known = ctx.scheduler.triggers()
    me = known.peer_id
    defs = sorted(
        (d for d in known.parsed.values() if isinstance(d, TriggerDef)),
        key=lambda d: d.id,
    )
    bad = len(known.parsed) - len(defs)
    if not defs:
        return "There are no trigger records." + (f" ({bad} malformed)" if bad else "")
    lines = [f"{len(defs)} trigger{'s' if len(defs) != 1 else ''}:"]
    for d in defs[:_LISTED]:
        where = (
            "unassigned"
            if is_unassigned(d.owner)
            else "here"
            if d.owner == me
            else f"on {d.owner[:16]}"
        )
        state = "enabled" if d.enabled else "disabled"
        status = f", last {d.rollup.last_status}" if d.rollup.last_status else ""
        lines.append(f"- {d.id} ({d.kind}, {d.program}) {where}, {state}{status}")
    if len(defs) > _LISTED:
        lines.append(f"… and {len(defs) - _LISTED} more")
    if bad:
        lines.append(f"({bad} malformed record{'s' if bad != 1 else ''} skipped)")
    return "\n".join(lines)


def _runs_text(rows: Sequence[RunRow], me: str | None) -> str:
    if not rows:
        return f"No runs on this device ({me}) yet."
    lines = [f"The last {len(rows)} runs on this device:"]
    for r in rows:
        took = f", {r.duration_ms} ms" if r.duration_ms is not None else ""
        lines.append(f"- {_when(r.started_at)} {r.trigger_id or '(manual)'}: {r.status}{took}")
    return "\n".join(lines)


def _next_text(ctx: ResponderContext) -> str:
    due = sorted(
        (e.row.next_fire, e.id)
        for e in ctx.scheduler.triggers().entries.values()
        if e.row.next_fire is not None
    )
    if not due:
        return "Nothing is scheduled on this device."
    lines = ["Next on this device:"]
    for at, tid in due[:10]:
        lines.append(f"- {tid} at {_when(at)} (in {_in(at - ctx.now)})")
    return "\n".join(lines)


# the watch

Fire = Callable[[str, ChatMessage], Awaitable["asyncio.Task[None] | None"]]
"""Start the conversation run for a message; return its task (None if it cannot run now)."""


class ChatWatch:
    """The chat responder of this device: connected while it holds the chat-watch record.

    Conversations run one at a time, oldest message first. `connect` returns at once; the
    worker it starts reads the backlog first, then serves the live messages `offer` queues.
    """

    def __init__(
        self,
        *,
        agent_name: str,
        client: ServerClient,
        clock: Clock,
        scheduler: Port,
        fire: Fire,
        responders: Iterable[Responder] | None = None,
        window_s: float = BACKLOG_WINDOW_S,
    ) -> None:
        self.agent_name = agent_name
        self.client = client
        self.clock = clock
        self.scheduler = scheduler
        self._fire = fire
        self.responders: list[Responder] = [SchedulerResponder()]
        self.responders += list(responders) if responders is not None else load_responders()
        self.window_s = window_s
        self.trigger_id: str | None = None
        self.chat: Dataset | None = None
        self._queue: deque[ChatMessage] = deque()
        self._ready = asyncio.Event()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._worker: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        return self.trigger_id is not None

    def accepts(self, message: ChatMessage) -> bool:
        """Return True when some responder takes the message."""
        return not is_own(message, self.agent_name) and any(
            r.accepts(message) for r in self.responders
        )

    def connect(self, trigger_id: str, chat: Dataset) -> bool:
        """Start answering as `trigger_id` on `chat` (backlog first); False if already so."""
        if self.trigger_id == trigger_id and self.chat == chat:
            return False
        if self.connected:
            self.disconnect("the chat-watch record moved")
        self.trigger_id, self.chat = trigger_id, chat
        self._worker = asyncio.create_task(self._work(trigger_id, chat), name="anyrtd-chat-watch")
        log.info("chat watch connected as %s on chat %s", trigger_id, chat.object_id)
        return True

    def disconnect(self, reason: str) -> int:
        """Stop answering; drop the conversations not started yet (the one running finishes)."""
        if not self.connected:
            return 0
        dropped = len(self._queue)
        for message in self._queue:
            self._seen.pop(message.message_id, None)  # not answered: a later backlog may
        self._queue.clear()
        if self._worker is not None:
            self._worker.cancel()
            self._worker = None
        log.info(
            "chat watch disconnected from %s (%s)%s",
            self.trigger_id,
            reason,
            f"; dropped {dropped} deferred conversations" if dropped else "",
        )
        self.trigger_id, self.chat = None, None
        return dropped

    def offer(self, message: ChatMessage) -> bool:
        """Queue a new message for a conversation; return True if it was queued."""
        if not self.connected or not self._admit(message):
            return False
        self._queue.append(message)
        self._ready.set()
        return True

    def _admit(self, message: ChatMessage) -> bool:
        if message.message_id in self._seen or not self.accepts(message):
            return False
        self._seen[message.message_id] = None
        while len(self._seen) > _SEEN_LIMIT:
            self._seen.popitem(last=False)
        return True

    async def backlog(self, chat: Dataset) -> list[ChatMessage]:
        """Return the chat's messages of the last window that no reply answers yet, oldest first."""
        since = self.clock.now() - self.window_s
        records = await self.client.query_all(
            chat, filter={"createdAt": {"$gte": since}}, sort=["createdAt"]
        )
        replied = {r["replyTo"] for r in records if isinstance(r.get("replyTo"), str)}
        out = []
        for record in records:
            message = message_of(record, chat.space, chat.object_id)
            if message.message_id not in replied and self.accepts(message):
                out.append(message)
        return out

    async def _work(self, trigger_id: str, chat: Dataset) -> None:
        try:
            backlog = await self.backlog(chat)
        except Exception as exc:  # the server is away: live messages still get answered
            log.warning("chat watch: the backlog could not be read: %s", exc)
        else:
            older = [m for m in backlog if self._admit(m)]
            if older:
                log.info("chat watch: answering %d unanswered messages of the backlog", len(older))
                self._queue.extendleft(reversed(older))
                self._ready.set()
        while True:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            message = self._queue.popleft()
            try:
                task = await self._fire(trigger_id, message)
                if task is not None:
                    await asyncio.shield(task)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("chat watch: the conversation on %s failed", message.message_id)

    async def stop(self) -> None:
        """Disconnect and wait for the worker to end."""
        worker = self._worker
        self.disconnect("stopping")
        if worker is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    # the program

    async def converse(self, args: Mapping[str, Any], ctx: ProgramContext) -> dict[str, Any]:
        """Run one conversation (the `internal:chat-watch` program): answer the message."""
        event = args.get("event")
        if not isinstance(event, Mapping) or not isinstance(event.get("messageId"), str):
            raise ValueError(
                f"{CHAT_WATCH_PROGRAM} runs only as the chat-watch record, on a chat event; "
                "it got no args.event"
            )
        message = message_of(
            {"id": event["messageId"], **{k: v for k, v in event.items() if k != "messageId"}},
            str(event.get("space") or ctx.space),
            str(event.get("objectId", "")),
        )
        rctx = ResponderContext(
            agent_name=self.agent_name,
            now=ctx.clock.now(),
            client=ctx.client,
            scheduler=self.scheduler,
            log=ctx.log,
        )
        for responder in self.responders:
            if not responder.accepts(message):
                continue
            text = await responder.respond(message, rctx)
            if text is None:
                continue
            where = Dataset(message.space, message.object_id, CHAT_DATASET)
            reply = reply_fields(text, self.agent_name, message.message_id, ctx.clock.now())
            await ctx.client.upsert(where, [Upsert(REPLY_PREFIX + message.message_id, reply)])
            ctx.log.info("answered message %s (%s)", message.message_id, type(responder).__name__)
            return {"title": f"Answered {_summary(message.text)}", "turns": 1, "effects": 1}
        return {"title": f"No answer to {_summary(message.text)}", "turns": 1}


def reply_fields(text: str, agent_name: str, reply_to: str, now: float) -> dict[str, Any]:
    """Return the fields of the agent's reply to message `reply_to`."""
    return {"text": text, "agent": agent_name, "createdAt": round(now, 3), "replyTo": reply_to}


def _summary(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "(no text)"
    return line if len(line) <= 60 else line[:59] + "…"


__all__ = [
    "BACKLOG_WINDOW_S",
    "CHAT_WATCH_ID",
    "CHAT_WATCH_ONLY",
    "RESPONDER_GROUP",
    "ChatWatch",
    "Responder",
    "ResponderContext",
    "SchedulerResponder",
    "chat_watch_fields",
    "current_generation",
    "ensure_chat_watch",
    "generation_id",
    "generation_of",
    "load_responders",
]
