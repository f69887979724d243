"""The control API on a small fake of the daemon's port (`anyrtd.port.Port`), no daemon at all.

The routes turn the port's facts into the seeds' JSON and its commands into write-through
and run-now calls; a fake shows what they ask for and what they send. The same routes run
on a real daemon in tests/test_control.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from support import SEED_KEYS

from anyrtd.client import ServerUnavailable
from anyrtd.clock import Slice
from anyrtd.control import views
from anyrtd.control.api import make_app
from anyrtd.history import RunHistory
from anyrtd.metrics import Stats
from anyrtd.missed import Scene, Watched, missed_of
from anyrtd.model import Malformed, TriggerDef, parse_record
from anyrtd.port import Health, Metrics, MissedFacts, Port, TriggerFacts, Triggers
from anyrtd.registry import Entry, new_row
from anyrtd.rows import RunRow
from anyrtd.vocab import HistorySource, RunStatus, Verdict
from anyrtd.why import Answer, WhyFacts, explain

NOW = 1_800_000_000.0
ME = "peer-here"


class FakePort:
    """Records in a dict, entries for those owned here, runs in a list; notes each command."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.entries: dict[str, Entry] = {}
        self.run_rows: list[RunRow] = []
        self.writes: list[tuple[str, dict[str, Any], list[str]]] = []
        self.started: list[str] = []
        self.runs_asked: list[tuple[str | None, str | None, int]] = []
        self.server_away = False
        self.stats = Stats()
        self.last_tick_age: float | None = 0.5
        self.given_way: list[int] = []
        self.frozen = True

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "frozen", False):
            raise AssertionError(f"the control API set the port's attribute {name}")
        super().__setattr__(name, value)

    def put(self, rid: str, *, adopt: bool = False, **fields: Any) -> None:
        record = {"id": rid, "_v": 1, "name": rid, "owner": ME, "enabled": True, **fields}
        self.records[rid] = record
        parsed = parse_record(dict(record))
        if adopt and isinstance(parsed, TriggerDef):
            self.entries[rid] = Entry(parsed, new_row(parsed, NOW, claimed=False))

    def _parsed(self) -> dict[str, TriggerDef | Malformed]:
        return {rid: parse_record(dict(r)) for rid, r in self.records.items()}

    # the port

    @property
    def peer_id(self) -> str | None:
        return ME

    def triggers(self) -> Triggers:
        return Triggers(self.entries, self._parsed(), self.records.get, ME, NOW)

    def trigger(self, trigger_id: str) -> TriggerFacts | None:
        parsed = self._parsed().get(trigger_id)
        entry = self.entries.get(trigger_id)
        if parsed is None and entry is None:
            return None
        raw = None if isinstance(parsed, TriggerDef) else self.records.get(trigger_id)
        return TriggerFacts(trigger_id, entry, parsed, raw, ME, NOW)

    async def runs(
        self, *, trigger_id: str | None = None, status: str | None = None, limit: int = 50
    ) -> Sequence[RunRow]:
        self.runs_asked.append((trigger_id, status, limit))
        rows = [
            r
            for r in self.run_rows
            if (trigger_id is None or r.trigger_id == trigger_id)
            and (status is None or r.status == status)
        ]
        return rows[:limit]

    async def trigger_runs(
        self, trigger_id: str, /, *, status: str | None = None, limit: int = 20
    ) -> RunHistory:
        rows = await self.runs(trigger_id=trigger_id, status=status, limit=limit)
        source = HistorySource.MIRROR if self.server_away else HistorySource.SERVER
        return RunHistory(rows, source)

    async def why(self, trigger_id: str) -> Answer:
        facts = self.trigger(trigger_id)
        parsed, entry = (facts.parsed, facts.entry) if facts is not None else (None, None)
        return explain(WhyFacts(trigger_id, NOW, ME, Verdict.ACTIVE, parsed, entry))

    async def run(self, run_id: str) -> RunRow | None:
        return next((r for r in self.run_rows if r.run_id == run_id), None)

    async def missed(self, trigger_id: str) -> MissedFacts:
        parsed = self._parsed().get(trigger_id)
        if not isinstance(parsed, TriggerDef):
            return MissedFacts(trigger_id, None, 60.0, 86400.0, NOW)
        # Pinned to a device that recorded nothing: every occurrence of the last day missed.
        watched = Watched(parsed, NOW - 86400.0)
        scene = Scene(now=NOW, grace_s=60.0, peer_id="someone-else", devices=None)
        return MissedFacts(trigger_id, missed_of(watched, scene, {}), 60.0, 86400.0, NOW)

    async def give_way(self) -> None:
        self.given_way.append(1)
        await asyncio.sleep(0)

    def health(self) -> Health:
        return Health(
            now=NOW,
            last_tick_at=NOW - 1,
            last_tick_age=self.last_tick_age,
            tick_s=5.0,
            peer_id=ME,
            verdict="active",
            triggers=len(self.entries),
            server_resolved=True,
            last_error=None,
        )

    async def metrics(self) -> Metrics:
        return Metrics(
            stats=self.stats, outbox_depth=7, verdict="standby", last_tick_age=2.0, peer_id=ME
        )

    def election(self) -> dict[str, Any]:
        return {"app": "bao", "enabled": True, "active": True, "peerId": ME, "winner": ME}

    async def write_through(
        self, trigger_id: str, fields: Mapping[str, Any], unset: Iterable[str] = ()
    ) -> TriggerDef | None:
        if self.server_away:
            raise ServerUnavailable("connection refused")
        unset = list(unset)
        self.writes.append((trigger_id, dict(fields), unset))
        record = {k: v for k, v in self.records[trigger_id].items() if k not in unset}
        self.records[trigger_id] = {**record, **fields, "_v": record["_v"] + 1}
        parsed = parse_record(dict(self.records[trigger_id]))
        return parsed if isinstance(parsed, TriggerDef) else None

    async def run_now(self, trigger_id: str) -> str | None:
        self.started.append(trigger_id)
        return f"run-{len(self.started)}"


