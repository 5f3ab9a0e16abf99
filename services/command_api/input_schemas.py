"""The JSON Schema of an input request (EXE-8): accepted only if it can validate every answer.

A runner's `inputSchema` is checked against its metaschema, but that alone lets through schemas
that fail later, when a user answers: a `$ref` that resolves nowhere (Unresolvable), or refs
that loop (RecursionError). Either made the answer a 500. So the request is refused up front
(422) unless every `$ref` resolves within the schema itself (no remote documents are ever
fetched) and validating simple probes terminates; and an answer is checked so that whatever
jsonschema raises becomes a problem, never an exception.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

__all__ = ["answer_problem", "schema_problem"]

_PROBES: tuple[Any, ...] = (None, {}, [], "", 0, True)


def _refs(schema: Any) -> list[str]:
    found: list[str] = []
    stack = [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            ref = value.get("$ref")
            if isinstance(ref, str):
                found.append(ref)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` cannot serve as an input schema, or None."""
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"inputSchema is not a valid JSON Schema: {exc.message}"
    resolver = Registry().with_resource("", Resource.from_contents(schema, DRAFT202012)).resolver()
    for ref in _refs(schema):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            return f"inputSchema: $ref {ref[:200]!r} does not resolve within the schema"
    validator = cls(schema)
    for probe in _PROBES:
        try:
            validator.is_valid(probe)
        except RecursionError:
            return "inputSchema: its $refs loop without end"
        except Unresolvable as exc:
            return f"inputSchema: a $ref does not resolve ({exc})"[:300]
    return None


def answer_problem(answer: Any, schema: dict[str, Any]) -> tuple[str, list[Any]] | None:
    """(why the answer is refused, where in it), or None when the answer is valid."""
    try:
        jsonschema.validate(answer, schema)
    except jsonschema.ValidationError as exc:
        return f"the answer does not match the input schema: {exc.message}", list(exc.absolute_path)
    except (jsonschema.SchemaError, Unresolvable, RecursionError) as exc:
        return f"the run's input schema cannot validate an answer: {type(exc).__name__}", []
    return None
