"""Deterministic identifiers.

Every event id is derived from its cause (the command or event that produced it), so that a
processor that re-handles a command after a crash produces byte-identical events and every
consumer can drop the repeat by id or by (aggregate, version).
"""

from __future__ import annotations

import hashlib
import re

from services.runner_sdk.hashing import action_hash, canonical_json  # the one definition (SDK)

__all__ = [
    "ACTION_HASH_PATTERN",
    "ATTEMPT_ID_PATTERN",
    "GRANT_ID_PATTERN",
    "INCIDENT_ID_PATTERN",
    "RUN_ID_PATTERN",
    "STATE_HASH_PATTERN",
    "action_hash",
    "canonical_json",
    "command_id_for",
    "derived_id",
    "is_attempt_id",
    "is_grant_id",
    "is_incident_id",
    "is_run_id",
    "run_id_for",
    "sha256_digest",
    "tenant_shard",
]

# The shapes of the ids Tenure issues (run_id_for below; attempt and grant ids are made by the
# Run aggregate, lease_coordinator.domain attempt_id_for / grant_id_for; incident ids by
# derived_id). An edge that receives an id checks its shape first, so a malformed id is "no such
# resource", never an exception deep in routing or encoding.
RUN_ID_PATTERN = r"^run_[0-9a-f]{32}$"
# The epoch is an Avro long: at most 19 digits, never 0.
ATTEMPT_ID_PATTERN = r"^att_[0-9a-f]{32}_[1-9][0-9]{0,18}$"
GRANT_ID_PATTERN = r"^grant_[0-9a-f]{32}_[0-9a-f]{16}$"
INCIDENT_ID_PATTERN = r"^inc_[0-9a-f]{32}$"
_RUN_ID = re.compile(RUN_ID_PATTERN)
_ATTEMPT_ID = re.compile(ATTEMPT_ID_PATTERN)
_GRANT_ID = re.compile(GRANT_ID_PATTERN)
_INCIDENT_ID = re.compile(INCIDENT_ID_PATTERN)


def _shaped(pattern: re.Pattern[str], value: object) -> bool:
    # fullmatch, not match: "$" alone would also accept a trailing newline.
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def is_run_id(value: object) -> bool:
    return _shaped(_RUN_ID, value)


def is_attempt_id(value: object) -> bool:
    return _shaped(_ATTEMPT_ID, value)


def is_grant_id(value: object) -> bool:
    return _shaped(_GRANT_ID, value)


def is_incident_id(value: object) -> bool:
    return _shaped(_INCIDENT_ID, value)


# WD-4: a step's action is named by a 64-bit xxHash of its tool id and canonical JSON arguments,
# 16 lowercase hex digits; a state snapshot by the SHA-256 of its canonical form (WD-1).
ACTION_HASH_PATTERN = r"^[0-9a-f]{16}$"
STATE_HASH_PATTERN = r"^[0-9a-f]{64}$"


def sha256_digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _short_hash(*parts: str) -> str:
    # The unit separator cannot appear in ids we accept, so ("a", "bc") and ("ab", "c") differ.
    joined = "\x1f".join(parts).encode("utf-8")
    return hashlib.sha256(joined).hexdigest()[:32]


def derived_id(prefix: str, *cause: str) -> str:
    """An id that is a pure function of its cause, e.g. derived_id("evt", command_id, "RunSubmitted")."""
    return f"{prefix}_{_short_hash(prefix, *cause)}"


def tenant_shard(tenant: str) -> str:
    """Two hex digits fixed by the tenant: every run of a tenant carries the same shard."""
    return hashlib.sha256(tenant.encode("utf-8")).hexdigest()[:2]


def run_id_for(tenant: str, idempotency_key: str) -> str:
    """The run id of a submission: the same tenant and Idempotency-Key always name the same run.

    The id starts with the tenant's shard, so all runs of a tenant live in one partition and the
    processor that owns it can keep the tenant's admission counters alone (EXE-2).
    """
    return f"run_{tenant_shard(tenant)}{_short_hash('run', tenant, idempotency_key)[:30]}"


def command_id_for(run_id: str, command_type: str, idempotency_key: str) -> str:
    """The id of a command sent on behalf of a caller's Idempotency-Key (retries collapse into one)."""
    return derived_id("cmd", run_id, command_type, idempotency_key)
