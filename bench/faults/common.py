"""What the fault families share: a devserver, `anyrtd serve` processes, the agent space's
records, a look at processes through /proc, and the checks a family reports."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import re
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from anyrtd.client import Dataset, ServerClient, Upsert
from anyrtd.places import Places, resolve_places

T = TypeVar("T")

DEVICE_LINE = re.compile(r"^anyrtd devserver: device (\d+) (\S+) (http://\S+)$")
LISTENING = re.compile(r"control API listening on (\S+)")
# systemd's default soft limit for a service: a daemon under test gets the same.
SERVICE_NOFILE = 1024
TAG_VAR = "ANYRTD_FAULTS_TAG"


def command() -> list[str]:
    """Return how to run `anyrtd`: the one on PATH, else this interpreter's module."""
    found = shutil.which("anyrtd")
    return [found] if found else [sys.executable, "-m", "anyrtd"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `check` until it returns a truthy value; raise `Timeout` naming `what`."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # not checkable yet (a socket not bound, a file not there)
            last = exc
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout:g} s waiting for {what}") from last
        time.sleep(interval)


def within(check: Callable[[], Any], timeout: float, interval: float = 0.05) -> bool:
    """Return whether `check` came true before `timeout` s (a figure, not a failure)."""
    try:
        wait_for(check, timeout, "a condition", interval)
    except Timeout:
        return False
    return True


class Timeout(AssertionError):
    """A condition of the harness did not come true before its deadline."""


# --- checks --------------------------------------------------------------------------------


@dataclass
class Check:
    """One promise: its figure, what it must be, and whether it held."""

    name: str
    value: Any
    expect: str
    ok: bool


@dataclass
class Result:
    """What one family measured: checks (promises), figures (context), notes."""

    family: str
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None
    seconds: float = 0.0

    def zero(self, name: str, value: int) -> None:
        self.checks.append(Check(name, value, "0", value == 0))

    def at_most(self, name: str, value: float, limit: float, unit: str = "") -> None:
        self.checks.append(Check(name, value, f"<= {limit:g}{unit}", value <= limit))

    def at_least(self, name: str, value: float, limit: float, unit: str = "") -> None:
        self.checks.append(Check(name, value, f">= {limit:g}{unit}", value >= limit))

    def equal(self, name: str, value: Any, expect: Any) -> None:
        self.checks.append(Check(name, value, f"{expect}", value == expect))

    @property
    def ok(self) -> bool:
        return self.skipped is None and self.error is None and all(c.ok for c in self.checks)

    def failures(self) -> list[str]:
        """Return one line per broken promise (and the harness error, if any)."""
        out = [f"{c.name} = {c.value} (expected {c.expect})" for c in self.checks if not c.ok]
        return ([f"harness: {self.error}"] if self.error else []) + out

    def report(self) -> str:
        """Return the broken promises, the notes and the figures, for an assertion message."""
        lines = [*self.failures(), *self.notes, json.dumps(self.figures, default=str)]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "ok": self.ok,
            "skipped": self.skipped,
            "error": self.error,
            "seconds": round(self.seconds, 1),
            "checks": [c.__dict__ for c in self.checks],
            "figures": self.figures,
            "notes": self.notes,
        }


