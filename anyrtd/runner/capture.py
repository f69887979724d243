"""A run's captured output: both pipes of a command, or an in-process program's log lines,
kept up to the cap as a true prefix, and the last stdout line kept apart for the result."""

from __future__ import annotations

import asyncio
import functools
import logging
import os

from anyrtd.runs import valid_text

INVALID_OUTPUT = "output bytes that are not valid UTF-8 were replaced with U+FFFD"
"""The note added after a run's output when its bytes had to be made valid."""
RESULT_LINE_LIMIT = 256 * 1024
"""A stdout line longer than this cannot be the JSON result; keeps memory bounded."""
PARTIAL_LINE_LIMIT = 64 * 1024
"""A partial line longer than this is flushed to the capture without waiting for its newline."""


class Capture:
    """The run's captured output: bytes up to the cap, the rest counted and dropped."""

    def __init__(self, cap: int) -> None:
        self._buf = bytearray()
        self._cap = max(0, cap)
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self._cap - len(self._buf)
        if self.dropped == 0 and len(data) <= room:
            self._buf += data
            return
        # Once anything is dropped, everything after is dropped too: the kept
        # output stays a true prefix of what the program wrote.
        if self.dropped == 0 and room > 0:
            self._buf += data[:room]
            self.dropped += len(data) - room
        else:
            self.dropped += len(data)

    def add_line(self, text: str) -> None:
        self.add(valid_text(text.rstrip("\n"))[0].encode("utf-8") + b"\n")

    def text(self) -> str:
        """Return the kept output as valid UTF-8, with a note if bytes had to be replaced."""
        buf = bytes(self._buf)
        if self.dropped:
            buf = utf8_whole(buf)
        try:
            return buf.decode("utf-8")
        except UnicodeDecodeError:
            return buf.decode("utf-8", "replace") + f"anyrtd: {INVALID_OUTPUT}\n"

    def so_far(self) -> str:
        """Return the output kept so far of a run still running: a prefix of what `text`
        gives at its end (a UTF-8 sequence cut short at the end waits for its rest)."""
        return utf8_whole(bytes(self._buf)).decode("utf-8", "replace")


def utf8_whole(buf: bytes) -> bytes:
    """Drop a UTF-8 sequence cut short at the end of `buf` (the cap can fall inside one)."""
    for back in range(1, min(4, len(buf)) + 1):
        byte = buf[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: keep looking for the lead
            continue
        if byte & 0x80 == 0:
            return buf
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return buf if back >= need else buf[:-back]
    return buf


class LastLine:
    """Track the last non-blank line of a stream, without holding the stream."""

    def __init__(self, limit: int = RESULT_LINE_LIMIT) -> None:
        self._limit = limit
        self._current = bytearray()
        self._too_long = False
        self.last: bytes | None = None

    def feed(self, data: bytes) -> None:
        parts = data.split(b"\n")
        for i, part in enumerate(parts):
            if not self._too_long:
                if len(self._current) + len(part) > self._limit:
                    self._too_long = True
                    self._current.clear()
                else:
                    self._current += part
            if i < len(parts) - 1:
                self._end_line()

    def _end_line(self) -> None:
        if self._too_long:
            self.last = None
        elif self._current.strip():
            self.last = bytes(self._current)
        self._current.clear()
        self._too_long = False

    def finish(self) -> bytes | None:
        if self._current or self._too_long:
            self._end_line()
        return self.last


class LineSink:
    """Feed one output stream into the shared capture a whole line at a time."""

    def __init__(self, capture: Capture, last_line: LastLine | None = None) -> None:
        self._capture = capture
        self._pending = b""
        self._last_line = last_line

    def feed(self, data: bytes) -> None:
        if self._last_line is not None:
            self._last_line.feed(data)
        data = self._pending + data
        cut = data.rfind(b"\n")
        if cut >= 0:
            self._capture.add(data[: cut + 1])
            data = data[cut + 1 :]
        if len(data) > PARTIAL_LINE_LIMIT:
            self._capture.add(data)
            data = b""
        self._pending = data

    def close(self) -> None:
        if self._pending:
            self._capture.add(self._pending + b"\n")
            self._pending = b""


class _PipeReader(asyncio.Protocol):
    """Read one output pipe as data arrives, so a chatty program never blocks on a full pipe."""

    def __init__(self, sink: LineSink, closed: asyncio.Future[None]) -> None:
        self._sink = sink
        self._closed = closed

    def data_received(self, data: bytes) -> None:
        self._sink.feed(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._sink.close()
        if not self._closed.done():
            self._closed.set_result(None)


class Pipes:
    """The read ends of a command's output pipes, each feeding its sink until EOF."""

    def __init__(self) -> None:
        self.closed: list[asyncio.Future[None]] = []
        self._transports: list[asyncio.ReadTransport] = []

    async def connect(self, fd: int, sink: LineSink) -> None:
        """Start reading the pipe `fd` (taking ownership of it) into `sink`."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        transport, _ = await loop.connect_read_pipe(
            functools.partial(_PipeReader, sink, fut), os.fdopen(fd, "rb", buffering=0)
        )
        self.closed.append(fut)
        self._transports.append(transport)

    async def drain(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for every pipe to reach EOF, then close them all."""
        if self.closed:
            await asyncio.wait(self.closed, timeout=timeout_s)
        for transport in self._transports:
            transport.close()


_RUN_LINE = logging.Formatter("%(levelname)s %(message)s")
"""How a run logger's line reads in the run's output (one formatter for every run)."""


class RunLogger(logging.Logger):
    """A run's logger (`ctx.log`): each line goes into the run's capture, then on to the
    daemon's handlers through `parent`.

    Not registered with logging's manager, so it goes away with the run; and no handler of
    its own (a handler takes a lock and a place in logging's registry), so a run costs one
    object here.
    """

    def __init__(self, name: str, capture: Capture, parent: logging.Logger) -> None:
        super().__init__(name, logging.INFO)
        self.parent = parent
        self._capture = capture

    def callHandlers(self, record: logging.LogRecord) -> None:
        try:
            self._capture.add_line(_RUN_LINE.format(record))
        except Exception:
            _ERRORS.handleError(record)
        super().callHandlers(record)


_ERRORS = logging.Handler()
"""Reports a line that could not be captured the way a handler would (logging's own rule)."""
