"""RFC 3339 beside every epoch-millisecond time the API's JSON views show (issue 17).

The views keep their times as epoch milliseconds (`expiresAt`, `occurredAt`, ...: the SDK, the
CLI, the console and the tests read those), and each integer field whose name ends in `At`
gets a sibling `<x>AtRfc3339` in the same object, the same instant as RFC 3339
(services/common/times.py), at any depth (a run's history entries, a lease, a trajectory's
steps and dispatches, a grant). Durations (`...Ms`) and every other field stay as they are; a
field that already is text (the watchdog's and breakers' views) gets no sibling; nor does a
time with no RFC 3339 text (beyond year 9999), which is never a failure either; nor anything
inside what a caller gave Tenure and gets back as given (OPAQUE_FIELDS).

It is done at ONE point, where answers leave the API: `Rfc3339Siblings`, an ASGI middleware,
rewrites every `application/json` body (the views a route returns, and the JSONResponses some
routes build themselves: grants, 201s, 202 tickets), so no view builder has to remember it and
no route can forget it. The body is parsed once, walked once in place (the parse is the only
copy) and written once, compactly, as Starlette writes it: about 17 µs for a 0.7 kB trajectory
view with 2 times and 74 µs for a 4.4 kB run view with 27 (timeit, docs/benchmarks.md); a
body with no name ending in `At` is not parsed at all. Problem documents
(application/problem+json), the OpenAPI document, an artifact's stored bytes (served under
X-Tenure-Content-Hash, whatever their media type) and every other media type pass untouched.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common import jsonbytes
from services.common.times import rfc3339_or_none

__all__ = ["OPAQUE_FIELDS", "RFC3339_SUFFIX", "Rfc3339Siblings", "add_rfc3339_siblings", "siblings_in_body"]

RFC3339_SUFFIX = "Rfc3339"
# What a caller gave Tenure and gets back as it gave it (a run's spec and labels, a step's params,
# a tool's output, an answer, evidence): no sibling is added anywhere inside these. A runner reads
# its executionSpec from the grant, and a time-like key in it must reach the runner unchanged.
OPAQUE_FIELDS = frozenset(
    {
        "executionSpec",
        "labels",
        "params",
        "arguments",
        "inputs",
        "output",
        "answer",
        "evidence",
        "inputSchema",
    }
)
# Not views: the OpenAPI document's examples are the schemas' own (services/command_api/openapi_doc.py).
_UNTOUCHED_PATHS = frozenset({"/openapi.json"})
# Bytes served as stored, under their content hash (an artifact): never rewritten, JSON or not.
CONTENT_HASH_HEADER = b"x-tenure-content-hash"
# The same instants are shown again and again (a long-polled view, a run's history): each is
# formatted once. 8192 short strings are well under a megabyte.
_text = lru_cache(maxsize=8192)(rfc3339_or_none)


def add_rfc3339_siblings(value: Any) -> Any:
    """`value` (a JSON tree of dicts and lists, as json.loads makes it) with `<x>AtRfc3339`
    added to each object that has an integer `<x>At`, at every depth but inside OPAQUE_FIELDS.

    In place, and returns `value`: give it a tree of your own (a freshly parsed body), never a
    view another reader holds. Each sibling is added after the object's own fields (rebuilding
    every object to put it right after its time cost a run view twice as much). A sibling that
    already is text is kept; one that is null (a model that declares it) is filled. A bool is
    an int to Python and is no time, hence `type(...) is int`."""
    if type(value) is list:
        for item in value:
            kind = type(item)
            if kind is dict or kind is list:
                add_rfc3339_siblings(item)
        return value
    if type(value) is not dict:
        return value
    times: list[tuple[str, int]] | None = None
    for key, item in value.items():
        kind = type(item)
        if kind is int:
            if key.endswith("At") and key != "At":
                if times is None:
                    times = []
                times.append((key, item))
        elif (kind is dict or kind is list) and key not in OPAQUE_FIELDS:
            add_rfc3339_siblings(item)
    if times is not None:
        for key, ms in times:
            sibling = key + RFC3339_SUFFIX
            if type(value.get(sibling)) is not str:
                text = _text(ms)
                if text is not None:
                    value[sibling] = text
    return value


def siblings_in_body(body: bytes) -> bytes:
    """A JSON body with the siblings added; the body as it was when it is not JSON."""
    try:
        return jsonbytes.dumps(add_rfc3339_siblings(jsonbytes.loads(body)))
    except ValueError:  # not JSON after all, or not UTF-8, or an Infinity: not for us to judge
        return body


def _is_view(headers: list[tuple[bytes, bytes]]) -> bool:
    """An application/json answer that is the API's own: not an artifact's stored bytes (GET
    /artifacts/{id} serves them as they were hashed, whatever their media type)."""
    json_body = False
    for name, value in headers:
        name = name.lower()
        if name == b"content-type":
            json_body = value.split(b";", 1)[0].strip().lower() == b"application/json"
        elif name == CONTENT_HASH_HEADER:
            return False
    return json_body


class Rfc3339Siblings:
    """ASGI middleware: every `application/json` answer gets its times' RFC 3339 siblings."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in _UNTOUCHED_PATHS:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def send_with_siblings(message: Message) -> None:
            nonlocal start
            kind = message["type"]
            if kind == "http.response.start" and _is_view(list(message.get("headers", []))):
                start = message  # held until the whole body is known (its length changes)
                return
            if kind != "http.response.body" or start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(chunks)
            # No body (a HEAD: keep its length) or no name ending in At: nothing to parse.
            shown = siblings_in_body(body) if b'At"' in body else body
            if shown is not body:
                headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(shown)).encode("latin-1")))
                start = {**start, "headers": headers}
            await send(start)
            await send({"type": "http.response.body", "body": shown, "more_body": False})

        await self.app(scope, receive, send_with_siblings)
