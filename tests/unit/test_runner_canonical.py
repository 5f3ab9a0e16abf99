"""The runner SDK's state canonicaliser (WD-1): two runners hashing the same state agree.

Property tests (hypothesis): the order of keys, the declared volatile fields (timestamps), the
spelling of a number (1 vs 1.0), the order files were written in, their mode and their times
do not change a state's hash; its content does.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.ids import STATE_HASH_PATTERN
from services.runner_sdk import (
    DEFAULT_VOLATILE_KEYS,
    canonical_text,
    json_state_hash,
    state_hash,
    tree_snapshot,
    tree_state_hash,
)

pytestmark = pytest.mark.timeout(120)

KEYS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6).filter(
    lambda k: k not in DEFAULT_VOLATILE_KEYS
)
LEAVES = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=8)
LEAVES = LEAVES | st.floats(allow_nan=False, allow_infinity=False, width=64)
DOCUMENTS = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)
STATE = re.compile(STATE_HASH_PATTERN)


def shuffled(value: Any, rnd: random.Random) -> Any:
    """The same document with every object's keys in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


def with_volatile(value: Any, rnd: random.Random) -> Any:
    """The same document with timestamps sprinkled into its objects."""
    if isinstance(value, dict):
        stamped = {k: with_volatile(v, rnd) for k, v in value.items()}
        stamped[rnd.choice(sorted(DEFAULT_VOLATILE_KEYS))] = rnd.random()
        return stamped
    if isinstance(value, list):
        return [with_volatile(v, rnd) for v in value]
    return value


@given(DOCUMENTS, st.randoms(use_true_random=False))
def test_key_order_does_not_change_the_hash_wd_1(document: Any, rnd: random.Random) -> None:
    assert json_state_hash(shuffled(document, rnd)) == json_state_hash(document)


@given(DOCUMENTS, st.randoms(use_true_random=False))
def test_volatile_fields_do_not_change_the_hash_wd_1(document: Any, rnd: random.Random) -> None:
    assert json_state_hash(with_volatile(document, rnd)) == json_state_hash(document)


@given(st.dictionaries(KEYS, DOCUMENTS, min_size=1, max_size=4), LEAVES)
def test_content_changes_the_hash_wd_1(document: dict[str, Any], leaf: Any) -> None:
    key = sorted(document)[0]
    changed = {**document, key: [document[key], leaf]}
    assert json_state_hash(changed) != json_state_hash(document)
    assert json_state_hash({**document, "extra" + key: leaf}) != json_state_hash(document)


def test_the_hash_is_sha256_of_the_canonical_text() -> None:
    doc = {"b": [1.0, 2.5], "a": {"updatedAt": "2026-01-01T00:00:00Z", "x": "é"}}
    assert canonical_text(doc) == '{"a":{"x":"é"},"b":[1,2.5]}'
    assert STATE.fullmatch(json_state_hash(doc))
    assert json_state_hash(doc) == json_state_hash({"b": [1, 2.5], "a": {"x": "é"}})
    assert json_state_hash(doc, volatile_keys=()) != json_state_hash(doc), "volatile keys are declared"
    assert json_state_hash({"a": 1}) != json_state_hash({"a": "1"})
    for bad in (float("nan"), float("inf"), {1: "x"}, object()):
        with pytest.raises(ValueError):
            json_state_hash({"v": bad})


# --- directory trees ------------------------------------------------------------------------------

FILES = st.dictionaries(
    st.lists(st.sampled_from(["src", "docs", "a", "b.txt", "c.json", "ü"]), min_size=1, max_size=3).map(
        lambda parts: "/".join(parts)
    ),
    st.binary(max_size=64),
    min_size=1,
    max_size=6,
).filter(lambda files: not any(a != b and b.startswith(a + "/") for a in files for b in files))


def write_tree(root: Path, files: dict[str, bytes], order: list[str]) -> Path:
    root.mkdir(parents=True)
    for name in order:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])
    return root


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(FILES, st.randoms(use_true_random=False))
def test_file_order_mode_and_times_do_not_change_a_trees_hash_wd_1(
    tmp_path_factory: pytest.TempPathFactory, files: dict[str, bytes], rnd: random.Random
) -> None:
    base = tmp_path_factory.mktemp("trees")
    order = sorted(files)
    first = write_tree(base / "one", files, order)
    rnd.shuffle(order)
    second = write_tree(base / "two", files, order)
    for path in second.rglob("*"):
        if path.is_file():
            os.utime(path, (rnd.randint(0, 2**31), rnd.randint(0, 2**31)))
            path.chmod(0o600 if rnd.random() < 0.5 else 0o755)
    (second / ".git").mkdir()
    (second / ".git" / "HEAD").write_text("ref: refs/heads/main")  # bookkeeping, not state
    assert tree_state_hash(first) == tree_state_hash(second)
    # Content does change it.
    name = sorted(files)[0]
    (second / name).write_bytes(files[name] + b"!")
    assert tree_state_hash(first) != tree_state_hash(second)


def test_a_json_file_is_hashed_by_its_canonical_content(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "state.json").write_text(json.dumps({"b": 1, "a": [1, 2], "updatedAt": 5}))
    (two / "state.json").write_text(json.dumps({"a": [1.0, 2], "b": 1}, indent=4))
    assert tree_state_hash(one) == tree_state_hash(two) == state_hash(one)
    (two / "notes.txt").write_text("")
    assert tree_state_hash(one) != tree_state_hash(two), "an empty file is state"
    (one / "empty-dir").mkdir()
    (one / "notes.txt").write_text("")
    assert tree_state_hash(one) == tree_state_hash(two), "an empty directory is not (as in git)"


def test_symlinks_are_state_but_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "real" / "f").write_text("x")
    (root / "link").symlink_to("real")
    (root / "flink").symlink_to("real/f")
    kinds = {path: kind for path, kind, _ in tree_snapshot(root)}
    assert kinds == {"real/f": "file", "link": "link", "flink": "link"}
    before = tree_state_hash(root)
    (root / "link").unlink()
    (root / "link").symlink_to("elsewhere")
    assert tree_state_hash(root) != before


def test_a_tree_hash_needs_a_directory(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError):
        tree_state_hash(tmp_path / "missing")
