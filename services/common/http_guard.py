"""The byte-level gate of every Tenure HTTP process: bounded bodies and headers, acceptable JSON.

`HttpGuard` is a pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which buffers and
re-streams responses and breaks streaming). For each HTTP request it

1. checks the bounded headers (`Idempotency-Key`, `X-Correlation-Id`: at most 200 visible ASCII
   characters) -> 422 `validation-failed`;
2. reads the body up to `max_body_bytes`, by Content-Length and by counting a chunked body
   -> 413 `payload-too-large`;
3. parses a non-empty body as one JSON document -> 400 `malformed-request` when it is not
   UTF-8 (no BOM), has a Content-Type other than JSON, has a duplicate key in any object,
   a lone surrogate escape (\\ud800-\\udfff) in any key or string, NaN/Infinity or a number
   too large for a double, or nests deeper than `max_depth`;
4. replays the body it read to the application, unchanged.

So none of these can reach a handler, a codec or Kafka, and nothing is published for them. A
refused request's body is read to its end before the answer (up to `drain_limit` bytes;
beyond, the answer says `Connection: close`), so the client can read the answer and the
keep-alive connection stays usable. Paths in `raw_body_prefixes` (uploads of artifact bytes)
skip 2 and 3: their handlers stream and bound the bytes themselves.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from services.common.problem_json import PROBLEM_JSON, ProblemCatalog

__all__ = ["DEFAULT_BOUNDED_HEADERS", "MAX_JSON_DEPTH", "HttpGuard", "check_json"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Headers whose values become part of recorded commands: bounded, printable ASCII only.
DEFAULT_BOUNDED_HEADERS: Mapping[str, int] = {"idempotency-key": 200, "x-correlation-id": 200}
# Deep enough for any JSON Schema or ExecutionSpec a person writes; shallow enough that no
# recursive consumer (json, jsonschema, pydantic) comes near Python's recursion limit.
MAX_JSON_DEPTH = 64


class _Refusal(Exception):
    def __init__(self, slug: str, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.slug = slug
        self.detail = detail
        self.extensions = extensions
        # Set when the refusal came with the body's last chunk: nothing is left to drain (and
        # asking the server for more would wait for the client to disconnect).
        self.body_done = False


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _Refusal("malformed-request", f"duplicate key {key[:80]!r} in a JSON object")
        obj[key] = value
    return obj


def _no_constant(name: str) -> Any:
    raise _Refusal("malformed-request", f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refusal("malformed-request", f"the number {text[:40]} is too large for a double")
    return value


def _utf8(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Refusal("malformed-request", f"a lone surrogate escape (\\ud800-\\udfff) in {where}") from None


def _walk(document: Any, max_depth: int) -> None:
    """Every key and string is encodable UTF-8; no nesting deeper than `max_depth` (iterative)."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _utf8(value, "a string")
        elif isinstance(value, dict | list):
            if depth > max_depth:
                raise _Refusal("malformed-request", f"the JSON nests deeper than {max_depth} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    _utf8(key, "an object key")
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)


