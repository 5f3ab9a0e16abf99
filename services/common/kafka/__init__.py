"""The confluent-kafka adapter: the only package that imports confluent_kafka.

It offers what the services need and nothing more: explicit topic creation, a transactional
writer for processors, an idempotent publisher for commands, and partition readers for
catch-up, projections, tailing and replay.
"""

from services.common.kafka._admin import (
    CommittedEnds,
    create_topics,
    describe_topics,
    partition_leaders,
    topic_durability,
    wait_for_broker,
)
from services.common.kafka._client_settings import (
    KafkaClientConfig,
    KafkaConfigError,
    client_config,
    resource_prefix,
)
from services.common.kafka._errors import KafkaAuthenticationError, is_transient_kafka_error
from services.common.kafka._group import GroupFence, committed_offsets
from services.common.kafka._publisher import CommandPublisher
from services.common.kafka._reader import PartitionReader, TopicFollower, follower_lags
from services.common.kafka._records import InboundRecord, OutboundRecord
from services.common.kafka._transactional import OffsetsStalled, TransactionalWriter, WriterFenced

__all__ = [
    "CommandPublisher",
    "CommittedEnds",
    "GroupFence",
    "InboundRecord",
    "KafkaAuthenticationError",
    "KafkaClientConfig",
    "KafkaConfigError",
    "OffsetsStalled",
    "OutboundRecord",
    "PartitionReader",
    "TopicFollower",
    "TransactionalWriter",
    "WriterFenced",
    "client_config",
    "committed_offsets",
    "create_topics",
    "describe_topics",
    "follower_lags",
    "is_transient_kafka_error",
    "partition_leaders",
    "resource_prefix",
    "topic_durability",
    "wait_for_broker",
]
