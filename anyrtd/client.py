"""The any server client: the one module that knows the server's wire format.

Everything else in anyrtd speaks the typed values defined here. If the real
server differs from `docs/server-api.md`, this module is the one to change.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlsplit

if TYPE_CHECKING:  # a local CLI command imports this module's types, not aiohttp
    import aiohttp

PACED_BYTES = 10_000
"""A feed page larger than this waits for `pace` first: decoding it and taking its changes
hold the loop for milliseconds (a second of a busy device's own writes shown back, about
100 KB, for 5-6 ms)."""

JSON_HEADERS = {"Content-Type": "application/json"}

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
    """The server could not be reached (connection refused, timeout, a 5xx)."""


class Pace(Protocol):
    """What a large feed page waits for before it is decoded (the daemon's timer: a decode
    holds the event loop for milliseconds, and must not hold up a start)."""

    async def clear_of(self) -> None:
        """Return when a few milliseconds of work would not hold up a start."""
        ...


@dataclass
class Reach:
    """Whether the server can be reached: since when it has not (connection refused, a timeout)
    and the last such error; both None once it answers again, whatever the answer."""

    unreachable_since: float | None = None
    error: str | None = None


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


@dataclass(frozen=True)
class Upsert:
    """A field-level write of one record: only `fields` change; `unset` paths are removed."""

    id: str
    fields: Mapping[str, Any]
    unset: Sequence[str] = ()
    if_version: int | None = None


def encode(body: Any) -> bytes:
    """A request's JSON body: compact UTF-8; a NaN or text that is not valid Unicode raises
    ValueError (the request is `Unsendable`)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class ServerClient:
    """An async client of the any server API.

    It speaks HTTP through aiohttp's client, whose cost per request is about a quarter of
    httpx's (docs/benchmarks.md): a daemon's idle CPU is mostly its polls. The session is
    made on the first request, in the event loop that makes it, and again if a later
    request comes from another loop (a test's `asyncio.run` after another)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 10.0,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._proxy: str | None = None
        self._now = now
        self.reach = Reach()
        """Whether the server answers (a 5xx is an answer: this is about reaching it at all)."""

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and self._session_loop is asyncio.get_running_loop():
            await session.close()

    def _http(self) -> aiohttp.ClientSession:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            # A timeout bounds the connect and each wait for bytes, as httpx's did; a large
            # answer that keeps coming is not cut short.
            t = self._timeout
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=t, sock_read=t)
            )
            self._session_loop = loop
            self._proxy = proxy_for(self.base_url)
        return self._session

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
        timeout: float | None = None,  # noqa: ASYNC109 - a per-request timeout (a long poll)
        pace: Pace | None = None,
    ) -> Any:
        try:
            data = None if body is None else encode(body)
        except (TypeError, ValueError) as exc:  # a NaN, a lone surrogate (a UnicodeError)
            raise Unsendable(f"{exc.__class__.__name__}: {exc}") from exc
        import aiohttp

        session = self._http()
        wait = None
        if timeout is not None:
            wait = aiohttp.ClientTimeout(total=None, connect=timeout, sock_read=timeout)
        try:
            async with session.request(
                method,
                self.base_url + path,
                data=data,
                params=params,
                headers=JSON_HEADERS if data is not None else None,
                proxy=self._proxy,
                timeout=wait if wait is not None else session.timeout,
            ) as resp:
                status = resp.status
                content = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = f"{self.base_url}: {_unreached(exc)}"
            if self.reach.unreachable_since is None:
                self.reach.unreachable_since = self._now()
            self.reach.error = error
            raise ServerUnavailable(error) from exc
        self.reach.unreachable_since = self.reach.error = None
        if status >= 500:
            raise ServerUnavailable(f"{self.base_url}{path}: server error {status}")
        if pace is not None and len(content) > PACED_BYTES:
            await pace.clear_of()
        try:
            payload = json.loads(content)
        except ValueError:  # not JSON, or not UTF-8
            payload = None
        if status >= 400:
            text = content.decode("utf-8", "replace")
            err = payload.get("error") if isinstance(payload, dict) else None
            code = str(err.get("code", "error")) if isinstance(err, dict) else "error"
            message = str(err.get("message", text)) if isinstance(err, dict) else text
            raise ServerError(status, code, message)
        return payload

    # spaces, types, bundles

    async def spaces(self) -> list[dict[str, str]]:
        body = await self._call("GET", "/v1/spaces")
        return list(body["spaces"])

    async def types(self, space: str, *, include_hidden: bool = True) -> list[dict[str, Any]]:
        params = {"includeHidden": "true"} if include_hidden else None
        body = await self._call("GET", f"/v1/spaces/{quote(space, safe='')}/types", params=params)
        return list(body["types"])

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
        body = await self._call(
            "POST",
            f"/v1/spaces/{quote(space, safe='')}/types",
            {
                "key": key,
                "name": name or key,
                "hidden": hidden,
                "idRule": id_rule,
                "dynamic": dynamic,
            },
        )
        return str(body["id"])

    async def child(self, space: str, bundle: str, seed: str, type_id: str | None = None) -> str:
        """Return the object id of the bundle child for `seed` (resolved idempotently)."""
        payload: dict[str, Any] = {"seed": seed}
        if type_id is not None:
            payload["type"] = type_id
        body = await self._call(
            "POST",
            f"/v1/spaces/{quote(space, safe='')}/bundles/{quote(bundle, safe='')}/children",
            payload,
        )
        return str(body["objectId"])

    async def datasets(self, space: str) -> list[dict[str, Any]]:
        body = await self._call("GET", f"/v1/spaces/{quote(space, safe='')}/datasets")
        return list(body["datasets"])

    # records

    async def upsert(self, where: Dataset, writes: Iterable[Upsert]) -> dict[str, int]:
        """Write fields of records (field-level merge); return each id's new version."""
        writes = list(writes)
        if not writes:
            return {}
        if all(not w.unset and w.if_version is None for w in writes):
            records: list[dict[str, Any]] = [{"id": w.id, "fields": dict(w.fields)} for w in writes]
            body = await self._call(
                "POST",
                self._space_path(where, "upsert"),
                {**self._where(where), "records": records},
            )
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
            body = await self._call(
                "POST", self._space_path(where, "modify"), {**self._where(where), "records": mods}
            )
        try:
            return {str(r["id"]): int(r["version"]) for r in body["records"]}
        except (KeyError, TypeError, ValueError) as exc:
            # Not the any server's answer (a proxy's page, say): the write may not have
            # happened, and an upsert may be sent again.
            raise ServerUnavailable(
                f"{self.base_url}: the answer to a write is not the any server's ({exc!r})"
            ) from exc

    async def replace(self, where: Dataset, record_id: str, value: Mapping[str, Any]) -> int:
        """Replace a whole record (creating it when missing); return its new version."""
        body = await self._call(
            "POST",
            self._space_path(where, "modify"),
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
        body = await self._call("POST", self._space_path(where, "query"), payload)
        nxt = body.get("next")
        return list(body["records"]), (str(nxt) if nxt else None)

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
        body = await self._call(
            "POST", self._space_path(where, "delete"), {**self._where(where), "ids": list(ids)}
        )
        return [str(i) for i in body["deleted"]]

    async def changes(
        self, space: str, since: int, wait: float = 0.0, *, pace: Pace | None = None
    ) -> ChangePage | None:
        """Return changes after `since` (long-polling up to `wait` s); None if there is no feed.
        A large page waits for `pace` before it is decoded."""
        try:
            body = await self._call(
                "GET",
                f"/v1/spaces/{quote(space, safe='')}/changes",
                params={"since": since, "wait": wait},
                timeout=wait + 10.0,
                pace=pace,
            )
        except ServerError as exc:
            if exc.status == 404 and exc.code in ("not_found", "error", "no_route"):
                return None
            raise
        changes = [
            Change(
                seq=int(c["seq"]),
                object_id=str(c.get("objectId", "")),
                dataset=str(c.get("dataset", "")),
                id=str(c.get("id", "")),
                op=str(c.get("op", "")),
                record=c.get("record"),
            )
            for c in body.get("changes", [])
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
        return DevicesView(
            self_id=str(body.get("self", "")),
            active=dict(body.get("active") or {}),
            devices=[_device_row(r) for r in body.get("devices", [])],
        )

    async def register(self, app: str, version: str, *, name: str = "", os: str = "") -> DeviceRow:
        body = await self._call(
            "PUT", "/v1/devices/me", {"name": name, "os": os, "apps": {app: {"version": version}}}
        )
        return _device_row(body)

    async def activate(self, app: str) -> DeviceRow:
        return _device_row(await self._call("POST", "/v1/devices/activate", {"app": app}))

    async def prune(self, peer_id: str) -> None:
        await self._call("DELETE", f"/v1/devices/{quote(peer_id, safe='')}")

    # helpers

    @staticmethod
    def _space_path(where: Dataset, verb: str) -> str:
        return f"/v1/spaces/{quote(where.space, safe='')}/{verb}"

    @staticmethod
    def _where(where: Dataset) -> dict[str, Any]:
        return {"objectId": where.object_id, "dataset": where.name}


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
