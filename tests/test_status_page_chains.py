"""The status page shows a chain: its row says when it fires, its detail the run that fired
it last (headless Chromium against a real `anyrtd serve`, docs/events.md)."""

from __future__ import annotations

import asyncio
import time

from conftest import DevserverProcess
from control_support import ServeProcess
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from test_status_page import browser, hourly, open_page, put, row, served, wait_for

from anyrtd.client import ServerClient, Upsert
from anyrtd.places import resolve_places

__all__ = ["browser", "served"]  # the page tests' fixtures, shared


def land_run(server_url: str, run_id: str, trigger_id: str) -> None:
    """Write an ended run's record, as another device's outbox would."""

    async def main() -> None:
        async with ServerClient(server_url) as client:
            places = await resolve_places(client, "bao")
            now = time.time()
            record = {
                "runId": run_id,
                "triggerId": trigger_id,
                "status": "ok",
                "device": "nas",
                "startedAt": now,
                "endedAt": now,
            }
            await client.upsert(places.runs, [Upsert(run_id, record)])

    asyncio.run(main())


def test_a_chain_shows_what_it_answers_and_the_run_that_fired_it(
    browser: WebDriver, served: ServeProcess, devserver: DevserverProcess
) -> None:
    open_page(browser, served)
    hourly(devserver.url, "nightly-backup")
    spec = {"dataset": "agent_runs", "filter": {"triggerId": "nightly-backup"}}
    put(devserver.url, "report", kind="event", spec=spec, program="test:echo@v1", owner="")
    wait_for(
        browser,
        lambda b: (
            (tr := row(b, "report")) is not None
            and "after each ok run of nightly-backup"
            in tr.find_element(By.CSS_SELECTOR, "td.schedule").text
        ),
        "the chain's row to say when it fires",
    )

    def listening() -> bool:
        with served.http() as c:
            return c.get("/triggers/report").json().get("state") == "listening"

    wait_for(browser, lambda _b: listening(), "the chain to be claimed and listening")
    land_run(devserver.url, "up-page-1", "nightly-backup")
    tr = row(browser, "report")
    assert tr is not None
    tr.find_element(By.CSS_SELECTOR, "td.id").click()
    wait_for(
        browser,
        lambda b: "last fired by run up-page-1" in b.find_element(By.ID, "detail").text,
        "the detail to name the run that fired the chain",
    )
