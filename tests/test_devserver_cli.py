"""`anyrtd devserver` as a real subprocess: device lines, ports, restarts, signals, the seeds."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import DEVSERVER_LINE, DevserverProcess, anyrtd_command

from anyrtd.devserver.ids import is_peer_id

Factory = Callable[..., DevserverProcess]


def trigger_anchor(url: str) -> tuple[str, str]:
    """Return (type id, trigger anchor) the way the runtime resolves them."""
    with httpx.Client(base_url=url, timeout=10) as c:
        tid = c.post(
            "/v1/spaces/bao/types",
            json={"key": "agent_trigger", "hidden": True, "idRule": "user", "dynamic": True},
        ).json()["id"]
        anchor = c.post(
            "/v1/spaces/bao/bundles/bao%2Fv1/children",
            json={"seed": "bao/triggers/v1", "type": tid},
        ).json()["objectId"]
    return tid, anchor


def test_devices_each_get_a_line_a_port_and_their_own_self(devserver_factory: Factory) -> None:
    dev = devserver_factory(devices=3)
    assert len(dev.urls) == 3 and len(set(dev.urls)) == 3
    assert len(set(dev.peers)) == 3 and all(is_peer_id(p) for p in dev.peers)
    for url, peer in zip(dev.urls, dev.peers, strict=True):
        view = httpx.get(f"{url}/v1/devices", timeout=10).json()
        assert view["self"] == peer
        assert [d["peerId"] for d in view["devices"]] == dev.peers


def test_devices_listen_on_consecutive_ports(tmp_path: Path) -> None:
    for attempt in range(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port > 65000:
            continue
        proc = subprocess.Popen(
            [
                *anyrtd_command(),
                "devserver",
                "--port",
                str(port),
                "--devices",
                "2",
                "--db",
                str(tmp_path / f"p{attempt}.sqlite3"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            if not first:  # another process took one of the ports meanwhile: try another pair
                continue
            second = proc.stdout.readline()
            urls = [
                DEVSERVER_LINE.match(line.strip()).group(3)  # type: ignore[union-attr]
                for line in (first, second)
            ]
            assert urls == [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
            assert httpx.get(f"{urls[1]}/v1/spaces", timeout=10).status_code == 200
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=15) == 0
            return
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
    pytest.fail("no free pair of consecutive ports in 5 attempts")


def test_a_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = subprocess.run(
            [
                *anyrtd_command(),
                "devserver",
                "--port",
                str(port),
                "--db",
                str(tmp_path / "busy.sqlite3"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port 0" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["--space", "no spaces"],
        ["--devices", "0"],
        ["--port", "65535", "--devices", "2"],
        ["--sync-delay", "-1"],
    ],
)
def test_bad_options_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    done = subprocess.run(
        [*anyrtd_command(), "devserver", "--db", str(tmp_path / "x.sqlite3"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Error" in done.stderr


def test_the_default_db_lives_in_the_state_directory(tmp_path: Path) -> None:
    env = {**os.environ, "STATE_DIRECTORY": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [*anyrtd_command(), "devserver", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert DEVSERVER_LINE.match(proc.stdout.readline().strip())
        assert (tmp_path / "state" / "devserver.sqlite3").is_file()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def test_a_restart_keeps_every_record_tombstone_sequence_and_device_row(
    devserver_factory: Factory,
) -> None:
    dev = devserver_factory(devices=2)
    tid, anchor = trigger_anchor(dev.url)
    where = {"objectId": anchor, "dataset": "agent_triggers"}
    with httpx.Client(base_url=dev.url, timeout=10) as c:
        c.post(
            "/v1/spaces/bao/upsert",
            json={**where, "records": [{"id": f"t{i}", "fields": {"n": i}} for i in range(50)]},
        )
        c.post("/v1/spaces/bao/delete", json={**where, "ids": ["t3", "t4"]})
        c.put("/v1/devices/me", json={"name": "one", "apps": {"bao": {"version": "1"}}})
        c.post("/v1/devices/activate", json={"app": "bao"})
        c.delete(f"/v1/devices/{dev.peers[1]}")
        before = {
            "records": c.post(
                "/v1/spaces/bao/query", json={**where, "includeDeleted": True}
            ).json(),
            "changes": c.get("/v1/spaces/bao/changes").json(),
            "devices": c.get("/v1/devices").json(),
            "types": c.get("/v1/spaces/bao/types?includeHidden=true").json(),
            "datasets": c.get("/v1/spaces/bao/datasets").json(),
        }
    peers = list(dev.peers)
    dev.restart()
    assert dev.peers == peers
    assert trigger_anchor(dev.url) == (tid, anchor)
    with httpx.Client(base_url=dev.url, timeout=10) as c:
        after = {
            "records": c.post(
                "/v1/spaces/bao/query", json={**where, "includeDeleted": True}
            ).json(),
            "changes": c.get("/v1/spaces/bao/changes").json(),
            "devices": c.get("/v1/devices").json(),
            "types": c.get("/v1/spaces/bao/types?includeHidden=true").json(),
            "datasets": c.get("/v1/spaces/bao/datasets").json(),
        }
        assert after == before
        assert before["changes"]["seq"] == 52
        resp = c.post(
            "/v1/spaces/bao/upsert", json={**where, "records": [{"id": "t3", "fields": {}}]}
        )
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "tombstoned"
        c.post("/v1/spaces/bao/upsert", json={**where, "records": [{"id": "new", "fields": {}}]})
        assert c.get("/v1/spaces/bao/changes?since=52").json()["changes"][0]["seq"] == 53
    resp = httpx.put(f"{dev.urls[1]}/v1/devices/me", json={"apps": {}}, timeout=10)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "pruned"


def test_sigint_and_sigterm_exit_cleanly(devserver_factory: Factory) -> None:
    dev = devserver_factory()
    assert dev.stop(signal.SIGINT) == 0
    dev.start()
    assert dev.stop(signal.SIGTERM) == 0
    assert "Traceback" not in dev.log.read_text()


def test_the_fixture_restarts_on_the_same_file(devserver: DevserverProcess) -> None:
    _, anchor = trigger_anchor(devserver.url)
    httpx.post(
        f"{devserver.url}/v1/spaces/bao/upsert",
        timeout=10,
        json={
            "objectId": anchor,
            "dataset": "agent_triggers",
            "records": [{"id": "a", "fields": {}}],
        },
    )
    devserver.restart()
    body = httpx.post(
        f"{devserver.url}/v1/spaces/bao/query",
        timeout=10,
        json={"objectId": anchor, "dataset": "agent_triggers"},
    ).json()
    assert [r["id"] for r in body["records"]] == ["a"]
    assert devserver.db.is_file()


# the seeds' own curl commands, run as written (curl and jq), against --devices 2


def sh(script: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


needs_curl_jq = pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("jq")), reason="the seeds' commands need curl and jq"
)


def seed_env(dev: DevserverProcess) -> dict[str, str]:
    # The seeds talk to 127.0.0.1:7001; point them at the test's port instead.
    return {"DEV": dev.url, "SPACE": "bao", "BAO": "bao", "PEER": dev.peers[1], "CHAT": "chat-1"}


@needs_curl_jq
def test_seed_devices_jq_line(devserver_factory: Factory) -> None:
    dev = devserver_factory(devices=2)
    out = sh(
        "curl -s $DEV/v1/devices | jq '{self, active, devices: [.devices[] | {peerId, name, os}]}'",
        seed_env(dev),
    )
    view = json.loads(out)
    assert view["self"] == dev.peers[0] and view["active"] == {}
    assert [d["peerId"] for d in view["devices"]] == dev.peers
    assert all(
        set(d) == {"peerId", "name", "os"} and d["name"] and d["os"] for d in view["devices"]
    )


@needs_curl_jq
def test_seed_scheduling_lookup_upsert_and_query(devserver_factory: Factory) -> None:
    dev = devserver_factory(devices=2)
    env = seed_env(dev)
    anchor = sh(
        "curl -s -X POST $DEV/v1/spaces/$SPACE/bundles/bao%2Fv1/children "
        "-H 'Content-Type: application/json' -d '{\"seed\": \"bao/triggers/v1\"}' "
        "| jq -r .objectId",
        env,
    ).strip()
    assert anchor.startswith("bafyrei")
    env["ANCHOR"] = anchor
    out = sh(
        r'''curl -s -X POST $DEV/v1/spaces/$SPACE/upsert \
  -H 'Content-Type: application/json' \
  -d "{\"objectId\": \"$ANCHOR\", \"dataset\": \"agent_triggers\",
       \"records\": [{\"id\": \"daily-digest\", \"fields\": {
         \"name\": \"daily digest\", \"kind\": \"cron\", \"spec\": {\"cron\": \"0 8 * * *\"},
         \"program\": \"agent:rollup@v1\", \"args\": {\"space\": \"$SPACE\", \"chatId\": \"$CHAT\"},
         \"enabled\": true}}]}"''',
        env,
    )
    assert json.loads(out) == {"records": [{"id": "daily-digest", "version": 1}]}
    env["TRIGGERS"] = sh(
        "curl -s $DEV/v1/spaces/$BAO/datasets | jq -r '.datasets[].name | "
        'select(endswith("_agent_triggers"))\'',
        env,
    ).strip()
    assert env["TRIGGERS"].endswith("_agent_triggers") and env["TRIGGERS"].startswith("t_")
    # pin the digest to device 2, as the device-pins seed does (collection name this time)
    sh(
        r'''curl -s -X POST $DEV/v1/spaces/$SPACE/upsert \
  -H 'Content-Type: application/json' \
  -d "{\"objectId\": \"$ANCHOR\", \"dataset\": \"$TRIGGERS\",
       \"records\": [{\"id\": \"daily-digest\", \"fields\": {\"owner\": \"$PEER\"}}]}"''',
        env,
    )
    out = sh(
        r"""curl -s -X POST $DEV/v1/spaces/$SPACE/query \
  -H 'Content-Type: application/json' \
  -d "{\"objectId\": \"$ANCHOR\", \"dataset\": \"$TRIGGERS\"}" \
  | jq -c '.records[] | {id, name, kind, owner, enabled, lastStatus}' """,
        env,
    )
    assert json.loads(out) == {
        "id": "daily-digest",
        "name": "daily digest",
        "kind": "cron",
        "owner": dev.peers[1],
        "enabled": True,
        "lastStatus": None,
    }


@needs_curl_jq
def test_seed_trigger_schema_typed_anchor_and_modify(devserver_factory: Factory) -> None:
    dev = devserver_factory(devices=2)
    env = seed_env(dev)
    with httpx.Client(base_url=dev.url, timeout=10) as c:
        c.post(
            "/v1/spaces/bao/types",
            json={"key": "agent_trigger", "hidden": True, "idRule": "user", "dynamic": True},
        )
    env["TYPE"] = sh(
        """curl -s "$DEV/v1/spaces/$BAO/types?includeHidden=true" """
        """| jq -r '.types[] | select(.key == "agent_trigger") | .id'""",
        env,
    ).strip()
    env["TRIGGER_ANCHOR"] = sh(
        r"""curl -s -X POST $DEV/v1/spaces/$BAO/bundles/bao%2Fv1/children """
        r"""-H 'Content-Type: application/json' """
        r"""-d "{\"seed\": \"bao/triggers/v1\", \"type\": \"$TYPE\"}" | jq -r .objectId""",
        env,
    ).strip()
    env["TRIGGERS"] = sh(
        "curl -s $DEV/v1/spaces/$BAO/datasets | jq -r '.datasets[].name | "
        'select(endswith("_agent_triggers"))\'',
        env,
    ).strip()
    assert env["TRIGGERS"] == f"{env['TYPE']}_agent_triggers"
    out = sh(
        """curl -s -X POST $DEV/v1/spaces/$BAO/modify -H 'Content-Type: application/json' -d '{
  "objectId": "'$TRIGGER_ANCHOR'", "dataset": "'$TRIGGERS'",
  "records": [{"id": "remind-standup", "upsert": true, "ops": [{"type": "$set", "path": "", "value": {
    "name": "Standup reminder", "kind": "once", "spec": {"at": 1787000000},
    "program": "agent:remind@v1",
    "args": {"space": "'$BAO'", "chatId": "'$CHAT'", "text": "standup in 5"}, "enabled": true }}]}]}' """,  # noqa: E501 (the seed, verbatim)
        env,
    )
    assert json.loads(out) == {"records": [{"id": "remind-standup", "version": 1}]}
    # the runs query the schema seed describes
    with httpx.Client(base_url=dev.urls[1], timeout=10) as c:
        runs = c.post(
            "/v1/spaces/bao/bundles/bao%2Fv1/children",
            json={"seed": "bao/runs/v1", "type": env["TYPE"]},
        ).json()["objectId"]
        where: dict[str, Any] = {"objectId": runs, "dataset": f"{env['TYPE']}_agent_runs"}
        c.post(
            "/v1/spaces/bao/upsert",
            json={
                **where,
                "records": [
                    {
                        "id": f"run{i}",
                        "fields": {
                            "triggerId": "remind-standup" if i % 2 else "x",
                            "startedAt": 100 + i,
                        },
                    }
                    for i in range(6)
                ],
            },
        )
        body = c.post(
            "/v1/spaces/bao/query",
            json={**where, "filter": {"triggerId": "remind-standup"}, "sort": ["-startedAt"]},
        ).json()
        assert [r["id"] for r in body["records"]] == ["run5", "run3", "run1"]
        rec = c.post(
            "/v1/spaces/bao/query",
            json={"objectId": env["TRIGGER_ANCHOR"], "dataset": "agent_triggers"},
        ).json()
        assert rec["records"][0]["spec"] == {"at": 1787000000}


def test_module_entry_point_runs_the_devserver(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "anyrtd",
            "devserver",
            "--port",
            "0",
            "--db",
            str(tmp_path / "m.sqlite3"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert DEVSERVER_LINE.match(proc.stdout.readline().strip())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def test_a_db_that_is_not_a_devserver_database_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("these are my notes, not a database\n" * 100)
    done = subprocess.run(
        [*anyrtd_command(), "devserver", "--port", "0", "--db", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert "not a devserver database" in done.stderr and "Traceback" not in done.stderr
    assert bad.read_text().startswith("these are my notes")
