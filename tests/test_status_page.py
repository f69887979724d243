"""The status page in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, which `.ci/run` installs) driven by selenium, against a real
`anyrtd serve` on a real devserver.

Chromium maps the name `rebind.example` to 127.0.0.1 (`--host-resolver-rules`), so a
test can load the page the way a DNS-rebinding attack would: a foreign name that
resolves to this machine.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from conftest import DevserverProcess
from control_support import LISTENING, ServeProcess
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait
from support import wait_until

from anyrtd.client import ServerClient, Upsert
from anyrtd.control.guard import GUARD, Guard, errors_middleware, guard_middleware
from anyrtd.control.page import STATIC, add_routes
from anyrtd.places import resolve_places
from anyrtd.vocab import STAMP_PREFIX, LastStatus, Marker, RunStatus, TriggerState

PY = sys.executable
ECHO = (
    '[programs."test:echo@v1"]',
    f'argv = ["{PY}", "-c", "print(\'hello from the status page test\')"]',
)
REBIND = "rebind.example"
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--no-proxy-server",
    "--window-size=1400,1000",
    f"--host-resolver-rules=MAP {REBIND} 127.0.0.1",
)
PAGE_WAIT = 30.0


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    """One headless Chromium for the module, on a fresh profile; quit at the end."""
    skipped = os.environ.get("ANYRTD_NO_BROWSER")
    if skipped:  # .ci/run found no browser it could install: it said so in one line
        pytest.skip(f"the browser tests: {skipped}")
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail(
            "the status page tests need Debian's chromium and chromium-driver: "
            "apt-get install -y chromium chromium-driver (.ci/run does it)"
        )
    profile = tmp_path_factory.mktemp("chromium-profile")
    options = Options()
    options.binary_location = chromium
    for arg in CHROMIUM_ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={profile}")
    service = Service(executable_path=driver, log_output=str(profile.parent / "chromedriver.log"))
    drv = webdriver.Chrome(options=options, service=service)
    try:
        yield drv
    finally:
        drv.quit()


def put(server_url: str, rid: str, **fields: Any) -> None:
    """Write a trigger record on the server, as `anyrtd triggers create` would."""

    async def main() -> None:
        async with ServerClient(server_url) as client:
            places = await resolve_places(client, "bao")
            await client.upsert(places.triggers, [Upsert(rid, fields)])

    asyncio.run(main())


def record(server_url: str, rid: str) -> dict[str, Any]:
    """Read a trigger record from the server."""

    async def main() -> list[dict[str, Any]]:
        async with ServerClient(server_url) as client:
            places = await resolve_places(client, "bao")
            records, _ = await client.query(places.triggers, filter={"id": rid})
            return records

    found = asyncio.run(main())
    assert found, f"no record {rid} on the server"
    return found[0]


@pytest.fixture
def served(devserver: DevserverProcess, tmp_path: Path) -> Iterator[ServeProcess]:
    """`anyrtd serve` with its control API on 127.0.0.1, a free port."""
    proc = ServeProcess(tmp_path, devserver.url, listen="127.0.0.1:0", config_lines=ECHO)
    try:
        yield proc.start()
    finally:
        proc.stop()


def hourly(server_url: str, rid: str) -> None:
    put(server_url, rid, kind="cron", spec={"every_s": 3600}, program="test:echo@v1", owner="")


# --------------------------------------------------------------------------- page helpers


def wait_for(
    browser: WebDriver, check: Callable[[WebDriver], Any], what: str, timeout: float = PAGE_WAIT
) -> Any:
    """Wait until `check` returns something truthy; a redrawn element is looked up again."""
    return WebDriverWait(
        browser, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(check, message=f"timed out after {timeout}s waiting for {what}")


def row(browser: WebDriver, rid: str) -> WebElement | None:
    found = browser.find_elements(By.CSS_SELECTOR, f'#triggers tr[data-id="{rid}"]')
    return found[0] if found else None


def row_state(browser: WebDriver, rid: str) -> str | None:
    tr = row(browser, rid)
    return tr.get_attribute("data-state") if tr is not None else None


def run_bar(browser: WebDriver, rid: str, run_id: str) -> WebElement | None:
    found = browser.find_elements(
        By.CSS_SELECTOR, f'#triggers tr[data-id="{rid}"] svg rect.run[data-run-id="{run_id}"]'
    )
    return found[0] if found else None


def open_page(browser: WebDriver, served: ServeProcess) -> None:
    """Load the page and wait for its first poll; mark the document to detect a reload."""
    browser.get(f"http://{served.listen}/")
    wait_for(
        browser,
        lambda b: b.find_elements(By.CSS_SELECTOR, "#health .card"),
        "the page's first poll",
    )
    browser.execute_script("window.__sameDocument = true;")


def not_reloaded(browser: WebDriver) -> bool:
    return browser.execute_script("return window.__sameDocument === true;") is True


# --------------------------------------------------------------------------- tests


def test_a_new_trigger_and_its_run_appear_without_a_reload(
    browser: WebDriver, served: ServeProcess, devserver: DevserverProcess
) -> None:
    open_page(browser, served)
    assert row(browser, "fresh") is None
    assert browser.find_element(By.ID, "h-daemon").text.splitlines()[1] == "ok"

    hourly(devserver.url, "fresh")
    wait_for(
        browser,
        lambda b: row_state(b, "fresh") == TriggerState.SCHEDULED,
        "the new trigger to show as scheduled",
    )
    cells = row(browser, "fresh")
    assert cells is not None
    assert "every 3600 s" in cells.find_element(By.CSS_SELECTOR, "td.schedule").text
    assert cells.find_element(By.CSS_SELECTOR, "td.last").text == "never ran"
    assert "this device" in cells.find_element(By.CSS_SELECTOR, "td.owner").text

    with served.http() as c:
        resp = c.post("/triggers/fresh/run")
    assert resp.status_code == 202, resp.text
    run_id = resp.json()["runId"]
    bar = wait_for(
        browser,
        lambda b: (
            (bar := run_bar(b, "fresh", run_id)) is not None
            and bar.get_attribute("data-status") == RunStatus.OK
            and bar
        ),
        "the run to show as ok on the trigger's timeline",
    )
    assert float(bar.get_attribute("width") or 0) >= 2
    wait_for(
        browser,
        lambda b: (
            (tr := row(b, "fresh")) is not None
            and tr.find_element(By.CSS_SELECTOR, "td.last .badge").text == "ok"
        ),
        "the last status to read ok",
    )
    assert not_reloaded(browser), "the page reloaded instead of updating itself"

    shot = served.tmp / "status-page.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_buttons_disable_enable_and_run_a_trigger(
    browser: WebDriver, served: ServeProcess, devserver: DevserverProcess
) -> None:
    hourly(devserver.url, "steady")
    open_page(browser, served)
    wait_for(browser, lambda b: row_state(b, "steady") == TriggerState.SCHEDULED, "steady to show")

    def toggle() -> WebElement:
        tr = row(browser, "steady")
        assert tr is not None
        return tr.find_element(By.CSS_SELECTOR, "button.toggle")

    assert toggle().text == "disable"
    toggle().click()
    wait_for(
        browser,
        lambda b: row_state(b, "steady") == TriggerState.DISABLED and toggle().text == "enable",
        "steady to show as disabled",
    )
    assert record(devserver.url, "steady")["enabled"] is False
    with served.http() as c:
        assert c.get("/triggers/steady").json()["enabled"] is False

    toggle().click()
    wait_for(
        browser,
        lambda b: row_state(b, "steady") == TriggerState.SCHEDULED and toggle().text == "disable",
        "steady to show as enabled again",
    )
    assert record(devserver.url, "steady")["enabled"] is True

    tr = row(browser, "steady")
    assert tr is not None
    tr.find_element(By.CSS_SELECTOR, "button.run").click()
    bar = wait_for(
        browser,
        lambda b: b.find_elements(
            By.CSS_SELECTOR, '#triggers tr[data-id="steady"] svg rect.run[data-status="ok"]'
        ),
        "the run started by the button to show on the timeline",
    )[0]
    run_id = bar.get_attribute("data-run-id")
    with served.http() as c:
        run = c.get(f"/runs/{run_id}").json()
    assert run["triggerId"] == "steady" and run["scheduledAt"] is None

    # The row opens the trigger's view: its runs with their lateness, its next fires.
    tr = row(browser, "steady")
    assert tr is not None
    tr.find_element(By.CSS_SELECTOR, "td.schedule").click()
    detail = wait_for(
        browser,
        lambda b: b.find_elements(By.CSS_SELECTOR, f'#detail tr[data-run-id="{run_id}"]'),
        "the trigger's view to list the run",
    )[0]
    assert "manual" in detail.text
    assert "Next fires" in browser.find_element(By.ID, "detail").text
    # ... and its why (GET /triggers/:id/why), which follows a change without a reload.
    why = browser.find_element(By.CSS_SELECTOR, "#detail .why")
    assert why.text.startswith("fires on this device, next ")
    browser.find_element(By.CSS_SELECTOR, "#detail button.toggle").click()
    wait_for(
        browser,
        lambda b: b.find_elements(
            By.CSS_SELECTOR, '#detail .why li.blocking[data-cause="disabled"]'
        ),
        "the detail's why to say it is disabled",
    )
    assert "anyrtd triggers enable steady" in browser.find_element(By.ID, "detail").text
    assert not_reloaded(browser)


def card_lines(browser: WebDriver, card_id: str) -> tuple[str, list[str]]:
    """Return a health card's tone class and its lines (label, value, note)."""
    card = browser.find_element(By.ID, card_id)
    return card.get_attribute("class") or "", card.text.splitlines()


