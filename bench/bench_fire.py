"""Fire lag measured from the program's side: anyrtd beside APScheduler 3, in one run.

Run from the repository's root:

    python -m bench.bench_fire [--quick] [--scenario NAME ...] [--json FILE] [--py-spy DIR]
        [--anyrtd TREE]

Each scheduler under test runs alone in a child process (`bench/fire_child.py`): anyrtd as
`anyrtd serve` builds it (election gate, default tick and poll, a real mirror) against a
devserver in another process; APScheduler 3's `AsyncIOScheduler` with its memory store
(`aps-memory`) and with `SQLAlchemyJobStore` on SQLite (`aps-sqlite`). This process writes
the triggers (anyrtd: records on the devserver; APScheduler: `add_job` commands to the
child), reads the child's CPU time and memory, and follows the devserver's change feed for
the run records. Every lag is the program's own: the moment it was called minus the
moment it was due. Scenarios (issue 13, "The bar"):

- `spread-1k`, `spread-10k`: 1,000 interval triggers every 10 s, 10,000 every 60 s, added
  ten at a time across one period; then real start lag and CPU per fire over a window.
- `burst-1k`, `burst-10k`: that many `once` triggers due in the same second; real start
  lag, and for anyrtd the largest `startedAt - scheduledAt` its run records claim and the
  time until every run is recorded on the server.
- `idle-0`, `idle-1k`, `idle-10k`, `idle-100k`: nothing due; CPU per second and resident
  memory; for anyrtd also a restart from the mirror those triggers left (start-up time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anyrtd.client import ServerClient, Upsert
from anyrtd.places import Places, resolve_places
from bench.fire_child import PROBE
from bench.support import percentile, start_devserver

REPO = Path(__file__).resolve().parent.parent
SCHEDULERS = ("anyrtd", "aps-memory", "aps-sqlite")
IDLE_EVERY_S = 86_400.0
"""The period of the idle scenarios' triggers: nothing comes due during the window."""
IDLE_WINDOW_S = 100.0
"""The idle scenarios' window: whole periods of anyrtd's own timers (the tick, 5 s; the
election's poll, 10 s; the feed's long poll, 25 s). Each poll costs 0.4-0.6 ms of CPU,
and a 30 s window held one or two long polls and three or four election polls: the
window alone moved the figure by about 0.04 ms/s."""


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # spread, burst or idle
    n: int
    every_s: float = 0.0
    window_s: float = 0.0
    schedulers: tuple[str, ...] = SCHEDULERS


def scenarios(quick: bool) -> dict[str, Scenario]:
    """Return the scenarios by name; `quick` shrinks each to a smoke run of a few seconds."""
    idle = ("anyrtd", "aps-memory")
    if quick:
        table = [
            Scenario("spread-1k", "spread", 100, every_s=4.0, window_s=4.0),
            Scenario("spread-10k", "spread", 400, every_s=8.0, window_s=8.0),
            Scenario("burst-1k", "burst", 100),
            Scenario("burst-10k", "burst", 1000),
            Scenario("idle-0", "idle", 0, window_s=3.0, schedulers=idle),
            Scenario("idle-1k", "idle", 100, window_s=3.0, schedulers=idle),
            Scenario("idle-10k", "idle", 1000, window_s=3.0, schedulers=idle),
            Scenario("idle-100k", "idle", 10_000, window_s=3.0, schedulers=idle),
        ]
    else:
        table = [
            Scenario("spread-1k", "spread", 1000, every_s=10.0, window_s=20.0),
            Scenario("spread-10k", "spread", 10_000, every_s=60.0, window_s=60.0),
            Scenario("burst-1k", "burst", 1000),
            Scenario("burst-10k", "burst", 10_000),
            Scenario("idle-0", "idle", 0, window_s=IDLE_WINDOW_S, schedulers=idle),
            Scenario("idle-1k", "idle", 1000, window_s=IDLE_WINDOW_S, schedulers=idle),
            Scenario("idle-10k", "idle", 10_000, window_s=IDLE_WINDOW_S, schedulers=idle),
            Scenario("idle-100k", "idle", 100_000, window_s=IDLE_WINDOW_S, schedulers=idle),
        ]
    return {s.name: s for s in table}


