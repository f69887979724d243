"""Event triggers: from a change of the space's feed to the fires it causes. Pure, clock-free.

Only a new message fires (`op: create` on a `chat_messages` dataset); edits and reactions
are updates and never fire. Messages under the serving agent's own name, and agent
messages with no name, never fire. Event triggers are live-only: a message that
reached the feed before this process started following it (`LiveGate`) never fires.
See docs/events.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from anyrtd.client import Change
from anyrtd.model import TriggerDef
from anyrtd.schedule import EventSchedule

CHAT_DATASET = "chat_messages"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """A new chat message, as the feed announced it."""

    space: str
    object_id: str
    message_id: str
    text: str
    agent: str | None
    """The `agent` field when the message has one (possibly ""), else None."""
    attachments: Any
    created_at: float | None
    seq: int
    record: Mapping[str, Any]

    @property
    def by_agent(self) -> bool:
        return self.agent is not None

    def payload(self) -> dict[str, Any]:
        """Return the `event` object a program receives."""
        out: dict[str, Any] = {
            "space": self.space,
            "objectId": self.object_id,
            "messageId": self.message_id,
            "text": self.text,
        }
        if self.agent is not None:
            out["agent"] = self.agent
        if self.attachments is not None:
            out["attachments"] = self.attachments
        return out


def is_chat_dataset(name: str) -> bool:
    """Return True for `chat_messages` by its short or its collection name."""
    return name == CHAT_DATASET or name.endswith("_" + CHAT_DATASET)


def message_of(record: Mapping[str, Any], space: str, object_id: str, seq: int = 0) -> ChatMessage:
    """Return the message a chat record holds (a record from a query or from the feed)."""
    text = record.get("text")
    agent = record.get("agent") if "agent" in record else None
    created = record.get("createdAt")
    if isinstance(created, bool) or not isinstance(created, int | float):
        created = None
    return ChatMessage(
        space=space,
        object_id=object_id,
        message_id=str(record.get("id", "")),
        text=text if isinstance(text, str) else "",
        agent=agent if isinstance(agent, str) else ("" if "agent" in record else None),
        attachments=record.get("attachments"),
        created_at=float(created) if created is not None else None,
        seq=seq,
        record=record,
    )


def new_message(change: Change, space: str) -> ChatMessage | None:
    """Return the new chat message a feed change announces, or None for anything else."""
    if change.op != "create" or change.record is None or not is_chat_dataset(change.dataset):
        return None
    if not change.id or change.record.get("_deleted"):
        return None
    return message_of({**change.record, "id": change.id}, space, change.object_id, change.seq)


def is_own(message: ChatMessage, agent_name: str) -> bool:
    """Return True for a message the serving agent must not react to: its own, or a nameless
    agent's."""
    return message.agent is not None and message.agent in ("", agent_name)


def event_target(defn: TriggerDef, agent_space: str) -> tuple[str, str] | None:
    """Return the (space, chat object id) an event trigger listens on, or None."""
    schedule = defn.schedule
    if not isinstance(schedule, EventSchedule) or schedule.dataset != CHAT_DATASET:
        return None
    return (schedule.space_id or agent_space, schedule.object_id)


def fires(
    message: ChatMessage,
    triggers: Iterable[TriggerDef],
    *,
    agent_space: str,
    agent_name: str,
) -> list[TriggerDef]:
    """Return the event triggers a new message fires (the caller passes only fireable ones)."""
    if is_own(message, agent_name):
        return []
    where = (message.space, message.object_id)
    return [d for d in triggers if d.kind == "event" and event_target(d, agent_space) == where]


@dataclass
class LiveGate:
    """What makes event triggers live-only: where each space's feed stood, and the wall time,
    when this process began following it. A message at or before that feed position, or
    created before that time, arrived while this device was not listening."""

    since: float
    """Wall time (unix s) this process started listening."""
    heads: dict[str, int] = field(default_factory=dict)
    """Per space, the feed's head when this process started following it."""

    def admits(self, message: ChatMessage) -> bool:
        """Return True for a message that arrived while this process was listening."""
        head = self.heads.get(message.space)
        if head is None or message.seq <= head:
            return False
        return message.created_at is None or message.created_at >= self.since


__all__ = [
    "CHAT_DATASET",
    "ChatMessage",
    "LiveGate",
    "event_target",
    "fires",
    "is_chat_dataset",
    "is_own",
    "message_of",
    "new_message",
]
