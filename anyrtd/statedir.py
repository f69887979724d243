"""One daemon per state directory: an exclusive lock, taken for the life of the process.

Two daemons on one mirror would both fire everything. So `anyrtd serve`, `anyrtd dev`,
`anyrtd db upgrade` and `anyrtd db rebuild` take an exclusive `flock` on `anyrtd.lock` in
the state directory before they open anything (the mirror, the control API socket, the
devserver), and keep it until the process ends; the kernel releases it however the process
ends, kill -9 included, so a stale lock cannot be left behind. The file holds the lock owner's
pid, which the refusal names. Its descriptor is not inherited by the programs the runner
starts, so a program that outlives its daemon does not keep the directory locked.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "anyrtd.lock"
LOCK_OWNER_WAIT_S = 1.0
"""How long to wait for the lock owner's pid: it writes it just after it takes the lock."""

_locked: dict[Path, int] = {}
"""The state directories this process holds, with the lock file's descriptor."""


class StateDirError(Exception):
    """The state directory cannot be locked; the message says why and what to do."""


class StateDirBusy(StateDirError):
    """Another process holds the state directory; the message names it."""


def lock_state_dir(state_dir: Path) -> None:
    """Hold `state_dir` for the rest of this process, or raise `StateDirBusy` at once.

    Holding a directory this process already holds is a no-op.
    """
    key = state_dir.resolve()
    if key in _locked:
        return
    path = key / LOCK_FILE
    try:
        key.mkdir(parents=True, exist_ok=True)
        # O_CLOEXEC (Python's default, spelled out): programs the runner starts must not
        # inherit the lock.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StateDirError(f"cannot lock the state directory {key}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _lock_owner(fd)
        os.close(fd)
        raise StateDirBusy(
            f"the state directory {key} is in use by {owner}: stop that daemon first, "
            "or give this one a state directory of its own (--state-dir)"
        ) from None
    except OSError as exc:
        os.close(fd)
        raise StateDirError(f"cannot lock {path}: {exc.strerror}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    if os.geteuid() == 0:
        _give_to_directory_owner(key, fd)
    _locked[key] = fd


def _give_to_directory_owner(directory: Path, fd: int) -> None:
    """Give the lock file the state directory's owner, as SQLite does with the files it makes.

    Otherwise a lock file made by `sudo anyrtd db upgrade` would be root's, and the
    service's own user could no longer open it.
    """
    owner = os.stat(directory)
    mine = os.fstat(fd)
    if (mine.st_uid, mine.st_gid) != (owner.st_uid, owner.st_gid):
        os.fchown(fd, owner.st_uid, owner.st_gid)


def _lock_owner(fd: int) -> str:
    """Return who holds the lock on `fd`'s file, as its pid, for the refusal."""
    deadline = time.monotonic() + LOCK_OWNER_WAIT_S
    while True:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text.isdigit():
            return f"another anyrtd (pid {text})"
        if time.monotonic() > deadline:
            return "another anyrtd (its pid is not recorded)"
        time.sleep(0.02)
