"""The confluent-kafka adapter: the only package that imports confluent_kafka.

It offers what the services need and nothing more: explicit topic creation, a transactional
writer for processors, an idempotent publisher for commands, and partition readers for
catch-up, projections, tailing and replay.
"""

from services.common.kafka._admin import create_topics, describe_topics, wait_for_broker
from services.common.kafka._errors import is_transient_kafka_error
from services.common.kafka._publisher import CommandPublisher
from services.common.kafka._reader import PartitionReader, TopicFollower
from services.common.kafka._records import InboundRecord, OutboundRecord
from services.common.kafka._transactional import TransactionalWriter, WriterFenced

__all__ = [
    "CommandPublisher",
    "InboundRecord",
    "OutboundRecord",
    "PartitionReader",
    "TopicFollower",
    "TransactionalWriter",
    "WriterFenced",
    "create_topics",
    "describe_topics",
    "is_transient_kafka_error",
    "wait_for_broker",
]
