"""The quarantine and artifact routes' problem types and rejection mapping (QUA-1, QUA-2).

Kept beside problems.py (which imports them into the one catalog, so /problems/<slug> serves
them); every QuarantineRejectionCode is mapped explicitly.
"""

from __future__ import annotations

from services.common.contracts.quarantine import QuarantineRejectionCode
from services.common.problem_json import ProblemType

__all__ = ["QUARANTINE_PROBLEMS", "QUARANTINE_REJECTION_PROBLEMS"]

# Quarantine and taint (routes_quarantine.py, routes_artifacts.py; QUA-1, QUA-2).
QUARANTINE_PROBLEMS: tuple[ProblemType, ...] = (
    ProblemType(
        "artifact-quarantined",
        "The artifact is quarantined",
        409,
        "ArtifactQuarantined (QUA-2): the artifact is TAINTED, produced by a quarantined run within "
        "its taint or derived from such an artifact. The mediation gateway serves nothing of it "
        "until an operator or an independent verifier clears it.",
    ),
    ProblemType(
        "artifact-not-found",
        "No such artifact",
        404,
        "No artifact with this id is registered in the provenance graph (an artifact is registered "
        "when its bytes are uploaded under a grant, or a saga step outputs it).",
    ),
    ProblemType(
        "quarantine-conflict",
        "The run's quarantine is not in that state",
        409,
        "The run is quarantined already (a trigger is recorded once; clear it first), or is not "
        "quarantined (nothing to clear or report a stage of): `code`, `currentStatus`.",
    ),
    ProblemType(
        "run-quarantined",
        "The run is quarantined",
        409,
        "The run is quarantined (QUA-1): its effects, uploads and grants are refused; only an "
        "operator or an independent verifier can clear it.",
    ),
    ProblemType(
        "clearing-forbidden",
        "You may not clear this quarantine or taint",
        403,
        "Clearing needs an operator or a registered verifier, and never the quarantined run's own "
        "principal (the seed's mistake: clearing taint on the model's self-check).",
    ),
)
QUARANTINE_REJECTION_PROBLEMS: dict[str, str] = {
    QuarantineRejectionCode.INVALID_COMMAND: "validation-failed",
    QuarantineRejectionCode.ALREADY_QUARANTINED: "quarantine-conflict",
    QuarantineRejectionCode.NOT_QUARANTINED: "quarantine-conflict",
    QuarantineRejectionCode.ARTIFACT_QUARANTINED: "artifact-quarantined",
    QuarantineRejectionCode.ARTIFACT_NOT_FOUND: "artifact-not-found",
    QuarantineRejectionCode.ARTIFACT_EXISTS: "artifact-exists",
    QuarantineRejectionCode.CLEARING_FORBIDDEN: "clearing-forbidden",
    # Answered by the routes as an idempotent repeat (202 with the view), never shown as a problem.
    QuarantineRejectionCode.NOTHING_TO_DO: "quarantine-conflict",
}
