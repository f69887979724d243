"""A command line that helps before things go wrong: `schedule preview`, the warnings of
`triggers create`/`edit`/`apply`, `programs list`, `triggers apply`, `triggers list` in fire
order and `--watch`, and the lateness of runs. Every command is the real `anyrtd` process,
against a real devserver (two devices) and a real `anyrtd serve`."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import sigint_default, wait_until

from anyrtd.client import ServerClient
from anyrtd.places import resolve_places

PY = sys.executable


class Stack:
    """The devserver, the daemon, and `anyrtd ...` as a subprocess pointed at both."""

    def __init__(self, devserver: DevserverProcess, served: ServeProcess) -> None:
        self.devserver = devserver
        self.served = served
        self.env = {
            **os.environ,
            "TZ": "UTC",
            "ANYRTD_CONFIG": str(served.config),
            "ANYRTD_SERVER": devserver.url,
            "ANYRTD_LISTEN": served.listen,
        }

    def run(self, *args: str, code: int | None = 0, stdin: str | None = None) -> Any:
        result = subprocess.run(
            [*anyrtd_command(), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
            input=stdin if stdin is not None else "",
        )
        if code is not None:
            assert result.returncode == code, (
                args,
                result.returncode,
                result.stdout,
                result.stderr,
            )
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json").stdout)

    def record(self, rid: str) -> dict[str, Any] | None:
        async def main() -> dict[str, Any] | None:
            async with ServerClient(self.devserver.url) as client:
                places = await resolve_places(client, "bao")
                records, _ = await client.query(places.triggers, filter={"id": rid})
                return records[0] if records else None

        return asyncio.run(main())

    def adopted(self, rid: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            result = self.run("triggers", "show", rid, "--json", code=None)
            if result.returncode != 0:
                return None
            body: dict[str, Any] = json.loads(result.stdout)["trigger"]
            return body if body["adopted"] and body["state"] != "claiming" else None

        return wait_until(check, timeout=20, what=f"{rid} adopted")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("help")
    devserver = DevserverProcess(tmp / "dev.sqlite3", ["--devices", "2"], tmp / "devserver.log")
    served = ServeProcess(
        tmp,
        "",
        config_lines=(
            '[programs."test:echo@v1"]',
            f'argv = ["{PY}", "-c", "print(\'echo\')"]',
        ),
    )
    try:
        devserver.start()
        served.server_url = devserver.url
        served.start()
        yield Stack(devserver, served)
    finally:
        served.stop()
        devserver.stop()


def on_terminal(stack: Stack, args: list[str], answer: str | None) -> tuple[int, str]:
    """Run `anyrtd ARGS` on a pseudo-terminal; answer its question; return (status, output)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*anyrtd_command(), *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=stack.env,
        start_new_session=True,
        preexec_fn=sigint_default,
    )
    os.close(slave)
    seen = b""
    answered = answer is None
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the other side closed: the process is gone
                    break
                if not chunk:
                    break
                seen += chunk
            if not answered and b"write it anyway?" in seen:
                os.write(master, (answer or "").encode() + b"\n")
                answered = True
            if proc.poll() is not None and not ready:
                break
        code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    return code, seen.decode(errors="replace")


# --------------------------------------------------------------------------- schedule preview


