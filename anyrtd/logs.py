"""Logging: one line per event on stderr, with syslog priority prefixes under systemd.

Under systemd (`JOURNAL_STREAM` names our stderr) every line starts with its `<N>`
priority, tracebacks included, so `journalctl -u anyrtd -p err` shows the errors and
their tracebacks; journald stamps the time itself. Elsewhere each line starts with a
local ISO 8601 timestamp and the level name. The trigger and run a line concerns follow
the message as `trigger=... run=...`: pass them in `extra=`. Warnings and errors of one
kind are rate-limited (`RateLimit`): 20 per 10 s, then one line saying how many were held.
Control characters in a line (an id, a name or a program's output quoted in it) are
escaped (`anyrtd.escape`): a line is one line, and no escape sequence reaches the journal.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

from anyrtd.escape import printable

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
        # json.dumps escapes what it quotes (`ensure_ascii`); printable, the rest.
        text = json.dumps(text) if not text or _NEEDS_QUOTES.search(text) else printable(text)
        parts.append(f"{name}={text}")
    return " " + " ".join(parts) if parts else ""


class _EventFormatter(logging.Formatter):
    """Format the message, its context fields, then any traceback."""

    def _head(self, record: logging.LogRecord) -> str:
        raise NotImplementedError

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        parts = [self._head(record) + printable(record.message) + _context_suffix(record)]
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            parts.append(printable(record.exc_text, lines=True))
        if record.stack_info:
            parts.append(printable(self.formatStack(record.stack_info), lines=True))
        return "\n".join(parts)


class PlainFormatter(_EventFormatter):
    """`2025-01-02T08:00:00.004+01:00 INFO anyrtd.firing: firing t1 (agent:x@v1) trigger=t1`."""

    _second: int | None = None
    _date = _zone = ""

    def _head(self, record: logging.LogRecord) -> str:
        # The date and the zone are made once a second: a burst logs thousands a second.
        second = int(record.created)
        if second != self._second:
            when = datetime.fromtimestamp(second).astimezone().isoformat(timespec="seconds")
            self._second, self._date, self._zone = second, when[:19], when[19:]
        millis = min(999, int((record.created - second) * 1000))
        return f"{self._date}.{millis:03d}{self._zone} {record.levelname} {record.name}: "


class JournalFormatter(_EventFormatter):
    """`<6>anyrtd.firing: firing t1 (agent:x@v1) trigger=t1`, the prefix repeated on every line."""

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


LIMIT_BURST = 20
"""How many lines of one kind (logger, level, message template) pass per interval."""
LIMIT_INTERVAL_S = 10.0
LIMIT_LEVEL = logging.WARNING
"""Lines below this level are never held back: they say what the daemon did, not a fault."""


@dataclass
class _Window:
    start: float
    passed: int = 1
    suppressed: int = 0


class RateLimit:
    """Pass `burst` lines of one kind per `interval_s`, then hold the rest back and say how
    many in one line when the interval is over.

    A fault can repeat thousands of times a second (a full disk, no file descriptors left,
    a client flooding the control API): each line the same but for its arguments. A kind
    is the logger, the level and the message template; only warnings and worse are held.
    Times are the records' own (`created`), so this reads no clock.
    """

    def __init__(
        self,
        burst: int = LIMIT_BURST,
        interval_s: float = LIMIT_INTERVAL_S,
        level: int = LIMIT_LEVEL,
    ) -> None:
        self.burst = burst
        self.interval_s = interval_s
        self.level = level
        self._windows: dict[tuple[str, int, str], _Window] = {}
        self._swept = 0.0

    def admit(self, record: logging.LogRecord) -> list[logging.LogRecord]:
        """Return what to write for `record`: itself, a summary line before it, or nothing."""
        if record.levelno < self.level:
            return [record]
        now = record.created
        out = self._sweep(now) if now - self._swept >= self.interval_s else []
        key = (record.name, record.levelno, str(record.msg))
        window = self._windows.get(key)
        if window is None or now - window.start >= self.interval_s:
            if window is not None and window.suppressed:
                out.append(self._summary(key, window, now))
            self._windows[key] = _Window(now)
            out.append(record)
        elif window.passed < self.burst:
            window.passed += 1
            out.append(record)
        else:
            window.suppressed += 1
        return out

    def pending(self, now: float) -> list[logging.LogRecord]:
        """Return the summary lines of every kind still holding lines back, and forget them."""
        out = [self._summary(k, w, now) for k, w in self._windows.items() if w.suppressed]
        self._windows.clear()
        return out

    def _sweep(self, now: float) -> list[logging.LogRecord]:
        """Close the windows that are over: their summary lines, and room in the table."""
        self._swept = now
        out = []
        for key, window in list(self._windows.items()):
            if now - window.start >= self.interval_s:
                if window.suppressed:
                    out.append(self._summary(key, window, now))
                del self._windows[key]
        return out

    def _summary(self, key: tuple[str, int, str], window: _Window, now: float) -> logging.LogRecord:
        name, level, template = key
        record = logging.LogRecord(
            name,
            level,
            __file__,
            0,
            "suppressed %d similar lines in %.0f s: %s",
            (window.suppressed, max(now - window.start, 0.0), one_line(template)),
            None,
        )
        record.created = now
        return record


def one_line(text: str, limit: int = 120) -> str:
    """Return `text` on one line, cut to `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class _AnyrtdHandler(logging.StreamHandler[TextIO]):
    """The handler `setup_logging` installs, so a second call replaces rather than adds; it
    writes lines through a `RateLimit`."""

    def __init__(self, stream: TextIO, limit: RateLimit | None = None) -> None:
        super().__init__(stream)
        self.limit = limit or RateLimit()

    def emit(self, record: logging.LogRecord) -> None:
        for line in self.limit.admit(record):
            super().emit(line)

    def close(self) -> None:
        self.acquire()
        try:
            for line in self.limit.pending(time.time()):
                super().emit(line)
        finally:
            self.release()
        super().close()


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
    _skip_unused_fields()
    for chatty in _CHATTY_LOGGERS:
        logging.getLogger(chatty).setLevel(name if name == "DEBUG" else "WARNING")


def _skip_unused_fields() -> None:
    """Stop making the fields of a log record that no line of ours prints: the caller's file
    and line (a walk of the stack per line), the thread, the process and its name. The
    logging HOWTO's "Optimization" section names these switches; a fire logs two lines, and
    they were about a third of a line's cost."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def iso_time(ts: float) -> str:
    """Return epoch seconds as the log lines print a time: ISO 8601, local, with its offset."""
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="milliseconds")
