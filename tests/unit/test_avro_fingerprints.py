"""The codec's schema fingerprints against Apache Avro's published reference cases: the Parsing
Canonical Form, CRC-64-AVRO, and every registered schema's fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.avro import SchemaRegistry, fingerprint_of, parsing_canonical_form
from tests.support.avro_reference import APACHE_SCHEMA_TESTS, FINGERPRINTED, reference_crc64_avro, unsigned

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def registry() -> SchemaRegistry:
    return SchemaRegistry.from_directory(REPO_ROOT / "schemas")


@pytest.mark.parametrize(("case", "schema", "canonical", "_fp"), APACHE_SCHEMA_TESTS)
def test_parsing_canonical_form_matches_apache_reference(
    case: str, schema: str, canonical: str, _fp: int | None
) -> None:
    assert parsing_canonical_form(schema) == canonical, case


@pytest.mark.parametrize(("case", "schema", "_canonical", "java_long"), FINGERPRINTED)
def test_crc64_avro_fingerprint_matches_apache_reference(
    case: str, schema: str, _canonical: str, java_long: int
) -> None:
    assert fingerprint_of(schema) == unsigned(java_long), case


def test_reference_crc64_implementation_agrees_with_apache_values() -> None:
    """Validates the spec-transcribed CRC used below as an independent check of the header."""
    assert len(FINGERPRINTED) >= 8
    for case, _schema, canonical, java_long in FINGERPRINTED:
        assert java_long is not None
        assert reference_crc64_avro(canonical.encode()) == unsigned(java_long), case


def test_every_registered_schema_fingerprint_is_crc64_of_its_canonical_form(
    registry: SchemaRegistry,
) -> None:
    for name in registry.names():
        for version in registry.versions(name):
            assert version.fingerprint == fingerprint_of(version.path.read_text())
            assert version.fingerprint == reference_crc64_avro(version.canonical_form.encode())
            # logicalType is not part of the canonical form; timestamps are plain longs there.
            assert "logicalType" not in version.canonical_form
