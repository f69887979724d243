"""The status page offers "run now" only where a run by hand can run (issue 23, item 2), in
headless Chromium against a real `anyrtd serve` (the fixtures of tests/test_status_page.py)."""

from __future__ import annotations

from conftest import DevserverProcess
from control_support import ServeProcess
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from test_status_page import browser, hourly, open_page, put, row, served, wait_for  # noqa: F401


def run_button_shown(b: WebDriver, rid: str) -> bool | None:
    tr = row(b, rid)
    if tr is None or tr.get_attribute("data-state") in (None, "claiming"):
        return None
    return tr.find_element(By.CSS_SELECTOR, "button.run").is_displayed()


def test_run_now_is_not_offered_where_it_could_only_fail(
    browser: WebDriver,  # noqa: F811 - the fixture
    served: ServeProcess,  # noqa: F811 - the fixture
    devserver: DevserverProcess,
) -> None:
    hourly(devserver.url, "offered")
    put(
        devserver.url,
        "missing",
        kind="cron",
        spec={"every_s": 3600},
        program="nobody:missing@v1",
        owner="",
    )
    open_page(browser, served)
    wait_for(browser, lambda b: run_button_shown(b, "offered") is True, "run now on offered")
    for rid in ("missing", "chat-watch", "extraction"):
        wait_for(browser, lambda b, rid=rid: run_button_shown(b, rid) is False, f"no run on {rid}")
    assert run_button_shown(browser, "offered") is True
