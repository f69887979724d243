"""Chains, the pure part: a chain's filter parsed and matched, the cycle check, the run id
a chain makes for an upstream run (anyrtd/chain.py, docs/events.md)."""

from __future__ import annotations

from typing import Any

import pytest

from anyrtd.chain import (
    CHAIN_DEPTH_LIMIT,
    RunFilter,
    UpstreamRun,
    chained_run_id,
    cycles,
    describe,
    find_cycle,
    matches,
    parse_filter,
    upstream_run,
)
from anyrtd.model import Malformed, chain_of, health_marker, marker_reason, parse_record, spec_error
from anyrtd.vocab import Marker


def run(
    trigger: str = "backup", status: str = "ok", device: str = "nas", depth: int = 0
) -> UpstreamRun:
    return UpstreamRun("r1", trigger, status, device, 1.0, 2.0, depth, "r1")


def f(raw: Any) -> RunFilter:
    got = parse_filter(raw)
    assert isinstance(got, RunFilter), got
    return got


MATCH_TABLE = [
    # filter, the upstream run, fires?
    ({"triggerId": "backup"}, run(), True),
    ({"triggerId": "backup"}, run(status="FAILED"), False),  # default status: ok
    ({"triggerId": "backup"}, run(trigger="other"), False),
    ({"triggerId": ["a", "backup"]}, run(), True),
    ({"triggerId": "backup", "status": "failed"}, run(status="FAILED"), True),  # any case
    ({"triggerId": "backup", "status": "FAILED"}, run(), False),
    ({"triggerId": "backup", "status": ["ok", "incomplete"]}, run(status="incomplete"), True),
    ({"triggerId": "backup", "status": "any"}, run(status="interrupted"), True),
    ({"triggerId": "backup", "status": "any"}, run(status="FAILED"), True),
    ({"triggerId": "backup", "device": "nas"}, run(), True),
    ({"triggerId": "backup", "device": "laptop"}, run(), False),
    ({"status": "failed"}, run(status="FAILED"), True),  # any trigger's failure
    ({"status": "failed"}, run(status="FAILED", depth=1), False),  # but no chain's run
    ({"triggerId": "backup"}, run(depth=3), True),  # named: a chain's run too
    (None, run(), True),  # no filter: every ok run no chain started
    ({}, run(status="FAILED"), False),
]


@pytest.mark.parametrize(("raw", "upstream", "fires"), MATCH_TABLE)
def test_a_filter_takes_exactly_the_runs_it_names(
    raw: Any, upstream: UpstreamRun, fires: bool
) -> None:
    assert matches(f(raw), upstream) is fires


REFUSED = [
    ("not an object", "filter must be an object"),
    ({"trigger": "x"}, "filter key 'trigger' is not one of triggerId, status, device"),
    ({"triggerId": ""}, "filter.triggerId must hold non-empty strings"),
    ({"triggerId": []}, "filter.triggerId must be a string or a non-empty list"),
    ({"triggerId": [1]}, "filter.triggerId must hold non-empty strings"),
    ({"status": "done"}, "filter.status 'done' is not a status a run ends with"),
    ({"status": "running"}, "is not a status a run ends with"),
    ({"status": ["any", "ok"]}, '"any" takes every status: give it alone'),
    ({"device": ""}, "filter.device must be a peer id"),
]


@pytest.mark.parametrize(("raw", "says"), REFUSED)
def test_a_bad_filter_is_refused_with_what_is_wrong(raw: Any, says: str) -> None:
    got = parse_filter(raw)
    assert isinstance(got, str)
    assert says in got


def test_a_chain_spec_is_supported_and_a_bad_one_is_invalid_spec() -> None:
    good = {"dataset": "agent_runs", "filter": {"triggerId": "backup"}}
    assert spec_error("event", good) is None
    defn = parse_record({"id": "report", "kind": "event", "program": "p", "spec": good})
    assert not isinstance(defn, Malformed)
    assert health_marker(defn) is None
    assert chain_of(defn) == RunFilter(frozenset({"backup"}), frozenset({"ok"}))
    # the collection name works as the short one does
    long = {"dataset": "agent_trigger_agent_runs", "filter": {"triggerId": "backup"}}
    assert spec_error("event", long) is None
    bad = {"dataset": "agent_runs", "filter": {"status": "done"}}
    assert "filter.status 'done'" in (spec_error("event", bad) or "")
    defn = parse_record({"id": "report", "kind": "event", "program": "p", "spec": bad})
    assert not isinstance(defn, Malformed)
    assert health_marker(defn) == Marker.INVALID_SPEC
    assert "chain spec refused" in (marker_reason(defn) or "")
    spaced = {"dataset": "agent_runs", "spaceId": "team"}
    assert "spaceId is not used" in (spec_error("event", spaced) or "")


