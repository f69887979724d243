"""The any server client: the one module that knows the server's wire format.

Everything else in anyrtd speaks the typed values defined here. If the real
server differs from `docs/server-api.md`, this module is the one to change.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import os
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from urllib.parse import quote, urlsplit

from anyrtd.heap import gc_paused, give_back

if TYPE_CHECKING:  # a local CLI command imports this module's types, not aiohttp
    import aiohttp

PACED_BYTES = 10_000
"""A feed page larger than this waits for `pace` first: decoding it and taking its changes
hold the loop for milliseconds (a second of a busy device's own writes shown back, about
100 KB, for 5-6 ms)."""

JSON_HEADERS = {"Content-Type": "application/json"}

DEADLINE_S = 30.0
"""The most a request may take from its start to the last byte of its answer (a long poll:
this plus its wait), however the bytes trickle in: a slow server must not hold the outbox."""

MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The most read of one answer: twice the largest request body the any server takes, so any
one record fits. A larger answer is the server's fault (`BadAnswer`), and is not kept."""

RETRY_AFTER_MAX_S = 60.0
"""The longest wait a `Retry-After` is honoured for: a server that asks for more is asked
again after this long."""

TRANSIENT = frozenset({408, 429})
"""Statuses below 500 that say "not now" (Request Timeout, Too Many Requests): with every
5xx, they are `ServerUnavailable`, and the request may be sent again."""

HEAD_BYTES = 64
"""How many of a bad answer's first bytes its log line shows (escaped)."""

log = logging.getLogger("anyrtd.client")

Record = dict[str, Any]
"""A record as the server's query returns it: flat fields plus `id`, `_v`, `_updatedAt`."""


class ServerError(Exception):
    """The server answered with an error body; `code` is its slug (`not_found`, `tombstoned`...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Unsendable(ServerError):
    """The request could not be encoded (text that is not valid Unicode, a NaN): no server
    would ever take it, so it is refused like a server's refusal, and never retried."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "unsendable", message)


class ServerUnavailable(Exception):
    """The server could not be reached (connection refused, no whole answer by the deadline),
    or said "not now" (a 5xx, a 408, a 429): the request may go again later, after
    `retry_after` seconds when the server named a wait (`Retry-After`, capped)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BadAnswer(ServerUnavailable):
    """The server answered, but not as the any server does (a body that is not its JSON, a
    JSON of another shape, an answer over `MAX_ANSWER_BYTES`): the server's fault, never
    the caller's, and the request may go again later."""


class Pace(Protocol):
    """What a large feed page waits for before it is decoded (the daemon's timer: a decode
    holds the event loop for milliseconds, and must not hold up a start)."""

    async def clear_of(self) -> None:
        """Return when a few milliseconds of work would not hold up a start."""
        ...


class Unreached(Exception):
    """A transport got no answer; the message says why in a few words
    (`ConnectError: Connection refused`)."""


WRITES = ("/upsert", "/modify", "/delete")


def _requests(path: str) -> str:
    """Return the kind of request a path is, as the server's faults are told apart."""
    return "writes" if path.endswith(WRITES) else "reads"


@dataclass
class Reach:
    """Whether the server can be reached: since when it has not (connection refused, a timeout)
    and the last such error; both None once it answers again, whatever the answer. And
    whether its answers are sound: since when they are not (`BadAnswer`s, 429s) and the
    last such fault; both None once it answers soundly again."""

    unreachable_since: float | None = None
    error: str | None = None
    faulty_since: float | None = None
    fault: str | None = None


@dataclass(frozen=True)
class Reply:
    """An answer as a transport hands it over: the status, the headers (looked up without
    regard to case) and the body, as it arrives."""

    status: int
    headers: Mapping[str, str]
    body: AsyncIterator[bytes]


class Transport(Protocol):
    """How requests reach the server: bytes out, bytes in. The wire format (paths, JSON
    bodies, statuses) stays in `ServerClient`; a test passes a fake transport."""

    def exchange(
        self,
        method: str,
        url: str,
        body: bytes | None,
        params: Mapping[str, Any] | None,
        wait: float,
    ) -> AbstractAsyncContextManager[Reply]:
        """Send a request; enter with its answer's status and headers, the body still to read.
        Raise `Unreached` when no answer comes: no connection in `wait` seconds, no byte
        for `wait` seconds, a connection lost."""
        ...

    async def aclose(self) -> None:
        """Let go of the connections."""
        ...


