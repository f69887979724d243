"""Boot a real systemd for the tests: PID 1 of a fresh PID namespace on this machine.

`tests/test_systemd.py` installs the packaged unit and drives it with the real systemctl and
journalctl; this module gives it a systemd to do that with, on a machine (a CI container)
whose own PID 1 is not systemd. It needs root, util-linux's `unshare` and `nsenter`, and
Debian's systemd package.

What the sandbox shares and what it does not:
- Its PID, mount and UTS namespaces are its own; the files and the network are the
  machine's. A unit written to /etc/systemd/system from outside is seen inside after
  `systemctl daemon-reload`, and a unit's 127.0.0.1 is the test's 127.0.0.1.
- Its /run is a tmpfs of its own (systemd writes its sockets and state there; the
  machine's /run is left alone). `root` is the sandbox's file system seen from outside,
  `/proc/<its pid>/root`, to reach a socket a unit made under that /run.
- The tmpfiles units and tmp.mount are masked: over the machine's own files they would
  empty /tmp and /var/tmp, the test's own temporary files included.

The pid of the sandbox's systemd is kept in a state file, so that a sandbox an interrupted
run left behind is found and stopped by the next run. The process behind that pid is
checked (its executable and a marker in its environment), so a reused pid is never taken
for the sandbox.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

SYSTEMD = Path("/lib/systemd/systemd")
MARKER = "container=anyrtd-tests"
"""Set in the sandbox's PID 1 environment (systemd reads `container=` as "in a container")."""
MASKED = (
    "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-clean.service",
    "systemd-tmpfiles-clean.timer",
    "tmp.mount",
)
UP_STATES = ("running", "degraded")
"""What `systemctl is-system-running` says once basic.target is reached (degraded: a unit
of the machine's own failed inside, which does not concern the test)."""


class SandboxError(Exception):
    """The sandbox could not be booted, reached or stopped; the message says why."""


def _poll(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Return whether `check()` became true within `timeout` s, checking every `interval` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def _children(parent: int) -> list[int]:
    """Return the pids of `parent`'s children (from /proc; any kernel config will do)."""
    try:  # needs CONFIG_PROC_CHILDREN, which most kernels have
        return [int(c) for c in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]
    except FileNotFoundError:
        pass
    except OSError:
        return []
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


class SystemdSandbox:
    """One sandboxed systemd: `start()`, `run(argv)` inside it, `stop()`."""

    def __init__(self, state: Path, log: Path, systemd: Path = SYSTEMD) -> None:
        self.state = state
        self.log = log
        self.systemd = systemd
        self._unshare: subprocess.Popen[bytes] | None = None

    # --- finding it ------------------------------------------------------------------------

    @staticmethod
    def _is_ours(pid: int) -> bool:
        """Return whether `pid` is a sandbox's systemd (not a process that reused the pid)."""
        proc = Path(f"/proc/{pid}")
        try:
            exe = os.readlink(proc / "exe")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or a zombie
            return False
        return Path(exe).name == "systemd" and MARKER.encode() in environ

    @property
    def pid(self) -> int | None:
        """Return the pid (as seen from here) of the sandbox's systemd, or None when none runs."""
        try:
            pid = int(self.state.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._is_ours(pid) else None

    @property
    def root(self) -> Path:
        """Return the sandbox's file system root as seen from here (its /run is its own)."""
        pid = self.pid
        if pid is None:
            raise SandboxError(f"the sandbox is not running; its boot log:\n{self.boot_log()}")
        return Path(f"/proc/{pid}/root")

    def boot_log(self, tail: int = 4000) -> str:
        """Return the end of what systemd printed while it booted and ran."""
        try:
            return self.log.read_text(errors="replace")[-tail:]
        except OSError:
            return "(no boot log)"

    # --- running things inside -------------------------------------------------------------

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `argv` in the sandbox's namespaces (its systemctl sees its systemd)."""
        pid = self.pid
        if pid is None:
            raise SandboxError(f"the sandbox is not running; its boot log:\n{self.boot_log()}")
        return subprocess.run(
            ["nsenter", "--target", str(pid), "--pid", "--mount", "--uts", "--", *argv],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )

    def _system_state(self) -> str:
        try:
            done = self.run("systemctl", "is-system-running", timeout=10)
        except (SandboxError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip()

    # --- start and stop --------------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        """Boot systemd to basic.target and return once it answers; raise SandboxError if not."""
        if self.pid is not None:
            raise SandboxError(f"a sandbox already runs (pid {self.pid}, state file {self.state})")
        if os.geteuid() != 0:
            raise SandboxError("booting systemd in a PID namespace needs root")
        if not os.access(self.systemd, os.X_OK):
            raise SandboxError(f"no systemd at {self.systemd} (Debian: apt-get install systemd)")
        # The child of `unshare --fork` is PID 1 of the new namespace: it mounts the sandbox's
        # own /run (its mount namespace is private) and becomes systemd.
        boot = (
            'mount -t tmpfs -o mode=0755 tmpfs /run && exec env "$1" "$0" --system '
            "--unit=basic.target" + "".join(f" systemd.mask={unit}" for unit in MASKED)
        )
        argv = ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "--", "sh", "-c", boot]
        with self.log.open("ab") as log:
            self._unshare = subprocess.Popen(
                [*argv, str(self.systemd), MARKER],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # not in the test's process group: ^C reaches pytest
            )
        pid = self._child_of(self._unshare.pid, timeout=10)
        if pid is None:
            self._abandon()
            raise SandboxError(f"systemd did not start; its boot log:\n{self.boot_log()}")
        self.state.write_text(f"{pid}\n")
        if not _poll(lambda: self._is_ours(pid), timeout=10):  # sh has exec'd systemd
            self.stop()
            raise SandboxError(f"systemd did not start; its boot log:\n{self.boot_log()}")
        last = ""

        def up() -> bool:
            nonlocal last
            last = self._system_state()
            return last in UP_STATES or self.pid is None

        if not _poll(up, timeout=timeout) or self.pid is None:
            self.stop()
            raise SandboxError(
                f"systemd did not come up within {timeout:g} s "
                f"(is-system-running: {last or 'no answer'}); its boot log:\n{self.boot_log()}"
            )

    def _child_of(self, parent: int, timeout: float) -> int | None:
        """Return the pid of `parent`'s child once it has one, or None if it dies first."""
        found: list[int] = []

        def child() -> bool:
            if self._unshare is not None and self._unshare.poll() is not None:
                return True  # unshare exited: no child will come
            found.extend(_children(parent)[:1])
            return bool(found)

        _poll(child, timeout=timeout, interval=0.02)
        return found[0] if found else None

    def stop(self, timeout: float = 30) -> None:
        """Power the sandbox off (one an interrupted run left, too) and wait until it is gone."""
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(SandboxError, subprocess.TimeoutExpired):  # killed below
                self.run("systemctl", "poweroff", "--no-block", timeout=10)
            if not _poll(lambda: not self._is_ours(pid), timeout=timeout):
                # The namespace's PID 1 taking SIGKILL takes every process inside with it.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                if not _poll(lambda: not self._is_ours(pid), timeout=10):
                    raise SandboxError(f"the sandbox's systemd (pid {pid}) survived SIGKILL")
        self._abandon()
        self.state.unlink(missing_ok=True)

    def _abandon(self) -> None:
        """Reap this object's `unshare` (it exits once the namespace's PID 1 is gone)."""
        if self._unshare is None:
            return
        try:
            self._unshare.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._unshare.kill()
            self._unshare.wait(timeout=10)
        self._unshare = None
