"""Log lines: priority prefixes under journald, timestamps elsewhere, trigger and run ids."""

from __future__ import annotations

import io
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from anyrtd import logs
from anyrtd.logs import setup_logging, syslog_priority

SWITCHES = ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing")
PLAIN_HEAD = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Put the root logger and the quietened libraries back as they were."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    chatty = {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    switches = {name: getattr(logging, name) for name in SWITCHES}
    try:
        yield
    finally:
        for name, value in switches.items():
            setattr(logging, name, value)  # pytest's reports print the caller's file and line
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
                h.close()
        root.setLevel(level)
        for name, lvl in chatty.items():
            logging.getLogger(name).setLevel(lvl)


def journal_env(path: Path) -> dict[str, str]:
    st = os.stat(path)
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_under_journald_every_line_carries_its_priority(tmp_path: Path) -> None:
    out = tmp_path / "stderr"
    with out.open("w") as stream:
        setup_logging("DEBUG", env=journal_env(out), stream=stream)
        log = logging.getLogger("anyrtd.test")
        log.debug("looked")
        log.info("fired", extra={"trigger": "t1", "run": "r1"})
        log.warning("server slow")
        log.error("write failed")
        log.critical("giving up")
    assert lines_of(out) == [
        "<7>anyrtd.test: looked",
        "<6>anyrtd.test: fired trigger=t1 run=r1",
        "<4>anyrtd.test: server slow",
        "<3>anyrtd.test: write failed",
        "<2>anyrtd.test: giving up",
    ]


def test_under_journald_a_traceback_carries_the_error_priority_on_every_line(
    tmp_path: Path,
) -> None:
    out = tmp_path / "stderr"
    with out.open("w") as stream:
        setup_logging(env=journal_env(out), stream=stream)
        log = logging.getLogger("anyrtd.test")
        try:
            raise RuntimeError("database is locked\nsecond line of the message")
        except RuntimeError:
            log.exception("tick failed", extra={"trigger": "t9"})
    lines = lines_of(out)
    assert lines[0] == "<3>anyrtd.test: tick failed trigger=t9"
    assert lines[1] == "<3>Traceback (most recent call last):"
    assert "<3>RuntimeError: database is locked" in lines
    assert lines[-1] == "<3>second line of the message"
    assert len(lines) > 4
    assert all(line.startswith("<3>") for line in lines)


def test_a_stderr_that_is_not_the_journal_stream_gets_the_plain_format(tmp_path: Path) -> None:
    # systemd passes JOURNAL_STREAM to children; one whose stderr went elsewhere must not prefix.
    other = tmp_path / "journal-elsewhere"
    other.write_text("")
    out = tmp_path / "stderr"
    with out.open("w") as stream:
        setup_logging(env=journal_env(other), stream=stream)
        logging.getLogger("anyrtd.test").info("fired")
    (line,) = lines_of(out)
    assert re.fullmatch(PLAIN_HEAD + r" INFO anyrtd\.test: fired", line), line


def test_a_stream_without_a_descriptor_takes_journal_stream_at_its_word() -> None:
    stream = io.StringIO()
    setup_logging(env={"JOURNAL_STREAM": "8:12345"}, stream=stream)
    logging.getLogger("anyrtd.test").warning("slow")
    assert stream.getvalue() == "<4>anyrtd.test: slow\n"


def test_elsewhere_lines_are_timestamped_with_level_and_ids() -> None:
    stream = io.StringIO()
    setup_logging(env={}, stream=stream)
    log = logging.getLogger("anyrtd.daemon")
    log.info("fired", extra={"trigger": "morning", "run": "run-1"})
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        log.exception("program raised", extra={"trigger": "morning", "run": "run-1"})
    lines = stream.getvalue().splitlines()
    assert re.fullmatch(
        PLAIN_HEAD + r" INFO anyrtd\.daemon: fired trigger=morning run=run-1", lines[0]
    )
    assert re.fullmatch(
        PLAIN_HEAD + r" ERROR anyrtd\.daemon: program raised trigger=morning run=run-1", lines[1]
    )
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "ZeroDivisionError: division by zero"


def test_trigger_and_run_extras_follow_the_message_quoted_when_needed() -> None:
    stream = io.StringIO()
    setup_logging(env={"JOURNAL_STREAM": "1:1"}, stream=stream)
    log = logging.getLogger("anyrtd.runner")
    log.info("armed", extra={"trigger": "t1"})
    log.info("started", extra={"trigger": "t1", "run": "r7", "program": "agent:remind@v1"})
    log.info("odd ids", extra={"trigger": "has space", "run": 'a"b'})
    assert stream.getvalue().splitlines() == [
        "<6>anyrtd.runner: armed trigger=t1",
        "<6>anyrtd.runner: started trigger=t1 run=r7 program=agent:remind@v1",
        '<6>anyrtd.runner: odd ids trigger="has space" run="a\\"b"',
    ]


def test_the_level_filters_and_http_request_lines_stay_quiet_at_info() -> None:
    stream = io.StringIO()
    setup_logging("info", env={}, stream=stream)
    logging.getLogger("anyrtd.test").debug("hidden")
    logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1:7001/v1/devices")
    logging.getLogger("httpx").warning("shown")
    assert [line.split(" ", 1)[1] for line in stream.getvalue().splitlines()] == [
        "WARNING httpx: shown"
    ]
    setup_logging("DEBUG", env={}, stream=stream)
    logging.getLogger("httpx").info("HTTP Request: now shown")
    assert "HTTP Request: now shown" in stream.getvalue()


def test_records_no_longer_carry_the_fields_no_line_prints() -> None:
    """The caller's file and line (a walk of the stack), the thread and the process."""
    setup_logging(env={}, stream=io.StringIO())
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logging.getLogger().addHandler(Keep())
    logging.getLogger("anyrtd.firing").info("firing t1")
    [record] = seen
    assert (record.pathname, record.lineno) == ("(unknown file)", 0)
    assert (record.thread, record.process, record.processName) == (None, None, None)


def test_setting_up_twice_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    setup_logging(env={}, stream=first)
    setup_logging(env={}, stream=second)
    logging.getLogger("anyrtd.test").info("once")
    assert first.getvalue() == ""
    assert second.getvalue().count("once") == 1


def test_an_unknown_level_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="log level 'loud': expected one of DEBUG, INFO"):
        setup_logging("loud", env={}, stream=io.StringIO())


def test_syslog_priorities() -> None:
    assert [syslog_priority(n) for n in (5, 10, 20, 25, 30, 40, 50)] == [7, 7, 6, 6, 4, 3, 2]


def test_a_context_value_is_quoted_for_exactly_whitespace_equals_and_quote() -> None:
    # The quoting test is a regex for speed; it must pick the same characters as
    # str.isspace() plus '=' and '"', over every code point.
    differ = [
        c
        for c in map(chr, range(sys.maxunicode + 1))
        if (c.isspace() or c in '="') != bool(logs._NEEDS_QUOTES.search(c))
    ]
    assert differ == []
