"""Hypothesis over the control API's own OpenAPI document: no request produces a 500.

Requests are drawn from `GET /openapi.json`: every operation, with path ids (known
and random), query values (valid per the schema and random), bodies (valid per the
schema, random JSON, random bytes) under assorted content types and headers. Each
answer must be a status the document lists for that operation (or one the guard
gives any route), with a JSON error body for every 4xx/5xx.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from conftest import DevserverProcess
from control_support import ServeProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import wait_until

from anyrtd.client import ServerClient, Upsert
from anyrtd.places import resolve_places

IDS = ["fz-cron", "fz-once", "fz-event", "fz-far", "fz-broken"]
GUARD_STATUSES = {"400", "401", "403", "404", "405", "413", "415"}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, Any]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    devserver = DevserverProcess(tmp / "dev.sqlite3", ["--devices", "1"], tmp / "devserver.log")
    devserver.start()
    served = ServeProcess(tmp, devserver.url, listen="127.0.0.1:0")
    try:
        served.start()
        asyncio.run(_seed(devserver.url))
        with served.http() as c:
            wait_until(
                lambda: all(c.get(f"/triggers/{i}").status_code == 200 for i in IDS),
                timeout=30,
                what="the fuzz triggers to reach the daemon",
            )
            doc = c.get("/openapi.json").json()
        yield served, doc
    finally:
        served.stop()
        devserver.stop()


async def _seed(url: str) -> None:
    remind = {"program": "agent:remind@v1", "args": {"text": "fuzz"}, "owner": ""}
    async with ServerClient(url) as client:
        places = await resolve_places(client, "bao")
        await client.upsert(
            places.triggers,
            [
                Upsert("fz-cron", {**remind, "kind": "cron", "spec": {"cron": "0 0 1 1 *"}}),
                Upsert("fz-once", {**remind, "kind": "once", "spec": {"at": 4_000_000_000}}),
                Upsert(
                    "fz-event",
                    {
                        **remind,
                        "kind": "event",
                        "spec": {"dataset": "chat_messages", "objectId": "x"},
                    },
                ),
                Upsert(
                    "fz-far",
                    {**remind, "kind": "cron", "spec": {"every_s": 60}, "owner": "12D3KooWfar"},
                ),
                Upsert("fz-broken", {"kind": 7, "program": "agent:remind@v1"}),
            ],
        )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

specs = st.fixed_dictionaries(
    {},
    optional={
        "cron": st.sampled_from(["*/5 * * * *", "0 8 * * 1-5", "61 * * * *", "0 0 30 2 *", "@x"])
        | st.text(max_size=20),
        "every_s": st.integers(-5, 10**6) | st.floats(allow_nan=False, allow_infinity=False),
        "at": st.integers(0, 2**40) | st.text(max_size=5),
        "tz": st.sampled_from(["UTC", "Europe/Paris", "Nowhere/City"]),
        "dataset": st.sampled_from(["chat_messages", "files"]),
        "objectId": st.text(max_size=10),
    },
)

patch_bodies = st.fixed_dictionaries({}, optional={"spec": specs, "enabled": st.booleans()})

bodies = st.one_of(
    st.none(),
    patch_bodies.map(lambda b: json.dumps(b).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
)

content_types = st.sampled_from(
    [
        None,
        "application/json",
        "application/merge-patch+json",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
        "",
    ]
)

extra_headers = st.fixed_dictionaries(
    {},
    optional={
        "Origin": st.sampled_from(["http://localhost:3000", "https://evil.example", "null"]),
        "Sec-Fetch-Site": st.sampled_from(["cross-site", "same-origin", "none"]),
        "Host": st.sampled_from(["localhost", "127.0.0.1:7010", "[::1]", "evil.example", "a b"]),
        "Authorization": st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
    },
)


def _param_values(schema: dict[str, Any]) -> st.SearchStrategy[str | None]:
    valid: st.SearchStrategy[str]
    if "enum" in schema:
        valid = st.sampled_from([str(v) for v in schema["enum"]])
    elif schema.get("type") == "integer":
        valid = st.integers(schema.get("minimum", -10), schema.get("maximum", 10**6)).map(str)
    elif schema.get("type") == "boolean":
        valid = st.sampled_from(["true", "false"])
    else:
        valid = st.sampled_from(IDS)
    return st.none() | valid | st.text(max_size=12)


@st.composite
def requests(draw: st.DrawFn, doc: dict[str, Any]) -> tuple[str, str, dict[str, Any], str]:
    """Draw (method, url, httpx kwargs, the operation's path template) from the document."""
    operations = [(m.upper(), p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]
    method, template, op = draw(st.sampled_from(operations))
    path = template
    params: dict[str, str] = {}
    for param in op.get("parameters", []):
        if param["in"] == "path":
            value = draw(st.sampled_from(IDS) | st.text(min_size=1, max_size=12))
            path = path.replace("{" + param["name"] + "}", quote(value, safe=""))
        elif param["in"] == "query":
            value = draw(_param_values(param.get("schema", {})))
            if value is not None:
                params[param["name"]] = value
    headers = dict(draw(extra_headers))
    kwargs: dict[str, Any] = {"params": params}
    if method in ("POST", "PATCH"):
        body = draw(bodies)
        content_type = draw(content_types)
        if content_type is not None:
            headers["Content-Type"] = content_type
        if body is not None:
            kwargs["content"] = body
    kwargs["headers"] = headers
    return method, path, kwargs, template


def test_no_request_produces_a_500(target: tuple[ServeProcess, Any]) -> None:
    served, doc = target
    client = httpx.Client(base_url=f"http://{served.listen}", timeout=15)

    @settings(
        max_examples=600,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(requests(doc))
    def check(request: tuple[str, str, dict[str, Any], str]) -> None:
        method, path, kwargs, template = request
        try:
            resp = client.request(method, path, **kwargs)
        except httpx.LocalProtocolError:
            return  # httpx itself refuses to send it (a header value it cannot encode)
        assert resp.status_code != 500, (method, path, kwargs, resp.text)
        documented = set(doc["paths"][template][method.lower()]["responses"])
        assert str(resp.status_code) in documented | GUARD_STATUSES, (
            method,
            path,
            kwargs,
            resp.status_code,
            resp.text,
        )
        if resp.status_code >= 400 and not (template == "/healthz" and resp.status_code == 503):
            error = resp.json()["error"]
            assert error["code"] and error["message"]

    try:
        check()
    finally:
        client.close()
    with served.http() as c:
        assert c.get("/healthz").json()["status"] == "ok"


def test_the_openapi_document_is_complete(target: tuple[ServeProcess, Any]) -> None:
    _, doc = target
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op.get("summary"), (method, path)
            assert op["responses"], (method, path)
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    assert "{" + param["name"] + "}" in path
    refs = json.dumps(doc)
    for name in doc["components"]["schemas"]:
        assert f"#/components/schemas/{name}" in refs or name == "TriggerPatch"


def test_the_document_is_served_as_written(target: tuple[ServeProcess, Any]) -> None:
    served, doc = target
    with served.http() as c:
        assert c.get("/openapi.json").json() == doc
