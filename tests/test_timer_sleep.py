"""The timer's precise last stretch before a start survives a sleep that fails or a clock
that stepped (issue 23, item 13: libfaketime's `time.sleep` raised EINVAL)."""

from __future__ import annotations

import errno
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_fire_ahead import PEER, Stage, stage  # noqa: F401 - the fixture

from anyrtd.clock import SystemClock
from anyrtd.firing import Prepared
from anyrtd.timer import PRECISE_S, Timer, precise_sleep
from anyrtd.vocab import Verdict


def einval(_seconds: float) -> None:
    raise OSError(errno.EINVAL, "Invalid argument")


def test_a_failing_sleep_is_taken_again_with_a_relative_timeout() -> None:
    began = time.perf_counter()
    assert precise_sleep(0.001, einval) is True
    assert time.perf_counter() - began >= 0.0009


def test_a_sleep_that_cannot_be_taken_at_all_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(select, "select", lambda *_a: einval(0.0))
    assert precise_sleep(0.001, einval) is False


def test_the_sleep_is_bounded_whatever_it_is_asked() -> None:
    asked: list[float] = []
    assert precise_sleep(3600.0, asked.append)
    assert precise_sleep(-5.0, asked.append)
    assert asked == [PRECISE_S, 0.0]


@pytest.mark.parametrize("select_fails", [False, True])
async def test_a_batch_starts_at_its_due_time_when_the_thread_sleep_fails(
    stage: Stage,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
    select_fails: bool,
) -> None:
    timer = Timer(stage.registry, stage.firing, SystemClock(), lambda: (PEER, Verdict.ACTIVE))
    started: list[tuple[float, float]] = []

    async def start(batch: Prepared) -> list[str]:
        started.append((batch.due, time.time()))
        timer.prepared.remove(batch)
        return []

    timer.start = start  # type: ignore[method-assign]
    monkeypatch.setattr(time, "sleep", einval)
    if select_fails:
        monkeypatch.setattr(select, "select", lambda *_a: einval(0.0))
    for _ in range(5):
        timer.prepared[:] = [Prepared(time.time() + PRECISE_S / 2, {})]
        deadline = time.monotonic() + 1.0
        while timer.prepared and time.monotonic() < deadline:
            await timer.step()
    assert len(started) == 5 and all(at >= due for due, at in started)


FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
)
SLEEPS = """
import time
from anyrtd.timer import PRECISE_S, precise_sleep
began = time.monotonic()
slept = [precise_sleep(PRECISE_S) for _ in range(50)]
print(sum(slept), time.monotonic() - began)
"""


@pytest.mark.process
@pytest.mark.parametrize("offset", ["-7200", "+7200"])
def test_the_precise_sleep_sleeps_under_libfaketime_with_its_clock_stepped(
    tmp_path: Path, offset: str
) -> None:
    """As the fault suite runs the daemon (bench/faults/clock.py): the wall clock offset
    by a timestamp file, the monotonic clock left alone; there `time.sleep` fails."""
    lib = next((p for p in FAKETIME_LIBS if Path(p).exists()), None)
    if lib is None:
        pytest.skip("libfaketime is not installed (Debian: faketime)")
    stamp = tmp_path / "faketime"
    stamp.write_text(f"{offset}\n")
    env = {
        **os.environ,
        "LD_PRELOAD": lib,
        "FAKETIME_TIMESTAMP_FILE": str(stamp),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", SLEEPS], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    slept, took = done.stdout.split()
    assert int(slept) == 50
    assert float(took) >= 50 * PRECISE_S * 0.9
