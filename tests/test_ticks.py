"""The ends of the daemon's ticks, and the loops that keep the tick's pace on them
(`anyrtd.clock.Ticks`): the notices' pass follows a tick's end, at most twice a tick
period, and goes on without ticks when none ends for two periods."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from support import async_wait_until, daemon_with

from anyrtd.clock import Ticks
from anyrtd.devserver import DevServer

TICK_S = 0.05


async def test_a_tick_s_end_lets_every_waiter_go_on_and_a_later_waiter_waits_for_the_next() -> None:
    ticks = Ticks()
    waiters = [asyncio.create_task(ticks.next(within=60.0)) for _ in range(3)]
    await asyncio.sleep(0)  # each waits on this tick's end
    ticks.end()
    later = asyncio.create_task(ticks.next(within=60.0))  # begun after that end
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert not later.done()
    ticks.end()
    assert await later


async def test_with_no_tick_s_end_the_wait_ends_after_its_bound() -> None:
    assert not await Ticks().next(within=0.01)


async def test_the_notices_pass_follows_a_tick_s_end_at_most_twice_a_period(
    devserver_inprocess: DevServer, tmp_path: Path
) -> None:
    daemon = daemon_with(devserver_inprocess.url, tmp_path / "state", {}, TICK_S)
    loop = asyncio.get_running_loop()
    passes: list[tuple[float, int]] = []  # (loop time, ticks ended) at each pass
    step = daemon.notices.step

    async def noted() -> None:
        passes.append((loop.time(), daemon.stats.ticks))
        await step()

    daemon.notices.step = noted  # type: ignore[method-assign]
    try:
        await daemon.start()
        await async_wait_until(lambda: asyncio.sleep(0, len(passes) >= 10), what="10 passes")
        # Ticks woken as fast as they go (a feed bringing changes): the passes keep their pace.
        seen = len(passes)
        for _ in range(200):
            daemon._wake.set()
            await asyncio.sleep(0.001)
        await async_wait_until(lambda: asyncio.sleep(0, len(passes) >= seen + 5), what="passes")
    finally:
        await daemon.stop()
    ticks_between = [b[1] - a[1] for a, b in itertools.pairwise(passes)]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(passes)]
    assert all(n >= 1 for n in ticks_between), ticks_between  # each pass after a tick's end
    assert min(gaps) >= TICK_S / 2, gaps
    assert max(ticks_between[seen - 1 :]) > 1, ticks_between  # ticks came faster than passes


async def test_the_notices_pass_goes_on_when_no_tick_ends_for_two_periods(
    devserver_inprocess: DevServer, tmp_path: Path
) -> None:
    daemon = daemon_with(devserver_inprocess.url, tmp_path / "state", {}, TICK_S)
    held = asyncio.Event()
    tick = daemon.tick

    async def held_tick() -> None:  # a tick held up, as by a mirror that does not answer
        await held.wait()
        await tick()

    passes: list[int] = []
    step = daemon.notices.step

    async def noted() -> None:
        passes.append(daemon.stats.ticks)
        await step()

    daemon.notices.step = noted  # type: ignore[method-assign]
    try:
        await daemon.start()
        daemon.tick = held_tick  # type: ignore[method-assign]
        ended, seen = daemon.stats.ticks, len(passes)  # a tick under way may still end
        await async_wait_until(lambda: asyncio.sleep(0, len(passes) >= seen + 3), what="passes")
        assert daemon.stats.ticks <= ended + 1
    finally:
        held.set()
        await daemon.stop()
