"""Explicit topic creation: partitions, replication and cleanup policy come from the catalog."""

from __future__ import annotations

import time
from typing import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from services.common.backoff import Backoff
from services.common.topics import TopicSpec

__all__ = ["create_topics", "describe_topics", "wait_for_broker"]


def _admin(bootstrap_servers: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap_servers, "client.id": "tenure-admin"})


def wait_for_broker(bootstrap_servers: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    admin = _admin(bootstrap_servers)
    backoff = Backoff(base_s=0.05, cap_s=1.0)  # BRK-3: many processes start against one broker
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2.0)
            return
        except KafkaException as exc:
            last_error = exc
            time.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))
    raise TimeoutError(f"Kafka at {bootstrap_servers} did not answer in {timeout_s}s: {last_error}")


def create_topics(
    bootstrap_servers: str, specs: Iterable[TopicSpec], replication_factor: int = 1
) -> dict[str, str]:
    """Create the missing topics; returns {name: "created" | "exists"}.

    An existing topic with a different partition count is an error, not something to paper over:
    co-partitioning of commands and events depends on it.
    """
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
                    config=dict(spec.config),
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
