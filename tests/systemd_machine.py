"""What the systemd tests put on this machine, and how they find and remove it.

tests/test_systemd.py and tests/test_service_install.py install anyrtd's unit in
/etc/systemd/system and run it in the sandbox of tests/systemd_sandbox.py (its fixtures are in
tests/systemd_fixtures.py). This module names what they install, tells a unit a test left
behind from one that is the machine's own, removes what they installed, and runs commands in
the sandbox.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from systemd_sandbox import SystemdSandbox

from anyrtd.service_files import UNIT_HEADER

REPO = Path(__file__).resolve().parents[1]
UNIT_DIR = Path("/etc/systemd/system")
SANDBOX_STATE = Path("/run/anyrtd-test-systemd-sandbox.pid")
SYSTEM_PYTHON = "/usr/bin/python3"
UNIT = UNIT_DIR / "anyrtd.service"
DROP_IN_DIR = UNIT_DIR / "anyrtd.service.d"
WANTS_LINK = UNIT_DIR / "multi-user.target.wants" / "anyrtd.service"  # what `enable` makes
OTHER_UNIT_PLACES = (Path("/lib/systemd/system"), Path("/usr/lib/systemd/system"))
STATE_PRIVATE = Path("/var/lib/private")
STATE_DIRS = (Path("/var/lib/anyrtd"), STATE_PRIVATE / "anyrtd")
CONFIG_DIR = Path("/etc/anyrtd")  # ConfigurationDirectory=anyrtd creates it
MARK = "# Installed by anyrtd's tests/test_systemd.py for one test run; safe to delete.\n"
OPT_PREFIX = "anyrtd-test-"
"""`opt_home` is /opt/anyrtd-test-*: a unit that runs anyrtd from there is a test's."""


def is_a_tests_unit(text: str) -> bool:
    """Return whether a unit file was written by a test (by hand or by `service install`)."""
    return text.startswith(MARK) or (
        text.startswith(UNIT_HEADER) and f"\nExecStart=/opt/{OPT_PREFIX}" in text
    )


def foreign_units() -> list[Path]:
    """Return the anyrtd units on this machine that no test installed."""
    found = [d / "anyrtd.service" for d in OTHER_UNIT_PLACES if (d / "anyrtd.service").exists()]
    if UNIT.exists() and not is_a_tests_unit(UNIT.read_text()):
        found.append(UNIT)
    return found


def remove_installed(created: list[Path]) -> None:
    """Remove what a test installed: the unit, its drop-ins, the state, and `created`."""
    shutil.rmtree(DROP_IN_DIR, ignore_errors=True)
    UNIT.unlink(missing_ok=True)
    if WANTS_LINK.is_symlink():
        WANTS_LINK.unlink()
    for path in STATE_DIRS:
        if path.is_symlink():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
    for path in created:  # files and directories made for the unit, when they were not there
        if path.is_file():
            path.unlink()
        elif path.exists() and not any(path.iterdir()):
            path.rmdir()


def apt_install(*packages: str) -> None:
    """Install Debian packages the test needs, or fail saying which and why."""
    if shutil.which("apt-get") is None:
        pytest.fail(f"this machine lacks {', '.join(packages)} and has no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:
            pytest.fail(f"`{' '.join(argv)}` failed ({done.returncode}):\n{done.stderr}")


class Systemd:
    """The sandboxed systemd: run commands inside it and read what it says."""

    def __init__(self, sandbox: SystemdSandbox) -> None:
        self.sandbox = sandbox

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside the sandbox; with `check`, fail the test on a non-zero exit."""
        done = self.sandbox.run(*argv)
        if check and done.returncode != 0:
            pytest.fail(f"`{' '.join(argv)}` exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    @property
    def root(self) -> Path:
        """Return the sandbox's file system root as seen from here (its /run is its own)."""
        return self.sandbox.root
