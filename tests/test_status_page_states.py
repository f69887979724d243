"""The status page's state cell and legend in headless Chromium, against a real `anyrtd
serve` on a real devserver: a trigger that cannot run here says so (the word the list and
`why` give it, its reason, a red badge), a built-in not shipped is quiet, a consumed `once`
offers no "enable", and the legend tells a trigger's last status from a run's status."""

from __future__ import annotations

import time

import httpx
import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from test_status_page import browser, hourly, open_page, put, row, served, wait_for

from anyrtd.vocab import Severity, TriggerState

__all__ = ["browser", "served"]  # the fixtures, shared with tests/test_status_page.py

pytestmark = pytest.mark.process


def state_cell(b: WebDriver, rid: str) -> tuple[str, str, str] | None:
    """Return (state, text, severity) of a row's state cell, once it is drawn."""
    tr = row(b, rid)
    if tr is None:
        return None
    badge = tr.find_elements(By.CSS_SELECTOR, "td.state .badge")
    if not badge:
        return None
    return (
        tr.get_attribute("data-state") or "",
        badge[0].text,
        badge[0].get_attribute("data-severity") or "",
    )


def test_the_state_cell_says_what_list_and_why_say(
    browser: WebDriver, served: ServeProcess, devserver: DevserverProcess
) -> None:
    me = devserver.peers[0]
    hourly(devserver.url, "steady")
    put(
        devserver.url, "backup", kind="cron", spec={"every_s": 3600},
        program="mine:backup@v1", owner=me,
    )  # fmt: skip
    put(
        devserver.url, "shot", kind="once", spec={"at": time.time() - 600},
        program="test:echo@v1", owner=me, enabled=False, lastRunAt=time.time() - 590,
        lastStatus="ok",
    )  # fmt: skip
    open_page(browser, served)
    wanted = {
        "steady": (TriggerState.SCHEDULED, "scheduled", Severity.OK),
        "backup": (TriggerState.CANNOT_RUN, "cannot_run (not_installed)", Severity.BAD),
        "extraction": (TriggerState.UNAVAILABLE, "unavailable (not_installed)", Severity.QUIET),
        "shot": (TriggerState.CONSUMED, "consumed", Severity.QUIET),
    }
    wait_for(
        browser,
        lambda b: all(state_cell(b, rid) == want for rid, want in wanted.items()),
        "each state cell to show its state",
    )
    backup = row(browser, "backup")
    assert backup is not None
    badge = backup.find_element(By.CSS_SELECTOR, "td.state .badge")
    assert "sev-bad" in (badge.get_attribute("class") or "").split()
    # no next fire where it cannot fire, as `triggers list` shows it ("-")
    assert backup.find_element(By.CSS_SELECTOR, "td.next").text == "—"
    steady_row = row(browser, "steady")
    assert (
        steady_row is not None and steady_row.find_element(By.CSS_SELECTOR, "td.next").text != "—"
    )
    # red as the seeds' error badges are: the colour of its severity, not of its word
    color = badge.value_of_css_property("background-color")
    assert color in ("rgba(253, 236, 234, 1)", "rgb(253, 236, 234)"), color

    # the page, the list and why agree: the same words from the control API
    with httpx.Client(base_url=f"http://{served.listen}") as c:
        for rid, (state, _text, severity) in wanted.items():
            listed = {t["id"]: t for t in c.get("/triggers", params={"all": "true"}).json()}
            why = c.get(f"/triggers/{rid}/why").json()
            assert listed[rid]["state"] == why["state"] == state, (rid, listed[rid], why)
            assert listed[rid]["severity"] == why["severity"] == severity
        refused = c.post("/triggers/shot/enable", headers={"Content-Type": "application/json"})
        assert refused.status_code == 409, refused.text
        assert "anyrtd triggers edit shot --at" in refused.json()["error"]["message"]

    # a consumed once offers no "enable": it would not run it again
    shot = row(browser, "shot")
    assert shot is not None
    assert not shot.find_element(By.CSS_SELECTOR, "button.toggle").is_displayed()
    steady = row(browser, "steady")
    assert steady is not None
    assert steady.find_element(By.CSS_SELECTOR, "button.toggle").is_displayed()

    legend = browser.find_element(By.ID, "legend").text
    assert (
        "last status is the trigger's" in legend
        and "error when its last run ended FAILED" in legend
    )
    assert "run status" in legend and "cannot fire until fixed" in legend
