"""`GET /agenda` on a real daemon against an in-process devserver: every trigger of the space,
wherever it is pinned, in time order, with its device's state and risk; bad input a 400."""

from __future__ import annotations

from typing import Any

import pytest
from support import async_wait_until
from test_control import Stack, stack  # noqa: F401 (a fixture)

from anyrtd.vocab import MissCause, OwnerState

GONE = "12D3KooWgone"


async def _agenda(stack: Stack, query: str = "") -> dict[str, Any]:  # noqa: F811
    status, body = await stack.json("GET", "/agenda" + query)
    assert status == 200, body
    return body  # type: ignore[no-any-return]


async def test_the_agenda_lists_every_devices_triggers_in_time_order(
    stack: Stack,  # noqa: F811
) -> None:
    await stack.create("here", spec={"every_s": 600})
    await stack.put(
        "berlin",
        kind="cron",
        spec={"cron": "*/20 * * * *", "tz": "Europe/Berlin"},
        program="test:echo@v1",
        owner=GONE,
    )
    await stack.put("off", kind="cron", spec={"every_s": 60}, program="test:echo@v1", enabled=False)

    async def both() -> dict[str, Any] | None:
        body = await _agenda(stack, "?hours=1")
        ids = {o["triggerId"] for o in body["occurrences"]}
        return body if {"here", "berlin"} <= ids else None

    body = await async_wait_until(both, timeout=15, what="both triggers in the agenda")
    occ = body["occurrences"]
    assert [o["at"] for o in occ] == sorted(o["at"] for o in occ)
    assert "off" not in {o["triggerId"] for o in occ}
    assert body["hours"] == 1 and body["until"] == pytest.approx(body["now"] + 3600)
    here = next(o for o in occ if o["triggerId"] == "here")
    assert here["owner"] == stack.me == here["device"]  # claimed by this, the active device
    assert here["deviceState"] == OwnerState.RUNNING and here["atRisk"] is False
    assert here["reason"] is None and here["fix"] is None
    berlin = [o for o in occ if o["triggerId"] == "berlin"]
    assert len(berlin) == 3
    first = berlin[0]
    assert first["tz"] == "Europe/Berlin" and first["local"].endswith(("CET", "CEST"))
    assert first["deviceState"] == OwnerState.UNKNOWN and first["atRisk"] is True
    assert first["cause"] == MissCause.OWNER_UNKNOWN
    assert "not in the devices registry" in first["reason"]
    assert first["fix"] == "anyrtd triggers pin berlin PEER"
    assert body["atRisk"] == 3

    only = await _agenda(stack, f"?hours=1&device={GONE}")
    assert {o["triggerId"] for o in only["occurrences"]} == {"berlin"}


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("?hours=0", "at most 168"),
        ("?hours=169", "at most 168"),
        ("?hours=-1", "more than 0"),
        ("?hours=soon", "must be a number of hours"),
        ("?hours=nan", "more than 0"),
        ("?device=%1b%5b31m", "give a peer id or a device name"),
    ],
)
async def test_bad_input_gets_a_400_that_says_what_is_wrong(
    stack: Stack,  # noqa: F811
    query: str,
    says: str,
) -> None:
    status, body = await stack.json("GET", "/agenda" + query)
    assert status == 400
    assert body["error"]["code"] == "bad_request"
    assert says in body["error"]["message"]