def test_preview_gives_the_next_times_of_a_cron_in_its_zone(stack: Stack) -> None:
    shown = stack.json("schedule", "preview", "0 9 * * 1-5", "--tz", "Europe/Paris", "-n", "4")
    assert shown["zone"] == "Europe/Paris"
    assert shown["spec"] == {"cron": "0 9 * * 1-5", "tz": "Europe/Paris"}
    paris = ZoneInfo("Europe/Paris")
    # Weekdays at 09:00 Paris time, counted by hand from now.
    day = datetime.now(paris).replace(hour=9, minute=0, second=0, microsecond=0)
    want: list[float] = []
    while len(want) < 4:
        if day.weekday() < 5 and day.timestamp() > time.time():
            want.append(day.timestamp())
        day = (day + timedelta(days=1)).replace(tzinfo=paris)
    assert shown["fires"] == want

    text = stack.run("schedule", "preview", "0 9 * * 1-5", "--tz", "Europe/Paris", "-n", "4")
    lines = text.stdout.splitlines()
    assert lines[0] == 'cron "0 9 * * 1-5", in Europe/Paris: the next 4 fire times'
    for line, ts in zip(lines[1:], want, strict=True):
        local = datetime.fromtimestamp(ts, paris)
        assert local.strftime("%Y-%m-%d 09:00:00 %Z") in line
        # The machine's own zone (UTC here) is named beside it.
        assert (
            datetime.fromtimestamp(ts, ZoneInfo("UTC")).strftime("= %Y-%m-%d %H:%M:%S UTC here")
            in line
        )


def test_preview_of_a_cron_without_a_zone_says_utc(stack: Stack) -> None:
    shown = stack.run("schedule", "preview", "@daily", "-n", "2")
    assert shown.stdout.splitlines()[0] == 'cron "@daily", in UTC: the next 2 fire times'
    assert shown.stdout.count(" 00:00:00 UTC +00:00") == 2


def test_preview_of_every_and_at(stack: Stack) -> None:
    every = stack.json("schedule", "preview", "--every", "30", "-n", "3")
    fires = every["fires"]
    assert [fires[1] - fires[0], fires[2] - fires[1]] == [30, 30]
    assert every["spec"] == {"every_s": 30}
    as_json = stack.json("schedule", "preview", '{"every_s": 30}', "-n", "2")
    assert as_json["spec"] == {"every_s": 30} and len(as_json["fires"]) == 2

    at = stack.run("schedule", "preview", "--at", "2031-06-01T12:00", "--tz", "Asia/Tokyo")
    assert "once, in Asia/Tokyo: its fire time" in at.stdout
    assert "2031-06-01 12:00:00 JST +09:00" in at.stdout
    assert "2031-06-01 03:00:00 UTC here" in at.stdout

    past = stack.run("schedule", "preview", "--at", "2020-01-01T00:00")
    assert "warning: at 2020-01-01 00:00:00 UTC is in the past" in past.stderr
    assert "the once fires at once" in past.stdout


def test_preview_says_what_a_seconds_first_cron_means(stack: Stack) -> None:
    shown = stack.run("schedule", "preview", "*/15 * * * * *", "-n", "2")
    assert (
        'warning: cron "*/15 * * * * *" has the second as its sixth field, so it fires every '
        "second for 4 minutes of each hour (minutes 0, 15, 30, 45): 240 fires an hour; if you "
        'meant seconds first (Quartz/Spring order), write "* * * * * */15"'
    ) in shown.stderr
    # and the times it prints are that: one second apart
    fires = stack.json("schedule", "preview", "*/15 * * * * *", "-n", "2")["fires"]
    assert fires[1] - fires[0] == 1
    # one second a minute is what a sixth field is for: no warning
    assert stack.run("schedule", "preview", "0 8 * * * 30").stderr == ""


def test_preview_refuses_bad_input_in_one_line(stack: Stack) -> None:
    bad = stack.run("schedule", "preview", "61 * * * *", code=1)
    assert bad.stderr == 'Error: cron "61 * * * *": minute 61 is out of range 0-59\n'
    zone = stack.run("schedule", "preview", "0 8 * * *", "--tz", "Mars/Olympus", code=1)
    assert "not a known IANA zone name" in zone.stderr
    both = stack.run("schedule", "preview", "0 8 * * *", "--every", "5", code=2)
    assert "give one schedule" in both.stderr


# --------------------------------------------------------------------------- warnings


