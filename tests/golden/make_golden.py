"""Writes golden single-object samples for every schema version; run by hand, never by tests.

    python tests/golden/make_golden.py

For each `<RecordName>.v<N>.avsc` under schemas/ it writes `<RecordName>.v<N>.bin` (the bytes
that version's writer produces) and `<RecordName>.v<N>.json` (what was written), from the fixed
values below. JSON keys keep the written order: Avro writes map entries in insertion order, so
the .json must replay that order to re-encode the same bytes. Existing goldens are never
rewritten: they pin what is already on the log, and test_schema_evolution.py must keep
decoding them forever. Adding a schema version means adding its sample here and running this
script once; to replace a golden, delete it on purpose first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).resolve().parent
REPO_ROOT = GOLDEN_DIR.parents[1]
sys.path.insert(0, str(REPO_ROOT))

from services.common.avro import SchemaRegistry  # noqa: E402  (needs the sys.path line above)

_SPEC = '{"entrypoint":"agent run","image":"registry.local/agent@sha256:0f0e","resources":{"cpu":2}}'
_COMMAND = {
    "commandId": "cmd-7f3a9c",
    "runId": "run-0001",
    "issuedAt": 1_767_225_600_123,  # 2026-01-01T00:00:00.123Z
    "correlationId": "corr-42",
    "actor": "user:alice@example.org",
}
_EVENT = {
    "runId": "run-0001",
    "occurredAt": 1_767_225_600_456,
    "correlationId": "corr-42",
    "actor": "user:alice@example.org",
}
_RUN_SUBMITTED_V1 = {
    **_EVENT,
    "eventId": "evt-submitted-1",
    "version": 1,
    "causationId": "cmd-7f3a9c",
    "tenant": "acme",
    "idempotencyKey": "idem-2026-01-01-é",
    "executionSpec": _SPEC,
    "specDigest": "sha256:5d41402abc4b2a76b9719d911017c592ae1b9b7a2b1c1f6a3f2d0b1c9e8f7a6b",
    "retrySafe": True,
    "timeoutSeconds": 3600,
    "maxAttempts": 3,
    "queueReservationId": "resv-9",
}
_SUBMIT_RUN_V1 = {
    **_COMMAND,
    "tenant": "acme",
    "idempotencyKey": "idem-2026-01-01-é",
    "executionSpec": _SPEC,
    "retrySafe": True,
    "timeoutSeconds": 3600,
    "maxAttempts": 5,
}
# One Run's lease story: runner-7 claims it, renews, goes quiet, and an operator takes over.
_ATTEMPT = {"attemptId": "att-0001-1", "leaseId": "lease-0001-1", "epoch": 1}
_ATTEMPT_CLAIMED_V1 = {
    **_EVENT,
    **_ATTEMPT,
    "actor": "runner:runner-7",
    "correlationId": "corr-claim-1",
    "eventId": "evt-claimed-2",
    "version": 2,
    "causationId": "cmd-claim-1",
    "attemptNumber": 1,
    "holder": "runner-7",
    "holderKind": "runner",
    "capabilities": ["checkpoint-v1", "gpu-a100"],
    "leaseSeconds": 90,
    "heartbeatSeconds": 20,
    "atRiskAfterMs": 40_000,
    "expiresAt": 1_767_225_690_456,
}
# The first claim (occurredAt ...600_456) fixes the deadline: timeoutSeconds 3600 later (EXE-10).
_DEADLINE_AT = 1_767_229_200_456
_HOLDER_COMMAND = {**_COMMAND, "actor": "runner:runner-7", "correlationId": "corr-claim-1"}
_LEASE_EVENT = {**_EVENT, "actor": "runner:runner-7", "correlationId": "corr-claim-1"}
# The ResultManifest of a successful Attempt (issue 4b): two artifacts, one with a non-ASCII id.
_MANIFEST = [
    {
        "artifactId": "art-report",
        "digest": "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",
        "sizeBytes": 3,
        "mediaType": "text/plain",
    },
    {
        "artifactId": "отчёт-2",
        "digest": "sha256:fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9",
        "sizeBytes": 5_368_709_120,  # 5 GiB: sizes need a long
        "mediaType": "application/json",
    },
]
_CHECKPOINT_DIGEST = "sha256:486ea46224d1bb4fb680f34f7c9ad96a8f24ec88be73ea8e5a6c65260e9cb8a7"
_INPUT_SCHEMA = '{"properties":{"approve":{"type":"boolean"}},"required":["approve"],"type":"object"}'

SAMPLES: dict[tuple[str, int], dict[str, Any]] = {
    ("tenure.runs.commands.SubmitRun", 1): _SUBMIT_RUN_V1,
    ("tenure.runs.commands.CancelRun", 1): {
        **_COMMAND,
        "commandId": "cmd-cancel-1",
        "reason": "отмена оператором ✓",
    },
    ("tenure.runs.events.RunSubmitted", 1): _RUN_SUBMITTED_V1,
    ("tenure.runs.events.RunSubmitted", 2): {
        **_RUN_SUBMITTED_V1,
        "labels": {"team": "search", "priority": "high"},
    },
    ("tenure.runs.events.RunCancelled", 1): {
        **_EVENT,
        "eventId": "evt-cancelled-2",
        "version": 2,
        "causationId": "cmd-cancel-1",
        "reason": "отмена оператором ✓",
        "previousStatus": "queued",
        "reservationReleased": True,
    },
    ("tenure.runs.rejections.CommandRejected", 1): {
        **_EVENT,
        "runId": "run-missing",
        "eventId": "rej-1",
        "causationId": "cmd-cancel-9",
        "commandType": "CancelRun",
        "code": "RUN_NOT_FOUND",
        "detail": "no run with id run-missing",
        "currentStatus": None,
        "currentVersion": 0,
    },
    # --- leases and effects (issue 3) ---
    ("tenure.runs.commands.ClaimRun", 1): {
        **_HOLDER_COMMAND,
        "commandId": "cmd-claim-1",
        "runnerId": "runner-7",
        "holderKind": "runner",
        "capabilities": ["checkpoint-v1", "gpu-a100"],
        "leaseSeconds": 90,
        "heartbeatSeconds": 20,
    },
    ("tenure.runs.commands.RenewLease", 1): {
        **_HOLDER_COMMAND,
        "commandId": "cmd-renew-3",
        "attemptId": "att-0001-1",
        "leaseEpoch": 1,
        "sequence": 3,
    },
    ("tenure.runs.commands.ReportAttempt", 1): {
        **_HOLDER_COMMAND,
        "commandId": "cmd-report-1",
        "attemptId": "att-0001-1",
        "leaseEpoch": 1,
        "sequence": 4,
        "outcome": "failed",
        "errorCode": "TOOL_TIMEOUT",
        "detail": "инструмент не ответил за 30 секунд",
    },
    ("tenure.runs.commands.TakeOverLease", 1): {
        **_COMMAND,
        "commandId": "cmd-takeover-1",
        "actor": "user:oncall@example.org",
        "reason": "runner-7 unreachable ✗",
        "newHolder": "user:oncall@example.org",
        "holderKind": "human",
        "leaseSeconds": 600,
    },
    ("tenure.runs.commands.RecordEffectIntent", 1): {
        **_HOLDER_COMMAND,
        "commandId": "cmd-intent-1",
        "attemptId": "att-0001-1",
        "leaseEpoch": 1,
        "effectId": "eff-1",
        "idempotencyKey": "run-0001/eff-1",
        "tool": "jira",
        "operation": "create_ticket",
    },
    ("tenure.runs.commands.RecordEffectOutcome", 1): {
        **_HOLDER_COMMAND,
        "commandId": "cmd-outcome-1",
        "attemptId": "att-0001-1",
        "leaseEpoch": 1,
        "effectId": "eff-1",
        "outcome": "unknown",
        "detail": "connection reset after the request was sent",
    },
    ("tenure.runs.events.AttemptClaimed", 1): _ATTEMPT_CLAIMED_V1,
    ("tenure.runs.events.LeaseRenewed", 1): {
        **_LEASE_EVENT,
        **_ATTEMPT,
        "occurredAt": 1_767_225_620_456,
        "eventId": "evt-renewed-3",
        "version": 3,
        "causationId": "cmd-renew-1",
        "sequence": 1,
        "expiresAt": 1_767_225_710_456,
        "runStarted": True,
    },
    ("tenure.runs.events.LeaseAtRisk", 1): {
        **_LEASE_EVENT,
        **_ATTEMPT,
        "occurredAt": 1_767_225_660_456,  # lastRenewalAt + atRiskAfterMs
        "eventId": "evt-at-risk-4",
        "version": 4,
        "causationId": "evt-renewed-3",
        "lastRenewalAt": 1_767_225_620_456,
        "expiresAt": 1_767_225_710_456,
    },
    ("tenure.runs.events.LeaseExpired", 1): {
        **_LEASE_EVENT,
        **_ATTEMPT,
        "occurredAt": 1_767_225_711_002,
        "eventId": "evt-expired-5",
        "version": 5,
        "causationId": "evt-at-risk-4",
        "expiresAt": 1_767_225_710_456,
        "lastRenewalAt": 1_767_225_620_456,
        "lastSequence": 1,
    },
    ("tenure.runs.events.RunRequeued", 1): {
        **_LEASE_EVENT,
        "occurredAt": 1_767_225_711_002,
        "eventId": "evt-requeued-6",
        "version": 6,
        "causationId": "evt-expired-5",
        "reason": "LEASE_EXPIRED",
        "attemptsUsed": 1,
        "attemptsRemaining": 2,
    },
    ("tenure.runs.events.LeaseTakenOver", 1): {
        **_EVENT,
        "actor": "user:oncall@example.org",
        "occurredAt": 1_767_225_665_000,
        "eventId": "evt-taken-over-4",
        "version": 4,
        "causationId": "cmd-takeover-1",
        "previousAttemptId": "att-0001-1",
        "previousLeaseId": "lease-0001-1",
        "previousEpoch": 1,
        "previousHolder": "runner-7",
        "attemptId": "att-0001-2",
        "leaseId": "lease-0001-2",
        "epoch": 2,
        "holder": "user:oncall@example.org",
        "holderKind": "human",
        "reason": "runner-7 unreachable ✗",
        "lastRenewalAt": 1_767_225_620_456,
        "lastSequence": 1,
        "effectsAttempted": ["eff-1", "eff-2"],
        "leaseSeconds": 600,
        "heartbeatSeconds": 20,
        "atRiskAfterMs": 40_000,
        "expiresAt": 1_767_226_265_000,
    },
    ("tenure.runs.events.AttemptReported", 1): {
        **_LEASE_EVENT,
        **_ATTEMPT,
        "occurredAt": 1_767_225_650_456,
        "eventId": "evt-reported-4",
        "version": 4,
        "causationId": "cmd-report-1",
        "sequence": 4,
        "outcome": "failed",
        "errorCode": "TOOL_TIMEOUT",
        "detail": "инструмент не ответил за 30 секунд",
    },
    ("tenure.runs.events.EffectIntentRecorded", 1): {
        **_LEASE_EVENT,
        **_ATTEMPT,
        "occurredAt": 1_767_225_630_456,
        "eventId": "evt-intent-4",
        "version": 4,
        "causationId": "cmd-intent-1",
        "effectId": "eff-1",
        "idempotencyKey": "run-0001/eff-1",
        "tool": "jira",
        "operation": "create_ticket",
    },
    ("tenure.runs.events.EffectOutcomeRecorded", 1): {
        **_LEASE_EVENT,
        **_ATTEMPT,
        "occurredAt": 1_767_225_640_456,
        "eventId": "evt-outcome-5",
        "version": 5,
        "causationId": "cmd-outcome-1",
        "effectId": "eff-1",
        "outcome": "unknown",
        "detail": "connection reset after the request was sent",
    },
    # --- cancel of running runs, deadlines, retries (issue 4) ---
    ("tenure.runs.commands.SubmitRun", 2): {
        **_SUBMIT_RUN_V1,
        "commandId": "cmd-resubmit-1",
        "runId": "run-0002",
        "idempotencyKey": "retry-of-run-0001",
        "parentRunId": "run-0001",
    },
    ("tenure.runs.events.RunSubmitted", 3): {
        **_RUN_SUBMITTED_V1,
        "labels": {"team": "search", "priority": "high"},
        "parentRunId": "run-0000",
    },
    ("tenure.runs.events.AttemptClaimed", 2): {
        **_ATTEMPT_CLAIMED_V1,
        "deadlineAt": _DEADLINE_AT,
    },
    ("tenure.runs.commands.RetryRun", 1): {
        **_COMMAND,
        "commandId": "cmd-retry-1",
        "acknowledgeRepeatedEffects": True,
        "reason": "повторить: внешний сервис снова доступен",
    },
    ("tenure.runs.events.RunCancelRequested", 1): {
        **_EVENT,
        "occurredAt": 1_767_225_630_000,
        "eventId": "evt-cancel-requested-4",
        "version": 4,
        "causationId": "cmd-cancel-1",
        "reason": "отмена оператором ✓",
        "previousStatus": "running",
        "attemptId": "att-0001-1",
        "epoch": 1,
        "graceUntil": 1_767_225_660_000,
    },
    ("tenure.runs.events.RunInterrupted", 1): {
        **_EVENT,
        "actor": "system:lease-coordinator",
        "occurredAt": 1_767_225_660_010,
        "eventId": "evt-interrupted-5",
        "version": 5,
        "causationId": "evt-cancel-requested-4",
        "reason": "CANCEL_UNCONFIRMED",
        "attemptId": "att-0001-1",
        "epoch": 1,
        "detail": "runner-7 did not confirm the stop within 30 s",
    },
    ("tenure.runs.events.DeadlineReached", 1): {
        **_LEASE_EVENT,
        "actor": "system:lease-coordinator",
        "occurredAt": 1_767_229_200_731,
        "eventId": "evt-deadline-7",
        "version": 7,
        "causationId": "evt-renewed-6",
        "deadlineAt": _DEADLINE_AT,
        "previousStatus": "running",
        "stopRequested": True,
        "attemptId": "att-0001-1",
        "epoch": 1,
        "graceUntil": 1_767_229_230_731,
    },
    ("tenure.runs.events.RunFailed", 1): {
        **_LEASE_EVENT,
        "occurredAt": 1_767_229_210_004,
        "eventId": "evt-failed-8",
        "version": 8,
        "causationId": "cmd-report-2",
        "code": "DEADLINE_EXCEEDED",
        "detail": "stopped at the deadline; остановлено по сроку",
        "attemptId": "att-0001-1",
        "epoch": 1,
    },
    ("tenure.runs.events.RunRetried", 1): {
        **_EVENT,
        "occurredAt": 1_767_225_700_000,
        "eventId": "evt-retried-6",
        "version": 6,
        "causationId": "cmd-retry-1",
        "acknowledgedRepeatedEffects": True,
        "reason": "повторить: внешний сервис снова доступен",
        "attemptsUsed": 1,
        "previousStatus": "interrupted",
    },
    # --- waiting for input, upload grants, the result manifest (issue 4b) ---
    ("tenure.runs.commands.ReportAttempt", 2): {
        **_HOLDER_COMMAND,
        "commandId": "cmd-report-2",
        "attemptId": "att-0001-1",
        "leaseEpoch": 1,
        "sequence": 9,
        "outcome": "succeeded",
        "errorCode": "",
        "detail": "",
        "manifest": _MANIFEST,
        "manifestVerified": True,
        "manifestProblem": "",
    },
    ("tenure.runs.events.AttemptReported", 2): {
        **_LEASE_EVENT,
        **_ATTEMPT,
        "occurredAt": 1_767_225_690_001,
        "eventId": "evt-reported-9",
        "version": 9,
        "causationId": "cmd-report-2",
        "sequence": 9,
        "outcome": "succeeded",
        "errorCode": "",
        "detail": "",
        "manifest": _MANIFEST,
    },
    ("tenure.runs.commands.RequestInput", 1): {
        **_HOLDER_COMMAND,
        "commandId": "cmd-input-1",
        "attemptId": "att-0001-1",
        "leaseEpoch": 1,
        "sequence": 5,
        "checkpointDigest": _CHECKPOINT_DIGEST,
        "inputSchema": _INPUT_SCHEMA,
        "prompt": "Удалить 3 файла? Delete 3 files?",
        "expiresAt": 1_767_312_000_000,
    },
    ("tenure.runs.commands.ProvideInput", 1): {
        **_COMMAND,
        "commandId": "cmd-answer-1",
        "responseId": "resp-1",
        "answer": '{"approve":true}',
    },
    ("tenure.runs.commands.RequestUploadGrant", 1): {
        **_HOLDER_COMMAND,
        "commandId": "cmd-grant-1",
        "attemptId": "att-0001-1",
        "leaseEpoch": 1,
        "destination": "reports/отчёт.json",
        "maxBytes": 5_368_709_120,
        "mediaType": "application/json",
    },
    ("tenure.runs.events.InputRequested", 1): {
        **_LEASE_EVENT,
        "occurredAt": 1_767_225_640_001,
        "eventId": "evt-input-requested-5",
        "version": 5,
        "causationId": "cmd-input-1",
        "attemptId": "att-0001-1",
        "epoch": 1,
        "requestId": "inreq-0001-1",
        "checkpointDigest": _CHECKPOINT_DIGEST,
        "inputSchema": _INPUT_SCHEMA,
        "prompt": "Удалить 3 файла? Delete 3 files?",
        "expiresAt": 1_767_312_000_000,
    },
    ("tenure.runs.events.InputProvided", 1): {
        **_EVENT,
        "occurredAt": 1_767_226_000_000,
        "eventId": "evt-input-provided-6",
        "version": 6,
        "causationId": "cmd-answer-1",
        "requestId": "inreq-0001-1",
        "responseId": "resp-1",
        "answer": '{"approve":true}',
        "checkpointDigest": _CHECKPOINT_DIGEST,
    },
    ("tenure.runs.events.UploadGrantIssued", 1): {
        **_LEASE_EVENT,
        "occurredAt": 1_767_225_645_000,
        "eventId": "evt-grant-5",
        "version": 5,
        "causationId": "cmd-grant-1",
        "grantId": "grant-0001-1",
        "attemptId": "att-0001-1",
        "epoch": 1,
        "destination": "reports/отчёт.json",
        "keyPrefix": "runs/run-0001/att-0001-1/",
        "maxBytes": 1_073_741_824,
        "mediaType": "application/json",
        "expiresAt": 1_767_226_545_000,
    },
    ("tenure.policy.events.BlockChanged", 1): {
        "eventId": "blk-0001",
        "subjectKind": "principal",
        "subject": "rita",
        "blocked": True,
        "reason": "credentials leaked",
        "occurredAt": 1_767_225_650_000,
        "actor": "olga",
    },
}


# The saga's records (tenure.trajectories.*, tenure.incidents.*) get values built from their
# declared fields: one plausible value per field name or type, so every field is non-default.
_SAGA_VALUES: dict[str, Any] = {
    "commandId": "cmd-saga-1",
    "eventId": "evt-saga-1",
    "runId": "run_a1000000000000000000000000000001",
    "issuedAt": 1_767_225_600_123,
    "occurredAt": 1_767_225_600_456,
    "correlationId": "corr-saga-1",
    "actor": "runner:runner-7",
    "causationId": "cmd-saga-1",
    "version": 3,
    "attemptId": "att_a1000000000000000000000000000001_1",
    "leaseEpoch": 1,
    "epoch": 1,
    "plan": '{"order":[{"after":[],"params":{"name":"web"},"stepId":"vm","tool":"vm.provision"}],'
    '"outbox":[],"pivot":null,"reordered":false}',
    "pivotApproval": "human",
    "tool": "vm.provision",
    "gatewayTool": "env",
    "operation": "vm.provision",
    "params": '{"name":"web"}',
    "output": '{"vmId":"vm-0f0e0d0c0b"}',
    "partialOutput": '{"ruleId":"rule-1a2b3c4d5e"}',
    "compensation": '{"costMoney":0.0,"costMs":45,"gatewayTool":"env","operation":"vm.terminate",'
    '"params":{"vmId":"vm-0f0e0d0c0b"}}',
    "idempotencyKey": "run_a1000000000000000000000000000001/s0/d1",
    "reversibility": "II",
    "status": "pending",
    "outcome": "committed",
    "errorKind": "conflict",
    "errorMessage": "the domain is owned by another tenant",
    "errorStatus": 409,
    "errorClass": "fatal",
    "signature": "490df786983f" + "0" * 52,
    "checks": '[{"detail":"epoch 1 held","name":"lease-active","passed":true}]',
    "verdict": "passed",
    "decision": "approve",
    "action": "BACKWARD_ROLLBACK",
    "gate": "gate-1-taxonomy",
    "inputs": '{"errorClass":"fatal","p":"0.5000"}',
    "severity": "fatal",
    "failureMode": "COMPENSATION_CORRUPTED",
    "resolution": "resume",
    "incidentId": "inc_7f3a9c",
    "errorContext": '{"kind":"auth-revoked","message":"credentials revoked"}',
    "uncompensated": '[{"stepIndex":1,"tool":"ip.reserve"}]',
    "snapshotRef": "tenure://trajectories/run_a1000000000000000000000000000001?version=9&sha256=ab",
    "logTopic": "trajectories.events",
}
# The semantic watchdog's records (tenure.watchdog.*, WD-1..WD-5) and the trajectory's side of
# them: hashes in their real shapes (16 hex digits of xxHash64, 64 of SHA-256).
_ACTION_HASH = "9f86d081884c7d65"
_STATE_A = "a19cb74e" + "0" * 56
_STATE_B = "c3e290ba" + "0" * 56
_SAGA_VALUES.update(
    {
        "source": "runner",
        "stepSeq": 7,
        "actionHash": _ACTION_HASH,
        "stateHash": _STATE_A,
        "summary": "FAILED tests/test_config.py::test_line_42 - 3 passed, 1 failed",
        "metrics": [3.0, -1.0],
        "detector": "cycle",
        "code": "STATE_OSCILLATION_DETECTED",
        "repeatedHashes": [_STATE_A, _STATE_B],
        "windowSteps": [5, 6, 7],
        "windowHashes": [_STATE_A, _STATE_B, _STATE_A],
        "metricHistory": "[[4.0,-1.0],[3.0,-1.0]]",
        "truncatedSteps": [5, 6, 7],
        "checkpointStateHash": _STATE_B,
        "restoredStateHash": _STATE_B,
        "origin": "run",
        "interventionId": "itv_7f3a9c",
        "detectionId": "det_7f3a9c",
        "message": "[SYSTEM ALERT: SEMANTIC_WATCHDOG_INTERRUPT] STATE_OSCILLATION_DETECTED (k=2)",
    }
)
# The circuit breakers' records (tenure.breakers.*, BRK-1, BRK-2): one endpoint's story, from a
# failing window through a failed and a successful canary; the aggregate id is the endpoint.
_BREAKER_COMMAND = {**_COMMAND, "runId": "env/vm.provision", "actor": "service:gateway-a"}
_BREAKER_EVENT = {
    **_EVENT,
    "runId": "env/vm.provision",
    "actor": "service:gateway-a",
    "causationId": "cmd-brk-1",
}
_CANARY = {"canaryId": "cny_4c1f9a", "instanceId": "gateway-a"}
SAMPLES.update(
    {
        ("tenure.breakers.commands.RecordCallOutcome", 1): {
            **_BREAKER_COMMAND,
            "instanceId": "gateway-a",
            "seq": 1_767_225_600_123_000,
            "outcome": "transport-failure",
            "durationMs": 5002,
            "detail": "HTTP 504 Gateway Timeout",
        },
        ("tenure.breakers.commands.RequestCanary", 1): {**_BREAKER_COMMAND, "instanceId": "gateway-a"},
        ("tenure.breakers.commands.ReportCanary", 1): {
            **_BREAKER_COMMAND,
            **_CANARY,
            "outcome": "success",
            "durationMs": 21,
            "detail": "HTTP 404 (an application error: the endpoint answered)",
        },
        ("tenure.breakers.commands.ForceOpenBreaker", 1): {
            **_BREAKER_COMMAND,
            "actor": "user:ops@example.org",
            "reason": "vendor incident INC-77 — maintenance window",
        },
        ("tenure.breakers.commands.DisableBreaker", 1): {
            **_BREAKER_COMMAND,
            "actor": "user:ops@example.org",
            "reason": "flaky health of the breaker itself",
        },
        ("tenure.breakers.commands.ResetBreaker", 1): {
            **_BREAKER_COMMAND,
            "actor": "user:ops@example.org",
            "reason": "vendor recovered",
        },
        ("tenure.breakers.events.CallOutcomeRecorded", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0001",
            "version": 20,
            "instanceId": "gateway-b",
            "seq": 1_767_225_600_200_001,
            "outcome": "transport-failure",
            "durationMs": 5001,
            "detail": "connect timeout",
            "failure": True,
            "counted": True,
            "windowSize": 20,
        },
        ("tenure.breakers.events.BreakerOpened", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0002",
            "version": 21,
            "window": [False] * 8 + [True] * 12,
            "calls": 20,
            "failures": 12,
            "errorRate": 0.6,
            "threshold": 0.5,
            "minCalls": 10,
            "cooldownMs": 30_000,
            "halfOpenAt": 1_767_225_630_456,
        },
        ("tenure.breakers.events.BreakerHalfOpened", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0003",
            "version": 22,
            "actor": "tenure-breakers",
            "causationId": "timer/env/vm.provision/1767225600456",
            "openedAt": 1_767_225_600_456,
            "cooldownMs": 30_000,
        },
        ("tenure.breakers.events.CanaryGranted", 1): {
            **_BREAKER_EVENT,
            **_CANARY,
            "eventId": "brk_0004",
            "version": 23,
            "grantedFrom": "half-open",
            "expiresAt": 1_767_225_615_456,
            "expiredCanaryId": "",
        },
        ("tenure.breakers.events.CanaryExpired", 1): {
            **_BREAKER_EVENT,
            **_CANARY,
            "eventId": "brk_0005",
            "version": 24,
            "actor": "tenure-breakers",
            "causationId": "timer/cny_4c1f9a",
            "expiresAt": 1_767_225_615_456,
        },
        ("tenure.breakers.events.BreakerReopened", 1): {
            **_BREAKER_EVENT,
            **_CANARY,
            "eventId": "brk_0006",
            "version": 25,
            "outcome": "transport-failure",
            "durationMs": 5000,
            "detail": "HTTP 503",
            "previousCooldownMs": 30_000,
            "cooldownMs": 60_000,
            "halfOpenAt": 1_767_225_660_456,
        },
        ("tenure.breakers.events.BreakerClosed", 1): {
            **_BREAKER_EVENT,
            **_CANARY,
            "eventId": "brk_0007",
            "version": 26,
            "outcome": "success",
            "durationMs": 21,
            "openForMs": 90_000,
        },
        ("tenure.breakers.events.BreakerForcedOpen", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0008",
            "version": 27,
            "actor": "user:ops@example.org",
            "reason": "vendor incident INC-77 — maintenance window",
            "previousStatus": "closed",
        },
        ("tenure.breakers.events.BreakerDisabled", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0009",
            "version": 28,
            "actor": "user:ops@example.org",
            "reason": "flaky health of the breaker itself",
            "previousStatus": "forced-open",
        },
        ("tenure.breakers.events.BreakerReset", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0010",
            "version": 29,
            "actor": "user:ops@example.org",
            "reason": "vendor recovered",
            "previousStatus": "disabled",
        },
    }
)
_BY_TYPE: dict[str, Any] = {"string": "value", "long": 2, "double": 0.25, "boolean": True}


def _saga_sample(declared: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for field in declared["fields"]:
        name, kind = field["name"], field["type"]
        if name in _SAGA_VALUES:
            record[name] = _SAGA_VALUES[name]
        elif isinstance(kind, dict) and kind.get("type") == "array":
            record[name] = [3, 2, 1]
        elif isinstance(kind, dict):
            record[name] = 1_767_225_600_789
        else:
            record[name] = f"{name}-1" if kind == "string" else _BY_TYPE[kind]
    return record


def main() -> int:
    registry = SchemaRegistry.from_directory(REPO_ROOT / "schemas")
    for name in registry.names():
        for v in registry.versions(name):
            if v.full_name.startswith(("tenure.trajectories.", "tenure.incidents.", "tenure.watchdog.")):
                SAMPLES.setdefault((v.full_name, v.version), _saga_sample(v.declared))
    missing = [
        f"{v.full_name} v{v.version}"
        for name in registry.names()
        for v in registry.versions(name)
        if (v.full_name, v.version) not in SAMPLES
    ]
    if missing:
        print("no sample values for: " + ", ".join(missing), file=sys.stderr)
        return 1
    for (full_name, version), record in sorted(SAMPLES.items()):
        schema = registry.get(full_name, version)
        stem = f"{full_name.rsplit('.', 1)[1]}.v{version}"
        bin_path, json_path = GOLDEN_DIR / f"{stem}.bin", GOLDEN_DIR / f"{stem}.json"
        if bin_path.exists() or json_path.exists():
            print(f"kept    {bin_path.name} (goldens are never rewritten)")
            continue
        bin_path.write_bytes(registry.encode(full_name, record, version=version))
        expectation = {
            "schema": full_name,
            "version": version,
            "fingerprint": schema.fingerprint_hex,
            # Schema field order reads best; it does not change the encoding of a record.
            "record": {f["name"]: record[f["name"]] for f in schema.declared["fields"]},
        }
        json_path.write_text(
            json.dumps(expectation, indent=2, ensure_ascii=False) + "\n",
            encoding="utf-8",
        )
        print(f"wrote   {bin_path.name} + {json_path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
