"""What the chat built-ins share: argument checks and posting a message under the agent's name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from anyrtd.client import Dataset, Upsert

if TYPE_CHECKING:
    from anyrtd.program import ProgramContext

AGENT_BUNDLE = "bao/v1"
GENERAL_CHAT_SEED = "bao/chat/general"
MESSAGES = "chat_messages"


class InvalidArgs(ValueError):
    """A program's args are missing or of the wrong type; the message says which and how to fix."""


def text_arg(args: Mapping[str, Any], key: str, program: str, *, required: bool) -> str | None:
    """Return `args[key]` as a non-empty string, None when absent and optional."""
    value = args.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        need = "needs" if required else "takes an optional"
        raise InvalidArgs(f"{program} {need} args.{key}, a non-empty string; got {value!r:.80}")
    return value


async def chat_messages(args: Mapping[str, Any], ctx: ProgramContext, program: str) -> Dataset:
    """Return the `chat_messages` dataset named by args.space/args.chatId.

    `space` defaults to the agent space and `chatId` to its general chat, so the
    standing rollup needs no args.
    """
    space = text_arg(args, "space", program, required=False) or ctx.space
    chat = text_arg(args, "chatId", program, required=False)
    if chat is None:
        chat = await ctx.client.child(space, AGENT_BUNDLE, GENERAL_CHAT_SEED)
    return Dataset(space, chat, MESSAGES)


async def post_message(ctx: ProgramContext, where: Dataset, message_id: str, text: str) -> None:
    """Post `text` to the chat as a new message under the agent's name."""
    await ctx.client.upsert(
        where,
        [
            Upsert(
                message_id,
                {"text": text, "agent": ctx.agent_name, "createdAt": round(ctx.clock.now(), 3)},
            )
        ],
    )