@dataclass(frozen=True)
class Dataset:
    """Where a set of records lives: a space, an object and a dataset (short or collection name)."""

    space: str
    object_id: str
    name: str


@dataclass(frozen=True)
class Change:
    seq: int
    object_id: str
    dataset: str
    id: str
    op: str
    record: Record | None


@dataclass(frozen=True)
class ChangePage:
    changes: list[Change]
    seq: int


@dataclass(frozen=True)
class DeviceRow:
    peer_id: str
    name: str
    os: str
    apps: Mapping[str, Mapping[str, Any]]
    deleted: bool = False


@dataclass(frozen=True)
class DevicesView:
    self_id: str
    active: Mapping[str, str | None]
    devices: list[DeviceRow] = field(default_factory=list)

    def row(self, peer_id: str) -> DeviceRow | None:
        return next((d for d in self.devices if d.peer_id == peer_id), None)


class Upsert(NamedTuple):
    """A field-level write of one record: only `fields` change; `unset` paths are removed.

    Sent at once, its place is named in `ServerClient.upsert(where, ...)`; queued in the
    outbox (`anyrtd.rows.Batch.write`), it names the place by `dataset`, and read back from
    there it carries its `seq` and `attempts` too. A tuple: a burst makes thousands."""

    id: str
    fields: Mapping[str, Any]
    unset: Sequence[str] = ()
    if_version: int | None = None
    """Write only if the server's record is still at this version (a claim: see `apply`);
    None writes whatever the record is at."""
    dataset: str = ""
    """The name the outbox resolves to a place (`anyrtd.outbox.RUNS`, `TRIGGERS`); empty for
    a write sent at once."""
    seq: int = 0
    """Its place in the outbox, once read back from there (0 before)."""
    attempts: int = 0
    """How often the outbox tried to send it, once read back from there (0 before)."""