def check_json(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The parsed document, or `_Refusal` (malformed-request) saying what is wrong with it."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Refusal("malformed-request", f"the body is not UTF-8 (byte {exc.start})") from None
    try:
        document = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite
        )
    except _Refusal:
        raise
    except json.JSONDecodeError as exc:
        raise _Refusal("malformed-request", f"the body is not JSON: {exc.msg} at {exc.pos}") from None
    except RecursionError:
        raise _Refusal("malformed-request", f"the JSON nests deeper than {max_depth} levels") from None
    except ValueError as exc:  # e.g. an integer literal longer than Python converts (4300 digits)
        raise _Refusal("malformed-request", f"the body is not acceptable JSON: {exc}"[:300]) from None
    _walk(document, max_depth)
    return document


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return True  # no declaration: it must still be JSON to reach a JSON route
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class HttpGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        catalog: ProblemCatalog,
        max_body_bytes: int,
        raw_body_prefixes: Iterable[str] = (),
        bounded_headers: Mapping[str, int] = DEFAULT_BOUNDED_HEADERS,
        max_depth: int = MAX_JSON_DEPTH,
        drain_limit: int | None = None,
    ) -> None:
        self.app = app
        self.catalog = catalog
        self.max_body_bytes = max_body_bytes
        self.raw_body_prefixes = tuple(raw_body_prefixes)
        self.bounded_headers = {name.lower(): limit for name, limit in bounded_headers.items()}
        self.max_depth = max_depth
        # How much of a refused body is read and dropped so the connection stays usable.
        self.drain_limit = drain_limit if drain_limit is not None else max(16 * max_body_bytes, 16 << 20)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[str, list[bytes]] = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name.decode("latin-1").lower(), []).append(value)
        try:
            self._check_headers(headers)
        except _Refusal as refusal:
            await self._refuse(scope, receive, send, refusal, body_done=False)
            return
        path = str(scope.get("path", ""))
        if path.startswith(self.raw_body_prefixes):
            await self.app(scope, receive, send)
            return
        try:
            body, complete = await self._read_body(headers, receive)
        except _Refusal as refusal:
            await self._refuse(scope, receive, send, refusal, body_done=refusal.body_done)
            return
        if not complete:
            return  # the client went away mid-body: nobody to answer
        if body:
            try:
                content_types = headers.get("content-type")
                declared = content_types[0].decode("latin-1") if content_types else None
                if declared is not None and not _is_json(declared):
                    raise _Refusal(
                        "malformed-request", f"the body must be application/json, not {declared[:80]!r}"
                    )
                check_json(body, self.max_depth)
            except _Refusal as refusal:
                await self._refuse(scope, receive, send, refusal, body_done=True)
                return
        await self.app(scope, _replay(body, receive), send)

    def _check_headers(self, headers: Mapping[str, list[bytes]]) -> None:
        for name, limit in self.bounded_headers.items():
            for value in headers.get(name, ()):
                if len(value) > limit or any(b < 0x20 or b > 0x7E for b in value):
                    raise _Refusal(
                        "validation-failed",
                        f"header {name}: at most {limit} printable ASCII characters",
                        errors=[
                            {
                                "location": ["header", name],
                                "message": f"at most {limit} printable ASCII characters",
                                "type": "header_invalid",
                            }
                        ],
                    )

    async def _read_body(self, headers: Mapping[str, list[bytes]], receive: Receive) -> tuple[bytes, bool]:
        declared = headers.get("content-length", [])
        if declared and declared[0].isdigit() and int(declared[0]) > self.max_body_bytes:
            raise self._too_large(f"Content-Length {int(declared[0])}")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", False
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                refusal = self._too_large(f"more than {self.max_body_bytes} bytes")
                refusal.body_done = not message.get("more_body", False)
                raise refusal
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), True

    def _too_large(self, what: str) -> _Refusal:
        return _Refusal(
            "payload-too-large",
            f"the body ({what}) is larger than the limit of {self.max_body_bytes} bytes; "
            "nothing was recorded",
            maxBodyBytes=self.max_body_bytes,
        )

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, refusal: _Refusal, *, body_done: bool
    ) -> None:
        keep_alive = body_done or await self._drain(receive)
        path = str(scope.get("path", ""))
        body = self.catalog.body(refusal.slug, refusal.detail, path, **refusal.extensions)
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        response_headers = [
            (b"content-type", PROBLEM_JSON.encode()),
            (b"content-length", str(len(payload)).encode()),
        ]
        if not keep_alive:
            response_headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": body["status"], "headers": response_headers})
        await send({"type": "http.response.body", "body": payload, "more_body": False})

    async def _drain(self, receive: Receive) -> bool:
        """Read and drop the rest of the body; False when it is too long to wait for."""
        drained = 0
        while drained <= self.drain_limit:
            message = await receive()
            if message["type"] == "http.disconnect":
                return False
            drained += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
        return False


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the application the body already read, then the real channel."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