def test_the_fake_is_a_port() -> None:
    port: Port = FakePort()  # mypy checks the protocol; this checks it at run time too
    assert callable(port.write_through) and callable(port.run_now)


@pytest.fixture
def port() -> FakePort:
    fake = FakePort()
    fake.put("daily", adopt=True, kind="cron", spec={"cron": "0 9 * * *"}, program="x:y@v1")
    fake.put("elsewhere", kind="cron", spec={"cron": "0 9 * * *"}, program="x:y@v1", owner="o")
    fake.put("broken", kind="cron", spec={"cron": "61 * * * *"}, program=7)
    fake.put(
        "tripped",
        adopt=True,
        kind="cron",
        spec={"cron": "0 9 * * *"},
        program="x:y@v1",
        lastStatus="auto_disabled",
        consecutiveFailures=3,
        enabled=False,
    )
    fake.run_rows.extend(
        [
            RunRow("r1", "daily", "x:y@v1", ME, NOW - 60, NOW - 60, status=RunStatus.OK),
            RunRow("r2", "daily", "x:y@v1", ME, NOW - 30, NOW - 30, status=RunStatus.FAILED),
        ]
    )
    return fake


@pytest.fixture
async def http(port: FakePort, aiohttp_client: Any) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = await aiohttp_client(make_app(port))
    return client


async def test_the_list_shows_the_entries_and_with_all_every_record(
    http: TestClient[Any, Any],
) -> None:
    listed = await (await http.get("/triggers")).json()
    assert [t["id"] for t in listed] == ["daily", "tripped"]
    assert set(listed[0]) >= SEED_KEYS
    everything = await (await http.get("/triggers?all=true")).json()
    states = {t["id"]: t["state"] for t in everything}
    assert states == {
        "broken": "malformed",
        "daily": "idle",
        "elsewhere": "pinned_elsewhere",
        "tripped": "auto_disabled",
    }


