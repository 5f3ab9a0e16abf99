"""`tenure up --instances` and the identity of one processor instance among N (issue 16)."""

from __future__ import annotations

import pytest

from services.common.process import InstanceIdInvalid, instance_health_port, instance_identity
from services.common.settings import TenureSettings
from services.tenure_cli.instances import SCALABLE, parse_instances, plan_instances
from services.tenure_cli.main import build_parser
from services.tenure_cli.supervisor import SERVICES


def test_a_bare_count_scales_every_consumer_group_processor() -> None:
    assert parse_instances("3") == dict.fromkeys(SCALABLE, 3)
    assert parse_instances(None) == dict.fromkeys(SCALABLE, 1)


def test_per_service_counts_with_short_names_and_a_default() -> None:
    counts = parse_instances("coordinator=3,saga=2")
    assert counts["lease-coordinator"] == 3 and counts["saga-orchestrator"] == 2
    assert counts["watchdog"] == 1
    mixed = parse_instances("2, saga-orchestrator=4")
    assert mixed["saga-orchestrator"] == 4 and mixed["lease-coordinator"] == 2 and mixed["breakers"] == 2


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0", "from 1 to 16"),
        ("17", "from 1 to 16"),
        ("coordinator=x", "lease-coordinator"),
        ("projections=2", "once per state dir"),
        ("command-api=2", "once per state dir"),
        ("nonsense=2", "scalable:"),
        ("2,,saga=1", "empty entry"),
    ],
)
def test_a_bad_instances_value_is_refused_with_a_reason(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_instances(text, SERVICES)


def test_the_cli_refuses_a_bad_value_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["up", "--instances", "projections=2"])
    assert exit_.value.code == 2
    assert "once per state dir" in capsys.readouterr().err
    assert build_parser().parse_args(["up", "--instances", "coordinator=2"]).instances == "coordinator=2"


def test_up_with_two_instances_plans_two_coordinators_with_their_own_ids_and_ports() -> None:
    settings = TenureSettings(coordinator_health_port=8301, saga_health_port=8303, instance_port_stride=100)
    plans = plan_instances(SERVICES, settings, parse_instances("2"))
    coordinators = [p for p in plans if p.service == "lease-coordinator"]
    assert [(p.name, p.instance_id, p.health_port) for p in coordinators] == [
        ("lease-coordinator", "0", 8301),
        ("lease-coordinator-1", "1", 8401),
    ]
    assert [p.name for p in plans if p.service == "projections"] == ["projections"]
    names = [p.name for p in plans]
    assert len(names) == len(set(names))
    ports = [p.health_port for p in plans if p.health_port]
    assert len(ports) == len(set(ports)), "two instances would share a health port"


def test_one_instance_changes_nothing_of_the_single_instance_defaults() -> None:
    plans = plan_instances(SERVICES, TenureSettings(), parse_instances(None))
    assert all(p.instance_id is None for p in plans)
    coordinator = next(p for p in plans if p.service == "lease-coordinator")
    assert (coordinator.name, coordinator.health_port) == ("lease-coordinator", 8301)


def test_instance_ids_and_health_ports() -> None:
    assert instance_identity("coordinator-b.eu_1") == "coordinator-b.eu_1"
    for bad in ("", "-x", "a/b", "a b", "x" * 65):
        with pytest.raises(InstanceIdInvalid):
            instance_identity(bad)
    assert instance_health_port(8301, "0", 100) == 8301
    assert instance_health_port(8301, "2", 100) == 8501
    assert instance_health_port(8301, "tenure-coordinator-2", 100) == 8301  # a container's hostname
    assert instance_health_port(0, "3", 100) == 0  # off stays off
    with pytest.raises(InstanceIdInvalid, match="stride"):
        instance_health_port(8301, "600", 100)


def test_the_generation_fence_speaks_librdkafkas_group_metadata_format() -> None:
    """The metadata handed to send_offsets_to_transaction is byte for byte what confluent-kafka's
    own consumer serialises (issue 16: the broker checks this generation on every commit)."""
    from confluent_kafka import Consumer

    from services.common.kafka import GroupFence

    consumer = Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g1", "group.instance.id": "g1-0"})
    try:
        theirs = consumer.consumer_group_metadata()
    finally:
        consumer.close()
    ours = GroupFence("g1", -1, "", "g1-0", "t", {0: 1}).metadata()
    assert ours == theirs
    fence = GroupFence("tenure-x", 7, "member-1", None, "runs.commands", {2: 10, 0: 5})
    assert fence.metadata().endswith(b"tenure-x\0member-1\0\x01")
    assert [(tp.partition, tp.offset) for tp in fence.positions()] == [(0, 5), (2, 10)]
