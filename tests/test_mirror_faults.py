"""A mirror lost, damaged or at the wrong revision: real `anyrtd serve` and `anyrtd db` processes.

Each refusal is one line naming the file, the fault and what to do, with exit status 65
(`EXIT_BROKEN_STATE`, which the systemd units keep from restarting), never a traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import wait_until

from anyrtd.mirror import Mirror, alembic_config
from anyrtd.mirror_guard import EXIT_BROKEN_STATE, MARKER_FILE, read_marker
from anyrtd.rows import Batch

ROOT = Path(__file__).resolve().parent.parent
UNITS = (
    ROOT / "packaging" / "systemd" / "anyrtd.service",
    ROOT / "packaging" / "systemd" / "user" / "anyrtd.service",
)
REBUILD = "`anyrtd db rebuild` (with the same --state-dir)"
AT_RISK = (
    "runs not yet recorded on the server, the outbox of writes the server has not taken, "
    "and `once` consumption not yet synced (so a `once` may fire twice)"
)


@pytest.fixture
def serve(tmp_path: Path, devserver: DevserverProcess) -> Iterator[ServeProcess]:
    """An `anyrtd serve` on the devserver (not started); stopped at teardown."""
    proc = ServeProcess(tmp_path, devserver.url)
    try:
        yield proc
    finally:
        proc.stop()


def mirror_of(serve: ServeProcess) -> Path:
    return serve.state / "anyrtd.sqlite3"


def run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a command to its end; a daemon that starts where it should refuse fails the test."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def db(serve: ServeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run([*anyrtd_command(), "db", *args, "--state-dir", str(serve.state)])


def refused(done: subprocess.CompletedProcess[str]) -> str:
    """Return the one line a refused command printed, having checked it is one line and 65."""
    assert done.returncode == EXIT_BROKEN_STATE, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: ")
    return lines[0].removeprefix("Error: ")


def served_once(serve: ServeProcess) -> str:
    """Start the daemon, wait until its mirror holds state (the marker), stop it; return the id."""
    serve.start()
    marker = serve.state / MARKER_FILE
    wait_until(marker.exists, timeout=30, what="the marker beside the mirror")
    assert serve.stop() == 0
    mirror_id = read_marker(mirror_of(serve))
    assert mirror_id is not None
    return mirror_id


class RebuildingServe(ServeProcess):
    """`anyrtd serve --rebuild-mirror`."""

    def argv(self) -> list[str]:
        return [*super().argv(), "--rebuild-mirror"]


def remove_mirror(serve: ServeProcess) -> None:
    for f in serve.state.glob("anyrtd.sqlite3*"):
        f.unlink()


# item 8: a missing or emptied mirror


def test_a_brand_new_state_directory_starts_fresh_and_marks_its_mirror(
    serve: ServeProcess,
) -> None:
    assert not serve.state.exists()
    mirror_id = served_once(serve)
    mirror = Mirror(mirror_of(serve))
    try:
        with mirror.engine.connect() as conn:
            stored = conn.exec_driver_sql(
                "SELECT value FROM meta WHERE key = 'mirror_id'"
            ).scalar_one()
    finally:
        mirror.close()
    assert stored == mirror_id


def test_a_deleted_mirror_is_refused_naming_what_would_be_lost(serve: ServeProcess) -> None:
    served_once(serve)
    remove_mirror(serve)  # as `rm anyrtd.sqlite3*` while the daemon was down

    line = refused(run(serve.argv()))
    assert line == (
        f"the mirror {mirror_of(serve)} is missing, but this state directory had one "
        f"({MARKER_FILE}): starting afresh would lose {AT_RISK}. Restore the file from a "
        f"backup, or run {REBUILD} or `anyrtd serve --rebuild-mirror` to start afresh anyway"
    )
    assert not mirror_of(serve).exists()  # nothing was made in its place
    assert not Path(serve.requested.removeprefix("unix:")).exists()  # nor the control socket
    assert " is missing, but this state directory had one" in refused(db(serve, "current"))


def test_an_emptied_mirror_is_refused_and_rebuilt_by_db_rebuild(serve: ServeProcess) -> None:
    first = served_once(serve)
    for f in serve.state.glob("anyrtd.sqlite3*"):
        f.write_bytes(b"")  # emptied in place

    assert " is empty, but this state directory had one" in refused(run(serve.argv()))
    assert " is empty, but this state directory had one" in refused(db(serve, "current"))

    rebuilt = db(serve, "rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr
    (line,) = rebuilt.stdout.splitlines()
    assert line.startswith(f"rebuilding the mirror {mirror_of(serve)} (asked by")
    assert f"{MARKER_FILE} removed" in line
    assert all(".old-" in f.name for f in serve.state.glob("anyrtd.sqlite3*"))

    second = served_once(serve)  # starts afresh, and marks the new mirror
    assert second != first


def test_serve_rebuild_mirror_starts_afresh_logged_and_keeps_a_good_mirror(
    serve: ServeProcess,
) -> None:
    served_once(serve)
    remove_mirror(serve)
    flagged = RebuildingServe(serve.tmp, serve.server_url)  # the same state directory
    try:
        flagged.start()
        log = flagged.log.read_text()
        assert f"WARNING anyrtd.mirror: rebuilding the mirror {mirror_of(serve)}" in log
        wait_until((serve.state / MARKER_FILE).exists, timeout=30, what="the new marker")
        kept = read_marker(mirror_of(serve))
        assert flagged.stop() == 0
        flagged.start()  # the flag again, on the good mirror it made: kept
        assert read_marker(mirror_of(serve)) == kept
        assert flagged.log.read_text().count("rebuilding the mirror") == 1
    finally:
        flagged.stop()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_mirror_deleted_or_replaced_while_running_stops_the_daemon(
    serve: ServeProcess, how: str
) -> None:
    served_once(serve)
    serve.start()
    assert serve.proc is not None
    path = mirror_of(serve)
    if how == "deleted":
        remove_mirror(serve)
    else:
        shutil.copy(path, path.with_name("copy"))
        os.replace(path.with_name("copy"), path)  # same content, another file

    code = serve.proc.wait(timeout=30)
    assert code == EXIT_BROKEN_STATE
    last = serve.log.read_text().splitlines()[-1]
    assert last.startswith(f"Error: the mirror {path} was {how}")
    assert "while anyrtd ran: stopping before writing into a file nobody will read" in last


# item 9: a corrupt, unreadable or read-only mirror


def test_a_corrupt_mirror_is_one_line_and_exit_65(serve: ServeProcess) -> None:
    serve.state.mkdir()
    mirror_of(serve).write_bytes(b"\x00garbage" * 4096)
    line = refused(run(serve.argv()))
    assert line == (
        f"the mirror {mirror_of(serve)} is damaged (file is not a database): restore it from a "
        f"backup, or run {REBUILD} to move it aside and start afresh (this loses {AT_RISK})"
    )
    assert "damaged" in refused(db(serve, "upgrade"))


def test_a_directory_in_the_mirrors_place_is_one_line_and_exit_65(serve: ServeProcess) -> None:
    mirror_of(serve).mkdir(parents=True)  # what is there is no file anyrtd can open
    line = refused(run(serve.argv()))
    assert line.startswith(
        f"the mirror {mirror_of(serve)} cannot be opened (unable to open database file): "
    )


NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
"""Run a command as root held to file permissions, as the service's own user is."""