# --------------------------------------------------------------------------- the child


def package_only(tree: Path, where: Path) -> Path:
    """Return a folder whose only package is `tree`'s `anyrtd` (a link), made in `where`: put
    before this tree on a child's path, it runs that anyrtd with this bench's `fire_child`."""
    where.mkdir(exist_ok=True)
    link = where / "anyrtd"
    if not link.exists():
        link.symlink_to((tree / "anyrtd").resolve(), target_is_directory=True)
    return where


class Child:
    """One scheduler under test in a process of its own, driven one command at a time."""

    def __init__(self, kind: str, params: Mapping[str, Any], log: Path) -> None:
        self.kind = kind
        self.params = {**params, "log": str(log)}
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None
        self.ready: dict[str, Any] = {}
        self._seq = 0
        self.code = REPO
        """The tree whose `bench.fire_child` and `anyrtd` the child runs: the folder first on
        its path (`package_only` makes one with another tree's `anyrtd` alone)."""

    async def start(self, limit_s: float = 600.0) -> dict[str, Any]:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from bench.fire_child import main; main()",
            self.kind,
            json.dumps(self.params),
            cwd=self.code,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self.log.open("ab"),
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(dict.fromkeys((str(self.code), str(REPO)))),
            },
            limit=2**28,  # the last answer carries every sample
        )
        self.ready = await self._read(limit_s)
        ran, meant = self.ready.get("anyrtd"), str((self.code / "anyrtd").resolve())
        if self.kind == "anyrtd" and ran != meant:
            raise RuntimeError(f"the child ran the anyrtd in {ran}, not the one in {meant}")
        return self.ready

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def ask(self, op: str, limit_s: float = 600.0, **fields: Any) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self._seq += 1
        self.proc.stdin.write((json.dumps({"op": op, "seq": self._seq, **fields}) + "\n").encode())
        await self.proc.stdin.drain()
        answer = await self._read(limit_s)
        while answer.get("seq") != self._seq:
            # The late answer to a command given up on: not this one's.
            answer = await self._read(limit_s)
        if "error" in answer:
            raise RuntimeError(f"{self.kind}: {op}: {answer['error']}")
        return answer

    async def _read(self, limit_s: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), limit_s)
        if not line:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the {self.kind} child ended early; its log ends:\n{tail}")
        return json.loads(line)  # type: ignore[no-any-return]

    async def wait_size(self, size: int, limit_s: float) -> dict[str, Any]:
        """Poll until the scheduler holds at least `size` triggers; return the last stat."""
        deadline = time.monotonic() + limit_s
        while True:
            st = await self.ask("stat")
            if st["size"] >= size:
                return st
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kind}: holds {st['size']} triggers, not {size}")
            await asyncio.sleep(0.2)

    async def stop(self) -> dict[str, Any]:
        final = await self.ask("stop", limit_s=120.0)
        assert self.proc is not None
        await asyncio.wait_for(self.proc.wait(), 30.0)
        return final

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


@dataclass(frozen=True)
class Under:
    """How each scheduler under test runs: anyrtd's tree, and how each logs: anyrtd at a
    level (INFO, as `anyrtd serve` does), APScheduler with Python's logging unconfigured
    (nothing below WARNING, as its users run it) unless `aps_info`."""

    anyrtd: str = "INFO"
    aps_info: bool = False
    timer: bool = False
    """Also anyrtd's timer lines at DEBUG (`anyrtd.timer`): each batch's prepare and start."""
    tree: Path | None = None
    """The tree whose `anyrtd` package the anyrtd child runs (None: this one), with this
    bench's `fire_child` and devserver: one bench measures two trees alike."""


