"""The timer's precise last stretch before a start survives a sleep that fails or a clock
that stepped (issue 23, item 13: libfaketime's `time.sleep` raised EINVAL)."""

from __future__ import annotations

import errno
import time

import pytest
from test_fire_ahead import PEER, Stage, stage  # noqa: F401 - the fixture

from anyrtd.clock import SystemClock
from anyrtd.firing import Undo
from anyrtd.timer import PRECISE_S, Prepared, Timer, precise_sleep
from anyrtd.vocab import Verdict


def einval(_seconds: float) -> None:
    raise OSError(errno.EINVAL, "Invalid argument")


def test_a_failing_sleep_is_reported_not_raised() -> None:
    assert precise_sleep(0.001, einval) is False


def test_the_sleep_is_bounded_whatever_it_is_asked() -> None:
    asked: list[float] = []
    assert precise_sleep(3600.0, asked.append)
    assert precise_sleep(-5.0, asked.append)
    assert asked == [PRECISE_S, 0.0]


async def test_a_batch_starts_at_its_due_time_when_the_thread_sleep_fails(
    stage: Stage,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timer = Timer(stage.registry, stage.firing, SystemClock(), lambda: (PEER, Verdict.ACTIVE))
    started: list[tuple[float, float]] = []

    async def start(batch: Prepared) -> list[str]:
        started.append((batch.due, time.time()))
        timer.prepared.remove(batch)
        return []

    timer.start = start  # type: ignore[method-assign]
    monkeypatch.setattr(time, "sleep", einval)
    undo = Undo({}, {}, 0)
    for _ in range(5):
        timer.prepared[:] = [Prepared(time.time() + PRECISE_S / 2, {}, undo)]
        deadline = time.monotonic() + 1.0
        while timer.prepared and time.monotonic() < deadline:
            await timer.step()
    assert len(started) == 5 and all(at >= due for due, at in started)
