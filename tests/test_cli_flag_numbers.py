"""Numbers from flags go through the spec check the JSON form goes through: `--every` and
`--at` with NaN or infinity get the same one-line error, never a traceback, and write nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import DevserverProcess, anyrtd_command

from anyrtd.client import ServerClient
from anyrtd.places import resolve_places
from anyrtd.schedule import compile_schedule

pytestmark = pytest.mark.process


def run(tmp_path: Path, server: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "empty.toml"
    config.write_text("")
    env = {
        **os.environ,
        "ANYRTD_CONFIG": str(config),
        "ANYRTD_STATE_DIR": str(tmp_path / "state"),
        "ANYRTD_LISTEN": f"unix:{tmp_path / 'no-daemon.sock'}",
    }
    if server is not None:
        env["ANYRTD_SERVER"] = server
    return subprocess.run(
        [*anyrtd_command(), *args], env=env, capture_output=True, text=True, timeout=60
    )


def record(url: str, rid: str) -> Any:
    """Return the trigger record `rid` as the server holds it, or None."""

    async def main() -> Any:
        async with ServerClient(url) as client:
            places = await resolve_places(client, "bao")
            records, _ = await client.query(places.triggers, filter={"id": rid})
            return records[0] if records else None

    return asyncio.run(main())


def one_line_error(result: subprocess.CompletedProcess[str], reason: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [f"Error: {reason}"], result.stderr


BAD_EVERY = [
    ("nan", "every_s must be a number of seconds, not nan"),
    ("inf", "every_s must be a number of seconds, not inf"),
    ("-inf", "every_s must be a number of seconds, not -inf"),
]
BAD_AT = [
    ("nan", 'once spec needs a numeric "at" (unix seconds, like {"at": 1787000000}), not nan'),
    ("1e400", 'once spec needs a numeric "at" (unix seconds, like {"at": 1787000000}), not inf'),
    (
        "1e20",
        'once "at" 1e+20 is outside the years 1 to 9999; give unix seconds, like {"at": '
        "1787000000}",
    ),
]


@pytest.mark.parametrize(("value", "reason"), BAD_EVERY)
def test_schedule_preview_every_refuses_what_the_json_form_refuses(
    tmp_path: Path, value: str, reason: str
) -> None:
    one_line_error(run(tmp_path, None, "schedule", "preview", "--every", value), reason)
    as_json = json.dumps({"every_s": float(value)})  # NaN, Infinity: Python's JSON words
    one_line_error(run(tmp_path, None, "schedule", "preview", as_json), reason)


@pytest.mark.parametrize(("value", "reason"), BAD_AT)
def test_schedule_preview_at_refuses_what_the_json_form_refuses(
    tmp_path: Path, value: str, reason: str
) -> None:
    one_line_error(run(tmp_path, None, "schedule", "preview", "--at", value), reason)
    as_json = json.dumps({"at": float(value)})
    one_line_error(run(tmp_path, None, "schedule", "preview", as_json), reason)


@pytest.mark.parametrize("at", [1e15, -1e12, 253402214400.5])
def test_a_once_no_date_can_show_is_refused_like_a_non_number(at: float) -> None:
    schedule = compile_schedule("once", {"at": at})
    assert schedule.error == (
        f'once "at" {at!r} is outside the years 1 to 9999; give unix seconds, like '
        '{"at": 1787000000}'
    )
    assert compile_schedule("once", {"at": 253402214400}).error is None


def test_create_and_edit_refuse_bad_numbers_and_write_nothing(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    url = devserver.url
    base = ("--program", "agent:remind@v1", "--arg", "text=hi", "--yes")
    for value, reason in BAD_EVERY:
        one_line_error(
            run(tmp_path, url, "triggers", "create", "--id", "bad-every", "--every", value, *base),
            f"trigger bad-every: {reason}",
        )
    for value, reason in BAD_AT:
        one_line_error(
            run(tmp_path, url, "triggers", "create", "--id", "bad-at", "--at", value, *base),
            f"trigger bad-at: {reason}",
        )
    made = run(tmp_path, url, "triggers", "create", "--id", "good", "--every", "60", *base)
    assert made.returncode == 0, made.stderr
    for value, reason in BAD_EVERY:
        one_line_error(
            run(tmp_path, url, "triggers", "edit", "good", "--every", value),
            f"trigger good: {reason}",
        )
    assert record(url, "good")["spec"] == {"every_s": 60}
    assert record(url, "bad-every") is None and record(url, "bad-at") is None


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (("triggers", "list", "--watch", "--interval", "nan"), "'nan' is not a finite number"),
        (("triggers", "list", "--watch", "--interval", "inf"), "inf is not in the range"),
        (("triggers", "run", "x", "--wait", "--timeout", "nan"), "'nan' is not a finite number"),
        (("triggers", "run", "x", "--wait", "--timeout", "inf"), "'inf' is not a finite number"),
        (("devserver", "--port", "0", "--sync-delay", "nan"), "'nan' is not a finite number"),
    ],
)
def test_other_seconds_flags_refuse_nan_and_infinity(
    tmp_path: Path, args: tuple[str, ...], reason: str
) -> None:
    result = run(tmp_path, None, *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert reason in result.stderr.splitlines()[-1], result.stderr
