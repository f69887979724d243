"""One daemon per state directory: the lock that keeps a second one from double-firing."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import wait_until

from anyrtd.statedir import LOCK_FILE, StateDirBusy, lock_state_dir


@pytest.fixture
def first(tmp_path: Path, devserver: DevserverProcess) -> Iterator[ServeProcess]:
    """A real `anyrtd serve` on a devserver, holding its state directory."""
    serve = ServeProcess(tmp_path, devserver.url, name="first").start()
    try:
        yield serve
    finally:
        serve.stop()


def refusal(serve: ServeProcess) -> str:
    """Return the one line a command refused for `serve`'s state directory prints."""
    assert serve.proc is not None
    return (
        f"Error: the state directory {serve.state.resolve()} is in use by another anyrtd "
        f"(pid {serve.proc.pid}): stop that daemon first, or give this one a state directory "
        "of its own (--state-dir)"
    )


def test_a_second_serve_on_a_state_directory_in_use_exits_naming_the_first(
    first: ServeProcess, devserver: DevserverProcess, tmp_path: Path
) -> None:
    second = ServeProcess(tmp_path, devserver.url, name="second")
    second.state = first.state
    done = subprocess.run(second.argv(), capture_output=True, text=True, timeout=60)

    assert done.returncode == 1
    assert done.stderr.splitlines() == [refusal(first)]
    # Nothing was opened: no control socket, and the first daemon goes on as before.
    assert not (tmp_path / "second.sock").exists()
    assert first._ticking()


def test_dev_and_db_upgrade_on_a_state_directory_in_use_open_nothing(
    first: ServeProcess, tmp_path: Path
) -> None:
    args = ["--state-dir", str(first.state), "--port", "0", "--no-sample"]
    listen = ["--listen", f"unix:{tmp_path / 'dev.sock'}"]
    dev = subprocess.run(
        [*anyrtd_command(), "dev", *args, *listen],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dev.returncode == 1
    assert dev.stderr.splitlines() == [refusal(first)]
    assert not (first.state / "devserver.sqlite3").exists()  # no devserver was started
    assert not (tmp_path / "dev.sock").exists()

    upgrade = subprocess.run(
        [*anyrtd_command(), "db", "upgrade", "--state-dir", str(first.state)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert upgrade.returncode == 1
    assert upgrade.stderr.splitlines() == [refusal(first)]
    assert first._ticking()


def test_the_lock_is_released_when_its_owner_is_killed_with_sigkill(
    first: ServeProcess, devserver: DevserverProcess, tmp_path: Path
) -> None:
    assert first.proc is not None
    killed = first.proc
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait(timeout=30) == -signal.SIGKILL

    second = ServeProcess(tmp_path, devserver.url, name="second")
    second.state = first.state
    try:
        second.start()  # it holds the directory, opens the mirror and ticks
        assert second.proc is not None
        assert (first.state / LOCK_FILE).read_text() == f"{second.proc.pid}\n"
    finally:
        second.stop()


HOLD_AND_SPAWN = textwrap.dedent(
    """
    import subprocess, sys
    from pathlib import Path
    from anyrtd.statedir import lock_state_dir
    lock_state_dir(Path(sys.argv[1]))
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    print(child.pid, flush=True)
    sys.stdin.read()  # held until the test kills this process
    """
)


@pytest.mark.process  # it starts a real program
def test_a_program_that_outlives_its_daemon_does_not_keep_the_lock(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_SPAWN, str(state)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        orphan = int(holder.stdout.readline())
        try:
            with pytest.raises(StateDirBusy, match=f"pid {holder.pid}"):
                lock_state_dir(state)
            holder.kill()
            holder.wait(timeout=30)
            assert _alive(orphan)  # the program still runs
            lock_state_dir(state)  # ...and the directory is free
            assert (state / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        finally:
            holder.kill()
            os.kill(orphan, signal.SIGKILL)
            wait_until(lambda: not _alive(orphan), what=f"the program (pid {orphan}) to end")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_locking_a_directory_this_process_locked_is_a_no_op(tmp_path: Path) -> None:
    lock_state_dir(tmp_path / "state")
    lock_state_dir(tmp_path / "state")
    lock_state_dir(tmp_path / "." / "state")
    assert (tmp_path / "state" / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_a_lock_owner_that_wrote_no_pid_is_still_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    fd = os.open(state / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a lock on its own description, like another process
        with pytest.raises(StateDirBusy, match="its pid is not recorded"):
            lock_state_dir(state)
    finally:
        os.close(fd)


def test_a_lock_file_root_makes_belongs_to_the_state_directorys_owner(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root makes files for another user")
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, 65534, 65534)  # a service's user, as StateDirectory= leaves it
    lock_state_dir(state)
    made = (state / LOCK_FILE).stat()
    assert (made.st_uid, made.st_gid) == (65534, 65534)
