"""A run's lock and local mode's checks (EXE-16), pure: the canonical digest, the sealed lock,
and what `tenure local run` refuses before anything runs (a tampered spec, lock or artifact)."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.contracts.locks import (
    BadInputs,
    bytes_digest,
    canonical_bytes,
    digest_of,
    input_artifact_ids,
    lock_problems,
    seal_lock,
)
from services.tenure_cli.local_mode import (
    LocalModeError,
    child_env,
    output_manifest,
    split_run_arguments,
    verified_bytes,
)
from services.tenure_cli.main import build_parser

pytestmark = pytest.mark.timeout(60)

ART = "art_" + "a" * 32
RUN = "run_" + "0" * 32
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=5),
    max_leaves=20,
)


def _reordered(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys in another order."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: _reordered(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [_reordered(v, rng) for v in value]
    return value


@settings(max_examples=200, deadline=None)
@given(JSON, st.integers(0, 2**32))
def test_the_canonical_digest_does_not_depend_on_key_order_EXE_16(value: Any, seed: int) -> None:
    shuffled = _reordered(value, random.Random(seed))
    assert canonical_bytes(shuffled) == canonical_bytes(value)
    assert digest_of(shuffled) == digest_of(value)
    assert json.loads(canonical_bytes(value)) == value  # the encoding is the value, nothing lost


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=6), JSON, min_size=1, max_size=5), st.text(min_size=1, max_size=6))
def test_a_different_spec_has_a_different_digest_EXE_16(spec: dict[str, Any], extra: str) -> None:
    changed = {**spec, extra + "\x01": 1}
    assert digest_of(changed) != digest_of(spec)


def _lock(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    entry = {
        "artifactId": ART,
        "digest": bytes_digest(b"input"),
        "sizeBytes": 5,
        "mediaType": "text/plain",
        "download": f"/runs/{RUN}/lock/artifacts/{ART}",
    }
    return seal_lock(RUN, "acme", "rev-1", spec or {"agent": "a", "inputs": [ART]}, [entry])


def test_a_sealed_lock_verifies_and_every_tampering_is_named_EXE_16() -> None:
    lock = _lock()
    assert lock_problems(lock) == []
    assert lock_problems(json.loads(json.dumps(lock))) == [], "a JSON round trip keeps it valid"
    spec_tampered = {**lock, "executionSpec": {**lock["executionSpec"], "agent": "b"}}
    assert any("specDigest" in p for p in lock_problems(spec_tampered))
    entry_tampered = {**lock, "artifacts": [{**lock["artifacts"][0], "digest": bytes_digest(b"other")}]}
    assert any("lockDigest" in p for p in lock_problems(entry_tampered))
    resealed_other = seal_lock(RUN, "acme", None, {"agent": "a", "inputs": []}, lock["artifacts"])
    assert any("not the ones its executionSpec names" in p for p in lock_problems(resealed_other))
    assert lock_problems([1]) == ["the lock is not a JSON object"]


def test_inputs_must_be_a_list_of_artifact_ids_EXE_16() -> None:
    assert input_artifact_ids({"agent": "x"}) == ()
    assert input_artifact_ids({"inputs": [ART, ART]}) == (ART,)
    for bad in ("art_1", [1], ["../etc/passwd"], [ART.upper()]):
        with pytest.raises(BadInputs):
            input_artifact_ids({"inputs": bad})


def test_an_artifact_whose_bytes_differ_from_the_lock_is_refused_EXE_16() -> None:
    entry = _lock()["artifacts"][0]
    assert verified_bytes(entry, b"input") == b"input"
    with pytest.raises(LocalModeError, match="refusing to run"):
        verified_bytes(entry, b"inpuT")
    with pytest.raises(LocalModeError, match="refusing to run"):
        verified_bytes({**entry, "sizeBytes": 6}, b"input")


def test_the_output_manifest_is_the_files_own_and_stays_in_outputs_EXE_16(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "out.txt").write_bytes(b"OUT")
    manifest = output_manifest([{"artifactId": "out.txt", "mediaType": "text/plain"}], outputs)
    assert manifest == [
        {"artifactId": "out.txt", "digest": bytes_digest(b"OUT"), "sizeBytes": 3, "mediaType": "text/plain"}
    ]
    with pytest.raises(LocalModeError, match="declared digest"):
        output_manifest([{"artifactId": "out.txt", "digest": bytes_digest(b"x")}], outputs)
    with pytest.raises(LocalModeError, match="not a file under"):
        output_manifest([{"artifactId": "../lock.json"}], outputs)
    with pytest.raises(LocalModeError, match="no file"):
        output_manifest([{"artifactId": "missing.txt"}], outputs)


def test_the_command_gets_its_paths_and_never_the_clis_key_EXE_16(tmp_path: Path) -> None:
    env = child_env({"PATH": "/bin", "TENURE_CLI_API_KEY": "secret", "KAFKA_X": "1"}, tmp_path, RUN)
    assert env["PATH"] == "/bin" and "TENURE_CLI_API_KEY" not in env and "KAFKA_X" not in env
    assert env["TENURE_RESULT_MANIFEST"] == str(tmp_path / "manifest.json")
    assert env["TENURE_ARTIFACTS_DIR"] == str(tmp_path / "artifacts")
    assert env["TENURE_EXECUTION_SPEC"] == str(tmp_path / "spec.json")


def test_options_after_the_run_are_the_clis_and_the_command_is_untouched_EXE_16() -> None:
    def parsed(*argv: str) -> tuple[str, list[str], argparse.Namespace]:
        args = build_parser().parse_args(["local", "run", *argv])
        run_id, command = split_run_arguments(args)
        return run_id, command, args

    run_id, command, args = parsed(RUN, "--dir", "D", "--api-key", "k", "--", "python", "-c", "x", "--dir")
    assert (run_id, command, args.dir, args.api_key) == (RUN, ["python", "-c", "x", "--dir"], "D", "k")
    with pytest.raises(LocalModeError, match="after --"):
        parsed(RUN)
