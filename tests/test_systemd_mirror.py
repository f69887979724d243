"""A broken mirror under a real systemd: the packaged unit fails once, without a restart loop.

Uses the sandboxed systemd (tests/systemd_fixtures.py) and the installed unit of
tests/test_systemd.py (its fixtures, imported here); see those for what the sandbox needs.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from support import wait_until
from systemd_machine import STATE_PRIVATE
from test_systemd import (  # noqa: F401 - fixtures, used by name
    Service,
    server,
    service,
)

from anyrtd.mirror_guard import EXIT_BROKEN_STATE, MARKER_FILE

pytest_plugins = ("systemd_fixtures",)
pytestmark = pytest.mark.systemd

STATE = STATE_PRIVATE / "anyrtd"  # StateDirectory= with DynamicUser=: /var/lib/private/anyrtd


def failed_for_good(unit: Service) -> dict[str, str] | None:
    """Return the unit's properties once it is failed: with Restart=on-failure, a failure
    that systemd would restart goes to `auto-restart` instead."""
    props = unit.show("ActiveState", "SubState", "Result", "ExecMainStatus", "NRestarts")
    return props if props["ActiveState"] == "failed" else None


def test_a_mirror_deleted_under_the_service_fails_it_once_with_status_65(
    service: Service,  # noqa: F811
) -> None:
    service.config.write_text(service.good_config)
    since = int(time.time())
    service.systemctl("start", "anyrtd")
    try:
        wait_until((STATE / MARKER_FILE).exists, timeout=30, what="the marker beside the mirror")
        restarts = service.show("NRestarts")["NRestarts"]
        for f in STATE.glob("anyrtd.sqlite3*"):
            f.unlink()

        props = wait_until(lambda: failed_for_good(service), timeout=30, what="the unit to fail")
        assert props == {
            "ActiveState": "failed",
            "SubState": "failed",
            "Result": "exit-code",
            "ExecMainStatus": str(EXIT_BROKEN_STATE),
            "NRestarts": restarts,
        }
        journal = service.journal(f"--since=@{since}")
        assert "was deleted while anyrtd ran: stopping before writing into a file" in journal

        # A start by hand meets the marker: refused, one line, still not restarted.
        service.systemd.run("systemctl", "start", "anyrtd", check=False)
        props = wait_until(lambda: failed_for_good(service), timeout=30, what="the refusal")
        assert props["ExecMainStatus"] == str(EXIT_BROKEN_STATE)
        assert props["NRestarts"] == restarts
        refusal = [
            line
            for line in service.journal(f"--since=@{since}").splitlines()
            if "is missing" in line
        ]
        assert len(refusal) == 1 and refusal[0].startswith("Error: the mirror ")

        # `anyrtd db rebuild`, as the docs say, and the service starts afresh.
        rebuilt = subprocess.run(
            [
                str(service.config.parent / "venv/bin/anyrtd"),
                "db",
                "rebuild",
                "--state-dir",
                str(STATE),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert rebuilt.returncode == 0, rebuilt.stderr
        service.systemctl("reset-failed", "anyrtd")
        service.systemctl("start", "anyrtd")
        assert service.show("ActiveState")["ActiveState"] == "active"
    finally:
        service.systemd.run("systemctl", "stop", "anyrtd", check=False)
        service.systemd.run("systemctl", "reset-failed", "anyrtd", check=False)
