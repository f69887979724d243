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
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from anyrtd.client import ServerClient, ServerUnavailable
from anyrtd.clock import Clock, SystemClock
from anyrtd.config import CommandProgram
from anyrtd.notify import child_environ
from anyrtd.program import ProgramContext, ProgramFn, RunOutcome, RunRequest
from anyrtd.programs import BUILTINS
from anyrtd.runner.budget import Budget, Stalls
from anyrtd.runner.capture import Capture, LastLine, LineSink, Pipes, RunLogger
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


class _Flight:
    """An in-flight run: the stop signal (budget or interrupt) and completion."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        budget_s: float,
        clock: Clock,
        on_start: Callable[[float], None] | None,
    ) -> None:
        self.budget_s = budget_s
        self.stop: asyncio.Future[str] = loop.create_future()
        self.done = asyncio.Event()
        self.started_at: float | None = None
        self._clock = clock
        self._on_start = on_start

    def start(self) -> None:
        """Note that the program starts now: called just before the in-process call, or
        just before the command's process is spawned."""
        self.started_at = self._clock.now()
        if self._on_start is not None:
            self._on_start(self.started_at)

    def signal(self, why: str) -> None:
        if not self.stop.done():
            self.stop.set_result(why)


@dataclass(slots=True)
class Launch:
    """A run made ready to start (`Runner.ready`): all of it but its start (`Runner.go`)."""

    req: RunRequest
    on_start: Callable[[float], None] | None
    capture: Capture
    flight: _Flight
    program: Program | Exception | None
    """The program found, None when none is installed, or the runner's own failure."""
    call: Callable[[], Coroutine[Any, Any, Any]] | None
    """An in-process program's call, made a task when the run starts."""
    generation: int
    """The runner's `generation` it was made ready in."""