def encode(body: Any) -> bytes:
    """A request's JSON body: compact UTF-8; a NaN or text that is not valid Unicode raises
    ValueError (the request is `Unsendable`)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class Waits:
    """The requests one caller (a run's program) has in flight to the server: each request
    made from a task whose context holds it (`WAITS`) is noted from its send to its answer,
    so that a run stopped while the server holds its request is told from one that ran
    long on its own (docs/programs.md)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._open: dict[int, tuple[str, float]] = {}
        self._next = 0

    def begin(self, what: str) -> int:
        """Note a request sent; return its token for `end`."""
        self._next += 1
        self._open[self._next] = (what, self._monotonic())
        return self._next

    def end(self, token: int) -> None:
        """Note a request answered (or given up)."""
        self._open.pop(token, None)

    def holding(self) -> tuple[str, float] | None:
        """Return the oldest request still unanswered and how long it has waited, or None."""
        if not self._open:
            return None
        what, since = min(self._open.values(), key=lambda item: item[1])
        return what, self._monotonic() - since


WAITS: ContextVar[Waits | None] = ContextVar("anyrtd_server_waits", default=None)
"""The `Waits` of the run whose task makes a request (None: a request of the daemon's own)."""


class ServerClient:
    """An async client of the any server API.

    It speaks HTTP through `transport` (by default aiohttp's client, whose cost per request
    is about a quarter of httpx's, docs/benchmarks.md: a daemon's idle CPU is mostly its
    polls). Every request has a deadline for its whole answer (`deadline`, a long poll's
    wait on top), and an answer is read up to `max_answer_bytes`. A 5xx, a 408, a 429 and
    an answer that is not the any server's raise `ServerUnavailable` (the last
    `BadAnswer`): the server's fault, to be tried again, never the caller's."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 10.0,
        deadline: float = DEADLINE_S,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        now: Callable[[], float] = time.time,
        transport: Transport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._deadline = deadline
        self._max_answer = max_answer_bytes
        self._transport = transport or AiohttpTransport(self.base_url)
        self._now = now
        self._faults: dict[str, tuple[str, float, str]] = {}
        """The fault of each kind of request (`_requests`: reads, writes) until one of that
        kind is answered soundly: (its condition, since when, the last such answer)."""
        self.reach = Reach()
        """Whether the server answers (a 5xx is an answer: this is about reaching it at all),
        and whether its answers are sound."""

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        long_poll: float = 0.0,
        pace: Pace | None = None,
        bodiless: bool = False,
    ) -> dict[str, Any]:
        """Send a request and return its answer's JSON object; a long poll may be held up to
        `long_poll` s by the server, on top of the waits and the deadline. With `bodiless`,
        a success without a body (a 204, say) is taken as `{}`."""
        try:
            data = None if body is None else encode(body)
        except (TypeError, ValueError) as exc:  # a NaN, a lone surrogate (a UnicodeError)
            raise Unsendable(f"{exc.__class__.__name__}: {exc}") from exc
        deadline = self._deadline + long_poll
        status, retry_after, content = 0, None, b""
        waits = WAITS.get()
        token = waits.begin(f"{method} {path}") if waits is not None else None
        try:
            async with asyncio.timeout(deadline):
                exchange = self._transport.exchange(
                    method, self.base_url + path, data, params, self._timeout + long_poll
                )
                async with exchange as reply:
                    status = reply.status
                    retry_after = _retry_after(_header(reply.headers, "Retry-After"), self._now)
                    content = await _read(reply.body, self._max_answer)
        except Unreached as exc:
            raise self._unreached(str(exc)) from exc
        except TimeoutError as exc:
            raise self._unreached(f"Timeout: no whole answer in {deadline:g} s") from exc
        except _TooLarge as exc:
            give_back()  # the room the refused answer took (anyrtd/heap.py)
            self.reach.unreachable_since = self.reach.error = None
            what = f"an answer over the {self._max_answer:,}-byte cap"
            raise self._bad("too large", method, path, status, what, exc.head) from None
        finally:
            if waits is not None and token is not None:
                waits.end(token)
        self.reach.unreachable_since = self.reach.error = None
        if status in TRANSIENT or status >= 500:
            what = f"server answered {status}" + (
                f" (Retry-After {retry_after:g} s)" if retry_after is not None else ""
            )
            if status == 429:  # a storm of these holds every write back: a fault while it lasts
                self._faulty("throttled", method, path, status, "429 Too Many Requests", content)
            raise ServerUnavailable(f"{self.base_url}{path}: {what}", retry_after=retry_after)
        if bodiless and status < 300 and not content.strip():
            self._sound(path)
            return {}
        if pace is not None and len(content) > PACED_BYTES:
            await pace.clear_of()
        try:
            # The collector paused: it would walk the page's objects again and again while
            # they are built (a feed page of 0.6 MB of broken records decoded in 4 ms, but
            # up to 36 ms with its passes, docs/reliability.md); a decoded body has no cycles.
            with gc_paused():
                payload = json.loads(content)
        except ValueError:  # not JSON, or not UTF-8
            payload = None
        if status >= 400:
            self._sound(path)  # an error answer is an answer: the request was the mistake
            text = content.decode("utf-8", "replace")
            err = payload.get("error") if isinstance(payload, dict) else None
            code = str(err.get("code", "error")) if isinstance(err, dict) else "error"
            message = str(err.get("message", text)) if isinstance(err, dict) else text
            raise ServerError(status, code, message)
        if not isinstance(payload, dict):
            what = "a body that is not JSON" if payload is None else "JSON that is not an object"
            raise self._bad("not json", method, path, status, what, content)
        self._sound(path)
        return payload

    def _unreached(self, why: str) -> ServerUnavailable:
        error = f"{self.base_url}: {why}"
        if self.reach.unreachable_since is None:
            self.reach.unreachable_since = self._now()
        self.reach.error = error
        return ServerUnavailable(error)

    def _bad(
        self, kind: str, method: str, path: str, status: int, what: str, content: bytes
    ) -> BadAnswer:
        fault = self._faulty(kind, method, path, status, what, content)
        return BadAnswer(f"{self.base_url}: {fault}")

    def _faulty(
        self, kind: str, method: str, path: str, status: int, what: str, content: bytes
    ) -> str:
        """Note a fault of the server's answers to this kind of request (`_requests`); log it
        once a condition (until a request of that kind is answered soundly, or another
        condition comes). A sound answer to a read does not end a fault of the writes: a
        429 storm of writes alone is a fault while it lasts, not one a second."""
        fault = f"{method} {path} answered {status} with {what}"
        requests = _requests(path)
        was = self._faults.get(requests)
        noted = any(k == kind for k, _, _ in self._faults.values())
        self._faults[requests] = (kind, was[1] if was else self._now(), fault)
        self._reach_faults()
        if not noted:
            log.warning(
                "the server at %s: %s (first bytes %s): its fault, not a program's; requests "
                "are tried again later, writes wait in the outbox (logged once until it "
                "answers %s soundly)",
                self.base_url,
                fault,
                head(content),
                requests,
            )
        return fault

    def _sound(self, path: str) -> None:
        if self._faults.pop(_requests(path), None) is not None:
            self._reach_faults()
            if not self._faults:
                log.info("the server at %s answers soundly again", self.base_url)

    def _reach_faults(self) -> None:
        """Show in `reach` the oldest fault of any kind of request, and the last answer."""
        if not self._faults:
            self.reach.faulty_since = self.reach.fault = None
            return
        self.reach.faulty_since = min(since for _, since, _ in self._faults.values())
        self.reach.fault = "; ".join(fault for _, _, fault in self._faults.values())

    @contextlib.contextmanager
    def _decoding(self, path: str, body: dict[str, Any]) -> Iterator[None]:
        """Turn an answer of another shape than the any server's (a field missing, of another
        type) into a `BadAnswer`."""
        try:
            yield
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            what = f"JSON of another shape ({exc.__class__.__name__}: {exc})"
            raise self._bad("shape", "a request to", path, 200, what, encode(body)) from exc

    # spaces, types, bundles

    async def spaces(self) -> list[dict[str, str]]:
        body = await self._call("GET", "/v1/spaces")
        with self._decoding("/v1/spaces", body):
            return _objects(body["spaces"])

    async def types(self, space: str, *, include_hidden: bool = True) -> list[dict[str, Any]]:
        params = {"includeHidden": "true"} if include_hidden else None
        path = f"/v1/spaces/{quote(space, safe='')}/types"
        body = await self._call("GET", path, params=params)
        with self._decoding(path, body):
            return _objects(body["types"])

    async def ensure_type(
        self,
        space: str,
        key: str,
        *,
        name: str | None = None,
        hidden: bool = True,
        id_rule: str = "user",
        dynamic: bool = True,
    ) -> str:
        """Return the id of the type `key`, creating it (idempotently) when missing."""
        for t in await self.types(space, include_hidden=True):
            if t.get("key") == key:
                return str(t["id"])
        path = f"/v1/spaces/{quote(space, safe='')}/types"
        body = await self._call(
            "POST",
            path,
            {
                "key": key,
                "name": name or key,
                "hidden": hidden,
                "idRule": id_rule,
                "dynamic": dynamic,
            },
        )
        with self._decoding(path, body):
            return _text(body["id"])

    async def child(self, space: str, bundle: str, seed: str, type_id: str | None = None) -> str:
        """Return the object id of the bundle child for `seed` (resolved idempotently)."""
        payload: dict[str, Any] = {"seed": seed}
        if type_id is not None:
            payload["type"] = type_id
        path = f"/v1/spaces/{quote(space, safe='')}/bundles/{quote(bundle, safe='')}/children"
        body = await self._call("POST", path, payload)
        with self._decoding(path, body):
            return _text(body["objectId"])

    async def datasets(self, space: str) -> list[dict[str, Any]]:
        path = f"/v1/spaces/{quote(space, safe='')}/datasets"
        body = await self._call("GET", path)
        with self._decoding(path, body):
            return _objects(body["datasets"])

    # records

    async def upsert(self, where: Dataset, writes: Iterable[Upsert]) -> dict[str, int]:
        """Write fields of records (field-level merge); return each id's new version."""
        writes = list(writes)
        if not writes:
            return {}
        if all(not w.unset and w.if_version is None for w in writes):
            records: list[dict[str, Any]] = [{"id": w.id, "fields": dict(w.fields)} for w in writes]
            path = self._space_path(where, "upsert")
            body = await self._call("POST", path, {**self._where(where), "records": records})
        else:
            mods = []
            for w in writes:
                ops: list[dict[str, Any]] = [
                    {"type": "$set", "path": k, "value": v} for k, v in w.fields.items()
                ]
                ops += [{"type": "$unset", "path": p} for p in w.unset]
                rec: dict[str, Any] = {"id": w.id, "upsert": True, "ops": ops}
                if w.if_version is not None:
                    rec["ifVersion"] = w.if_version
                mods.append(rec)
            path = self._space_path(where, "modify")
            body = await self._call("POST", path, {**self._where(where), "records": mods})
        # Not the any server's answer (a proxy's page, say) is a `BadAnswer`: the write may
        # not have happened, and an upsert may be sent again.
        with self._decoding(path, body):
            return {_text(r["id"]): int(r["version"]) for r in body["records"]}

    async def replace(self, where: Dataset, record_id: str, value: Mapping[str, Any]) -> int:
        """Replace a whole record (creating it when missing); return its new version."""
        path = self._space_path(where, "modify")
        body = await self._call(
            "POST",
            path,
            {
                **self._where(where),
                "records": [
                    {
                        "id": record_id,
                        "upsert": True,
                        "ops": [{"type": "$set", "path": "", "value": dict(value)}],
                    }
                ],
            },
        )
        with self._decoding(path, body):
            return int(body["records"][0]["version"])

    async def query(
        self,
        where: Dataset,
        *,
        filter: Mapping[str, Any] | None = None,
        sort: Sequence[str] | None = None,
        limit: int | None = None,
        after: str | None = None,
        include_deleted: bool = False,
    ) -> tuple[list[Record], str | None]:
        """Return one page of records and the token of the next page (or None)."""
        payload: dict[str, Any] = self._where(where)
        if filter:
            payload["filter"] = dict(filter)
        if sort:
            payload["sort"] = list(sort)
        if limit is not None:
            payload["limit"] = limit
        if after is not None:
            payload["after"] = after
        if include_deleted:
            payload["includeDeleted"] = True
        path = self._space_path(where, "query")
        body = await self._call("POST", path, payload)
        with self._decoding(path, body):
            nxt = body.get("next")
            return _objects(body["records"]), (str(nxt) if nxt else None)

    async def query_all(
        self,
        where: Dataset,
        *,
        filter: Mapping[str, Any] | None = None,
        sort: Sequence[str] | None = None,
        include_deleted: bool = False,
        page_size: int = 1000,
    ) -> list[Record]:
        """Return every record matching `filter`, following pages."""
        out: list[Record] = []
        after: str | None = None
        while True:
            page, after = await self.query(
                where,
                filter=filter,
                sort=sort,
                limit=page_size,
                after=after,
                include_deleted=include_deleted,
            )
            out.extend(page)
            if after is None:
                return out

    async def delete(self, where: Dataset, ids: Sequence[str]) -> list[str]:
        path = self._space_path(where, "delete")
        body = await self._call("POST", path, {**self._where(where), "ids": list(ids)})
        with self._decoding(path, body):
            return [_text(i) for i in body["deleted"]]

    async def changes(
        self, space: str, since: int, wait: float = 0.0, *, pace: Pace | None = None
    ) -> ChangePage | None:
        """Return changes after `since` (long-polling up to `wait` s); None if there is no feed.
        A large page waits for `pace` before it is decoded."""
        path = f"/v1/spaces/{quote(space, safe='')}/changes"
        try:
            body = await self._call(
                "GET", path, params={"since": since, "wait": wait}, long_poll=wait, pace=pace
            )
        except ServerError as exc:
            if exc.status == 404 and exc.code in ("not_found", "error", "no_route"):
                return None
            raise
        with self._decoding(path, body):
            changes = [
                Change(
                    seq=int(c["seq"]),
                    object_id=str(c.get("objectId", "")),
                    dataset=str(c.get("dataset", "")),
                    id=str(c.get("id", "")),
                    op=str(c.get("op", "")),
                    record=_object_or_none(c.get("record")),
                )
                for c in _objects(body.get("changes", []))
            ]
            return ChangePage(changes=changes, seq=int(body.get("seq", since)))

    # devices registry

    async def devices(self) -> DevicesView | None:
        """Return the devices registry, or None when the server has none (404)."""
        try:
            body = await self._call("GET", "/v1/devices")
        except ServerError as exc:
            if exc.status == 404:
                return None
            raise
        with self._decoding("/v1/devices", body):
            return DevicesView(
                self_id=str(body.get("self", "")),
                active=dict(body.get("active") or {}),
                devices=[_device_row(r) for r in _objects(body.get("devices", []))],
            )

    async def register(self, app: str, version: str, *, name: str = "", os: str = "") -> DeviceRow:
        body = await self._call(
            "PUT", "/v1/devices/me", {"name": name, "os": os, "apps": {app: {"version": version}}}
        )
        with self._decoding("/v1/devices/me", body):
            return _device_row(body)

    async def activate(self, app: str) -> DeviceRow:
        body = await self._call("POST", "/v1/devices/activate", {"app": app})
        with self._decoding("/v1/devices/activate", body):
            return _device_row(body)

    async def prune(self, peer_id: str) -> None:
        await self._call("DELETE", f"/v1/devices/{quote(peer_id, safe='')}", bodiless=True)

    # helpers

    @staticmethod
    def _space_path(where: Dataset, verb: str) -> str:
        return f"/v1/spaces/{quote(where.space, safe='')}/{verb}"

    @staticmethod
    def _where(where: Dataset) -> dict[str, Any]:
        return {"objectId": where.object_id, "dataset": where.name}


