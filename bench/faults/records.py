"""10,000 malformed and oversized trigger records written under a running daemon (issue 15
items 6 and 7, and the record cache's every door).

Records of every broken shape (no kind, wrong types, bad crons, huge cron lists, `every_s`
below the floor, impossible `at`, unknown zones, deep nesting, huge strings and
lists) go to the server in batches while two good triggers fire every second and a
thread asks `/healthz` every 50 ms. Promised: no stall of the event loop over 100 ms, as
seen by `/healthz` latency and by the good triggers' fire lag (`startedAt - scheduledAt`),
no occurrence of a good trigger missed, and the daemon still running afterwards.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.faults.common import (
    Result,
    Serve,
    Server,
    Space,
    cron,
    every,
    family_run,
    marker_program,
    percentile,
)

ROUNDS = 10_000
QUICK = 1_000
MARK = "faults:mark@v1"
STALL_LIMIT_MS = 100.0
BATCH = 250
HOLD_S = 10.0  # after the last batch: the daemon digests what it was sent


def shapes(n: int) -> dict[str, Any]:
    """Return the fields of the `n`th broken record (every shape in turn)."""
    k = n % 24
    base: dict[str, Any] = {"kind": "cron", "spec": {"every_s": 60}, "program": MARK, "owner": ""}
    if k == 0:
        return {"spec": {"cron": "* * * * *"}, "program": MARK}  # no kind
    if k == 1:
        return {**base, "kind": 7}
    if k == 2:
        return {**base, "kind": "sometimes"}
    if k == 3:
        return {**base, "program": None}
    if k == 4:
        return {**base, "spec": "* * * * *"}
    if k == 5:
        return {**base, "spec": {"cron": "61 * * * *"}}
    if k == 6:  # valid item by item, far over the size limit
        return {**base, "spec": {"cron": ",".join(["1"] * (2_000 + n % 2_000)) + " * * * *"}}
    if k == 7:
        return {**base, "spec": {"every_s": 0.001}}
    if k == 8:
        return {**base, "spec": {"every_s": 1e-9}}
    if k == 9:
        return {**base, "spec": {"every_s": -5}}
    if k == 10:
        return {**base, "spec": {"every_s": 1e300}}
    if k == 11:
        return {**base, "kind": "once", "spec": {"at": "tomorrow"}}
    if k == 12:
        return {**base, "kind": "once", "spec": {"at": 1e20}}
    if k == 13:
        return {**base, "spec": {"cron": "0 8 * * *", "tz": "Mars/Olympus_Mons"}}
    if k == 14:
        return {**base, "spec": {"cron": "0 8 * * *", "tz": "x" * 5_000}}
    if k == 15:
        nested: Any = 1
        for _ in range(50):  # the devserver refuses bodies deeper than 64 levels
            nested = [nested]
        return {**base, "args": {"deep": nested}}
    if k == 16:
        return {**base, "name": "n" * 20_000}
    if k == 17:
        return {**base, "args": {"items": list(range(5_000))}}
    if k == 18:
        return {**base, "enabled": "yes"}
    if k == 19:
        return {**base, "limits": {"timeoutS": "forever"}}
    if k == 20:
        return {**base, "maxConsecutiveFailures": -3}
    if k == 21:
        return {**base, "spec": {"cron": "*/0 * * * *"}}
    if k == 22:
        return {**base, "spec": {"cron": "0 0 31 2 *"}}  # never: 31 February
    return {**base, "kind": "event", "spec": {"dataset": 12}}


def batches(count: int) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, count, BATCH):
        yield [
            {"id": f"bad-{n:05d}", "fields": shapes(n)}
            for n in range(start, min(count, start + BATCH))
        ]


class Prober(threading.Thread):
    """Ask `/healthz` every 50 ms; keep each answer's latency (a timeout counts its length)."""

    def __init__(self, serve: Serve) -> None:
        super().__init__(daemon=True)
        self.serve = serve
        self.latencies: list[tuple[float, float]] = []  # (when, seconds)
        self.stop = threading.Event()

    def run(self) -> None:
        with self.serve.http(timeout=10) as client:
            while not self.stop.is_set():
                began = time.monotonic()
                with contextlib.suppress(httpx.HTTPError):
                    client.get("/healthz")
                self.latencies.append((time.time(), time.monotonic() - began))
                self.stop.wait(0.05)


