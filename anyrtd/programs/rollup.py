"""`agent:rollup@v1`: post a digest of a chat's last day: messages per author and first lines."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from anyrtd.programs.chat import InvalidArgs, chat_messages, post_message, text_arg

if TYPE_CHECKING:
    from anyrtd.client import Record
    from anyrtd.program import ProgramContext

SPEC = "agent:rollup@v1"
DIGEST_PREFIX = "digest-"
MAX_LISTED = 100  # first lines listed in one digest; the counts always cover every message
LINE_WIDTH = 120


def check_args(args: Mapping[str, Any]) -> float:
    """Return the window in hours; raise InvalidArgs when an arg is of the wrong type."""
    text_arg(args, "space", SPEC, required=False)
    text_arg(args, "chatId", SPEC, required=False)
    return _hours(args.get("hours", 24))


async def main(args: Mapping[str, Any], ctx: ProgramContext) -> dict[str, Any]:
    """Post a digest of the last day (or args.hours) of the chat args.chatId in args.space."""
    hours = check_args(args)
    where = await chat_messages(args, ctx, SPEC)
    now = ctx.clock.now()
    since = now - hours * 3600
    records = await ctx.client.query_all(
        where, filter={"createdAt": {"$gte": since}}, sort=["createdAt"]
    )
    messages = [r for r in records if _in_digest(r, ctx.agent_name, since, now)]
    if not messages:
        ctx.log.info(
            "no messages in chat %s since %s; nothing to post", where.object_id, _utc(since)
        )
        return {"title": f"No messages in the last {hours:g} h", "effects": 0}
    text = digest_text(messages, since, now, hours)
    await post_message(ctx, where, f"{DIGEST_PREFIX}{ctx.run_id}", text)
    authors = len({author_of(m) for m in messages})
    ctx.log.info(
        "posted a digest of %d messages from %d authors to chat %s",
        len(messages),
        authors,
        where.object_id,
    )
    return {
        "title": f"Digest: {_plural(len(messages), 'message')} from {_plural(authors, 'author')}",
        "effects": 1,
    }


def _hours(raw: Any) -> float:
    if (
        isinstance(raw, bool)
        or not isinstance(raw, int | float)
        or not math.isfinite(raw)
        or not 0 < raw <= 24 * 31
    ):
        raise InvalidArgs(
            f"{SPEC} takes an optional args.hours, the window in hours (0 < hours <= 744, "
            f"default 24); got {raw!r:.80}"
        )
    return float(raw)


def _in_digest(msg: Record, agent_name: str, since: float, now: float) -> bool:
    created = msg.get("createdAt")
    if msg.get("_deleted") or isinstance(created, bool) or not isinstance(created, int | float):
        return False
    if not since <= created <= now:
        return False
    # Its own earlier digests are not news.
    own_digest = msg.get("agent") == agent_name and str(msg.get("id", "")).startswith(DIGEST_PREFIX)
    return not own_digest


def author_of(msg: Mapping[str, Any]) -> str:
    """Return the name a digest lists a message under."""
    author = msg.get("author")
    if isinstance(author, str) and author.strip():
        return author.strip()
    if "agent" in msg:
        agent = msg.get("agent")
        return f"{agent} (agent)" if isinstance(agent, str) and agent else "an agent"
    return "unknown"


def first_line(msg: Mapping[str, Any]) -> str:
    """Return the first non-blank line of a message, shortened to fit one digest line."""
    text = msg.get("text")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()] if isinstance(text, str) else []
    if not lines:
        return "(attachment)" if msg.get("attachments") else "(no text)"
    line = lines[0]
    return line if len(line) <= LINE_WIDTH else line[: LINE_WIDTH - 1] + "…"


def digest_text(
    messages: Sequence[Mapping[str, Any]], since: float, now: float, hours: float
) -> str:
    """Return the digest: a headline, then each author's count and first lines, busiest first."""
    by_author: dict[str, list[Mapping[str, Any]]] = {}
    for msg in messages:
        by_author.setdefault(author_of(msg), []).append(msg)
    order = sorted(by_author, key=lambda a: (-len(by_author[a]), a.casefold()))
    out = [
        f"Digest of the last {hours:g} h ({_utc(since)} to {_utc(now)} UTC): "
        f"{_plural(len(messages), 'message')} from {_plural(len(order), 'author')}.",
    ]
    listed = 0
    for author in order:
        mine = by_author[author]
        out.append("")
        out.append(f"{author}: {_plural(len(mine), 'message')}")
        for msg in mine:
            if listed == MAX_LISTED:
                break
            out.append(f"- {first_line(msg)}")
            listed += 1
    if listed < len(messages):
        out.append("")
        out.append(f"… and {len(messages) - listed} more not listed.")
    return "\n".join(out)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")
