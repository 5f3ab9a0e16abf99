"""Golden sample values of quarantine and taint (tenure.quarantine.*, QUA-1, QUA-2)."""

from __future__ import annotations

from typing import Any

from golden_base import _COMMAND, _EVENT

__all__ = ["SAMPLES"]

# Quarantine and taint (tenure.quarantine.*, QUA-1, QUA-2): a run quarantined on an egress
# violation, its stages, its clearing; and a tenant's provenance graph (aggregate graph/acme).
_Q_RUN = "run_7f3a9c0000000000000000000000aa01"
_Q_COMMAND = {**_COMMAND, "runId": _Q_RUN, "actor": "service:gateway-a"}
_Q_EVENT = {**_EVENT, "runId": _Q_RUN, "actor": "service:gateway-a", "causationId": "cmd-q-1"}
_Q_GRAPH_COMMAND = {**_COMMAND, "runId": "graph/acme", "actor": "runner-a"}
_Q_GRAPH_EVENT = {**_EVENT, "runId": "graph/acme", "actor": "runner-a", "causationId": "cmd-g-1"}
_Q_TRIGGER = {
    "trigger": "egress-policy",
    "reason": "egress to attacker.example is not on the run's allowlist (ledger credit)",
    "evidence": '{"host":"attacker.example","tool":"ledger"}',
    "tenant": "acme",
    "holder": "runner-a",
    "leaseEpoch": 1,
    "attemptId": "att_7f3a9c0000000000000000000000aa01_1",
    "taintFromStep": -1,
    "taintFromAt": 0,
}
_Q_STAGE = {
    "stage": "suspended",
    "mechanism": "cgroup-v1-freezer",
    "completedAt": 1_767_225_600_460,
    "hostId": "host-a",
    "detail": "",
}
_Q_CLEAR = {"reason": "reviewed: false positive", "evidence": '{"ticket":"SEC-7"}', "role": "operator"}
_ARTIFACT = {
    "artifactId": "art_0f0e0d0c0b0a09080706050403020100",
    "producerRunId": _Q_RUN,
    "attemptId": "att_7f3a9c0000000000000000000000aa01_1",
    "step": 2,
    "contentHash": "sha256:" + "ab" * 32,
    "sizeBytes": 2048,
    "mediaType": "application/json",
    "source": "upload",
    "location": "acme/run_7f3a9c/report.json",
    "derivedFrom": ["art_00000000000000000000000000000001"],
}
_TAINT = {"taintedRunId": _Q_RUN, "sinceStep": 2, "sinceAt": 0, "quarantineEventId": "qev_1"}
_CLEAR_ART = {
    "clearedRunId": _Q_RUN,
    "artifactIds": [_ARTIFACT["artifactId"]],
    "reason": "verified by the review harness",
    "evidence": '{"check":"diff-clean"}',
    "role": "verifier",
}
SAMPLES: dict[tuple[str, int], dict[str, Any]] = dict(
    {
        ("tenure.quarantine.commands.StartQuarantine", 1): {**_Q_COMMAND, **_Q_TRIGGER},
        ("tenure.quarantine.commands.RecordQuarantineStage", 1): {**_Q_COMMAND, **_Q_STAGE},
        ("tenure.quarantine.commands.ClearQuarantine", 1): {**_Q_COMMAND, **_Q_CLEAR, "artifactIds": []},
        ("tenure.quarantine.events.QuarantineStarted", 1): {
            **_Q_EVENT,
            "eventId": "qev_1",
            "version": 1,
            **_Q_TRIGGER,
        },
        ("tenure.quarantine.events.QuarantineStageCompleted", 1): {
            **_Q_EVENT,
            "eventId": "qev_2",
            "version": 2,
            **_Q_STAGE,
        },
        ("tenure.quarantine.events.QuarantineCleared", 1): {
            **_Q_EVENT,
            "eventId": "qev_3",
            "version": 5,
            **_Q_CLEAR,
            "artifactIds": [],
        },
        ("tenure.quarantine.commands.RegisterArtifact", 1): {**_Q_GRAPH_COMMAND, **_ARTIFACT},
        ("tenure.quarantine.commands.RecordArtifactRead", 1): {
            **_Q_GRAPH_COMMAND,
            "artifactId": _ARTIFACT["artifactId"],
            "readerRunId": "run_7f3a9c0000000000000000000000bb02",
            "reader": "runner-b",
        },
        ("tenure.quarantine.commands.TaintRun", 1): {**_Q_GRAPH_COMMAND, **_TAINT},
        ("tenure.quarantine.commands.ClearArtifacts", 1): {**_Q_GRAPH_COMMAND, **_CLEAR_ART},
        ("tenure.quarantine.events.ArtifactRegistered", 1): {
            **_Q_GRAPH_EVENT,
            "eventId": "qev_g1",
            "version": 2,
            **_ARTIFACT,
            "status": "UNTAINTED",
            "taintOrigin": "",
        },
        ("tenure.quarantine.events.ArtifactRead", 1): {
            **_Q_GRAPH_EVENT,
            "eventId": "qev_g2",
            "version": 3,
            "artifactId": _ARTIFACT["artifactId"],
            "readerRunId": "run_7f3a9c0000000000000000000000bb02",
            "reader": "runner-b",
            "status": "UNTAINTED",
        },
        ("tenure.quarantine.events.TaintPropagated", 1): {
            **_Q_GRAPH_EVENT,
            "eventId": "qev_g3",
            "version": 4,
            **_TAINT,
            "tainted": [_ARTIFACT["artifactId"]],
            "suspect": ["art_00000000000000000000000000000002"],
            "suspectRuns": ["run_7f3a9c0000000000000000000000bb02"],
        },
        ("tenure.quarantine.events.ArtifactsCleared", 1): {
            **_Q_GRAPH_EVENT,
            "eventId": "qev_g4",
            "version": 5,
            **_CLEAR_ART,
        },
    }
)
