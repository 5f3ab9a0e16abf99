"""RFC 9457 problem details: the one implementation every Tenure HTTP process uses.

Each problem type is a relative URI under /problems/ that the process itself serves, so a client
(or a person at 3 a.m.) can dereference the `type` of an error and read what it means. A process
builds its catalog from `ProblemType`s (`ProblemCatalog`), raises `Problem` anywhere in a
handler, and installs the handlers once (`install_problem_handlers`): validation errors, unknown
routes, authentication failures and even an unexpected exception all answer problem+json, never
a bare 500 text page.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.common.auth import AuthError

__all__ = [
    "COMMON_PROBLEMS",
    "PROBLEM_JSON",
    "Problem",
    "ProblemCatalog",
    "ProblemType",
    "install_problem_handlers",
]

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("tenure.http")


@dataclass(frozen=True)
class ProblemType:
    slug: str
    title: str
    status: int
    meaning: str


class Problem(Exception):
    """Raise to answer with problem `slug`; `extensions` become members of the body."""

    def __init__(
        self,
        slug: str,
        detail: str,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.slug = slug
        self.detail = detail
        self.status = status
        self.headers = dict(headers or {})
        self.extensions = extensions


# What every Tenure HTTP process can answer, whatever its own catalog adds.
COMMON_PROBLEMS: tuple[ProblemType, ...] = (
    ProblemType(
        "validation-failed",
        "The request is not valid",
        422,
        "A field is missing, has the wrong type or is out of range; see `errors`.",
    ),
    ProblemType(
        "malformed-request",
        "The request body is not acceptable JSON",
        400,
        "The body must be one UTF-8 JSON document with no duplicate keys and no lone surrogate "
        "escapes (\\ud800-\\udfff); `detail` says where it is wrong.",
    ),
    ProblemType(
        "payload-too-large",
        "The request body is too large",
        413,
        "Bodies are limited (TENURE_MAX_BODY_BYTES); nothing was recorded.",
    ),
    ProblemType(
        "unauthenticated",
        "Missing or unknown API key",
        401,
        "Send `Authorization: Bearer <api key>` with a key this deployment knows.",
    ),
    ProblemType(
        "forbidden",
        "Your role may not do this",
        403,
        "The caller's role does not allow this action; `detail` names the role it needs.",
    ),
    ProblemType("not-found", "No such resource", 404, "The path does not name a resource."),
    ProblemType("method-not-allowed", "Method not allowed", 405, "The path exists; the method does not."),
    ProblemType(
        "unavailable",
        "A dependency is unavailable",
        503,
        "Kafka or another dependency is not reachable right now; retry after `Retry-After` seconds.",
    ),
    ProblemType("http-error", "HTTP error", 400, "A generic HTTP error."),
    ProblemType(
        "internal-error",
        "An unexpected error",
        500,
        "Tenure failed in a way it did not foresee; nothing is known to be recorded. The error "
        "is logged with the request's path; please report it.",
    ),
)


class ProblemCatalog:
    """The problem types one process answers with, by slug."""

    def __init__(self, *groups: Iterable[ProblemType]) -> None:
        self._types: dict[str, ProblemType] = {}
        for group in (*groups, COMMON_PROBLEMS):  # a process's own wording wins
            for problem in group:
                self._types.setdefault(problem.slug, problem)

    def __contains__(self, slug: object) -> bool:
        return slug in self._types

    def __getitem__(self, slug: str) -> ProblemType:
        return self._types[slug]

    def get(self, slug: str) -> ProblemType | None:
        return self._types.get(slug)

    def slugs(self) -> list[str]:
        return sorted(self._types)

    def body(
        self, slug: str, detail: str, instance: str | None = None, status: int | None = None, **ext: Any
    ) -> dict[str, Any]:
        problem = self._types.get(slug) or self._types["http-error"]
        body: dict[str, Any] = {
            "type": f"/problems/{slug}",
            "title": problem.title,
            "status": status or problem.status,
            "detail": detail,
        }
        if instance:
            body["instance"] = instance
        body.update(ext)
        return body

    def response(
        self,
        slug: str,
        detail: str,
        instance: str | None = None,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        **ext: Any,
    ) -> JSONResponse:
        body = self.body(slug, detail, instance, status, **ext)
        headers = dict(headers or {})
        if body["status"] == 503 and "Retry-After" not in headers:
            headers["Retry-After"] = "1"
        return JSONResponse(body, status_code=body["status"], media_type=PROBLEM_JSON, headers=headers)

    def describe(self, slug: str) -> dict[str, Any] | None:
        problem = self._types.get(slug)
        if problem is None:
            return None
        return {
            "type": f"/problems/{slug}",
            "title": problem.title,
            "status": problem.status,
            "meaning": problem.meaning,
        }


def install_problem_handlers(app: FastAPI, catalog: ProblemCatalog, *, serve_types: bool = True) -> None:
    """Every error of `app` answers problem+json from `catalog`; `/problems/{slug}` documents them."""

    @app.exception_handler(Problem)
    async def on_problem(request: Request, exc: Problem) -> JSONResponse:
        return catalog.response(
            exc.slug, exc.detail, str(request.url.path), exc.status, exc.headers, **exc.extensions
        )

    @app.exception_handler(AuthError)
    async def on_auth(request: Request, exc: AuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.slug == "unauthenticated" else None
        return catalog.response(exc.slug, exc.detail, str(request.url.path), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "location": [str(p) for p in e.get("loc", ())],
                "message": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"location": [], "message": "invalid request"}
        where = ".".join(first["location"])
        return catalog.response(
            "validation-failed", f"{where}: {first['message']}", str(request.url.path), errors=errors
        )

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug = {404: "not-found", 405: "method-not-allowed", 413: "payload-too-large"}.get(
            exc.status_code, "http-error"
        )
        return catalog.response(slug, str(exc.detail), str(request.url.path), status=exc.status_code)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error(
            "unexpected error answering %s %s",
            request.method,
            request.url.path,
            exc_info=exc,
            extra={"fields": {"path": request.url.path}},
        )
        return catalog.response(
            "internal-error", f"{type(exc).__name__} while answering the request", str(request.url.path)
        )

    if serve_types:

        @app.get("/problems/{slug}", summary="What a problem type means", tags=["problems"])
        async def describe_problem(slug: str) -> Any:
            described = catalog.describe(slug)
            if described is None:
                raise Problem("not-found", f"no problem type {slug!r}")
            return described