async def test_a_long_list_gives_way_once_its_slice_of_the_loop_is_spent(
    http: TestClient[Any, Any], port: FakePort, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Building 10,000 views of records not seen before held the loop (and a start) for
    # 0.23 s: past its slice, the list lets a start due soon and the loop's other work go.
    whole = await (await http.get("/triggers?all=true")).json()
    assert port.given_way == []  # four views: well within a slice
    monkeypatch.setattr(views, "Slice", lambda: Slice(0.0))  # every slice spent at once
    listed = await (await http.get("/triggers?all=true")).json()
    assert listed == whole and len(port.given_way) == len(whole)


async def test_an_unknown_trigger_is_404_and_asks_the_port_nothing_else(
    http: TestClient[Any, Any], port: FakePort
) -> None:
    for method, path in (("GET", "/triggers/nope"), ("POST", "/triggers/nope/disable")):
        resp = await http.request(method, path)
        assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"
    assert port.writes == [] and port.started == []


async def test_disable_writes_through_and_answers_with_the_written_view(
    http: TestClient[Any, Any], port: FakePort
) -> None:
    resp = await http.patch("/triggers/daily", json={"enabled": False})
    assert resp.status == 200
    assert port.writes == [("daily", {"enabled": False}, [])]
    assert (await resp.json())["version"] == 2


async def test_enable_resets_the_breaker_and_clears_the_trip(
    http: TestClient[Any, Any], port: FakePort
) -> None:
    resp = await http.post("/triggers/tripped/enable")
    assert resp.status == 200
    written = {"enabled": True, "consecutiveFailures": 0, "lastStatus": "error"}
    assert port.writes == [("tripped", written, [])]
    assert (await resp.json())["lastStatus"] == "error"


async def test_a_refused_spec_sends_no_write(http: TestClient[Any, Any], port: FakePort) -> None:
    resp = await http.patch("/triggers/daily", json={"spec": {"cron": "61 * * * *"}})
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_spec"
    assert port.writes == []


async def test_a_write_the_server_does_not_take_is_503(
    http: TestClient[Any, Any], port: FakePort
) -> None:
    object.__setattr__(port, "server_away", True)
    resp = await http.post("/triggers/daily/disable")
    assert resp.status == 503
    assert (await resp.json())["error"]["code"] == "server_unavailable"
    assert port.records["daily"]["enabled"] is True


async def test_run_now_starts_an_entry_and_refuses_a_record_held_elsewhere(
    http: TestClient[Any, Any], port: FakePort
) -> None:
    resp = await http.post("/triggers/daily/run")
    assert resp.status == 202
    assert await resp.json() == {"runId": "run-1", "triggerId": "daily", "status": "running"}
    resp = await http.post("/triggers/elsewhere/run")
    body = await resp.json()
    assert resp.status == 409 and body["error"]["code"] == "not_adopted"
    assert f"anyrtd triggers pin elsewhere {ME}" in body["error"]["message"]
    assert port.started == ["daily"]


async def test_runs_pass_their_filters_to_the_port_and_refuse_bad_ones(
    http: TestClient[Any, Any], port: FakePort
) -> None:
    rows = await (await http.get("/runs?trigger=daily&status=FAILED&limit=5")).json()
    assert [r["runId"] for r in rows] == ["r2"]
    assert (await http.get("/runs?status=bogus")).status == 400
    assert (await http.get("/runs?limit=0")).status == 400
    assert [r["runId"] for r in await (await http.get("/triggers/daily/runs")).json()] == [
        "r1",
        "r2",
    ]
    assert port.runs_asked == [("daily", "FAILED", 5), ("daily", None, 20)]
    assert (await http.get("/runs/r1")).status == 200
    assert (await http.get("/runs/nope")).status == 404


async def test_runs_say_whether_the_server_or_this_devices_mirror_answered(
    http: TestClient[Any, Any], port: FakePort
) -> None:
    resp = await http.get("/triggers/daily/runs")
    assert resp.headers["X-Anyrtd-Source"] == "server"
    assert (await http.get("/runs?trigger=daily")).headers["X-Anyrtd-Source"] == "server"
    assert (await http.get("/runs")).headers["X-Anyrtd-Source"] == "mirror"
    object.__setattr__(port, "server_away", True)
    resp = await http.get("/triggers/daily/runs")
    assert resp.headers["X-Anyrtd-Source"] == "mirror"
    assert [r["runId"] for r in await resp.json()] == ["r1", "r2"]


async def test_patch_refuses_a_standing_built_ins_spec_and_takes_its_enabled(
    http: TestClient[Any, Any], port: FakePort
) -> None:
    port.put("rollup", kind="cron", spec={"cron": "0 8 * * *"}, program="agent:rollup@v1")
    resp = await http.patch("/triggers/rollup", json={"spec": {"cron": "* * * * *"}})
    body = await resp.json()
    assert resp.status == 409 and body["error"]["code"] == "code_owned"
    assert "only enabled can change" in body["error"]["message"]
    assert port.writes == []
    resp = await http.patch("/triggers/rollup", json={"enabled": False})
    assert resp.status == 200
    assert port.writes == [("rollup", {"enabled": False}, [])]


async def test_health_turns_stale_past_three_ticks_or_thirty_seconds(
    http: TestClient[Any, Any], port: FakePort
) -> None:
    resp = await http.get("/healthz")
    body = await resp.json()
    assert resp.status == 200 and body["status"] == "ok" and body["triggers"] == 2
    object.__setattr__(port, "last_tick_age", 31.0)
    resp = await http.get("/healthz")
    assert resp.status == 503 and (await resp.json())["status"] == "stale"


async def test_metrics_and_election_come_from_the_port(http: TestClient[Any, Any]) -> None:
    text = await (await http.get("/metrics")).text()
    assert "anyrtd_outbox_depth 7" in text
    assert 'anyrtd_election_verdict{verdict="standby"} 1' in text
    assert 'anyrtd_triggers{state="auto_disabled"} 1' in text
    assert (await (await http.get("/election")).json())["winner"] == ME


async def test_why_answers_for_any_id_from_the_port(http: TestClient[Any, Any]) -> None:
    causes = {}
    for rid in ("daily", "elsewhere", "broken", "tripped", "nope"):
        resp = await http.get(f"/triggers/{rid}/why")
        assert resp.status == 200
        body = await resp.json()
        assert body["id"] == rid
        causes[rid] = [r["cause"] for r in body["reasons"] if r["blocking"]]
    assert causes == {
        "daily": ["no_next_fire"],  # the fake never arms its entries
        "elsewhere": ["pinned_elsewhere"],
        "broken": ["malformed"],
        "tripped": ["auto_disabled"],
        "nope": ["unknown"],
    }


async def test_missed_answers_from_the_port_for_a_known_trigger(
    http: TestClient[Any, Any],
) -> None:
    resp = await http.get("/triggers/daily/missed")
    assert resp.status == 200
    body = await resp.json()
    assert body["id"] == "daily" and body["count"] == 1 and body["graceS"] == 60.0
    (newest,) = body["occurrences"]
    assert newest["cause"] == "owner_not_running" and newest["fix"].startswith("start anyrtd")
    assert (await http.get("/triggers/nope/missed")).status == 404
