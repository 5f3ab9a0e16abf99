"""A client generated at test time from nothing but an OpenAPI document, that checks both ways.

Each operation becomes a method named by its operationId (`client.submit_run(...)`), built from
the document's method, path template and parameters: path and query parameters and headers are
keyword arguments in snake case (`run_id`, `idempotency_key`), a missing required one or an
unknown one is a TypeError before anything is sent. The request body is validated against the
operation's declared request schema before it is sent; the answer must have a status the
operation declares, a declared media type, and a body that validates against the schema declared
for that status (problems included). So a test driving the API through this client proves the
document describes the API, as a client generated with openapi-generator would rely on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

__all__ = ["Answer", "OpenApiClient", "OpenApiMismatch", "Operation", "validator_for"]


class OpenApiMismatch(AssertionError):
    """The API and its document disagree (or the caller broke the document's request schema)."""


@dataclass(frozen=True)
class Answer:
    operation_id: str
    status: int
    headers: httpx.Headers
    body: Any
    raw: bytes


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str
    parameters: dict[str, dict[str, Any]]  # snake-case name -> the parameter object
    request_body: dict[str, Any] | None
    responses: dict[str, Any]


def validator_for(document: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """A JSON Schema 2020-12 validator (OpenAPI 3.1's dialect) of `schema` within `document`."""
    # The document's components beside the schema, so its #/components/... refs resolve.
    root = {**schema, "components": document.get("components", {})}
    return Draft202012Validator(root, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _snake(name: str) -> str:
    """`Idempotency-Key` -> `idempotency_key`, `asOf` -> `as_of`: what generators name them."""
    words = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", re.sub(r"[^0-9a-zA-Z]+", "_", name))
    return re.sub(r"_+", "_", words).strip("_").lower()


@dataclass
class OpenApiClient:
    http: httpx.Client
    document: dict[str, Any]
    operations: dict[str, Operation] = field(init=False)
    seen: set[tuple[str, int]] = field(init=False, default_factory=set)
    _validators: dict[str, Draft202012Validator] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.operations = {}
        for path, item in self.document["paths"].items():
            for method, op in item.items():
                parameters = {_snake(p["name"]): p for p in op.get("parameters", [])}
                self.operations[op["operationId"]] = Operation(
                    op["operationId"],
                    method.upper(),
                    path,
                    parameters,
                    op.get("requestBody"),
                    op["responses"],
                )

    def __getattr__(self, name: str) -> Callable[..., Answer]:
        if name.startswith("_") or name not in self.__dict__.get("operations", {}):
            raise AttributeError(f"the document has no operation {name!r}")

        def call(**kwargs: Any) -> Answer:
            return self.call(name, **kwargs)

        return call

    # --- validation -----------------------------------------------------------------------------

    def _validate(self, schema: dict[str, Any], instance: Any, what: str) -> None:
        key = json.dumps(schema, sort_keys=True)
        validator = self._validators.get(key)
        if validator is None:
            validator = self._validators[key] = validator_for(self.document, schema)
        try:
            validator.validate(instance)
        except ValidationError as exc:
            location = "/".join(str(p) for p in exc.absolute_path)
            raise OpenApiMismatch(
                f"{what}: {exc.message} at /{location}\n{json.dumps(instance)[:2000]}"
            ) from exc

    # --- calling --------------------------------------------------------------------------------

    def call(
        self,
        operation_id: str,
        *,
        body: Any = None,
        content: bytes | None = None,
        content_type: str | None = None,
        auth: str | None = None,
        **arguments: Any,
    ) -> Answer:
        op = self.operations[operation_id]
        unknown = set(arguments) - set(op.parameters)
        if unknown:
            raise TypeError(f"{operation_id}() has no parameter {sorted(unknown)}")
        path, query, headers = op.path, {}, {}
        for name, parameter in op.parameters.items():
            if name not in arguments or arguments[name] is None:
                if parameter.get("required"):
                    raise TypeError(f"{operation_id}() needs {name} ({parameter['in']} {parameter['name']})")
                continue
            value = arguments[name]
            self._validate(parameter.get("schema", {}), value, f"{operation_id} parameter {name}")
            where = parameter["in"]
            if where == "path":
                path = path.replace("{" + parameter["name"] + "}", str(value))
            elif where == "query":
                query[parameter["name"]] = value
            elif where == "header":
                headers[parameter["name"]] = str(value)
        if auth is not None:
            headers["Authorization"] = f"Bearer {auth}"
        request: dict[str, Any] = {"params": query, "headers": headers}
        declared_body = (op.request_body or {}).get("content", {})
        if body is not None:
            if "application/json" not in declared_body:
                raise OpenApiMismatch(f"{operation_id} declares no JSON request body")
            self._validate(declared_body["application/json"]["schema"], body, f"{operation_id} request body")
            request["json"] = body
        elif content is not None:
            if not declared_body or "application/json" in declared_body:
                raise OpenApiMismatch(f"{operation_id} declares no raw request body")
            request["content"] = content
            headers["Content-Type"] = content_type or "application/octet-stream"
        elif (op.request_body or {}).get("required"):
            raise TypeError(f"{operation_id}() needs a body")
        response = self.http.request(op.method, path, **request)
        return self._answer(op, response)

    def _answer(self, op: Operation, response: httpx.Response) -> Answer:
        status = response.status_code
        declared = op.responses.get(str(status))
        if declared is None:
            raise OpenApiMismatch(
                f"{op.operation_id} answered {status}, which the document does not declare "
                f"(it declares {sorted(op.responses)}): {response.text[:500]}"
            )
        self.seen.add((op.operation_id, status))
        content = declared.get("content")
        if not content:
            if response.content:
                raise OpenApiMismatch(
                    f"{op.operation_id} {status} declares no body but sent {response.text[:200]}"
                )
            return Answer(op.operation_id, status, response.headers, None, b"")
        media_type = response.headers.get("content-type", "").split(";")[0].strip()
        schema_of = content.get(media_type) or content.get("*/*")
        if schema_of is None:
            raise OpenApiMismatch(
                f"{op.operation_id} {status} sent {media_type!r}, declared {sorted(content)}"
            )
        body: Any = response.content
        if media_type.endswith("json"):
            body = response.json()
            self._validate(schema_of["schema"], body, f"{op.operation_id} {status} answer")
        for name, header in declared.get("headers", {}).items():
            if header.get("required") and name.lower() not in response.headers:
                raise OpenApiMismatch(f"{op.operation_id} {status} lacks its declared header {name}")
        return Answer(op.operation_id, status, response.headers, body, response.content)
