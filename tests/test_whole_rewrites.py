"""A user's whole-record rewrite of a trigger (`modify` with `$set` at path `""`, made from the
record as read, conditional on its version, but without the runtime's bookkeeping: `claim`,
`noticed`, `handoff:<peer>`) at any moment: mid-claim, right after a notice, mid-handoff.
Nothing fires twice and no notice is made twice (docs/election.md, docs/notices.md). Real
processes: a devserver, one or two `anyrtd serve`, command programs that note each start."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from support import World, wait_until
from test_notices_serve import activate, delivered, election

from anyrtd.client import ServerError, ServerUnavailable

pytestmark = pytest.mark.timeout(180)

PY = sys.executable
BOOKKEEPING = ("claim", "noticed")
"""Keys of the runtime the user's tool does not know (and `handoff:<peer>` ones)."""


def _rewrite(world: World, rid: str) -> bool:
    """Rewrite `rid` whole, as read now less the runtime's bookkeeping, if still at the
    version read; return whether the server took it."""
    record = world.record(rid)
    version = record["_v"]
    value = {
        k: v
        for k, v in record.items()
        if k not in BOOKKEEPING and not k.startswith("handoff") and not k.startswith("_")
    }

    async def write(client: Any, places: Any) -> None:
        body = {
            "objectId": places.triggers.object_id,
            "dataset": places.triggers.name,
            "records": [
                {
                    "id": rid,
                    "ifVersion": version,
                    "ops": [{"type": "$set", "path": "", "value": value}],
                }
            ],
        }
        await client._call("POST", client._space_path(places.triggers, "modify"), body)

    try:
        world.call(write)
    except ServerError as exc:
        if exc.code == "version_conflict":
            return False  # the daemon wrote meanwhile: a careful user reads again
        raise
    return True


class Rewriter:
    """Rewrites a record whole every `every_s` in a thread, until stopped."""

    def __init__(self, world: World, rid: str, every_s: float = 0.15) -> None:
        self.world, self.rid, self.every_s = world, rid, every_s
        self.taken = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._go, daemon=True)

    def __enter__(self) -> Rewriter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _go(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(ServerUnavailable, AssertionError):
                self.taken += _rewrite(self.world, self.rid)


def _note_program(log: Path, name: str, exit_code: int) -> tuple[str, ...]:
    code = (
        "import os, sys; "
        f"open({str(log)!r}, 'a').write(os.environ['ANYRTD_TRIGGER_ID'] + chr(10)); "
        f"sys.exit({exit_code})"
    )
    return (f'[programs."{name}"]', f"argv = {json.dumps([PY, '-c', code])}")


def _starts(log: Path, rid: str) -> int:
    return log.read_text().split().count(rid) if log.exists() else 0


def test_rewrites_around_a_claim_and_a_fire_run_a_once_once(
    devserver: DevserverProcess, world: World, tmp_path: Path
) -> None:
    log = tmp_path / "starts.log"
    serve = ServeProcess(tmp_path, devserver.url, config_lines=_note_program(log, "t:ok@v1", 0))
    serve.start()
    try:
        at = time.time() + 3.0
        world.put("shot", kind="once", spec={"at": at}, program="t:ok@v1", owner="")
        wait_until(lambda: world.record("shot").get("claim"), timeout=20, what="a claim")
        # from mid-claim (stamped, not confirmed yet) to after the fire
        with Rewriter(world, "shot", every_s=0.3) as rewriter:
            wait_until(lambda: _starts(log, "shot") >= 1, timeout=30, what="the fire")
            wait_until(
                lambda: world.record("shot").get("lastRunAt") is not None,
                timeout=30,
                what="the once consumed",
            )
            time.sleep(3.0)  # rewrites go on after the fire, then a claim could come again
        assert rewriter.taken >= 5
        time.sleep(2.0)
        assert _starts(log, "shot") == 1
        assert world.record("shot")["enabled"] is False
    finally:
        serve.stop()


@pytest.fixture
def pair(
    devserver_factory: Callable[..., DevserverProcess], tmp_path: Path
) -> Iterator[tuple[DevserverProcess, ServeProcess, ServeProcess, Path, Path]]:
    out = tmp_path / "notices"
    out.mkdir()
    log = tmp_path / "starts.log"
    keep = (
        "import sys, uuid, pathlib; "
        f"pathlib.Path({str(out)!r}, uuid.uuid4().hex + '.json')"
        ".write_bytes(sys.stdin.buffer.read())"
    )
    lines = (
        "election_poll_s = 0.5",
        "takeover_hold_s = 3",
        *_note_program(log, "t:fail@v1", 1),
        "[notices]",
        "[notices.command]",
        f"argv = {json.dumps([PY, '-c', keep])}",
    )
    server = devserver_factory(devices=2)
    a = ServeProcess(tmp_path, server.urls[0], name="a", config_lines=lines)
    b = ServeProcess(tmp_path, server.urls[1], name="b", config_lines=lines)
    try:
        a.start()
        wait_until(lambda: election(a)["verdict"] == "active", timeout=30, what="a active")
        b.start()
        yield server, a, b, out, log
    finally:
        a.stop()
        b.stop()


def test_a_rewrite_right_after_a_notice_and_across_a_handoff_makes_it_once(
    pair: tuple[DevserverProcess, ServeProcess, ServeProcess, Path, Path],
) -> None:
    server, a, b, out, log = pair
    world = World(server.url)
    world.put("shot", kind="once", spec={"at": time.time() + 2}, program="t:fail@v1", owner="")
    wait_until(lambda: delivered(out), timeout=40, what="the once_failed notice")
    assert [n["kind"] for n in delivered(out)] == ["once_failed"]
    # right after the notice: the rewrite drops whatever marks it on the record
    wait_until(lambda: _rewrite(world, "shot"), timeout=20, what="a rewrite taken")
    with Rewriter(world, "shot", every_s=0.3), Rewriter(world, "chat-watch", every_s=0.3):
        activate(server.urls[1])  # the role moves to B, beats rewritten away meanwhile
        wait_until(lambda: election(b)["verdict"] == "active", timeout=30, what="b active")
        wait_until(lambda: election(a)["verdict"] != "active", timeout=30, what="a stands down")
        time.sleep(8.0)  # B's hold ends (3 s at most), then several passes of its notices
    assert [n["kind"] for n in delivered(out)] == ["once_failed"]
    assert _starts(log, "shot") == 1
