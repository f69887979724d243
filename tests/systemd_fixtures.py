"""The sandboxed systemd for the tests that need one, as pytest fixtures.

`machine` holds the machine for one module at a time (they install units in /etc), `systemd`
boots the sandbox of tests/systemd_sandbox.py for a module, and `opt_home` builds a virtual
environment under /opt, once per session, that the hardened unit can see. A test module takes
them with `pytest_plugins = ("systemd_fixtures",)`; the rest it needs is in systemd_machine.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from systemd_machine import (
    OPT_PREFIX,
    REPO,
    SANDBOX_STATE,
    SYSTEM_PYTHON,
    UNIT_DIR,
    Systemd,
    apt_install,
)
from systemd_sandbox import SYSTEMD, SandboxError, SystemdSandbox


@pytest.fixture(scope="module")
def machine() -> Iterator[None]:
    """Hold the machine for this module: one run of this test at a time may install units."""
    if os.geteuid() != 0:
        pytest.skip("booting systemd in a PID namespace needs root (CI runs as root)")
    # A lock on the unit directory itself: no lock file to leave behind.
    fd = os.open(UNIT_DIR, os.O_RDONLY)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another run of this test has held {UNIT_DIR} for 10 minutes")
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)  # releases the lock


@pytest.fixture(scope="module")
def systemd(machine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Systemd]:
    """Boot a real systemd in the sandbox for this module; power it off at the end."""
    if not SYSTEMD.exists() or shutil.which("systemctl") is None:
        apt_install("systemd")
    log = tmp_path_factory.mktemp("systemd") / "boot.log"
    sandbox = SystemdSandbox(SANDBOX_STATE, log)
    sandbox.stop()  # a sandbox an interrupted run of this test left behind
    try:
        sandbox.start(timeout=120)
    except SandboxError as exc:
        pytest.fail(f"systemd could not boot in the sandbox: {exc}")
    try:
        yield Systemd(sandbox)
    finally:
        sandbox.stop()


@pytest.fixture(scope="session")
def opt_home() -> Iterator[Path]:
    """Return a directory under /opt with venv/, Debian's python3 with this checkout installed.

    It lives under /opt: the hardened unit hides /root, /home and /tmp (ProtectHome=,
    PrivateTmp=), and a non-editable install keeps it from reading the checkout.
    """
    if os.geteuid() != 0:
        pytest.skip("the systemd test needs root")
    probe = [SYSTEM_PYTHON, "-c", "import ensurepip, venv"]
    if not Path(SYSTEM_PYTHON).exists() or subprocess.run(probe, capture_output=True).returncode:
        apt_install("python3", "python3-venv")
    base = Path(tempfile.mkdtemp(prefix=OPT_PREFIX, dir="/opt"))
    try:
        base.chmod(0o755)  # the unit's dynamic user must reach the environment
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_USER")
        }
        for argv in (
            [SYSTEM_PYTHON, "-m", "venv", str(base / "venv")],
            [str(base / "venv/bin/pip"), "install", "-q", "--disable-pip-version-check", str(REPO)],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
            if done.returncode != 0:
                pytest.fail(f"`{' '.join(argv)}` failed:\n{done.stdout}{done.stderr}")
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
