"""The Run aggregate's lease metrics, counted from the events the coordinator commits.

Counted once a transaction committed (the aggregate runtime's commit hook,
`ProcessorMetrics.committed`), never from requests: a refused or duplicate claim grants nothing,
and an expiry is the coordinator's timer deciding it, with no request at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.contracts import AttemptClaimed, LeaseAtRisk, LeaseExpired, LeaseRenewed, LeaseTakenOver
from services.common.metrics import ProcessorMetrics, counter

__all__ = ["LeaseMetrics"]


class LeaseMetrics:
    """Lease grants (by claim or takeover), renewals, jeopardy and expiries."""

    def __init__(self, metrics: ProcessorMetrics) -> None:
        r = metrics.registry
        self._grants = counter(
            r,
            "tenure_lease_grants",
            "Leases granted, by how: claim (a new Attempt) or takeover (the same run, a higher epoch).",
            ["via"],
        )
        self._renewals = counter(r, "tenure_lease_renewals", "Lease renewals accepted (one or a batch).")
        self._at_risk = counter(
            r, "tenure_lease_at_risk", "Leases unrenewed past their at-risk interval (LEASE-4 jeopardy)."
        )
        self._expiries = counter(r, "tenure_lease_expiries", "Leases that expired unrenewed.")
        metrics.on_commit(self.count)

    def count(self, events: Sequence[object]) -> None:
        for event in events:
            if isinstance(event, LeaseRenewed):
                self._renewals.inc()
            elif isinstance(event, AttemptClaimed):
                self._grants.labels("claim").inc()
            elif isinstance(event, LeaseTakenOver):
                self._grants.labels("takeover").inc()
            elif isinstance(event, LeaseExpired):
                self._expiries.inc()
            elif isinstance(event, LeaseAtRisk):
                self._at_risk.inc()