class AiohttpTransport:
    """Requests over aiohttp's client. The session is made on the first request, in the event
    loop that makes it, and again if a later request comes from another loop (a test's
    `asyncio.run` after another)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._proxy: str | None = None

    def _http(self) -> aiohttp.ClientSession:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession()
            self._session_loop = loop
            self._proxy = proxy_for(self.base_url)
        return self._session

    @asynccontextmanager
    async def exchange(
        self,
        method: str,
        url: str,
        body: bytes | None,
        params: Mapping[str, Any] | None,
        wait: float,
    ) -> AsyncIterator[Reply]:
        import aiohttp

        session = self._http()
        # `wait` bounds the connect and each wait for bytes; the client's deadline bounds
        # the whole answer.
        timeout = aiohttp.ClientTimeout(total=None, connect=wait, sock_read=wait)
        try:
            async with session.request(
                method,
                url,
                data=body,
                params=params,
                headers=JSON_HEADERS if body is not None else None,
                proxy=self._proxy,
                timeout=timeout,
            ) as resp:
                yield Reply(resp.status, resp.headers, resp.content.iter_any())
        except aiohttp.ClientError as exc:
            raise Unreached(_unreached(exc)) from exc

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and self._session_loop is asyncio.get_running_loop():
            await session.close()


class _TooLarge(Exception):
    def __init__(self, head: bytes) -> None:
        super().__init__("an answer over the cap")
        self.head = head


async def _read(chunks: AsyncIterator[bytes], cap: int) -> bytes:
    """Return a whole body; raise `_TooLarge` (with its first bytes) as soon as it passes `cap`."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > cap:
            # The head from the first chunks alone: a join of all would be another copy of
            # the cap's bytes, only to take the first few.
            head = b"".join([*parts[: HEAD_BYTES + 1], chunk])[:HEAD_BYTES]
            del parts
            raise _TooLarge(head)
        parts.append(chunk)
    return b"".join(parts)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        lower = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lower), None)
    return value