def test_built_ins_not_installed_here_are_expected_not_an_alarm(
    browser: WebDriver, served: ServeProcess, devserver: DevserverProcess
) -> None:
    # anyrtd ships two of the six standing built-ins: on the active device the four others
    # carry `not_installed`, as `anyrtd doctor` expects.
    open_page(browser, served)
    wait_for(
        browser,
        lambda b: all(
            row_state(b, rid) == TriggerState.UNAVAILABLE for rid in ("extraction", "linkgen")
        ),
        "the standing built-ins to show as not installed here",
    )
    tone, lines = wait_for(
        browser,
        lambda b: (c := card_lines(b, "h-markers"))[1][1:2] == ["0"] and c,
        "the markers card to count no alarm",
    )
    assert "good" in tone.split()
    assert lines[2] == "4 built-ins not installed here (expected)"

    # A trigger of the user's that can never fire is an alarm.
    put(
        devserver.url,
        "never",
        kind="cron",
        spec={"cron": "0 0 30 2 *"},
        program="test:echo@v1",
        owner=devserver.peers[0],
    )
    tone, lines = wait_for(
        browser,
        lambda b: (c := card_lines(b, "h-markers"))[1][1:2] == ["1"] and c,
        "the markers card to count the trigger that can never fire",
    )
    assert "bad" in tone.split()
    assert lines[2] == "1 invalid_spec, 4 built-ins not installed here (expected)"


