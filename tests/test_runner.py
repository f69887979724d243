"""The runner: every run outcome produced for real, budgets, process groups, output capture."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from support import async_wait_until, run_of

from anyrtd.client import ServerClient, ServerUnavailable
from anyrtd.clock import FakeClock, SystemClock
from anyrtd.config import CommandProgram
from anyrtd.heap import gc_paused
from anyrtd.program import ProgramContext, ProgramFn, RunOutcome
from anyrtd.rows import RunRow
from anyrtd.runner import Runner
from anyrtd.runner.run import Launch

PY = sys.executable


@pytest.fixture
async def client() -> AsyncIterator[ServerClient]:
    c = ServerClient("http://127.0.0.1:9")  # nothing listens there: the server is away
    try:
        yield c
    finally:
        await c.aclose()


MakeRunner = Callable[..., Runner]


@pytest.fixture
def make_runner(client: ServerClient) -> MakeRunner:
    def make(
        *,
        commands: Mapping[str, CommandProgram] | None = None,
        programs: Mapping[str, ProgramFn] | None = None,
        **kw: Any,
    ) -> Runner:
        kw.setdefault("clock", SystemClock())
        return Runner(
            client=client,
            agent_name="bao",
            space="bao-space",
            commands=commands or {},
            extra_builtins=programs,
            **kw,
        )

    return make


def request(
    program: str, args: Mapping[str, Any] | None = None, run_id: str = "run-1"
) -> tuple[RunRow, dict[str, Any]]:
    return run_of(program, args, run_id=run_id, scheduled_at=1_800_000_000.0)


def py(code: str, **kw: Any) -> CommandProgram:
    """Return a command program running `code` with this interpreter."""
    return CommandProgram(argv=(PY, "-c", textwrap.dedent(code)), **kw)


def process_alive(pid: int) -> bool:
    """Return whether `pid` is a live process (a zombie counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def group_members(pgid: int) -> list[int]:
    """Return the live processes of process group `pgid`, read from the process table."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            pids.append(int(name))
    return pids


# A command whose child forks a grandchild that ignores SIGTERM, both in the run's
# process group; each writes its pid to the file named by argv[1] once ready.
FAMILY = r"""
import os, signal, subprocess, sys, time
pidfile = sys.argv[1]
grandchild = subprocess.Popen([sys.executable, "-c", '''
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1], "a") as fh:
    fh.write(f"grandchild {os.getpid()} {os.getpgrp()}\\n")
while True:
    time.sleep(1)
''', pidfile])
with open(pidfile, "a") as fh:
    fh.write(f"child {os.getpid()} {os.getpgrp()}\n")
print("family started", flush=True)
while True:
    time.sleep(1)
"""


def read_family(pidfile: Path) -> dict[str, tuple[int, int]]:
    if not pidfile.exists():
        return {}
    out = {}
    for line in pidfile.read_text().splitlines():
        who, pid, pgid = line.split()
        out[who] = (int(pid), int(pgid))
    return out


def family_program(pidfile: Path) -> CommandProgram:
    return CommandProgram(argv=(PY, "-c", FAMILY, str(pidfile)))


async def wait_family(pidfile: Path) -> dict[str, tuple[int, int]]:
    async def ready() -> dict[str, tuple[int, int]] | None:
        family = read_family(pidfile)
        return family if len(family) == 2 else None

    return await async_wait_until(ready, timeout=15, what="the program's child and grandchild")


def assert_family_gone(family: dict[str, tuple[int, int]]) -> None:
    pgid = family["child"][1]
    assert family["grandchild"][1] == pgid, "the grandchild stayed in the run's group"
    for who, (pid, _) in family.items():
        assert not process_alive(pid), f"the {who} (pid {pid}) survived"
    assert group_members(pgid) == []


# the outcomes of runtime.md's table, each produced for real


async def test_program_that_returns_is_ok_with_its_result_and_log(make_runner: MakeRunner) -> None:
    seen: dict[str, Any] = {}

    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> Mapping[str, Any]:
        seen.update(
            args=args,
            run_id=ctx.run_id,
            trigger=ctx.trigger_id,
            agent=ctx.agent_name,
            space=ctx.space,
            device=ctx.device,
            scheduled=ctx.scheduled_at,
        )
        ctx.log.info("working on %s", args["what"])
        ctx.log.warning("almost out of fuel")
        return {
            "fuel": 12,
            "costUsd": 0.25,
            "tokens": {"in": 10, "out": 3},
            "model": "m1",
            "title": "did it",
            "turns": 2,
            "extra": "dropped",
            "cells": -1,
        }

    runner = make_runner(programs={"test:ok@v1": main})
    out = await runner.run(*request("test:ok@v1", {"what": "the thing"}))

    assert out.status == "ok"
    assert (out.error_type, out.error) == (None, None)
    assert out.result == {
        "fuel": 12,
        "costUsd": 0.25,
        "tokens": {"in": 10, "out": 3},
        "model": "m1",
        "title": "did it",
        "turns": 2,
    }
    assert "INFO working on the thing\nWARNING almost out of fuel\n" in out.output
    assert "'extra' ignored" in out.output and "'cells' ignored" in out.output
    assert seen == {
        "args": {"what": "the thing"},
        "run_id": "run-1",
        "trigger": "trig-1",
        "agent": "bao",
        "space": "bao-space",
        "device": "12D3KooWdevice",
        "scheduled": 1_800_000_000.0,
    }
    assert out.ended_at >= out.started_at and out.duration_ms >= 0
    assert runner.in_flight == 0


async def test_a_run_made_ready_starts_only_when_it_goes(make_runner: MakeRunner) -> None:
    calls: list[Mapping[str, Any]] = []

    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> dict[str, Any]:
        calls.append(args)
        return {"title": "went"}

    runner = make_runner(programs={"x:went@v1": main})
    starts: list[float] = []
    launch = runner.ready(*request("x:went@v1", {"n": 1}), on_start=starts.append)
    await asyncio.sleep(0)
    assert calls == [] and starts == [] and runner.in_flight == 0
    outcome = await runner.go(launch)
    assert outcome.status == "ok" and outcome.result == {"title": "went"}
    assert calls == [{"n": 1}] and starts == [outcome.started_at]


def launches() -> int:
    return sum(isinstance(o, Launch) for o in gc.get_objects())


async def test_a_finished_run_is_freed_without_the_collector(make_runner: MakeRunner) -> None:
    # A run kept in a reference cycle is freed only by the collector's passes: at 10,000
    # runs a minute, some 200,000 objects a minute (docs/history/benchmarks-2026.md).
    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> dict[str, Any]:
        return {"title": "went"}

    runner = make_runner(programs={"x:went@v1": main})
    gc.collect()
    with gc_paused():
        before = launches()
        launch = runner.ready(*request("x:went@v1", {"n": 1}))
        outcome = await runner.go(launch)
        del launch
        await asyncio.sleep(0)  # the run's task lets go of its frames
        assert outcome.status == "ok"
        assert launches() == before


async def test_a_run_made_ready_before_the_program_table_changed_is_made_ready_again(
    make_runner: MakeRunner,
) -> None:
    runner = make_runner()
    launch = runner.ready(*request("x:late@v1"))  # not installed yet

    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        return None

    runner.install("x:late@v1", main)
    outcome = await runner.go(launch)
    assert outcome.status == "ok"


async def test_program_that_raises_fails_with_the_exception_class(make_runner: MakeRunner) -> None:
    class QuotaExhausted(RuntimeError):
        pass

    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        raise QuotaExhausted("the API quota is used up\nsecond line")

    out = await make_runner(programs={"test:raise@v1": main}).run(*request("test:raise@v1"))

    assert out.status == "FAILED"
    assert out.error_type == "QuotaExhausted"
    assert out.error == "the API quota is used up"
    assert "Traceback" in out.output and "QuotaExhausted" in out.output
    assert out.result == {}


async def test_a_program_the_server_failed_says_so_in_its_error_type(
    make_runner: MakeRunner,
) -> None:
    class PostFailed(RuntimeError):
        pass

    async def post(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        await ctx.client.spaces()  # nothing listens at the test client's address

    async def wrapped(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        try:
            await ctx.client.spaces()
        except ServerUnavailable as exc:
            raise PostFailed("could not post the reminder") from exc

    runner = make_runner(programs={"test:post@v1": post, "test:wrapped@v1": wrapped})
    direct = await runner.run(*request("test:post@v1"))
    assert (direct.status, direct.error_type) == ("FAILED", "ServerUnavailable")
    assert direct.error is not None and "ConnectError: Connection refused" in direct.error
    wrap = await runner.run(*request("test:wrapped@v1"))
    assert (wrap.status, wrap.error_type) == ("FAILED", "ServerUnavailable")
    assert wrap.error == "could not post the reminder"


async def test_a_command_exiting_75_says_the_server_could_not_be_reached(
    make_runner: MakeRunner,
) -> None:
    prog = py("import sys; print('POST refused'); sys.exit(75)")
    out = await make_runner(commands={"mine:post@v1": prog}).run(*request("mine:post@v1"))
    assert (out.status, out.error_type) == ("FAILED", "ServerUnavailable")
    assert out.error is not None and "exited with status 75" in out.error
    assert "could not reach the any server" in out.error


async def test_command_that_exits_non_zero_fails_with_exit_code(make_runner: MakeRunner) -> None:
    prog = py("import sys; print('partial work'); print('bad disk', file=sys.stderr); sys.exit(3)")
    out = await make_runner(commands={"mine:fail@v1": prog}).run(*request("mine:fail@v1"))

    assert out.status == "FAILED"
    assert out.error_type == "ExitCode"
    assert out.error is not None and "exited with status 3" in out.error
    assert "partial work\n" in out.output and "bad disk\n" in out.output


async def test_command_killed_by_a_signal_fails_naming_it(make_runner: MakeRunner) -> None:
    prog = py("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    out = await make_runner(commands={"mine:segv@v1": prog}).run(*request("mine:segv@v1"))

    assert (out.status, out.error_type) == ("FAILED", "ExitCode")
    assert out.error is not None and "SIGSEGV" in out.error


async def test_program_not_installed_fails_with_program_not_found(make_runner: MakeRunner) -> None:
    out = await make_runner().run(*request("vendor:absent@v9"))

    assert out.status == "FAILED"
    assert out.error_type == "ProgramNotFound"
    assert out.error is not None
    assert "'vendor:absent@v9' is not installed on this device" in out.error
    assert '[programs."vendor:absent@v9"]' in out.error


async def test_in_process_program_past_the_budget_is_incomplete(make_runner: MakeRunner) -> None:
    unwound = asyncio.Event()

    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            unwound.set()

    runner = make_runner(programs={"test:slow@v1": main}, timeout_s=0.3)
    out = await runner.run(*request("test:slow@v1"))

    assert out.status == "incomplete"
    assert out.error_type == "BudgetExceeded"
    assert out.error is not None and "0.3 s" in out.error
    assert 250 <= out.duration_ms < 5000
    assert unwound.is_set(), "the program's task was not cancelled"
    assert runner.in_flight == 0


async def test_command_past_the_budget_is_incomplete(make_runner: MakeRunner) -> None:
    prog = py("import time; print('started', flush=True); time.sleep(60)")
    out = await make_runner(commands={"mine:slow@v1": prog}, timeout_s=0.3).run(
        *request("mine:slow@v1")
    )

    assert (out.status, out.error_type) == ("incomplete", "BudgetExceeded")
    assert out.duration_ms < 5000


# process groups


async def test_budget_kills_a_grandchild_that_ignores_sigterm(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    clock = FakeClock()
    pidfile = tmp_path / "pids"
    runner = make_runner(
        commands={"mine:family@v1": family_program(pidfile)},
        clock=clock,
        timeout_s=10,
        kill_grace_s=0.3,
    )
    run = asyncio.create_task(runner.run(*request("mine:family@v1")))
    family = await wait_family(pidfile)
    assert all(process_alive(pid) for pid, _ in family.values())

    clock.advance(10)  # the budget runs out on the injected clock
    out = await asyncio.wait_for(run, 15)

    assert (out.status, out.error_type) == ("incomplete", "BudgetExceeded")
    assert "family started" in out.output
    assert_family_gone(family)


async def test_leftovers_in_the_group_are_terminated_when_the_program_exits(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    pidfile = tmp_path / "bg"
    prog = py(
        f"""
        import subprocess, sys
        bg = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pidfile)!r}, "w").write(str(bg.pid))
        print("left a sleeper behind")
        """
    )
    out = await make_runner(commands={"mine:bg@v1": prog}, kill_grace_s=0.5).run(
        *request("mine:bg@v1")
    )

    assert out.status == "ok"
    assert not process_alive(int(pidfile.read_text()))
    assert "leaving 1 process(es) in its group" in out.output


async def test_cancelling_a_run_kills_its_process_group(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pids"
    runner = make_runner(commands={"mine:family@v1": family_program(pidfile)}, kill_grace_s=0.3)
    run = asyncio.create_task(runner.run(*request("mine:family@v1")))
    family = await wait_family(pidfile)

    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(run, 15)

    assert_family_gone(family)
    assert runner.in_flight == 0


# output capture and the result line


async def test_output_past_the_cap_is_counted_and_dropped(make_runner: MakeRunner) -> None:
    # 4 MiB on stdout and 1 MiB on stderr through 64 KiB pipes: a runner that
    # read one stream at a time, or not at all until exit, would deadlock here.
    prog = py(
        """
        import json, sys
        line = "x" * 1023 + "\\n"
        for i in range(4096):
            sys.stdout.write(line)
            if i % 4 == 0:
                sys.stderr.write(line)
        sys.stdout.write(json.dumps({"title": "big", "effects": 4096}) + "\\n")
        """
    )
    cap = 64 * 1024
    runner = make_runner(commands={"mine:big@v1": prog}, output_cap=cap, timeout_s=60)
    out = await runner.run(*request("mine:big@v1"))

    written = 4096 * 1024 + 1024 * 1024 + len(json.dumps({"title": "big", "effects": 4096})) + 1
    kept = len(out.output.encode())
    assert out.status == "ok"
    assert kept == cap
    assert kept + out.output_dropped == written
    assert out.result == {"title": "big", "effects": 4096}, "the result line survives the cap"


async def test_in_process_log_past_the_cap_is_counted_and_dropped(
    make_runner: MakeRunner,
) -> None:
    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        for i in range(1000):
            ctx.log.info("line %04d %s", i, "é" * 100)

    out = await make_runner(programs={"test:chatty@v1": main}, output_cap=1000).run(
        *request("test:chatty@v1")
    )

    line_bytes = len(f"INFO line 0000 {'é' * 100}\n".encode())
    assert out.status == "ok"
    assert len(out.output.encode()) <= 1000
    assert out.output.startswith("INFO line 0000 éé")
    assert "\ufffd" not in out.output, "the cap cut a character in half"
    assert out.output_dropped == 1000 * line_bytes - 1000


async def test_command_gets_args_on_stdin_and_context_in_env_and_reports_a_result(
    make_runner: MakeRunner,
) -> None:
    prog = py(
        """
        import json, os, sys
        args = json.load(sys.stdin)
        names = ["RUN_ID", "TRIGGER_ID", "SCHEDULED_AT", "DEVICE", "SPACE", "SERVER",
                 "AGENT_NAME", "PROGRAM"]
        for name in names:
            print(name, os.environ["ANYRTD_" + name])
        print("extra", os.environ["BACKUP_TARGET"])
        print("diagnostics", file=sys.stderr)
        print(json.dumps({"title": "backed up " + args["event"]["text"], "fuel": 1.5,
                          "tokens": {"in": 1, "out": 2, "cacheRead": 3, "cacheWrite": 4}}))
        """,
        env={"BACKUP_TARGET": "/srv/backup"},
    )
    args = {"path": "/home", "event": {"text": "now", "messageId": "m1"}}
    out = await make_runner(commands={"mine:backup@v1": prog}).run(*request("mine:backup@v1", args))

    assert out.status == "ok", out.output
    assert out.result == {
        "title": "backed up now",
        "fuel": 1.5,
        "tokens": {"in": 1, "out": 2, "cacheRead": 3, "cacheWrite": 4},
    }
    lines = out.output.splitlines()
    for expected in (
        "RUN_ID run-1",
        "TRIGGER_ID trig-1",
        "SCHEDULED_AT 1800000000.0",
        "DEVICE 12D3KooWdevice",
        "SPACE bao-space",
        "SERVER http://127.0.0.1:9",
        "AGENT_NAME bao",
        "PROGRAM mine:backup@v1",
        "extra /srv/backup",
        "diagnostics",
    ):
        assert expected in lines


@pytest.mark.parametrize(
    "last_line",
    ["plain text", "[1, 2]", '{"fuel": "lots"}', '{"title": "ok"} trailing', ""],
)
async def test_a_last_line_that_is_not_a_result_object_gives_no_result(
    make_runner: MakeRunner, last_line: str
) -> None:
    prog = py(f"print('hello'); print({last_line!r})")
    out = await make_runner(commands={"mine:text@v1": prog}).run(*request("mine:text@v1"))

    assert out.status == "ok"
    assert out.result == {}


async def test_result_is_read_from_the_last_non_blank_line_without_newline(
    make_runner: MakeRunner,
) -> None:
    prog = py("""import sys; sys.stdout.write('{"title": "first"}\\n{"title": "last"}')""")
    out = await make_runner(commands={"mine:nl@v1": prog}).run(*request("mine:nl@v1"))

    assert out.result == {"title": "last"}


async def test_a_lone_surrogate_in_a_command_result_is_replaced_and_said(
    make_runner: MakeRunner,
) -> None:
    # What JavaScript's JSON.stringify gives for a string cut through an emoji: json.loads
    # accepts it, but no UTF-8 encoder can write it, so it must not reach a record.
    prog = py(
        r"""
        import sys
        print("working")
        sys.stdout.write('{"title": "cut \\ud83d", "model": "m\\udfff", "effects": 1}\n')
        """
    )
    out = await make_runner(commands={"mine:js@v1": prog}).run(*request("mine:js@v1"))

    assert out.status == "ok", out.output
    assert out.result == {"title": "cut \ufffd", "model": "m\ufffd", "effects": 1}
    json.dumps(dict(out.result), ensure_ascii=False).encode("utf-8")  # storable and sendable
    notes = [ln for ln in out.output.splitlines() if ln.startswith("anyrtd: result key")]
    assert notes == [
        "anyrtd: result key 'title': text that is not valid Unicode (a lone surrogate) was "
        "replaced with U+FFFD",
        "anyrtd: result key 'model': text that is not valid Unicode (a lone surrogate) was "
        "replaced with U+FFFD",
    ]


async def test_output_that_is_not_utf8_is_replaced_and_said(make_runner: MakeRunner) -> None:
    prog = py(r"""import sys; sys.stdout.buffer.write(b"ok \xff\xfe bytes\n\xed\xa0\x80\n")""")
    out = await make_runner(commands={"mine:bytes@v1": prog}).run(*request("mine:bytes@v1"))

    assert out.status == "ok"
    out.output.encode("utf-8")
    assert out.output.splitlines() == [
        "ok \ufffd\ufffd bytes",
        "\ufffd\ufffd\ufffd",
        "anyrtd: output bytes that are not valid UTF-8 were replaced with U+FFFD",
    ]


async def test_a_lone_surrogate_in_an_error_or_a_log_line_is_replaced(
    make_runner: MakeRunner,
) -> None:
    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        ctx.log.info("half an emoji: \ud83d")
        raise ValueError("cannot post \ud83d")

    out = await make_runner(programs={"mine:half@v1": main}).run(*request("mine:half@v1"))

    assert (out.status, out.error_type, out.error) == ("FAILED", "ValueError", "cannot post \ufffd")
    out.output.encode("utf-8")
    assert "INFO half an emoji: \ufffd" in out.output.splitlines()
    assert out.output.splitlines()[-1] == (
        "anyrtd: the run's error: text that is not valid Unicode (a lone surrogate) was "
        "replaced with U+FFFD"
    )


async def test_a_failed_command_still_reports_its_result(make_runner: MakeRunner) -> None:
    prog = py("""import sys; print('{"costUsd": 0.5}'); sys.exit(1)""")
    out = await make_runner(commands={"mine:costly@v1": prog}).run(*request("mine:costly@v1"))

    assert (out.status, out.error_type, out.result) == ("FAILED", "ExitCode", {"costUsd": 0.5})


# interrupting


async def test_interrupt_all_ends_every_run_in_flight(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    started = 0

    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        nonlocal started
        started += 1
        await asyncio.sleep(60)

    pidfile = tmp_path / "pids"
    runner = make_runner(
        programs={"test:forever@v1": main},
        commands={"mine:family@v1": family_program(pidfile)},
        kill_grace_s=0.3,
    )
    runs = [
        asyncio.create_task(runner.run(*request("test:forever@v1", run_id=f"r{i}")))
        for i in range(3)
    ]
    runs.append(asyncio.create_task(runner.run(*request("mine:family@v1", run_id="r-cmd"))))
    family = await wait_family(pidfile)

    async def all_started() -> bool:
        return started == 3 and runner.in_flight == 4

    await async_wait_until(all_started, what="four runs in flight")
    await asyncio.wait_for(runner.interrupt_all(), 15)

    assert all(r.done() for r in runs), "interrupt_all returned before the runs ended"
    outcomes: list[RunOutcome] = [r.result() for r in runs]
    assert [(o.status, o.error_type) for o in outcomes] == [("interrupted", None)] * 4
    assert runner.in_flight == 0
    assert_family_gone(family)


async def test_interrupt_all_with_nothing_in_flight_returns_at_once(
    make_runner: MakeRunner,
) -> None:
    await asyncio.wait_for(make_runner().interrupt_all(), 1)


async def test_a_program_that_ignores_cancellation_is_abandoned_after_the_grace(
    make_runner: MakeRunner,
) -> None:
    release = asyncio.Event()

    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # a misbehaving program

    runner = make_runner(programs={"test:stubborn@v1": main}, timeout_s=0.2, kill_grace_s=0.2)
    out = await asyncio.wait_for(runner.run(*request("test:stubborn@v1")), 10)
    release.set()

    assert (out.status, out.error_type) == ("incomplete", "BudgetExceeded")
    assert out.duration_ms < 5000


# resolution


async def test_a_synced_record_cannot_name_a_command_that_is_not_declared(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    runner = make_runner(commands={"mine:ok@v1": CommandProgram(argv=("/bin/true",))})
    for spec in (f"/usr/bin/touch {marker}", "/bin/true", "sh", "mine:ok@v2", "mine:ok@v1 "):
        out = await runner.run(*request(spec))
        assert (out.status, out.error_type) == ("FAILED", "ProgramNotFound"), spec
        assert not runner.is_installed(spec)
    assert not marker.exists()
    assert runner.is_installed("mine:ok@v1")


async def test_a_declared_command_whose_executable_is_missing_fails_clearly(
    make_runner: MakeRunner, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-binary")
    out = await make_runner(commands={"mine:gone@v1": CommandProgram(argv=(missing,))}).run(
        *request("mine:gone@v1")
    )

    assert (out.status, out.error_type) == ("FAILED", "FileNotFoundError")
    assert out.error is not None
    assert missing in out.error and '[programs."mine:gone@v1"]' in out.error


async def test_built_ins_resolve_before_entry_points_and_commands(make_runner: MakeRunner) -> None:
    runner = make_runner(commands={"agent:remind@v1": CommandProgram(argv=("/bin/false",))})
    program = runner.resolve("agent:remind@v1")

    assert program is not None and program.source == "builtin"
    assert runner.is_installed("agent:rollup@v1")


async def test_a_non_async_main_fails_with_a_clear_type_error(make_runner: MakeRunner) -> None:
    def main(args: Mapping[str, Any], ctx: ProgramContext) -> dict[str, Any]:
        return {}

    runner = make_runner(programs={"test:sync@v1": main})  # type: ignore[dict-item]
    out = await runner.run(*request("test:sync@v1"))

    assert (out.status, out.error_type) == ("FAILED", "TypeError")
    assert out.error is not None and "async def main(args, ctx)" in out.error


async def test_the_program_gets_a_copy_of_its_args(make_runner: MakeRunner) -> None:
    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> None:
        args["event"]["text"] = "changed"  # type: ignore[index]

    args = {"event": {"text": "original"}}
    await make_runner(programs={"test:mut@v1": main}).run(*request("test:mut@v1", args))

    assert args == {"event": {"text": "original"}}


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"n": 1, "x": 1.5, "s": "a", "b": True, "none": None},
        {"event": {"text": "t", "tags": ["a", {"deep": [1, 2]}]}},
        {"odd": {"set": {1, 2}, "tuple": ([1], 2)}},  # not from JSON: copied by deepcopy
    ],
)
async def test_a_programs_args_are_an_equal_copy_it_may_change_anywhere(
    make_runner: MakeRunner, args: dict[str, Any]
) -> None:
    seen: list[Any] = []

    async def main(got: Mapping[str, Any], ctx: ProgramContext) -> None:
        seen.append(json.loads(json.dumps(got, default=repr)))
        _scribble(got)

    before = json.loads(json.dumps(args, default=repr))
    await make_runner(programs={"test:mut@v1": main}).run(*request("test:mut@v1", args))

    assert seen == [before]
    assert json.loads(json.dumps(args, default=repr)) == before


def _scribble(value: Any) -> None:
    """Change every dict, list and set inside `value`, in place."""
    if isinstance(value, dict):
        for item in list(value.values()):
            _scribble(item)
        value["scribbled"] = True
    elif isinstance(value, list):
        for item in value:
            _scribble(item)
        value.append("scribbled")
    elif isinstance(value, set):
        value.add("scribbled")
    elif isinstance(value, tuple):
        for item in value:
            _scribble(item)


async def test_a_budget_that_is_not_positive_is_refused(client: ServerClient) -> None:
    with pytest.raises(ValueError, match="greater than 0"):
        Runner(
            client=client,
            clock=SystemClock(),
            agent_name="bao",
            space="s",
            commands={},
            timeout_s=0,
        )


async def test_configure_takes_a_new_program_table_and_budget(make_runner: MakeRunner) -> None:
    runner = make_runner(commands={"mine:old@v1": CommandProgram(argv=("/bin/true",))})
    assert runner.is_installed("mine:old@v1")

    runner.configure(commands={"mine:new@v1": py("import time; time.sleep(60)")}, timeout_s=0.2)

    assert not runner.is_installed("mine:old@v1")
    out = await runner.run(*request("mine:new@v1"))
    assert (out.status, out.error_type) == ("incomplete", "BudgetExceeded")
    assert out.error is not None and "0.2 s" in out.error
    with pytest.raises(ValueError, match="greater than 0"):
        runner.configure(timeout_s=-1)


async def test_a_command_that_cannot_be_started_fails_instead_of_raising(
    make_runner: MakeRunner,
) -> None:
    runner = make_runner(commands={"mine:nul@v1": CommandProgram(argv=("/bin/echo", "a\0b"))})
    out = await runner.run(*request("mine:nul@v1"))

    assert (out.status, out.error_type) == ("FAILED", "ValueError")
    assert out.error is not None and "cannot start command '/bin/echo'" in out.error


async def test_command_runs_leave_no_descriptors_open(make_runner: MakeRunner) -> None:
    # The shell, not an interpreter: twenty start well within the budget on a busy machine.
    runner = make_runner(
        commands={
            "mine:ok@v1": CommandProgram(argv=("/bin/sh", "-c", "echo fine")),
            "mine:slow@v1": CommandProgram(argv=("/bin/sh", "-c", "exec sleep 60")),
        },
        timeout_s=2.0,
        kill_grace_s=0.2,
    )
    await runner.run(*request("mine:ok@v1"))  # let asyncio set up its child watcher first
    before = len(os.listdir("/proc/self/fd"))

    outs = await asyncio.gather(
        *(runner.run(*request("mine:ok@v1", run_id=f"ok-{i}")) for i in range(20)),
        *(runner.run(*request("mine:slow@v1", run_id=f"slow-{i}")) for i in range(5)),
    )

    assert [o.status for o in outs] == ["ok"] * 20 + ["incomplete"] * 5
    assert len(os.listdir("/proc/self/fd")) <= before


async def test_a_command_does_not_inherit_the_daemon_notify_socket(
    make_runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("ANYRTD_TEST_INHERITED", "yes")
    prog = py(
        "import os; print(sorted(k for k in os.environ if 'NOTIFY' in k or 'WATCHDOG' in k));"
        "print(os.environ['ANYRTD_TEST_INHERITED'])"
    )
    out = await make_runner(commands={"mine:env@v1": prog}).run(*request("mine:env@v1"))

    assert out.output == "[]\nyes\n"
