"""Fixtures shared by the tests; each section belongs to the part it starts."""

from __future__ import annotations

# --- devserver -----------------------------------------------------------------------------
# `devserver`: a real `anyrtd devserver --port 0` subprocess on a fresh SQLite file.
# `devserver_factory(devices=N, replicated=..., sync_delay=..., space=..., db=...)`: the same
# with options. `devserver_inprocess`: `start_devserver` in the test's own event loop.
# `.admin("partition", {"device": 2})`, `.admin("state")`...: the devserver's /_dev/ routes.
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from fleet import Fleet, Node
from support import World

from anyrtd.devserver import DevServer, start_devserver

if TYPE_CHECKING:  # control_support imports this module
    from control_support import ServeProcess
from anyrtd.mirror import AsyncMirror, Mirror

DEVSERVER_LINE = re.compile(r"^anyrtd devserver: device (\d+) (\S+) (http://\S+)$")


def anyrtd_command() -> list[str]:
    """Return how to run the `anyrtd` command: the one on PATH, else this interpreter's module."""
    found = shutil.which("anyrtd")
    return [found] if found else [sys.executable, "-m", "anyrtd"]


class DevserverProcess:
    """A devserver subprocess: `.url` (device 1), `.urls`, `.peers`, `.db`, `.restart()`."""

    def __init__(self, db: Path, args: list[str], log: Path, start_timeout: float = 30.0) -> None:
        self.db = db
        self.args = args
        self.log = log
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.urls: list[str] = []
        self.peers: list[str] = []
        self.returncode: int | None = None

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def devices(self) -> int:
        return int(self.args[self.args.index("--devices") + 1]) if "--devices" in self.args else 1

    def start(self) -> DevserverProcess:
        """Start the process and wait for its device lines (ports change on every start)."""
        cmd = [*anyrtd_command(), "devserver", "--port", "0", "--db", str(self.db), *self.args]
        with self.log.open("a") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
            )
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, lines), daemon=True).start()
        urls: list[str] = []
        peers: list[str] = []
        deadline = time.monotonic() + self.start_timeout
        while len(urls) < self.devices:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise AssertionError(
                    f"devserver printed no device lines in time; log:\n{self.log.read_text()}"
                ) from None
            if line is None:
                self.stop()
                raise AssertionError(
                    f"devserver exited before it was ready; log:\n{self.log.read_text()}"
                )
            match = DEVSERVER_LINE.match(line.rstrip("\n"))
            if match:
                peers.append(match.group(2))
                urls.append(match.group(3))
        self.urls, self.peers = urls, peers
        return self

    @staticmethod
    def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Stop the process (SIGTERM, then SIGKILL) and return its exit status."""
        proc = self.proc
        if proc is None:
            return self.returncode
        self.proc = None
        try:
            if proc.poll() is None:
                proc.send_signal(sig)
            self.returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            self.returncode = proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
        return self.returncode

    def admin(self, path: str, body: dict[str, Any] | None = None, device: int = 1) -> Any:
        """Call a `/_dev/` route (`state` is a GET, the rest POST) on a device's port."""
        url = f"{self.urls[device - 1]}/_dev/{path}"
        resp = (
            httpx.get(url, timeout=10)
            if path == "state"
            else httpx.post(url, json=body or {}, timeout=10)
        )
        assert resp.status_code == 200, resp.text
        return resp.json()

    def restart(self) -> DevserverProcess:
        """Stop and start again on the same --db (new ports: read `.urls` again)."""
        code = self.stop()
        assert code == 0, f"devserver exited {code} on SIGTERM; log:\n{self.log.read_text()}"
        return self.start()


@pytest.fixture
def devserver_factory(tmp_path: Path) -> Iterator[Callable[..., DevserverProcess]]:
    """Start devserver subprocesses with options; every one is stopped at teardown."""
    started: list[DevserverProcess] = []

    def start(
        *,
        devices: int = 1,
        db: Path | None = None,
        space: str | None = None,
        replicated: bool = False,
        sync_delay: float | None = None,
        extra: tuple[str, ...] = (),
    ) -> DevserverProcess:
        args = ["--devices", str(devices)]
        if space is not None:
            args += ["--space", space]
        if replicated:
            args.append("--replicated")
        if sync_delay is not None:
            args += ["--sync-delay", str(sync_delay)]
        args += list(extra)
        n = len(started)
        path = db if db is not None else tmp_path / ("dev.sqlite3" if n == 0 else f"dev{n}.sqlite3")
        proc = DevserverProcess(path, args, tmp_path / f"devserver{n}.log")
        started.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for proc in started:
            proc.stop(timeout=5.0)