def test_an_at_in_the_past_needs_a_yes(stack: Stack) -> None:
    args = ["triggers", "create", "--id", "h-past", "--at", "2020-01-01T00:00"]
    args += ["--program", "test:echo@v1"]
    refused = stack.run(*args, code=1)
    assert "warning: at 2020-01-01 00:00:00 UTC is in the past" in refused.stderr
    assert "nothing was written: there is no terminal to ask on, so give --yes" in refused.stderr
    assert stack.record("h-past") is None
    stack.run(*args, "--yes")
    assert stack.record("h-past") is not None
    # An edit that does not touch the schedule is not asked about it again.
    stack.run("triggers", "edit", "h-past", "--name", "still past")
    again = stack.run("triggers", "edit", "h-past", "--at", "2021-01-01T00:00", code=1)
    assert "is in the past" in again.stderr


def test_a_seconds_first_cron_needs_a_yes(stack: Stack) -> None:
    args = ["triggers", "create", "--id", "h-secs", "--cron", "*/15 * * * * *"]
    args += ["--program", "test:echo@v1", "--disabled"]
    refused = stack.run(*args, code=1)
    assert "every second for 4 minutes of each hour" in refused.stderr
    assert stack.record("h-secs") is None
    stack.run(*args, "-y")
    assert stack.record("h-secs") is not None


def test_a_program_this_device_lacks_needs_a_yes_where_it_runs_here(stack: Stack) -> None:
    here = ["--every", "3600", "--owner", "here", "--disabled"]
    missing = stack.run(
        "triggers", "create", "--id", "h-nope", *here, "--program", "no:such@v1", code=1
    )
    assert (
        "warning: program no:such@v1 is not installed on this device, which will run it"
        in missing.stderr
    )
    assert "`anyrtd programs list`" in missing.stderr
    assert stack.record("h-nope") is None
    # Declared in this device's config: no question.
    fine = stack.run("triggers", "create", "--id", "h-echo", *here, "--program", "test:echo@v1")
    assert fine.stderr == ""
    # Pinned to the other device: the CLI cannot see its programs, and says so.
    other = stack.devserver.peers[1]
    elsewhere = stack.run(
        "triggers", "create", "--id", "h-other", "--every", "3600", "--owner", other,
        "--program", "no:such@v1", "--disabled",
    )  # fmt: skip
    assert f"note: program no:such@v1 runs on the device {other}" in elsewhere.stderr
    assert "cannot tell whether that device has it" in elsewhere.stderr
    assert stack.record("h-other") is not None
    # Moving it here is a change of the device that runs it: asked again.
    moved = stack.run("triggers", "edit", "h-other", "--owner", "here", code=1)
    assert "is not installed on this device" in moved.stderr


def test_on_a_terminal_the_question_is_asked(stack: Stack) -> None:
    args = ["triggers", "create", "--id", "h-tty", "--at", "2020-01-01T00:00"]
    args += ["--program", "test:echo@v1"]
    code, out = on_terminal(stack, args, "n")
    assert code == 1 and "write it anyway? [y/N]" in out
    assert stack.record("h-tty") is None
    code, out = on_terminal(stack, args, "y")
    assert code == 0, out
    assert "created h-tty" in out
    assert stack.record("h-tty") is not None


def test_a_standing_built_ins_definition_is_refused(stack: Stack) -> None:
    refused = stack.run("triggers", "edit", "rollup", "--cron", "0 9 * * *", "--yes", code=1)
    assert "rollup is a standing built-in" in refused.stderr
    assert "only enabled can change" in refused.stderr


# --------------------------------------------------------------------------- programs list


def test_programs_list_shows_where_each_comes_from(stack: Stack) -> None:
    rows = {r["spec"]: r for r in stack.json("programs", "list")}
    assert rows["agent:remind@v1"]["source"] == "builtin"
    assert rows["agent:remind@v1"]["origin"] == "anyrtd.programs.remind.main"
    assert rows["test:echo@v1"]["source"] == "command"
    assert rows["test:echo@v1"]["origin"] == PY
    assert all(r["problem"] is None for r in rows.values())
    text = stack.run("programs", "list").stdout.splitlines()
    assert text[0].split() == ["PROGRAM", "SOURCE", "RUNS", "HERE", "FROM"]
    echo = next(line for line in text if line.startswith("test:echo@v1"))
    assert f"command   yes        {PY} (config {stack.served.config})" in echo