def _retry_after(value: str | None, now: Callable[[], float]) -> float | None:
    """Return the wait a `Retry-After` asks for (seconds, or an HTTP date), capped at
    `RETRY_AFTER_MAX_S`; None when there is none or it cannot be read."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - now()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)


def head(content: bytes) -> str:
    """Return an answer's first bytes for a log line, escaped (a bytes literal: no control
    character of a hostile body reaches the log)."""
    shown = repr(content[:HEAD_BYTES])
    return shown + ("..." if len(content) > HEAD_BYTES else "")


def _objects(value: Any) -> list[dict[str, Any]]:
    """Return a list of JSON objects; raise TypeError when `value` is not one."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TypeError(f"expected a list of objects, got {type(value).__name__}")
    return value


def _object_or_none(value: Any) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"expected an object or null, got {type(value).__name__}")
    return value


def _text(value: Any) -> str:
    """Return an id as text; raise TypeError for a value an id cannot be (an object, null)."""
    if isinstance(value, (dict, list)) or value is None:
        raise TypeError(f"expected an id, got {type(value).__name__}")
    return str(value)


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for `url` (`http_proxy`, `https_proxy`, `no_proxy`,
    as httpx honoured them), read once per session: aiohttp's own reading of the
    environment opens `~/.netrc` in a thread for every request."""
    import urllib.request  # here: a local CLI command imports this module's types only

    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy is None or urllib.request.proxy_bypass(parts.netloc):
        return None
    return proxy


def _unreached(exc: Exception) -> str:
    """Why a request got no answer, in a few words: `ConnectError: Connection refused`,
    `Timeout: no answer in time`, else the exception's class and text."""
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError):
        cause = exc.os_error
        if cause.errno is not None and cause.errno > 0:
            return f"ConnectError: {os.strerror(cause.errno)}"
        return f"ConnectError: {cause.strerror or cause}"  # a name that does not resolve
    if isinstance(exc, TimeoutError):
        return "Timeout: no answer in time"
    return f"{exc.__class__.__name__}: {exc}"


def _device_row(raw: Mapping[str, Any]) -> DeviceRow:
    return DeviceRow(
        peer_id=str(raw.get("peerId", "")),
        name=str(raw.get("name", "")),
        os=str(raw.get("os", "")),
        apps=dict(raw.get("apps") or {}),
        deleted=bool(raw.get("deleted", False)),
    )
