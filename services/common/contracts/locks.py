"""A run's lock (EXE-16): the pinned, self-verifying document local mode runs a Run from.

Pure: no I/O, no clock. The API builds a lock (`seal_lock`) from the Run view and the artifact
envelopes its spec names; `tenure local run` checks it (`lock_problems`) and every artifact's
bytes against the digest it pins before anything runs, and `tenure local sync` compares the run's
current `specDigest` with the lock's before it claims.

One canonical encoding, `canonical_bytes`: JSON with sorted keys, no insignificant whitespace,
UTF-8 (services.common.ids.canonical_json), so equal values give equal bytes whatever the key
order a client sent. Digests are `sha256:<64 lowercase hex>`, the object store's own form.

The inputs convention: an ExecutionSpec names the artifacts its run reads as
`"inputs": ["art_<32 hex>", ...]` (ids of artifacts of the run's own tenant, as an upload answers
them in `artifactRef`); a spec without `inputs` needs none.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from services.common.ids import canonical_json

__all__ = [
    "INPUTS_FIELD",
    "LOCK_VERSION",
    "MAX_INPUTS",
    "BadInputs",
    "bytes_digest",
    "canonical_bytes",
    "digest_of",
    "input_artifact_ids",
    "lock_problems",
    "seal_lock",
]

LOCK_VERSION = 1
INPUTS_FIELD = "inputs"
MAX_INPUTS = 100
_ARTIFACT_ID = re.compile(r"art_[0-9a-f]{32}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_LOCK_DIGEST = "lockDigest"


class BadInputs(ValueError):
    """The spec's `inputs` is not a list of artifact ids."""


def canonical_bytes(value: Any) -> bytes:
    """THE canonical encoding digests are taken over (sorted keys, compact, UTF-8)."""
    return canonical_json(value).encode("utf-8")


def bytes_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    """The digest of a JSON value: sha256 over its canonical encoding."""
    return bytes_digest(canonical_bytes(value))


def input_artifact_ids(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The artifact ids the spec's `inputs` names, in order, without repeats."""
    inputs = spec.get(INPUTS_FIELD)
    if inputs is None:
        return ()
    if not isinstance(inputs, list) or len(inputs) > MAX_INPUTS:
        raise BadInputs(f"executionSpec.{INPUTS_FIELD} must be a list of at most {MAX_INPUTS} artifact ids")
    for item in inputs:
        if not isinstance(item, str) or not _ARTIFACT_ID.fullmatch(item):
            shown = repr(item)[:80]
            raise BadInputs(f"executionSpec.{INPUTS_FIELD}: {shown} is not an artifact id (art_ + 32 hex)")
    return tuple(dict.fromkeys(inputs))


def seal_lock(
    run_id: str,
    tenant: str,
    agent_revision_id: str | None,
    execution_spec: Mapping[str, Any],
    artifacts: list[dict[str, Any]],
) -> dict[str, Any]:
    """The lock document: the spec, its digest, the artifacts, and a digest over all of it.

    `artifacts` are {artifactId, digest, sizeBytes, mediaType, download} in the spec's order."""
    body: dict[str, Any] = {
        "lockVersion": LOCK_VERSION,
        "runId": run_id,
        "tenant": tenant,
        "agentRevisionId": agent_revision_id,
        "executionSpec": dict(execution_spec),
        "specDigest": digest_of(dict(execution_spec)),
        "artifacts": artifacts,
    }
    return {**body, _LOCK_DIGEST: digest_of(body)}


def lock_problems(lock: Any) -> list[str]:
    """What is wrong with a lock document ([] when it verifies): shape, spec digest, lock digest."""
    if not isinstance(lock, Mapping):
        return ["the lock is not a JSON object"]
    problems: list[str] = []
    if lock.get("lockVersion") != LOCK_VERSION:
        problems.append(f"lockVersion {lock.get('lockVersion')!r} is not {LOCK_VERSION}")
    spec = lock.get("executionSpec")
    if not isinstance(spec, Mapping):
        return [*problems, "the lock has no executionSpec object"]
    if lock.get("specDigest") != digest_of(dict(spec)):
        problems.append(f"the executionSpec does not match its specDigest {str(lock.get('specDigest'))[:80]}")
    body = {k: v for k, v in lock.items() if k != _LOCK_DIGEST}
    if lock.get(_LOCK_DIGEST) != digest_of(body):
        problems.append(f"the lock does not match its lockDigest {str(lock.get(_LOCK_DIGEST))[:80]}")
    artifacts = lock.get("artifacts")
    if not isinstance(artifacts, list):
        return [*problems, "the lock has no artifacts list"]
    try:
        named = input_artifact_ids(spec)
    except BadInputs as exc:
        return [*problems, str(exc)]
    listed = [a.get("artifactId") if isinstance(a, Mapping) else None for a in artifacts]
    if listed != list(named):
        problems.append("the lock's artifacts are not the ones its executionSpec names")
    for entry in artifacts:
        if not isinstance(entry, Mapping) or not _DIGEST.fullmatch(str(entry.get("digest"))):
            problems.append(f"artifact entry {str(entry)[:80]} has no sha256 digest")
    return problems