def test_programs_list_shows_an_entry_point_with_its_distribution(
    stack: Stack, tmp_path: Path
) -> None:
    # A real distribution on sys.path: its metadata declares two programs, one broken.
    site = tmp_path / "site"
    (site / "helpfulpkg").mkdir(parents=True)
    (site / "helpfulpkg" / "__init__.py").write_text("async def main(args, ctx):\n    return {}\n")
    meta = site / "helpfulpkg-1.2.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: helpfulpkg\nVersion: 1.2\n")
    (meta / "entry_points.txt").write_text(
        "[anyrtd.programs]\nhelp:ok@v1 = helpfulpkg:main\nhelp:broken@v1 = helpfulpkg:nothing\n"
    )
    env = {**stack.env, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [*anyrtd_command(), "programs", "list", "--json"],
        capture_output=True, text=True, timeout=60, env=env, check=True,
    ).stdout  # fmt: skip
    rows = {r["spec"]: r for r in json.loads(out)}
    assert rows["help:ok@v1"] == {
        "spec": "help:ok@v1",
        "source": "entry_point",
        "origin": "helpfulpkg:main",
        "distribution": "helpfulpkg 1.2",
        "problem": None,
    }
    broken = rows["help:broken@v1"]
    assert broken["problem"].startswith("its entry point helpfulpkg:nothing")
    assert "failed to load" in broken["problem"]


# --------------------------------------------------------------------------- apply


def test_apply_creates_updates_and_is_idempotent(stack: Stack, tmp_path: Path) -> None:
    records = [
        {
            "id": "h-apply-1",
            "name": "first",
            "kind": "cron",
            "spec": {"cron": "0 8 * * *"},
            "program": "test:echo@v1",
            "args": {"chat": "${GENERAL_CHAT}"},
            "owner": "",
        },
        {
            "id": "h-apply-2",
            "kind": "cron",
            "spec": {"every_s": 3600},
            "program": "test:echo@v1",
            "owner": "",
            "enabled": False,
        },
    ]
    file = tmp_path / "triggers.json"
    file.write_text(json.dumps(records))
    first = stack.run("triggers", "apply", "-f", str(file))
    assert "create h-apply-1" in first.stdout and "create h-apply-2" in first.stdout
    assert '  + spec: {"cron": "0 8 * * *"}' in first.stdout
    assert first.stdout.rstrip().endswith(
        "applied: 2 created, 0 updated, 0 unchanged; the owning devices pick it up within one tick"
    )
    made = stack.record("h-apply-1")
    assert made is not None and made["name"] == "first"
    assert made["args"]["chat"] not in ("", "${GENERAL_CHAT}")
    stack.adopted("h-apply-1")  # the daemon claims it: the file's owner "" does not undo that

    again = stack.run("triggers", "apply", "-f", str(file))
    assert again.stdout.splitlines() == [
        "unchanged h-apply-1",
        "unchanged h-apply-2",
        "nothing to change: 2 unchanged",
    ]

    records[0]["spec"] = {"cron": "30 8 * * *", "tz": "Europe/Paris"}
    records[0]["maxConsecutiveFailures"] = 5
    file.write_text(json.dumps(records))
    dry = stack.json("triggers", "apply", "-f", str(file), "--dry-run")
    assert dry == {
        "dryRun": True,
        "records": [
            {
                "id": "h-apply-1",
                "action": "update",
                "changes": [
                    {"field": "maxConsecutiveFailures", "from": None, "to": 5},
                    {
                        "field": "spec",
                        "from": {"cron": "0 8 * * *"},
                        "to": {"cron": "30 8 * * *", "tz": "Europe/Paris"},
                    },
                ],
                "unset": [],
            },
            {"id": "h-apply-2", "action": "unchanged", "changes": [], "unset": []},
        ],
    }
    assert stack.record("h-apply-1")["spec"] == {"cron": "0 8 * * *"}  # type: ignore[index]
    text = stack.run("triggers", "apply", "-f", str(file), "--dry-run").stdout
    assert '  ~ spec: {"cron": "0 8 * * *"} -> {"cron": "30 8 * * *", "tz": "Europe/Paris"}' in text
    assert "  + maxConsecutiveFailures: 5" in text
    assert "dry run: 0 to create, 1 to update, 1 unchanged; nothing was written" in text

    stack.run("triggers", "apply", "-f", str(file))
    changed = stack.record("h-apply-1")
    assert changed is not None
    assert changed["spec"] == {"cron": "30 8 * * *", "tz": "Europe/Paris"}
    assert changed["owner"] == stack.devserver.peers[0]  # the claim stayed
    assert stack.run("triggers", "apply", "-f", str(file)).stdout.endswith("2 unchanged\n")