class Setup:
    """What one scheduler's measurement needs: a devserver (anyrtd only) and the child."""

    def __init__(self, kind: str, tmp: Path, under: Under | None = None) -> None:
        self.kind = kind
        self.tmp = tmp
        self.under = Under() if under is None else under
        self.state = tmp / "state"
        self.state.mkdir(exist_ok=True)
        self.server: subprocess.Popen[str] | None = None
        self.url = ""
        self.client: ServerClient | None = None
        self.places: Places | None = None
        self.peer = ""
        self.children: list[Child] = []

    async def __aenter__(self) -> Setup:
        if self.kind == "anyrtd":
            self.server, self.url = start_devserver(self.tmp / "server.sqlite3")
            self.client = ServerClient(self.url, timeout=120.0)
            self.places = await resolve_places(self.client, "bao")
            view = await self.client.devices()
            assert view is not None, "the devserver has no devices registry"
            self.peer = view.self_id
        return self

    async def __aexit__(self, *exc: object) -> None:
        for child in self.children:
            await child.kill()
        if self.client is not None:
            await self.client.aclose()
        if self.server is not None:
            self.server.terminate()
            self.server.wait()

    def child(self) -> Child:
        params: dict[str, Any] = {}
        if self.kind == "anyrtd":
            params = {
                "url": self.url,
                "state": str(self.state),
                "log_level": self.under.anyrtd,
                "timer_log": self.under.timer,
            }
        elif self.kind == "aps-sqlite":
            params = {"sqlite": str(self.tmp / "jobs.sqlite3")}
        if self.kind != "anyrtd":
            params["aps_log_info"] = self.under.aps_info
        child = Child(self.kind, params, self.tmp / f"{self.kind}-{len(self.children)}.log")
        if self.kind == "anyrtd" and self.under.tree is not None:
            child.code = package_only(self.under.tree, self.tmp / "tree")
        self.children.append(child)
        return child

    async def write(self, records: Sequence[tuple[str, dict[str, Any]]], batch: int) -> None:
        """Write trigger records pinned to the device, `batch` to a request."""
        assert self.client is not None and self.places is not None
        for start in range(0, len(records), batch):
            await self.client.upsert(
                self.places.triggers,
                [
                    Upsert(rid, {**fields, "owner": self.peer})
                    for rid, fields in records[start : start + batch]
                ],
            )


def every_record(every_s: float) -> dict[str, Any]:
    return {"kind": "cron", "spec": {"every_s": every_s}, "program": PROBE}


def once_record(at: float) -> dict[str, Any]:
    return {"kind": "once", "spec": {"at": at}, "program": PROBE}


# --------------------------------------------------------------------------- the scenarios


def lag_summary(lags: Sequence[float]) -> dict[str, Any]:
    """Return the count, p50, p99 and max of `lags` (seconds) in milliseconds."""
    if not lags:
        return {"samples": 0}
    return {
        "samples": len(lags),
        "p50_ms": round(percentile(list(lags), 0.5) * 1000, 2),
        "p99_ms": round(percentile(list(lags), 0.99) * 1000, 2),
        "max_ms": round(max(lags) * 1000, 2),
    }