def test_other_datasets_stay_unsupported_and_chat_stays_as_it_is() -> None:
    assert "not supported" in (spec_error("event", {"dataset": "notes", "objectId": "o"}) or "")
    chat = {"dataset": "chat_messages", "objectId": "c", "filter": {"anything": 1}}
    assert spec_error("event", chat) is None  # a chat's filter stays reserved: ignored
    defn = parse_record({"id": "c", "kind": "event", "program": "p", "spec": chat})
    assert not isinstance(defn, Malformed) and chain_of(defn) is None


def chains(**edges: list[str]) -> dict[str, RunFilter]:
    return {cid: RunFilter(frozenset(ups), None) for cid, ups in edges.items()}


CYCLE_TABLE = [
    # chains (id -> the upstream ids it names), the chain asked about, the loop found
    (chains(a=["a"]), "a", ["a", "a"]),
    (chains(a=["b"]), "a", None),
    (chains(a=["b"], b=["a"]), "a", ["a", "b", "a"]),
    (chains(a=["c"], b=["a"], c=["b"]), "a", ["a", "b", "c", "a"]),
    (chains(a=["x"], b=["a"], c=["b"]), "a", None),  # a line, not a loop
    (chains(a=["x"], b=["a", "c"], c=["b"]), "a", None),  # a loop that a is not on
    (chains(a=["x"], b=["a", "c"], c=["b"]), "b", ["b", "c", "b"]),
    (chains(a=["x", "d"], b=["a"], c=["a"], d=["c"]), "a", ["a", "c", "d", "a"]),
]


@pytest.mark.parametrize(("graph", "start", "loop"), CYCLE_TABLE)
def test_the_cycle_check_names_the_loop_through_a_chain(
    graph: dict[str, RunFilter], start: str, loop: list[str] | None
) -> None:
    assert find_cycle(graph, start) == loop


def test_a_wildcard_chain_is_never_part_of_a_loop() -> None:
    graph = {"cleanup": RunFilter(None, frozenset({"FAILED"})), **chains(b=["cleanup"])}
    assert cycles(graph) == {}
    assert cycles(chains(a=["b"], b=["a"], c=["a"])) == {"a": ["a", "b", "a"], "b": ["b", "a", "b"]}


def test_a_chained_run_id_is_the_same_everywhere_and_differs_per_pair() -> None:
    one = chained_run_id("report", "r1")
    assert one == chained_run_id("report", "r1")
    assert len(one) == 32 and one != chained_run_id("report", "r2")
    assert one != chained_run_id("other", "r1")


def test_an_upstream_run_is_read_from_its_record_only_once_it_ended() -> None:
    record = {
        "runId": "r1",
        "triggerId": "b",
        "status": "ok",
        "device": "nas",
        "startedAt": 1,
        "endedAt": 2,
    }
    got = upstream_run(record, "r1", seq=7)
    assert got == UpstreamRun("r1", "b", "ok", "nas", 1.0, 2.0, 0, "r1", 7)
    assert upstream_run({**record, "status": "running"}, "r1") is None
    assert upstream_run({**record, "triggerId": None}, "r1") is None
    assert upstream_run({**record, "_deleted": True}, "r1") is None
    deep = upstream_run({**record, "chainDepth": CHAIN_DEPTH_LIMIT}, "r1")
    assert deep is not None and deep.depth == CHAIN_DEPTH_LIMIT
    assert got.payload({"space": "s", "objectId": "o", "dataset": "d"})["ref"] == {
        "space": "s",
        "objectId": "o",
        "dataset": "d",
        "id": "r1",
    }


def test_a_chain_says_when_it_fires() -> None:
    assert describe(f({"triggerId": "nightly-backup"})) == "after each ok run of nightly-backup"
    assert (
        describe(f({"status": "failed"})) == "after each FAILED run of any trigger (no chain's run)"
    )
    assert describe(f({"triggerId": ["a", "b"], "status": "any", "device": "nas"})) == (
        "after each run of a, b on nas"
    )
