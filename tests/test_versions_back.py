"""The server's versions go back (docs/reliability.md, "When the server's versions go back"):
a devserver restarted on an older copy of its database, and a proxy that adds 1e9 to every
version for a while. A user's disable, a re-spec and a `POST /triggers/ID/disable` through
the control API take effect within seconds, and the control API answers what the record is.
Real processes: a devserver, `anyrtd serve`, command programs that note each start."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import DevserverProcess
from control_support import ServeProcess
from support import World, wait_until
from yarl import URL

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults.proxy import FaultProxy

pytestmark = pytest.mark.timeout(180)

PY = sys.executable
INFLATE = 1_000_000_000
IDS = ("a", "b", "c")


class VersionProxy(FaultProxy):
    """A pass-through proxy whose `upstream` may change (a devserver restarted on a new port)
    and which, while `inflate` is set, adds `INFLATE` to every version the server answers
    (and takes it off the `ifVersion` of a write)."""

    inflate = False

    async def _forward(self, request: web.Request) -> tuple[int, str, bytes]:
        assert self._session is not None
        data = await request.read()
        if self.inflate and data:
            data = json.dumps(_shift(json.loads(data), -INFLATE, ("ifVersion",))).encode()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with self._session.request(
            request.method,
            URL(self.upstream + request.raw_path, encoded=True),
            data=data if data else None,
            headers=headers if data else None,
        ) as resp:
            status, body = resp.status, await resp.read()
            content_type = resp.headers.get("Content-Type", "application/json")
        if self.inflate and status == 200 and body:
            body = json.dumps(_shift(json.loads(body), INFLATE, ("_v", "version"))).encode()
        return status, content_type, body


def _shift(value: Any, by: int, keys: tuple[str, ...]) -> Any:
    """Return `value` with every integer under one of `keys` moved by `by` (not below 1)."""
    if isinstance(value, dict):
        return {
            k: (
                max(1, v + by)
                if k in keys and isinstance(v, int) and not isinstance(v, bool) and v > 0
                else _shift(v, by, keys)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_shift(v, by, keys) for v in value]
    return value


@pytest.fixture
def proxy(devserver: DevserverProcess) -> Iterator[VersionProxy]:
    p = VersionProxy(devserver.url).start()
    try:
        yield p
    finally:
        p.stop()


def _note_program(log: Path) -> tuple[str, ...]:
    code = (
        "import os, time; "
        f"open({str(log)!r}, 'a').write(os.environ['ANYRTD_TRIGGER_ID'] + ' ' "
        "+ repr(time.time()) + chr(10))"
    )
    return ('[programs."test:note@v1"]', f"argv = {json.dumps([PY, '-c', code])}")


def _starts(log: Path) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            rid, _, at = line.partition(" ")
            if at:
                found.setdefault(rid, []).append(float(at))
    return found


def _every_second(world: World, *ids: str) -> None:
    for rid in ids:
        world.put(rid, kind="cron", spec={"every_s": 1}, program="test:note@v1", owner="")


def _firing(log: Path, ids: tuple[str, ...], n: int) -> None:
    since = time.time()
    wait_until(
        lambda: all(sum(1 for t in _starts(log).get(r, []) if t > since) >= n for r in ids),
        timeout=30,
        what=f"{ids} to fire {n} times each",
    )


def _change_all(world: World, serve: ServeProcess, ids: tuple[str, str, str]) -> float:
    """Disable the first on the server, re-spec the second to an hour, disable the third
    through the control API (which must answer what the record then is); return when."""
    first, second, third = ids
    at = time.time()
    world.put(first, enabled=False)
    world.put(second, spec={"every_s": 3600})
    with serve.http() as c:
        resp = c.post(f"/triggers/{third}/disable")
    assert resp.status_code == 200, resp.text
    assert resp.json()["enabled"] is False and resp.json()["state"] != "scheduled", resp.json()
    assert world.record(third)["enabled"] is False
    return at


def _took_effect(log: Path, ids: tuple[str, ...], at: float) -> None:
    """Wait until none of `ids` started for 3 s; each last started within 2.5 s of `at`."""

    def quiet() -> bool:
        starts = _starts(log)
        return all(time.time() - max(starts.get(r, [0.0])) >= 3.0 for r in ids)

    wait_until(quiet, timeout=15, what=f"{ids} to stop firing after the changes")
    starts = _starts(log)
    late = {r: round(max(starts[r]) - at, 2) for r in ids if max(starts[r]) - at > 2.5}
    assert not late, f"fired this long after the change (s): {late}"


def _warnings(serve: ServeProcess) -> int:
    return serve.log.read_text(errors="replace").count("the server's versions went back")


def test_a_server_restored_from_an_older_copy_is_followed_at_once(
    devserver: DevserverProcess, proxy: VersionProxy, world: World, tmp_path: Path
) -> None:
    log = tmp_path / "starts.log"
    _every_second(world, *IDS)
    serve = ServeProcess(tmp_path, proxy.url, config_lines=_note_program(log)).start()
    try:
        _firing(log, IDS, 2)
        backup = tmp_path / "backup.sqlite3"
        with sqlite3.connect(devserver.db) as src, sqlite3.connect(backup) as dst:
            src.backup(dst)
        for n in range(30):  # the live server's versions run well ahead of the copy's
            for rid in IDS:
                world.put(rid, note=n)
        _firing(log, IDS, 2)
        devserver.stop()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{devserver.db}{suffix}").unlink(missing_ok=True)
        shutil.copy(backup, devserver.db)
        devserver.start()
        proxy.upstream = devserver.url
        restored = World(devserver.url)
        assert restored.record("a")["_v"] < 30
        at = _change_all(restored, serve, IDS)
        _took_effect(log, IDS, at)
        assert restored.record("b")["spec"] == {"every_s": 3600}
        assert serve.trigger("a")["enabled"] is False
        assert serve.trigger("b")["spec"] == {"every_s": 3600}
        assert _warnings(serve) == 1
    finally:
        serve.stop()


def test_versions_inflated_for_a_while_do_not_hide_later_edits(
    proxy: VersionProxy, world: World, tmp_path: Path
) -> None:
    log = tmp_path / "starts.log"
    _every_second(world, *IDS)
    proxy.inflate = True
    serve = ServeProcess(tmp_path, proxy.url, config_lines=_note_program(log)).start()
    try:
        _firing(log, IDS, 2)
        assert serve.trigger("a")["adopted"]
        proxy.inflate = False
        at = _change_all(world, serve, IDS)
        _took_effect(log, IDS, at)
        assert serve.trigger("b")["spec"] == {"every_s": 3600}
    finally:
        serve.stop()


def test_inflated_versions_in_the_mirror_do_not_hide_edits_after_a_restart(
    proxy: VersionProxy, world: World, tmp_path: Path
) -> None:
    log = tmp_path / "starts.log"
    later = ("d", "e", "f")
    _every_second(world, *later)
    proxy.inflate = True
    serve = ServeProcess(tmp_path, proxy.url, config_lines=_note_program(log)).start()
    try:
        _firing(log, later, 2)
        serve.stop()
        proxy.inflate = False  # the mirror holds versions above 1e9; the server, its own
        serve.start()
        _firing(log, later, 1)
        at = _change_all(world, serve, later)
        _took_effect(log, later, at)
        assert serve.trigger("e")["spec"] == {"every_s": 3600}
        # and the first full read (30 s after a start from a mirror) keeps them so
        wait_until(
            lambda: "took the server's records as they are now" in serve.log.read_text(),
            timeout=60,
            what="a full read after the versions went back",
        )
        world.put("d", enabled=True)
        _firing(log, ("d",), 2)
        assert serve.trigger("f")["enabled"] is False
    finally:
        serve.stop()
