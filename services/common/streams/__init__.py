"""The faust-streaming adapter: the only package that imports faust (and, through it, aiokafka).

Services hand it a plain batch handler; faust only consumes, batches and acknowledges. Writes
and state never go through faust (its exactly_once mode double-counts after kills and
rebalances, faust-streaming/faust#323, #517), see services/common/aggregate/processor.py.
"""

from services.common.streams._runtime import (
    CommandStream,
    Failure,
    StreamSettings,
    classify_failure,
    parts_of,
)

__all__ = ["CommandStream", "Failure", "StreamSettings", "classify_failure", "parts_of"]
