"""A wall clock stepped back: recurring triggers re-arm from the new time, none fires twice.

The daemon runs in-process on the fleet harness (one node) with a fake clock whose wall
time is moved back while its monotonic time is not, as an NTP step or a manual `date -s`
does; the restart case keeps the mirror and restarts the daemon under the earlier clock.
"""

from __future__ import annotations

from typing import Any

from fleet import T0, Node

STEP_S = 7200.0


def every(seconds: float) -> dict[str, Any]:
    return {"kind": "cron", "spec": {"every_s": seconds}, "program": "test:ok@v1"}


def cron(expr: str) -> dict[str, Any]:
    return {"kind": "cron", "spec": {"cron": expr}, "program": "test:ok@v1"}


def next_fire(h: Node, trigger_id: str) -> float:
    entry = h.daemon.registry.get(trigger_id)
    assert entry is not None and entry.row.next_fire is not None
    return entry.row.next_fire


async def scheduled(h: Node, trigger_id: str) -> list[float]:
    return sorted(r["scheduledAt"] for r in await h.runs(trigger_id))


async def adopt_both(h: Node) -> None:
    await h.put("every10", owner=h.me, **every(10))
    await h.put("minutely", owner=h.me, **cron("* * * * *"))
    await h.step(1)
    await h.step(59)  # T0 + 60: both fire once under the later clock
    assert await scheduled(h, "minutely") == [T0 + 60]
    assert len(await scheduled(h, "every10")) == 1


async def test_recurring_triggers_keep_firing_after_a_two_hour_step_back(h: Node) -> None:
    await adopt_both(h)
    h.clock.set(h.clock.now() - STEP_S)
    back = h.clock.now()
    assert await h.step(0) == []  # the step is noticed: both re-arm from the new wall time
    assert back < next_fire(h, "every10") <= back + 10
    assert back < next_fire(h, "minutely") <= back + 60
    for _ in range(6):  # one minute of the new wall time
        await h.step(10)
    every10, minutely = await scheduled(h, "every10"), await scheduled(h, "minutely")
    assert len([t for t in every10 if back < t <= h.clock.now()]) == 6
    assert len([t for t in minutely if back < t <= h.clock.now()]) == 1
    assert len(set(every10)) == len(every10) and len(set(minutely)) == len(minutely)


async def test_the_occurrence_that_already_ran_does_not_fire_again(h: Node) -> None:
    await adopt_both(h)  # minutely ran its T0 + 60 occurrence; the clock reads T0 + 60
    h.clock.set(h.clock.now() - 5)
    assert await h.step(0) == []
    assert next_fire(h, "minutely") == T0 + 60  # re-armed from T0 + 55
    await h.step(5)  # T0 + 60 again: that occurrence already ran
    assert next_fire(h, "minutely") == T0 + 120
    await h.step(60)
    assert await scheduled(h, "minutely") == [T0 + 60, T0 + 120]


async def test_a_small_wobble_within_the_tolerance_re_arms_nothing(h: Node) -> None:
    await adopt_both(h)
    before = next_fire(h, "minutely"), next_fire(h, "every10")
    h.clock.set(h.clock.now() - 0.5)
    await h.step(0)
    assert (next_fire(h, "minutely"), next_fire(h, "every10")) == before


async def test_a_restart_under_an_earlier_clock_re_arms_from_now(h: Node) -> None:
    await adopt_both(h)
    await h.stop()
    h.clock.set(h.clock.now() - STEP_S)  # the mirror holds next fires 2 h ahead
    back = h.clock.now()
    await h.restart()
    assert back < next_fire(h, "every10") <= back + 10
    assert back < next_fire(h, "minutely") <= back + 60
    for _ in range(6):
        await h.step(10)
    now = h.clock.now()
    assert len([t for t in await scheduled(h, "every10") if back < t <= now]) == 6
    assert len([t for t in await scheduled(h, "minutely") if back < t <= now]) == 1


async def test_a_restart_does_not_fire_the_last_occurrence_again(h: Node) -> None:
    await adopt_both(h)
    await h.stop()
    h.clock.set(h.clock.now() - 5)
    await h.restart()
    assert next_fire(h, "minutely") == T0 + 60
    await h.step(5)
    await h.step(60)
    assert await scheduled(h, "minutely") == [T0 + 60, T0 + 120]
