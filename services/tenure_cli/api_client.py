"""What every `tenure` command that goes through the command API shares: the call, its flags, and
how an answer is printed.

The API is `--api` (alias `--api-url`), else TENURE_CLI_API_URL, else the API this deployment
serves; the key is `--api-key`, else TENURE_CLI_API_KEY. A problem answer (RFC 9457) becomes
`HTTP <status> <type>: <detail>` and exit 1; a 202 (accepted, not yet decided) is said on stderr.
Output follows kubectl: `-o table` (the default, for people), `-o json` and `-o yaml` (the API's
body as it came, for scripts), `-o name` (each object's id, one per line, for shell variables).
Times in tables are RFC 3339 in UTC.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import yaml

from services.common.auth import bearer
from services.common.settings import TenureSettings
from services.common.times import rfc3339_or_none
from services.tenure_cli.readiness import probe_host

__all__ = [
    "OUTPUTS",
    "add_api_options",
    "api_target",
    "call",
    "duration",
    "open_client",
    "output_format",
    "rfc3339",
    "show",
    "table",
]

OUTPUTS = ("table", "json", "yaml", "name")
# `-o name` prints what names each object, one per line (kubectl's), for `RUN=$(tenure ...)`.
_NAME_FIELDS = ("runId", "incidentId", "scheduleId", "endpoint", "attemptId")


def open_client(base_url: str, timeout_s: float) -> httpx.Client:
    """The HTTP client of one command (tests replace this with the in-process API's)."""
    return httpx.Client(base_url=base_url, timeout=timeout_s)


def output_format(text: str) -> str:
    """An `-o` value: one of OUTPUTS, or `jsonpath=` with a path such as `{.lease.attemptId}`."""
    if text in OUTPUTS:
        return text
    if text.startswith("jsonpath="):
        _path_steps(text.removeprefix("jsonpath="))  # refuses a malformed path now, not later
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: use {', '.join(OUTPUTS)} or jsonpath={{.field}}")


_STEP = re.compile(r"([^.\[\]]+)|\[(\d{1,9})\]")


def _path_steps(expression: str) -> list[str | int]:
    """`{.items[0].runId}` (kubectl's braces and leading dot optional) as keys and indexes."""
    body = expression.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    body = body.removeprefix(".")
    steps: list[str | int] = []
    at = 0
    while at < len(body):
        if body[at] == ".":
            at += 1
            continue
        match = _STEP.match(body, at)
        if match is None:
            raise argparse.ArgumentTypeError(f"jsonpath {expression!r}: cannot read it at {body[at:]!r}")
        steps.append(match.group(1) if match.group(1) is not None else int(match.group(2)))
        at = match.end()
    if not steps:
        raise argparse.ArgumentTypeError(f"jsonpath {expression!r} names no field")
    return steps


def _at_path(body: Any, steps: list[str | int]) -> Any:
    value = body
    for step in steps:
        indexed = isinstance(step, int) and isinstance(value, list) and step < len(value)
        keyed = isinstance(step, str) and isinstance(value, Mapping) and step in value
        if not (indexed or keyed):
            return None
        value = value[step]
    return value


def add_api_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """`-o`, `--api` and `--api-key`, accepted on a resource and on each of its verbs.

    Given on `tenure runs` or on `tenure runs list`: below the top level there is no default,
    so a verb's parser never overwrites what the top level parsed."""
    default: Any = argparse.SUPPRESS
    parser.add_argument(
        "-o",
        "--output",
        type=output_format,
        default="table" if top else default,
        help="table, json, yaml, name, or jsonpath={.field.sub[0]} (one value per line)",
    )
    parser.add_argument(
        "--api",
        "--api-url",
        dest="api_url",
        default=None if top else default,
        help="the API's base URL (default TENURE_CLI_API_URL, else this deployment's)",
    )
    parser.add_argument(
        "--api-key", default=None if top else default, help="the key to present (default TENURE_CLI_API_KEY)"
    )


def api_target(args: argparse.Namespace, settings: TenureSettings | None = None) -> tuple[str, str]:
    """The API's base URL and key: --api/--api-key, else TENURE_CLI_API_URL/_KEY, else the local API."""
    settings = settings or TenureSettings()
    base = (
        getattr(args, "api_url", None)
        or settings.cli_api_url
        or f"http://{probe_host(settings.api_host)}:{settings.api_port}"
    )
    given = getattr(args, "api_key", None)
    return base, settings.cli_api_key if given is None else given


def call(
    args: argparse.Namespace,
    method: str,
    path: str,
    body: Mapping[str, Any] | None = None,
    *,
    params: Mapping[str, Any] | None = None,
) -> Any:
    """One request to the API; the decoded answer, or RuntimeError with the problem's words."""
    settings = TenureSettings()
    base, key = api_target(args, settings)
    headers = {"Accept": "application/json, application/problem+json", **bearer(key)}
    if getattr(args, "idempotency_key", None):
        headers["Idempotency-Key"] = args.idempotency_key
    query = {k: v for k, v in (params or {}).items() if v is not None}
    http = open_client(base, settings.decision_timeout_s + 5.0)
    try:
        response = http.request(method, path, json=body, headers=headers, params=query or None)
    except httpx.TransportError as exc:
        raise RuntimeError(f"cannot reach the API at {base}: {exc}") from exc
    finally:
        http.close()
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    if response.status_code >= 400:
        kind = str(answer.get("type") or "").rsplit("/", 1)[-1] if isinstance(answer, dict) else ""
        detail = answer.get("detail") if isinstance(answer, dict) else None
        raise RuntimeError(f"HTTP {response.status_code} {kind or 'error'}: {detail or response.text[:300]}")
    if response.status_code == 202:
        print(f"accepted, not yet decided: {answer.get('detail', '')}", file=sys.stderr)
    return answer


def show(args: argparse.Namespace, body: Any, render: Callable[[Any], str]) -> int:
    """Print `body` as the `-o` flag asks: `render` for tables, the body itself otherwise."""
    output = getattr(args, "output", "table")
    if output == "json":
        print(json.dumps(body, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(body, sort_keys=False, allow_unicode=True).rstrip())
    elif output.startswith("jsonpath="):
        value = _at_path(body, _path_steps(output.removeprefix("jsonpath=")))
        if value is None:
            raise RuntimeError(f"{output}: the answer has no such field")
        print(value if isinstance(value, str | int | float) else json.dumps(value))
    elif output == "name":
        items = body.get("items") if isinstance(body, Mapping) and "items" in body else [body]
        for item in items or []:
            print(_name_of(item))
    else:
        print(render(body))
    return 0


def _name_of(item: Any) -> str:
    if isinstance(item, Mapping):
        for field in _NAME_FIELDS:
            if item.get(field):
                return str(item[field])
    return json.dumps(item)


def rfc3339(value: Any) -> str:
    """An epoch-millisecond time (the views' and the records' fields) as RFC 3339 in UTC; a text
    that already is one passes through; nothing is "-"."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return rfc3339_or_none(value) or f"{value} ms (beyond year 9999)"
    return str(value) if value else "-"


def duration(ms: Any) -> str:
    """Milliseconds for people: 250 ms, 1.5s, 2m05s."""
    if not isinstance(ms, int) or isinstance(ms, bool):
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:g}s"
    return f"{ms // 60_000}m{(ms % 60_000) // 1000:02d}s"


def table(rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, three spaces apart (kubectl's look)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
