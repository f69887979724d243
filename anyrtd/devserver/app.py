"""The devserver's HTTP routes: one aiohttp application per device, over one shared hub."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from anyrtd.clock import Clock
from anyrtd.devserver.errors import ApiError, bad_request, not_found
from anyrtd.devserver.records import (
    MAX_LIMIT,
    Page,
    compile_filter,
    compile_sort,
    fingerprint,
    page_by_id,
    parse_ops,
    run_query,
    type_name,
)
from anyrtd.devserver.store import RecordWrite, Store, Topology, Where

log = logging.getLogger("anyrtd.devserver")

T = TypeVar("T")

MAX_BODY = 8 * 1024 * 1024
MAX_DEPTH = 64
MAX_WAIT = 30.0
MAX_CHANGES = 1000
MAX_INT = 2**63 - 1
FAULTS = {"devices": ("missing", "error"), "changes": ("missing",), "writes": ("error",)}


@dataclass
class Device:
    """One device endpoint: its index (1-based), peer id, replica, URL and injected faults."""

    index: int
    peer: str
    replica: int
    url: str = ""
    faults: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(FAULTS))


class Hub:
    """What every device's application shares: the store, its worker thread and the feeds."""

    def __init__(self, store: Store, clock: Clock, *, replicated: bool, os_name: str) -> None:
        self.store = store
        self.clock = clock
        self.replicated = replicated
        self.os_name = os_name
        self.devices: list[Device] = []
        # One worker thread owns the SQLite connection: the event loop never blocks on it
        # and every write is serialized.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="devserver-db")
        self._feeds: dict[tuple[int, str], asyncio.Event] = {}
        self.closing = asyncio.Event()
        self.sync_wake = asyncio.Event()

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a store call on the store's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def shutdown_executor(self) -> None:
        self._executor.shutdown(wait=True)

    def feed_event(self, replica: int, space: str) -> asyncio.Event:
        """Return the event the next write to (replica, space) sets."""
        return self._feeds.setdefault((replica, space), asyncio.Event())

    def waiting(self, replica: int, space: str) -> bool:
        """Tell whether a reader is parked on the feed of (replica, space)."""
        return (replica, space) in self._feeds

    def notify(self, touched: set[tuple[int, str]]) -> None:
        """Wake the readers waiting on the feeds that grew."""
        for key in touched:
            event = self._feeds.pop(key, None)
            if event is not None:
                event.set()

    def wake_all(self) -> None:
        """Wake every waiting reader (used when shutting down)."""
        feeds, self._feeds = self._feeds, {}
        for event in feeds.values():
            event.set()

    def device(self, ref: Any) -> Device:
        """Find a device by index (1-based) or peer id."""
        for d in self.devices:
            if (isinstance(ref, int) and not isinstance(ref, bool) and d.index == ref) or (
                isinstance(ref, str) and d.peer == ref
            ):
                return d
        known = ", ".join(f"{d.index} ({d.peer})" for d in self.devices)
        raise not_found(f"device {ref!r} is not one of this devserver's devices: {known}")

    async def state(self) -> dict[str, Any]:
        """Return what `GET /_dev/state` shows."""
        topo = self.store.topology
        pending = await self.run(self.store.pending)
        out = []
        for d in self.devices:
            heads = await self.run(self.store.heads, d.replica)
            out.append(
                {
                    "device": d.index,
                    "peerId": d.peer,
                    "url": d.url,
                    "replica": d.replica,
                    "partitioned": d.replica in topo.partitioned and self.replicated,
                    "pending": pending.get(d.replica, {"outgoing": 0, "incoming": 0}),
                    "seq": heads,
                    "faults": dict(d.faults),
                }
            )
        total = sum(p["outgoing"] for p in pending.values())
        return {
            "mode": "replicated" if self.replicated else "shared",
            "syncDelay": topo.delay,
            "partitioned": sorted(topo.partitioned) if self.replicated else [],
            "pending": total,
            "devices": out,
        }


HUB = web.AppKey("hub", Hub)
DEVICE = web.AppKey("device", Device)


