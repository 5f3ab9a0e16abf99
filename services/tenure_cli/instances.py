"""`tenure up --instances`: how many of each processor, and the children that makes (issue 16).

The consumer-group processors run as N instances of one group, instance n with
TENURE_INSTANCE_ID n and its health port moved by n * TENURE_INSTANCE_PORT_STRIDE
(services/common/process.py), so that N of them share one machine; the supervisor
(supervisor.py) starts and restarts each as a child of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common.process import instance_health_port
from services.common.settings import TenureSettings

__all__ = [
    "INSTANCE_ALIASES",
    "MAX_INSTANCES",
    "SCALABLE",
    "InstancePlan",
    "parse_instances",
    "plan_instances",
]

Services = Sequence[tuple[str, str]]  # (service name, module), supervisor.SERVICES

# The processors that run as N instances of one consumer group (`tenure up --instances`): each
# partition of their command topic is owned by one instance at a time (issue 16). The others are
# one per state dir: the projector folds every partition into the store the API reads, and the
# API, gateway, ledger and sim environment serve fixed ports.
SCALABLE = (
    "lease-coordinator",
    "saga-orchestrator",
    "watchdog",
    "breakers",
    "schedules",
    "quarantine",
)
# Short names `--instances` accepts besides the service names.
INSTANCE_ALIASES = {"coordinator": "lease-coordinator", "saga": "saga-orchestrator"}
MAX_INSTANCES = 16


def parse_instances(text: str | None, services: Services = ()) -> dict[str, int]:
    """`--instances`: "3" (every scalable processor), "coordinator=3,saga=2", or both ("2,saga=3").

    Returns the count per scalable service (1 where not named); ValueError says what is wrong
    (naming one of `services` that is not scalable says why it is not)."""
    counts = dict.fromkeys(SCALABLE, 1)
    if text is None or not text.strip():
        return counts

    def count_of(value: str, what: str) -> int:
        if not value.strip().isdigit() or not 1 <= int(value) <= MAX_INSTANCES:
            raise ValueError(
                f"--instances: {what} must be a whole number from 1 to {MAX_INSTANCES}, got {value!r}"
            )
        return int(value)

    named: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise ValueError(f"--instances: empty entry in {text!r}")
        name, sep, value = item.partition("=")
        if not sep:
            counts = dict.fromkeys(SCALABLE, count_of(item, "the count"))
            continue
        service = INSTANCE_ALIASES.get(name.strip(), name.strip())
        if service not in SCALABLE:
            others = {n for n, _ in services} - set(SCALABLE)
            why = " (it runs once per state dir)" if service in others else ""
            raise ValueError(
                f"--instances: {name.strip()!r} cannot run as several instances{why}; "
                f"scalable: {', '.join(SCALABLE)} (or coordinator, saga)"
            )
        named[service] = count_of(value, f"the count of {service}")
    counts.update(named)
    return counts


@dataclass(frozen=True)
class InstancePlan:
    """One supervised child of `tenure up`: its name, module and the environment it adds."""

    name: str
    service: str  # the SERVICES name
    module: str
    instance_id: str | None  # None: the service's only instance, TENURE_INSTANCE_ID untouched
    health_port: int | None  # the processor's health port for this instance (None: not a processor)


def plan_instances(
    services: Services, settings: TenureSettings, counts: dict[str, int]
) -> list[InstancePlan]:
    """Every child `tenure up` starts, in `services` order: N of each scalable processor, named
    <service>-<n> after the first, with TENURE_INSTANCE_ID n and its own health port."""
    plans: list[InstancePlan] = []
    for name, module in services:
        count = counts.get(name, 1)
        setting = _HEALTH_PORTS.get(name)
        base: int | None = None if setting is None else int(getattr(settings, setting))
        if count == 1:
            plans.append(InstancePlan(name, name, module, None, base))
            continue
        for index in range(count):
            port = None
            if base is not None:
                port = instance_health_port(base, str(index), settings.instance_port_stride)
            child = name if index == 0 else f"{name}-{index}"
            plans.append(InstancePlan(child, name, module, str(index), port))
    return plans


# The health-port setting of each processor `tenure up` probes.
_HEALTH_PORTS = {
    "lease-coordinator": "coordinator_health_port",
    "projections": "projections_health_port",
    "saga-orchestrator": "saga_health_port",
    "watchdog": "watchdog_health_port",
    "breakers": "breakers_health_port",
    "schedules": "schedules_health_port",
    "quarantine": "quarantine_health_port",
}
