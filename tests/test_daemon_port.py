"""The daemon's port is a class of its own, and a trigger's "why" is gathered through it alone."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from anyrtd.client import DeviceRow, DevicesView
from anyrtd.config import Config
from anyrtd.daemon import Daemon
from anyrtd.daemon_port import DaemonPort
from anyrtd.missed import Missed
from anyrtd.model import TriggerDef, parse_record
from anyrtd.port import Port, TriggerFacts
from anyrtd.registry import Entry, new_row
from anyrtd.rows import RunRow
from anyrtd.vocab import RunStatus, Verdict
from anyrtd.why_facts import Claiming, gather

NOW = 1_800_000_000.0
ME = "12D3KooWme"
OTHER = "12D3KooWother"

PORT_MEMBERS = sorted(
    name for name in dir(Port) if not name.startswith("_") and name not in dir(object)
)


def definition() -> TriggerDef:
    parsed = parse_record(
        {
            "id": "t1",
            "name": "t1",
            "kind": "cron",
            "spec": {"cron": "0 8 * * *"},
            "program": "test:gone@v1",
            "owner": ME,
            "enabled": True,
            "_v": 1,
        }
    )
    assert isinstance(parsed, TriggerDef), parsed
    return parsed


class Facts:
    """The port's queries that a "why" reads, and nothing of the stages behind them."""

    peer_id = ME

    def __init__(self) -> None:
        defn = definition()
        self.entry = Entry(defn, new_row(defn, NOW - 60, claimed=False))
        self.entry.row.next_fire = NOW + 3600
        self.defn = defn

    def now(self) -> float:
        return NOW

    def verdict(self) -> str:
        return Verdict.ACTIVE

    def trigger(self, trigger_id: str) -> TriggerFacts | None:
        if trigger_id != "t1":
            return None
        return TriggerFacts("t1", self.entry, self.defn, None, ME, NOW)

    async def runs(
        self, *, trigger_id: str | None = None, status: str | None = None, limit: int = 50
    ) -> Sequence[RunRow]:
        failed = RunRow("r2", "t1", "test:gone@v1", ME, NOW - 10, NOW - 10, RunStatus.FAILED)
        ok = RunRow("r1", "t1", "test:gone@v1", ME, NOW - 20, NOW - 20, RunStatus.OK)
        return [r for r in (failed, ok) if trigger_id in (None, r.trigger_id)][:limit]

    async def devices(self) -> DevicesView | None:
        rows = [DeviceRow(ME, "desk", "linux", {}), DeviceRow(OTHER, "old", "linux", {}, True)]
        return DevicesView(self_id=ME, active={"anyrtd": ME}, devices=rows)

    def election(self) -> dict[str, Any]:
        return {"verdict": Verdict.ACTIVE, "winner": ME}

    def claiming(self, now: float) -> Claiming:
        return Claiming(False, f"term 4 ({OTHER})", now - 5, 30.0)

    def tombstoned(self, trigger_id: str) -> bool:
        return False

    def installed(self, program: str) -> bool:
        return program != "test:gone@v1"

    def overlap_skips(self, trigger_id: str) -> int:
        return 2

    def chain_loop(self, trigger_id: str) -> Sequence[str] | None:
        return None

    def missed_of(self, trigger_id: str, now: float, scheduled: Sequence[float]) -> Missed | None:
        return None


async def test_a_triggers_why_is_gathered_through_the_port_alone() -> None:
    facts = await gather(Facts(), "t1")
    assert (facts.now, facts.peer_id, facts.verdict) == (NOW, ME, Verdict.ACTIVE)
    assert facts.entry is not None and facts.entry.id == "t1"
    assert facts.devices == {ME: "live", OTHER: "pruned"}
    assert facts.names == {ME: "desk", OTHER: "old"}
    assert facts.winner == ME
    assert facts.hold == {"waitingFor": f"term 4 ({OTHER})", "since": NOW - 5, "maxS": 30.0}
    assert not facts.may_claim and not facts.installed and not facts.tombstoned
    assert [f.run_id for f in facts.failures] == ["r2"]
    assert facts.overlap_skips == 2
    assert facts.next_fires[0] == NOW + 3600


async def test_a_trigger_the_port_does_not_know_is_gathered_as_unknown() -> None:
    facts = await gather(Facts(), "nope")
    assert (facts.entry, facts.parsed, facts.failures, facts.next_fires) == (None, None, [], [])


async def test_the_daemons_port_is_a_class_of_its_own(tmp_path: Path) -> None:
    daemon = Daemon(Config(server="http://127.0.0.1:9", state_dir=tmp_path / "state"))
    try:
        assert PORT_MEMBERS, "the Port protocol names its members"
        # What the daemon keeps: its peer id (its loops read it), the write-through step and
        # giving way to its loops (the timer's next start).
        kept = {"peer_id", "write_through", "give_way"}
        assert [m for m in PORT_MEMBERS if hasattr(Daemon, m) and m not in kept] == []
        assert isinstance(daemon.port, DaemonPort)
        assert [m for m in PORT_MEMBERS if not hasattr(daemon.port, m)] == []
        assert daemon.port.peer_id is None and daemon.port.trigger("t1") is None
        assert daemon.port.verdict() == daemon.gate.verdict == Verdict.ACTIVE
        assert daemon.port.claiming(NOW) == Claiming(may_claim=True)
    finally:
        await daemon.client.aclose()
