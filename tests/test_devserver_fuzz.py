"""Random bodies against a real devserver subprocess: every answer is JSON, none is a 5xx."""

from __future__ import annotations

from typing import Any

import httpx
from conftest import DevserverProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KEYS = [
    "objectId",
    "dataset",
    "records",
    "ids",
    "filter",
    "sort",
    "limit",
    "after",
    "includeDeleted",
    "seed",
    "type",
    "key",
    "name",
    "hidden",
    "idRule",
    "dynamic",
    "app",
    "apps",
    "os",
    "ops",
    "fields",
    "id",
    "ifVersion",
    "upsert",
    "path",
    "value",
    "device",
    "devices",
    "changes",
    "seconds",
    "$set",
    "$gt",
    "$in",
    "$exists",
    "version",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            "$set",
            "$unset",
            "$inc",
            "a.b",
            "a..b",
            "agent_triggers",
            "bao",
            "-n",
            "ANCHOR",
            "PEER",
            "missing",
            "error",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)
    ),
    max_leaves=25,
)
bodies = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)

ROUTES = [
    ("POST", "/v1/spaces/bao/upsert"),
    ("POST", "/v1/spaces/bao/modify"),
    ("POST", "/v1/spaces/bao/query"),
    ("POST", "/v1/spaces/bao/delete"),
    ("POST", "/v1/spaces/bao/types"),
    ("POST", "/v1/spaces/bao/bundles/bao%2Fv1/children"),
    ("PUT", "/v1/devices/me"),
    ("POST", "/v1/devices/activate"),
    ("POST", "/_dev/faults"),
    ("POST", "/_dev/reinit"),
]


def _fill(value: Any, anchor: str, peer: str) -> Any:
    if value == "ANCHOR":
        return anchor
    if value == "PEER":
        return peer
    if isinstance(value, list):
        return [_fill(v, anchor, peer) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, anchor, peer) for k, v in value.items()}
    return value


def test_random_bodies_never_get_a_5xx(devserver: DevserverProcess) -> None:
    with httpx.Client(base_url=devserver.url, timeout=30) as http:
        anchor = http.post(
            "/v1/spaces/bao/bundles/bao%2Fv1/children", json={"seed": "bao/triggers/v1"}
        ).json()["objectId"]

        @settings(
            max_examples=300,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(route=st.sampled_from(ROUTES), body=bodies, real_object=st.booleans())
        def check(route: tuple[str, str], body: dict[str, Any], real_object: bool) -> None:
            body = _fill(body, anchor, devserver.peers[0])
            if real_object:
                body = {**body, "objectId": anchor, "dataset": "agent_triggers"}
            method, path = route
            resp = http.request(method, path, json=body)
            assert resp.status_code < 500, (route, body, resp.text)
            payload = resp.json()
            if resp.status_code >= 400:
                assert set(payload["error"]) == {"code", "message"}, payload

        check()
        # faults the fuzzing may have set are cleared, then the server still answers everything
        http.post("/_dev/faults", json={"devices": None, "changes": None, "writes": None})
        assert http.get("/v1/devices").status_code == 200
        assert http.get("/v1/spaces/bao/changes").status_code == 200
