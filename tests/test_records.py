"""The record cache: server records, this device's overlay on top, and what is kept of them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anyrtd import records
from anyrtd.model import Malformed, TriggerDef, parse_record
from anyrtd.records import RecordCache
from anyrtd.vocab import RollupField


def record(v: int, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "t",
        "kind": "cron",
        "spec": {"cron": "0 8 * * *"},
        "program": "agent:remind@v1",
        "owner": "",
        "_v": v,
    }
    base.update(fields)
    return base


def defn(cache: RecordCache) -> TriggerDef:
    parsed = cache.parsed["t"]
    assert isinstance(parsed, TriggerDef)
    return parsed


def test_an_older_or_equal_version_does_not_replace_a_newer_one() -> None:
    cache = RecordCache()
    assert cache.put(record(2, name="new")) == "t"
    assert cache.put(record(1, name="old")) is None
    assert cache.put(record(2, name="same version")) is None
    assert defn(cache).name == "new"


def test_an_own_write_shows_at_once_and_the_server_view_stays_readable() -> None:
    cache = RecordCache()
    cache.put(record(1))
    cache.write("t", {"owner": "me"})
    assert defn(cache).owner == "me"
    assert cache.raw("t") is not None and cache.raw("t")["owner"] == ""  # type: ignore[index]
    assert cache.pending_owner(["t"]) == {"t"}


def test_a_stale_full_read_cannot_undo_an_unacknowledged_write() -> None:
    cache = RecordCache()
    cache.put(record(1, enabled=True))
    cache.write("t", {"enabled": False, "lastRunAt": 5.0})
    cache.put(record(1, enabled=True))  # a full read before the outbox drained
    assert defn(cache).enabled is False and defn(cache).rollup.last_run_at == 5.0


def test_the_overlay_goes_once_the_server_shows_the_acknowledged_version() -> None:
    cache = RecordCache()
    cache.put(record(1))
    cache.write("t", {"owner": "me"})
    cache.acked("t", 2)
    assert cache.pending_owner(["t"]) == {"t"}  # acknowledged, not yet seen back
    cache.put(record(2, owner="me"))
    assert cache.pending_owner(["t"]) == set()
    assert defn(cache).owner == "me"


def test_another_devices_later_write_wins_once_the_overlay_goes() -> None:
    cache = RecordCache()
    cache.put(record(1))
    cache.write("t", {"owner": "me"})
    cache.put(record(3, owner="other"))  # the other device's stamp landed after ours
    assert defn(cache).owner == "me"  # still laid over: our write is not acknowledged yet
    cache.acked("t", 2)
    assert defn(cache).owner == "other"


def test_an_unset_removes_the_field_from_the_view() -> None:
    cache = RecordCache()
    cache.put(record(1, lastStatus="invalid_spec"))
    cache.write("t", {}, unset=["lastStatus"])
    assert defn(cache).rollup.last_status is None


def test_a_malformed_record_keeps_its_text_for_display() -> None:
    cache = RecordCache()
    cache.put(record(1, kind="weekly"))
    assert isinstance(cache.parsed["t"], Malformed)
    assert cache.raw("t") == record(1, kind="weekly")


def test_a_loaded_record_parses_like_a_put_one() -> None:
    cache = RecordCache()
    cache.load('{"id":"t","kind":"once","spec":{"at":5},"program":"p","_v":4}')
    assert defn(cache).kind == "once" and cache.version("t") == 4


def test_a_page_loaded_at_once_is_what_loading_each_text_gives() -> None:
    texts = [
        '{"id":"a","kind":"once","spec":{"at":5},"program":"p","_v":4}',
        '{"id":"b","kind":"weekly","program":"p","_v":2}',  # malformed: its text is kept
        '{"id":"c","kind":"cron","spec":{"every_s":60},"program":"p","owner":"x"}',
        "[1]",  # not a record: skipped, as `load` skips it
        '{"id":"d","kind":"cron","spec":{"cron":"0 8 * * *"},"program":"p","_v":1}',
    ]
    one, many = RecordCache(), RecordCache()
    for text in texts:
        one.load(text)
    many.load_many(texts)
    assert list(many.ids()) == list(one.ids()) == ["a", "b", "c", "d"]
    for rid in "abcd":
        assert many.parsed[rid] == one.parsed[rid]
        assert many.version(rid) == one.version(rid) and many.raw(rid) == one.raw(rid)


def test_a_page_with_a_text_that_is_not_one_json_value_fails_as_loading_it_alone() -> None:
    good = '{"id":"a","kind":"once","spec":{"at":5},"program":"p","_v":4}'
    for bad in ("1,2", "{"):
        with pytest.raises(ValueError):
            RecordCache().load(bad)
        with pytest.raises(ValueError):
            RecordCache().load_many([good, bad])


def test_a_dropped_record_is_gone_with_its_overlay() -> None:
    cache = RecordCache()
    cache.put(record(1))
    cache.write("t", {"owner": "me"})
    assert cache.drop("t") is True
    assert "t" not in cache and cache.pending_owner(["t"]) == set() and cache.raw("t") is None
    assert cache.drop("t") is False


def test_a_definition_turns_back_into_a_record_that_parses_the_same() -> None:
    cache = RecordCache()
    cache.put(
        record(
            1,
            args={"a": [1, 2]},
            limits={"timeoutS": 3},
            runCount=2,
            lastStatus="ok",
            maxConsecutiveFailures=5,
        )
    )
    again = RecordCache()
    again.put(defn(cache).to_record())
    assert defn(again) == defn(cache)


# A fire's writes (a once's consumption, a run's rollup) take a fast path that lays them over
# the parsed definition: it must give what parsing the whole written record gives.

_ROLLUP_VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-3, max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=8),
    st.just([1]),
)
_RUNTIME_FIELDS = [*RollupField, "enabled"]
_WRITE = st.tuples(
    st.dictionaries(
        st.sampled_from([*_RUNTIME_FIELDS, "name", "args"]), _ROLLUP_VALUES, max_size=4
    ),
    st.lists(st.sampled_from(_RUNTIME_FIELDS), max_size=2),
)


def _same(got: TriggerDef | Malformed, want: TriggerDef | Malformed) -> None:
    if isinstance(want, Malformed):
        assert got == want
        return
    assert isinstance(got, TriggerDef)
    assert got.to_record() == want.to_record()
    assert (got.enabled, got.rollup, got.fingerprint) == (
        want.enabled,
        want.rollup,
        want.fingerprint,
    )
    assert type(got.schedule) is type(want.schedule)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["cron", "once"]),
    start=st.dictionaries(st.sampled_from(_RUNTIME_FIELDS), _ROLLUP_VALUES, max_size=4),
    writes=st.lists(_WRITE, min_size=1, max_size=5),
)
def test_a_fire_write_gives_the_definition_a_full_parse_gives(
    kind: str, start: dict[str, Any], writes: list[tuple[dict[str, Any], list[str]]]
) -> None:
    spec = {"cron": "0 8 * * *"} if kind == "cron" else {"at": 1_900_000_000}
    rec = record(1, kind=kind, spec=spec, **start)
    cache = RecordCache()
    cache.put(copy.deepcopy(rec))
    want = copy.deepcopy(rec)
    for fields, unset in writes:
        cache.write("t", copy.deepcopy(fields), unset)
        want.update(copy.deepcopy(fields))
        for key in unset:
            want.pop(key, None)
        _same(cache.parsed["t"], parse_record(copy.deepcopy(want)))


def test_a_once_consumption_and_a_rollup_write_parse_no_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = RecordCache()
    cache.put(record(1, kind="once", spec={"at": 1_900_000_000}))
    calls: list[object] = []
    monkeypatch.setattr(records, "parse_record", lambda r: calls.append(r) or parse_record(r))
    cache.write("t", {"enabled": False, RollupField.LAST_RUN_AT: 1_900_000_000.5})
    cache.write(
        "t",
        {RollupField.LAST_STATUS: "ok", RollupField.RUN_COUNT: 1, RollupField.LAST_DURATION_MS: 3},
        unset=[RollupField.LAST_RUN_REF],
    )
    assert calls == []
    got = defn(cache)
    assert got.enabled is False
    assert (got.rollup.run_count, got.rollup.last_status) == (1, "ok")
    cache.write("t", {"name": "renamed"})  # a definition field: parsed as a whole
    assert len(calls) == 1
    assert defn(cache).name == "renamed"
    assert defn(cache).enabled is False


# This device's own writes shown back at the version the server gave them take a path that
# parses nothing: the cache must read exactly as when every record shown back is parsed.

_SANE_WRITE = st.tuples(
    st.fixed_dictionaries(
        {},
        optional={
            "enabled": st.booleans(),
            RollupField.LAST_STATUS: st.sampled_from(["ok", "failed"]),
            RollupField.RUN_COUNT: st.integers(min_value=0, max_value=3),
            RollupField.LAST_RUN_AT: st.floats(min_value=0, max_value=2e9),
            "name": st.sampled_from(["a", "b"]),
        },
    ),
    st.lists(st.sampled_from([RollupField.LAST_STATUS, RollupField.RUN_COUNT]), max_size=1),
)
_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["write", "send", "send", "ack", "ack", "show", "show", "foreign"]),
        _SANE_WRITE,
    ),
    min_size=1,
    max_size=30,
)


class _ParsedOverlay(records.Overlay):
    """An overlay that never takes its writes shown back as an echo: each is parsed."""

    __slots__ = ()

    def echoed_by(self, version: int) -> bool:
        return False


@settings(max_examples=600, deadline=None)
@given(events=_EVENTS)
def test_own_writes_shown_back_read_as_a_full_parse_of_the_shown_record(
    events: list[tuple[str, Any]],
) -> None:
    server = record(1, kind="once", spec={"at": 1_900_000_000})
    quick, full = RecordCache(), RecordCache()
    for cache in (quick, full):
        cache.put(copy.deepcopy(server))
    queued: list[tuple[dict[str, Any], list[str]]] = []
    sent: list[tuple[int, int]] = []  # (version, writes in it), oldest first

    def apply(fields: dict[str, Any], unset: list[str]) -> None:
        server.update(copy.deepcopy(fields))
        for key in unset:
            server.pop(key, None)

    for kind, arg in events:
        if kind == "write":
            fields, unset = arg
            queued.append((fields, unset))
            for cache in (quick, full):
                cache.write("t", copy.deepcopy(fields), unset)
        elif kind == "send" and queued:
            for fields, unset in queued:  # the outbox folds them into one write
                apply(fields, unset)
            server["_v"] += 1
            sent.append((server["_v"], len(queued)))
            queued = []
        elif kind == "ack" and sent:
            version, n = sent.pop(0)
            for _ in range(n):
                quick.acked("t", version)
                full.acked("t", version)
        elif kind == "foreign":
            apply(*arg)
            server["_v"] += 1
        elif kind == "show":
            quick.put(copy.deepcopy(server))
            full.put(copy.deepcopy(server))
        if (overlay := full._overlay.get("t")) is not None:
            overlay.__class__ = _ParsedOverlay
        _same(quick.parsed["t"], full.parsed["t"])
        assert quick.version("t") == full.version("t")
        assert getattr(quick.parsed["t"], "version", None) == getattr(
            full.parsed["t"], "version", None
        )


def test_a_write_the_server_took_is_not_laid_over_another_device_s_later_write() -> None:
    """Hypothesis's case: this device's write, taken at v2, stayed in the overlay under a new
    write; another device set the field at v3. Shown v3, the cache must read v3's value,
    and keep it when its own v4 comes back as an echo."""
    cache = RecordCache()
    cache.put(record(1, kind="once", spec={"at": 1_900_000_000}))
    cache.write("t", {}, unset=[RollupField.LAST_STATUS])
    cache.acked("t", 2)
    cache.write("t", {RollupField.RUN_COUNT: 1})  # not sent yet
    v3 = record(3, kind="once", spec={"at": 1_900_000_000}, lastStatus="ok")
    cache.put(v3)
    assert defn(cache).rollup.last_status == "ok"
    assert defn(cache).rollup.run_count == 1  # the write not taken yet stays laid over
    cache.acked("t", 4)
    cache.put({**v3, "_v": 4, "runCount": 1})  # its own write shown back
    assert defn(cache) == parse_record({**v3, "_v": 4, "runCount": 1})


def test_an_acknowledged_write_shown_back_is_not_parsed_again_unless_another_write_came_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[object] = []
    monkeypatch.setattr(records, "parse_record", lambda r: calls.append(r) or parse_record(r))
    cache = RecordCache()
    cache.put(record(1))
    cache.write("t", {RollupField.LAST_STATUS: "ok", RollupField.RUN_COUNT: 1})
    cache.acked("t", 2)
    calls.clear()
    cache.put(record(2, lastStatus="ok", runCount=1))
    assert calls == [] and defn(cache).version == 2
    assert defn(cache) == parse_record(record(2, lastStatus="ok", runCount=1))
    assert cache.echo("t") is False  # nothing of this device's is on it any more

    cache.write("t", {RollupField.RUN_COUNT: 2})
    assert cache.echo("t") is True
    cache.acked("t", 4)  # version 3 was another device's write
    cache.put(record(4, lastStatus="ok", runCount=2, name="renamed"))
    assert len(calls) == 1 and defn(cache).name == "renamed"


def test_an_acknowledgement_not_above_the_version_written_on_says_the_versions_went_back() -> None:
    cache = RecordCache()
    cache.put(record(22, enabled=True))
    cache.write("t", {"enabled": False})
    assert cache.acked("t", 7)  # a server restored from a backup took the write at 7
    assert defn(cache).enabled is False  # not let go of: 22 >= 7 says nothing any more
    assert cache.is_stale("t") and cache.stale == 1
    assert cache.put(record(6, enabled=True)) == "t"  # a read from before the write
    assert defn(cache).enabled is False  # still laid over until the server shows 7
    assert cache.put(record(7, enabled=False)) == "t"
    assert defn(cache).enabled is False and cache.version("t") == 7
    assert cache.pending_owner(["t"]) == set() and not cache.is_stale("t")
    assert cache.put(record(6, enabled=True)) is None  # versions compare again


def test_after_the_versions_go_back_the_next_record_is_taken_and_old_acks_are_let_go() -> None:
    cache = RecordCache()
    cache.put(record(22))
    cache.write("t", {"lastRunAt": 5.0})
    assert not cache.acked("t", 23)  # the old server took it, then was restored
    cache.write("t", {"owner": "me"})  # queued, not sent yet
    cache.went_back()
    assert cache.put(record(6, owner="")) == "t"
    assert defn(cache).rollup.last_run_at is None  # gone with the restore: the server says
    assert defn(cache).owner == "me"  # not taken yet: still laid over
    assert not cache.acked("t", 7)
    cache.put(record(7, owner="me"))
    assert defn(cache).owner == "me" and cache.pending_owner(["t"]) == set()
