"""Run one program to its end under the budget, and report an honest outcome.

A run ends in one of four ways (docs/programs.md, How a run ends): `ok`, `FAILED` (the
program raised, exited non-zero, or is not installed here), `incomplete` (it ran past the
budget and was stopped) or `interrupted` (the daemon stopped it). `Runner.run` never raises
for anything a program does; it always returns a `RunOutcome`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import logging
import os
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from anyrtd.client import WAITS, ServerClient, ServerUnavailable, Waits
from anyrtd.clock import Clock, SystemClock
from anyrtd.config import CommandProgram
from anyrtd.notify import child_environ
from anyrtd.program import ProgramContext, ProgramFn, RunOutcome
from anyrtd.programs import BUILTINS, IDEMPOTENT
from anyrtd.rows import RunRow
from anyrtd.runner.budget import Budget, Stalls
from anyrtd.runner.capture import Capture, LastLine, LineSink, Pipes, RunLogger
from anyrtd.runner.marks import (
    NO_MARK_STATUS,
    NOT_EXECUTABLE_STATUS,
    NOT_FOUND_STATUS,
    SUPERVISOR,
    Marks,
)
from anyrtd.runner.process import (
    KILL_WAIT_S,
    OutOfDescriptors,
    exit_message,
    feed_stdin,
    kill_group,
    out_of_descriptors,
    spawn_in_group,
)
from anyrtd.runner.resolve import Program, ProgramTable
from anyrtd.runs import (
    DAEMON_FAULT,
    REPLACED,
    SERVER_UNAVAILABLE,
    duration_ms,
    normalize_result,
    one_line,
    valid_text,
)
from anyrtd.vocab import RunStatus

log = logging.getLogger("anyrtd.runner")

_PROGRAM_LOG = logging.getLogger("anyrtd.programs")
# How long to wait for the output pipes to reach EOF once the program's process is gone.
_DRAIN_WAIT_S = 2.0


class Launch:
    """A run as the runner holds it, from `Runner.ready` to its end: the run (its row, read
    and never written here) and its program's args, what the caller is told on the way
    (`on_start`, `on_spawn`), and once made ready its capture, its program and call, its
    stop signal (budget or interrupt), its completion and how it ended."""

    __slots__ = (
        "_clock",
        "args",
        "budget_s",
        "call",
        "capture",
        "done",
        "error",
        "error_type",
        "generation",
        "on_spawn",
        "on_start",
        "program",
        "result",
        "row",
        "started_at",
        "status",
        "stop",
        "waits",
    )

    def __init__(
        self,
        row: RunRow,
        args: Mapping[str, Any],
        on_start: Callable[[float], None] | None,
        on_spawn: Callable[[int], Awaitable[None]] | None,
        budget_s: float,
        clock: Clock,
        capture: Capture,
        generation: int,
    ) -> None:
        self.row = row
        self.args = args
        """The program's args (its trigger's, plus the `event` of an event's run)."""
        self.on_start = on_start
        """Called with the moment the program starts, at that moment."""
        self.on_spawn = on_spawn
        """Called with a command's process group once it is started, before the runner waits."""
        self.budget_s = budget_s
        self._clock = clock
        self.capture = capture
        self.program: Program | Exception | None = None
        """The program found, None when none is installed, or the runner's own failure."""
        self.call: Callable[[], Coroutine[Any, Any, Any]] | None = None
        """An in-process program's call, made a task when the run starts (and let go then)."""
        self.generation = generation
        """The runner's `generation` it was made ready in."""
        self.stop: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.done = asyncio.Event()
        self.started_at: float | None = None
        self.status = RunStatus.FAILED
        self.error_type: str | None = None
        self.error: str | None = None
        self.result: dict[str, Any] = {}
        self.waits = Waits()
        """The requests its in-process program has in flight to the any server."""

    def start(self) -> None:
        """Note that the program starts now: called just before the in-process call, or
        just before the command's process is spawned."""
        self.started_at = self._clock.now()
        if self.on_start is not None:
            self.on_start(self.started_at)

    def signal(self, why: str) -> None:
        if not self.stop.done():
            self.stop.set_result(why)

    def end(
        self,
        status: RunStatus,
        error_type: str | None = None,
        error: str | None = None,
        result: dict[str, Any] | None = None,
    ) -> None:
        """Note how the run ended (its times and output are added by `Runner`)."""
        self.status, self.error_type, self.error = status, error_type, error
        self.result = {} if result is None else result