def held_to_permissions() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and util-linux's setpriv (root alone ignores file modes)")


def mirror_with_state(serve: ServeProcess) -> Path:
    made = Mirror(mirror_of(serve))
    made.ensure_schema(create=True)
    made.commit(Batch(meta={"peer_id": "12D3KooWself"}), now=1.0)
    made.close()
    return mirror_of(serve)


def test_an_unreadable_mirror_is_one_line_and_exit_65(serve: ServeProcess) -> None:
    held_to_permissions()
    mirror_with_state(serve).chmod(0o000)
    line = refused(run([*NO_DAC, *serve.argv()]))
    assert line.startswith(
        f"the mirror {mirror_of(serve)} cannot be opened (unable to open database file): it "
        "must be a file the user anyrtd runs as may read and write"
    )


def test_a_read_only_mirror_is_one_line_and_exit_65(serve: ServeProcess) -> None:
    held_to_permissions()
    mirror_with_state(serve).chmod(0o444)
    line = refused(run([*NO_DAC, *serve.argv()]))
    assert line.startswith(
        f"the mirror {mirror_of(serve)} cannot be written (attempt to write a readonly "
        f"database): give the user anyrtd runs as write access to it"
    )


# item 10: schema advice that works


def at_revision(serve: ServeProcess, sql: str) -> None:
    """Make a mirror holding state, then change its schema bookkeeping with `sql`."""
    made = Mirror(mirror_with_state(serve))
    with made.engine.begin() as conn:
        conn.exec_driver_sql(sql)
    made.close()


def head() -> str | None:
    """Return the newest schema revision this anyrtd's migrations know."""
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def test_a_newer_mirror_is_told_to_upgrade_anyrtd_and_db_upgrade_says_so_too(
    serve: ServeProcess,
) -> None:
    at_revision(serve, "UPDATE alembic_version SET version_num = 'f00dfeed'")
    advice = (
        f"the mirror {mirror_of(serve)} is at schema revision f00dfeed, which this anyrtd does "
        f"not know (its newest is {head()}): a newer anyrtd wrote it; upgrade anyrtd to that "
        "version or later (`anyrtd db upgrade` cannot go forward to it)"
    )
    assert refused(run(serve.argv())) == advice
    assert refused(db(serve, "upgrade")) == advice
    current = db(serve, "current")
    assert current.returncode == 0 and "upgrade anyrtd" in current.stdout


def test_an_unversioned_mirror_is_told_to_rebuild_which_works(serve: ServeProcess) -> None:
    at_revision(serve, "DROP TABLE alembic_version")
    advice = (
        f"the mirror {mirror_of(serve)} has tables but no schema revision (no alembic_version "
        f"table): anyrtd did not make it, or did not finish; run {REBUILD} to move it aside "
        f"and start afresh (this loses {AT_RISK})"
    )
    assert refused(run(serve.argv())) == advice
    assert refused(db(serve, "upgrade")) == advice
    current = db(serve, "current")
    assert current.returncode == 0 and current.stdout.endswith(f"(head {head()}, {advice})\n")
    assert db(serve, "rebuild").returncode == 0
    served_once(serve)


def test_db_upgrade_does_not_make_a_new_mirror_where_one_was_lost(serve: ServeProcess) -> None:
    served_once(serve)
    remove_mirror(serve)
    assert " is missing, but this state directory had one" in refused(db(serve, "upgrade"))
    assert not mirror_of(serve).exists()


# the units


def test_both_units_keep_a_broken_mirror_from_restarting_in_a_loop() -> None:
    for unit in UNITS:
        lines = [line.strip() for line in unit.read_text().splitlines()]
        assert f"RestartPreventExitStatus={EXIT_BROKEN_STATE}" in lines, unit
        assert "Restart=on-failure" in lines, unit


def test_the_exit_status_is_documented() -> None:
    service = (ROOT / "docs" / "service.md").read_text()
    assert f"| {EXIT_BROKEN_STATE} |" in service
    assert f"RestartPreventExitStatus={EXIT_BROKEN_STATE}" in service
