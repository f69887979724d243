"""The client commands through click's CliRunner, against a running devserver and `anyrtd serve`."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import DevserverProcess
from control_support import ServeProcess
from support import wait_until

from anyrtd.cli import main
from anyrtd.client import ServerClient
from anyrtd.places import resolve_places

PY = sys.executable
CONTRIB = Path(__file__).resolve().parent.parent / "contrib" / "triggers"


class Cli:
    """Run `anyrtd ...` in-process with the environment that points at the test's stack."""

    def __init__(self, env: dict[str, str], server_url: str) -> None:
        self.env = env
        self.server_url = server_url

    def __call__(self, *args: str, code: int = 0, **env: str) -> Result:
        result = CliRunner().invoke(
            main, list(args), env={**self.env, **env}, catch_exceptions=False
        )
        assert result.exit_code == code, (args, result.exit_code, result.output)
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json").stdout)

    def record(self, rid: str, deleted: bool = False) -> dict[str, Any] | None:
        async def main() -> dict[str, Any] | None:
            async with ServerClient(self.server_url) as client:
                places = await resolve_places(client, "bao")
                records, _ = await client.query(
                    places.triggers, filter={"id": rid}, include_deleted=deleted
                )
                return records[0] if records else None

        return asyncio.run(main())

    def adopted(self, rid: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            result = CliRunner().invoke(main, ["triggers", "show", rid, "--json"], env=self.env)
            if result.exit_code != 0:
                return None
            body: dict[str, Any] = json.loads(result.stdout)["trigger"]
            return body if body["adopted"] and body["state"] != "claiming" else None

        return wait_until(check, timeout=20, what=f"{rid} adopted")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cli, ServeProcess]]:
    tmp = tmp_path_factory.mktemp("cli")
    devserver = DevserverProcess(tmp / "dev.sqlite3", ["--devices", "2"], tmp / "devserver.log")
    devserver.start()
    served = ServeProcess(
        tmp,
        devserver.url,
        config_lines=(
            '[programs."test:echo@v1"]',
            f'argv = ["{PY}", "-c", "print(\'hello from the cli run\')"]',
            '[programs."test:fail@v1"]',
            f'argv = ["{PY}", "-c", "raise SystemExit(4)"]',
        ),
    )
    try:
        served.start()
        env = {
            # The daemon's own config: the CLI checks programs against this device's table.
            "ANYRTD_CONFIG": str(served.config),
            "ANYRTD_SERVER": devserver.url,
            "ANYRTD_LISTEN": served.listen,
            "ANYRTD_STATE_DIR": str(served.state),
        }
        cli = Cli(env, devserver.url)
        cli.peers = devserver.peers  # type: ignore[attr-defined]
        yield cli, served
    finally:
        served.stop()
        devserver.stop()


@pytest.fixture
def cli(stack: tuple[Cli, ServeProcess]) -> Cli:
    return stack[0]


def test_create_from_flags_then_list_and_show(cli: Cli) -> None:
    out = cli(
        "triggers",
        "create",
        "--id",
        "cli-cron",
        "--cron",
        "0 8 * * *",
        "--tz",
        "Europe/Paris",
        "--program",
        "test:echo@v1",
        "--arg",
        "text=hi",
        "--arg",
        "n=3",
    )
    assert "created cli-cron (cron, 0 8 * * * (Europe/Paris))" in out.stdout
    record = cli.record("cli-cron")
    assert record is not None
    assert record["spec"] == {"cron": "0 8 * * *", "tz": "Europe/Paris"}
    assert record["args"] == {"text": "hi", "n": 3}
    assert record["owner"] in ("", cli.peers[0])  # type: ignore[attr-defined]  # claimed yet?
    cli.adopted("cli-cron")

    listed = cli.json("triggers", "list")
    mine = next(t for t in listed if t["id"] == "cli-cron")
    assert mine["kind"] == "cron" and mine["enabled"] is True
    table = cli("triggers", "list").stdout
    header = table.splitlines()[0].split()
    assert header[:4] == ["ID", "KIND", "SCHEDULE", "OWNER"]
    assert "cli-cron" in table and "(here)" in table

    shown = cli.json("triggers", "show", "cli-cron")
    assert set(shown) == {"trigger", "runs"}
    assert len(shown["trigger"]["nextFires"]) == 5
    text = cli("triggers", "show", "cli-cron").stdout
    assert "next fires:" in text and "Europe/Paris" in text