def percentile(values: Iterable[float], q: float) -> float:
    """Return the `q` quantile (0 to 1) of `values`, nearest rank; 0 for none."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# --- the devserver ---------------------------------------------------------------------------


class Server:
    """`anyrtd devserver` in a process of its own: `.url`, `.urls`, `.peers`."""

    def __init__(self, work: Path, *, devices: int = 1, port: int | None = None) -> None:
        self.db = work / "dev.sqlite3"
        self.log = work / "devserver.log"
        self.devices = devices
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.urls: list[str] = []
        self.peers: list[str] = []

    @property
    def url(self) -> str:
        return self.urls[0]

    def start(self, timeout: float = 60.0) -> Server:
        argv = [*command(), "devserver", "--db", str(self.db), "--devices", str(self.devices)]
        argv += ["--port", str(self.port if self.port is not None else 0)]
        with self.log.open("a") as err:
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
            )
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc, lines), daemon=True).start()
        urls, peers = [], []
        deadline = time.monotonic() + timeout
        while len(urls) < self.devices:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise Timeout(f"the devserver did not start; see {self.log}")
            match = DEVICE_LINE.match(line.strip())
            if match:
                peers.append(match.group(2))
                urls.append(match.group(3))
        self.urls, self.peers = urls, peers
        return self

    def stop(self, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            _end(proc, timeout)

    def admin(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        resp = httpx.post(f"{self.url}/_dev/{path}", json=dict(body or {}), timeout=30)
        resp.raise_for_status()
        return resp.json()


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


def _end(proc: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM, then SIGKILL to the whole group past `timeout`; return the exit status."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


# --- the daemon ------------------------------------------------------------------------------


def _service_limits() -> None:
    """Run in the child: the descriptor limit systemd gives a service by default."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = SERVICE_NOFILE if hard == resource.RLIM_INFINITY else min(SERVICE_NOFILE, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