def test_enable_after_a_trip_keeps_the_last_status(
    browser: WebDriver, served: ServeProcess, devserver: DevserverProcess
) -> None:
    # As the breaker leaves a record: three failed runs, the last one a minute ago.
    put(
        devserver.url,
        "tripped",
        kind="cron",
        spec={"every_s": 3600},
        program="test:echo@v1",
        owner=devserver.peers[0],
        enabled=False,
        lastStatus=LastStatus.AUTO_DISABLED,
        consecutiveFailures=3,
        runCount=3,
        lastRunAt=time.time() - 60,
    )
    open_page(browser, served)
    wait_for(
        browser,
        lambda b: row_state(b, "tripped") == TriggerState.AUTO_DISABLED,
        "tripped to show as auto-disabled",
    )
    tr = row(browser, "tripped")
    assert tr is not None
    toggle = tr.find_element(By.CSS_SELECTOR, "button.toggle")
    assert toggle.text == "enable"
    toggle.click()
    wait_for(
        browser,
        lambda b: row_state(b, "tripped") == TriggerState.SCHEDULED,
        "tripped to show as enabled",
    )
    last = wait_for(
        browser,
        lambda b: (
            (tr := row(b, "tripped")) is not None
            and tr.find_element(By.CSS_SELECTOR, "td.last").text
        ),
        "the last status cell",
    )
    assert last.splitlines()[0] == LastStatus.ERROR, last
    assert "never ran" not in last
    rec = record(devserver.url, "tripped")
    assert rec["lastStatus"] == LastStatus.ERROR and rec["consecutiveFailures"] == 0


def test_the_page_under_a_foreign_host_is_refused(browser: WebDriver, served: ServeProcess) -> None:
    port = served.listen.rpartition(":")[2]
    with served.http() as c:
        page = c.get("/")
        assert page.status_code == 200
        assert page.headers["Content-Type"].startswith("text/html")
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        for path in ("/", "/static/app.js"):
            resp = c.get(path, headers={"Host": f"{REBIND}:{port}"})
            assert resp.status_code == 403
            assert resp.json()["error"]["code"] == "forbidden_host"
        assert c.get("/static/nothing.js").status_code == 404

    # The browser resolves rebind.example to 127.0.0.1, as a rebinding attack would.
    browser.get(f"http://{REBIND}:{port}/")
    text = browser.find_element(By.TAG_NAME, "body").text
    assert "forbidden_host" in text
    assert not browser.find_elements(By.ID, "triggers")


