"""Schema evolution: every version stays readable by its neighbours, and old bytes decode forever.

Event topics keep everything and state is rebuilt by replaying them, so a record written by any
released schema version must still decode with today's code. Two guards:
- each version is backward (new reader, old data) and forward (old reader, new data) compatible
  with its predecessor, checked with fastavro's writer/reader resolution through the codec;
- golden bytes under tests/golden (written once by make_golden.py) decode to their recorded JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.common.avro import SchemaRegistry, SchemaVersion, parsing_canonical_form

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO_ROOT / "schemas"
GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
REGISTRY = SchemaRegistry.from_directory(SCHEMA_DIR)
ALL_VERSIONS = [v for name in REGISTRY.names() for v in REGISTRY.versions(name)]
EVOLUTION_STEPS = [
    (older, newer)
    for name in REGISTRY.names()
    for older, newer in zip(REGISTRY.versions(name), REGISTRY.versions(name)[1:], strict=False)
]
GOLDEN_STEMS = sorted(p.name.removesuffix(".bin") for p in GOLDEN_DIR.glob("*.bin"))


def _version_id(version: SchemaVersion) -> str:
    return f"{version.full_name.rsplit('.', 1)[1]}.v{version.version}"


def _sample(schema: Any, name: str) -> Any:
    """A valid value for `schema`, distinctive per field so a mix-up between fields shows."""
    if isinstance(schema, list):
        return _sample(next(branch for branch in schema if branch != "null"), name)
    if isinstance(schema, dict):
        kind = schema["type"]
        if kind == "record":
            return {f["name"]: _sample(f["type"], f["name"]) for f in schema["fields"]}
        if kind == "map":
            return {f"{name}-key": _sample(schema["values"], name)}
        if kind == "array":
            return [_sample(schema["items"], name)]
        if kind == "enum":
            return schema["symbols"][0]
        if kind == "fixed":
            return bytes(schema["size"])
        return _sample(kind, name)
    primitives = {
        "null": None,
        "boolean": True,
        "int": 7 + len(name),
        "long": 2**40 + len(name),
        "float": 1.5,
        "double": 2.5,
        "bytes": name.encode(),
        "string": f"{name}-sample",
    }
    return primitives[schema]


def _fields(version: SchemaVersion) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in version.declared["fields"]}


def _expected_after_resolution(written: dict[str, Any], reader: SchemaVersion) -> dict[str, Any]:
    """What resolving `written` into `reader` must give: shared fields kept, others defaulted."""
    return {
        name: written[name] if name in written else field["default"]
        for name, field in _fields(reader).items()
    }


def test_every_schema_file_is_loaded() -> None:
    assert len(ALL_VERSIONS) == len(list(SCHEMA_DIR.rglob("*.avsc")))
    assert {v.full_name for v in ALL_VERSIONS} >= {
        "tenure.runs.commands.SubmitRun",
        "tenure.runs.commands.CancelRun",
        "tenure.runs.events.RunSubmitted",
        "tenure.runs.events.RunCancelled",
        "tenure.runs.rejections.CommandRejected",
    }


def _inline_records(schema: Any, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """(full name, definition) of every record defined inline below `schema`, outermost first."""
    if isinstance(schema, list):
        return [found for branch in schema for found in _inline_records(branch, namespace)]
    if not isinstance(schema, dict):
        return []  # a primitive, or a reference to a named type defined elsewhere in the file
    if schema["type"] == "record":
        name = schema["name"]
        full_name = name if "." in name else f"{schema.get('namespace', namespace)}.{name}"
        inner_namespace = full_name.rsplit(".", 1)[0]
        nested = [found for f in schema["fields"] for found in _inline_records(f["type"], inner_namespace)]
        return [(full_name, schema), *nested]
    if schema["type"] == "array":
        return _inline_records(schema["items"], namespace)
    if schema["type"] == "map":
        return _inline_records(schema["values"], namespace)
    return []


def _nested_records(version: SchemaVersion) -> list[tuple[str, dict[str, Any]]]:
    return _inline_records(dict(version.declared), "")[1:]


@pytest.mark.parametrize("version", ALL_VERSIONS, ids=_version_id)
def test_schema_is_documented_and_free_of_enums(version: SchemaVersion) -> None:
    assert version.declared.get("doc"), f"{version.path}: the record needs a doc"
    for field in version.declared["fields"]:
        assert field.get("doc"), f"{version.path}: field {field['name']} needs a doc"
    for full_name, record in _nested_records(version):
        assert record.get("doc"), f"{version.path}: nested record {full_name} needs a doc"
        for field in record["fields"]:
            assert field.get("doc"), f"{version.path}: field {full_name}.{field['name']} needs a doc"
    # Statuses and codes are strings so new values need no schema change; an Avro enum would
    # make an unknown symbol undecodable for old readers.
    assert '"enum"' not in version.path.read_text()


@pytest.mark.parametrize(
    ("older", "newer"), EVOLUTION_STEPS, ids=[_version_id(n) for _, n in EVOLUTION_STEPS]
)
def test_new_fields_have_defaults_and_removed_fields_had_them(
    older: SchemaVersion, newer: SchemaVersion
) -> None:
    old_fields, new_fields = _fields(older), _fields(newer)
    for name in new_fields.keys() - old_fields.keys():
        assert "default" in new_fields[name], f"{name} added in v{newer.version} needs a default"
    for name in old_fields.keys() - new_fields.keys():
        assert "default" in old_fields[name], f"{name} removed in v{newer.version} had no default"


@pytest.mark.parametrize(
    ("older", "newer"), EVOLUTION_STEPS, ids=[_version_id(n) for _, n in EVOLUTION_STEPS]
)
def test_backward_compatible_new_reader_reads_old_data(older: SchemaVersion, newer: SchemaVersion) -> None:
    written = _sample(dict(older.declared), "root")
    data = REGISTRY.encode(older.full_name, written, version=older.version)
    decoded = REGISTRY.decode(data, reader_version=newer.version)
    assert decoded.version == older.version
    assert decoded.record == _expected_after_resolution(written, newer)


@pytest.mark.parametrize(
    ("older", "newer"), EVOLUTION_STEPS, ids=[_version_id(n) for _, n in EVOLUTION_STEPS]
)
def test_forward_compatible_old_reader_reads_new_data(older: SchemaVersion, newer: SchemaVersion) -> None:
    written = _sample(dict(newer.declared), "root")
    data = REGISTRY.encode(newer.full_name, written, version=newer.version)
    decoded = REGISTRY.decode(data, reader_version=older.version)
    assert decoded.version == newer.version
    assert decoded.record == _expected_after_resolution(written, older)


def test_run_submitted_has_a_real_evolution_step() -> None:
    """The machinery above is exercised on at least one real step (RunSubmitted v1 -> v2)."""
    steps = [(o.version, n.version) for o, n in EVOLUTION_STEPS]
    names = {n.full_name for _, n in EVOLUTION_STEPS}
    assert (1, 2) in steps and "tenure.runs.events.RunSubmitted" in names


def test_shared_named_records_agree_across_the_latest_schemas() -> None:
    """Each file defines a shared record (e.g. tenure.runs.ArtifactEntry) inline for itself, so
    nothing but this test keeps the copies equal: the latest schema of every record must carry
    one wire form per shared name. Older versions keep the form they were released with."""
    forms: dict[str, dict[str, list[str]]] = {}
    for name in REGISTRY.names():
        latest = REGISTRY.latest(name)
        for full_name, record in _nested_records(latest):
            form = parsing_canonical_form({**record, "name": full_name})
            forms.setdefault(full_name, {}).setdefault(form, []).append(_version_id(latest))
    for full_name, by_form in forms.items():
        assert len(by_form) == 1, f"{full_name} is defined differently in {sorted(by_form.values())}"
    shared = forms["tenure.runs.ArtifactEntry"]
    assert sorted(next(iter(shared.values()))) == ["AttemptReported.v2", "ReportAttempt.v2"]


def test_array_of_record_fields_are_exercised_by_real_evolution_steps() -> None:
    """The compatibility tests above cover an array-of-record field added with default []."""
    added = {
        (newer.full_name, newer.version, name)
        for older, newer in EVOLUTION_STEPS
        for name, field in _fields(newer).items()
        if name not in _fields(older)
        and isinstance(field["type"], dict)
        and field["type"]["type"] == "array"
        and isinstance(field["type"]["items"], dict)
        and field["default"] == []
    }
    assert {
        ("tenure.runs.commands.ReportAttempt", 2, "manifest"),
        ("tenure.runs.events.AttemptReported", 2, "manifest"),
    } <= added


# --- golden samples -----------------------------------------------------------------------------


def test_every_schema_version_has_a_golden_sample() -> None:
    expected = sorted(_version_id(v) for v in ALL_VERSIONS)
    missing = sorted(set(expected) - set(GOLDEN_STEMS))
    assert not missing, f"run `python tests/golden/make_golden.py` to add goldens for {missing}"
    for stem in GOLDEN_STEMS:
        assert (GOLDEN_DIR / f"{stem}.json").is_file(), f"{stem}.bin has no .json expectation"


@pytest.mark.parametrize("stem", GOLDEN_STEMS)
def test_golden_sample_decodes_as_written(stem: str) -> None:
    expectation = json.loads((GOLDEN_DIR / f"{stem}.json").read_text(encoding="utf-8"))
    data = (GOLDEN_DIR / f"{stem}.bin").read_bytes()
    decoded = REGISTRY.decode(data, reader_version=expectation["version"])
    assert decoded.full_name == expectation["schema"]
    assert decoded.version == expectation["version"]
    assert decoded.fingerprint_hex == expectation["fingerprint"]
    assert decoded.record == expectation["record"]


@pytest.mark.parametrize("stem", GOLDEN_STEMS)
def test_golden_sample_decodes_into_the_latest_reader(stem: str) -> None:
    expectation = json.loads((GOLDEN_DIR / f"{stem}.json").read_text(encoding="utf-8"))
    decoded = REGISTRY.decode((GOLDEN_DIR / f"{stem}.bin").read_bytes())
    latest = REGISTRY.latest(expectation["schema"])
    assert decoded.record == _expected_after_resolution(expectation["record"], latest)


@pytest.mark.parametrize("stem", GOLDEN_STEMS)
def test_encoder_still_produces_the_golden_bytes(stem: str) -> None:
    """Pins the encoder too: the same record and version must give byte-identical output."""
    expectation = json.loads((GOLDEN_DIR / f"{stem}.json").read_text(encoding="utf-8"))
    encoded = REGISTRY.encode(expectation["schema"], expectation["record"], version=expectation["version"])
    assert encoded == (GOLDEN_DIR / f"{stem}.bin").read_bytes()