class Serve:
    """`anyrtd serve` as a process: its config, state directory, log and control API."""

    def __init__(
        self,
        work: Path,
        server_url: str,
        *,
        name: str = "serve",
        programs: Mapping[str, list[str]] | None = None,
        config: Iterable[str] = (),
        tick: float = 0.5,
        listen: str | None = None,
        env: Mapping[str, str] | None = None,
        state: Path | None = None,
    ) -> None:
        self.work = work
        self.server_url = server_url
        self.name = name
        self.state = state or work / f"{name}-state"
        self.log = work / f"{name}.log"
        self.config = work / f"{name}.toml"
        self.requested = listen or f"unix:{work / f'{name}.sock'}"
        self.tick = tick
        self.env = dict(env or {})
        lines = ["grace_s = 1.0", *config]
        for spec, argv in (programs or {}).items():
            lines += [f'[programs."{spec}"]', f"argv = {json.dumps(argv)}"]
        self.config.write_text("".join(f"{ln}\n" for ln in lines))
        self.listen = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._offset = 0

    @property
    def mirror(self) -> Path:
        return self.state / "anyrtd.sqlite3"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def spawn(self) -> subprocess.Popen[bytes]:
        argv = [*command(), "serve", "--config", str(self.config), "--server", self.server_url]
        argv += ["--state-dir", str(self.state), "--tick", str(self.tick)]
        argv += ["--listen", self.requested]
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                env={**os.environ, **self.env},
                preexec_fn=_service_limits,
            )
        return self.proc

    def start(self, timeout: float = 60.0) -> Serve:
        """Spawn the daemon and wait until its control API answers `/healthz` from a tick."""
        self.spawn()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        def bound() -> str | None:
            self.check_alive()
            match = LISTENING.search(self.log.read_text(errors="replace")[self._offset :])
            return match.group(1) if match else None

        self.listen = wait_for(bound, timeout, f"{self.name} to listen")
        wait_for(self.ticking, timeout, f"{self.name} to tick")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[self._offset :][-2000:]
            raise DaemonExited(self.proc.returncode, tail)

    def ticking(self) -> bool:
        self.check_alive()
        with self.http(timeout=5) as client:
            resp = client.get("/healthz")
        return resp.status_code in (200, 503) and resp.json().get("status") in ("ok", "degraded")

    def http(self, timeout: float = 10.0) -> httpx.Client:
        """Return a client of the control API (unix socket or TCP)."""
        if self.listen.startswith("unix:"):
            transport = httpx.HTTPTransport(uds=self.listen.removeprefix("unix:"))
            return httpx.Client(base_url="http://localhost", transport=transport, timeout=timeout)
        return httpx.Client(base_url=f"http://{self.listen}", timeout=timeout)

    def get(self, path: str, **params: Any) -> Any:
        with self.http() as client:
            return client.get(path, params=params).json()

    def get_text(self, path: str) -> str:
        with self.http() as client:
            return client.get(path).text

    def kill9(self) -> int | None:
        """SIGKILL the daemon alone (its programs stay, as after a crash)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        return proc.wait()

    def stop(self, timeout: float = 30.0) -> int | None:
        proc, self.proc = self.proc, None
        return _end(proc, timeout) if proc is not None else None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class DaemonExited(AssertionError):
    """The daemon under test exited on its own."""

    def __init__(self, code: int | None, tail: str) -> None:
        super().__init__(f"anyrtd serve exited {code}: {tail.strip().splitlines()[-1:]}")
        self.code = code
        self.tail = tail


# --- the agent space -------------------------------------------------------------------------


class Space:
    """The agent space as a user sees it, synchronously: write triggers, read run records."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._places: Places | None = None

    def _call(self, fn: Callable[[ServerClient, Places], Any]) -> Any:
        async def main() -> Any:
            async with ServerClient(self.url) as client:
                if self._places is None:
                    self._places = await resolve_places(client, "bao")
                return await fn(client, self._places)

        return asyncio.run(main())

    def put(self, records: Mapping[str, Mapping[str, Any]], batch: int = 500) -> None:
        """Write trigger records (field-level), `batch` to a request."""
        items = [Upsert(rid, dict(fields)) for rid, fields in records.items()]

        async def go(client: ServerClient, places: Places) -> None:
            for start in range(0, len(items), batch):
                await client.upsert(places.triggers, items[start : start + batch])

        self._call(go)

    def dataset(self) -> Dataset:
        """Return where the trigger records live (for writes the client would not send)."""
        found: Dataset = self._call(lambda c, p: asyncio.sleep(0, p.triggers))
        return found

    def runs(self) -> list[dict[str, Any]]:
        """Return every `agent_runs` record on the server."""
        found: list[dict[str, Any]] = self._call(lambda c, p: c.query_all(p.runs))
        return found

    def triggers(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._call(lambda c, p: c.query_all(p.triggers))
        return found


def once(at: float, program: str) -> dict[str, Any]:
    return {"kind": "once", "spec": {"at": at}, "program": program, "owner": "", "enabled": True}


def every(seconds: float, program: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "cron", "spec": {"every_s": seconds}, "program": program, "owner": "", **extra}


def cron(expr: str, program: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "cron", "spec": {"cron": expr}, "program": program, "owner": "", **extra}


def marker_program(started: Path, *then: str) -> list[str]:
    """A command that notes `run-id trigger-id scheduled-at` in `started`, then runs `then`."""
    note = f'echo "$ANYRTD_RUN_ID $ANYRTD_TRIGGER_ID $ANYRTD_SCHEDULED_AT" >> {started}'
    return ["/bin/sh", "-c", "\n".join([note, *then])]


def started_runs(started: Path) -> dict[str, tuple[str, str]]:
    """Return the runs the programs noted: run id -> (trigger id, scheduled-at)."""
    out: dict[str, tuple[str, str]] = {}
    if started.exists():
        for line in started.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 3 and parts[0]:
                out[parts[0]] = (parts[1], parts[2])
    return out


def quiesce(
    serve: Serve,
    space: Space,
    ids: Iterable[str],
    started: Path,
    onces: Iterable[str] = (),
    timeout: float = 120.0,
) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]], str | None]:
    """Disable the recurring triggers `ids`, wait until the daemon holds them disabled, then
    `settle`; return the server's runs, the runs the programs noted, and what was missing."""
    ids = list(ids)
    space.put({rid: {"enabled": False} for rid in ids})

    def disabled() -> bool:
        return all(serve.get(f"/triggers/{rid}").get("enabled") is False for rid in ids)

    wait_for(disabled, 60, "the daemon to hold the recurring triggers disabled", 0.2)
    runs, missing = settle(space, started, onces, timeout)
    return runs, started_runs(started), missing


