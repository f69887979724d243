"""Log lines of one kind are rate-limited: a burst passes, the rest is counted in one line."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import pytest

from anyrtd.logs import RateLimit, setup_logging

T0 = 1_800_000_000.0


def record(
    msg: str = "cannot start %r: %s", *args: object, at: float = T0, level: int = logging.ERROR
) -> logging.LogRecord:
    rec = logging.LogRecord("anyrtd.runner", level, __file__, 1, msg, args or ("x", "y"), None)
    rec.created = at
    return rec


def texts(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records]


def test_a_burst_passes_then_the_rest_is_held_and_counted_when_the_interval_ends() -> None:
    limit = RateLimit(burst=3, interval_s=10.0)
    passed = [r for i in range(10) for r in limit.admit(record(at=T0 + i * 0.01))]
    assert len(passed) == 3
    later = limit.admit(record(at=T0 + 11))
    assert len(later) == 2
    assert later[0].getMessage() == ("suppressed 7 similar lines in 11 s: cannot start %r: %s")
    assert later[0].levelno == logging.ERROR and later[0].name == "anyrtd.runner"
    assert later[1].getMessage() == "cannot start 'x': y"


def test_kinds_are_counted_apart_and_info_lines_are_never_held() -> None:
    limit = RateLimit(burst=1, interval_s=10.0)
    assert len(limit.admit(record("one %s", 1))) == 1
    assert len(limit.admit(record("two %s", 1))) == 1
    assert limit.admit(record("one %s", 2)) == []
    assert len(limit.admit(record("one %s", 3, level=logging.WARNING))) == 1
    infos = [limit.admit(record("fired %s", n, level=logging.INFO)) for n in range(50)]
    assert all(len(x) == 1 for x in infos)


def test_a_kind_that_went_quiet_is_summed_up_when_any_later_line_comes() -> None:
    limit = RateLimit(burst=1, interval_s=10.0)
    for i in range(5):
        limit.admit(record("flood %s", i, at=T0 + i * 0.1))
    out = limit.admit(record("other %s", 1, at=T0 + 20))
    assert texts(out) == ["suppressed 4 similar lines in 20 s: flood %s", "other 1"]
    assert limit.pending(T0 + 30) == []


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
                h.close()
        root.setLevel(level)


def test_the_daemons_handler_writes_a_flood_as_a_burst_and_one_summary(
    root_restored: None,
) -> None:
    stream = io.StringIO()
    setup_logging(env={}, stream=stream)
    log = logging.getLogger("anyrtd.test.flood")
    for n in range(5000):
        log.error("accept failed: %s", n)
    handler = logging.getLogger().handlers[-1]
    handler.close()  # what logging does at exit: the lines still held are summed up
    lines = stream.getvalue().splitlines()
    assert len(lines) == 21
    assert re.search(r"suppressed 4980 similar lines in \d+ s: accept failed: %s$", lines[-1])
