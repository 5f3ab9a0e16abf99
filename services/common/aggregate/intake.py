"""The runtime's intake of one command record (services/common/aggregate/processor.py, step 2):
its decoding (an envelope opened into its commands), its route check, and the dead letter of a
command (or timer work) whose handling raised."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from services.common.aggregate.definition import AggregateDefinition
from services.common.aggregate.envelopes import open_envelope
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec, command_or_deadletter
from services.common.poison import TIMER_FAILED, failure_reason, set_aside_command, set_aside_timer

__all__ = ["Intake"]

S = TypeVar("S")
C = TypeVar("C")


class Intake(Generic[S, C]):
    """Decodes command records for one definition and counts those on the wrong partition."""

    def __init__(
        self,
        definition: AggregateDefinition[S, C, Any, Any],
        codec: MessageCodec,
        deadlettered: Callable[[str], None],
    ) -> None:
        self.definition = definition
        self._codec = codec
        self._deadlettered = deadlettered
        # What a command record may decode to: a command, or an envelope of commands.
        self._accepted_types = definition.command_types + definition.envelope_types
        self.misrouted = 0

    def commands_of(self, record: InboundRecord, out: list[OutboundRecord]) -> Sequence[C]:
        """The command in `record`, or the commands of the envelope it is; none after its dead
        letter was appended to `out`."""
        d = self.definition
        message = command_or_deadletter(
            self._codec,
            record,
            self._accepted_types,
            d.command_kind,
            out,
            d.deadletter_topic,
            d.log,
            self._deadlettered,
        )
        if message is None:
            return ()
        if d.envelope_types and isinstance(message, d.envelope_types):
            return open_envelope(d, record, message, out, self._deadlettered)
        self._check_route(record, d.aggregate_id(message))
        return (message,)

    def set_aside(
        self, record: InboundRecord, command: C, state: S | None, exc: Exception, now: int
    ) -> list[OutboundRecord]:
        """The dead letter and refusal of a command whose handling raised; the batch goes on."""
        d = self.definition
        self._deadlettered(failure_reason(exc))
        return set_aside_command(
            self._codec,
            record,
            command,
            exc,
            now,
            processor=d.processor_name,
            deadletter_topic=d.deadletter_topic,
            rejections_topic=d.rejections_topic,
            current_status=d.status(state) if state is not None else None,
            current_version=d.version(state) if state is not None else 0,
            log=d.log,
        )

    def set_timer_aside(
        self, partition: int, aggregate_id: str, state: S, due: int, exc: Exception
    ) -> OutboundRecord:
        """The dead letter of timer work that raised; the tick goes on, and the timer waits for
        the aggregate's next change."""
        d = self.definition
        self._deadlettered(TIMER_FAILED)
        return set_aside_timer(
            partition,
            aggregate_id,
            d.version(state),
            due,
            exc,
            processor=d.processor_name,
            deadletter_topic=d.deadletter_topic,
            events_topic=d.events_topic,
            log=d.log,
        )

    def _check_route(self, record: InboundRecord, aggregate_id: str) -> None:
        # An aggregate's commands must all reach the partition its id routes to (services.
        # common.routing); otherwise two processors could own one tenant's load. Counted and
        # logged rather than refused, so a misconfigured producer degrades admission, not runs.
        try:
            expected = self.definition.expected_partition(aggregate_id)
            if expected is None:
                return
        except ValueError:
            expected = None
        if expected != record.partition:
            self.misrouted += 1
            if self.misrouted in (1, 10, 100) or self.misrouted % 1000 == 0:
                self.definition.log.warning(
                    "%d command(s) arrived on a partition their aggregate does not route to (last: %s on %d)",
                    self.misrouted,
                    aggregate_id,
                    record.partition,
                )