@pytest.fixture
def devserver(devserver_factory: Callable[..., DevserverProcess]) -> DevserverProcess:
    """A one-device devserver subprocess on `<tmp_path>/dev.sqlite3`."""
    return devserver_factory()


@pytest.fixture
async def devserver_inprocess(tmp_path: Path) -> AsyncIterator[DevServer]:
    """A one-device devserver running inside the test's event loop."""
    server = await start_devserver(tmp_path / "inproc.sqlite3")
    try:
        yield server
    finally:
        await server.close()


# --- end devserver -------------------------------------------------------------------------


# --- fleet ---------------------------------------------------------------------------------
# `fleet`: in-process daemons on a multi-device devserver, one shared fake clock
# (tests/fleet.py). Two devices unless the test or its module says `pytest.mark.devices(n)`.
# The devserver runs in the test's own event loop (the process boundary is not what these
# tests are about): reach it through the fleet's async helpers (`await fleet.admin(...)`).
# `fleet_factory(devices=N, **devserver options)`: fleets on devserver subprocesses, or a
# fleet with options (`replicated=True`, ...).
# `h`: one always-active node (no election) on a one-device in-process devserver;
# `h_process`: the same on a devserver subprocess (`devserver`), which a test can stop.


@pytest.fixture
async def fleet_factory(
    devserver_factory: Callable[..., DevserverProcess], tmp_path: Path
) -> AsyncIterator[Callable[..., Fleet]]:
    """Make fleets on fresh devservers; each is closed at teardown."""
    made: list[Fleet] = []

    def make(*, devices: int = 2, **options: Any) -> Fleet:
        where = tmp_path if not made else tmp_path / f"fleet{len(made)}"
        made.append(Fleet(devserver_factory(devices=devices, **options), where))
        return made[-1]

    try:
        yield make
    finally:
        for fleet in made:
            await fleet.close()


@pytest.fixture
async def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Fleet]:
    """A fleet on an in-process devserver with two devices (or `pytest.mark.devices(n)`)."""
    marker = request.node.get_closest_marker("devices")
    devices = int(marker.args[0]) if marker is not None else 2
    server = await start_devserver(tmp_path / "fleet-dev.sqlite3", devices=devices)
    made = Fleet(server, tmp_path)
    try:
        yield made
    finally:
        await made.close()
        await server.close()


@pytest.fixture
async def h(devserver_inprocess: DevServer, tmp_path: Path) -> AsyncIterator[Node]:
    """One always-active daemon on a one-device in-process devserver: a fleet of one node."""
    fleet = Fleet(devserver_inprocess, tmp_path)
    try:
        yield await fleet.node(1, election=False)
    finally:
        await fleet.close()


@pytest.fixture
async def h_process(devserver: DevserverProcess, tmp_path: Path) -> AsyncIterator[Node]:
    """`h` on a devserver subprocess, for a test that stops and restarts the server."""
    fleet = Fleet(devserver, tmp_path)
    try:
        yield await fleet.node(1, election=False)
    finally:
        await fleet.close()


# --- end fleet -----------------------------------------------------------------------------


# --- records and mirror --------------------------------------------------------------------
# `world`: the trigger and run records of `devserver`, read and written as a user would
# (tests/support.py's `World`). `mirror`: a fresh `AsyncMirror` at the schema head.