@dataclass
class _Ended:
    status: RunStatus
    error_type: str | None = None
    error: str | None = None
    result: dict[str, Any] = field(default_factory=dict)


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
    ) -> None:
        """`watch_stalls`: leave out of each run's budget the time the daemon was stopped
        (`anyrtd.runner.budget`); by default on the real clock only, as a test's fake clock
        moves by jumps that are no stalls."""
        if not timeout_s > 0:
            raise ValueError(f"run budget must be greater than 0 s, got {timeout_s!r}")
        self._client = client
        self._clock = clock
        self._agent_name = agent_name
        self._space = space
        self._programs = ProgramTable({**BUILTINS, **(extra_builtins or {})}, commands)
        self._timeout_s = timeout_s
        self._kill_grace_s = max(0.0, kill_grace_s)
        self._output_cap = output_cap
        self._flights: set[_Flight] = set()
        self._event_only: dict[str, str] = {}
        """Programs that run only on an event, and why (a run by hand can only fail)."""
        if watch_stalls is None:
            watch_stalls = isinstance(clock, SystemClock)
        self._stalls = Stalls(clock, watch=watch_stalls)
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

    def install(self, spec: str, main: ProgramFn, *, event_only: str | None = None) -> None:
        """Add an in-process built-in (the daemon's `internal:` programs) unless one exists.
        `event_only`: the program runs only on an event, and this says why (a run by hand
        of it is refused, `by_hand`)."""
        self._programs.install(spec, main)
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
        self, req: RunRequest, on_start: Callable[[float], None] | None = None
    ) -> RunOutcome:
        """Run one program to its end, under the budget; never raise for what the program does.

        The outcome's `started_at` is when the program was really started (the in-process
        call, or the command's spawn), and `on_start` is called with it at that moment; a
        program that never started (not installed, cannot be spawned) has the time the
        runner gave up. `duration_ms` is `ended_at - started_at`.
        """
        return await self.start(req, on_start)

    def start(
        self, req: RunRequest, on_start: Callable[[float], None] | None = None
    ) -> Coroutine[Any, Any, RunOutcome]:
        """Start one run now; return the coroutine that runs it to its end (as `run` does).

        An in-process program's call is created here as a task of its own, so runs started
        together begin at the loop's next turn, in the order started, each for the cost of
        creating its task; the budget and the rest of the run follow in the coroutine. A
        command is spawned when the coroutine first runs, each in the task that awaits it,
        none waiting for another. The coroutine must be awaited.
        """
        return self.go(self.ready(req, on_start))

    def ready(self, req: RunRequest, on_start: Callable[[float], None] | None = None) -> Launch:
        """Make one run ready to start (`go`): its capture, its program found, its context and
        its own copy of the args, but no task yet. A batch prepared ahead of its due time is
        made ready in its lead, so that at the due time each start costs its task alone."""
        capture = Capture(self._output_cap)
        flight = _Flight(asyncio.get_running_loop(), self._timeout_s, self._clock, on_start)
        program: Program | Exception | None
        call = None
        try:
            program = self.resolve(req.program)
            if program is not None and program.main is not None:
                call = self._call(program.main, req, capture, flight)
        except Exception as exc:  # a bug of the runner itself: reported by the coroutine
            program = exc
        return Launch(req, on_start, capture, flight, program, call, self.generation)

    def go(self, launch: Launch) -> Coroutine[Any, Any, RunOutcome]:
        """Start a run made ready (`ready`); return the coroutine that runs it to its end, as
        `start` does. A run made ready before the program table or the budget changed is
        made ready again first."""
        if launch.generation != self.generation:
            launch = self.ready(launch.req, launch.on_start)
        self._flights.add(launch.flight)
        launched: tuple[Program | None, asyncio.Task[Any] | None] | Exception
        if isinstance(launch.program, Exception):
            launched = launch.program
        elif launch.call is None:
            launched = (launch.program, None)
        else:
            try:
                task = asyncio.create_task(launch.call(), name=f"anyrtd-run-{launch.req.run_id}")
                launched = (launch.program, task)
            except Exception as exc:  # a bug of the runner itself: reported by the coroutine
                launched = exc
        return self._finish(launch.req, launched, launch.capture, launch.flight)

    async def _finish(
        self,
        req: RunRequest,
        launched: tuple[Program | None, asyncio.Task[Any] | None] | Exception,
        capture: Capture,
        flight: _Flight,
    ) -> RunOutcome:
        clock = self._clock
        try:
            if isinstance(launched, Exception):
                raise launched
            ended = await self._execute(req, *launched, capture, flight)
        except Exception as exc:  # a bug of the runner itself must still end the run
            log.exception("run %s: the runner failed", req.run_id)
            capture.add_line("".join(traceback.format_exception(exc)))
            ended = _Ended(
                RunStatus.FAILED,
                DAEMON_FAULT if out_of_descriptors(exc) else type(exc).__name__,
                f"anyrtd runner error: {one_line(str(exc), '')}",
            )
        finally:
            self._flights.discard(flight)
            flight.done.set()
        ended_at = clock.now()
        started_at = flight.started_at if flight.started_at is not None else ended_at
        ended_at = max(ended_at, started_at)
        error_type, error = _valid_or_none(ended.error_type), _valid_or_none(ended.error)
        if error_type != ended.error_type or error != ended.error:
            capture.add_line(f"anyrtd: the run's error: {REPLACED}")
        return RunOutcome(
            status=ended.status,
            error_type=error_type,
            error=error,
            started_at=started_at,
            ended_at=ended_at,
            duration_ms=duration_ms(started_at, ended_at),
            result=ended.result,
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
        self,
        req: RunRequest,
        program: Program | None,
        call: asyncio.Task[Any] | None,
        capture: Capture,
        flight: _Flight,
    ) -> _Ended:
        if program is None:
            return _Ended(
                RunStatus.FAILED, "ProgramNotFound", self._programs.not_found(req.program)
            )
        budget = Budget(self._clock, self._stalls, flight.budget_s, lambda: flight.signal("budget"))
        try:
            if program.command is not None:
                return await self._run_command(program, program.command, req, capture, flight)
            assert call is not None
            return await self._run_in_process(call, req, capture, flight)
        finally:
            budget.cancel()

    def _stopped(self, why: str, flight: _Flight) -> _Ended:
        if why == "budget":
            return _Ended(
                RunStatus.INCOMPLETE,
                "BudgetExceeded",
                f"ran past the run budget of {flight.budget_s:g} s and was stopped",
            )
        return _Ended(RunStatus.INTERRUPTED, None, "the daemon stopped this run")

    def _call(
        self, main: ProgramFn, req: RunRequest, capture: Capture, flight: _Flight
    ) -> Callable[[], Coroutine[Any, Any, Any]]:
        """Return the call of an in-process program, its context and args built (its task
        starts it at the loop's next turn)."""
        ctx = ProgramContext(
            run_id=req.run_id,
            trigger_id=req.trigger_id,
            scheduled_at=req.scheduled_at,
            device=req.device,
            agent_name=self._agent_name,
            space=self._space,
            log=RunLogger(f"anyrtd.programs.run.{req.run_id}", capture, _PROGRAM_LOG),
            client=self._client,
            clock=self._clock,
        )
        # A program gets its own copy: editing its args must not touch the daemon's record.
        args = _own_copy(req.args)

        async def call() -> Mapping[str, Any] | None:
            flight.start()
            value = main(args, ctx)
            if not inspect.isawaitable(value):
                raise TypeError(
                    f"program {req.program!r} returned {type(value).__name__} instead of an "
                    f"awaitable: define it as async def main(args, ctx)"
                )
            return await value

        return call

    async def _run_in_process(
        self, task: asyncio.Task[Any], req: RunRequest, capture: Capture, flight: _Flight
    ) -> _Ended:
        stopped: str | None = None
        try:
            await asyncio.wait(_futures(task, flight.stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                stopped = flight.stop.result() if flight.stop.done() else "cancelled"
                task.cancel()
                await self._settle(task, req)
        if stopped is not None:
            return self._stopped(stopped, flight)
        if task.cancelled():
            return _Ended(RunStatus.FAILED, "CancelledError", "the program was cancelled")
        exc = task.exception()
        if exc is not None:
            capture.add_line("".join(traceback.format_exception(exc)))
            kind = _error_type(exc)
            return _Ended(RunStatus.FAILED, kind, one_line(str(exc), kind))
        result, notes = normalize_result(task.result())
        for note in notes:
            capture.add_line(f"anyrtd: {note}")
        return _Ended(RunStatus.OK, result=result)

    async def _settle(self, task: asyncio.Task[Any], req: RunRequest) -> None:
        """Give a cancelled program the grace period to unwind; abandon it past that."""
        done, _ = await asyncio.wait({task}, timeout=self._kill_grace_s)
        if not done:
            log.warning(
                "run %s: program %s ignored cancellation for %g s; abandoning it",
                req.run_id,
                req.program,
                self._kill_grace_s,
            )
        elif not task.cancelled():
            task.exception()  # retrieved, so asyncio does not report it as never seen

    def _command_env(self, cmd: CommandProgram, req: RunRequest) -> dict[str, str]:
        # The notify variables are for the daemon alone: a child must not ping its watchdog.
        env = {**child_environ(os.environ), **cmd.env}
        env.update(
            ANYRTD_RUN_ID=req.run_id,
            ANYRTD_TRIGGER_ID=req.trigger_id or "",
            ANYRTD_SCHEDULED_AT="" if req.scheduled_at is None else repr(req.scheduled_at),
            ANYRTD_DEVICE=req.device,
            ANYRTD_SPACE=self._space,
            ANYRTD_SERVER=self._client.base_url,
            ANYRTD_AGENT_NAME=self._agent_name,
            ANYRTD_PROGRAM=req.program,
        )
        return env

    async def _run_command(
        self,
        program: Program,
        cmd: CommandProgram,
        req: RunRequest,
        capture: Capture,
        flight: _Flight,
    ) -> _Ended:
        payload = json.dumps(dict(req.args), default=str).encode() + b"\n"
        env = self._command_env(cmd, req)
        try:  # flight.start() is called just before the spawn (again, if it is retried)
            proc, out_r, err_r = await spawn_in_group(
                cmd.argv, cwd=cmd.cwd, env=env, before_spawn=flight.start, stop=flight.stop
            )
        except OutOfDescriptors as exc:  # the daemon's fault: not the program's
            if flight.stop.result() == "interrupt":
                return self._stopped("interrupt", flight)
            return _Ended(RunStatus.FAILED, DAEMON_FAULT, str(exc))
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in argv or env
            reason = getattr(exc, "strerror", None) or str(exc)
            return _Ended(
                RunStatus.FAILED,
                type(exc).__name__,
                f"cannot start command {cmd.argv[0]!r}: {reason}; check argv in the local "
                f'config\'s [programs."{program.spec}"] table',
            )
        pgid = proc.pid
        last_line = LastLine()
        pipes = Pipes()
        await pipes.connect(out_r, LineSink(capture, last_line))
        await pipes.connect(err_r, LineSink(capture))
        feeder = asyncio.create_task(feed_stdin(proc, payload))
        waiter = asyncio.create_task(proc.wait())
        why: str | None = None
        try:
            if req.on_spawn is not None:
                await req.on_spawn(pgid)
            await asyncio.wait(_futures(waiter, flight.stop), return_when=asyncio.FIRST_COMPLETED)
            why = None if waiter.done() else flight.stop.result()
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
            return self._stopped(why, flight)
        rc = waiter.result()
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
            return _Ended(RunStatus.OK, result=result)
        if rc == EX_TEMPFAIL:
            return _Ended(
                RunStatus.FAILED,
                SERVER_UNAVAILABLE,
                f"{exit_message(cmd.argv[0], rc)}: the program could not reach the any server",
                result,
            )
        return _Ended(RunStatus.FAILED, "ExitCode", exit_message(cmd.argv[0], rc), result)


EX_TEMPFAIL = 75
"""The exit status (sysexits.h) by which a command says the any server could not be reached."""


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
