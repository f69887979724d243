"""The status page's views (issue 38): a URL per trigger with its definition, next fires in
its own zone and UTC, why, missed and runs; a run's output followed as it grows; a filter
and an order the user picks; a time axis above the run strips. In headless Chromium against
a real `anyrtd serve` (the fixtures of tests/test_status_page.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote
from zoneinfo import ZoneInfo

import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from test_status_page import (  # noqa: F401 - fixtures
    ECHO,
    browser,
    hourly,
    not_reloaded,
    open_page,
    put,
    row,
    row_state,
    served,
    wait_for,
)

from anyrtd.vocab import RunStatus, TriggerState

PY = sys.executable
WAITER = (
    "import os, sys, time\n"
    "print('first line', flush=True)\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    "print('<b>second</b> line', flush=True)\n"
)


def shown(b: WebDriver, section: str) -> bool:
    return bool(b.execute_script(f"return !document.getElementById('{section}').hidden;"))


def hash_of(b: WebDriver) -> str:
    return str(b.execute_script("return location.hash;"))


def shown_ids(b: WebDriver) -> list[str]:
    return [
        tr.get_attribute("data-id") or ""
        for tr in b.find_elements(By.CSS_SELECTOR, "#triggers tbody tr")
    ]


def row_of(b: WebDriver, rid: str) -> WebElement | None:
    """Find a row by its id in the page's own terms (an id may hold quotes and brackets)."""
    found: WebElement | None = b.execute_script(
        "return [...document.querySelectorAll('#triggers tbody tr')]"
        ".find((tr) => tr.dataset.id === arguments[0]) || null;",
        rid,
    )
    return found


