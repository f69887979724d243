"""What the chat built-ins share: argument checks and posting a message under the agent's name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from anyrtd.client import Dataset, ServerError, Upsert

if TYPE_CHECKING:
    from anyrtd.program import ProgramContext

AGENT_BUNDLE = "bao/v1"
GENERAL_CHAT_SEED = "bao/chat/general"
MESSAGES = "chat_messages"


class InvalidArgs(ValueError):
    """A program's args are missing or of the wrong type; the message says which and how to fix."""


class ChatNotFound(InvalidArgs):
    """The chat a built-in posts to (args.chatId in args.space) does not exist on the server."""


def no_such_chat(chat: str, space: str) -> str:
    """Return what a built-in says when its chat does not exist, in the user's words."""
    return (
        f"chat {chat} does not exist in space {space}: set args.chatId to a chat of the "
        "space, or drop args.chatId to post to its general chat"
    )


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
    try:
        await _upsert(ctx, where, message_id, text)
    except ServerError as exc:
        if exc.status != 404:
            raise
        raise ChatNotFound(no_such_chat(where.object_id, where.space)) from None


async def _upsert(ctx: ProgramContext, where: Dataset, message_id: str, text: str) -> None:
    await ctx.client.upsert(
        where,
        [
            Upsert(
                message_id,
                {"text": text, "agent": ctx.agent_name, "createdAt": round(ctx.clock.now(), 3)},
            )
        ],
    )
