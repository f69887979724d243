"""A chain that would trigger itself, directly or through other chains, is refused at the door
with the loop named, and nothing is written: `anyrtd triggers create|edit`, `apply -f`, and
the control API (docs/events.md, "Chains")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DevserverProcess
from test_cli_checked_writes import cli, record
from test_control import Stack, stack

__all__ = ["stack"]  # the control API's fixture, shared

pytestmark = pytest.mark.process

YES = ("--program", "agent:rollup@v1", "--yes")


def test_the_command_line_refuses_a_chain_that_closes_a_loop(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    url = devserver.url
    made = cli(tmp_path, url, "triggers", "create", "--id", "backup", "--every", "3600", *YES)
    assert made.returncode == 0, made.stderr
    report = cli(tmp_path, url, "triggers", "create", "--id", "report", "--after", "backup", *YES)
    assert report.returncode == 0, report.stderr
    assert record(url, "report")["spec"] == {
        "dataset": "agent_runs",
        "filter": {"triggerId": "backup"},
    }
    ping = cli(tmp_path, url, "triggers", "create", "--id", "ping", "--after", "report", *YES)
    assert ping.returncode == 0, ping.stderr
    # report after ping: report → ping → report
    looped = cli(tmp_path, url, "triggers", "edit", "report", "--after", "ping", "--yes")
    assert looped.returncode == 1
    lines = looped.stderr.strip().splitlines()
    assert lines == [
        "Error: trigger report: this chain would trigger itself: report → ping → report; a "
        "chain may not answer its own runs, directly or through other chains"
    ]
    assert record(url, "report")["spec"]["filter"] == {"triggerId": "backup"}
    itself = cli(tmp_path, url, "triggers", "create", "--id", "echo", "--after", "echo", *YES)
    assert itself.returncode == 1 and "echo → echo" in itself.stderr
    assert record(url, "echo") is None
    # a disabled chain cannot loop; enabling it is checked like any write
    off = cli(
        tmp_path, url, "triggers", "create", "--id", "echo", "--after", "echo", "--disabled", *YES
    )
    assert off.returncode == 0, off.stderr
    on = cli(tmp_path, url, "triggers", "edit", "echo", "--set", "enabled=true", "--yes")
    assert on.returncode == 1 and "echo → echo" in on.stderr
    assert record(url, "echo")["enabled"] is False


def test_apply_refuses_chains_that_form_a_loop_among_themselves(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    url = devserver.url

    def chain(rid: str, up: str) -> dict[str, object]:
        spec = {"dataset": "agent_runs", "filter": {"triggerId": up}}
        return {"id": rid, "kind": "event", "spec": spec, "program": "agent:rollup@v1"}

    file = tmp_path / "chains.json"
    file.write_text(json.dumps([chain("a", "c"), chain("b", "a"), chain("c", "b")]))
    refused = cli(tmp_path, url, "triggers", "apply", "-f", str(file), "--yes")
    assert refused.returncode == 1
    assert "c → a → b → c" in refused.stderr, refused.stderr
    assert record(url, "a") is None and record(url, "b") is None and record(url, "c") is None
    file.write_text(json.dumps([chain("a", "x"), chain("b", "a"), chain("c", "b")]))
    fine = cli(tmp_path, url, "triggers", "apply", "-f", str(file), "--yes")
    assert fine.returncode == 0, fine.stderr
    assert record(url, "c")["spec"]["filter"] == {"triggerId": "b"}


async def test_the_control_api_refuses_a_spec_that_closes_a_loop(stack: Stack) -> None:
    def spec(up: str) -> dict[str, object]:
        return {"dataset": "agent_runs", "filter": {"triggerId": up}}

    await stack.create("first", kind="event", spec=spec("second"), program="test:echo@v1")
    await stack.create("second", kind="event", spec=spec("backup"), program="test:echo@v1")
    status, body = await stack.json("PATCH", "/triggers/second", json={"spec": spec("first")})
    assert status == 409, body
    assert body["error"]["code"] == "chain_loop"
    assert "second → first → second" in body["error"]["message"]
    assert (await stack.record("second"))["spec"] == spec("backup")
    status, body = await stack.json("PATCH", "/triggers/second", json={"spec": spec("other")})
    assert status == 200, body