def fmt(at: float, zone: str) -> str:
    return datetime.fromtimestamp(at, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S")


def test_a_trigger_has_its_own_url_that_back_forward_and_reload_keep(
    browser: WebDriver,  # noqa: F811 - the fixture
    served: ServeProcess,  # noqa: F811 - the fixture
    devserver: DevserverProcess,
) -> None:
    put(
        devserver.url,
        "zoned",
        name="Morning in Berlin",
        kind="cron",
        spec={"cron": "30 7 * * *", "tz": "Europe/Berlin"},
        program="test:echo@v1",
        owner="",
    )
    hourly(devserver.url, "plain")
    open_page(browser, served)
    wait_for(browser, lambda b: row_state(b, "zoned") == TriggerState.SCHEDULED, "zoned to show")
    tr = row(browser, "zoned")
    assert tr is not None
    tr.find_element(By.CSS_SELECTOR, "td.owner").click()
    fires = wait_for(
        browser,
        lambda b: b.find_elements(By.CSS_SELECTOR, "#detail table.fires tbody tr"),
        "the trigger's view with its next fires",
    )
    assert hash_of(browser) == "#/triggers/zoned"
    assert shown(browser, "detail") and not shown(browser, "view-list")
    assert len(fires) == 5
    at = float(fires[0].get_attribute("data-at") or 0)
    cells = [td.text for td in fires[0].find_elements(By.TAG_NAME, "td")]
    # In its own zone (07:30 in Berlin), and in UTC.
    assert cells[1].startswith(fmt(at, "Europe/Berlin")) and "07:30:00" in cells[1]
    assert cells[2] == fmt(at, "UTC")
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#detail table.fires th")]
    assert heads[1:3] == ["Europe/Berlin", "UTC"]
    text = browser.find_element(By.ID, "detail").text
    assert "Morning in Berlin" in text and "test:echo@v1" in text and "cron 30 7 * * *" in text
    assert "Missed" in text and "None: every occurrence" in text
    why = browser.find_element(By.CSS_SELECTOR, "#detail .why")
    assert why.text.startswith("fires on this device, next ")
    assert "No runs yet." in text

    browser.back()
    wait_for(browser, lambda b: shown(b, "view-list"), "back to show the list")
    assert not shown(browser, "detail")
    assert not_reloaded(browser)
    browser.forward()
    wait_for(
        browser,
        lambda b: (
            shown(b, "detail") and "Morning in Berlin" in b.find_element(By.ID, "detail").text
        ),
        "forward to show the trigger again",
    )
    browser.refresh()
    wait_for(
        browser,
        lambda b: b.find_elements(By.CSS_SELECTOR, "#detail table.fires tbody tr"),
        "the trigger's view after a reload",
    )
    assert hash_of(browser) == "#/triggers/zoned" and not shown(browser, "view-list")
    # Another trigger's URL, typed: the view follows the hash.
    browser.execute_script("location.hash = '#/triggers/plain';")
    wait_for(
        browser,
        lambda b: b.find_element(By.CSS_SELECTOR, "#detail h2 .tid").text == "plain",
        "the view to follow the hash",
    )
    assert "every 3600 s" in browser.find_element(By.ID, "detail").text


HOSTILE = '<img src=x onerror="window.__pwned=1">'


def test_an_unknown_or_hostile_id_gets_a_clear_message_and_no_markup(
    browser: WebDriver,  # noqa: F811 - the fixture
    served: ServeProcess,  # noqa: F811 - the fixture
    devserver: DevserverProcess,
) -> None:
    put(
        devserver.url,
        HOSTILE,
        name="<script>window.__pwned=2</script>",
        kind="cron",
        spec={"every_s": 3600},
        program="test:echo@v1",
        owner="",
    )
    base = f"http://{served.listen}/"
    open_page(browser, served)
    wait_for(browser, lambda b: row_of(b, HOSTILE) is not None, "the hostile record's row")
    assert "<script>" in browser.find_element(By.ID, "triggers").text
    tr = row_of(browser, HOSTILE)
    assert tr is not None
    tr.find_element(By.CSS_SELECTOR, "td.id a").click()
    wait_for(
        browser,
        lambda b: b.find_element(By.CSS_SELECTOR, "#detail h2 .tid").text == HOSTILE,
        "the hostile trigger's view, its id as text",
    )
    assert hash_of(browser) == "#/triggers/" + quote(HOSTILE, safe="~()*!.'")

    def problem() -> str:
        return str(
            wait_for(
                browser,
                lambda b: (
                    (p := b.find_elements(By.CSS_SELECTOR, ".view:not([hidden]) .problem"))
                    and p[0].text
                ),
                "the page's message",
            )
        )

    browser.get(base + "#/triggers/" + quote("<svg onload=window.__pwned=3>"))
    assert problem() == (
        "No trigger “<svg onload=window.__pwned=3>” here: this daemon holds no entry "
        "and knows no record with that id."
    )
    browser.get(base + "#/triggers/a%00b")
    assert "control character U+0000" in problem()
    browser.get(base + "#/triggers/" + "x" * 300)
    assert "more than the limit of 128" in problem()
    browser.get(base + "#/triggers/%E0%A4%A")
    assert "is not valid percent-encoding" in problem()
    browser.get(base + "#/runs/" + quote("<i>nope</i>", safe=""))
    assert problem().startswith("no run '<i>nope</i>' on this device")
    browser.get(base + "#/somewhere/else")
    assert problem().startswith("Nothing is shown at #/somewhere/else")
    for section in ("detail", "run", "nowhere", "triggers"):
        assert not browser.find_elements(By.CSS_SELECTOR, f"#{section} img, #{section} svg[onload]")
    assert browser.execute_script("return window.__pwned === undefined;") is True


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path / "gate"


@pytest.fixture
def served_waiter(
    devserver: DevserverProcess, tmp_path: Path, gate: Path
) -> Iterator[ServeProcess]:
    argv = json.dumps([PY, "-c", WAITER, str(gate)])
    lines = (*ECHO, '[programs."test:waiter@v1"]', f"argv = {argv}")
    proc = ServeProcess(tmp_path, devserver.url, listen="127.0.0.1:0", config_lines=lines)
    try:
        yield proc.start()
    finally:
        proc.stop()


def test_a_runs_output_follows_on_the_page_as_it_grows(
    browser: WebDriver,  # noqa: F811 - the fixture
    served_waiter: ServeProcess,
    devserver: DevserverProcess,
    gate: Path,
) -> None:
    proc = served_waiter
    put(
        devserver.url,
        "slow",
        kind="cron",
        spec={"every_s": 3600},
        program="test:waiter@v1",
        owner="",
    )
    open_page(browser, proc)
    wait_for(browser, lambda b: row_state(b, "slow") == TriggerState.SCHEDULED, "slow to show")
    with proc.http() as c:
        resp = c.post("/triggers/slow/run")
    assert resp.status_code == 202, resp.text
    run_id = resp.json()["runId"]
    # From the trigger's view, its running run's link opens the run's own view.
    row_el = row(browser, "slow")
    assert row_el is not None
    row_el.click()
    link = wait_for(
        browser,
        lambda b: b.find_elements(By.CSS_SELECTOR, f'#detail tr[data-run-id="{run_id}"] a.output'),
        "the running run in the trigger's view",
    )[0]
    assert link.text == "follow output"
    link.click()
    wait_for(
        browser,
        lambda b: b.find_element(By.ID, "output").text == "first line",
        "the running run's first line on the page",
    )
    assert hash_of(browser) == f"#/runs/{run_id}"
    state = browser.find_element(By.ID, "output-state")
    assert state.get_attribute("data-running") == "true", state.text
    assert "running" in browser.find_element(By.CSS_SELECTOR, "#run dl").text

    gate.touch()
    wait_for(
        browser,
        lambda b: b.find_element(By.ID, "output-state").get_attribute("data-running") == "false",
        "the run's end on the page",
    )
    assert browser.find_element(By.ID, "output").text == "first line\n<b>second</b> line"
    assert not browser.find_elements(By.CSS_SELECTOR, "#output b")
    assert browser.find_element(By.CSS_SELECTOR, "#run dl .badge").text == RunStatus.OK
    assert not_reloaded(browser)
    # Its URL again, after a reload: the whole output at once.
    browser.refresh()
    wait_for(
        browser,
        lambda b: b.find_element(By.ID, "output").text == "first line\n<b>second</b> line",
        "the ended run's output after a reload",
    )
    browser.find_element(By.CSS_SELECTOR, "#run .crumbs a[href='#/triggers/slow']").click()
    wait_for(browser, lambda b: shown(b, "detail"), "the run's trigger")


def test_the_filter_and_the_order_are_the_users_and_are_kept(
    browser: WebDriver,  # noqa: F811 - the fixture
    served: ServeProcess,  # noqa: F811 - the fixture
    devserver: DevserverProcess,
) -> None:
    for rid, name, every in (("m-beta", "Gamma report", 7), ("a-alpha", "", 3600)):
        put(
            devserver.url,
            rid,
            name=name or rid,
            kind="cron",
            spec={"every_s": every},
            program="test:echo@v1",
            owner="",
        )
    put(
        devserver.url,
        "z-off",
        kind="cron",
        spec={"every_s": 5},
        program="test:echo@v1",
        owner="",
        enabled=False,
    )
    open_page(browser, served)
    browser.execute_script("localStorage.clear();")
    browser.get(f"http://{served.listen}/#/")
    wait_for(
        browser,
        lambda b: all(row_state(b, r) for r in ("m-beta", "a-alpha", "z-off")),
        "the three triggers",
    )
    # By id, and it holds still as the next fires move (m-beta fires every 7 s).
    ids = shown_ids(browser)
    assert ids == sorted(ids), ids
    assert (
        browser.find_element(By.CSS_SELECTOR, 'th[data-sort="id"]').get_attribute("aria-sort")
        == "ascending"
    )
    before = browser.find_element(By.ID, "updated").text
    wait_for(browser, lambda b: b.find_element(By.ID, "updated").text != before, "a poll")
    assert shown_ids(browser) == ids

    box = browser.find_element(By.ID, "filter")
    box.send_keys("gamma")
    wait_for(browser, lambda b: shown_ids(b) == ["m-beta"], "the filter by name")
    assert "1 shown" in browser.find_element(By.ID, "counts").text
    box.clear()
    box.send_keys("state:disabled")
    wait_for(browser, lambda b: shown_ids(b) == ["z-off"], "the filter by state")
    assert hash_of(browser) == "#/?q=state%3Adisabled"
    box.clear()
    box.send_keys("nothing-like-this")
    wait_for(
        browser,
        lambda b: b.find_element(By.ID, "no-match").is_displayed(),
        "the no-match line",
    )
    box.clear()
    box.send_keys("echo")  # by program: every trigger of ours, no built-in
    wait_for(
        browser, lambda b: shown_ids(b) == ["a-alpha", "m-beta", "z-off"], "the filter by program"
    )
    browser.refresh()
    wait_for(browser, lambda b: shown_ids(b) == ["a-alpha", "m-beta", "z-off"], "the filter kept")
    assert browser.find_element(By.ID, "filter").get_attribute("value") == "echo"

    def sort_by(key: str) -> None:
        browser.find_element(By.CSS_SELECTOR, f'th[data-sort="{key}"] button').click()

    sort_by("next")
    wait_for(browser, lambda b: shown_ids(b) == ["m-beta", "a-alpha", "z-off"], "by next fire")
    assert hash_of(browser) == "#/?q=echo&sort=next"
    sort_by("next")
    wait_for(
        browser, lambda b: shown_ids(b) == ["z-off", "a-alpha", "m-beta"], "by next fire, desc"
    )
    assert (
        browser.find_element(By.CSS_SELECTOR, 'th[data-sort="next"]').get_attribute("aria-sort")
        == "descending"
    )
    # The order chosen is the next visit's too (localStorage).
    browser.get(f"http://{served.listen}/")
    wait_for(browser, lambda b: row_state(b, "z-off"), "the list again")
    assert (
        browser.find_element(By.CSS_SELECTOR, 'th[data-sort="next"]').get_attribute("aria-sort")
        == "descending"
    )
    assert browser.find_element(By.ID, "filter").get_attribute("value") == ""

    # The run strips share a time axis, ending at now.
    labels = browser.find_elements(By.CSS_SELECTOR, "#runs-axis svg text")
    assert len(labels) >= 2 and labels[-1].text == "now"
    assert all(label.text for label in labels)
    browser.execute_script("localStorage.clear();")


def test_the_time_axis_follows_the_span(
    browser: WebDriver,  # noqa: F811 - the fixture
    served: ServeProcess,  # noqa: F811 - the fixture
    devserver: DevserverProcess,
) -> None:
    open_page(browser, served)
    browser.find_element(By.CSS_SELECTOR, "#span option[value='604800']").click()
    first = wait_for(
        browser,
        lambda b: (
            (t := b.find_elements(By.CSS_SELECTOR, "#runs-axis svg text")) and len(t) == 2 and t[0]
        ),
        "a 7-day axis",
    )
    at = float(first.get_attribute("data-at") or 0)
    # 7 days back, written as a date and a time.
    assert abs(datetime.now(UTC).timestamp() - 604800 - at) < 120
    assert len(first.text) == len("12-05 07:30")
