"""The timer: sleeps until the earliest next fire in the registry's heap and fires it then.

A fire whose preparation could not be committed (the disk is full) is tried again after
the wait `Firing.hold_s` gives, not at once: late, not lost, and no hot loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from anyrtd.clock import Clock
from anyrtd.firing import Firing
from anyrtd.registry import Registry

IDLE_WAKE_S = 60.0
"""The longest the timer sleeps without looking (the wall clock may have stepped)."""


class Timer:
    """One step of the timer loop at a time (`step`), woken early by `rearm`."""

    def __init__(
        self,
        *,
        registry: Registry,
        firing: Firing,
        clock: Clock,
        fire: Callable[[float], Awaitable[list[str]]],
    ) -> None:
        self.registry = registry
        self.firing = firing
        self.clock = clock
        self.fire = fire
        self.rearm = asyncio.Event()
        """Set to make the sleeping timer look at the heap again (a tick, a write-through)."""

    async def step(self) -> None:
        """Fire what is due, or sleep until it is (or until `rearm` is set)."""
        self.firing.watch_clock()
        due = self.registry.next_due()
        now = self.clock.now()
        hold = self.firing.hold_s()
        if due is not None and due <= now and hold <= 0.0:
            await self.fire(now)
            return
        self.rearm.clear()
        timeout = IDLE_WAKE_S if due is None else min(IDLE_WAKE_S, max(due - now, hold))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.rearm.wait(), timeout=timeout)


__all__ = ["Timer"]
