"""The clock, injected everywhere time is read, so tests can run hours in milliseconds."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time (unix seconds), monotonic time and sleeping."""

    def now(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told; `sleep` returns once the clock has advanced."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 0.0
        self._changed = asyncio.Event() if _has_loop() else None

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by `seconds`."""
        self._now += seconds
        self._mono += seconds
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def set(self, now: float) -> None:
        """Jump the wall clock to `now` (monotonic moves by the same amount if forward)."""
        self.advance(max(0.0, now - self._now))
        self._now = now

    async def sleep(self, seconds: float) -> None:
        deadline = self._mono + max(0.0, seconds)
        while self._mono < deadline:
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