def make_app(hub: Hub, device: Device) -> web.Application:
    """Build the application that answers as `device`."""
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY)
    app[HUB] = hub
    app[DEVICE] = device
    r = app.router
    r.add_get("/v1/spaces", _spaces)
    r.add_get("/v1/spaces/{space}/types", _types)
    r.add_post("/v1/spaces/{space}/types", _create_type)
    r.add_post("/v1/spaces/{space}/bundles/{bundle:.+}/children", _child)
    r.add_get("/v1/spaces/{space}/datasets", _datasets)
    r.add_post("/v1/spaces/{space}/upsert", _upsert)
    r.add_post("/v1/spaces/{space}/modify", _modify)
    r.add_post("/v1/spaces/{space}/query", _query)
    r.add_post("/v1/spaces/{space}/delete", _delete)
    r.add_get("/v1/spaces/{space}/changes", _changes)
    r.add_get("/v1/devices", _devices)
    r.add_put("/v1/devices/me", _register)
    r.add_post("/v1/devices/activate", _activate)
    r.add_delete("/v1/devices/{peer}", _prune)
    r.add_get("/_dev/state", _state)
    r.add_post("/_dev/partition", _partition)
    r.add_post("/_dev/heal", _heal)
    r.add_post("/_dev/sync-delay", _sync_delay)
    r.add_post("/_dev/sync", _sync_now)
    r.add_post("/_dev/faults", _faults)
    r.add_post("/_dev/reinit", _reinit)
    return app


# errors

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, code: str, message: str) -> web.Response:
    """Return the error body every failure uses."""
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.code, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        where = f"{request.method} {request.path}"
        if exc.status == 404:
            return error_response(
                404,
                "no_route",
                f"no route {where}; the devserver's routes are listed in docs/server-api.md",
            )
        if exc.status == 405:
            return error_response(405, "method_not_allowed", f"{where}: method not allowed")
        if exc.status == 413:
            return error_response(
                413,
                "too_large",
                f"{where}: the body is over {MAX_BODY} bytes; send fewer records per request",
            )
        code = "bad_request" if exc.status < 500 else "internal"
        return error_response(exc.status, code, f"{where}: {exc.reason}")
    except Exception:
        # A bug in the devserver: say so in the error shape instead of dropping the connection.
        log.exception("%s %s failed", request.method, request.path)
        return error_response(
            500, "internal", "the devserver failed on this request; its log has the traceback"
        )


# input helpers


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _depth(value: Any) -> int:
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        raise ApiError(400, "invalid_json", "expected a JSON object body, got nothing")
    try:
        value = json.loads(
            raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float
        )
        # Lone surrogates parse but cannot be stored; find them now, not in the store.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeError as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid UTF-8 text: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "invalid_json", f"expected a JSON object body, got {type_name(value)}")
    if _depth(value) > MAX_DEPTH:
        raise bad_request(f"the body nests deeper than {MAX_DEPTH} levels")
    return value


def _string(body: dict[str, Any], key: str, where: str = "") -> str:
    name = f"{where}.{key}" if where else key
    if key not in body:
        raise bad_request(f"{name}: missing; expected a non-empty string")
    value = body[key]
    if not isinstance(value, str) or not value:
        raise bad_request(f"{name}: expected a non-empty string, got {_shown(value)}")
    return value


def _opt_string(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"{key}: expected a string, got {_shown(value)}")
    return value


def _opt_bool(body: dict[str, Any], key: str, where: str = "") -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        name = f"{where}.{key}" if where else key
        raise bad_request(f"{name}: expected true or false, got {_shown(value)}")
    return value