def test_apply_changes_nothing_when_one_record_is_bad(stack: Stack, tmp_path: Path) -> None:
    good = {
        "id": "h-apply-good",
        "kind": "cron",
        "spec": {"every_s": 60},
        "program": "test:echo@v1",
    }
    bad = {"id": "h-apply-bad", "kind": "cron", "spec": {"cron": "61 * * * *"}, "program": "x"}
    file = tmp_path / "mixed.json"
    file.write_text(json.dumps([good, bad]))
    refused = stack.run("triggers", "apply", "-f", str(file), code=1)
    assert (
        refused.stderr
        == 'Error: trigger h-apply-bad: cron "61 * * * *": minute 61 is out of range 0-59\n'
    )
    assert stack.record("h-apply-good") is None

    standing = tmp_path / "standing.json"
    standing.write_text(
        json.dumps(
            {
                "id": "rollup",
                "kind": "cron",
                "spec": {"cron": "* * * * *"},
                "program": "agent:rollup@v1",
            }
        )
    )
    refused = stack.run("triggers", "apply", "-f", str(standing), code=1)
    assert "rollup is a standing built-in" in refused.stderr

    rollup = tmp_path / "rollup.json"
    rollup.write_text(
        json.dumps(
            {"id": "h-x", "kind": "cron", "spec": {"every_s": 5}, "program": "p", "lastRunAt": 5}
        )
    )
    refused = stack.run("triggers", "apply", "-f", str(rollup), code=2)
    assert "lastRunAt is written by the owning device" in refused.stderr

    no_id = tmp_path / "noid.json"
    no_id.write_text(json.dumps([good, {"kind": "cron"}]))
    refused = stack.run("triggers", "apply", "-f", str(no_id), code=2)
    assert 'record 2 has no "id"' in refused.stderr


def test_apply_warns_like_create(stack: Stack, tmp_path: Path) -> None:
    file = tmp_path / "past.json"
    file.write_text(
        json.dumps(
            {
                "id": "h-apply-past",
                "kind": "once",
                "spec": {"at": 1577836800},
                "program": "test:echo@v1",
            }
        )
    )
    refused = stack.run("triggers", "apply", "-f", str(file), code=1)
    assert "warning: h-apply-past: at 2020-01-01 00:00:00 UTC is in the past" in refused.stderr
    assert stack.record("h-apply-past") is None
    dry = stack.run("triggers", "apply", "-f", str(file), "--dry-run")  # said, not asked
    assert "is in the past" in dry.stderr and "nothing was written" in dry.stdout
    stack.run("triggers", "apply", "-f", str(file), "--yes")
    assert stack.record("h-apply-past") is not None


# --------------------------------------------------------------------------- list and runs


