"""The runner: resolve a program spec, run it under the budget, and report an honest outcome.

A run ends in one of four ways (`docs/programs.md`, How a run ends): `ok`, `FAILED`
(the program raised, exited non-zero, or is not installed here), `incomplete`
(it ran past the budget and was stopped) or `interrupted` (the daemon stopped
it). `Runner.run` never raises for anything a program does; it always returns a
`RunOutcome`.

Programs come from three places, in order: the built-ins shipped with anyrtd
(plus in-process ones the daemon adds), the `anyrtd.programs` entry-point group,
and the command table of the local config. A spec is only ever a lookup key: a
synced record cannot make a device run anything that is not installed or
declared on that device.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import importlib.metadata
import inspect
import json
import logging
import math
import os
import signal
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from anyrtd.client import ServerClient
from anyrtd.clock import Clock
from anyrtd.config import CommandProgram
from anyrtd.notify import child_environ
from anyrtd.program import ProgramContext, ProgramFn, RunOutcome, RunRequest, Status
from anyrtd.programs import BUILTINS

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "anyrtd.programs"


_PROGRAM_LOG = logging.getLogger("anyrtd.programs")
# A stdout line longer than this cannot be the JSON result; keeps memory bounded.
_RESULT_LINE_LIMIT = 256 * 1024
# A partial line longer than this is flushed to the capture without waiting for its newline.
_PARTIAL_LINE_LIMIT = 64 * 1024
# How long to wait for a process group to empty after SIGKILL before giving up on it.
_KILL_WAIT_S = 5.0
# How long to wait for the output pipes to reach EOF once the program's process is gone.
_DRAIN_WAIT_S = 2.0
_POLL_S = 0.02


@dataclass(frozen=True)
class Program:
    """A resolved program: an in-process `main` or a declared command."""

    spec: str
    source: Literal["builtin", "entry_point", "command"]
    origin: str
    main: ProgramFn | None = None
    command: CommandProgram | None = None


# Result normalization: only the agent_runs fields a program may report, well typed.
_COUNT_KEYS = ("turns", "cells", "effects", "mutations")
_TOKEN_KEYS = ("in", "out", "cacheRead", "cacheWrite")
_TEXT_LIMIT = 500


def normalize_result(raw: Any) -> tuple[dict[str, Any], list[str]]:
    """Return the well-typed run fields of a program's result, and a note per value dropped."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [f"result ignored: expected an object, got {type(raw).__name__}"]
    out: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in raw.items():
        if key in ("fuel", "costUsd"):
            if _is_number(value) and value >= 0:
                out[key] = value
                continue
        elif key in _COUNT_KEYS:
            if _is_int(value) and value >= 0:
                out[key] = value
                continue
        elif key in ("model", "title"):
            if isinstance(value, str) and value:
                out[key] = value[:_TEXT_LIMIT]
                continue
        elif key == "tokens":
            if isinstance(value, Mapping):
                tokens = {k: v for k, v in value.items() if k in _TOKEN_KEYS}
                if tokens and all(_is_int(v) and v >= 0 for v in tokens.values()):
                    out[key] = tokens
                    continue
        else:
            notes.append(f"result key {key!r} ignored: not a run field")
            continue
        notes.append(f"result key {key!r} ignored: bad value {value!r:.80}")
    return out, notes


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_line(text: str, fallback: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else fallback
    return line if len(line) <= _TEXT_LIMIT else line[: _TEXT_LIMIT - 1] + "…"


class _Capture:
    """The run's captured output: bytes up to the cap, the rest counted and dropped."""

    def __init__(self, cap: int) -> None:
        self._buf = bytearray()
        self._cap = max(0, cap)
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self._cap - len(self._buf)
        if self.dropped == 0 and len(data) <= room:
            self._buf += data
            return
        # Once anything is dropped, everything after is dropped too: the kept
        # output stays a true prefix of what the program wrote.
        if self.dropped == 0 and room > 0:
            self._buf += data[:room]
            self.dropped += len(data) - room
        else:
            self.dropped += len(data)

    def add_line(self, text: str) -> None:
        self.add(text.rstrip("\n").encode("utf-8", "replace") + b"\n")

    def text(self) -> str:
        buf = bytes(self._buf)
        if self.dropped:
            buf = _utf8_whole(buf)
        return buf.decode("utf-8", "replace")


def _utf8_whole(buf: bytes) -> bytes:
    """Drop a UTF-8 sequence cut short at the end of `buf` (the cap can fall inside one)."""
    for back in range(1, min(4, len(buf)) + 1):
        byte = buf[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: keep looking for the lead
            continue
        if byte & 0x80 == 0:
            return buf
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return buf if back >= need else buf[:-back]
    return buf


class _LineSink:
    """Feed one output stream into the shared capture a whole line at a time."""

    def __init__(self, capture: _Capture, last_line: _LastLine | None = None) -> None:
        self._capture = capture
        self._pending = b""
        self._last_line = last_line

    def feed(self, data: bytes) -> None:
        if self._last_line is not None:
            self._last_line.feed(data)
        data = self._pending + data
        cut = data.rfind(b"\n")
        if cut >= 0:
            self._capture.add(data[: cut + 1])
            data = data[cut + 1 :]
        if len(data) > _PARTIAL_LINE_LIMIT:
            self._capture.add(data)
            data = b""
        self._pending = data

    def close(self) -> None:
        if self._pending:
            self._capture.add(self._pending + b"\n")
            self._pending = b""


class _LastLine:
    """Track the last non-blank line of a stream, without holding the stream."""

    def __init__(self, limit: int = _RESULT_LINE_LIMIT) -> None:
        self._limit = limit
        self._current = bytearray()
        self._too_long = False
        self.last: bytes | None = None

    def feed(self, data: bytes) -> None:
        parts = data.split(b"\n")
        for i, part in enumerate(parts):
            if not self._too_long:
                if len(self._current) + len(part) > self._limit:
                    self._too_long = True
                    self._current.clear()
                else:
                    self._current += part
            if i < len(parts) - 1:
                self._end_line()

    def _end_line(self) -> None:
        if self._too_long:
            self.last = None
        elif self._current.strip():
            self.last = bytes(self._current)
        self._current.clear()
        self._too_long = False

    def finish(self) -> bytes | None:
        if self._current or self._too_long:
            self._end_line()
        return self.last


class _PipeReader(asyncio.Protocol):
    """Read one output pipe as data arrives, so a chatty program never blocks on a full pipe."""

    def __init__(self, sink: _LineSink, closed: asyncio.Future[None]) -> None:
        self._sink = sink
        self._closed = closed

    def data_received(self, data: bytes) -> None:
        self._sink.feed(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._sink.close()
        if not self._closed.done():
            self._closed.set_result(None)


class _RunLogHandler(logging.Handler):
    """Copy a run logger's lines into the run's capture."""

    def __init__(self, capture: _Capture) -> None:
        super().__init__(logging.DEBUG)
        self._capture = capture
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._capture.add_line(self.format(record))
        except Exception:
            self.handleError(record)


class _Flight:
    """An in-flight run: the stop signal (budget or interrupt) and completion."""

    def __init__(self, loop: asyncio.AbstractEventLoop, budget_s: float) -> None:
        self.budget_s = budget_s
        self.stop: asyncio.Future[str] = loop.create_future()
        self.done = asyncio.Event()

    def signal(self, why: str) -> None:
        if not self.stop.done():
            self.stop.set_result(why)


@dataclass
class _Ended:
    status: Status
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
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"run budget must be greater than 0 s, got {timeout_s!r}")
        self._client = client
        self._clock = clock
        self._agent_name = agent_name
        self._space = space
        self._commands = dict(commands)
        self._timeout_s = timeout_s
        self._kill_grace_s = max(0.0, kill_grace_s)
        self._output_cap = output_cap
        self._builtins: dict[str, ProgramFn] = {**BUILTINS, **(extra_builtins or {})}
        self._entry_points: dict[str, importlib.metadata.EntryPoint] | None = None
        self._resolved: dict[str, Program] = {}
        self._load_errors: dict[str, str] = {}
        self._flights: set[_Flight] = set()

    @property
    def in_flight(self) -> int:
        """Return how many runs are executing now."""
        return len(self._flights)

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

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
        if commands is not None:
            self._commands = dict(commands)
            self._resolved = {k: p for k, p in self._resolved.items() if p.source != "command"}
        self.rescan_entry_points()

    # resolution

    def resolve(self, spec: str) -> Program | None:
        """Return the program installed here under `spec`, or None."""
        found = self._resolved.get(spec)
        if found is not None:
            return found
        fn = self._builtins.get(spec)
        if fn is not None:
            origin = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
            found = Program(spec, "builtin", origin, main=fn)
        elif (ep := self._entry_point(spec)) is not None:
            found = self._load_entry_point(spec, ep)
        # A broken entry point does not hide a command the local config declares.
        if found is None and (cmd := self._commands.get(spec)) is not None:
            found = Program(spec, "command", cmd.argv[0], command=cmd)
        if found is not None:
            self._resolved[spec] = found
        return found

    def install(self, spec: str, main: ProgramFn) -> None:
        """Add an in-process built-in (the daemon's `internal:` programs) unless one exists."""
        if spec not in self._builtins:
            self._builtins[spec] = main
            self._resolved.pop(spec, None)

    def is_installed(self, spec: str) -> bool:
        """Return whether `spec` names a program this device can run."""
        return self.resolve(spec) is not None

    def rescan_entry_points(self) -> None:
        """Forget the entry-point index so newly installed packages are seen."""
        self._entry_points = None
        self._load_errors.clear()
        self._resolved = {k: p for k, p in self._resolved.items() if p.source != "entry_point"}

    def _entry_point(self, spec: str) -> importlib.metadata.EntryPoint | None:
        if self._entry_points is None:
            index: dict[str, importlib.metadata.EntryPoint] = {}
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                # The first distribution on sys.path wins, as for console scripts.
                index.setdefault(ep.name, ep)
            self._entry_points = index
        return self._entry_points.get(spec)

    def _load_entry_point(self, spec: str, ep: importlib.metadata.EntryPoint) -> Program | None:
        if spec in self._load_errors:
            return None
        try:
            main = ep.load()
        except Exception as exc:
            self._load_errors[spec] = (
                f"its entry point {ep.value} (group {ENTRY_POINT_GROUP}) failed to load: "
                f"{type(exc).__name__}: {_one_line(str(exc), 'no message')}"
            )
            log.warning("program %s: %s", spec, self._load_errors[spec])
            return None
        if not callable(main):
            self._load_errors[spec] = (
                f"its entry point {ep.value} is a {type(main).__name__}, not an "
                f"async function main(args, ctx)"
            )
            log.warning("program %s: %s", spec, self._load_errors[spec])
            return None
        return Program(spec, "entry_point", ep.value, main=main)

    def _not_found(self, spec: str) -> str:
        if spec in self._load_errors:
            return f"program {spec!r} is not usable on this device: {self._load_errors[spec]}"
        return (
            f"program {spec!r} is not installed on this device: it is not a built-in, no "
            f"package provides it in the entry-point group {ENTRY_POINT_GROUP!r}, and the local "
            f'config has no [programs."{spec}"] table'
        )

    # running

    async def run(self, req: RunRequest) -> RunOutcome:
        """Run one program to its end, under the budget; never raise for what the program does."""
        clock = self._clock
        started_at = clock.now()
        t0 = clock.monotonic()
        capture = _Capture(self._output_cap)
        flight = _Flight(asyncio.get_running_loop(), self._timeout_s)
        self._flights.add(flight)
        try:
            ended = await self._execute(req, capture, flight)
        except Exception as exc:  # a bug of the runner itself must still end the run
            log.exception("run %s: the runner failed", req.run_id)
            capture.add_line("".join(traceback.format_exception(exc)))
            ended = _Ended(
                "FAILED", type(exc).__name__, f"anyrtd runner error: {_one_line(str(exc), '')}"
            )
        finally:
            self._flights.discard(flight)
            flight.done.set()
        ended_at = clock.now()
        return RunOutcome(
            status=ended.status,
            error_type=ended.error_type,
            error=ended.error,
            started_at=started_at,
            ended_at=max(ended_at, started_at),
            duration_ms=max(0, round((clock.monotonic() - t0) * 1000)),
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

    async def _execute(self, req: RunRequest, capture: _Capture, flight: _Flight) -> _Ended:
        program = self.resolve(req.program)
        if program is None:
            return _Ended("FAILED", "ProgramNotFound", self._not_found(req.program))
        budget = asyncio.create_task(self._budget(flight))
        try:
            if program.command is not None:
                return await self._run_command(program, program.command, req, capture, flight)
            assert program.main is not None
            return await self._run_in_process(program.main, req, capture, flight)
        finally:
            budget.cancel()

    async def _budget(self, flight: _Flight) -> None:
        await self._clock.sleep(flight.budget_s)
        flight.signal("budget")

    def _stopped(self, why: str, flight: _Flight) -> _Ended:
        if why == "budget":
            return _Ended(
                "incomplete",
                "BudgetExceeded",
                f"ran past the run budget of {flight.budget_s:g} s and was stopped",
            )
        return _Ended("interrupted", None, "the daemon stopped this run")

    def _run_logger(self, req: RunRequest, capture: _Capture) -> logging.Logger:
        # Not registered with logging's manager, so it goes away with the run; its
        # lines still reach the daemon's handlers through the parent.
        logger = logging.Logger(f"anyrtd.programs.run.{req.run_id}", logging.INFO)
        logger.parent = _PROGRAM_LOG
        logger.addHandler(_RunLogHandler(capture))
        return logger

    async def _run_in_process(
        self, main: ProgramFn, req: RunRequest, capture: _Capture, flight: _Flight
    ) -> _Ended:
        ctx = ProgramContext(
            run_id=req.run_id,
            trigger_id=req.trigger_id,
            scheduled_at=req.scheduled_at,
            device=req.device,
            agent_name=self._agent_name,
            space=self._space,
            log=self._run_logger(req, capture),
            client=self._client,
            clock=self._clock,
        )
        # A program gets its own copy: editing its args must not touch the daemon's record.
        args = copy.deepcopy(dict(req.args))

        async def call() -> Mapping[str, Any] | None:
            value = main(args, ctx)
            if not inspect.isawaitable(value):
                raise TypeError(
                    f"program {req.program!r} returned {type(value).__name__} instead of an "
                    f"awaitable: define it as async def main(args, ctx)"
                )
            return await value

        task = asyncio.create_task(call(), name=f"anyrtd-run-{req.run_id}")
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
            return _Ended("FAILED", "CancelledError", "the program was cancelled")
        exc = task.exception()
        if exc is not None:
            capture.add_line("".join(traceback.format_exception(exc)))
            return _Ended("FAILED", type(exc).__name__, _one_line(str(exc), type(exc).__name__))
        result, notes = normalize_result(task.result())
        for note in notes:
            capture.add_line(f"anyrtd: {note}")
        return _Ended("ok", result=result)

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
        capture: _Capture,
        flight: _Flight,
    ) -> _Ended:
        loop = asyncio.get_running_loop()
        payload = json.dumps(dict(req.args), default=str).encode() + b"\n"
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=out_w,
                stderr=err_w,
                cwd=cmd.cwd,
                env=self._command_env(cmd, req),
                start_new_session=True,  # its own process group: the budget kills all of it
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in argv or env
            for fd in (out_r, err_r):
                os.close(fd)
            reason = getattr(exc, "strerror", None) or str(exc)
            return _Ended(
                "FAILED",
                type(exc).__name__,
                f"cannot start command {cmd.argv[0]!r}: {reason}; check argv in the local "
                f'config\'s [programs."{program.spec}"] table',
            )
        finally:
            os.close(out_w)
            os.close(err_w)
        pgid = proc.pid
        last_line = _LastLine()
        closed: list[asyncio.Future[None]] = []
        transports: list[asyncio.ReadTransport] = []
        for fd, tail in ((out_r, last_line), (err_r, None)):
            fut: asyncio.Future[None] = loop.create_future()
            sink = _LineSink(capture, tail)
            transport, _ = await loop.connect_read_pipe(
                functools.partial(_PipeReader, sink, fut),
                os.fdopen(fd, "rb", buffering=0),
            )
            closed.append(fut)
            transports.append(transport)
        feeder = asyncio.create_task(_feed_stdin(proc, payload))
        waiter = asyncio.create_task(proc.wait())
        why: str | None = None
        try:
            await asyncio.wait(_futures(waiter, flight.stop), return_when=asyncio.FIRST_COMPLETED)
            why = None if waiter.done() else flight.stop.result()
        finally:
            # On budget, interrupt, or our own cancellation: nothing of the group survives.
            # After a normal exit, whatever the program left in its group goes too, as
            # systemd does with a oneshot service's leftovers.
            killed = await _kill_group(pgid, self._kill_grace_s)
            if killed and why is None and waiter.done():
                capture.add_line(
                    f"anyrtd: the program exited leaving {killed} process(es) in its group; "
                    "they were terminated"
                )
            if not waiter.done():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(waiter), _KILL_WAIT_S)
            await asyncio.wait(closed, timeout=_DRAIN_WAIT_S)
            for transport in transports:
                transport.close()
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
            return _Ended("ok", result=result)
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            message = f"command {cmd.argv[0]!r} was killed by {name}"
        else:
            message = f"command {cmd.argv[0]!r} exited with status {rc}"
        return _Ended("FAILED", "ExitCode", message, result)


def _futures(*futs: asyncio.Future[Any]) -> set[asyncio.Future[Any]]:
    return set(futs)


async def _feed_stdin(proc: asyncio.subprocess.Process, payload: bytes) -> None:
    """Write the args to the program's stdin and close it; a program may ignore them."""
    stdin = proc.stdin
    if stdin is None:
        return
    try:
        stdin.write(payload)
        await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        stdin.close()


def _group_members(pgid: int) -> int:
    """Return how many live (non-zombie) processes are in group `pgid`; -1 if unknowable."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return 0
    except PermissionError:
        return -1  # a member runs as another user: alive, and we cannot inspect it
    # killpg also reaches zombies, which nobody may reap where pid 1 is not an init;
    # /proc tells a zombie from a live process.
    try:
        entries = os.listdir("/proc")
    except OSError:
        return -1
    alive = 0
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            alive += 1
    return alive


async def _wait_group_empty(pgid: int, seconds: float) -> bool:
    # Real time on purpose: this waits on the operating system, not on the schedule,
    # and must end even under a fake clock.
    deadline = time.monotonic() + seconds
    while _group_members(pgid) != 0:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _kill_group(pgid: int, grace_s: float) -> int:
    """Empty process group `pgid`: SIGTERM, then SIGKILL after `grace_s`; return how many lived."""
    members = _group_members(pgid)
    if members == 0:
        return 0
    _signal_group(pgid, signal.SIGTERM)
    if await _wait_group_empty(pgid, grace_s):
        return members
    _signal_group(pgid, signal.SIGKILL)
    if not await _wait_group_empty(pgid, _KILL_WAIT_S):
        log.error("process group %d still has live members %g s after SIGKILL", pgid, _KILL_WAIT_S)
    return members
