"""The mirror keeps a bounded number of runs per trigger (`runs_kept_per_trigger`), pruned in
batches by the commits as runs end, whatever the run rate; a real daemon holds to it too."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import put_triggers, server_runs, wait_until

from anyrtd.config import Config, ConfigError, load_config
from anyrtd.mirror import TRIM_ROWS, Mirror, trim_slack
from anyrtd.rows import Batch, RunRow
from anyrtd.vocab import RunStatus


def opened(path: Path, kept: int | None) -> Mirror:
    mirror = Mirror(path, runs_kept=None if kept is None else (lambda: kept))
    mirror.ensure_schema(create=True)
    return mirror


def ended(trigger_id: str | None, n: int, status: str = RunStatus.OK) -> RunRow:
    return RunRow(
        run_id=f"{trigger_id}-{n:06d}",
        trigger_id=trigger_id,
        program="agent:remind@v1",
        device="12D3KooWself",
        scheduled_at=float(n),
        started_at=float(n),
        status=status,
        ended_at=float(n) + 0.5,
        duration_ms=500,
    )


def kept_runs(path: Path, trigger_id: str) -> list[tuple[str, str]]:
    """Return (run id, status) of a trigger's runs in the mirror, oldest first."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT run_id, status FROM runs WHERE trigger_id = ? ORDER BY started_at",
            (trigger_id,),
        )
        return [(r, s) for r, s in rows]


def test_each_trigger_keeps_its_newest_runs_within_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    mirror = opened(path, kept=20)
    try:
        # a long-running run of `busy`, started first, and a few runs of a quiet trigger
        mirror.commit(Batch(runs=[ended("busy", 0, RunStatus.RUNNING)]), now=0.0)
        mirror.commit(Batch(runs=[ended("quiet", n) for n in range(1, 6)]), now=0.0)
        for n in range(1, 501):  # one run ends per commit, as at a high fire rate
            mirror.commit(Batch(runs=[ended("busy", n)]), now=float(n))
            finished = [r for r, s in kept_runs(path, "busy") if s != RunStatus.RUNNING]
            assert len(finished) <= 20 + trim_slack(20)
    finally:
        mirror.close()
    busy = kept_runs(path, "busy")
    finished = [r for r, s in busy if s != RunStatus.RUNNING]
    assert 20 <= len(finished) <= 20 + trim_slack(20)
    assert finished[-1] == "busy-000500"  # the newest are the ones kept
    assert finished == [f"busy-{n:06d}" for n in range(501 - len(finished), 501)]
    assert ("busy-000000", RunStatus.RUNNING) in busy  # a run in flight is never pruned
    assert len(kept_runs(path, "quiet")) == 5  # a trigger under its bound loses nothing


def test_without_a_bound_every_run_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    mirror = opened(path, kept=None)
    try:
        for n in range(1, 101):
            mirror.commit(Batch(runs=[ended("busy", n)]), now=float(n))
    finally:
        mirror.close()
    assert len(kept_runs(path, "busy")) == 100


def test_a_mirror_over_the_bound_is_brought_down_in_batches_after_a_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    mirror = opened(path, kept=None)  # runs piled up before the bound (an older anyrtd)
    total = TRIM_ROWS + 500
    try:
        mirror.commit(Batch(runs=[ended("old", n) for n in range(total)]), now=0.0)
    finally:
        mirror.close()

    mirror = opened(path, kept=10)
    try:
        mirror.snapshot()  # what a start reads, which finds the triggers over the bound
        mirror.commit(Batch(meta={"peer_id": "12D3KooWself"}), now=1.0)
        assert len(kept_runs(path, "old")) == total - TRIM_ROWS  # one batch a commit
        mirror.commit(Batch(meta={"peer_id": "12D3KooWself"}), now=2.0)
        assert [r for r, _ in kept_runs(path, "old")] == [
            f"old-{n:06d}" for n in range(total - 10, total)
        ]
    finally:
        mirror.close()


