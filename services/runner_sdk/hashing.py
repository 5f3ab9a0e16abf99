"""Canonical JSON and the semantic watchdog's action hash (WD-4): the one definition of each.

They live in the runner SDK so that its own distribution (sdk/, tenure-sdk) carries them; the
services import them from services.common.ids, which re-exports these.
"""

from __future__ import annotations

import json
from typing import Any

import xxhash

__all__ = ["action_hash", "canonical_json"]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no insignificant whitespace: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def action_hash(tool: str, arguments: Any) -> str:
    """WD-4: xxHash64 of `tool` + NUL + canonical JSON of `arguments`, as 16 lowercase hex digits.

    The one definition every party uses (the saga for the steps it dispatches and refuses, the
    gateway, the API and the runner SDK for the steps a runner reports), so that one action has
    one hash wherever it is seen. The NUL keeps ("a", "bc") apart from ("ab", "c")."""
    return xxhash.xxh64_hexdigest(f"{tool}\x00{canonical_json(arguments)}".encode())
