"""services.common.jsonbytes writes and reads what the standard library's json does.

The stored views and states moved from `json` to orjson (issue 16: the projector's live fold);
stores written by either must read the same, and no value may change on the way, including a
user's executionSpec with integers beyond 64 bits, which orjson alone would refuse to write and
read back as floats."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common import jsonbytes

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: beyond 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def _stdlib(value: Any, sort_keys: bool) -> bytes:
    return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@given(_VALUES, st.booleans())
def test_what_is_written_reads_back_equal_by_either_decoder(value: Any, sort_keys: bool) -> None:
    written = jsonbytes.dumps(value, sort_keys=sort_keys)
    assert jsonbytes.loads(written) == value
    assert json.loads(written) == value


@given(_VALUES)
def test_what_the_standard_library_wrote_reads_the_same(value: Any) -> None:
    for old in (_stdlib(value, True), json.dumps(value).encode("utf-8")):  # escaped ASCII too
        decoded = jsonbytes.loads(old)
        assert decoded == json.loads(old)
        assert type(decoded) is type(value)


_LONGS = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(st.dictionaries(st.text(), _LONGS | st.text(), max_size=8))
def test_sorted_output_is_the_standard_librarys_byte_for_byte(value: dict[str, Any]) -> None:
    assert jsonbytes.dumps(value, sort_keys=True) == _stdlib(value, True)


def test_integers_beyond_64_bits_keep_their_value_both_ways() -> None:
    spec = {"seed": 2**70, "negative": -(2**64) - 5, "nested": [{"n": 10**25}]}
    written = jsonbytes.dumps(spec, sort_keys=True)
    assert written == _stdlib(spec, True)
    back = jsonbytes.loads(written)
    assert back == spec and type(back["seed"]) is int


def test_non_string_keys_are_written_as_the_standard_library_writes_them() -> None:
    assert jsonbytes.dumps({1: "a", "b": 2}, sort_keys=False) == b'{"1":"a","b":2}'


@pytest.mark.parametrize("text", [b"{", b"NaN", b"Infinity", b"\xff", b"", "[1,]"])
def test_what_is_not_json_is_a_value_error(text: bytes | str) -> None:
    with pytest.raises(ValueError):
        jsonbytes.loads(text)


def test_what_json_cannot_hold_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        jsonbytes.dumps({"when": object()})


class _Certainty(enum.Enum):
    ACTIVE = "active"


@dataclasses.dataclass(frozen=True)
class _Lease:
    epoch: int
    certainty: _Certainty
    capabilities: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class _State:
    run_id: str
    lease: _Lease | None
    handled: tuple[str, ...]
    huge: int = 0


def test_a_dataclass_is_written_as_its_fields_in_order_by_either_encoder() -> None:
    """A frozen state is encoded without first being copied to dicts; the standard library's
    path (taken for an integer beyond 64 bits) writes the same document."""
    state = _State("run_1", _Lease(3, _Certainty.ACTIVE, ("a",)), ("c1", "c2"))
    document = {
        "run_id": "run_1",
        "lease": {"epoch": 3, "certainty": "active", "capabilities": ["a"]},
        "handled": ["c1", "c2"],
        "huge": 0,
    }
    fast = jsonbytes.dumps(state)
    assert list(json.loads(fast)) == list(document) and json.loads(fast) == document
    beyond = dataclasses.replace(state, huge=2**70)
    assert jsonbytes.loads(jsonbytes.dumps(beyond)) == {**document, "huge": 2**70}


@given(st.lists(st.sampled_from([b"1", b"23", b"0" * 13, b"9" * 18, b"9" * 19, b'"', b",", b"a", b"-"])))
def test_a_long_digit_run_in_bytes_is_found_wherever_it_is(parts: list[bytes]) -> None:
    """The bytes scan (digits turned to NUL) finds exactly what the pattern over text finds."""
    raw = b"".join(parts)
    found = jsonbytes._NINETEEN_DIGITS in raw.translate(jsonbytes._DIGITS_AS_NUL)
    assert found == (jsonbytes._LONG_DIGITS_TEXT.search(raw.decode()) is not None)
    numbers = [
        int(run)
        for run in raw.decode().replace('"', ",").replace("a", ",").replace("-", ",").split(",")
        if run
    ]
    document = json.dumps(numbers).encode()  # the runs as integers: beyond 64 bits they keep their value
    assert jsonbytes.loads(document) == numbers
