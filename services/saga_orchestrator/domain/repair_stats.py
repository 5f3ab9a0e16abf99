"""P(success | error kind) of one forward repair, measured from recorded outcomes (REC-4).

The statistic is a fold over the log: each finished repair is `observe`d once, so it can always be
rebuilt from the recorded decisions and their outcomes; `to_json` / `from_json` let a store keep
the folded value between restarts. Pure and immutable: `observe` returns a new value.

Estimate: the policy's prior (`RecoveryPolicy.prior_success`) until `min_samples` repairs of that
kind have been recorded; from then on the measured rate with Laplace smoothing (the rule of
succession, (successes + 1) / (attempts + 2)), so a short streak of failures never makes a repair
look impossible and a short streak of successes never makes it look certain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, TypeGuard

from services.saga_orchestrator.domain.policy import RecoveryPolicy, normalise_kind

__all__ = ["KindCounts", "RepairEstimate", "RepairStats", "RepairStatsCorrupt"]

_FORMAT_VERSION = 1


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class RepairStatsCorrupt(ValueError):
    """A stored statistic does not parse; rebuild it from the log instead."""


class RepairEstimate(NamedTuple):
    p: float
    source: str  # "prior" or "measured"
    samples: int


@dataclass(frozen=True)
class KindCounts:
    attempts: int = 0
    successes: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.successes <= self.attempts:
            raise ValueError(f"need 0 <= successes <= attempts, got {self.successes}/{self.attempts}")


@dataclass(frozen=True)
class RepairStats:
    """Counts of repairs per error kind (normalised, see `normalise_kind`)."""

    counts: Mapping[str, KindCounts] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", MappingProxyType(dict(self.counts)))

    def observe(self, kind: str, succeeded: bool) -> RepairStats:
        key = normalise_kind(kind)
        before = self.counts.get(key, KindCounts())
        after = KindCounts(before.attempts + 1, before.successes + (1 if succeeded else 0))
        return RepairStats({**self.counts, key: after})

    def samples(self, kind: str) -> int:
        return self.counts.get(normalise_kind(kind), KindCounts()).attempts

    def p_success(self, kind: str, policy: RecoveryPolicy | None = None) -> RepairEstimate:
        """(p, "prior" | "measured", samples) for one repair of an error of this kind."""
        policy = policy if policy is not None else RecoveryPolicy()
        counts = self.counts.get(normalise_kind(kind), KindCounts())
        if counts.attempts == 0 or counts.attempts < policy.min_samples:
            return RepairEstimate(policy.prior_success, "prior", counts.attempts)
        return RepairEstimate((counts.successes + 1) / (counts.attempts + 2), "measured", counts.attempts)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _FORMAT_VERSION,
            "kinds": {
                kind: {"attempts": counts.attempts, "successes": counts.successes}
                for kind, counts in sorted(self.counts.items())
            },
        }

    @classmethod
    def from_json(cls, data: Any) -> RepairStats:
        if not isinstance(data, Mapping) or data.get("version") != _FORMAT_VERSION:
            raise RepairStatsCorrupt(
                f"expected a repair-stats object of version {_FORMAT_VERSION}, got {data!r}"
            )
        kinds = data.get("kinds")
        if not isinstance(kinds, Mapping):
            raise RepairStatsCorrupt(f"'kinds' must be an object, got {kinds!r}")
        counts: dict[str, KindCounts] = {}
        for kind, raw in kinds.items():
            if not isinstance(raw, Mapping):
                raise RepairStatsCorrupt(f"counts of {kind!r} must be an object, got {raw!r}")
            attempts, successes = raw.get("attempts"), raw.get("successes")
            if not (_is_count(attempts) and _is_count(successes)):
                raise RepairStatsCorrupt(f"counts of {kind!r} must be integers, got {raw!r}")
            try:
                counts[normalise_kind(str(kind))] = KindCounts(attempts, successes)
            except ValueError as exc:
                raise RepairStatsCorrupt(f"counts of {kind!r}: {exc}") from exc
        return cls(counts)
