"""`.ci/run`'s needs (.ci/needs.sh) as a user who is not root and lacks chromium,
chromedriver, faketime and promtool: one line each says what is skipped and why, nothing is
installed, and the script goes on (the rest of .ci/run still runs). Run under `setpriv` as
`nobody` with a PATH that holds only what the script needs; skipped where setpriv cannot
change user (not root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NEEDS = ROOT / ".ci" / "needs.sh"


def bare_path(tmp_path: Path) -> Path:
    """Return a directory holding only the commands needs.sh calls (no browser, no promtool)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("id", "ls", "env"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    bin_dir.chmod(0o755)
    tmp_path.chmod(0o755)
    return bin_dir


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root")
def test_as_a_user_who_cannot_install_each_missing_tool_is_one_skip_line() -> None:
    # pytest's own tmp_path sits under a directory only root may enter: a fresh one instead,
    # with the script copied in, that `nobody` can read
    tmp_path = Path(tempfile.mkdtemp(prefix="anyrtd-ci-needs-"))
    try:
        _as_nobody(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _as_nobody(tmp_path: Path) -> None:
    bin_dir = bare_path(tmp_path)
    needs = tmp_path / "needs.sh"
    shutil.copy(NEEDS, needs)
    needs.chmod(0o644)
    bash = shutil.which("bash")
    setpriv = shutil.which("setpriv")
    assert bash is not None and setpriv is not None
    script = (
        f"set -euo pipefail; source {needs}; echo went-on; "
        'echo "browser=${ANYRTD_NO_BROWSER:+set} faketime=${ANYRTD_NO_FAKETIME:+set} '
        'promtool=${ANYRTD_NO_PROMTOOL:+set}"'
    )
    result = subprocess.run(
        [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", bash, "-c", script],
        env={"PATH": str(bin_dir), "ANYRTD_FAKETIME_LIBS": str(tmp_path / "none" / "*.so.1")},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result
    assert result.stdout.split() == ["went-on", "browser=set", "faketime=set", "promtool=set"]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3, result.stderr
    assert all(line.startswith("skip: ") and "nobody cannot install" in line for line in lines)
    assert "apt-get install chromium chromium-driver" in lines[0]
    assert "apt-get install faketime" in lines[1]
    assert "apt-get install prometheus" in lines[2]


def test_with_every_tool_there_nothing_is_skipped_or_installed(tmp_path: Path) -> None:
    bin_dir = bare_path(tmp_path)
    for tool in ("chromium", "chromedriver", "promtool"):
        fake = bin_dir / tool
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    lib = tmp_path / "lib" / "libfaketimeMT.so.1"
    lib.parent.mkdir()
    lib.write_text("")
    bash = shutil.which("bash")
    assert bash is not None
    script = f'set -euo pipefail; source {NEEDS}; echo "[${{ANYRTD_NO_BROWSER:-}}]"'
    result = subprocess.run(
        [bash, "-c", script],
        env={"PATH": str(bin_dir), "ANYRTD_FAKETIME_LIBS": str(lib)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result
    assert result.stdout.strip() == "[]" and result.stderr == ""


def test_the_status_page_tests_skip_with_the_reason_run_gives(tmp_path: Path) -> None:
    env = {**os.environ, "ANYRTD_NO_BROWSER": "chromium is missing (a test)"}
    result = subprocess.run(
        [
            str(Path(os.environ.get("VIRTUAL_ENV", "")) / "bin" / "pytest")
            if os.environ.get("VIRTUAL_ENV")
            else "pytest",
            "-p", "no:cacheprovider", "-q", "-n", "0", "-rs",
            str(ROOT / "tests" / "test_status_page_states.py"),
        ],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:]
    assert "1 skipped" in result.stdout and "chromium is missing (a test)" in result.stdout
