"""Examples of the command API's 2xx bodies for the OpenAPI document, one per documented answer.

Taken from what the API answered in the README's walkthrough (ids shortened to readable ones);
a unit test validates each against its own schema, so an example cannot drift from the model.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["EXAMPLES"]

RUN = "run_82c9439b57fb09e5e164080b62323563"
ATT = f"att_{RUN[4:]}_1"
LEASE = "lease_0b42121e15c232a05ee71585358ed5ea"
T = 1796152650687  # 2026-12-01T19:17:30.687Z
DIGEST = "sha256:1fe440f48d3ba4391d1c0a0e0adb08cfc0f41a4b78636273b36d1e5d58448ebe"


def _at(ms: int) -> str:
    """The RFC 3339 sibling of an example's milliseconds, so the two agree."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


_SUBMITTED = {
    "type": "RunSubmitted", "version": 1, "eventId": "evt_e1ad29b614ced1f44bcbcff41d56a068",
    "occurredAt": T, "occurredAtRfc3339": _at(T), "actor": "svc",
    "causationId": "cmd_9cde824f1e1668d5ec778e241028a3b9", "correlationId": RUN,
}  # fmt: skip
_LEASE = {
    "leaseId": LEASE, "workId": RUN, "attemptId": ATT, "holder": "runner-a", "holderKind": "runner",
    "holderPrincipal": "svc", "epoch": 1, "issuedAt": T + 15, "issuedAtRfc3339": _at(T + 15),
    "expiresAt": T + 30_026, "expiresAtRfc3339": _at(T + 30_026),
    "expiryRule": {"leaseSeconds": 30, "heartbeatSeconds": 10, "atRiskAfterMs": 15000,
                   "clock": "coordinator"},
    "certainty": "active", "certaintyChangedAt": T + 15, "certaintyChangedAtRfc3339": _at(T + 15),
    "renewals": [{"sequence": 1, "at": T + 26, "expiresAt": T + 30_026, "expiresAtRfc3339": _at(T + 30_026)}],
    "takeoverReason": None, "takeoverEvidence": None, "endedAt": None, "endedAtRfc3339": None, "effects": [],
}  # fmt: skip
QUEUED_RUN: dict[str, Any] = {
    "runId": RUN, "tenant": "acme", "status": "queued", "statusReason": None, "version": 1,
    "idempotencyKey": "demo-1", "executionSpec": {"agent": "triage-bot", "input": "ticket 42"},
    "specDigest": DIGEST, "retrySafe": False, "timeoutSeconds": 900, "maxAttempts": 3, "labels": {},
    "agentRevisionId": None, "parentRunId": None, "deadlineAt": None, "deadlineAtRfc3339": None, "stop": None,
    "queueReservationId": "rsv_47a1888bf952e93a76d9cbc69d0071d2", "attempts": [], "lease": None,
    "leaseHistory": [], "submittedAt": T, "submittedAtRfc3339": _at(T), "updatedAt": T,
    "updatedAtRfc3339": _at(T), "submittedBy": "svc", "history": [_SUBMITTED],
}  # fmt: skip
RUNNING_RUN: dict[str, Any] = QUEUED_RUN | {
    "status": "running", "version": 3, "queueReservationId": None,
    "deadlineAt": T + 900_015, "deadlineAtRfc3339": _at(T + 900_015),
    "attempts": [{"attemptId": ATT, "attemptNumber": 1, "epoch": 1, "holder": "runner-a",
                  "claimedAt": T + 15, "claimedAtRfc3339": _at(T + 15), "outcome": None}],
    "lease": _LEASE, "updatedAt": T + 26, "updatedAtRfc3339": _at(T + 26),
    "history": [_SUBMITTED, _SUBMITTED | {"type": "AttemptClaimed", "version": 2, "occurredAt": T + 15,
                                          "occurredAtRfc3339": _at(T + 15), "details": {"attemptId": ATT}}],
}  # fmt: skip
CANCELLED_RUN = QUEUED_RUN | {
    "status": "cancelled",
    "statusReason": "demo",
    "version": 2,
    "queueReservationId": None,
}
PENDING = {
    "runId": RUN,
    "commandId": "cmd_9cde824f1e1668d5ec778e241028a3b9",
    "status": "pending",
    "detail": "the command is durable but no decision arrived within 10s; poll the run "
    "(or repeat the request with the same Idempotency-Key)",
}
GRANT: dict[str, Any] = {
    "runId": RUN, "attemptId": ATT, "attemptNumber": 1, "leaseId": LEASE, "epoch": 1, "holder": "runner-a",
    "holderKind": "runner", "expiresAt": T + 30_015, "expiresAtRfc3339": _at(T + 30_015), "leaseSeconds": 30,
    "heartbeatIntervalSeconds": 10, "serverTime": T + 15,
    "assignment": {"executionSpec": {"agent": "deployer"}, "specDigest": DIGEST}, "attemptContext": None,
}  # fmt: skip
_RENEWED = {
    "attemptId": ATT, "epoch": 1, "sequence": 1, "expiresAt": T + 30_026, "expiresAtRfc3339": _at(T + 30_026),
    "serverTime": T + 26, "certainty": "active", "runStatus": "running", "stopRequested": False,
    "stopKind": None, "stopGraceUntil": None, "watchdog": None,
}  # fmt: skip
TRAJECTORY: dict[str, Any] = {
    "runId": RUN, "version": 1, "status": "forward", "terminal": False, "attemptId": ATT, "epoch": 1,
    "pivotApproval": "none", "budget": {"tokens": 200000, "steps": 50, "money": 10.0},
    "rerunCost": {"durationMs": 0, "money": 0.0}, "plan": None, "pivotStep": None, "pivotCommitted": False,
    "stack": [], "compensated": [], "openStep": None, "steps": [], "decisions": [], "incident": None,
    "incidents": [], "recentCommands": [{"commandId": "cmd_4ed8c2a9c9ed167ccd99216f9288a623", "version": 1,
                                         "firstEvent": "TrajectoryStarted", "actor": "svc", "at": T + 70}],
    "watchdog": {"interruptAction": None, "tombstones": [], "semanticDeadlock": False, "intervention": None},
    "startedAt": T + 70, "startedAtRfc3339": _at(T + 70),
    "updatedAt": T + 70, "updatedAtRfc3339": _at(T + 70),
}  # fmt: skip
_INCIDENT = {
    "incidentId": "inc_5f0c3b1d2a4e6f708192a3b4c5d6e7f8", "runId": RUN, "failureMode": "COMPENSATION_FAILED",
    "failedStep": 1, "failedTool": "dns.update", "uncompensated": [], "epoch": 1, "openedAt": T + 9000,
    "openedAtRfc3339": _at(T + 9000), "version": 9, "resolution": None, "resolvedAt": None,
    "resolvedAtRfc3339": None, "resolvedBy": None,
}  # fmt: skip
WATCHDOG: dict[str, Any] = {
    "runId": RUN, "version": 2, "status": "watching", "terminal": False,
    "thresholds": {"maxPeriod": 4, "window": 12, "epochSteps": 3, "repeatCount": 3, "rollbackBudget": 2,
                   "ladderEpoch": 0, "pollPatience": 6},
    "configurations": [], "turn": 1, "rollbacks": {"used": 0, "budget": 2}, "pendingRollback": None,
    "tombstones": [], "pendingIntervention": None, "observations": [{"stepSeq": 1, "tool": "env.read"}],
    "detections": [], "interventions": [], "startedAt": _at(T + 80), "updatedAt": _at(T + 90),
}  # fmt: skip
SCHEDULE: dict[str, Any] = {
    "scheduleId": "sch_3f1a2b3c4d5e6f7a8b9c0d1e", "version": 1, "status": "active", "tenant": "acme",
    "owner": "svc", "agentRevisionId": None,
    "runTemplate": {"executionSpec": {"agent": "nightly"}, "retrySafe": True, "timeoutSeconds": 900,
                    "maxAttempts": 3, "labels": {}},
    "timeZone": "Europe/Berlin", "cron": "0 2 * * *", "overlapPolicy": "skip", "misfirePolicy": "run_once",
    "dst": {"nonexistent": "shift_forward", "repeated": "first"}, "nextRunAt": "2026-12-02T01:00:00Z",
    "nextFirings": [{"local": "2026-12-02T02:00:00+01:00", "utc": "2026-12-02T01:00:00Z"}], "activeRuns": [],
    "pending": None, "fired": 0, "skipped": 0, "history": [], "createdAt": _at(T), "updatedAt": _at(T),
}  # fmt: skip
BREAKER: dict[str, Any] = {
    "endpoint": "ledger", "status": "closed", "failsFast": False, "version": 3, "errorRate": 0.0,
    "window": {"size": 20, "calls": 3, "failures": 0, "errorRate": 0.0}, "cooldownMs": 30000,
    "cooldownRemainingMs": 0, "retryAfterMs": 0, "halfOpenAt": None, "openSince": None, "openedAt": None,
    "timesOpened": 0, "canaryHolder": None, "canary": None, "reason": None, "reportingInstances": 1,
    "lastTransition": None, "updatedAt": "2026-12-01T19:17:31.000Z",
}  # fmt: skip
QUARANTINE: dict[str, Any] = {
    "runId": RUN, "status": "none", "version": 0, "trigger": None, "stages": {}, "taintFrom": None,
    "holder": None, "leaseEpoch": None, "cleared": None, "taintedArtifacts": [], "suspectArtifacts": [],
    "suspectRuns": [], "uncompensatedEffects": [], "incidentId": None, "inFlightEffects": [],
}  # fmt: skip
ARTIFACT: dict[str, Any] = {
    "artifactId": "art_0c1d2e3f405162738495a6b7c8d9e0f1",
    "envelope": {"contentHash": "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
                 "producerRunId": RUN, "attemptId": ATT, "step": None, "sizeBytes": 5,
                 "mediaType": "text/plain", "source": "upload", "derivedFrom": [],
                 "registeredAt": "2026-12-01T19:17:31.000Z"},
    "taint": "clean", "taintOrigin": None, "tombstoned": False, "cleared": None,
}  # fmt: skip
BLOCK = {
    "subjectKind": "principal",
    "subject": "mallory",
    "blocked": True,
    "reason": "abuse",
    "by": "olga",
    "at": T,
}
_GRANT_ID = f"grant_{RUN[4:]}_67a30132aaaaf4bf"
_KEY = f"runs/{RUN}/{ATT}/out.txt"

