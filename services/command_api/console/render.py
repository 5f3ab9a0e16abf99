"""The console's Jinja2 environment (autoescape on for every template), its filters, its static
files, and the headers every console response carries.

Security headers: a Content-Security-Policy that allows scripts, styles and fetches from this
origin only and no inline script at all, so markup that slipped through escaping still could not
run; no framing (clickjacking), no referrer (a run id in the URL stays here), no MIME sniffing,
and no caching of pages that show data.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from services.common.times import rfc3339_or_none

__all__ = ["SECURITY_HEADERS", "STATIC", "html", "render", "rfc3339", "static_file"]

_HERE = Path(__file__).parent
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
        "form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# The only files /ui/static/ serves (no path from the request ever reaches the file system).
_MEDIA_TYPES = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}
STATIC: dict[str, bytes] = {name: (_HERE / "static" / name).read_bytes() for name in _MEDIA_TYPES}
# Changes whenever a static file does, so a browser never runs an old script with a new page.
_STATIC_VERSION = hashlib.sha256(b"".join(STATIC[n] for n in sorted(STATIC))).hexdigest()[:12]


def rfc3339(value: Any) -> str:
    """Epoch milliseconds as RFC 3339 UTC (2026-01-31T12:00:00.000Z); text is shown as it is."""
    if value is None or value == "" or isinstance(value, bool):
        return "—" if value is None or value == "" else str(value)
    if isinstance(value, (int, float)):
        if value <= 0:
            return "—"
        return rfc3339_or_none(int(value)) or f"{value} ms (beyond year 9999)"
    return str(value)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _is_time(name: str, value: Any) -> bool:
    """A field that holds epoch ms by the events' naming (occurredAt, expiresAt, notBefore...)."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and (name.endswith("At") or name in ("at", "notBefore", "deadline", "graceUntil"))
    )


def _field(name: str, value: Any) -> str:
    return rfc3339(value) if _is_time(name, value) else _compact(value)


_ENV = Environment(
    loader=FileSystemLoader(_HERE / "templates"),
    autoescape=True,  # every template, whatever its name: all of them are HTML
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters.update(ts=rfc3339, pretty=_pretty, compact=_compact)
_ENV.globals.update(field=_field, static_version=_STATIC_VERSION)


def render(template: str, **context: Any) -> str:
    return _ENV.get_template(template).render(**context)


def html(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(render(template, **context), status_code=status, headers=SECURITY_HEADERS)


def static_file(name: str) -> Response | None:
    body = STATIC.get(name)
    if body is None:
        return None
    headers = {**SECURITY_HEADERS, "Cache-Control": "public, max-age=300"}
    return Response(body, media_type=_MEDIA_TYPES[name], headers=headers)
