"""The foundation benchmark's results, one record per phase, and the phase parameters its report
quotes (bench/foundation.py runs the phases, bench/_foundation_report.py renders them)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BATCH",
    "PROBE_JITTER_S",
    "RAW_REPEATS",
    "RAW_VALUE_BYTES",
    "ApiResult",
    "ProcessorResult",
    "RawResult",
    "RebuildResult",
]

RAW_VALUE_BYTES = 300
RAW_REPEATS = 3
BATCH = 200  # services.common.streams.StreamSettings.batch_size: commands per processor transaction
PROBE_JITTER_S = 0.25  # longer than any poll timeout in the services, so probes arrive at random phases


@dataclass
class RawResult:
    """Best of RAW_REPEATS rounds (the limit is what the setup can do, not its worst moment)."""

    messages: int
    produce_runs: list[float]
    consume_runs: list[float]

    @property
    def produce_s(self) -> float:
        return min(self.produce_runs)

    @property
    def consume_s(self) -> float:
        return min(self.consume_runs)


@dataclass
class ProcessorResult:
    commands: int
    publish_s: float
    decided_s: float
    viewed_s: float
    decided_ms: list[float]
    viewed_ms: list[float]
    probe_decided_ms: list[float]
    probe_viewed_ms: list[float]
    verified: int
    burst_markers: int
    logic_s: float = float("nan")


@dataclass
class RebuildResult:
    restore_events: int
    restore_s: float
    projection_events: int
    projection_runs: int
    projection_s: float
    projection_first_batch_s: float
    log_offsets: int


@dataclass
class ApiResult:
    requests: int
    seconds: float
    statuses: dict[int, int]
    created_ms: list[float]