EXAMPLES: dict[str, Any] = {
    "problem": {"type": "/problems/run-not-found", "title": "Run not found", "status": 404,
                "meaning": "No run with this id exists."},
    "health": {"status": "ok", "service": "tenure-command-api", "developmentMode": False},
    "ready": {"status": "ready", "service": "tenure-command-api", "developmentMode": False,
              "checks": {"kafka": {"ready": True, "detail": "a broker answered a metadata request"},
                         "runDecisions": {"ready": True, "detail": "caught up", "lag": 0}}},
    "queued_run": QUEUED_RUN,
    "running_run": RUNNING_RUN,
    "cancelled_run": CANCELLED_RUN,
    "run_page": {"items": [QUEUED_RUN], "nextCursor": None},
    "pending": PENDING,
    "grant": GRANT,
    "queue_grant": GRANT | {"queue": "default", "tenant": "acme", "waitedMs": 0},
    "heartbeat": _RENEWED,
    "renewals": {"results": [_RENEWED | {"status": "accepted"}], "accepted": 1, "replayed": 0, "refused": 0,
                 "pending": 0, "unavailable": 0},
    "lease_record": {"runId": RUN, "runStatus": "running", "lease": _LEASE, "previousLeases": []},
    "input_ack": {"acknowledged": True, "requestId": "inp_1a2b3c4d5e6f70819a2b3c4d5e6f7081",
                  "runStatus": "awaiting_input", "leaseReleased": True},
    "upload_grant": {"grantId": _GRANT_ID, "uploadUrl": f"/uploads/{_GRANT_ID}", "key": _KEY,
                     "artifactId": "out.txt", "maxBytes": 100, "mediaType": "text/plain",
                     "expiresAt": T + 900_000, "expiresAtRfc3339": _at(T + 900_000)},
    "upload": {"artifactId": "out.txt", "key": _KEY, "digest": ARTIFACT["envelope"]["contentHash"],
               "sizeBytes": 5, "mediaType": "text/plain", "artifactRef": ARTIFACT["artifactId"],
               "taint": "clean"},
    "trajectory": TRAJECTORY,
    "step_ticket": {"runId": RUN, "stepIndex": 0, "dispatch": 1, "idempotencyKey": f"{RUN}/step-0/1",
                    "tool": "env.reserve_ip", "status": "pending",
                    "commandId": "cmd_0a1b2c3d4e5f60718293a4b5c6d7e8f9",
                    "version": 2, "replayed": False, "watchdog": None},
    "incidents": {"items": [_INCIDENT]},
    "observation": {"runId": RUN, "commandId": "cmd_1b2c3d4e5f60718293a4b5c6d7e8f90a", "stepSeq": 1,
                    "actionHash": "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                    "status": "accepted", "replayed": False, "watchdog": None},
    "watchdog": WATCHDOG,
    "block": BLOCK,
    "block_pending": BLOCK | {"status": "pending"},
    "blocks": {"blocks": [BLOCK]},
    "breakers": {"breakers": [BREAKER], "count": 1, "serverTime": "2026-12-01T19:17:31.000Z"},
    "breaker": BREAKER | {"recentOutcomes": [False, False, False], "transitions": []},
    "breaker_override": BREAKER | {"status": "forced_open", "failsFast": True, "reason": "maintenance",
                                   "recentOutcomes": [], "transitions": [],
                                   "commandId": "cmd_2c3d4e5f60718293a4b5c6d7e8f90a1b", "replayed": False},
    "breaker_pending": {"endpoint": "ledger", "commandId": "cmd_2c3d4e5f60718293a4b5c6d7e8f90a1b",
                        "status": "pending", "detail": "the command is durable but this API has not seen "
                        "its decision yet; GET the breaker (or repeat the request with the same "
                        "Idempotency-Key)"},
    "bulkheads": {"defaultDomain": "external",
                  "pools": [{"pool": "external", "domain": "external", "concurrency": 16, "queue": 16,
                             "timeoutMs": 5000}],
                  "tools": [], "connectionLimit": 112,
                  "occupancy": "live occupancy is each effect gateway's own: its GET /bulkheads"},
    "schedule": SCHEDULE,
    "schedules": {"items": [SCHEDULE]},
    "schedule_pending": {"scheduleId": SCHEDULE["scheduleId"],
                         "commandId": "cmd_3d4e5f60718293a4b5c6d7e8f90a1b2c",
                         "status": "pending"},
    "quarantine": QUARANTINE,
    "artifact": ARTIFACT,
    "artifacts": {"items": [ARTIFACT], "count": 1, "tombstonedHidden": True},
    "bytes": "hello",
    "lock": {
        "lockVersion": 1,
        "runId": "run_9f2c4e1ab7d05e63",
        "tenant": "acme",
        "agentRevisionId": None,
        "executionSpec": {"agent": "summariser", "inputs": ["art_" + "3" * 32]},
        "specDigest": "sha256:" + "5" * 64,
        "artifacts": [
            {
                "artifactId": "art_" + "3" * 32,
                "digest": "sha256:" + "7" * 64,
                "sizeBytes": 5,
                "mediaType": "text/plain",
                "download": "/runs/run_9f2c4e1ab7d05e63/lock/artifacts/art_" + "3" * 32,
            }
        ],
        "lockDigest": "sha256:" + "9" * 64,
    },
}  # fmt: skip
