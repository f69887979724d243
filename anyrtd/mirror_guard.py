"""Is this the mirror the state directory had? The marker, the file's identity, the faults.

A daemon that finds no mirror cannot tell a new device from one whose mirror was deleted:
starting afresh would lose the runs not yet recorded on the server, the outbox of writes
the server has not taken, and the `once` consumption not yet synced (so a `once` could
fire twice). So once a mirror holds state, a marker file beside it names the mirror's id
(kept in its `meta` table too). A start that finds the marker but the mirror missing,
empty or another one refuses until `anyrtd db rebuild` (or `anyrtd serve --rebuild-mirror`)
says to start afresh. The marker lives outside the SQLite file, and its name does not
start with the mirror's, so `rm anyrtd.sqlite3*` leaves it.

While the daemon runs, the mirror file's identity (st_dev, st_ino) is checked before each
use: a mirror deleted or replaced under it stops the daemon before it writes into a file
nobody will read again.

No SQL here: the mirror (`anyrtd.mirror`) reads the id from its table.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger("anyrtd.mirror")

MARKER_FILE = "anyrtd.mirror-id"
EXIT_BROKEN_STATE = 65
"""What `anyrtd serve` and `anyrtd db` exit with on a mirror fault (65, EX_DATAERR): a
restart would fail the same way, so the systemd units name it in RestartPreventExitStatus=."""
MIRROR_SIDECARS = ("", "-wal", "-shm", "-journal")
"""The files SQLite keeps for one database: the file itself and the ones named after it."""
REBUILD = "`anyrtd db rebuild` (with the same --state-dir)"
AT_RISK = (
    "runs not yet recorded on the server, the outbox of writes the server has not taken, "
    "and `once` consumption not yet synced (so a `once` may fire twice)"
)


class MirrorFault(Exception):
    """The mirror cannot be used as it is; the message names the file, the fault and the fix."""

    exit_status = EXIT_BROKEN_STATE


class MirrorLost(MirrorFault):
    """The state directory had a mirror, and it is missing, empty or another one."""


class MirrorCorrupt(MirrorFault):
    """The mirror file is damaged or not a SQLite database."""


class MirrorUnusable(MirrorFault):
    """The mirror cannot be opened or written (permissions, a read-only file system)."""


FileId = tuple[int, int]


def marker_path(mirror_path: Path) -> Path:
    return mirror_path.parent / MARKER_FILE


def read_marker(mirror_path: Path) -> str | None:
    """Return the id of the mirror the state directory had, or None if it never had one."""
    try:
        text = marker_path(mirror_path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MirrorUnusable(
            f"cannot read {marker_path(mirror_path)} ({exc.strerror}): give the user anyrtd "
            "runs as access to its state directory"
        ) from None
    lines = text.splitlines()
    return lines[0].strip() if lines and lines[0].strip() else "(unreadable)"


def write_marker(mirror_path: Path, mirror_id: str) -> None:
    """Write the marker naming `mirror_id`, durably (a new file renamed over the old)."""
    path = marker_path(mirror_path)
    tmp = path.with_name(path.name + ".new")
    text = (
        f"{mirror_id}\n"
        f"# The id of the mirror {mirror_path.name} in this directory (in its meta table too).\n"
        "# While this file is here, anyrtd refuses to start on a missing, empty or other mirror:\n"
        f"# {AT_RISK} would be lost. {REBUILD} starts afresh.\n"
    )
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lost(mirror_path: Path, what: str) -> MirrorLost:
    """Return the refusal for a state directory whose mirror `what` (is missing, is empty...)."""
    return MirrorLost(
        f"the mirror {mirror_path} {what}, but this state directory had one ({MARKER_FILE}): "
        f"starting afresh would lose {AT_RISK}. Restore the file from a backup, or run "
        f"{REBUILD} or `anyrtd serve --rebuild-mirror` to start afresh anyway"
    )


def file_id(path: Path) -> FileId | None:
    """Return the file's identity (st_dev, st_ino), or None when there is no file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def check_same_file(mirror_path: Path, opened: FileId) -> None:
    """Raise `MirrorLost` when the file at `mirror_path` is no longer the one opened."""
    now = file_id(mirror_path)
    if now == opened:
        return
    what = "was deleted" if now is None else "was replaced by another file"
    raise MirrorLost(
        f"the mirror {mirror_path} {what} while anyrtd ran: stopping before writing into "
        f"a file nobody will read. Restore it, or run {REBUILD} to start afresh (this loses "
        f"{AT_RISK})"
    )


def rebuild(mirror_path: Path, reason: str) -> str:
    """Move the mirror and its SQLite files aside and forget the marker; return what was done.

    Nothing is deleted: the old files keep their names with `.old-<UTC time>` added.
    """
    suffix = time.strftime(".old-%Y%m%dT%H%M%SZ", time.gmtime())
    moved: list[str] = []
    for tail in MIRROR_SIDECARS:
        src = mirror_path.with_name(mirror_path.name + tail)
        if src.exists():
            dst = mirror_path.with_name(mirror_path.name + suffix + tail)
            os.replace(src, dst)
            moved.append(dst.name)
    marker = marker_path(mirror_path)
    had_marker = marker.exists()
    marker.unlink(missing_ok=True)
    _fsync_dir(mirror_path.parent)
    kept = f"the old files are kept as {', '.join(moved)}" if moved else "there was no old file"
    forgot = f"; {MARKER_FILE} removed" if had_marker else ""
    done = (
        f"rebuilding the mirror {mirror_path} ({reason}): {kept}{forgot}; the next start makes "
        f"a new one from the server's records, and what only the old one held is lost: {AT_RISK}"
    )
    log.warning("%s", done)
    return done
