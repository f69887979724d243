"""One spec check for every door: what `anyrtd serve` marks `invalid_spec` is what its
control API's PATCH and the CLI refuse, with the same reason: a cron whose last year has
passed, a cron over the size limits, and an `every_s` below one second."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from conftest import DevserverProcess, anyrtd_command
from control_support import ServeProcess
from support import put_triggers, wait_until

from anyrtd.client import ServerClient
from anyrtd.places import resolve_places

PY = sys.executable
ECHO = (
    '[programs."test:echo@v1"]',
    f'argv = ["{PY}", "-c", "print(\'hello\')"]',
)
PAST_YEAR = "0 0 1 1 * 0 2020"
PAST_YEAR_REASON = (
    f'cron "{PAST_YEAR}" has no occurrence after now: the last year of its year field has passed'
)
# Valid item by item and under the control API's 256 KiB body limit, but over 1,024 characters.
HUGE_LIST = ",".join(["1"] * 60_000) + " * * * *"


@pytest.fixture
def served(serve_on: Callable[..., ServeProcess]) -> ServeProcess:
    return serve_on(ECHO)


def record(url: str, rid: str) -> dict[str, Any] | None:
    """Return the trigger record `rid` as the server holds it."""

    async def main() -> dict[str, Any] | None:
        async with ServerClient(url) as client:
            places = await resolve_places(client, "bao")
            records, _ = await client.query(places.triggers, filter={"id": rid})
            return records[0] if records else None

    return asyncio.run(main())


def trigger(served: ServeProcess, rid: str, *, marked: bool) -> dict[str, Any]:
    """Wait until the daemon has adopted `rid` (with a marker, or without one) and return it."""

    def check() -> dict[str, Any] | None:
        with served.http() as c:
            resp = c.get(f"/triggers/{rid}")
        body: dict[str, Any] = resp.json()
        if resp.status_code != 200 or not body.get("adopted") or body["state"] == "claiming":
            return None
        return body if (body["marker"] is not None) == marked else None

    return wait_until(check, timeout=30, what=f"{rid} adopted by anyrtd serve")


def write(rid: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "cron", "spec": spec, "program": "test:echo@v1", "owner": ""}


def test_the_daemon_marks_and_patch_refuses_the_same_specs_with_the_same_reason(
    served: ServeProcess, devserver: DevserverProcess
) -> None:
    put_triggers(
        devserver.url,
        {
            "fine": write("fine", {"cron": "0 9 * * *"}),
            "past": write("past", {"cron": PAST_YEAR}),
            "huge": write("huge", {"cron": HUGE_LIST}),
            "rapid": write("rapid", {"every_s": 0.001}),
        },
    )
    marked: dict[str, str] = {}
    for rid in ("past", "huge", "rapid"):
        t = trigger(served, rid, marked=True)
        assert t["marker"] == "invalid_spec", t
        marked[rid] = t["markerReason"]
    assert marked["past"] == PAST_YEAR_REASON
    assert "characters long, more than the limit of 1024" in marked["huge"]
    assert "less than the minimum of 1 second" in marked["rapid"]
    assert trigger(served, "fine", marked=False)["marker"] is None

    with served.http() as c:
        for rid, spec in (
            ("past", {"cron": PAST_YEAR}),
            ("huge", {"cron": HUGE_LIST}),
            ("rapid", {"every_s": 0.001}),
        ):
            resp = c.patch("/triggers/fine", json={"spec": spec})
            assert resp.status_code == 400, resp.text
            error = resp.json()["error"]
            assert error["code"] == "invalid_spec"
            assert error["message"] == f"spec refused, nothing was written: {marked[rid]}"
        resp = c.patch("/triggers/fine", json={"spec": {"every_s": 1}})
        assert resp.status_code == 200, resp.text
        assert c.get("/healthz").status_code == 200
    fine = record(devserver.url, "fine")
    assert fine is not None and fine["spec"] == {"every_s": 1}


def run_cli(
    served: ServeProcess, devserver: DevserverProcess, *args: str
) -> subprocess.CompletedProcess[str]:
    empty = served.tmp / "empty.toml"
    empty.write_text("")
    env = {
        **os.environ,
        "ANYRTD_CONFIG": str(empty),
        "ANYRTD_SERVER": devserver.url,
        "ANYRTD_LISTEN": served.listen,
        "ANYRTD_STATE_DIR": str(served.state),
    }
    return subprocess.run(
        [*anyrtd_command(), *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_cli_refuses_what_the_daemon_would_mark(
    served: ServeProcess, devserver: DevserverProcess
) -> None:
    for flags, reason in (
        (("--cron", PAST_YEAR), PAST_YEAR_REASON),
        (
            ("--every", "0.5"),
            "every_s 0.5 is less than the minimum of 1 second (cron's finest grain); "
            "give 1 or more",
        ),
    ):
        out = run_cli(
            served,
            devserver,
            "triggers",
            "create",
            "--id",
            "refused",
            *flags,
            "--program",
            "test:echo@v1",
        )
        assert out.returncode == 1, (out.stdout, out.stderr)
        assert out.stderr.strip() == f"Error: trigger refused: {reason}"
        assert record(devserver.url, "refused") is None
    out = run_cli(
        served,
        devserver,
        "triggers",
        "create",
        "--id",
        "later",
        "--cron",
        "0 0 1 1 * 0 2090",
        "--program",
        "test:echo@v1",
        "--yes",  # test:echo@v1 is the daemon's own, not in this CLI's program table
    )
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert trigger(served, "later", marked=False)["marker"] is None
