"""`triggers disable` / `enable` say what will happen when this device has not applied the
switch yet: right after `create`, the daemon's claim on the new trigger is still in flight.
The real `anyrtd` command line against a real `anyrtd serve` on a real devserver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import wait_until

PY = sys.executable
TICK_S = 10.0
"""Long enough that a claim stays unconfirmed for the time a command takes."""


def anyrtd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*anyrtd_command(), *args], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def test_disable_during_the_claim_says_when_it_takes_effect_and_it_does(
    devserver: DevserverProcess, tmp_path: Path
) -> None:
    served = ServeProcess(
        tmp_path,
        devserver.url,
        tick_s=TICK_S,
        config_lines=('[programs."test:echo@v1"]', f"argv = {json.dumps([PY, '-c', 'pass'])}"),
    ).start()
    env = {
        **os.environ,
        "ANYRTD_CONFIG": str(served.config),
        "ANYRTD_SERVER": devserver.url,
        "ANYRTD_LISTEN": served.listen,
    }

    def view() -> dict[str, Any]:
        shown = anyrtd(env, "triggers", "show", "sw1", "--json").stdout
        return dict(json.loads(shown)["trigger"])

    try:
        create = ("--id", "sw1", "--every", "3600", "--program", "test:echo@v1", "--yes")
        anyrtd(env, "triggers", "create", *create)
        claiming = wait_until(
            lambda: (v := view())["state"] == "claiming" and v["enabled"] and v,
            timeout=30,
            interval=0.05,
            what="sw1 claimed and not yet confirmed",
        )
        assert claiming
        said = anyrtd(env, "triggers", "disable", "sw1").stdout.strip()
        assert said == (
            "sw1: disabled in its record; disabled here once this device's claim on it "
            "is confirmed (within a few ticks)"
        )
        done = wait_until(
            lambda: (v := view())["state"] == "disabled" and not v["enabled"] and v,
            timeout=6 * TICK_S,
            what="sw1 disabled here once the claim was confirmed",
        )
        assert done["owner"] == devserver.peers[0]
        assert anyrtd(env, "triggers", "disable", "sw1").stdout.strip() == "sw1: disabled"
    finally:
        served.stop()