def _opt_int(body: dict[str, Any], key: str, where: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    name = f"{where}.{key}" if where else key
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise bad_request(f"{name}: expected an integer from {low} to {high}, got {_shown(value)}")
    return value


def _list(body: dict[str, Any], key: str) -> list[Any]:
    if key not in body:
        raise bad_request(f"{key}: missing; expected a list")
    value = body[key]
    if not isinstance(value, list):
        raise bad_request(f"{key}: expected a list, got {type_name(value)}")
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _param(request: web.Request, name: str) -> str:
    value = request.match_info[name]
    try:
        value.encode("utf-8")
    except UnicodeError:
        raise bad_request(f"{name}: not valid UTF-8 in the path") from None
    return value


def _query_number(request: web.Request, name: str, default: float, *, integer: bool) -> float:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number of seconds"
        raise bad_request(f"?{name}={raw}: expected {kind}") from None
    if not math.isfinite(value) or value < 0 or value > MAX_INT:
        raise bad_request(f"?{name}={raw}: expected a value from 0 to {MAX_INT}")
    return value


def _ctx(request: web.Request) -> tuple[Hub, Device]:
    return request.app[HUB], request.app[DEVICE]


def _ok(payload: Any) -> web.Response:
    return web.json_response(payload)


# spaces, types, bundles


async def _spaces(request: web.Request) -> web.Response:
    hub, _ = _ctx(request)
    return _ok({"spaces": await hub.run(hub.store.spaces)})


async def _types(request: web.Request) -> web.Response:
    hub, _ = _ctx(request)
    flag = request.query.get("includeHidden", "false").lower()
    if flag not in ("true", "false", "1", "0", ""):
        raise bad_request(f"?includeHidden={flag}: expected true or false")
    types = await hub.run(hub.store.types, _param(request, "space"), flag in ("true", "1"))
    return _ok({"types": types})


async def _create_type(request: web.Request) -> web.Response:
    hub, _ = _ctx(request)
    body = await _body(request)
    key = _string(body, "key")
    name = _opt_string(body, "name")
    id_rule = _opt_string(body, "idRule")
    hidden = _opt_bool(body, "hidden")
    dynamic = _opt_bool(body, "dynamic")
    made = await hub.run(
        hub.store.ensure_type,
        _param(request, "space"),
        key,
        name,
        bool(hidden),
        id_rule or "auto",
        bool(dynamic),
    )
    return _ok(made)


async def _child(request: web.Request) -> web.Response:
    hub, _ = _ctx(request)
    body = await _body(request)
    seed = _string(body, "seed")
    type_ref = body.get("type")
    if type_ref is not None and (not isinstance(type_ref, str) or not type_ref):
        raise bad_request(f"type: expected a type id, got {_shown(type_ref)}")
    bundle = _param(request, "bundle")
    return _ok(await hub.run(hub.store.child, _param(request, "space"), bundle, seed, type_ref))


async def _datasets(request: web.Request) -> web.Response:
    hub, _ = _ctx(request)
    return _ok({"datasets": await hub.run(hub.store.datasets, _param(request, "space"))})


# records


async def _where(request: web.Request, hub: Hub, body: dict[str, Any]) -> Where:
    object_id = _string(body, "objectId")
    dataset = _string(body, "dataset")
    return await hub.run(hub.store.resolve, _param(request, "space"), object_id, dataset)


def _record_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    items = _list(body, "records")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request(f"records[{i}]: expected an object with an id, got {type_name(item)}")
        _string(item, "id", f"records[{i}]")
    return items


async def _write(request: web.Request, writes: list[RecordWrite], where: Where) -> web.Response:
    hub, device = _ctx(request)
    if device.faults["writes"] == "error":
        raise ApiError(
            503,
            "unavailable",
            "record writes are failing (a fault injected with POST /_dev/faults); retry later",
        )
    result = await hub.run(
        hub.store.write, device.replica, where, writes, device.peer, hub.clock.now()
    )
    hub.notify(result.touched)
    if result.queued:
        hub.sync_wake.set()
    return _ok({"records": [{"id": rid, "version": v} for rid, v in result.versions]})


async def _upsert(request: web.Request) -> web.Response:
    hub, _ = _ctx(request)
    body = await _body(request)
    items = _record_items(body)
    writes = []
    for i, item in enumerate(items):
        fields = item.get("fields")
        if not isinstance(fields, dict):
            raise bad_request(
                f"records[{i}].fields: expected an object of fields, got "
                f"{'nothing' if fields is None else type_name(fields)}"
            )
        version = _opt_int(item, "ifVersion", f"records[{i}]", 0, MAX_INT)
        writes.append(RecordWrite(item["id"], fields=fields, if_version=version))
    return await _write(request, writes, await _where(request, hub, body))


async def _modify(request: web.Request) -> web.Response:
    hub, _ = _ctx(request)
    body = await _body(request)
    items = _record_items(body)
    writes = []
    for i, item in enumerate(items):
        at = f"records[{i}]"
        if "ops" not in item:
            raise bad_request(f"{at}.ops: missing; expected a list of ops")
        ops = parse_ops(item["ops"], at)
        upsert = _opt_bool(item, "upsert", at)
        version = _opt_int(item, "ifVersion", at, 0, MAX_INT)
        writes.append(RecordWrite(item["id"], ops=ops, upsert=bool(upsert), if_version=version))
    return await _write(request, writes, await _where(request, hub, body))


async def _query(request: web.Request) -> web.Response:
    hub, device = _ctx(request)
    body = await _body(request)
    conditions = compile_filter(body.get("filter"))
    keys = compile_sort(body.get("sort"))
    limit = _opt_int(body, "limit", "", 1, MAX_LIMIT)
    include_deleted = bool(_opt_bool(body, "includeDeleted"))
    after = body.get("after")
    where = await _where(request, hub, body)
    shape = fingerprint(
        where.space,
        where.object_id,
        where.dataset,
        body.get("filter"),
        body.get("sort"),
        include_deleted,
    )

    def run() -> Page:
        if not keys:  # id order is the store's own: read only as far as the page goes
            rows_after = functools.partial(
                hub.store.records_after, device.replica, where, include_deleted
            )
            return page_by_id(rows_after, conditions, limit=limit, after=after, shape=shape)
        rows = hub.store.records(device.replica, where, include_deleted)
        return run_query(rows, conditions, keys, limit=limit, after=after, shape=shape)

    page = await hub.run(run)
    out: dict[str, Any] = {"records": page.records}
    if page.next is not None:
        out["next"] = page.next
    return _ok(out)


async def _delete(request: web.Request) -> web.Response:
    hub, device = _ctx(request)
    body = await _body(request)
    record_ids = _list(body, "ids")
    for i, rid in enumerate(record_ids):
        if not isinstance(rid, str) or not rid:
            raise bad_request(f"ids[{i}]: expected a non-empty record id, got {_shown(rid)}")
    where = await _where(request, hub, body)
    unique = list(dict.fromkeys(record_ids))
    result = await hub.run(
        hub.store.delete, device.replica, where, unique, device.peer, hub.clock.now()
    )
    hub.notify(result.touched)
    if result.queued:
        hub.sync_wake.set()
    return _ok({"deleted": unique})


async def _changes(request: web.Request) -> web.Response:
    hub, device = _ctx(request)
    if device.faults["changes"] == "missing":
        raise web.HTTPNotFound()
    space = _param(request, "space")
    since = int(_query_number(request, "since", 0, integer=True))
    wait = min(_query_number(request, "wait", 0.0, integer=False), MAX_WAIT)
    limit = int(_query_number(request, "limit", MAX_CHANGES, integer=True))
    if not 1 <= limit <= MAX_CHANGES:
        raise bad_request(f"?limit={limit}: expected 1 to {MAX_CHANGES}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        # Take the event before reading, so a write that lands between the read and the wait
        # still wakes this reader.
        event = hub.feed_event(device.replica, space)
        entries, head = await hub.run(hub.store.changes, device.replica, space, since, limit)
        remaining = deadline - loop.time()
        if entries or remaining <= 0 or hub.closing.is_set():
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=remaining)
    seq = entries[-1]["seq"] if entries else head
    return _ok({"changes": entries, "seq": seq})


# devices registry


def _registry(request: web.Request) -> tuple[Hub, Device]:
    hub, device = _ctx(request)
    fault = device.faults["devices"]
    if fault == "missing":
        raise web.HTTPNotFound()
    if fault == "error":
        raise ApiError(
            503,
            "unavailable",
            "the devices registry is failing (a fault injected "
            "with POST /_dev/faults); retry later",
        )
    return hub, device


async def _devices(request: web.Request) -> web.Response:
    hub, device = _registry(request)
    return _ok(await hub.run(hub.store.devices_view, device.peer))


async def _register(request: web.Request) -> web.Response:
    hub, device = _registry(request)
    body = await _body(request)
    name = _opt_string(body, "name")
    os_name = _opt_string(body, "os")
    apps = body.get("apps")
    if not isinstance(apps, dict):
        raise bad_request(
            'apps: expected an object like {"bao": {"version": "1.0"}}, got '
            f"{'nothing' if apps is None else type_name(apps)}"
        )
    entries: dict[str, dict[str, Any]] = {}
    for app, entry in apps.items():
        if not app:
            raise bad_request("apps: an app slug cannot be empty")
        if not isinstance(entry, dict) or not isinstance(entry.get("version"), str):
            raise bad_request(
                f'apps.{app}: expected {{"version": "<string>"}}, got {_shown(entry)}'
            )
        entries[app] = {"version": entry["version"]}
    row = await hub.run(hub.store.register, device.peer, name, os_name, entries)
    return _ok(row.to_json())


async def _activate(request: web.Request) -> web.Response:
    hub, device = _registry(request)
    body = await _body(request)
    app = _string(body, "app")
    row = await hub.run(hub.store.activate, device.peer, app, hub.clock.now())
    return _ok(row.to_json())


async def _prune(request: web.Request) -> web.Response:
    hub, device = _registry(request)
    peer = _param(request, "peer")
    row = await hub.run(hub.store.prune, device.peer if peer == "me" else peer)
    return _ok(row.to_json())


# admin routes


async def _optional_body(request: web.Request) -> dict[str, Any]:
    if not (await request.read()).strip():
        return {}
    return await _body(request)


def _target(hub: Hub, device: Device, body: dict[str, Any]) -> Device:
    ref = body.get("device", body.get("peerId"))
    return device if ref is None else hub.device(ref)


def _need_replicas(hub: Hub) -> None:
    if not hub.replicated:
        raise ApiError(
            409,
            "not_replicated",
            "the devices share one store; start the devserver "
            "with --replicated (or --sync-delay S) to give each device its own replica",
        )


async def _state(request: web.Request) -> web.Response:
    hub, _ = _ctx(request)
    return _ok(await hub.state())


async def _set_topology(hub: Hub, topology: Topology) -> None:
    hub.store.topology = topology
    hub.sync_wake.set()


async def _partition(request: web.Request) -> web.Response:
    hub, device = _ctx(request)
    _need_replicas(hub)
    body = await _optional_body(request)
    target = _target(hub, device, body)
    topo = hub.store.topology
    await _set_topology(
        hub, Topology(topo.replicas, topo.delay, topo.partitioned | {target.replica})
    )
    return _ok(await hub.state())


async def _heal(request: web.Request) -> web.Response:
    hub, device = _ctx(request)
    _need_replicas(hub)
    body = await _optional_body(request)
    topo = hub.store.topology
    healed = set() if not body else topo.partitioned - {_target(hub, device, body).replica}
    await _set_topology(hub, Topology(topo.replicas, topo.delay, healed))
    return _ok(await hub.state())


async def _sync_delay(request: web.Request) -> web.Response:
    hub, _ = _ctx(request)
    _need_replicas(hub)
    body = await _body(request)
    seconds = body.get("seconds")
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not (0 <= seconds <= 3600)
    ):
        raise bad_request(f"seconds: expected a number from 0 to 3600, got {_shown(seconds)}")
    topo = hub.store.topology
    await _set_topology(hub, Topology(topo.replicas, float(seconds), topo.partitioned))
    return _ok(await hub.state())


