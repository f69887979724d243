"""A run's budget, counted on the time the daemon was there to watch the run.

The budget is measured on the monotonic clock, which does not advance while the machine is
suspended (a laptop asleep costs a run nothing). A stopped daemon is another matter: under
`SIGSTOP`, or a paused VM, the monotonic clock goes on while nothing of the daemon runs, so
a run that ended meanwhile would be found past its budget when the daemon comes back, and
be blamed for it (`incomplete`, toward the breaker). So while runs are in flight a beat
checks every `BEAT_S` that the event loop comes when it is due (`Stalls`); a beat later
than `STALL_S` means the loop was held up (stopped, or blocked), and that time is not
counted: a run's budget (`Budget`) is its monotonic time since its start less the stalls
since then, and a budget that runs out with a stall in it is extended by the stall rather
than spent. docs/programs.md (How a run ends).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from anyrtd.clock import Cancellable, Clock

log = logging.getLogger("anyrtd.runner")

BEAT_S = 0.5
"""How often the loop's punctuality is checked while runs are in flight."""
STALL_S = 1.0
"""A beat later than this means the event loop was held up: the lateness is a stall."""
_SPENT_EPSILON_S = 0.001


class Stalls:
    """The time the event loop was held up, summed while any run is in flight."""

    def __init__(self, clock: Clock, *, watch: bool = True) -> None:
        self._clock = clock
        self._watch = watch
        """False on an injected clock that tests move by hand: a jump is no stall there."""
        self._total = 0.0
        self._expected: float | None = None
        self._beat_handle: Cancellable | None = None
        self._watchers = 0

    def join(self) -> float:
        """Watch for stalls until `leave` (a run began); return the total so far."""
        self._watchers += 1
        if self._watch and self._beat_handle is None:
            self._arm()
        return self.total()

    def leave(self) -> None:
        """Stop watching once no run is in flight."""
        self._watchers = max(0, self._watchers - 1)
        if self._watchers == 0 and self._beat_handle is not None:
            self._beat_handle.cancel()
            self._beat_handle, self._expected = None, None

    def total(self) -> float:
        """Return the seconds of stalls so far, the one under way (a beat overdue) included."""
        late = self._late()
        return self._total + (late if late > STALL_S else 0.0)

    def _late(self) -> float:
        if self._expected is None:
            return 0.0
        return self._clock.monotonic() - self._expected

    def _arm(self) -> None:
        self._expected = self._clock.monotonic() + BEAT_S
        self._beat_handle = self._clock.call_later(BEAT_S, self._beat)

    def _beat(self) -> None:
        late = self._late()
        if late > STALL_S:
            self._total += late
            log.info(
                "the daemon was held up %.1f s (stopped, or its event loop blocked): the "
                "budgets of the runs in flight do not count it",
                late,
            )
        self._arm()


class Budget:
    """One run's budget: calls `spent` once the run had `budget_s` of watched time."""

    def __init__(
        self, clock: Clock, stalls: Stalls, budget_s: float, spent: Callable[[], None]
    ) -> None:
        self._clock = clock
        self._stalls = stalls
        self.budget_s = budget_s
        self._spent = spent
        self._began = clock.monotonic()
        self._stalled_before = stalls.join()
        self._handle: Cancellable | None = clock.call_later(budget_s, self._check)

    def used(self) -> float:
        """Return the run's time so far, less the stalls since it began."""
        stalled = self._stalls.total() - self._stalled_before
        return self._clock.monotonic() - self._began - stalled

    def _check(self) -> None:
        left = self.budget_s - self.used()
        if left > _SPENT_EPSILON_S:  # a stall came meanwhile: extend, do not blame
            self._handle = self._clock.call_later(left, self._check)
            return
        self._handle = None
        self._spent()

    def cancel(self) -> None:
        """The run ended: stop counting."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._stalls.leave()


__all__ = ["BEAT_S", "STALL_S", "Budget", "Stalls"]