def test_a_token_is_asked_once_and_sent_with_every_call(
    browser: WebDriver, devserver: DevserverProcess, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-page\n")
    token.chmod(0o600)
    hourly(devserver.url, "guarded")
    proc = ServeProcess(
        tmp_path,
        devserver.url,
        listen="127.0.0.1:0",
        # A top-level key goes before the programs table, or TOML files it under the table.
        config_lines=(f'token_file = "{token}"', *ECHO),
    )
    proc.spawn()
    try:

        def bound() -> str | None:
            proc._check_alive()
            match = LISTENING.search(proc.log.read_text(errors="replace"))
            return match.group(1) if match else None

        proc.listen = wait_until(bound, timeout=30, what="anyrtd serve to listen with a token")
        base = f"http://{proc.listen}"
        # The shell holds no data and needs no token; the data does.
        assert httpx.get(f"{base}/", timeout=10).status_code == 200
        assert httpx.get(f"{base}/triggers", timeout=10).status_code == 401

        browser.get(f"{base}/")
        form = wait_for(
            browser,
            lambda b: (f := b.find_element(By.ID, "token-form")).is_displayed() and f,
            "the page to ask for the token",
        )
        assert row(browser, "guarded") is None
        form.find_element(By.ID, "token").send_keys("wrong")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for(
            browser,
            lambda b: (
                b.find_element(By.ID, "token-form").is_displayed()
                and b.find_element(By.ID, "updated").text == "needs a token"
            ),
            "a wrong token to be asked again",
        )
        browser.find_element(By.ID, "token").send_keys("s3cret-page")
        browser.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
        wait_for(
            browser,
            lambda b: row_state(b, "guarded") == TriggerState.SCHEDULED,
            "the trigger to show once the token is given",
        )
        assert not browser.find_element(By.ID, "token-form").is_displayed()
        stored = browser.execute_script("return sessionStorage.getItem('anyrtd.token');")
        assert stored == "s3cret-page"

        row_el = row(browser, "guarded")
        assert row_el is not None
        row_el.find_element(By.CSS_SELECTOR, "button.toggle").click()
        wait_for(
            browser,
            lambda b: row_state(b, "guarded") == TriggerState.DISABLED,
            "the disable sent with the token to take effect",
        )
        assert record(devserver.url, "guarded")["enabled"] is False
    finally:
        proc.stop()


# --------------------------------------------------------------------------- the guard's part


async def _data(request: web.Request) -> web.Response:
    return web.json_response({"secret": 42})


@pytest.fixture
async def guarded(aiohttp_client: Any) -> TestClient[web.Request, web.Application]:
    """The page's routes and one data route behind a token, on a non-loopback listener."""
    app = web.Application(middlewares=[errors_middleware, guard_middleware])
    app[GUARD] = Guard(token="t0ken", extra_hosts=frozenset({"192.0.2.7"}))
    add_routes(app)
    app.router.add_get("/data", _data)
    app.router.add_post("/data", _data)
    client: TestClient[web.Request, web.Application] = await aiohttp_client(app)
    return client


async def test_the_page_shell_needs_no_token_but_the_data_does(
    guarded: TestClient[web.Request, web.Application],
) -> None:
    for path, kind in (("/", "text/html"), ("/static/app.js", "text/javascript")):
        resp = await guarded.get(path)
        assert resp.status == 200 and resp.content_type == kind
        assert resp.headers["X-Frame-Options"] == "DENY"
    assert (await guarded.head("/")).status == 200
    assert (await guarded.get("/data")).status == 401
    auth = {"Authorization": "Bearer t0ken"}
    assert (await guarded.get("/data", headers=auth)).status == 200
    # The exemption is the page's GET only: a foreign Host is still refused.
    resp = await guarded.get("/", headers={"Host": "rebind.example"})
    assert resp.status == 403
    assert (await resp.json())["error"]["code"] == "forbidden_host"


async def test_the_page_takes_its_words_from_the_vocabulary(
    guarded: TestClient[web.Request, web.Application],
) -> None:
    resp = await guarded.get("/static/vocab.json")
    assert resp.status == 200
    words = await resp.json()
    assert words["RunStatus"] == {m.name: m.value for m in RunStatus}
    assert words["TriggerState"] == {m.name: m.value for m in TriggerState}
    assert words["stampPrefix"] == STAMP_PREFIX
    # The stylesheet colours every word the page can show as a badge or a run bar.
    css = STATIC.joinpath("app.css").read_text()
    for word in {*TriggerState, *LastStatus, *RunStatus, *Marker}:
        assert f".s-{word}" in css, f"app.css has no badge colour for {word}"
    for status in RunStatus:
        assert f"svg.timeline .run-{status}" in css and f"i.run-{status}" in css


async def test_a_page_served_on_the_listeners_own_address_may_write(
    guarded: TestClient[web.Request, web.Application],
) -> None:
    own = {"Host": "192.0.2.7:7010", "Authorization": "Bearer t0ken"}
    same = {**own, "Origin": "http://192.0.2.7:7010", "Content-Type": "application/json"}
    assert (await guarded.post("/data", headers=same)).status == 200
    foreign = {**same, "Origin": "http://evil.example"}
    resp = await guarded.post("/data", headers=foreign)
    assert resp.status == 403
    assert (await resp.json())["error"]["code"] == "cross_origin"