async def _sync_now(request: web.Request) -> web.Response:
    hub, _ = _ctx(request)
    _need_replicas(hub)
    while True:
        applied, touched = await hub.run(hub.store.deliver, hub.clock.now(), early=True)
        hub.notify(touched)
        if not applied:
            break
    return _ok(await hub.state())


async def _faults(request: web.Request) -> web.Response:
    hub, device = _ctx(request)
    body = await _body(request)
    target = _target(hub, device, body)
    changes: dict[str, str | None] = {}
    for key, allowed in FAULTS.items():
        if key not in body:
            continue
        value = body[key]
        if value is not None and value not in allowed:
            choices = ", ".join(f'"{a}"' for a in allowed)
            raise bad_request(f"{key}: expected {choices} or null, got {_shown(value)}")
        changes[key] = value
    if not changes:
        raise bad_request(
            'expected at least one of "devices" ("missing", "error" or null), '
            '"changes" ("missing" or null) and "writes" ("error" or null)'
        )
    target.faults.update(changes)
    log.info("device %d faults: %s", target.index, target.faults)
    return _ok({"device": target.index, "peerId": target.peer, "faults": dict(target.faults)})


async def _reinit(request: web.Request) -> web.Response:
    hub, device = _ctx(request)
    body = await _optional_body(request)
    target = _target(hub, device, body)
    target.peer = await hub.run(hub.store.reinit_device, target.index, hub.os_name)
    log.info("device %d has a fresh peer id %s", target.index, target.peer)
    return _ok({"device": target.index, "peerId": target.peer})
