"""A run's output while it runs and after (issue 38): `GET /runs/:runId/output?from=N` and
`anyrtd runs show --follow`, on a real `anyrtd serve` with a program that waits for the test
to let it finish."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from control_support import ServeProcess
from support import World, wait_until

from anyrtd.cli import main
from anyrtd.runner.capture import Capture
from anyrtd.vocab import RunStatus

pytestmark = pytest.mark.process

PY = sys.executable
# Prints a line, waits for the gate file the test makes, prints another and a line of its
# own with a control character (escaped on the terminal), then ends.
WAITER = (
    "import os, sys, time\n"
    "print('first line', flush=True)\n"
    "gate = sys.argv[1]\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists(gate) and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    "print('second line', flush=True)\n"
    "print('bell \\x07 here', file=sys.stderr, flush=True)\n"
)


def programs(gate: Path) -> tuple[str, ...]:
    return ('[programs."test:waiter@v1"]', f"argv = {json.dumps([PY, '-c', WAITER, str(gate)])}")


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path / "gate"


@pytest.fixture
def served(serve_on: Callable[..., ServeProcess], gate: Path) -> ServeProcess:
    return serve_on(programs(gate))


def start_run(served: ServeProcess, world: World, rid: str) -> str:
    world.put(rid, kind="cron", spec={"every_s": 3600}, program="test:waiter@v1", owner="")
    wait_until(
        lambda: served.trigger(rid)["adopted"] is True, timeout=20, what=f"{rid} to be adopted"
    )
    with served.http() as c:
        resp = c.post(f"/triggers/{rid}/run")
    assert resp.status_code == 202, resp.text
    run_id: str = resp.json()["runId"]
    return run_id


def output(served: ServeProcess, run_id: str, start: int = 0) -> dict[str, Any]:
    with served.http() as c:
        resp = c.get(f"/runs/{run_id}/output", params={"from": start})
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def test_a_running_runs_output_is_read_as_it_grows(
    served: ServeProcess, world: World, gate: Path
) -> None:
    run_id = start_run(served, world, "grows")
    first = wait_until(
        lambda: (a := output(served, run_id))["text"] and a,
        timeout=20,
        what="the running run's first line",
    )
    assert first["running"] is True and first["status"] == RunStatus.RUNNING
    assert first["text"] == "first line\n" and first["from"] == 0
    assert first["next"] == len("first line\n")
    # GET /runs/:runId shows the output so far too (`anyrtd runs show`).
    with served.http() as c:
        assert c.get(f"/runs/{run_id}").json()["output"] == "first line\n"
    # Nothing new yet: the same offset, no text.
    again = output(served, run_id, first["next"])
    assert again["text"] == "" and again["next"] == first["next"] and again["running"]

    gate.touch()
    rest = wait_until(
        lambda: not (a := output(served, run_id, first["next"]))["running"] and a,
        timeout=30,
        what="the run to end",
    )
    assert rest["status"] == RunStatus.OK
    assert rest["text"] == "second line\nbell \x07 here\n"
    with served.http() as c:
        whole = c.get(f"/runs/{run_id}").json()["output"]
    assert whole == first["text"] + rest["text"]
    assert rest["next"] == len(whole)


def test_bad_output_requests_get_one_line_and_change_nothing(
    served: ServeProcess, world: World, gate: Path
) -> None:
    gate.touch()
    run_id = start_run(served, world, "done")
    wait_until(lambda: not output(served, run_id)["running"], timeout=30, what="the run to end")
    with served.http() as c:
        for start in ("-1", "abc", "1e3", "\u0661", "9" * 10, ""):
            resp = c.get(f"/runs/{run_id}/output", params={"from": start})
            assert resp.status_code == 400, (start, resp.text)
            message = resp.json()["error"]["message"]
            assert message.startswith("from must be a character offset") and "\n" not in message
        resp = c.get(f"/runs/{run_id}/output", params={"from": 10_000})
        assert resp.status_code == 400
        assert "past the end of run" in resp.json()["error"]["message"]
        resp = c.get("/runs/nope/output")
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "not_found"


def env_of(served: ServeProcess) -> dict[str, str]:
    return {
        "ANYRTD_CONFIG": str(served.config),
        "ANYRTD_SERVER": served.server_url,
        "ANYRTD_LISTEN": served.listen,
        "ANYRTD_STATE_DIR": str(served.state),
    }


def test_runs_show_follow_prints_the_output_until_the_run_ends(
    served: ServeProcess, world: World, gate: Path, tmp_path: Path
) -> None:
    run_id = start_run(served, world, "followed")
    anyrtd = shutil.which("anyrtd")
    assert anyrtd is not None
    out = tmp_path / "follow.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [anyrtd, "runs", "show", "--follow", run_id],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**env_of(served), "PATH": str(Path(anyrtd).parent)},
        )
    try:
        wait_until(
            lambda: "first line" in out.read_text(), timeout=30, what="the first line followed"
        )
        assert proc.poll() is None, "--follow ended before the run did"
        gate.touch()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    lines = text.splitlines()
    assert lines[:4] == ["output:", "first line", "second line", "bell \\x07 here"], text
    assert f"run:       {run_id}" in lines
    assert "status:    ok" in lines

    # An ended run: the whole output at once, then the outcome.
    result = CliRunner().invoke(main, ["runs", "show", "-f", run_id], env=env_of(served))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[:3] == ["output:", "first line", "second line"]


def test_runs_show_follow_refuses_bad_input_in_one_line(served: ServeProcess) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["runs", "show", "--follow", "nope"], env=env_of(served))
    assert result.exit_code == 1
    assert "no run 'nope' on this device" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    result = runner.invoke(main, ["runs", "show", "--follow", "--json", "x"], env=env_of(served))
    assert result.exit_code == 2
    assert "--follow prints the output as it grows" in result.output


@pytest.mark.parametrize(
    "chunks",
    [
        [b"plain\n", b"more\n"],
        [b"caf\xc3", b"\xa9\n"],  # a sequence cut between two reads waits for its rest
        [b"bad \xff byte\n", b"after\n"],  # replaced, and the end adds the note after it
        [b"x" * 10, b"y" * 10],  # past the cap of 16: the kept prefix only
    ],
)
def test_the_output_so_far_is_a_prefix_of_the_output_at_the_end(chunks: list[bytes]) -> None:
    capture = Capture(16)
    seen = ""
    for chunk in chunks:
        capture.add(chunk)
        now = capture.so_far()
        assert now.startswith(seen)
        seen = now
    assert capture.text().startswith(seen)
