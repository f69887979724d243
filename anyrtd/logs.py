"""Logging: one line per event on stderr, with syslog priority prefixes under systemd.

Under systemd (`JOURNAL_STREAM` names our stderr) every line starts with its `<N>`
priority, tracebacks included, so `journalctl -u anyrtd -p err` shows the errors and
their tracebacks; journald stamps the time itself. Elsewhere each line starts with a
local ISO 8601 timestamp and the level name. The trigger and run a line concerns follow
the message as `trigger=... run=...`: pass them in `extra=`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import TextIO

# The context fields a log line may carry, in the order they are written.
CONTEXT_FIELDS = ("trigger", "run", "program")

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Libraries that log every HTTP request at INFO: a tick would fill the journal.
_CHATTY_LOGGERS = ("alembic", "httpx", "httpcore")


def syslog_priority(levelno: int) -> int:
    """Return the syslog priority (0-7) for a logging level number."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


_NEEDS_QUOTES = re.compile(r'[\s="]')
"""A context value with whitespace (as `str.isspace` judges it), `=` or `"` is quoted."""


def _context_suffix(record: logging.LogRecord) -> str:
    parts = []
    for name in CONTEXT_FIELDS:
        value = getattr(record, name, None)
        if value is None:
            continue
        text = str(value)
        if not text or _NEEDS_QUOTES.search(text):
            text = json.dumps(text)
        parts.append(f"{name}={text}")
    return " " + " ".join(parts) if parts else ""


class _EventFormatter(logging.Formatter):
    """Format the message, its context fields, then any traceback."""

    def _head(self, record: logging.LogRecord) -> str:
        raise NotImplementedError

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        parts = [self._head(record) + record.message + _context_suffix(record)]
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            parts.append(record.exc_text)
        if record.stack_info:
            parts.append(self.formatStack(record.stack_info))
        return "\n".join(parts)


class PlainFormatter(_EventFormatter):
    """`2025-01-02T08:00:00.004+01:00 INFO anyrtd.daemon: fired trigger=t1 run=r1`."""

    def _head(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).astimezone()
        stamp = when.isoformat(timespec="milliseconds")
        return f"{stamp} {record.levelname} {record.name}: "


class JournalFormatter(_EventFormatter):
    """`<6>anyrtd.daemon: fired trigger=t1 run=r1`, the prefix repeated on every line."""

    def _head(self, record: logging.LogRecord) -> str:
        return f"{record.name}: "

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


def stream_is_journal(env: Mapping[str, str], stream: TextIO) -> bool:
    """Return whether `stream` is the journal connection `JOURNAL_STREAM` names.

    systemd passes the variable on to every child, so a process whose stderr was
    redirected elsewhere compares device and inode before writing priority prefixes.
    A stream without a file descriptor is taken at the variable's word.
    """
    raw = env.get("JOURNAL_STREAM")
    if not raw:
        return False
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return True
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return raw == f"{st.st_dev}:{st.st_ino}"


class _AnyrtdHandler(logging.StreamHandler[TextIO]):
    """The handler `setup_logging` installs, so a second call replaces rather than adds."""


def setup_logging(
    level: str = "INFO",
    env: Mapping[str, str] = os.environ,
    stream: TextIO | None = None,
) -> None:
    """Send every log record at `level` or above to `stream` (stderr), one line per event."""
    name = level.upper()
    if name not in LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
    out = sys.stderr if stream is None else stream
    handler = _AnyrtdHandler(out)
    handler.setFormatter(JournalFormatter() if stream_is_journal(env, out) else PlainFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _AnyrtdHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(name)
    for chatty in _CHATTY_LOGGERS:
        logging.getLogger(chatty).setLevel(name if name == "DEBUG" else "WARNING")


def iso_time(ts: float) -> str:
    """Return epoch seconds as the log lines print a time: ISO 8601, local, with its offset."""
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="milliseconds")