def settle(
    space: Space, started: Path, onces: Iterable[str], timeout: float = 120.0
) -> tuple[list[dict[str, Any]], str | None]:
    """Wait until every `once` has a run and every noted run its ended record; return the
    server's runs, and what was still missing at the deadline (None when nothing was)."""
    want = set(onces)
    missing: list[str] = []

    def done() -> bool:
        runs = space.runs()
        recorded = {r.get("runId") for r in runs if r.get("endedAt") is not None}
        fired = {r.get("triggerId") for r in runs}
        missing[:] = [
            f"{len(set(started_runs(started)) - recorded)} started runs without a record",
            f"{len(want - fired)} onces without a run",
        ]
        return set(started_runs(started)) <= recorded and want <= fired

    try:
        wait_for(done, timeout, "every once fired and every started run recorded", 0.5)
    except Timeout:
        return space.runs(), f"after {timeout:g} s: {', '.join(missing)}"
    return space.runs(), None


def duplicates(runs: Iterable[Mapping[str, Any]]) -> int:
    """Count the `(triggerId, scheduledAt)` occurrences recorded more than once."""
    seen = Counter(
        (r.get("triggerId"), r.get("scheduledAt")) for r in runs if r.get("scheduledAt") is not None
    )
    return sum(n - 1 for n in seen.values() if n > 1)


def integrity(mirror: Path) -> str:
    """Return `PRAGMA integrity_check` of a mirror (opened as the daemon would)."""
    if not mirror.exists():
        return "ok"
    with contextlib.closing(sqlite3.connect(mirror, timeout=10)) as conn:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    return "; ".join(str(r[0]) for r in rows)


# --- processes ---------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after its last ')'
    return [raw[: raw.index("(")].strip(), *raw[raw.rindex(")") + 2 :].split()]


def process_key(pid: int) -> tuple[int, str] | None:
    """Return (pid, start time) while the process exists and is not a zombie."""
    fields = _stat(pid)
    if fields is None or fields[1] == "Z":
        return None
    return pid, fields[20]


def tagged(tag: str) -> set[tuple[int, str]]:
    """Return the live processes whose environment carries `ANYRTD_FAULTS_TAG=tag`."""
    needle = f"{TAG_VAR}={tag}".encode()
    out: set[tuple[int, str]] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            key = process_key(int(entry.name))
            if key is not None:
                out.add(key)
    return out


def alive(keys: Iterable[tuple[int, str]]) -> set[tuple[int, str]]:
    """Return those of `keys` still running (same pid and start time)."""
    return {k for k in keys if process_key(k[0]) == k}


def zombies_of(pid: int) -> int:
    """Count the zombie children of `pid`."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[1] == "Z" and fields[2] == str(pid):
                count += 1
    return count


def fd_count(pid: int, *, sockets: bool = True) -> int:
    """Return how many descriptors `pid` holds (-1: it is gone); without `sockets`, those
    that are not sockets (a run's pipes and files, not the pool of connections to the server,
    whose size follows the load)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return -1
    if sockets:
        return len(names)
    count = 0
    for name in names:
        try:
            if not os.readlink(fd_dir / name).startswith("socket:"):
                count += 1
        except OSError:  # closed meanwhile
            continue
    return count


def kill_tagged(tag: str) -> int:
    """SIGKILL every process tagged `tag` (the harness's own clean-up); return how many."""
    found = tagged(tag)
    for pid, _ in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(found)


@contextlib.contextmanager
def family_run(
    result: Result,
    serve: Serve,
    server: Server,
    tag: str,
    *,
    first: Callable[[], object] = lambda: None,
    last: Callable[[], object] = lambda: None,
) -> Iterator[None]:
    """Run a family's rounds; however they end, stop the daemon, the devserver and every
    program tagged `tag` (with `first` before them and `last` after). A daemon that exited
    on its own becomes the family's error: the caller returns `result` when it is set."""
    try:
        yield
    except DaemonExited as exc:
        result.error = str(exc)
    finally:
        first()
        serve.stop()
        server.stop()
        kill_tagged(tag)
        last()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
