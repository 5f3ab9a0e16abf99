"""JSON to and from bytes on the hot paths: stored states and views, and the API's answers.

The Run view projector and every API instance render a run's view on each of its events, and
the coordinator encodes a run's state on each of its commands. With the standard library's
encoder that JSON was the largest single cost of following the log (44% of the projector's
live fold, bench/run_views_fold.py). orjson does the same in C.

What is written and read is exactly what `json.dumps(value, separators=(",", ":"),
ensure_ascii=False[, sort_keys=True])` and `json.loads` give, with two exceptions no reader
sees: non-ASCII text is UTF-8 where the standard library's default escapes it, and a float that
is not finite becomes null where the standard library writes `NaN`, which is not JSON (no
stored state or view holds a float; the API refuses such numbers in what it is given). Where
orjson would change a value, the standard library does the work instead:
* an integer beyond 64 bits (a user's executionSpec may hold one) is refused by orjson's
  encoder, so that document is encoded by the standard library;
* orjson's decoder reads such an integer as a float, so a document with a run of 19 or more
  digits anywhere (a cheap scan in C; a long digit run inside a string only costs the fast
  path) is decoded by the standard library.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from typing import Any

import orjson

__all__ = ["dumps", "loads"]

_PLAIN = orjson.OPT_NON_STR_KEYS
_SORTED = orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS
# 2**63 has 19 digits: any shorter run of digits is an integer orjson reads exactly. One pattern
# for bytes and one for text, so that text (a run's executionSpec) is not encoded just to scan it.
_LONG_DIGITS_TEXT = re.compile(r"[0-9]{19}")
# For bytes, each digit becomes NUL and a run of 19 NULs is looked for: two passes in C at about
# 1 ns a byte, where the pattern above costs 18 (32 us for a 1.8 KB Run state, four times orjson's
# whole decode; issue 16). JSON holds no raw NUL, so a NUL of the input can only cause a needless
# slow path (and such input is not JSON: both decoders refuse it).
_DIGITS_AS_NUL = bytes.maketrans(b"0123456789", b"\x00" * 10)
_NINETEEN_DIGITS = b"\x00" * 19


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON (no spaces) as UTF-8 bytes; `sort_keys` orders every dict's keys.

    A dataclass is written as an object of its fields in their declared order, an enum as its
    value, a tuple as an array: a frozen state is encoded in C without being copied to dicts
    first (a renewal's state is encoded twice on its way: the coordinator's store and changelog,
    the projections' folds)."""
    try:
        return orjson.dumps(value, option=_SORTED if sort_keys else _PLAIN)
    except orjson.JSONEncodeError:
        # An integer beyond 64 bits, or a type orjson does not know: the standard library
        # writes the former and raises its own TypeError for the latter.
        text = json.dumps(
            value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False, default=_as_orjson_would
        )
        return text.encode("utf-8")


def _as_orjson_would(value: Any) -> Any:
    """What orjson writes for a value the standard library does not know: a dataclass as an
    object of its fields, an enum as its value (so both encoders give the same document)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def loads(raw: bytes | str) -> Any:
    """The value of a JSON document; a ValueError (json.JSONDecodeError) when it is not one."""
    if isinstance(raw, str):
        long_digits = _LONG_DIGITS_TEXT.search(raw) is not None
    else:
        long_digits = _NINETEEN_DIGITS in raw.translate(_DIGITS_AS_NUL)
    if long_digits:
        return json.loads(raw)
    return orjson.loads(raw)