@pytest.fixture
def serve_on(devserver: DevserverProcess, tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    """Make `anyrtd serve` on the `devserver` with a module's config lines (its programs),
    started unless `started=False`; each one made is stopped at teardown."""
    from control_support import ServeProcess

    made: list[ServeProcess] = []

    def make(config_lines: tuple[str, ...], *, started: bool = True) -> ServeProcess:
        proc = ServeProcess(tmp_path, devserver.url, config_lines=config_lines)
        made.append(proc)
        return proc.start() if started else proc

    try:
        yield make
    finally:
        for proc in made:
            proc.stop()


@pytest.fixture
def world(devserver: DevserverProcess) -> World:
    """The records of the `devserver`, as a user sees them."""
    return World(devserver.url)


@pytest.fixture
async def mirror(tmp_path: Path) -> AsyncIterator[AsyncMirror]:
    """A fresh mirror at the schema head, in `<tmp_path>/mirror.sqlite3`."""
    db = AsyncMirror(Mirror(tmp_path / "mirror.sqlite3"))
    await db.call(lambda m: m.ensure_schema(create=True))
    try:
        yield db
    finally:
        await db.close()


# --- end records and mirror ----------------------------------------------------------------


# --- markers -------------------------------------------------------------------------------
# `pytest -m "not process"` is the fast loop: it leaves out every test that starts a real
# process. A test is `process` when it uses a fixture that starts one, or sits in a module
# whose tests start `anyrtd` (or another program) themselves.

PROCESS_FIXTURES = frozenset({"devserver", "devserver_factory", "fleet_factory", "h_process"})
PROCESS_MODULES = frozenset(
    {
        "test_bench_fire",
        "test_cli_client",
        "test_cli_completion",
        "test_cli_help",
        "test_cli_settings",
        "test_cli_startup",
        "test_control_fuzz",
        "test_control_process",
        "test_control_records",
        "test_dev",
        "test_devserver_cli",
        "test_faults_clock",
        "test_faults_diskfull",
        "test_faults_fleet",
        "test_faults_flood",
        "test_faults_kill9",
        "test_faults_outage",
        "test_faults_programs",
        "test_faults_records",
        "test_identity_serve",
        "test_leftover_groups",
        "test_multi_device_serve",
        "test_outage",
        "test_packaging",
        "test_runner",
        "test_serve_notify",
        "test_serve_process",
        "test_service_install",
        "test_service_limits",
        "test_spawn_descriptors",
        "test_status_page",
        "test_systemd",
        "test_systemd_mirror",
    }
)


# Every test has pyproject's timeout (60 s) unless it says `pytest.mark.timeout(N)`; these
# modules' tests take longer on a loaded machine (a fault family, systemd and the venv the
# unit runs from, Chromium, several daemons, many Hypothesis examples).
LONG_TIMEOUTS = {
    "test_faults_clock": 240,
    "test_faults_diskfull": 240,
    "test_faults_fleet": 240,
    "test_faults_flood": 240,
    "test_faults_kill9": 240,
    "test_faults_outage": 240,
    "test_faults_programs": 240,
    "test_faults_records": 240,
    "test_service_install": 600,
    "test_systemd": 600,
    "test_systemd_mirror": 600,
    "test_status_page": 180,
    "test_multi_device_fence": 180,
    "test_control_fuzz": 180,
    "test_control_descriptors": 120,
    "test_control_flood": 120,
    "test_serve_process": 120,
    "test_once_lifecycle": 120,
    "test_fire_disk_full": 120,
    "test_startup_spread": 120,
    "test_model": 120,
    "test_records": 120,
    "test_schedule_props": 120,
}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Escape lone surrogates in a report's captured output (tests feed the daemon such text
    on purpose): a pytest-xdist worker sends its reports as UTF-8 and cannot send them."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    report.sections = [
        (name, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for name, text in report.sections
    ]


SLOW = frozenset(LONG_TIMEOUTS)


def pytest_itemcollected(item: pytest.Item) -> None:
    fixtures = set(getattr(item, "fixturenames", ()))
    module = item.module.__name__ if isinstance(item, pytest.Function) else ""
    if fixtures & PROCESS_FIXTURES or module in PROCESS_MODULES:
        item.add_marker(pytest.mark.process)
    if module in LONG_TIMEOUTS and item.get_closest_marker("timeout") is None:
        item.add_marker(pytest.mark.timeout(LONG_TIMEOUTS[module]))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The long modules first, so that no worker starts one at the end of the run (a stable
    # sort: each module's tests stay together and in their order). `.ci/run` hands each
    # module to one pytest-xdist worker (`--dist loadfile`): its module-scoped fixtures are
    # built once, and the modules that share a machine-wide resource (the systemd sandbox,
    # the units under /etc) take a lock for it (tests/systemd_fixtures.py).
    items.sort(key=lambda i: getattr(getattr(i, "module", None), "__name__", "") not in SLOW)


# --- end markers ---------------------------------------------------------------------------
