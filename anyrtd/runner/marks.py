"""A command's marks beside its run: the evidence of its spawn and its end, written by the
spawned side, which a restart after a crash reads.

A command is not spawned alone: the runner spawns a small supervisor (`SUPERVISOR`, a
POSIX shell script, about 1 ms of start cost: `bench/bench_supervisor.py`) at the head of
the run's process group, which

1. writes `<run id>.started` in the marks folder (`MARKS_DIR`, beside the mirror) before
   the command starts, and does not start it when it cannot (exit 125);
2. runs the command in the foreground, in the same process group (the budget, an
   interrupt and the leftovers at a restart stop the whole group, as before), surviving a
   SIGTERM of the group to see how the command ended;
3. writes the command's exit status to `<run id>.ended` (a temporary file renamed over it:
   a reader sees all of it or nothing), whose modification time is the end time;
4. exits as the command did (a command killed by a signal: the supervisor kills itself
   with that signal, so the runner reads the same status).

So a `.started` mark is written by the spawned side after the spawn, never by the daemon
before it, and a run with neither mark nor process never started; an `.ended` mark keeps a
command's outcome when the daemon died before it could record it. The marks of a run are
removed once its outcome is committed to the mirror; a restart removes those of every run
not left open.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MARKS_DIR = "anyrtd.runs"
"""The marks folder's name, beside the mirror."""
STARTED = ".started"
ENDED = ".ended"

NOT_FOUND_STATUS = 127
"""The supervisor's exit status when the command's executable does not exist (not started)."""
NOT_EXECUTABLE_STATUS = 126
"""... when it is not executable (not started)."""
NO_MARK_STATUS = 125
"""... when the start mark could not be written (not started: a crash could not tell)."""

# The signals a command can die of, as the shell's 128+N status: the supervisor dies of the
# same one (the stopping and ignored-by-default signals are not among them).
_LETHAL = "|".join(str(128 + n) for n in (*range(1, 16), 24, 25, 26, 27, 29, 30, 31))

SUPERVISOR = f"""m=$1; shift
case $1 in */*) [ -e "$1" ] || exit {NOT_FOUND_STATUS}; [ -x "$1" ] || exit \
{NOT_EXECUTABLE_STATUS};; *) command -v "$1" >/dev/null || exit {NOT_FOUND_STATUS};; esac
printf '' 2>/dev/null >"$m{STARTED}" || exit {NO_MARK_STATUS}
trap : TERM
"$@"
s=$?
printf '%s\\n' "$s" 2>/dev/null >"$m.t" && mv -f "$m.t" "$m{ENDED}"
case $s in {_LETHAL}) trap - TERM; ulimit -c 0; kill -$((s - 128)) $$;; esac
exit "$s"
"""
"""The supervisor, run as `sh -c SUPERVISOR anyrtd-run <marks prefix> argv...`."""


@dataclass(frozen=True, slots=True)
class Ended:
    """A command's end as its supervisor noted it."""

    status: int
    """The shell's status: the exit status, or 128 + the signal that killed it."""
    at: float
    """When it was noted (the mark's modification time)."""


@dataclass(frozen=True, slots=True)
class Found:
    """What a run's marks say: whether its command was spawned, and how it ended."""

    started_at: float | None
    """When the supervisor noted the start (None: no start mark)."""
    ended: Ended | None


class Marks:
    """The marks folder: where the supervisor writes, what a restart reads."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def open(self) -> None:
        """Make the folder (the daemon opens its mirror)."""
        self.folder.mkdir(mode=0o700, exist_ok=True)

    def prefix(self, run_id: str) -> str:
        """Return the path the supervisor adds `.started` and `.ended` to."""
        return os.path.join(self.folder, run_id)

    def started(self, run_id: str) -> bool:
        """Return whether the supervisor of `run_id` wrote its start mark."""
        return os.path.exists(self.prefix(run_id) + STARTED)

    def read(self, run_id: str) -> Found:
        """Return what the marks of `run_id` say."""
        prefix = self.prefix(run_id)
        try:
            started_at: float | None = os.stat(prefix + STARTED).st_mtime
        except OSError:
            started_at = None
        ended = None
        try:
            with open(prefix + ENDED, "rb") as fh:
                at = os.fstat(fh.fileno()).st_mtime
                text = fh.read(32)
            ended = Ended(int(text.strip()), at)
        except (OSError, ValueError):
            pass
        return Found(started_at, ended)

    def clear(self, run_id: str) -> None:
        """Remove the marks of `run_id` (its outcome is in the mirror)."""
        prefix = self.prefix(run_id)
        for suffix in (STARTED, ENDED, ".t"):
            with contextlib.suppress(OSError):
                os.unlink(prefix + suffix)

    def sweep(self, keep: Iterable[str]) -> int:
        """Remove every mark but those of the runs in `keep`; return how many went."""
        kept = set(keep)
        gone = 0
        try:
            names = os.listdir(self.folder)
        except OSError:
            return 0
        for name in names:
            if name.partition(".")[0] in kept:
                continue
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.folder, name))
                gone += 1
        return gone


__all__ = [
    "ENDED",
    "MARKS_DIR",
    "NOT_EXECUTABLE_STATUS",
    "NOT_FOUND_STATUS",
    "NO_MARK_STATUS",
    "STARTED",
    "SUPERVISOR",
    "Ended",
    "Found",
    "Marks",
]