async def run_spread(
    sc: Scenario, kind: str, tmp: Path, py_spy: Path | None, under: Under
) -> dict[str, Any]:
    """Add `n` interval triggers ten at a time across one period; measure a window after."""
    async with Setup(kind, tmp, under) as setup:
        child = setup.child()
        ready = await child.start()
        base = ready["size"]
        groups = max(1, sc.n // 10)
        step = sc.every_s / groups
        t0 = time.time()
        added = 0
        for g in range(groups):
            await asyncio.sleep(max(0.0, t0 + g * step - time.time()))
            if time.time() - t0 > 2 * sc.every_s:
                break
            if kind == "anyrtd":
                ids = [
                    (f"spread{i:06d}", every_record(sc.every_s)) for i in range(g * 10, g * 10 + 10)
                ]
                await setup.write(ids, 10)
            else:
                with contextlib.suppress(TimeoutError):
                    await child.ask(
                        "add_every",
                        limit_s=2 * sc.every_s,
                        prefix="spread",
                        first=g * 10,
                        n=10,
                        every=sc.every_s,
                    )
            added += 10
        adding_s = time.time() - t0
        if added < groups * 10:
            # Adding took over two periods: the scheduler is behind its own schedule.
            final = await child.stop()
            lags = [lag for _, lag in final["samples"]]
            return {
                "triggers": groups * 10,
                "every_s": sc.every_s,
                "fell_behind": f"{added} of {groups * 10} added in {adding_s:.0f} s",
                "lag_of_every_start_so_far": lag_summary(lags),
            }
        await child.wait_size(base + groups * 10, limit_s=120.0)
        with profiled(py_spy, kind, child.pid, sc.name):
            w0 = await child.ask("stat", size=False)
            await asyncio.sleep(sc.window_s)
            w1 = await child.ask("stat", size=False)
        # Runs due in the window that a scheduler behind its schedule starts after it still
        # count: wait until it has started a run due after the window (or a period passed).
        deadline = time.monotonic() + sc.every_s + 5.0
        while time.monotonic() < deadline:
            st = await child.ask("stat", size=False)
            if st["last_due"] >= w1["t"]:
                break
            await asyncio.sleep(0.2)
        final = await child.stop()
    window = [(due, lag) for due, lag in final["samples"] if w0["t"] <= due < w1["t"]]
    fires = w1["fires"] - w0["fires"]
    cpu = w1["cpu_s"] - w0["cpu_s"]
    dues = {round(due, 3) for due, _ in window}
    return {
        "triggers": groups * 10,
        "every_s": sc.every_s,
        "adding_s": round(adding_s, 2),
        "window_s": round(w1["t"] - w0["t"], 2),
        "expected_fires": round(groups * 10 * (w1["t"] - w0["t"]) / sc.every_s),
        "fires_in_window": fires,
        "fires_per_s": round(fires / (w1["t"] - w0["t"]), 1),
        "fires_per_due_time": round(len(window) / len(dues), 1) if dues else None,
        "cpu_ms_per_fire": round(cpu / fires * 1000, 3) if fires else None,
        "cpu_share_of_core": round(cpu / (w1["t"] - w0["t"]), 3),
        "lag": lag_summary([lag for _, lag in window]),
    }


ANYRTD_LEAD_S = (3.0, 0.005)
"""(fixed seconds, seconds per trigger) between writing anyrtd's burst and its due time."""
CALIBRATION = 100
"""How many jobs APScheduler adds (and removes) to time its adding before a burst."""


async def run_burst(
    sc: Scenario, kind: str, tmp: Path, py_spy: Path | None, under: Under
) -> dict[str, Any]:
    """Write `n` once triggers due at the same instant; measure their starts and records."""
    async with Setup(kind, tmp, under) as setup:
        child = setup.child()
        ready = await child.start()
        follower: asyncio.Task[dict[str, Any]] | None = None
        if kind == "anyrtd":
            assert setup.client is not None and setup.places is not None
            at = math.ceil(time.time() + ANYRTD_LEAD_S[0] + ANYRTD_LEAD_S[1] * sc.n)
            head = await setup.client.changes("bao", since=2**53, wait=0)
            assert head is not None
            follower = asyncio.create_task(follow_runs(setup, head.seq, "burst", sc.n))
            ids = [(f"burst{i:06d}", once_record(at)) for i in range(sc.n)]
            await setup.write(ids, 500)
            held_at = (await child.wait_size(ready["size"] + sc.n, limit_s=at + 60 - time.time()))[
                "t"
            ]
        else:
            # The lead is what adding this many jobs takes here, with room to spare.
            add_s = (await child.ask("calibrate", prefix="calibrate", n=CALIBRATION))["add_s"]
            at = math.ceil(time.time() + 2.0 + 1.5 * add_s * sc.n / CALIBRATION)
            held_at = (await child.ask("add_once", prefix="burst", n=sc.n, at=at))["t"]
        setup_margin = at - held_at
        await asyncio.sleep(max(0.0, at - 0.5 - time.time()))
        with profiled(py_spy, kind, child.pid, sc.name):
            before = await child.ask("stat", size=False)
            deadline = time.monotonic() + max(0.0, at - time.time()) + 180.0
            while time.monotonic() < deadline:
                st = await child.ask("stat", size=False)
                if st["fires"] >= sc.n:
                    break
                await asyncio.sleep(0.1)
        recorded: dict[str, Any] = {}
        if follower is not None:
            try:
                recorded = await asyncio.wait_for(follower, max(5.0, at + 300.0 - time.time()))
            except TimeoutError:
                recorded = {"error": "not every run was recorded on the server within 300 s"}
        final = await child.stop()
    lags = [lag for due, lag in final["samples"] if due == at]
    out: dict[str, Any] = {
        "triggers": sc.n,
        "written_ahead_s": round(setup_margin, 2),
        "started": len(lags),
        "lag": lag_summary(lags),
        "first_start_ms": round(min(lags) * 1000, 2) if lags else None,
        "cpu_ms_per_fire_until_last_start": round((st["cpu_s"] - before["cpu_s"]) / sc.n * 1000, 3),
    }
    if setup_margin < 0.2:
        out["warning"] = "the triggers were not all held before their due time: raise the lead"
    if kind == "anyrtd":
        out["records"] = {**recorded, "due_at": at}
        if "last_recorded_at" in recorded:
            out["records"]["all_recorded_s"] = round(recorded["last_recorded_at"] - at, 2)
    return out


async def follow_runs(setup: Setup, since: int, prefix: str, n: int) -> dict[str, Any]:
    """Follow the devserver's feed until `n` run records of triggers `prefix*` are there."""
    assert setup.client is not None and setup.places is not None
    runs = setup.places.runs.object_id
    claims: dict[str, float] = {}
    last = 0.0
    while len(claims) < n:
        page = await setup.client.changes("bao", since=since, wait=5.0)
        assert page is not None
        for change in page.changes:
            rec = change.record
            if change.object_id != runs or not rec:
                continue
            if not str(rec.get("triggerId", "")).startswith(prefix):
                continue
            if rec.get("startedAt") is not None and rec.get("scheduledAt") is not None:
                claims[change.id] = float(rec["startedAt"]) - float(rec["scheduledAt"])
                last = time.time()
        since = page.seq
    return {
        "recorded": len(claims),
        "last_recorded_at": last,
        "largest_claimed_lag_ms": round(max(claims.values()) * 1000, 2),
    }


def start_py_spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """Start sampling `pid` with py-spy (collapsed stacks, idle frames left out; only the
    thread holding the GIL, a view of the CPU, when BENCH_PY_SPY_GIL is set)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        print("py-spy is not installed here: no profile", file=sys.stderr)
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    gil = ["--gil"] if os.environ.get("BENCH_PY_SPY_GIL") else []
    return subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "250",
            *gil,
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def profiled(py_spy: Path | None, kind: str, pid: int, name: str) -> Iterator[None]:
    """Profile anyrtd's child `pid` with py-spy into `py_spy/name.txt` over the block, when
    asked (`--py-spy`); the peers are not profiled."""
    spy = None
    if py_spy is not None and kind == "anyrtd":
        spy = start_py_spy(pid, py_spy / f"{name}.txt")
    try:
        yield
    finally:
        if spy is not None:
            stop_py_spy(spy)


def stop_py_spy(spy: subprocess.Popen[bytes]) -> None:
    """Stop py-spy (SIGINT): it writes what it sampled and exits."""
    spy.send_signal(signal.SIGINT)
    spy.wait(60)


async def run_idle(
    sc: Scenario, kind: str, tmp: Path, settle_s: float, py_spy: Path | None, under: Under
) -> dict[str, Any]:
    """Hold `n` triggers with nothing due: CPU per second, memory, and a restart (anyrtd).
    With `py_spy`, anyrtd is profiled over the window (py-spy's sampling costs CPU of its
    own: the figure of a profiled run is not comparable)."""
    async with Setup(kind, tmp, under) as setup:
        out: dict[str, Any] = {"triggers": sc.n}
        if kind == "anyrtd":
            t0 = time.perf_counter()
            recs = [(f"idle{i:06d}", every_record(IDLE_EVERY_S + i % 1000)) for i in range(sc.n)]
            await setup.write(recs, 1000)
            out["seeding_s"] = round(time.perf_counter() - t0, 1)
        child = setup.child()
        ready = await child.start()
        if kind == "anyrtd":
            base = 0
            held = await child.wait_size(sc.n, limit_s=900.0)
            out["first_start_s"] = ready["start_s"]
            out["adopted_after_s"] = round(held["t"] - ready["t"] + ready["start_s"], 2)
        else:
            base = ready["size"]
            if sc.n:
                await child.ask(
                    "add_every", prefix="idle", n=sc.n, every=IDLE_EVERY_S, stagger=True
                )
        await asyncio.sleep(settle_s)
        mem = await child.ask("gc")
        with profiled(py_spy, kind, child.pid, sc.name):
            w0 = await child.ask("stat", size=False)
            await asyncio.sleep(sc.window_s)
            w1 = await child.ask("stat", size=False)
        out.update(
            {
                "held": mem["size"] - base,
                "idle_cpu_ms_per_s": round(
                    (w1["cpu_s"] - w0["cpu_s"]) / (w1["t"] - w0["t"]) * 1000, 3
                ),
                "window_s": round(w1["t"] - w0["t"], 1),
                "rss_mb": round(mem["rss_kb"] / 1024, 1),
                "peak_rss_mb": round(mem["hwm_kb"] / 1024, 1),
            }
        )
        if kind == "anyrtd":
            # The full re-read of every record every `full_resync_s` (300 s), which a 30 s
            # window leaves out: its CPU, and the idle figure with it spread over its period.
            resync = await child.ask("resync", limit_s=900.0)
            out["full_read"] = {
                "cpu_s": round(resync["cpu_s"], 3),
                "wall_s": round(resync["wall_s"], 2),
                "every_s": resync["every_s"],
            }
            out["idle_cpu_ms_per_s_with_full_read"] = round(
                out["idle_cpu_ms_per_s"] + resync["cpu_s"] / resync["every_s"] * 1000, 3
            )
        await child.stop()
        if kind == "anyrtd" and sc.n:
            # The same device starts again from the mirror those triggers left behind.
            again = setup.child()
            ready = await again.start()
            held = await again.wait_size(sc.n, limit_s=300.0)
            out["restart"] = {
                "open_s": ready["open_s"],
                "start_s": ready["start_s"],
                "held_at_start": ready["size"],
                "peak_rss_mb": round(held["hwm_kb"] / 1024, 1),
            }
            await again.stop()
    return out


# --------------------------------------------------------------------------- the report


def per_trigger(results: Mapping[str, Any]) -> None:
    """Add memory per trigger to each idle result: resident memory above idle-0's, per trigger."""
    base = results.get("idle-0", {})
    for name, by_kind in results.items():
        if not name.startswith("idle-") or name == "idle-0":
            continue
        for kind, res in by_kind.items():
            zero = base.get(kind, {}).get("rss_mb")
            if zero is not None and res.get("triggers"):
                res["kb_per_trigger_above_idle_0"] = round(
                    (res["rss_mb"] - zero) * 1024 / res["triggers"], 2
                )


def markdown_table(results: Mapping[str, Any]) -> str:
    """Return the figures as a Markdown table: one row per figure, one column per scheduler."""

    def cell(name: str, kind: str, *path: str, unit: str = "") -> str:
        value: Any = results.get(name, {}).get(kind)
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        return "—" if value is None else f"{value}{unit}"

    def lag(name: str, kind: str) -> str:
        p50, p99 = cell(name, kind, "lag", "p50_ms"), cell(name, kind, "lag", "p99_ms")
        return "—" if p50 == "—" else f"{p50} / {p99} ms"

    rows = [
        ("spread 1k every 10 s: real start lag p50 / p99", lambda k: lag("spread-1k", k)),
        ("spread 1k: CPU per fire", lambda k: cell("spread-1k", k, "cpu_ms_per_fire", unit=" ms")),
        ("spread 10k every 60 s: real start lag p50 / p99", lambda k: lag("spread-10k", k)),
        (
            "spread 10k: CPU per fire",
            lambda k: cell("spread-10k", k, "cpu_ms_per_fire", unit=" ms"),
        ),
        ("spread 10k: share of a core", lambda k: cell("spread-10k", k, "cpu_share_of_core")),
        ("burst 1k: real start lag p50 / p99", lambda k: lag("burst-1k", k)),
        ("burst 10k: real start lag p50 / p99", lambda k: lag("burst-10k", k)),
        (
            "bursts: largest startedAt - scheduledAt in the records (1k / 10k)",
            lambda k: (
                "—"
                if k != "anyrtd"
                else f"{cell('burst-1k', k, 'records', 'largest_claimed_lag_ms')} / "
                f"{cell('burst-10k', k, 'records', 'largest_claimed_lag_ms')} ms"
            ),
        ),
        (
            "bursts: until every run is recorded on the server (1k / 10k)",
            lambda k: (
                "—"
                if k != "anyrtd"
                else f"{cell('burst-1k', k, 'records', 'all_recorded_s')} / "
                f"{cell('burst-10k', k, 'records', 'all_recorded_s')} s"
            ),
        ),
    ]
    for size in ("0", "1k", "10k", "100k"):
        rows.append(
            (
                f"idle CPU, {size} triggers",
                lambda k, s=size: cell(f"idle-{s}", k, "idle_cpu_ms_per_s", unit=" ms/s"),
            )
        )
    for size in ("0", "1k", "10k", "100k"):
        rows.append(
            (
                f"idle CPU with the full re-read spread over its period, {size} triggers",
                lambda k, s=size: cell(
                    f"idle-{s}", k, "idle_cpu_ms_per_s_with_full_read", unit=" ms/s"
                ),
            )
        )
    for size in ("1k", "10k", "100k"):
        rows.append(
            (
                f"memory per trigger at {size} (RSS above idle-0)",
                lambda k, s=size: cell(f"idle-{s}", k, "kb_per_trigger_above_idle_0", unit=" KB"),
            )
        )
    rows.append(
        (
            "restart from a mirror of 100k: open / start",
            lambda k: (
                "—"
                if k != "anyrtd"
                else f"{cell('idle-100k', k, 'restart', 'open_s')} / "
                f"{cell('idle-100k', k, 'restart', 'start_s')} s"
            ),
        )
    )
    lines = ["| figure | " + " | ".join(SCHEDULERS) + " |", "| --- |" + " ---: |" * len(SCHEDULERS)]
    lines += [f"| {title} | " + " | ".join(fn(k) for k in SCHEDULERS) + " |" for title, fn in rows]
    if results.get("quick"):
        lines.append("\n(a --quick run: the sizes are smaller than the scenarios' names say)")
    return "\n".join(lines)


def budget_s(sc: Scenario) -> float:
    """Return how long one scheduler's run of `sc` may take before it counts as failed."""
    if sc.kind == "spread":
        return 3 * sc.every_s + sc.window_s + 180.0
    return 900.0 if sc.kind == "burst" else 1500.0


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def main(args: argparse.Namespace) -> dict[str, Any]:
    table = scenarios(args.quick)
    chosen = args.scenario or list(table)
    unknown = [name for name in chosen if name not in table]
    if unknown:
        raise SystemExit(f"unknown scenario {unknown[0]!r}: expected one of {', '.join(table)}")
    kinds = args.scheduler or list(SCHEDULERS)
    results: dict[str, Any] = {
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "quick": args.quick,
    }
    settle_s = 2.0 if args.quick else 12.0
    under = Under(
        anyrtd=args.anyrtd_log, aps_info=args.aps_log_info, timer=args.timer_log, tree=args.anyrtd
    )
    results["logs"] = {"anyrtd": under.anyrtd, "aps": "INFO" if under.aps_info else "unconfigured"}
    results["anyrtd_tree"] = str(under.tree or REPO)
    keep = contextlib.nullcontext(str(args.work)) if args.work else None
    with keep or tempfile.TemporaryDirectory(prefix="bench-fire-") as tmp:
        for name in chosen:
            sc = table[name]
            results[name] = {}
            for kind in sc.schedulers:
                if kind not in kinds:
                    continue
                where = Path(tmp) / f"{name}-{kind}"
                where.mkdir()
                before = load()
                try:
                    async with asyncio.timeout(budget_s(sc)):
                        if sc.kind == "spread":
                            res = await run_spread(sc, kind, where, args.py_spy, under)
                        elif sc.kind == "burst":
                            res = await run_burst(sc, kind, where, args.py_spy, under)
                        else:
                            res = await run_idle(sc, kind, where, settle_s, args.py_spy, under)
                except (TimeoutError, RuntimeError) as exc:
                    what = str(exc) or f"no result within {budget_s(sc):.0f} s"
                    res = {"error": f"{exc.__class__.__name__}: {what}"}
                res["load_before_after"] = f"{before} / {load()}"
                results[name][kind] = res
                print(name, kind, json.dumps(res), flush=True)
    per_trigger(results)
    print(markdown_table(results), flush=True)
    return results


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_fire", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument(
        "--scenario", action="append", help="run only this scenario (repeatable); default all"
    )
    parser.add_argument(
        "--scheduler",
        action="append",
        choices=SCHEDULERS,
        help="measure only this scheduler (repeatable); default all",
    )
    parser.add_argument(
        "--anyrtd-log",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="anyrtd's log level (default INFO, as `anyrtd serve` logs)",
    )
    parser.add_argument(
        "--aps-log-info",
        action="store_true",
        help="log APScheduler at INFO to a file (default: logging unconfigured, as users run it)",
    )
    parser.add_argument(
        "--timer-log",
        action="store_true",
        help="log anyrtd's timer at DEBUG: each batch's prepare and start times (with --work)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="an empty folder for the children's state and logs, kept (default: a temporary one)",
    )
    parser.add_argument(
        "--anyrtd",
        type=Path,
        metavar="TREE",
        help="run the daemon of this anyrtd tree (a checkout) with this bench's child and "
        "devserver, to measure two trees alike (default: this one)",
    )
    parser.add_argument("--json", type=Path, help="write the results to this file")
    parser.add_argument(
        "--py-spy",
        type=Path,
        help="profile anyrtd with py-spy into this folder (a burst, a spread or an idle window)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        print(markdown_table(json.loads(Path(sys.argv[2]).read_text())))
        sys.exit(0)
    ns = parse()
    out = asyncio.run(main(ns))
    if ns.json:
        ns.json.write_text(json.dumps(out, indent=2) + "\n")
