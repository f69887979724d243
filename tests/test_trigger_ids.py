"""Trigger ids are refused at the door when no record can have them (over 128 characters, a
control character, NUL): a record with one is malformed with a reason, and the control API
and the CLI say so instead of looking it up. A PATCH that names a key twice is refused."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import put_triggers, wait_until

from anyrtd.model import MAX_ID_LENGTH, Malformed, TriggerDef, id_problem, parse_record

RECORD: dict[str, Any] = {"kind": "cron", "spec": {"every_s": 3600}, "program": "agent:remind@v1"}


@pytest.mark.parametrize(
    ("rid", "reason"),
    [
        ("a\x00b", "the control character U+0000 at position 2"),
        ("line\nforged", "the control character U+000A at position 5"),
        ("\x1b]52;c;aGk=\x07", "the control character U+001B at position 1"),
        ("bell\x07", "U+0007"),
        ("del\x7f", "U+007F"),
        ("c1\x9b", "U+009B"),
        ("rtl\u202eevil", "U+202E"),
        ("sep\u2028x", "U+2028"),
        ("x" * (MAX_ID_LENGTH + 1), "the id is 129 characters long, more than the limit of 128"),
        ("x" * 10_000, "the id is 10,000 characters long, more than the limit of 128"),
    ],
)
def test_a_record_whose_id_cannot_be_shown_safely_is_malformed(rid: str, reason: str) -> None:
    parsed = parse_record({"id": rid, **RECORD})
    assert isinstance(parsed, Malformed)
    assert parsed.reason.startswith("record id refused: ")
    assert reason in parsed.reason
    assert id_problem(rid) == parsed.reason.removeprefix("record id refused: ")


@pytest.mark.parametrize("rid", ["remind-standup", "x" * MAX_ID_LENGTH, "café-digest", "a b", "👍"])
def test_printable_ids_up_to_the_limit_are_accepted(rid: str) -> None:
    assert id_problem(rid) is None
    assert isinstance(parse_record({"id": rid, **RECORD}), TriggerDef)


@pytest.fixture
def served(devserver: DevserverProcess, tmp_path: Path) -> Iterator[ServeProcess]:
    proc = ServeProcess(tmp_path, devserver.url)
    try:
        yield proc.start()
    finally:
        proc.stop()


def adopted(served: ServeProcess, rid: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        with served.http() as c:
            resp = c.get(f"/triggers/{quote(rid, safe='')}")
        body: dict[str, Any] = resp.json()
        return body if resp.status_code == 200 and body.get("adopted") else None

    return wait_until(check, timeout=30, what=f"{rid} adopted")


def test_the_control_api_refuses_bad_ids_and_lists_their_records_as_malformed(
    served: ServeProcess, devserver: DevserverProcess
) -> None:
    long_id = "x" * 10_000
    put_triggers(
        devserver.url,
        {
            "good": {**RECORD, "owner": "", "args": {"text": "hi"}},
            "nul\x00id": {**RECORD, "owner": "", "args": {"text": "hi"}},
            long_id: {**RECORD, "owner": "", "args": {"text": "hi"}},
        },
    )
    adopted(served, "good")

    def listed() -> dict[str, Any] | None:
        with served.http() as c:
            items = c.get("/triggers", params={"all": "true"}).json()
        by_id = {t["id"]: t for t in items}
        return by_id if "nul\x00id" in by_id and long_id in by_id else None

    by_id = wait_until(listed, timeout=30, what="the malformed records listed")
    assert "U+0000" in by_id["nul\x00id"]["malformed"]
    assert "more than the limit of 128" in by_id[long_id]["malformed"]
    assert not by_id["nul\x00id"].get("adopted")

    with served.http() as c:
        for path in (
            f"/triggers/{quote(long_id)}",
            f"/triggers/{quote(long_id)}/why",
            f"/triggers/{quote(long_id)}/runs",
        ):
            resp = c.get(path)
            assert resp.status_code == 400, (path[:40], resp.status_code, resp.text[:200])
            message = resp.json()["error"]["message"]
            assert "the id is 10,000 characters long, more than the limit of 128" in message
        resp = c.get("/runs", params={"trigger": "nul\x00id"})
        assert resp.status_code == 400 and "U+0000" in resp.json()["error"]["message"]
        for method, path in (("GET", "/triggers/nul%00id"), ("POST", "/triggers/nul%00id/run")):
            resp = c.request(method, path)
            assert resp.status_code == 400, (path, resp.status_code, resp.text[:200])
            message = resp.json()["error"]["message"]
            assert "U+0000" in message and "argv" not in message


def test_a_patch_that_names_a_key_twice_is_refused_and_writes_nothing(
    served: ServeProcess, devserver: DevserverProcess
) -> None:
    put_triggers(devserver.url, {"twice": {**RECORD, "owner": "", "args": {"text": "hi"}}})
    assert adopted(served, "twice")["enabled"] is True
    with served.http() as c:
        for body, key in (
            ('{"enabled": true, "enabled": false}', "enabled"),
            ('{"spec": {"every_s": 60, "every_s": 120}}', "every_s"),
        ):
            resp = c.patch(
                "/triggers/twice", content=body, headers={"Content-Type": "application/json"}
            )
            assert resp.status_code == 400, resp.text
            message = resp.json()["error"]["message"]
            assert f'names the key "{key}" twice' in message and "nothing was written" in message
        after = c.get("/triggers/twice").json()
    assert after["enabled"] is True
    assert after["spec"] == {"every_s": 3600}


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "empty.toml"
    config.write_text("")
    env = {
        **os.environ,
        "ANYRTD_CONFIG": str(config),
        "ANYRTD_LISTEN": f"unix:{tmp_path / 'none.sock'}",
        "ANYRTD_SERVER": "http://127.0.0.1:9",
    }
    return subprocess.run(
        [*anyrtd_command(), *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.process
@pytest.mark.parametrize(
    ("command", "rid", "reason"),
    [
        (("triggers", "show"), "a\x1b[2Jb", "U+001B at position 2"),
        (("triggers", "why"), "line\nforged", "U+000A at position 5"),
        (("triggers", "edit", "--name", "x"), "rtl\u202e", "U+202E"),
        (("triggers", "disable"), "x" * 200, "the id is 200 characters long"),
    ],
)
def test_the_cli_refuses_a_bad_id_in_one_line_before_any_request(
    tmp_path: Path, command: tuple[str, ...], rid: str, reason: str
) -> None:
    result = run_cli(tmp_path, *command[:2], rid, *command[2:])
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: trigger id refused: "), lines
    assert reason in lines[0]
