"""The OpenAPI document as a client generator needs it, built from the app's own routes.

FastAPI writes the paths, parameters and body schemas. What it cannot know is added here, once,
from the same sources the API answers from:

* **Problems.** Every operation declares the RFC 9457 answers it can give, as
  `application/problem+json` with the `Problem` schema and an example from the problem catalog
  (the wording the API really sends); FastAPI's own 422 `HTTPValidationError`, which this API
  never sends, is replaced. Each status lists the problem types it can carry.
* **Security.** `bearerAuth` (an API key from TENURE_API_KEYS as a bearer token), required on
  every route but the public ones (health, problem types), so the docs page has an Authorize
  button; a test sends every operation without a key and checks the document says which
  answer 401.
* **Stable operationIds**: the route function's name (`submit_run`, `claim_run`), set by
  `operation_id` below at app construction; a test keeps them unique and unchanged.
* **Required headers**: an Idempotency-Key that the route refuses to go without.
* **Retry-After** on every 503.
* **Typed 2xx answers with examples** for every operation (responses.py, keyed by operationId):
  documentation only, so no answer changes shape or costs more to send.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from services.command_api.responses import install_responses
from services.common.problem_json import PROBLEM_JSON, ProblemCatalog

__all__ = ["PROBLEM_SCHEMA", "install_openapi", "operation_id"]

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Problem",
    "description": "RFC 9457 problem details; GET the `type` URL for what it means.",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "example": "/problems/run-not-found"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "instance": {"type": "string", "description": "The request path."},
        "code": {"type": "string", "description": "The aggregate's rejection code, when one decided."},
        "retryAfterSeconds": {"type": "integer", "description": "With 503: when to retry."},
    },
    "additionalProperties": True,
}
_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
# What any route can answer: the HTTP guard's refusals, validation, outages, the unforeseen.
_EVERY_ROUTE = (400, 422, 500, 503)
_AUTHENTICATED = (401, 403)
# Which routes a body can be refused on for its size.
_WITH_BODY = {"post", "put", "patch"}
# Routes that refuse to act without an Idempotency-Key (they answer idempotency-key-required);
# the others take one to make a repeat safe (create_schedule makes up a key when none is sent).
_KEY_REQUIRED = {"submit_run"}


def operation_id(route: APIRoute) -> str:
    """The route function's name: stable while the code is, and readable in generated clients."""
    return route.name


def _problem_response(catalog: ProblemCatalog, status: int, slugs: list[str]) -> dict[str, Any]:
    example_slug = slugs[0] if slugs else "http-error"
    example = catalog.body(example_slug, catalog[example_slug].title if example_slug in catalog else "")
    response: dict[str, Any] = {
        "description": "Problem: " + (", ".join(f"`{s}`" for s in slugs) if slugs else "an HTTP error"),
        "content": {PROBLEM_JSON: {"schema": _PROBLEM_REF, "example": example}},
    }
    if status == 503:
        response["headers"] = {
            "Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}
        }
    return response


def install_openapi(app: FastAPI, catalog: ProblemCatalog, public_paths: Collection[str]) -> None:
    """Replace `app.openapi` with a generator that adds the above to FastAPI's document."""
    by_status: dict[int, list[str]] = defaultdict(list)
    for slug in catalog.slugs():
        by_status[catalog[slug].status].append(slug)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        install_responses(schema)
        components = schema.setdefault("components", {})
        components.setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
        components["schemas"].pop("HTTPValidationError", None)
        components["schemas"].pop("ValidationError", None)
        components["securitySchemes"] = {
            "bearerAuth": {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key this deployment knows (TENURE_API_KEYS), as a bearer token.",
            }
        }
        for path, item in schema.get("paths", {}).items():
            for method, operation in item.items():
                statuses = set(_EVERY_ROUTE)
                if path not in public_paths:
                    operation["security"] = [{"bearerAuth": []}]
                    statuses.update(_AUTHENTICATED)
                if "{" in path:
                    statuses.add(404)
                if method in _WITH_BODY:
                    statuses.update({409, 413})
                responses = operation.setdefault("responses", {})
                for status in sorted(statuses):
                    responses[str(status)] = _problem_response(catalog, status, by_status.get(status, []))
                if operation.get("operationId") in _KEY_REQUIRED:
                    for parameter in operation.get("parameters", []):
                        if parameter.get("in") == "header" and parameter.get("name") == "Idempotency-Key":
                            parameter["required"] = True
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