def test_create_once_and_event_from_the_contrib_files(cli: Cli) -> None:
    cli(
        "triggers",
        "create",
        "--file",
        str(CONTRIB / "remind-standup.json"),
        "--id",
        "cli-once",
        "--at",
        "+2h",
    )
    record = cli.record("cli-once")
    assert record is not None and record["kind"] == "once"
    assert record["program"] == "agent:remind@v1"

    cli("triggers", "create", "--file", str(CONTRIB / "echo-on-message.json"), "--id", "cli-ev")
    record = cli.record("cli-ev")
    assert record is not None and record["kind"] == "event"
    chat = asyncio.run(_general_chat(cli.server_url))
    assert record["spec"]["objectId"] == chat
    assert "${" not in json.dumps(record)


async def _general_chat(url: str) -> str:
    async with ServerClient(url) as client:
        return await client.child("bao", "bao/v1", "bao/chat/general")


def test_every_contrib_record_is_one_the_daemon_accepts(cli: Cli) -> None:
    files = sorted(CONTRIB.glob("*.json"))
    assert len(files) >= 3
    for n, path in enumerate(files):
        result = cli(
            "triggers",
            "create",
            "--file",
            str(path),
            "--id",
            f"contrib-{n}",
            "--disabled",
            "--yes",  # disk-report's program is declared only by the example config
            "--json",
        )
        assert json.loads(result.stdout)["enabled"] is False


def test_create_refuses_bad_input_with_one_line(cli: Cli) -> None:
    result = cli(
        "triggers",
        "create",
        "--id",
        "bad",
        "--cron",
        "61 * * * *",
        "--program",
        "test:echo@v1",
        code=1,
    )
    assert "minute 61 is out of range 0-59" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert cli.record("bad") is None
    result = cli("triggers", "create", "--id", "bad", "--every", "5", code=2)
    assert "--program" in result.stderr
    cli("triggers", "create", "--id", "twice", "--every", "60", "--program", "test:echo@v1")
    result = cli(
        "triggers", "create", "--id", "twice", "--every", "60", "--program", "x:y@v1", code=1
    )
    assert "exists: change it with `anyrtd triggers edit twice`" in result.stderr
    result = cli("triggers", "create", "--id", "no/slash", "--every", "5", "--program", "a", code=1)
    assert "slug" in result.stderr


def test_edit_changes_only_the_given_fields(cli: Cli) -> None:
    cli(
        "triggers",
        "create",
        "--id",
        "cli-edit",
        "--name",
        "Before",
        "--every",
        "600",
        "--program",
        "test:echo@v1",
        "--arg",
        "text=one",
    )
    cli.adopted("cli-edit")  # claimed: the daemon writes the record no more
    cli("triggers", "edit", "cli-edit", "--cron", "*/10 * * * *", "--set", 'limits={"timeoutS": 5}')
    record = cli.record("cli-edit")
    assert record is not None
    assert record["spec"] == {"cron": "*/10 * * * *"}
    assert record["name"] == "Before" and record["args"] == {"text": "one"}
    assert record["limits"] == {"timeoutS": 5}
    version = record["_v"]

    result = cli("triggers", "edit", "cli-edit", "--set", 'spec={"cron": "0 25 * * *"}', code=1)
    assert "hour 25" in result.stderr
    record = cli.record("cli-edit")
    assert record is not None and record["_v"] == version

    cli("triggers", "edit", "cli-edit", "--unset", "limits", "--name", "After")
    record = cli.record("cli-edit")
    assert record is not None and "limits" not in record and record["name"] == "After"
    result = cli("triggers", "edit", "nope-edit", "--name", "x", code=1)
    assert "no trigger nope-edit" in result.stderr


def test_enable_and_disable_go_through_the_daemon(cli: Cli) -> None:
    cli("triggers", "create", "--id", "cli-toggle", "--every", "3600", "--program", "test:echo@v1")
    cli.adopted("cli-toggle")
    body = cli.json("triggers", "disable", "cli-toggle")
    assert body["enabled"] is False
    record = cli.record("cli-toggle")
    assert record is not None and record["enabled"] is False
    out = cli("triggers", "enable", "cli-toggle").stdout
    assert out.startswith("cli-toggle: enabled")
    record = cli.record("cli-toggle")
    assert record is not None and record["enabled"] is True
    result = cli("triggers", "disable", "nope-toggle", code=1)
    assert "no trigger 'nope-toggle'" in result.stderr


def test_disable_and_enable_print_the_state_once(cli: Cli) -> None:
    cli("triggers", "create", "--id", "cli-words", "--every", "3600", "--program", "test:echo@v1")
    cli.adopted("cli-words")
    assert cli("triggers", "disable", "cli-words").stdout == "cli-words: disabled\n"
    out = cli("triggers", "enable", "cli-words").stdout
    assert out.startswith("cli-words: enabled (scheduled), next fire ")


