"""`anyrtd dev --config FILE` reads that file, as docs/cli.md says every command that uses
the config does (the real `anyrtd` command)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import anyrtd_command

pytestmark = pytest.mark.process


def test_dev_takes_config_and_reads_it(tmp_path: Path) -> None:
    config = tmp_path / "dev.toml"
    config.write_text("tick_s = 0\n")  # refused before anything starts: the file was read
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANYRTD_")}
    result = subprocess.run(
        [
            *anyrtd_command(),
            "dev",
            "--config",
            str(config),
            "--state-dir",
            str(tmp_path / "state"),
            "--port",
            "0",
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("Error: config key tick_s: must be a number of seconds")
    assert not (tmp_path / "state").exists()  # nothing was started
