"""Bad input that used to be accepted, through the real `anyrtd` command against a devserver:
an empty `--tz`, a breaker threshold past its limit, a program spec that is not one (with
`--yes` too), and click's usage errors, each refused in one line with nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DevserverProcess
from test_cli_checked_writes import cli, record

from anyrtd.model import MAX_CONSECUTIVE_FAILURES, parse_record

pytestmark = pytest.mark.process

BASE = ("--program", "agent:remind@v1", "--arg", "text=hi", "--yes")


def one_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("Error: "), stderr
    return lines[0]


def test_an_empty_tz_is_refused_not_read_as_utc(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    result = cli(
        tmp_path, devserver.url, "triggers", "create", "--id", "no-zone", "--cron", "0 9 * * *",
        "--tz", "", *BASE,
    )  # fmt: skip
    assert result.returncode == 1, result
    assert "tz must be an IANA zone name" in one_error(result.stderr)
    assert record(devserver.url, "no-zone") is None
    # `--tz ''` without --cron is the same mistake as any --tz without it
    alone = cli(tmp_path, devserver.url, "triggers", "create", "--id", "z", "--every", "60",
                "--tz", "", *BASE)  # fmt: skip
    assert alone.returncode == 2 and "--tz goes with --cron" in one_error(alone.stderr)


def test_a_breaker_threshold_past_its_limit_is_refused(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    huge = cli(
        tmp_path, devserver.url, "triggers", "create", "--id", "huge", "--every", "60",
        "--max-failures", "99999999999999999999999", *BASE,
    )  # fmt: skip
    assert huge.returncode == 1, huge
    line = one_error(huge.stderr)
    assert f"maxConsecutiveFailures must be at most {MAX_CONSECUTIVE_FAILURES:,}" in line
    assert record(devserver.url, "huge") is None
    edge = cli(
        tmp_path, devserver.url, "triggers", "create", "--id", "edge", "--every", "60",
        "--max-failures", str(MAX_CONSECUTIVE_FAILURES), *BASE,
    )  # fmt: skip
    assert edge.returncode == 0, edge.stderr
    assert record(devserver.url, "edge")["maxConsecutiveFailures"] == MAX_CONSECUTIVE_FAILURES


def test_the_one_check_bounds_records_as_the_flags() -> None:
    base = {"id": "t", "kind": "cron", "spec": {"every_s": 60}, "program": "agent:remind@v1"}
    assert parse_record({**base, "maxConsecutiveFailures": 1e23}).reason.startswith(  # type: ignore[union-attr]
        f"maxConsecutiveFailures must be at most {MAX_CONSECUTIVE_FAILURES:,}"
    )
    ok = parse_record({**base, "maxConsecutiveFailures": MAX_CONSECUTIVE_FAILURES})
    assert ok.max_consecutive_failures == MAX_CONSECUTIVE_FAILURES  # type: ignore[union-attr]
    assert "is not a program spec" in parse_record({**base, "program": "not a program"}).reason  # type: ignore[union-attr]


@pytest.mark.parametrize("spec", ["not a program", "agent:remind@v1\n", "x" * 201])
def test_a_program_spec_that_is_not_one_is_refused_whatever_yes_says(
    devserver: DevserverProcess, tmp_path: Path, spec: str
) -> None:
    result = cli(
        tmp_path, devserver.url, "triggers", "create", "--id", "c21", "--every", "60",
        "--program", spec, "--yes",
    )  # fmt: skip
    assert result.returncode == 1, result
    line = one_error(result.stderr)
    assert "program" in line and ("not a program spec" in line or "at most 200" in line)
    assert "warning" not in result.stderr
    assert record(devserver.url, "c21") is None


def test_a_program_not_installed_here_still_takes_yes(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    result = cli(
        tmp_path, devserver.url, "triggers", "create", "--id", "backup", "--every", "3600",
        "--program", "mine:backup@v1", "--owner", "somewhere", "--force", "--yes",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert record(devserver.url, "backup")["program"] == "mine:backup@v1"


@pytest.mark.parametrize(
    ("args", "said", "hint"),
    [
        (("triggers", "create", "--bogus"), "No such option '--bogus'", "anyrtd triggers create"),
        (
            ("triggers", "list", "--sort", "zzz"),
            "Invalid value for '--sort'",
            "anyrtd triggers list",
        ),
        (("runs", "show"), "Missing argument 'RUNID'", "anyrtd runs show"),
        (("--nope",), "No such option '--nope'", "anyrtd"),
        (("no-such-command",), "No such command 'no-such-command'", "anyrtd"),
        (
            ("triggers", "create", "--id", "x", "--every", "6", "--at", "+1m", "--program", "a"),
            "give one schedule",
            "anyrtd triggers create",
        ),
    ],
)
def test_a_usage_error_is_one_line_with_its_hint(
    tmp_path: Path, args: tuple[str, ...], said: str, hint: str
) -> None:
    result = cli(tmp_path, "http://127.0.0.1:9", *args)
    assert result.returncode == 2, result
    line = one_error(result.stderr)
    assert said in line, line
    assert line.endswith(f"(try '{hint} --help')"), line
    assert "Usage:" not in result.stderr
