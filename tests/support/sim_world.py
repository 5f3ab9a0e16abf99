"""The simulated world driven directly, as the sim environment's tests drive it: a request, its
answer's output, and the seed's deploy up to its DNS step."""

from __future__ import annotations

from typing import Any

from services.sim_environment.world import Answer, World

__all__ = ["PROBLEM_JSON", "WORK", "deploy_until_dns", "output_of", "perform"]

PROBLEM_JSON = "application/problem+json"
WORK = "run-1"


def perform(
    world: World, key: str, operation: str, payload: dict[str, Any], epoch: int = 1, work: str = WORK
) -> Answer:
    return world.perform(work, epoch, key, operation, payload)


def output_of(answer: Answer) -> dict[str, Any]:
    assert answer.status == 200, answer.body
    output: dict[str, Any] = answer.body["output"]
    return output


def deploy_until_dns(world: World) -> dict[str, str]:
    """The seed's deploy, steps T1..T4 (VM, IP, compile, firewall); returns the resource ids."""
    vm = output_of(perform(world, "t1", "vm.provision", {"name": "web"}))["vmId"]
    ip = output_of(perform(world, "t2", "ip.reserve", {"region": "eu-west"}))
    build = output_of(perform(world, "t3", "sandbox.compile", {"vmId": vm, "source": "int main() {}"}))[
        "buildId"
    ]
    rule = output_of(perform(world, "t4", "firewall.write", {"vmId": vm, "port": 443}))["ruleId"]
    return {"vm": vm, "ip": ip["ipId"], "address": ip["address"], "build": build, "rule": rule}