def test_list_sorts_by_next_fire_and_by_id(stack: Stack) -> None:
    now = time.time()
    for rid, offset in (("h-sort-a", 7200), ("h-sort-b", 600), ("h-sort-c", 3600)):
        stack.run(
            "triggers", "create", "--id", rid, "--at", str(int(now + offset)),
            "--program", "test:echo@v1", "--owner", "here",
        )  # fmt: skip
    for rid in ("h-sort-a", "h-sort-b", "h-sort-c"):
        stack.adopted(rid)

    def order(*extra: str) -> list[str]:
        lines = stack.run("triggers", "list", *extra).stdout.splitlines()[1:]
        return [line.split()[0] for line in lines if line.startswith("h-sort-")]

    assert order() == ["h-sort-b", "h-sort-c", "h-sort-a"]
    assert order("--sort", "id") == ["h-sort-a", "h-sort-b", "h-sort-c"]
    listing = stack.run("triggers", "list").stdout
    row = next(line for line in listing.splitlines() if line.startswith("h-sort-b"))
    assert " UTC (in " in row  # the next fire carries its zone
    assert "at " in row and " UTC" in row.split("at ", 1)[1]  # and so does the schedule


def test_watch_prints_successive_tables_until_ctrl_c(stack: Stack) -> None:
    proc = subprocess.Popen(
        [*anyrtd_command(), "triggers", "list", "--watch", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stack.env,
        start_new_session=True,
        preexec_fn=sigint_default,
    )
    assert proc.stdout is not None
    heads = 0
    try:
        deadline = time.monotonic() + 30
        while heads < 3 and time.monotonic() < deadline:
            if not select.select([proc.stdout], [], [], 0.2)[0]:
                continue  # nothing yet: look at the deadline again
            line = proc.stdout.readline()
            if line.startswith("every 0.2s, Ctrl-C stops; "):
                assert line.rstrip().endswith(" UTC")
                heads += 1
        assert heads == 3
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert "\x1b[" not in out and err == ""


def test_watch_redraws_in_place_on_a_terminal(stack: Stack) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*anyrtd_command(), "triggers", "list", "--watch", "--interval", "0.2"],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=stack.env,
        start_new_session=True,
        preexec_fn=sigint_default,
    )
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while seen.count(b"\x1b[H\x1b[2J") < 2 and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                seen += os.read(master, 4096)
        assert seen.count(b"\x1b[H\x1b[2J") >= 2, seen[-500:]
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)


def test_runs_list_shows_how_late_each_run_started(stack: Stack) -> None:
    stack.run(
        "triggers",
        "create",
        "--id",
        "h-late",
        "--every",
        "1",
        "--program",
        "test:echo@v1",
        "--owner",
        "here",
    )
    stack.adopted("h-late")

    def both() -> list[dict[str, Any]] | None:
        runs = stack.json("runs", "list", "--trigger", "h-late")
        ended = [r for r in runs if r["status"] != "running"]
        return ended if any(r["scheduledAt"] for r in ended) else None

    wait_until(both, timeout=30, what="a scheduled run of h-late")
    stack.run("triggers", "disable", "h-late")
    manual = stack.json("triggers", "run", "h-late", "--wait")
    runs = stack.json("runs", "list", "--trigger", "h-late")
    scheduled = next(r for r in runs if r["scheduledAt"])
    lines = stack.run("runs", "list", "--trigger", "h-late").stdout.splitlines()
    header = lines[0]
    assert header.split() == ["RUN", "TRIGGER", "STARTED", "LATE", "STATUS", "DURATION", "NOTE"]
    late_at, status_at = header.index("LATE"), header.index("STATUS")

    def late(run_id: str) -> str:
        row = next(line for line in lines if line.startswith(run_id + " "))
        return row[late_at:status_at].strip()

    assert late(manual["runId"]) == ""
    want = (scheduled["startedAt"] - scheduled["scheduledAt"]) * 1000
    shown = late(scheduled["runId"])
    assert shown == (f"{int(want)}ms" if want < 1000 else f"{want / 1000:.1f}s")
    detail = stack.run("runs", "show", scheduled["runId"]).stdout
    assert "late:" in detail and shown in detail
    assert " UTC (" in detail  # started, ended: each carries its zone
