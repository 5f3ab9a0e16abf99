"""The shortcuts that make restore and rebuild fast (issue 16) give exactly what they replace.

`services.common.frozen.replace` against `dataclasses.replace`; the compiled contract builders
against the generic one; the registry's precomputed resolution against explicit versions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import pytest

from services.common.avro import default_registry
from services.common.contracts import from_record, to_record
from services.common.contracts.runs import _build_any
from services.common.frozen import replace
from services.common.messages import MessageCodec
from tests.unit.run_walks import RunWalk


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plain:
    a: int
    b: str = "b"
    c: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Checked:
    a: int

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must not be negative")


@dataclasses.dataclass(frozen=True, slots=True)
class Slotted:
    a: int
    b: int = 0


def test_replace_equals_dataclasses_replace_for_a_plain_frozen_dataclass() -> None:
    before = Plain(a=1, c=(1, 2))
    after = replace(before, a=2, b="x")
    assert after == dataclasses.replace(before, a=2, b="x")
    assert type(after) is Plain and before == Plain(a=1, c=(1, 2))  # the original is unchanged
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.a = 3  # type: ignore[misc]
    assert hash(after) == hash(Plain(a=2, b="x", c=(1, 2)))


def test_replace_keeps_post_init_checks_slots_and_unknown_field_errors() -> None:
    with pytest.raises(ValueError, match="negative"):
        replace(Checked(1), a=-1)  # __post_init__ still runs: the shortcut is not taken
    assert replace(Slotted(1), b=2) == Slotted(1, 2)
    with pytest.raises(TypeError):
        replace(Plain(a=1), nope=1)


def test_run_events_decode_to_what_the_generic_builder_gives() -> None:
    """Every event of a long walk (claims, renewals, effects, takeover, report with a manifest)
    decodes through the compiled builders to the value the field-by-field builder gives."""
    codec, registry = MessageCodec(), default_registry()
    walk = RunWalk("restore-speed", retry_safe=True, max_attempts=3, timeout_seconds=3600)
    for step in [("claim", 0, 1_000), ("renew", 1, 20_000), ("intent", 1, 0), ("outcome", 0, 0)]:
        walk.step(*step)
    walk.step("takeover", 2, 1_000)
    walk.step("grant", 1, 0)
    walk.step("report", 4, 1_000)
    assert len(walk.events) >= 6
    for event in walk.events:
        decoded = registry.decode(codec.outbound("runs.events", event.run_id, event).value)
        built = from_record(decoded.full_name, decoded.record)
        assert built == event == _build_any(type(event), decoded.record)
        assert to_record(built) == to_record(event)
        for value in vars(built).values():
            assert not isinstance(value, (list, dict))  # arrays are tuples, maps read-only
            if isinstance(value, Mapping):
                assert isinstance(value, MappingProxyType)


def test_a_record_missing_a_field_takes_the_default_as_before() -> None:
    event = RunWalk("restore-speed-defaults").events[0]
    record = to_record(event)
    field = next(f for f in dataclasses.fields(event) if f.default is not dataclasses.MISSING)
    key = next(k for k in record if k.replace("_", "").lower() == field.name.replace("_", "").lower())
    del record[key]
    full_name = default_registry().decode(MessageCodec().outbound("t", event.run_id, event).value).full_name
    built = from_record(full_name, record)
    assert built == _build_any(type(event), record)
    assert getattr(built, field.name) == field.default


def test_the_precomputed_resolution_decodes_as_explicit_versions_do() -> None:
    registry = default_registry()
    event = RunWalk("restore-speed-versions").events[0]
    data = MessageCodec().outbound("runs.events", event.run_id, event).value
    latest = registry.decode(data)
    explicit = registry.decode(data, reader_version=latest.version)
    assert latest == explicit


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        [("tenure-schema", b"tenure.runs.events.LeaseRenewed"), ("tenure-schema-version", b"1")],
        [("a", None), ("b", b"x")],
        [("a", b""), ("b", b"x")],
    ],
)
def test_record_headers_are_normalised_as_before(raw: list[tuple[str, bytes | None]] | None) -> None:
    from services.common.kafka._config import normalise_headers
    from services.common.kafka._reader import _headers

    assert _headers(raw) == normalise_headers(raw)
    assert all(type(k) is str and type(v) is bytes for k, v in _headers(raw))
