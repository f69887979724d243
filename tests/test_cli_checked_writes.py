"""Writes checked when they are made, through the real `anyrtd` command: a built-in's required
args, an event on a chat that does not exist, `edit --unset` of a field the record does not
have, and `triggers why` of an id nobody knows (a non-zero exit)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess

from anyrtd.client import ServerClient
from anyrtd.places import resolve_places

pytestmark = pytest.mark.process


def record(url: str, rid: str) -> Any:
    """Return the trigger record `rid` as the server holds it, or None."""

    async def main() -> Any:
        async with ServerClient(url) as client:
            places = await resolve_places(client, "bao")
            records, _ = await client.query(places.triggers, filter={"id": rid})
            return records[0] if records else None

    return asyncio.run(main())


def cli(tmp_path: Path, url: str, *args: str, listen: str = "") -> subprocess.CompletedProcess[str]:
    config = tmp_path / "empty.toml"
    config.write_text("")
    env = {
        **os.environ,
        "ANYRTD_CONFIG": str(config),
        "ANYRTD_SERVER": url,
        "ANYRTD_STATE_DIR": str(tmp_path / "state"),
        "ANYRTD_LISTEN": listen or f"unix:{tmp_path / 'none.sock'}",
    }
    return subprocess.run(
        [*anyrtd_command(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


EVERY = ("--every", "3600", "--yes")


def test_a_remind_without_its_text_is_refused_when_written(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    url = devserver.url
    for args in (
        (),
        ("--arg", "text="),
        ("--arg", "text=5"),
        ("--arg", "text=hi", "--arg", "chatId=3"),
    ):
        result = cli(
            tmp_path, url, "triggers", "create", "--id", "no-text", "--program",
            "agent:remind@v1", *args, *EVERY,
        )  # fmt: skip
        assert result.returncode == 1, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: trigger no-text: agent:remind@v1 ")
        assert lines[0].endswith("so every run would fail"), lines
    assert record(url, "no-text") is None
    made = cli(
        tmp_path, url, "triggers", "create", "--id", "has-text", "--program", "agent:remind@v1",
        "--arg", "text=standup", *EVERY,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    emptied = cli(tmp_path, url, "triggers", "edit", "has-text", "--set", "args={}", "--yes")
    assert emptied.returncode == 1
    assert "agent:remind@v1 needs args.text" in emptied.stderr
    assert record(url, "has-text")["args"] == {"text": "standup"}
    bad_hours = cli(
        tmp_path, url, "triggers", "create", "--id", "digest", "--program", "agent:rollup@v1",
        "--arg", "hours=0", *EVERY,
    )  # fmt: skip
    assert bad_hours.returncode == 1 and "args.hours" in bad_hours.stderr


def test_an_event_on_a_chat_that_does_not_exist_gets_a_warning(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    url = devserver.url
    base = ("triggers", "create", "--program", "agent:remind@v1", "--arg", "text=hi")
    asked = cli(tmp_path, url, *base, "--id", "ev-missing", "--event-chat", "no-such-chat")
    assert asked.returncode == 1, asked.stderr
    assert "warning: chat no-such-chat does not exist in space bao" in asked.stderr
    assert "the trigger would never fire" in asked.stderr
    assert "nothing was written" in asked.stderr
    assert record(url, "ev-missing") is None
    forced = cli(
        tmp_path, url, *base, "--id", "ev-missing", "--event-chat", "no-such-chat", "--yes"
    )
    assert forced.returncode == 0, forced.stderr
    assert "warning: chat no-such-chat does not exist" in forced.stderr
    assert record(url, "ev-missing")["spec"]["objectId"] == "no-such-chat"
    general = cli(tmp_path, url, *base, "--id", "ev-general", "--event-chat", "${GENERAL_CHAT}")
    assert general.returncode == 0, general.stderr
    assert "warning" not in general.stderr


def test_unset_of_a_field_the_record_does_not_have_is_an_error(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    url = devserver.url
    made = cli(
        tmp_path, url, "triggers", "create", "--id", "unset-me", "--name", "Unset me",
        "--program", "agent:remind@v1", "--arg", "text=hi", *EVERY,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    before = record(url, "unset-me")
    result = cli(tmp_path, url, "triggers", "edit", "unset-me", "--unset", "nmae")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: trigger unset-me has no field nmae to unset")
    assert "name" in lines[0]
    assert record(url, "unset-me") == before
    fixed = cli(tmp_path, url, "triggers", "edit", "unset-me", "--unset", "name")
    assert fixed.returncode == 0, fixed.stderr
    assert "name" not in record(url, "unset-me")


@pytest.fixture
def served(devserver: DevserverProcess, tmp_path: Path) -> Iterator[ServeProcess]:
    proc = ServeProcess(tmp_path, devserver.url)
    try:
        yield proc.start()
    finally:
        proc.stop()


def test_why_of_an_unknown_id_exits_non_zero(
    served: ServeProcess, devserver: DevserverProcess, tmp_path: Path
) -> None:
    url = devserver.url
    unknown = cli(tmp_path, url, "triggers", "why", "never-made", listen=served.listen)
    assert unknown.returncode == 1, (unknown.stdout, unknown.stderr)
    assert "no trigger 'never-made' among this daemon's records" in unknown.stdout
    as_json = cli(tmp_path, url, "triggers", "why", "never-made", "--json", listen=served.listen)
    assert as_json.returncode == 1 and '"unknown"' in as_json.stdout
    known = cli(tmp_path, url, "triggers", "why", "rollup", listen=served.listen)
    assert known.returncode == 0, (known.stdout, known.stderr)
