"""`replace` for frozen dataclasses: `dataclasses.replace` without its per-call overhead.

`dataclasses.replace` walks every field and calls `__init__` with all of them: about 5 us for a
state of 25 fields, three times per event in the Run's `evolve`, which made `evolve` half of a
restore's time (issue 16). For a plain dataclass (no `__post_init__`, no `InitVar` or
`init=False` field, a `__dict__`), the result of `__init__` is exactly the fields' values, so the
copy can be made by copying the instance dictionary and applying the changes. Anything else,
and a change naming no field, goes to `dataclasses.replace` itself, errors included.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["replace"]

T = TypeVar("T")

# class -> the names of its fields when the shortcut is exact for it, else an empty set
_PLAIN: dict[type[Any], frozenset[str]] = {}


def _plain_fields(cls: type[Any]) -> frozenset[str]:
    fields = dataclasses.fields(cls)
    plain = (
        not hasattr(cls, "__post_init__")
        and "__slots__" not in cls.__dict__
        and all(f.init and f._field_type is dataclasses._FIELD for f in fields)  # type: ignore[attr-defined]
    )
    names = frozenset(f.name for f in fields) if plain else frozenset()
    _PLAIN[cls] = names
    return names


def replace(obj: T, /, **changes: Any) -> T:
    """What `dataclasses.replace(obj, **changes)` returns, faster for plain dataclasses."""
    cls = type(obj)
    names = _PLAIN.get(cls)
    if names is None:
        names = _plain_fields(cls)
    if not names or not names.issuperset(changes):
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    new = object.__new__(cls)
    state = new.__dict__
    state.update(obj.__dict__)
    state.update(changes)
    return new