def owner_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("owner:"))


def test_show_prints_the_owner_once(cli: Cli) -> None:
    here, other = cli.peers[0], cli.peers[1]  # type: ignore[attr-defined]
    cli("triggers", "create", "--id", "cli-own", "--every", "3600", "--program", "test:echo@v1")
    cli("triggers", "pin", "cli-own", "here")
    wait_until(
        lambda: cli.json("triggers", "show", "cli-own")["trigger"]["owner"] == here,
        timeout=20,
        what="the pin to reach the daemon",
    )
    line = owner_line(cli("triggers", "show", "cli-own").stdout)
    assert line.split() == ["owner:", here, "(here)"]
    cli("triggers", "pin", "cli-own", other)
    wait_until(
        lambda: cli.json("triggers", "show", "cli-own")["trigger"]["owner"] == other,
        timeout=20,
        what="the repin to reach the daemon",
    )
    line = owner_line(cli("triggers", "show", "cli-own").stdout)
    assert line.split() == ["owner:", other]


def test_pin_and_unpin(cli: Cli) -> None:
    cli("triggers", "create", "--id", "cli-pin", "--every", "3600", "--program", "test:echo@v1")
    other = cli.peers[1]  # type: ignore[attr-defined]
    cli("triggers", "pin", "cli-pin", other)
    record = cli.record("cli-pin")
    assert record is not None and record["owner"] == other
    cli("triggers", "pin", "cli-pin", "here")
    record = cli.record("cli-pin")
    assert record is not None and record["owner"] == cli.peers[0]  # type: ignore[attr-defined]
    result = cli("triggers", "pin", "cli-pin", "12D3KooWnobody", code=1)
    assert "devices list" in result.stderr
    cli("triggers", "pin", "cli-pin", "12D3KooWnobody", "--force")
    record = cli.record("cli-pin")
    assert record is not None and record["owner"] == "12D3KooWnobody"
    cli("triggers", "unpin", "cli-pin")
    record = cli.record("cli-pin")
    # Unassigned: the active device (the daemon here) may have claimed it already.
    assert record is not None and record["owner"] in ("", cli.peers[0])  # type: ignore[attr-defined]


def test_run_wait_prints_the_output_and_runs_show_it(cli: Cli) -> None:
    cli("triggers", "create", "--id", "cli-run", "--cron", "0 0 1 1 *", "--program", "test:echo@v1")
    cli.adopted("cli-run")
    result = cli("triggers", "run", "cli-run", "--wait")
    assert "hello from the cli run" in result.stdout
    assert "status:" in result.stdout and "ok" in result.stdout

    started = cli.json("triggers", "run", "cli-run")
    run_id = started["runId"]

    def ended() -> dict[str, Any] | None:
        run: dict[str, Any] = cli.json("runs", "show", run_id)
        return run if run["status"] != "running" else None

    run = wait_until(ended, timeout=20, what="the run to end")
    assert run["output"].strip() == "hello from the cli run"
    listed = cli.json("runs", "list", "--trigger", "cli-run", "--status", "ok")
    assert len(listed) == 2 and all(r["triggerId"] == "cli-run" for r in listed)
    table = cli("runs", "list", "--trigger", "cli-run").stdout
    assert run_id in table
    text = cli("runs", "show", run_id).stdout
    assert "by hand" in text and "hello from the cli run" in text
    result = cli("runs", "show", "no-such-run", code=1)
    assert "no run 'no-such-run'" in result.stderr


def test_a_failing_run_exits_non_zero_with_wait(cli: Cli) -> None:
    cli(
        "triggers",
        "create",
        "--id",
        "cli-fail",
        "--cron",
        "0 0 1 1 *",
        "--program",
        "test:fail@v1",
        "--max-failures",
        "5",
    )
    cli.adopted("cli-fail")
    result = cli("triggers", "run", "cli-fail", "--wait", code=1)
    assert "FAILED" in result.stdout


def test_election_and_devices(cli: Cli) -> None:
    election = cli.json("election")
    assert {"app", "enabled", "active", "peerId", "winner"} <= set(election)
    assert "verdict:" in cli("election").stdout
    devices = cli.json("devices", "list")
    assert devices["self"] == cli.peers[0]  # type: ignore[attr-defined]
    assert {d["peerId"] for d in devices["devices"]} >= set(cli.peers)  # type: ignore[attr-defined]
    assert "self" in cli("devices", "list").stdout
    out = cli("devices", "activate").stdout
    assert "now holds the newest claim for 'bao'" in out
    assert cli.json("devices", "list")["active"]["bao"] == cli.peers[0]  # type: ignore[attr-defined]


