"""The open-file limit: what the units `anyrtd service install` writes set, and what the
daemon makes of the limit it is given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from anyrtd.service_files import SYSTEM_UNIT, USER_UNIT, packaged, systemd_target
from anyrtd.service_files import Installation as Install

OPT = Install(("/opt/anyrtd/bin/anyrtd",), (Path("/opt/anyrtd/bin/anyrtd"),))
WANTED = 65536


def limit_nofile(unit_text: str) -> list[str]:
    return [
        line.removeprefix("LimitNOFILE=")
        for line in unit_text.splitlines()
        if line.startswith("LimitNOFILE=")
    ]


@pytest.mark.parametrize("name", [SYSTEM_UNIT, USER_UNIT])
def test_the_packaged_units_set_an_open_file_limit(name: str) -> None:
    assert limit_nofile(packaged(name)) == [str(WANTED)]


@pytest.mark.parametrize("user", [False, True])
def test_the_unit_service_install_writes_keeps_the_open_file_limit(
    user: bool, tmp_path: Path
) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")} if user else {}
    target = systemd_target(OPT, user=user, env=env, home=tmp_path)
    assert limit_nofile(target.unit_text) == [str(WANTED)]


def raised(soft: int, hard: int) -> str:
    """Return what `raise_nofile_limit` answers in a process started with these limits."""
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "from anyrtd.serve import raise_nofile_limit\n"
        "print(raise_nofile_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "error"},
        check=True,
    )
    return done.stdout.strip()


def test_the_daemon_raises_its_soft_open_file_limit_to_the_hard_one() -> None:
    assert raised(256, 2048) == "2048 2048"


def test_a_soft_limit_already_at_the_hard_one_is_kept() -> None:
    assert raised(300, 300) == "300 300"
