"""The layout and the wheel: top-level `migrations/` and `packaging/` ship inside the package,
and building the wheel (what `pip install .` does) prints no setuptools warning."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from anyrtd.mirror import alembic_config

ROOT = Path(__file__).resolve().parent.parent

SETUPTOOLS_WARNING = re.compile(r"\b\w*Warning\b|_BetaConfiguration|is absent from the")
"""A warning setuptools prints while it builds (`_Warning: Package 'anyrtd.packaging.systemd'
is absent from the packages configuration`, `SetuptoolsDeprecationWarning: ...`); pip's own
notes are `WARNING:` in capitals and distutils' `warning: ... byte-compiling is disabled` in
lower case, neither of which this matches."""


NOT_SOURCE = (
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
)


def test_migrations_are_a_top_level_folder_the_package_links_to() -> None:
    assert (ROOT / "migrations" / "env.py").is_file()
    assert (ROOT / "migrations" / "versions" / "0001_initial.py").is_file()
    link = ROOT / "anyrtd" / "migrations"
    assert link.is_symlink(), "anyrtd/migrations is a link to the top-level migrations/"
    assert link.resolve() == (ROOT / "migrations").resolve()


def test_alembic_finds_its_env_through_the_package() -> None:
    location = Path(alembic_config("sqlite://").get_main_option("script_location") or "")
    assert (location / "env.py").is_file()
    assert (location / "script.py.mako").is_file()
    assert (location / "versions" / "0001_initial.py").is_file()


@pytest.mark.process
def test_the_wheel_builds_without_setuptools_warnings_and_carries_every_file(
    tmp_path: Path,
) -> None:
    # A copy of the tree (its links kept): the build's own files stay out of the checkout.
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    out = tmp_path / "wheel"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    warnings = [
        line.strip()
        for line in (built.stdout + built.stderr).splitlines()
        if SETUPTOOLS_WARNING.search(line) and "WARNING: Location" not in line
    ]
    assert warnings == []
    (wheel,) = out.glob("anyrtd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        "anyrtd/migrations/env.py",
        "anyrtd/migrations/script.py.mako",
        "anyrtd/migrations/versions/0001_initial.py",
        "anyrtd/packaging/systemd/anyrtd.service",
        "anyrtd/packaging/systemd/anyrtd.toml.example",
        "anyrtd/packaging/systemd/user/anyrtd.service",
        "anyrtd/packaging/launchd/LaunchAgents/org.anyrtd.anyrtd.plist",
        "anyrtd/packaging/launchd/LaunchDaemons/org.anyrtd.anyrtd.plist",
        "anyrtd/control/static/index.html",
        "anyrtd/control/static/app.js",
        "anyrtd/control/static/app.css",
        "anyrtd/py.typed",
    }
    assert shipped <= names, sorted(shipped - names)
    versions = sorted(p.name for p in (ROOT / "migrations" / "versions").glob("0*.py"))
    assert versions
    assert {f"anyrtd/migrations/versions/{v}" for v in versions} <= names
