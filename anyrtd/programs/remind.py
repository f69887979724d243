"""`agent:remind@v1`: post a reminder to a chat, as a message under the agent's name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from anyrtd.programs.chat import chat_messages, post_message, text_arg

if TYPE_CHECKING:
    from anyrtd.program import ProgramContext

SPEC = "agent:remind@v1"


def check_args(args: Mapping[str, Any]) -> str:
    """Return args.text; raise InvalidArgs when an arg is missing or of the wrong type."""
    text = text_arg(args, "text", SPEC, required=True)
    assert text is not None
    text_arg(args, "space", SPEC, required=False)
    text_arg(args, "chatId", SPEC, required=False)
    return text


async def main(args: Mapping[str, Any], ctx: ProgramContext) -> dict[str, Any]:
    """Post args.text to the chat args.chatId of args.space."""
    text = check_args(args)
    where = await chat_messages(args, ctx, SPEC)
    # The message id derives from the run, so a retried write cannot post twice.
    message_id = f"remind-{ctx.run_id}"
    await post_message(ctx, where, message_id, text)
    ctx.log.info(
        "posted message %s to chat %s in space %s", message_id, where.object_id, where.space
    )
    first = text.strip().splitlines()[0]
    return {"title": f"Reminder: {first[:80]}", "effects": 1}