def test_doctor_finds_everything_in_order(cli: Cli) -> None:
    checks = cli.json("doctor")
    by_name = {c["name"]: c for c in checks}
    assert list(by_name) == [
        "server",
        "devices",
        "anchor",
        "triggers",
        "mirror",
        "outbox",
        "control",
        "clock",
    ]
    for name in ("server", "anchor", "mirror", "outbox", "control", "clock"):
        assert by_name[name]["status"] == "ok", by_name[name]
    assert "ok" in cli("doctor").stdout


def test_delete_tombstones_the_id(cli: Cli) -> None:
    cli("triggers", "create", "--id", "cli-del", "--every", "3600", "--program", "test:echo@v1")
    cli.adopted("cli-del")
    result = cli("triggers", "delete", "cli-del", code=1, input="n\n")
    assert cli.record("cli-del") is not None
    result = cli("triggers", "delete", "cli-del", "--yes")
    assert "deleted cli-del" in result.stdout
    assert cli.record("cli-del") is None
    tomb = cli.record("cli-del", deleted=True)
    assert tomb is not None and tomb.get("_deleted") is True
    result = cli(
        "triggers", "create", "--id", "cli-del", "--every", "60", "--program", "a:b@v1", code=1
    )
    assert "create it under a new id" in result.stderr


def test_a_stopped_daemon_gives_one_line_that_says_what_to_do(cli: Cli, tmp_path: Path) -> None:
    dead = f"unix:{tmp_path / 'nobody.sock'}"
    for args in (("triggers", "list"), ("runs", "list"), ("election",), ("triggers", "run", "x")):
        result = cli(*args, code=1, ANYRTD_LISTEN=dead)
        line = result.stderr.strip()
        assert len(line.splitlines()) == 1
        assert f"cannot reach the daemon at {dead}" in line
        assert "is `anyrtd serve` running?" in line
    result = cli("triggers", "list", code=1, ANYRTD_LISTEN="127.0.0.1:9")
    assert "cannot reach the daemon at 127.0.0.1:9" in result.stderr
    result = cli("doctor", code=1, ANYRTD_LISTEN=dead)
    assert "fail" in result.stdout and "start `anyrtd serve`" in result.stdout


def test_a_stopped_server_gives_one_line_too(cli: Cli) -> None:
    result = cli(
        "triggers",
        "create",
        "--id",
        "x",
        "--every",
        "5",
        "--program",
        "a:b@v1",
        code=1,
        ANYRTD_SERVER="http://127.0.0.1:9",
    )
    assert "cannot reach the any server at http://127.0.0.1:9" in result.stderr
    result = cli("devices", "list", code=1, ANYRTD_SERVER="http://127.0.0.1:9")
    assert len(result.stderr.strip().splitlines()) == 1


def test_trigger_ids_complete_from_the_running_daemon(cli: Cli) -> None:
    import os
    import subprocess

    from conftest import anyrtd_command

    cli(
        "triggers", "create", "--id", "cli-complete", "--every", "3600", "--program", "a:b@v1",
        "--yes",
    )  # fmt: skip
    cli.adopted("cli-complete")
    out = subprocess.run(
        anyrtd_command(),
        env={
            **os.environ,
            **cli.env,
            "_ANYRTD_COMPLETE": "bash_complete",
            "COMP_WORDS": "anyrtd triggers show cli-comp",
            "COMP_CWORD": "3",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.splitlines() == ["plain,cli-complete"]


def test_why_says_what_stops_a_trigger_and_the_command_that_fixes_it(cli: Cli) -> None:
    cli("triggers", "create", "--id", "cli-why", "--every", "3600", "--program", "test:echo@v1")
    cli.adopted("cli-why")
    cli("triggers", "disable", "cli-why")
    out = cli("triggers", "why", "cli-why").stdout
    assert out.startswith("cli-why will not fire on this device (")
    assert "1. it is disabled" in out and "fix:  anyrtd triggers enable cli-why" in out
    cli("triggers", "enable", "cli-why")
    out = cli("triggers", "why", "cli-why").stdout
    assert out.startswith("cli-why fires on this device (") and ": next " in out
    assert out.count("then ") == 4
    body = json.loads(cli("triggers", "why", "nope-why", "--json", code=1).stdout)
    assert body["fires"] is False and [r["cause"] for r in body["reasons"]] == ["unknown"]
