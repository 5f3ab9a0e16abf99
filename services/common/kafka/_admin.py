"""Explicit topic creation: partitions, replication and cleanup policy come from the catalog."""

from __future__ import annotations

import threading
import time
from typing import Iterable

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from services.common.backoff import Backoff
from services.common.kafka._config import base_config
from services.common.kafka._errors import AuthenticationWatch
from services.common.settings import KafkaSettings
from services.common.topics import TopicSpec

__all__ = [
    "CommittedEnds",
    "create_topics",
    "describe_topics",
    "partition_leaders",
    "topic_durability",
    "wait_for_broker",
]


def _admin(bootstrap_servers: str, watch: AuthenticationWatch | None = None) -> AdminClient:
    config = base_config(bootstrap_servers, "tenure-admin")
    if watch is not None:
        config["error_cb"] = watch
    config.pop("partitioner")  # a producer property; the admin client warns about it
    return AdminClient(config)


def wait_for_broker(bootstrap_servers: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    watch = AuthenticationWatch(bootstrap_servers)
    admin = _admin(bootstrap_servers, watch)
    backoff = Backoff(base_s=0.05, cap_s=1.0)  # BRK-3: many processes start against one broker
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2.0)
            return
        except KafkaException as exc:
            watch.check(admin)  # refused credentials: say so now, not after the whole timeout
            last_error = exc
            time.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))
    raise TimeoutError(f"Kafka at {bootstrap_servers} did not answer in {timeout_s}s: {last_error}")


def create_topics(
    bootstrap_servers: str,
    specs: Iterable[TopicSpec],
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
) -> dict[str, str]:
    """Create the missing topics; returns {name: "created" | "exists"}.

    Replication factor and min.insync.replicas are the deployment's (TENURE_TOPIC_REPLICATION_FACTOR,
    TENURE_TOPIC_MIN_INSYNC_REPLICAS) unless given. An existing topic with a different partition
    count is an error, not something to paper over: co-partitioning of commands and events
    depends on it.
    """
    layout = KafkaSettings()
    replication_factor = replication_factor or layout.topic_replication_factor
    min_insync_replicas = min_insync_replicas or layout.topic_min_insync_replicas
    durability = {"min.insync.replicas": str(min_insync_replicas)} if min_insync_replicas else {}
    admin = _admin(bootstrap_servers)
    specs = list(specs)
    existing = admin.list_topics(timeout=10.0).topics
    result: dict[str, str] = {}
    to_create: list[NewTopic] = []
    for spec in specs:
        if spec.name in existing:
            have = len(existing[spec.name].partitions)
            if have != spec.partitions:
                raise RuntimeError(
                    f"topic {spec.name} has {have} partitions but the catalog says "
                    f"{spec.partitions}; co-partitioned topics must match"
                )
            result[spec.name] = "exists"
        else:
            to_create.append(
                NewTopic(
                    spec.name,
                    num_partitions=spec.partitions,
                    replication_factor=replication_factor,
                    config={**dict(spec.config), **durability},
                )
            )
    if to_create:
        for name, future in admin.create_topics(to_create, operation_timeout=30.0).items():
            try:
                future.result()
                result[name] = "created"
            except KafkaException as exc:
                if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    result[name] = "exists"
                else:
                    raise
    _wait_for_leaders(admin, [s.name for s in specs])
    return result


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        topics = admin.list_topics(timeout=5.0).topics
        ready = all(
            n in topics
            and topics[n].error is None
            and all(p.leader >= 0 for p in topics[n].partitions.values())
            for n in names
        )
        if ready:
            return
        time.sleep(0.1)
    raise TimeoutError(f"topics {names} have no leader after {timeout_s}s")


def describe_topics(bootstrap_servers: str) -> dict[str, int]:
    """{topic name: partition count} for every topic the broker knows."""
    topics = _admin(bootstrap_servers).list_topics(timeout=10.0).topics
    return {name: len(meta.partitions) for name, meta in topics.items()}


def topic_durability(bootstrap_servers: str, names: Iterable[str]) -> dict[str, tuple[int, int, int]]:
    """{topic: (replication factor, min.insync.replicas, smallest in-sync replica set now)}:
    what an operator checks after `tenure topics create` on a production cluster."""
    admin = _admin(bootstrap_servers)
    names = list(names)
    topics = admin.list_topics(timeout=10.0).topics
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
    out: dict[str, tuple[int, int, int]] = {}
    for resource, future in admin.describe_configs(resources, request_timeout=10.0).items():
        entries = future.result()
        partitions = topics[resource.name].partitions.values()
        out[resource.name] = (
            min(len(p.replicas) for p in partitions),
            int(entries["min.insync.replicas"].value),
            min(len(p.isrs) for p in partitions),
        )
    return out


def partition_leaders(bootstrap_servers: str, topic: str) -> dict[int, int]:
    """{partition: node id of its leader (-1: none now)} of `topic`."""
    meta = _admin(bootstrap_servers).list_topics(topic, timeout=10.0).topics[topic]
    return {p: int(m.leader) for p, m in meta.partitions.items()}


class CommittedEnds:
    """Where each partition of a topic ends for a read_committed reader (its last stable offset),
    in one ListOffsets request per partition leader.

    A read barrier asks this before every read, so it must be cheap: the partition list is
    cached (partitions are added rarely, and a stale list only misses a brand-new partition for
    `_PARTITIONS_TTL_S`), and the offsets of all partitions travel in one request instead of a
    watermark query each (about 0.5 ms against 5.5 ms for six partitions on one broker)."""

    _PARTITIONS_TTL_S = 30.0

    def __init__(self, bootstrap_servers: str) -> None:
        self._admin = _admin(bootstrap_servers)
        self._partitions: dict[str, tuple[float, list[int]]] = {}
        self._lock = threading.Lock()

    def _partitions_of(self, topic: str, timeout_s: float) -> list[int]:
        with self._lock:
            cached = self._partitions.get(topic)
        if cached is not None and time.monotonic() - cached[0] < self._PARTITIONS_TTL_S:
            return cached[1]
        meta = self._admin.list_topics(topic, timeout=timeout_s).topics[topic]
        if meta.error is not None:
            raise KafkaException(meta.error)
        partitions = sorted(meta.partitions)
        with self._lock:
            self._partitions[topic] = (time.monotonic(), partitions)
        return partitions

    def ends(self, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
        """{partition: offset after the last committed record} right now."""
        partitions = self._partitions_of(topic, timeout_s)
        wanted = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}  # type: ignore[no-untyped-call]
        try:
            futures = self._admin.list_offsets(
                wanted, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout_s
            )
            return {tp.partition: int(f.result(timeout=timeout_s).offset) for tp, f in futures.items()}
        except Exception:
            with self._lock:  # a moved or re-created topic: look its partitions up again next time
                self._partitions.pop(topic, None)
            raise
