"""The clock, injected everywhere time is read, so tests can run hours in milliseconds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol


class Cancellable(Protocol):
    """A call to come (an `asyncio.TimerHandle`, or a task), taken back with `cancel`."""

    def cancel(self) -> Any: ...


class Clock(Protocol):
    """Wall time (unix seconds), monotonic time, sleeping and calls to come."""

    def now(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    def call_later(self, seconds: float, fn: Callable[[], None]) -> Cancellable:
        """Call `fn` in `seconds` from the event loop, unless cancelled first."""
        ...


LOOP_SLICE_S = 0.02
"""How long one piece of sliced work may hold the event loop before it leaves the rest to
its next turn: applying the changes the feed brought, noting a drain's acknowledgements.
A count alone does not bound it: one record of megabytes (huge strings, a cron list of
thousands) costs a millisecond or more to decode, fingerprint and keep, and 100 of them in
one tick held the loop for 150 ms (the records fault family, bound 100 ms).
Chosen: a tick also reconciles a slice (about 25 ms, `SPREAD_SLICE`) and commits its unit
of work; 20 ms of changes leaves those within the bound with a margin."""


def rise_at_once(held: float, seen: float) -> float:
    """Return a measure `held` after `seen`: at once up to a larger one, a fifth of the way
    down to a smaller one (a start late is worse than work done early, and a slow disk or a
    busy loop is slow for a while, not once)."""
    return max(seen, held + 0.2 * (seen - held))


class Slice:
    """A stretch of the event loop's time for one piece of sliced work: the work asks
    `over()` between items and leaves the rest for its next turn.

    It reads `time.perf_counter`, the time the loop is really held, not the injected
    clock (a test's fake clock does not move while work runs); tests pass `timer`.
    """

    __slots__ = ("_end", "_timer")

    def __init__(
        self, seconds: float = LOOP_SLICE_S, timer: Callable[[], float] = time.perf_counter
    ) -> None:
        self._timer = timer
        self._end = timer() + seconds

    def over(self) -> bool:
        """Tell whether the slice's time is spent."""
        return self._timer() >= self._end


class Ticks:
    """The ends of the daemon's ticks, for the loops that keep the tick's pace (the
    notices' pass, the spaces loop). Waiting for a tick's end rather than on a timer of
    their own, their work shares the tick's wake of the process: an idle daemon wakes
    once a tick, not once a loop."""

    def __init__(self) -> None:
        self._ended = asyncio.Event()

    def end(self) -> None:
        """Note that a tick ended: whoever waits for it goes on."""
        ended, self._ended = self._ended, asyncio.Event()
        ended.set()

    async def next(self, within: float) -> bool:
        """Wait for the next tick's end, at most `within` s; return whether one came."""
        ended = self._ended
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await ended.wait()
        return ended.is_set()


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def call_later(self, seconds: float, fn: Callable[[], None]) -> Cancellable:
        # A timer handle, not a task that sleeps: a run's budget costs no task.
        return asyncio.get_running_loop().call_later(max(0.0, seconds), fn)


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

    def call_later(self, seconds: float, fn: Callable[[], None]) -> Cancellable:
        async def later() -> None:
            await self.sleep(seconds)
            fn()

        return asyncio.get_running_loop().create_task(later())


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
