"""Take docs/status-page.png (the triggers), docs/status-page-trigger.png (one trigger's
view) and docs/status-page-run.png (a run's output followed while it runs): a devserver,
`anyrtd serve`, a few triggers and runs, and headless Chromium (Debian's `chromium` and
`chromium-driver`, selenium from the test extra).

    python contrib/status_page_screenshot.py [OUT.png] [--seconds 75]

The two views' pictures are named after OUT.png (`-trigger`, `-run`).

Everything runs in a temporary directory and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from anyrtd.client import ServerClient, Upsert
from anyrtd.places import resolve_places

T = TypeVar("T")
PY = sys.executable
DEVICE_LINE = re.compile(r"^anyrtd devserver: device 1 (\S+) (http://\S+)$", re.M)
LISTENING = re.compile(r"control API listening on (\S+)")
PROGRAMS = {
    "demo:report@v1": "import time; time.sleep(2.5); print('report written')",
    "demo:sync@v1": "import time; time.sleep(0.6); print('12 messages synced')",
    "demo:export@v1": "import sys; sys.exit('export target unreachable: 503')",
    "demo:backup@v1": (
        "import time\n"
        "for n, d in enumerate(['etc', 'home/ana', 'home/bo', 'srv/www', 'var/lib/db'] * 4):\n"
        "    print(f'copied /{d}: {(n + 1) * 211} files, {(n + 1) * 37} MB', flush=True)\n"
        "    time.sleep(1.5)\n"
        "print('backup done')"
    ),
}
OTHER_DEVICE = "12D3KooWLaptopAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


def wait(check: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


@contextmanager
def process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def put(url: str, triggers: dict[str, dict[str, Any]]) -> None:
    async def main() -> None:
        async with ServerClient(url) as client:
            places = await resolve_places(client, "bao")
            await client.upsert(places.triggers, [Upsert(k, v) for k, v in triggers.items()])

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", default="docs/status-page.png")
    parser.add_argument("--seconds", type=float, default=75.0, help="how long runs accumulate")
    args = parser.parse_args()
    anyrtd = shutil.which("anyrtd") or "anyrtd"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        config = tmp / "anyrtd.toml"
        config.write_text(
            "grace_s = 1.0\n"
            + "".join(
                f'[programs."{name}"]\nargv = {json.dumps([PY, "-c", code])}\n'
                for name, code in PROGRAMS.items()
            )
        )
        dev_log, serve_log = tmp / "devserver.log", tmp / "serve.log"
        devserver_argv = [anyrtd, "devserver", "--port", "0", "--db", str(tmp / "dev.sqlite3")]
        with process(devserver_argv, dev_log):
            match = wait(lambda: DEVICE_LINE.search(dev_log.read_text()), "the devserver")
            server = match.group(2)
            serve_argv = [anyrtd, "serve", "--config", str(config), "--server", server]
            serve_argv += ["--state-dir", str(tmp / "state"), "--tick", "0.2"]
            serve_argv += ["--listen", "127.0.0.1:0"]
            with process(serve_argv, serve_log):
                listen = wait(lambda: LISTENING.search(serve_log.read_text()), "anyrtd serve")
                base = f"http://{listen.group(1)}"
                now = time.time()
                put(
                    server,
                    {
                        "nightly-report": {
                            "name": "Nightly report",
                            "kind": "cron",
                            "spec": {"every_s": 15},
                            "program": "demo:report@v1",
                            "owner": "",
                        },
                        "inbox-sync": {
                            "name": "Sync the inbox",
                            "kind": "cron",
                            "spec": {"every_s": 6},
                            "program": "demo:sync@v1",
                            "owner": "",
                        },
                        "crm-export": {
                            "name": "Export to the CRM",
                            "kind": "cron",
                            "spec": {"every_s": 9},
                            "program": "demo:export@v1",
                            "owner": "",
                            "maxConsecutiveFailures": 4,
                        },
                        "catch-up": {
                            "name": "A once that was due before the daemon started",
                            "kind": "once",
                            "spec": {"at": round(now - 40)},
                            "program": "demo:sync@v1",
                            "owner": "",
                        },
                        "daily-digest": {
                            "name": "Daily digest",
                            "kind": "cron",
                            "spec": {"cron": "30 7 * * *", "tz": "Europe/Berlin"},
                            "program": "demo:report@v1",
                            "owner": "",
                        },
                        "broken-cron": {
                            "kind": "cron",
                            "spec": {"cron": "61 * * * *"},
                            "program": "demo:sync@v1",
                            "owner": "",
                        },
                        "home-backup": {
                            "name": "Back up the home server",
                            "kind": "cron",
                            "spec": {"every_s": 45},
                            "program": "demo:backup@v1",
                            "owner": "",
                        },
                        "laptop-backup": {
                            "name": "Back up the laptop",
                            "kind": "cron",
                            "spec": {"cron": "0 * * * *"},
                            "program": "demo:report@v1",
                            "owner": OTHER_DEVICE,
                        },
                    },
                )
                with httpx.Client(base_url=base, timeout=10) as c:

                    def adopted() -> bool:
                        ids = {t["id"] for t in c.get("/triggers").json() if t["adopted"]}
                        return {"nightly-report", "daily-digest"} <= ids

                    wait(adopted, "the triggers to be adopted")
                    c.post("/triggers/daily-digest/run")
                    time.sleep(args.seconds)  # a script, not a test: let runs accumulate
                shoot(base, Path(args.out))


def shoot(base: str, out: Path) -> None:
    options = Options()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-proxy-server",
        "--hide-scrollbars",
        "--window-size=1440,900",
    ):
        options.add_argument(arg)
    with tempfile.TemporaryDirectory() as profile:
        options.add_argument(f"--user-data-dir={profile}")
        service = Service(executable_path=shutil.which("chromedriver") or "chromedriver")
        driver = webdriver.Chrome(options=options, service=service)
        try:
            driver.get(f"{base}/")
            WebDriverWait(driver, 30).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, '#triggers tr[data-id="catch-up"]')
            )
            out.parent.mkdir(parents=True, exist_ok=True)
            full_page(driver, out)
            driver.get(f"{base}/#/triggers/daily-digest")
            WebDriverWait(driver, 30).until(
                lambda d: (
                    d.find_elements(By.CSS_SELECTOR, "#detail tr[data-run-id]")
                    and d.find_elements(By.CSS_SELECTOR, "#detail table.fires tbody tr")
                )
            )
            full_page(driver, out.with_name(f"{out.stem}-trigger.png"))
            with httpx.Client(base_url=base, timeout=10) as c:
                running = wait(
                    lambda: [
                        r
                        for r in c.get("/runs", params={"status": "running"}).json()
                        if r["triggerId"] == "home-backup"
                    ],
                    "a run of home-backup",
                )
            driver.get(f"{base}/#/runs/{running[0]['runId']}")
            WebDriverWait(driver, 30).until(
                lambda d: len(d.find_element(By.ID, "output").text.splitlines()) >= 5
            )
            full_page(driver, out.with_name(f"{out.stem}-run.png"))
        finally:
            driver.quit()
    print(f"wrote {out} and its views")


def full_page(driver: webdriver.Chrome, out: Path) -> None:
    """Save the whole page, not only the window, as `out`."""
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    driver.set_window_size(1440, 900)
    height = driver.execute_script("return document.documentElement.scrollHeight;")
    # A headless window stops at the screen's size; the emulated viewport does not.
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1440, "height": max(900, int(height)), "deviceScaleFactor": 1, "mobile": False},
    )
    driver.save_screenshot(str(out))


if __name__ == "__main__":
    main()