def test_a_trim_reads_the_index_and_never_scans_the_table(tmp_path: Path) -> None:
    path = tmp_path / "anyrtd.sqlite3"
    opened(path, kept=None).close()
    with sqlite3.connect(path) as conn:
        plans = [
            " ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))
            for sql, args in (
                (
                    "SELECT started_at FROM runs WHERE trigger_id = ? "
                    "ORDER BY started_at DESC LIMIT 1 OFFSET ?",
                    ("t", 9),
                ),
                (
                    "SELECT rowid FROM runs WHERE trigger_id = ? AND started_at < ? "
                    "AND status != ? LIMIT ?",
                    ("t", 1.0, "running", 10),
                ),
            )
        ]
    for plan in plans:
        assert "runs_trigger_started" in plan, plan
        assert "SCAN runs" not in plan.replace("SCAN runs USING", ""), plan


def test_the_bound_is_a_setting_of_the_file_the_environment_and_the_flag(
    tmp_path: Path,
) -> None:
    assert Config().runs_kept_per_trigger == 1000
    toml = tmp_path / "anyrtd.toml"
    toml.write_text("runs_kept_per_trigger = 50\n")
    assert load_config(str(toml), env={}).runs_kept_per_trigger == 50
    env = {"ANYRTD_RUNS_KEPT_PER_TRIGGER": "70"}
    assert load_config(str(toml), env=env).runs_kept_per_trigger == 70
    flagged = load_config(str(toml), env=env, runs_kept_per_trigger="90")
    assert flagged.runs_kept_per_trigger == 90


@pytest.mark.parametrize("bad", ["0", "-3", "1.5", "many", "", "nan"])
def test_a_bound_that_is_not_a_whole_number_of_at_least_one_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(None, env={"ANYRTD_RUNS_KEPT_PER_TRIGGER": "5"}, runs_kept_per_trigger=bad)
    assert str(refused.value) == (
        f"config key runs_kept_per_trigger: must be a whole number of at least 1, got "
        f"{bad!r}; give one such as 1000 (--runs-kept-per-trigger, "
        "ANYRTD_RUNS_KEPT_PER_TRIGGER or runs_kept_per_trigger in the config file)"
    )


@pytest.mark.parametrize("bad", ["0", "2.5", "true"])
def test_a_bad_bound_in_the_file_is_refused(tmp_path: Path, bad: str) -> None:
    toml = tmp_path / "anyrtd.toml"
    toml.write_text(f"runs_kept_per_trigger = {bad}\n")
    with pytest.raises(ConfigError, match="runs_kept_per_trigger: must be a whole number"):
        load_config(str(toml), env={})


@pytest.fixture
def serve(tmp_path: Path, devserver: DevserverProcess) -> Iterator[ServeProcess]:
    lines = ("runs_kept_per_trigger = 3", '[programs."test:true@v1"]', 'argv = ["/bin/true"]')
    proc = ServeProcess(tmp_path, devserver.url, config_lines=lines)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.process
def test_a_daemon_keeps_its_mirror_to_the_bound_while_the_server_keeps_every_run(
    serve: ServeProcess, devserver: DevserverProcess
) -> None:
    put_triggers(
        devserver.url,
        {
            "often": {
                "name": "often",
                "kind": "cron",
                "spec": {"every_s": 1},
                "program": "test:true@v1",
                "owner": "",
                "enabled": True,
            }
        },
    )
    serve.start()
    wait_until(
        lambda: len(server_runs(devserver.url, "often")) >= 9,
        timeout=60,
        interval=0.5,
        what="nine runs of `often` on the server",
    )
    mirror = serve.state / "anyrtd.sqlite3"
    finished = [r for r, s in kept_runs(mirror, "often") if s != RunStatus.RUNNING]
    assert 3 <= len(finished) <= 3 + trim_slack(3), finished
    assert serve.stop() == 0


@pytest.mark.process
def test_serve_refuses_a_bad_bound_flag_with_one_line(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    done = subprocess.run(
        [*anyrtd_command(), "serve", "--state-dir", state, "--runs-kept-per-trigger", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "Error: config key runs_kept_per_trigger: must be a whole number of at least 1, got "
        "'0'; give one such as 1000 (--runs-kept-per-trigger, ANYRTD_RUNS_KEPT_PER_TRIGGER "
        "or runs_kept_per_trigger in the config file)"
    ]
    assert not (tmp_path / "state").exists()