class Runner:
    """Run programs under the fixed budget and report each run's outcome."""

    def __init__(
        self,
        *,
        client: ServerClient,
        clock: Clock,
        agent_name: str,
        space: str,
        commands: Mapping[str, CommandProgram],
        timeout_s: float = 300.0,
        kill_grace_s: float = 2.0,
        output_cap: int = 1 << 20,
        extra_builtins: Mapping[str, ProgramFn] | None = None,
        watch_stalls: bool | None = None,
        marks: Marks | None = None,
    ) -> None:
        """`watch_stalls`: leave out of each run's budget the time the daemon was stopped
        (`anyrtd.runner.budget`); by default on the real clock only, as a test's fake clock
        moves by jumps that are no stalls. `marks`: spawn each command under the supervisor
        that writes its marks there (`anyrtd.runner.marks`); None, the command alone."""
        if not timeout_s > 0:
            raise ValueError(f"run budget must be greater than 0 s, got {timeout_s!r}")
        self._client = client
        self._clock = clock
        self._agent_name = agent_name
        self._space = space
        self._programs = ProgramTable(
            {**BUILTINS, **(extra_builtins or {})}, commands, idempotent=IDEMPOTENT
        )
        self._timeout_s = timeout_s
        self._kill_grace_s = max(0.0, kill_grace_s)
        self._output_cap = output_cap
        self._flights: set[Launch] = set()
        self._event_only: dict[str, str] = {}
        """Programs that run only on an event, and why (a run by hand can only fail)."""
        if watch_stalls is None:
            watch_stalls = isinstance(clock, SystemClock)
        self._stalls = Stalls(clock, watch=watch_stalls)
        self.marks = marks
        """Where each command's supervisor writes its marks (None: no supervisor)."""
        self.generation = 0
        """Counts the changes of the program table and the budget: a run made ready before
        one is made ready again when it starts (`go`)."""

    @property
    def in_flight(self) -> int:
        """Return how many runs are executing now."""
        return len(self._flights)

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def output(self, run_id: str) -> tuple[str, int] | None:
        """Return the output captured so far of the run `run_id` in flight and the bytes
        dropped past the cap; None when no run of that id is in flight."""
        for launch in self._flights:
            if launch.row.run_id == run_id:
                return launch.capture.so_far(), launch.capture.dropped
        return None

    @property
    def kill_grace_s(self) -> float:
        """How long a process group has between SIGTERM and SIGKILL."""
        return self._kill_grace_s

    def configure(
        self,
        *,
        commands: Mapping[str, CommandProgram] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Take a reloaded program table and budget, and rescan the entry points.

        Runs in flight keep the budget they started with.
        """
        if timeout_s is not None:
            if not timeout_s > 0:
                raise ValueError(f"run budget must be greater than 0 s, got {timeout_s!r}")
            self._timeout_s = timeout_s
            self.generation += 1
        if commands is not None:
            self._programs.set_commands(commands)
        self.rescan_entry_points()

    # resolution

    def resolve(self, spec: str) -> Program | None:
        """Return the program installed here under `spec`, or None."""
        return self._programs.resolve(spec)

    def install(
        self,
        spec: str,
        main: ProgramFn,
        *,
        event_only: str | None = None,
        idempotent: bool = False,
    ) -> None:
        """Add an in-process built-in (the daemon's `internal:` programs) unless one exists.
        `event_only`: the program runs only on an event, and this says why (a run by hand
        of it is refused, `by_hand`); `idempotent`: its effects are idempotent by the run id
        (a run a crash left ambiguous is run again)."""
        self._programs.install(spec, main, idempotent=idempotent)
        self.generation += 1
        if event_only is not None:
            self._event_only[spec] = event_only

    def by_hand(self, spec: str) -> str | None:
        """Return why a run by hand of `spec` could only fail on this device (it runs only
        on an event, or it is not installed here), or None when it can run."""
        if (why := self._event_only.get(spec)) is not None:
            return why
        if not self.is_installed(spec):
            return self._programs.not_found(spec)
        return None

    def is_installed(self, spec: str) -> bool:
        """Return whether `spec` names a program this device can run."""
        return self.resolve(spec) is not None

    def rescan_entry_points(self) -> None:
        """Forget the entry-point index so newly installed packages are seen."""
        self._programs.rescan_entry_points()
        self.generation += 1

    # running

    async def run(
        self,
        row: RunRow,
        args: Mapping[str, Any],
        *,
        on_start: Callable[[float], None] | None = None,
        on_spawn: Callable[[int], Awaitable[None]] | None = None,
    ) -> RunOutcome:
        """Run the program of `row` with `args` to its end, under the budget; never raise for
        what the program does. The row is read, never written: its owner is
        `anyrtd.lifecycle`, and `on_start`/`on_spawn` tell the caller what to write.

        The outcome's `started_at` is when the program was really started (the in-process
        call, or the command's spawn), and `on_start` is called with it at that moment; a
        program that never started (not installed, cannot be spawned) has the time the
        runner gave up. `duration_ms` is `ended_at - started_at`. `on_spawn` is called with
        a command's process group once it is started, before the runner waits.
        """
        return await self.start(row, args, on_start=on_start, on_spawn=on_spawn)

    def start(
        self,
        row: RunRow,
        args: Mapping[str, Any],
        *,
        on_start: Callable[[float], None] | None = None,
        on_spawn: Callable[[int], Awaitable[None]] | None = None,
    ) -> Coroutine[Any, Any, RunOutcome]:
        """Start one run now; return the coroutine that runs it to its end (as `run` does).

        An in-process program's call is created here as a task of its own, so runs started
        together begin at the loop's next turn, in the order started, each for the cost of
        creating its task; the budget and the rest of the run follow in the coroutine. A
        command is spawned when the coroutine first runs, each in the task that awaits it,
        none waiting for another. The coroutine must be awaited.
        """
        return self.go(self.ready(row, args, on_start=on_start, on_spawn=on_spawn))

    def ready(
        self,
        row: RunRow,
        args: Mapping[str, Any],
        *,
        on_start: Callable[[float], None] | None = None,
        on_spawn: Callable[[int], Awaitable[None]] | None = None,
    ) -> Launch:
        """Make one run ready to start (`go`): its capture, its program found, its context and
        its own copy of the args, but no task yet. A batch prepared ahead of its due time is
        made ready in its lead, so that at the due time each start costs its task alone."""
        launch = Launch(
            row,
            args,
            on_start,
            on_spawn,
            self._timeout_s,
            self._clock,
            Capture(self._output_cap),
            self.generation,
        )
        try:
            launch.program = program = self.resolve(row.program)
            if program is not None and program.main is not None:
                launch.call = self._call(program.main, launch)
        except Exception as exc:  # a bug of the runner itself: reported by the coroutine
            launch.program = exc
        return launch

    def go(self, launch: Launch) -> Coroutine[Any, Any, RunOutcome]:
        """Start a run made ready (`ready`); return the coroutine that runs it to its end, as
        `start` does. A run made ready before the program table or the budget changed is
        made ready again first."""
        if launch.generation != self.generation:
            launch = self.ready(
                launch.row, launch.args, on_start=launch.on_start, on_spawn=launch.on_spawn
            )
        self._flights.add(launch)
        task: asyncio.Task[Any] | Exception | None = None
        # The call is handed to its task, not kept: it holds its launch, and kept, the two
        # would hold each other, a cycle of some 23 objects a run that only the collector's
        # passes free (docs/benchmarks.md, "Where issue 22's spread CPU went").
        call, launch.call = launch.call, None
        if call is not None and not isinstance(launch.program, Exception):
            try:
                task = asyncio.create_task(call(), name=f"anyrtd-run-{launch.row.run_id}")
            except Exception as exc:  # a bug of the runner itself: reported by the coroutine
                task = exc
        return self._finish(launch, task)

    async def _finish(
        self, launch: Launch, task: asyncio.Task[Any] | Exception | None
    ) -> RunOutcome:
        clock, capture = self._clock, launch.capture
        try:
            if isinstance(launch.program, Exception):
                raise launch.program
            if isinstance(task, Exception):
                raise task
            await self._execute(launch, launch.program, task)
        except Exception as exc:  # a bug of the runner itself must still end the run
            log.exception("run %s: the runner failed", launch.row.run_id)
            capture.add_line("".join(traceback.format_exception(exc)))
            launch.end(
                RunStatus.FAILED,
                DAEMON_FAULT if out_of_descriptors(exc) else type(exc).__name__,
                f"anyrtd runner error: {one_line(str(exc), '')}",
            )
        finally:
            self._flights.discard(launch)
            launch.done.set()
        ended_at = clock.now()
        started_at = launch.started_at if launch.started_at is not None else ended_at
        ended_at = max(ended_at, started_at)
        error_type, error = _valid_or_none(launch.error_type), _valid_or_none(launch.error)
        if error_type != launch.error_type or error != launch.error:
            capture.add_line(f"anyrtd: the run's error: {REPLACED}")
        return RunOutcome(
            status=launch.status,
            error_type=error_type,
            error=error,
            started_at=started_at,
            ended_at=ended_at,
            duration_ms=duration_ms(started_at, ended_at),
            result=launch.result,
            output=capture.text(),
            output_dropped=capture.dropped,
        )

    async def interrupt_all(self) -> None:
        """End every in-flight run now as interrupted, and return once all have ended."""
        flights = list(self._flights)
        for flight in flights:
            flight.signal("interrupt")
        await asyncio.gather(*(f.done.wait() for f in flights))

    async def _execute(
        self, launch: Launch, program: Program | None, call: asyncio.Task[Any] | None
    ) -> None:
        if program is None:
            launch.end(
                RunStatus.FAILED, "ProgramNotFound", self._programs.not_found(launch.row.program)
            )
            return
        budget = Budget(self._clock, self._stalls, launch.budget_s, lambda: launch.signal("budget"))
        try:
            if program.command is not None:
                await self._run_command(program, program.command, launch)
            else:
                assert call is not None
                await self._run_in_process(call, launch)
        finally:
            budget.cancel()

    def _stopped(self, why: str, launch: Launch, held: tuple[str, float] | None = None) -> None:
        if why == "budget" and held is not None and held[1] >= HELD_S:
            # Held up by the server, whatever the budget: not the program's failure.
            what, waited = held
            launch.end(
                RunStatus.INCOMPLETE,
                SERVER_UNAVAILABLE,
                f"ran past the run budget of {launch.budget_s:g} s while the any server held "
                f"its request ({what}, unanswered for {waited:.1f} s) and was stopped: the "
                "server's fault, not counted toward the breaker",
            )
        elif why == "budget":
            launch.end(
                RunStatus.INCOMPLETE,
                "BudgetExceeded",
                f"ran past the run budget of {launch.budget_s:g} s and was stopped",
            )
        else:
            launch.end(RunStatus.INTERRUPTED, None, "the daemon stopped this run")

    def _call(self, main: ProgramFn, launch: Launch) -> Callable[[], Coroutine[Any, Any, Any]]:
        """Return the call of an in-process program, its context and args built (its task
        starts it at the loop's next turn)."""
        row = launch.row
        ctx = ProgramContext(
            run_id=row.run_id,
            trigger_id=row.trigger_id,
            scheduled_at=row.scheduled_at,
            device=row.device,
            agent_name=self._agent_name,
            space=self._space,
            log=RunLogger(f"anyrtd.programs.run.{row.run_id}", launch.capture, _PROGRAM_LOG),
            client=self._client,
            clock=self._clock,
        )
        # A program gets its own copy: editing its args must not touch the daemon's record.
        args = _own_copy(launch.args)

        async def call() -> Mapping[str, Any] | None:
            WAITS.set(launch.waits)  # this task's context: the program's requests are noted
            launch.start()
            value = main(args, ctx)
            if not inspect.isawaitable(value):
                raise TypeError(
                    f"program {row.program!r} returned {type(value).__name__} instead of an "
                    f"awaitable: define it as async def main(args, ctx)"
                )
            return await value

        return call

    async def _run_in_process(self, task: asyncio.Task[Any], launch: Launch) -> None:
        stopped: str | None = None
        held: tuple[str, float] | None = None
        try:
            await asyncio.wait(_futures(task, launch.stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                stopped = launch.stop.result() if launch.stop.done() else "cancelled"
                held = launch.waits.holding()  # before the cancel ends the request
                task.cancel()
                await self._settle(task, launch.row)
        if stopped is not None:
            self._stopped(stopped, launch, held)
        elif task.cancelled():
            launch.end(RunStatus.FAILED, "CancelledError", "the program was cancelled")
        elif (exc := task.exception()) is not None:
            kind = _error_type(exc)
            program = launch.program
            if isinstance(program, Program) and _ours(program):
                # anyrtd's own programs say what went wrong in their message: one line.
                launch.capture.add_line(f"{kind}: {one_line(str(exc), kind)}")
            else:
                launch.capture.add_line("".join(traceback.format_exception(exc)))
            launch.end(RunStatus.FAILED, kind, one_line(str(exc), kind))
        else:
            result, notes = normalize_result(task.result())
            for note in notes:
                launch.capture.add_line(f"anyrtd: {note}")
            launch.end(RunStatus.OK, result=result)

    async def _settle(self, task: asyncio.Task[Any], row: RunRow) -> None:
        """Give a cancelled program the grace period to unwind; abandon it past that."""
        done, _ = await asyncio.wait({task}, timeout=self._kill_grace_s)
        if not done:
            log.warning(
                "run %s: program %s ignored cancellation for %g s; abandoning it",
                row.run_id,
                row.program,
                self._kill_grace_s,
            )
        elif not task.cancelled():
            task.exception()  # retrieved, so asyncio does not report it as never seen

    def _command_env(self, cmd: CommandProgram, row: RunRow) -> dict[str, str]:
        # The notify variables are for the daemon alone: a child must not ping its watchdog.
        env = {**child_environ(os.environ), **cmd.env}
        env.update(
            ANYRTD_RUN_ID=row.run_id,
            ANYRTD_TRIGGER_ID=row.trigger_id or "",
            ANYRTD_SCHEDULED_AT="" if row.scheduled_at is None else repr(row.scheduled_at),
            ANYRTD_DEVICE=row.device,
            ANYRTD_SPACE=self._space,
            ANYRTD_SERVER=self._client.base_url,
            ANYRTD_AGENT_NAME=self._agent_name,
            ANYRTD_PROGRAM=row.program,
        )
        return env

    async def _run_command(self, program: Program, cmd: CommandProgram, launch: Launch) -> None:
        capture = launch.capture
        payload = json.dumps(dict(launch.args), default=str).encode() + b"\n"
        env = self._command_env(cmd, launch.row)
        marks = self.marks
        argv: tuple[str, ...] = cmd.argv
        if marks is not None:
            argv = ("/bin/sh", "-c", SUPERVISOR, "anyrtd-run", marks.prefix(launch.row.run_id))
            argv += cmd.argv
        try:  # launch.start() is called just before the spawn (again, if it is retried)
            proc, out_r, err_r = await spawn_in_group(
                argv, cwd=cmd.cwd, env=env, before_spawn=launch.start, stop=launch.stop
            )
        except OutOfDescriptors as exc:  # the daemon's fault: not the program's
            if launch.stop.result() == "interrupt":
                self._stopped("interrupt", launch)
            else:
                launch.end(RunStatus.FAILED, DAEMON_FAULT, str(exc))
            return
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in argv or env
            reason = getattr(exc, "strerror", None) or str(exc)
            launch.end(
                RunStatus.FAILED,
                type(exc).__name__,
                f"cannot start command {cmd.argv[0]!r}: {reason}; check argv in the local "
                f'config\'s [programs."{program.spec}"] table',
            )
            return
        pgid = proc.pid
        last_line = LastLine()
        pipes = Pipes()
        await pipes.connect(out_r, LineSink(capture, last_line))
        await pipes.connect(err_r, LineSink(capture))
        feeder = asyncio.create_task(feed_stdin(proc, payload))
        waiter = asyncio.create_task(proc.wait())
        why: str | None = None
        try:
            if launch.on_spawn is not None:
                await launch.on_spawn(pgid)
            await asyncio.wait(_futures(waiter, launch.stop), return_when=asyncio.FIRST_COMPLETED)
            why = None if waiter.done() else launch.stop.result()
        finally:
            # On budget, interrupt, or our own cancellation: nothing of the group survives.
            # After a normal exit, whatever the program left in its group goes too, as
            # systemd does with a oneshot service's leftovers.
            killed = await kill_group(pgid, self._kill_grace_s)
            if killed and why is None and waiter.done():
                capture.add_line(
                    f"anyrtd: the program exited leaving {killed} process(es) in its group; "
                    "they were terminated"
                )
            if not waiter.done():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(waiter), KILL_WAIT_S)
            await pipes.drain(_DRAIN_WAIT_S)
            feeder.cancel()
            if not waiter.done():
                waiter.cancel()
        if why is not None:
            self._stopped(why, launch)
            return
        rc = waiter.result()
        if marks is not None and rc in _NOT_STARTED and not marks.started(launch.row.run_id):
            launch.end(RunStatus.FAILED, *_not_started(rc, cmd, program.spec, marks))
            return
        result: dict[str, Any] = {}
        line = last_line.finish()
        if line is not None:
            try:
                parsed = json.loads(line)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                result, notes = normalize_result(parsed)
                for note in notes:
                    capture.add_line(f"anyrtd: {note}")
        if rc == 0:
            launch.end(RunStatus.OK, result=result)
        elif rc == EX_TEMPFAIL:
            launch.end(
                RunStatus.FAILED,
                SERVER_UNAVAILABLE,
                f"{exit_message(cmd.argv[0], rc)}: the program could not reach the any server",
                result,
            )
        else:
            launch.end(RunStatus.FAILED, "ExitCode", exit_message(cmd.argv[0], rc), result)


HELD_S = 1.0
"""A request to the any server unanswered this long when a run's budget runs out: the run
was held up by the server, and its end is not counted toward the breaker."""
EX_TEMPFAIL = 75
"""The exit status (sysexits.h) by which a command says the any server could not be reached."""

_NOT_STARTED = (NOT_FOUND_STATUS, NOT_EXECUTABLE_STATUS, NO_MARK_STATUS)


def _not_started(rc: int, cmd: CommandProgram, spec: str, marks: Marks) -> tuple[str, str]:
    """Return the error type and error of a command its supervisor did not start."""
    fix = f'check argv in the local config\'s [programs."{spec}"] table'
    if rc == NOT_FOUND_STATUS:
        return "FileNotFoundError", f"cannot start command {cmd.argv[0]!r}: not found; {fix}"
    if rc == NOT_EXECUTABLE_STATUS:
        return "PermissionError", f"cannot start command {cmd.argv[0]!r}: not executable; {fix}"
    return DAEMON_FAULT, (
        f"command {cmd.argv[0]!r} was not started: its start mark could not be written in "
        f"{marks.folder} (without it a crash could not tell whether it ran); the program was "
        "not at fault: free space for the state directory"
    )


def _ours(program: Program) -> bool:
    """Tell whether a program is one anyrtd ships (its built-ins, the daemon's `internal:`
    ones): those say what went wrong in their message, so a failure is one line of output."""
    return program.source == "builtin" and (
        program.spec in BUILTINS or program.spec.startswith("internal:")
    )


def _error_type(exc: BaseException) -> str:
    """Return a raised exception's `errorType`: `ServerUnavailable` when the server could not be
    reached, even under an exception of the program's own; else the class name."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ServerUnavailable):
            return SERVER_UNAVAILABLE
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return type(exc).__name__


def _valid_or_none(text: str | None) -> str | None:
    return None if text is None else valid_text(text)[0]


_IMMUTABLE = (str, int, float, bool, type(None))


def _own_copy(args: Mapping[str, Any]) -> dict[str, Any]:
    """Return a deep copy of `args`: by hand for what JSON gives (a run's args come from a
    record), through `copy.deepcopy` for anything else."""
    return {key: _copy_value(value) for key, value in args.items()}


def _copy_value(value: Any) -> Any:
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is dict:
        return {key: _copy_value(item) for key, item in value.items()}
    if kind is list:
        return [_copy_value(item) for item in value]
    return copy.deepcopy(value)


def _futures(*futs: asyncio.Future[Any]) -> set[asyncio.Future[Any]]:
    return set(futs)
