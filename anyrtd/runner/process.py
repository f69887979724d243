"""A command program's process group: its stdin, how it ended, and stopping all of it.

A command starts in a process group of its own (`start_new_session`), so the budget, an
interrupt or the end of the run can stop everything it started, grandchildren included,
as systemd does with a oneshot service's leftovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence

log = logging.getLogger("anyrtd.runner")

KILL_WAIT_S = 5.0
"""How long to wait for a process group to empty after SIGKILL before giving up on it."""
_POLL_S = 0.02


def _pipes() -> tuple[int, int, int, int]:
    """Return two fresh pipes, stdout's and stderr's: (read, write, read, write)."""
    out_r, out_w = os.pipe()
    try:
        err_r, err_w = os.pipe()
    except OSError:
        os.close(out_r)
        os.close(out_w)
        raise
    return out_r, out_w, err_r, err_w


async def _spawn(
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    pipes: tuple[int, int, int, int],
) -> tuple[asyncio.subprocess.Process, int, int]:
    """Spawn `argv` on the given stdout and stderr pipes (read, write, read, write); the
    write ends are closed whatever happens, the read ends too if it cannot start."""
    out_r, out_w, err_r, err_w = pipes
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=out_w,
            stderr=err_w,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,  # its own process group: the budget kills all of it
        )
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return proc, out_r, err_r


OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
"""The errors of a process (EMFILE) or of the system (ENFILE) out of file descriptors."""
SPAWN_RETRY_S = (0.05, 1.0)
"""The first and the longest wait between two tries to start a command while out of them."""


def out_of_descriptors(exc: BaseException) -> bool:
    """Return whether `exc` says the daemon (or the system) is out of file descriptors."""
    return isinstance(exc, OSError) and exc.errno in OUT_OF_DESCRIPTORS


class OutOfDescriptors(Exception):
    """The daemon had no file descriptor to start a command with until its run was stopped."""


async def spawn_in_group(
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    before_spawn: Callable[[], None],
    stop: asyncio.Future[str],
) -> tuple[asyncio.subprocess.Process, int, int]:
    """Start `argv` in a process group of its own, stdout and stderr on fresh pipes, and
    call `before_spawn` just before the spawn.

    Return the process and the read ends of its stdout and stderr pipes (the caller owns
    them); raise OSError or ValueError (a NUL byte in argv or env) if it cannot start.
    When the daemon is out of file descriptors (EMFILE, ENFILE: its own fault, not the
    program's), wait and try again, until `stop` is done (the budget or an interrupt);
    raise `OutOfDescriptors` then. The wait is in real time: it waits on the system.
    """
    wait = SPAWN_RETRY_S[0]
    tries = 0
    while True:
        try:
            pipes = _pipes()  # first: taking them is what usually fails, before the start
            before_spawn()
            return await _spawn(argv, cwd=cwd, env=env, pipes=pipes)
        except OSError as exc:
            if not out_of_descriptors(exc):
                raise
            tries += 1
            if tries == 1:
                log.warning(
                    "cannot start %r: the daemon is out of file descriptors (%s); "
                    "trying again until the run's budget is spent",
                    argv[0],
                    exc.strerror,
                )
            await asyncio.wait({stop}, timeout=wait)
            if stop.done():
                raise OutOfDescriptors(
                    f"the daemon was out of file descriptors ({exc.strerror}) for the whole "
                    f"run and could not start {argv[0]!r} ({tries} tries); the program was "
                    "not at fault: raise LimitNOFILE= (docs/service.md)"
                ) from exc
            wait = min(2 * wait, SPAWN_RETRY_S[1])


async def feed_stdin(proc: asyncio.subprocess.Process, payload: bytes) -> None:
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


def exit_message(argv0: str, returncode: int) -> str:
    """Return how a command that did not succeed ended: its exit status or the signal."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"command {argv0!r} was killed by {name}"
    return f"command {argv0!r} exited with status {returncode}"


def group_members(pgid: int) -> int:
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
    return sum(1 for name in entries if name.isdigit() and _live_group(name) == pgid)


def _live_group(pid: str) -> int | None:
    """Return the process group of a live (non-zombie) process, from /proc; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # past the command name, which may hold ")"
    if len(fields) < 3 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[2])


async def _wait_group_empty(pgid: int, seconds: float) -> bool:
    # Real time on purpose: this waits on the operating system, not on the schedule,
    # and must end even under a fake clock.
    deadline = time.monotonic() + seconds
    while group_members(pgid) != 0:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def kill_group(pgid: int, grace_s: float) -> int:
    """Empty process group `pgid`: SIGTERM, then SIGKILL after `grace_s`; return how many lived."""
    members = group_members(pgid)
    if members == 0:
        return 0
    _signal_group(pgid, signal.SIGTERM)
    if await _wait_group_empty(pgid, grace_s):
        return members
    _signal_group(pgid, signal.SIGKILL)
    if not await _wait_group_empty(pgid, KILL_WAIT_S):
        log.error("process group %d still has live members %g s after SIGKILL", pgid, KILL_WAIT_S)
    return members


_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _boot_id() -> str | None:
    try:
        with open(_BOOT_ID) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """Return what tells process `pid` from a later one given the same id: `BOOT:START`.

    BOOT is the kernel's boot id, START the process's start time in clock ticks since boot
    (field 22 of /proc/PID/stat). None where /proc does not say (not Linux, or no such pid).
    """
    boot = _boot_id()
    if boot is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces and parentheses): state is
    # field 3, so the start time, field 22, is the 20th.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        return None
    return f"{boot}:{int(fields[19])}"


def leftover_group(pgid: int, started: str | None) -> bool:
    """Return whether process group `pgid`, whose leader started as `started`, still runs.

    A group whose leader is still the same process is it; one whose leader has exited may
    still hold its other members (the kernel gives no new process that id while they live),
    unless the machine was restarted since. A leader id now taken by another process, or a
    group whose start is unknown, is not it.
    """
    if started is None:
        return False
    now = process_start(pgid)
    if now is not None:
        return now == started
    boot = _boot_id()
    return boot is not None and started.partition(":")[0] == boot and group_members(pgid) != 0


RUN_ID_VAR = b"ANYRTD_RUN_ID="


def _run_id(pid: int | str) -> str | None:
    """Return the `ANYRTD_RUN_ID` in process `pid`'s environment, if any."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(RUN_ID_VAR):
            return entry[len(RUN_ID_VAR) :].decode(errors="replace")
    return None


def run_groups(run_ids: Collection[str]) -> dict[str, set[int]]:
    """Return the process groups of the processes whose environment names one of `run_ids`.

    For runs whose group was not kept (a crash between the start of a command and that
    write): the runner gives each command `ANYRTD_RUN_ID`. A group counts when its leader
    carries the same run id, or has exited; a process that joined a stranger's group does
    not bring that group in. One pass over /proc; empty where /proc does not say.
    """
    wanted = set(run_ids)
    found: dict[str, set[int]] = {}
    if not wanted:
        return found
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    own = os.getpgrp()
    for name in entries:
        if not name.isdigit() or (run_id := _run_id(name)) not in wanted:
            continue
        pgid = _live_group(name)
        if pgid is None or pgid == own:
            continue
        if pgid == int(name) or not os.path.exists(f"/proc/{pgid}") or _run_id(pgid) == run_id:
            found.setdefault(run_id, set()).add(pgid)
    return found
