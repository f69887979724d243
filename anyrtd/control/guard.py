"""What keeps the control API to its owner: loopback `Host`, no cross-site writes, a bearer token.

A web page in the user's browser can send requests to 127.0.0.1. Two tricks are
closed here: DNS rebinding (a foreign name that resolves to 127.0.0.1, caught by
the `Host` check) and cross-site writes (a page POSTing a form or text/plain,
caught by the `Origin`, `Sec-Fetch-Site` and content-type checks). A bodiless
`curl -X POST` carries none of these marks and works. Every route refuses a body over
256 KiB (413) or one that takes over 10 s to arrive (408), and a request the HTTP parser
cannot take (no `Host` in HTTP/1.1, say) gets aiohttp's plain 400 and one warning line,
not a traceback (`PROTOCOL_LOG`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from anyrtd.address import is_loopback_host, split_host_header

log = logging.getLogger("anyrtd.control")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MUTATING = frozenset({"POST", "PATCH", "PUT", "DELETE"})
MAX_BODY = 256 * 1024
"""The largest request body any route takes, in bytes (the app's `client_max_size` too)."""
BODY_TIMEOUT_S = 10.0
"""How long a request's body may take to arrive, once its head has."""
ORIGIN = re.compile(
    r"(?P<scheme>https?)://(?P<host>\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?",
    re.ASCII | re.IGNORECASE,
)
"""An `Origin` as a browser serialises one: scheme, host and port, nothing more."""


@dataclass(frozen=True)
class Guard:
    """The listener's safety settings: the bearer token (TCP only) and extra allowed host names."""

    token: str | None = None
    unix: bool = False
    extra_hosts: frozenset[str] = frozenset()


GUARD = web.AppKey("guard", Guard)
PUBLIC_MARK = "anyrtd_public"


def public(handler: Handler) -> Handler:
    """Mark a GET handler whose answer is the same for everyone and holds no data: no token."""
    setattr(handler, PUBLIC_MARK, True)
    return handler


def _is_public(request: web.Request) -> bool:
    return (
        request.method in ("GET", "HEAD")
        and getattr(request.match_info.handler, PUBLIC_MARK, False) is True
    )


def error_response(status: int, code: str, message: str) -> web.Response:
    """Return the error body every route uses: `{"error": {"code", "message"}}`."""
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def _origin_is_local(origin: str, extra_hosts: frozenset[str]) -> bool:
    """Return whether `origin` is `scheme://host[:port]` naming this machine; refuse the rest.

    This machine is a loopback name or address, or the listener's own address. A browser
    sends nothing else (an opaque origin is `null`), so anything else (user info, a path,
    a backslash) is refused rather than guessed at: URL parsers disagree on where the
    host of `http://evil.example\\@127.0.0.1` is.
    """
    match = ORIGIN.fullmatch(origin.strip())
    if match is None:
        return False
    port = match.group("port")
    if port is not None and not 0 < int(port) <= 65535:
        return False
    host = match.group("host")
    return is_loopback_host(host) or host.lower() in extra_hosts


def _is_json(content_type: str) -> bool:
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


def refusal(request: web.Request, guard: Guard) -> web.Response | None:
    """Return the refusal for a request the listener must not answer, or None."""
    if not guard.unix:
        if "Host" not in request.headers:  # HTTP/1.0 may leave it out
            return error_response(
                400,
                "bad_request",
                "the request has no Host header: address it to localhost, 127.0.0.1 or [::1]",
            )
        raw_host = request.headers["Host"]
        host = split_host_header(raw_host).lower()
        if not (is_loopback_host(host) or host in guard.extra_hosts):
            return error_response(
                403,
                "forbidden_host",
                f"Host {raw_host!r} is not a loopback name: the control API answers only "
                "requests addressed to localhost, 127.0.0.1 or [::1]",
            )
        if guard.token is not None and not _is_public(request):
            sent = request.headers.get("Authorization", "")
            scheme, _, value = sent.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                value.strip().encode(), guard.token.encode()
            ):
                response = error_response(
                    401,
                    "unauthorized",
                    "this control API needs `Authorization: Bearer <token>`; the token is in "
                    "the file named by token_file in the daemon's config",
                )
                response.headers["WWW-Authenticate"] = 'Bearer realm="anyrtd"'
                return response
    if request.method not in MUTATING:
        return None
    origin = request.headers.get("Origin")
    if origin is not None and not _origin_is_local(origin, guard.extra_hosts):
        return error_response(
            403,
            "cross_origin",
            f"Origin {origin!r} is not this machine: the control API takes changes only "
            "from local tools (curl, the anyrtd CLI), not from web pages",
        )
    if request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
        return error_response(
            403,
            "cross_site",
            "a cross-site request (Sec-Fetch-Site: cross-site) cannot change triggers",
        )
    has_body = (
        bool(request.content_length)
        or "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    )
    if "Content-Type" in request.headers or has_body:
        content_type = request.content_type.lower()
        if has_body and not _is_json(content_type):
            return error_response(
                415,
                "unsupported_media_type",
                f"a body of type {content_type or 'unknown'} is not accepted: send JSON with "
                "`Content-Type: application/json`, or no body at all",
            )
        if (
            not has_body
            and content_type not in ("", "application/octet-stream")
            and not _is_json(content_type)
        ):
            return error_response(
                415,
                "unsupported_media_type",
                f"Content-Type {content_type} is not accepted: send JSON or no body at all",
            )
    return None


def _too_large(size: int | None) -> web.Response:
    sent = f" (this one is {size} bytes)" if size is not None else ""
    response = error_response(
        413, "too_large", f"a request body over 256 KiB ({MAX_BODY} bytes) is not accepted{sent}"
    )
    response.force_close()  # the rest of the body is not read
    return response


def _too_slow() -> web.Response:
    response = error_response(
        408,
        "request_timeout",
        f"the request body did not arrive within {BODY_TIMEOUT_S:g} s; send it whole and retry",
    )
    response.force_close()
    return response


async def body_refusal(request: web.Request) -> web.Response | None:
    """Return a 413 for a body over `MAX_BODY`, on every route, whether a handler reads it or
    not, and a 408 for a body that does not arrive within `BODY_TIMEOUT_S`.

    A body is read here, whole, up to the limit; the handler then reads it from memory.
    """
    size = request.content_length
    if size is not None:
        if size > MAX_BODY:
            return _too_large(size)
        if size == 0:
            return None
    elif "chunked" not in request.headers.get("Transfer-Encoding", "").lower():
        return None
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            body = await request.read()  # bounded by the app's client_max_size
    except web.HTTPRequestEntityTooLarge:
        return _too_large(None)
    except TimeoutError:
        return _too_slow()
    except ConnectionResetError:  # the client went away mid-body: nobody reads an answer
        response = error_response(400, "bad_request", "the connection closed mid-body")
        response.force_close()
        return response
    return _too_large(len(body)) if len(body) > MAX_BODY else None


@web.middleware
async def guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse what the guard refuses before any handler runs."""
    refused = refusal(request, request.app[GUARD])
    if refused is None:  # only then read a body: not for a request already refused
        refused = await body_refusal(request)
    if refused is not None:
        return refused
    return await handler(request)


class _MalformedRequestFilter(logging.Filter):
    """Log a request the HTTP parser refused as one warning line instead of a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and record.levelno >= logging.ERROR:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg = "control API: refused a malformed request from %s: %s %s"
            record.args = (remote, exc.code, exc.message.strip())
            record.exc_info = record.exc_text = None
        return True


PROTOCOL_LOG = logging.getLogger("anyrtd.control.http")
"""The logger to give the control API's `AppRunner`: aiohttp logs its protocol errors here."""
PROTOCOL_LOG.addFilter(_MalformedRequestFilter())


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into a JSON error body; never answer 500."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.content_type == "application/json":
            raise
        text = exc.text or exc.reason
        if exc.status == 404:
            text = f"no route {request.method} {request.path}: see GET /openapi.json"
        elif exc.status == 405:
            text = f"{request.method} is not allowed on {request.path}: see GET /openapi.json"
        response = error_response(exc.status, _code(exc.status), text.strip())
        for header in ("Allow", "WWW-Authenticate"):
            if header in exc.headers:
                response.headers[header] = exc.headers[header]
        return response
    except Exception as exc:  # the last guard: no request may produce a 500
        log.exception("control API: %s %s failed", request.method, request.path)
        return error_response(
            503,
            "internal",
            f"the daemon could not answer ({exc.__class__.__name__}); see its log and retry",
        )


def _code(status: int) -> str:
    return {
        400: "bad_request",
        401: "unauthorized",
        403: "forbidden",
        404: "not_found",
        405: "method_not_allowed",
        409: "conflict",
        413: "too_large",
        415: "unsupported_media_type",
    }.get(status, "error")