def run(work: Path, rounds: int) -> Result:
    result = Result("records")
    tag = f"records-{time.time_ns()}"
    started = work / "started"
    server = Server(work).start()
    serve = Serve(
        work,
        server.url,
        programs={MARK: marker_program(started)},
        env={"ANYRTD_FAULTS_TAG": tag},
        tick=0.5,
    )
    space = Space(server.url)
    prober = Prober(serve)
    sizes: list[int] = []
    with family_run(result, serve, server, tag, first=prober.stop.set):
        space.put({"good1": every(1, MARK), "good-cron": cron("* * * * * *", MARK)})
        serve.start()
        where = space.dataset()
        prober.start()
        calm = time.time()
        time.sleep(5.0)  # a baseline before the barrage, on the same machine under its load
        began = time.time()
        with httpx.Client(base_url=server.url, timeout=120) as http:
            for batch in batches(rounds):
                body = json.dumps(
                    {"objectId": where.object_id, "dataset": where.name, "records": batch}
                )
                sizes.append(len(body))
                resp = http.post(
                    "/v1/spaces/bao/upsert",
                    content=body,
                    headers={"content-type": "application/json"},
                )
                if resp.status_code != 200:
                    raise AssertionError(f"the server refused a batch: {resp.text[:300]}")
        written = time.time()
        time.sleep(HOLD_S)  # the window measured after the barrage
        ended = time.time()
        prober.stop.set()
        prober.join(15)
        serve.check_alive()
        listed = serve.get("/triggers")
        runs = space.runs()
        serve.stop()
    if result.error is not None:
        return result

    window = [(t, s) for t, s in prober.latencies if began <= t <= ended + 10]
    baseline = [s for t, s in prober.latencies if calm <= t < began]
    before = [
        float(r["startedAt"]) - float(r["scheduledAt"])
        for r in runs
        if r.get("triggerId") in ("good1", "good-cron")
        and r.get("scheduledAt") is not None
        and calm <= float(r["scheduledAt"]) < began
    ]
    good = [
        r
        for r in runs
        if r.get("triggerId") in ("good1", "good-cron")
        and r.get("scheduledAt") is not None
        and began <= float(r["scheduledAt"]) <= ended
    ]
    lags = [float(r["startedAt"]) - float(r["scheduledAt"]) for r in good]
    expected = 2 * int(ended - began)
    worst = max((s for _, s in window), default=0.0)
    states: dict[str, int] = {}
    for t in listed if isinstance(listed, list) else []:
        if str(t.get("id", "")).startswith("bad-"):
            reason = t.get("stateReason")  # the marker: `cannot_run (invalid_spec)`
            key = f"{t.get('state')} ({reason})" if reason else str(t.get("state"))
            states[key] = states.get(key, 0) + 1
    result.at_most("longest /healthz answer (ms)", round(worst * 1000), STALL_LIMIT_MS)
    result.at_most("good fire lag max (ms)", round(max(lags, default=0.0) * 1000), STALL_LIMIT_MS)
    result.at_least("good occurrences fired / due", len(good), max(0, expected - 2))
    result.figures.update(
        records=rounds,
        request_bytes_max=max(sizes, default=0),
        request_bytes_total=sum(sizes),
        write_seconds=round(written - began, 1),
        baseline_healthz_max_ms=round(max(baseline, default=0.0) * 1000, 1),
        baseline_lag_max_ms=round(max(before, default=0.0) * 1000, 1),
        baseline_lag_p50_ms=round(percentile(before, 0.5) * 1000, 1),
        healthz_p50_ms=round(percentile([s for _, s in window], 0.5) * 1000, 1),
        healthz_p99_ms=round(percentile([s for _, s in window], 0.99) * 1000, 1),
        healthz_samples=len(window),
        good_lag_p50_ms=round(percentile(lags, 0.5) * 1000, 1),
        good_lag_p99_ms=round(percentile(lags, 0.99) * 1000, 1),
        good_fired=len(good),
        good_due=expected,
        bad_states=states,
    )
    return result
