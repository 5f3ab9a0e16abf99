"""The state canonicaliser (WD-1): SHA-256 over a canonical snapshot of JSON state or a directory.

The semantic watchdog judges progress by the environment: a step that leaves the state exactly
as an earlier step did closes a cycle (WD-2). That needs a state hash two runners agree on for
the same state, whatever order they built it in and whenever they took it:

* a JSON document: object keys sorted, declared volatile fields removed at any depth (timestamps
  and the like: `DEFAULT_VOLATILE_KEYS`, or the runner's own), integral floats written as
  integers (1.0 and 1 are one number), no insignificant whitespace; NaN and infinities refused;
* a directory tree: every regular file and symlink under the root, by its path relative to the
  root (POSIX separators, Unicode NFC) in sorted order, each with the SHA-256 of its content (a
  symlink: of its target, never followed); files matching `json_files` are canonicalised as JSON
  first, so a re-serialised config with the same content hashes the same; file mode, owner and
  times are ignored; names matching `ignore` (VCS metadata, caches) are left out with everything
  under them. Empty directories do not count (as in git).

`state_hash` is the 64 lowercase hex digits the observation's `stateHash` carries.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_IGNORED",
    "DEFAULT_JSON_FILES",
    "DEFAULT_VOLATILE_KEYS",
    "canonical_document",
    "canonical_text",
    "json_state_hash",
    "state_hash",
    "tree_snapshot",
    "tree_state_hash",
]

# Keys whose values are about when, not what: removed wherever they appear.
DEFAULT_VOLATILE_KEYS: frozenset[str] = frozenset(
    {
        "timestamp",
        "time",
        "createdAt",
        "updatedAt",
        "modifiedAt",
        "generatedAt",
        "lastModified",
        "created_at",
        "updated_at",
        "modified_at",
        "generated_at",
        "last_modified",
        "mtime",
        "atime",
        "ctime",
    }
)
# Names in a tree that are bookkeeping, not state: version control, caches, editor droppings.
DEFAULT_IGNORED: tuple[str, ...] = (".git", ".hg", ".svn", "__pycache__", "*.pyc", ".DS_Store", "*.swp")
DEFAULT_JSON_FILES: tuple[str, ...] = ("*.json",)
_CHUNK = 1 << 20


def canonical_document(value: Any, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS) -> Any:
    """`value` (JSON-able) with the volatile keys removed at any depth and integral floats as
    integers. Raises ValueError for NaN, an infinity, a non-string key or a non-JSON value."""
    volatile = frozenset(volatile_keys)

    def clean(item: Any) -> Any:
        if isinstance(item, bool) or item is None or isinstance(item, str):
            return item
        if isinstance(item, int):
            return item
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{item!r} has no JSON form")
            return int(item) if item.is_integer() else item
        if isinstance(item, Mapping):
            if not all(isinstance(k, str) for k in item):
                raise ValueError("JSON object keys must be strings")
            return {k: clean(v) for k, v in item.items() if k not in volatile}
        if isinstance(item, list | tuple):
            return [clean(v) for v in item]
        raise ValueError(f"{type(item).__name__} is not a JSON value")

    return clean(value)


def canonical_text(value: Any, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS) -> str:
    """The canonical JSON text of `value` (sorted keys, no whitespace, UTF-8 as is)."""
    return json.dumps(
        canonical_document(value, volatile_keys),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def json_state_hash(value: Any, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS) -> str:
    """SHA-256 (64 hex digits) of the canonical form of a JSON document."""
    return hashlib.sha256(canonical_text(value, volatile_keys).encode("utf-8")).hexdigest()


def _ignored(name: str, relative: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(relative, p) for p in patterns)


def _file_digest(path: Path, as_json: bool, volatile_keys: frozenset[str]) -> str:
    if as_json:
        try:
            document = json.loads(path.read_bytes().decode("utf-8"))
            return json_state_hash(document, volatile_keys)
        except (UnicodeDecodeError, ValueError):
            pass  # not JSON after all: its bytes are its state
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tree_snapshot(
    root: str | os.PathLike[str],
    *,
    ignore: Iterable[str] = DEFAULT_IGNORED,
    json_files: Iterable[str] = DEFAULT_JSON_FILES,
    volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS,
) -> list[tuple[str, str, str]]:
    """The canonical snapshot of a directory: sorted (relative path, "file" | "link", SHA-256)."""
    base = Path(root)
    if not base.is_dir():
        raise NotADirectoryError(f"{base} is not a directory")
    patterns, json_patterns, volatile = tuple(ignore), tuple(json_files), frozenset(volatile_keys)
    entries: list[tuple[str, str, str]] = []
    for folder, dirs, files in os.walk(base, followlinks=False):
        here = Path(folder)
        kept = []
        for name in sorted(dirs):
            relative = (here / name).relative_to(base).as_posix()
            if (here / name).is_symlink():
                files.append(name)  # a link to a directory is a link, never followed
            elif not _ignored(name, relative, patterns):
                kept.append(name)
        dirs[:] = kept
        for name in files:
            path = here / name
            relative = unicodedata.normalize("NFC", path.relative_to(base).as_posix())
            if _ignored(name, relative, patterns):
                continue
            if path.is_symlink():
                target = os.readlink(path)
                entries.append((relative, "link", hashlib.sha256(os.fsencode(target)).hexdigest()))
            elif path.is_file():
                as_json = any(fnmatch.fnmatchcase(name, p) for p in json_patterns)
                entries.append((relative, "file", _file_digest(path, as_json, volatile)))
    return sorted(entries)


def tree_state_hash(
    root: str | os.PathLike[str],
    *,
    ignore: Iterable[str] = DEFAULT_IGNORED,
    json_files: Iterable[str] = DEFAULT_JSON_FILES,
    volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS,
) -> str:
    """SHA-256 (64 hex digits) of a directory's canonical snapshot."""
    snapshot = tree_snapshot(root, ignore=ignore, json_files=json_files, volatile_keys=volatile_keys)
    text = json.dumps([list(entry) for entry in snapshot], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def state_hash(state: Any, *, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS, **tree: Any) -> str:
    """The state hash of a directory (a Path) or of a JSON document (anything else); `tree`
    passes `ignore` and `json_files` on to tree_state_hash."""
    if isinstance(state, Path):
        return tree_state_hash(state, volatile_keys=volatile_keys, **tree)
    return json_state_hash(state, volatile_keys)
