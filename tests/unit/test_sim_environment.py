"""The simulated environment: the "external world" sagas act upon through the effect gateway.

Proves that the recipient, not Tenure, refuses a previous lease holder (LEASE-3: stale epochs),
that one idempotency key is applied at most once whatever the retries (EXE-6), that a lost
acknowledgement can be found by the probe (REC-6), that compensators are idempotent and semantic
so an unwind brings the world back to its start (SAGA-3, SAGA-4), that every armed fault does what
it says (timeouts before/after commit, errors, partial outputs), and that tools.json registers
the operations consistently with the world (SAGA-2, SAGA-5). The HTTP app is in
test_sim_environment_http.py.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from services.common.settings import TenureSettings
from services.sim_environment import load_tool_registrations
from services.sim_environment.verifiers import UnknownVerifier, verify
from services.sim_environment.world import OPERATIONS, Fault, World, is_back_to_start
from tests.support.sim_world import WORK, deploy_until_dns, output_of, perform

pytestmark = pytest.mark.timeout(30)


# --------------------------------------------------------------------------- idempotency, fencing


def test_same_key_twice_is_applied_once_and_answers_the_same_body_exe6() -> None:
    world = World()
    first = perform(world, "k1", "vm.provision", {"name": "web"})
    second = perform(world, "k1", "vm.provision", {"name": "web"})
    assert first.status == second.status == 200
    assert second.body == first.body and second.replay and not first.replay
    assert first.body["output"]["vmId"].startswith("vm-")
    audit = world.audit()
    assert len(audit["live"]) == 1
    assert audit["effects"] == [
        {
            "key": "k1",
            "workId": WORK,
            "operation": "vm.provision",
            "requests": 2,
            "applied": 1,
            "succeeded": True,
        }
    ]
    assert audit["duplicates"] == []


def test_a_different_request_under_a_known_key_is_a_conflict_and_changes_nothing() -> None:
    world = World()
    output_of(perform(world, "k1", "vm.provision", {"name": "web"}))
    for work, operation, payload, differs in (
        (WORK, "vm.provision", {"name": "db"}, ["payload"]),
        ("run-2", "vm.provision", {"name": "web"}, ["workId"]),
        (WORK, "ip.reserve", {"region": "eu"}, ["operation", "payload"]),
    ):
        answer = world.perform(work, 1, "k1", operation, payload)
        assert answer.status == 409
        assert answer.body["type"] == "/problems/idempotency-key-conflict"
        assert answer.body["differences"] == differs
    assert len(world.audit()["live"]) == 1


def test_stale_epoch_is_refused_by_the_recipient_and_changes_nothing_lease3() -> None:
    world = World()
    output_of(perform(world, "k1", "vm.provision", {"name": "web"}, epoch=2))
    stale = perform(world, "k2", "vm.provision", {"name": "db"}, epoch=1)
    assert stale.status == 409
    assert stale.body["type"] == "/problems/stale-epoch"
    assert (stale.body["presentedEpoch"], stale.body["highestEpoch"]) == (1, 2)
    assert [r["params"]["name"] for r in world.audit()["live"]] == ["web"]
    # Another work id has its own bar.
    output_of(perform(world, "k3", "vm.provision", {"name": "other"}, epoch=1, work="run-2"))
    assert world.highest_epoch(WORK) == 2 and world.highest_epoch("run-2") == 1


def test_a_replay_answers_the_stored_body_even_with_a_stale_epoch_rec6() -> None:
    world = World()
    first = perform(world, "k1", "vm.provision", {"name": "web"}, epoch=1)
    output_of(perform(world, "k2", "ip.reserve", {"region": "eu"}, epoch=3))
    replay = perform(world, "k1", "vm.provision", {"name": "web"}, epoch=1)
    assert replay.status == 200 and replay.body == first.body and replay.replay


def test_the_epoch_bar_rises_even_when_the_request_then_fails() -> None:
    world = World()
    assert perform(world, "k1", "vm.provision", {}, epoch=5).status == 422
    assert (
        perform(world, "k2", "vm.provision", {"name": "web"}, epoch=4).body["type"] == "/problems/stale-epoch"
    )


def test_ids_and_answers_are_deterministic() -> None:
    worlds = [World(), World()]
    for world in worlds:
        deploy_until_dns(world)
        perform(world, "c1", "vm.terminate", {"vmId": world.audit()["live"][0]["id"]})
    assert worlds[0].audit() == worlds[1].audit()


# --------------------------------------------------------------------------- operations


def test_every_forward_operation_creates_what_it_says() -> None:
    world = World()
    ids = deploy_until_dns(world)
    assert ids["address"].startswith("10.")
    dns = output_of(perform(world, "t5", "dns.publish", {"name": "web.example", "address": ids["address"]}))
    hold = output_of(perform(world, "p1", "payment.hold", {"account": "acct-1", "amount": 12.5}))
    message = output_of(perform(world, "n1", "notify.send", {"to": "ops@example", "text": "deployed"}))
    cache = output_of(perform(world, "w1", "cache.warm", {"name": "assets"}))
    audit = world.audit()
    live = {(r["kind"], r["id"]) for r in audit["live"]}
    assert live == {
        ("vm", ids["vm"]),
        ("ip", ids["ip"]),
        ("build", ids["build"]),
        ("firewall-rule", ids["rule"]),
        ("payment-hold", hold["holdId"]),
        ("cache", cache["cacheId"]),
    }
    assert {(r["kind"], r["id"]) for r in audit["permanent"]} == {
        ("dns-record", dns["recordId"]),
        ("message", message["messageId"]),
    }
    assert all(r["workId"] == WORK for r in audit["live"])
    assert next(r for r in audit["live"] if r["kind"] == "ip")["params"] == {
        "region": "eu-west",
        "address": ids["address"],
    }


def test_compile_needs_a_live_vm_and_fails_on_a_syntax_error() -> None:
    world = World()
    missing = perform(world, "k1", "sandbox.compile", {"vmId": "vm-nope", "source": "x"})
    assert (missing.status, missing.body["type"]) == (404, "/problems/not-found")
    vm = output_of(perform(world, "k2", "vm.provision", {"name": "web"}))["vmId"]
    broken = perform(world, "k3", "sandbox.compile", {"vmId": vm, "source": "ok\nsyntax-error here"})
    assert (broken.status, broken.body["type"], broken.body["line"]) == (422, "/problems/compile-error", 2)
    output_of(perform(world, "k4", "vm.terminate", {"vmId": vm}))
    after = perform(world, "k5", "firewall.write", {"vmId": vm, "port": 80})
    assert after.status == 404 and "no live vm" in after.body["detail"]
    assert world.audit()["live"] == []


@pytest.mark.parametrize(
    ("operation", "payload", "kind", "detail_part"),
    [
        ("vm.provision", {}, "missing-parameter", "vm.provision needs payload.name"),
        ("firewall.write", {"vmId": "vm-x"}, "missing-parameter", "needs payload.port"),
        ("firewall.write", {"vmId": "vm-x", "port": 70000}, "schema-invalid", "payload.port"),
        ("firewall.write", {"vmId": "vm-x", "port": "80"}, "schema-invalid", "payload.port"),
        ("vm.provision", {"name": "web", "size": "xl"}, "schema-invalid", "'size' was unexpected"),
        ("vm.provision", {"name": ""}, "schema-invalid", "payload.name"),
        ("payment.hold", {"account": "a", "amount": 0}, "schema-invalid", "payload.amount"),
        ("payment.hold", {"account": "a", "amount": True}, "schema-invalid", "payload.amount"),
        ("teleport", {}, "schema-invalid", "unknown operation 'teleport'"),
    ],
)
def test_bad_payloads_are_refused_with_a_specific_problem(
    operation: str, payload: dict[str, Any], kind: str, detail_part: str
) -> None:
    world = World()
    answer = perform(world, "k1", operation, payload)
    assert (answer.status, answer.body["type"]) == (422, f"/problems/{kind}")
    assert detail_part in answer.body["detail"]
    assert world.audit()["live"] == [] and world.probe("k1") is None


def test_compensators_are_idempotent_and_semantic_saga3() -> None:
    world = World()
    vm = output_of(perform(world, "k1", "vm.provision", {"name": "web"}))["vmId"]
    first = output_of(perform(world, "c1", "vm.terminate", {"vmId": vm}))
    assert first == {"vmId": vm, "terminated": True, "alreadyReleased": False}
    assert perform(world, "c1", "vm.terminate", {"vmId": vm}).replay  # same key: a replay
    second = output_of(
        perform(world, "c2", "vm.terminate", {"vmId": vm})
    )  # new key: succeeds, changes nothing
    assert second["alreadyReleased"] is True
    released = world.audit()["released"]
    assert [(r["id"], r["releasedByKey"], r["releaseKeys"]) for r in released] == [(vm, "c1", ["c1", "c2"])]
    unknown = perform(world, "c3", "ip.release", {"ipId": vm})  # a vm id is no ip
    assert (unknown.status, unknown.body["type"]) == (404, "/problems/not-found")
    effects = {e["key"]: e for e in world.audit()["effects"]}
    assert effects["c1"]["applied"] == effects["c2"]["applied"] == 1 and effects["c3"]["applied"] == 0


def test_the_seeds_deploy_failing_at_dns_unwinds_back_to_start_saga4() -> None:
    """T1..T4 commit, T5 (DNS, the pivot) fails 409; C4..C1 in reverse bring the world back."""
    world = World()
    ids = deploy_until_dns(world)
    world.arm(Fault("dns.publish", "error", problem="conflict", detail="domain owned by someone else"))
    failed = perform(world, "t5", "dns.publish", {"name": "web.example", "address": ids["address"]})
    assert (failed.status, failed.body["type"]) == (409, "/problems/conflict")
    assert not is_back_to_start(world.audit())
    for key, operation, payload in (
        ("c4", "firewall.unbind", {"ruleId": ids["rule"]}),
        ("c3", "sandbox.clean", {"buildId": ids["build"]}),
        ("c2", "ip.release", {"ipId": ids["ip"]}),
        ("c1", "vm.terminate", {"vmId": ids["vm"]}),
    ):
        output_of(perform(world, key, operation, payload))
    audit = world.audit()
    assert is_back_to_start(audit) and audit["backToStart"]
    assert audit["permanent"] == [] and audit["duplicates"] == [] and audit["orphans"] == []
    assert [r["releaseKeys"] for r in audit["released"]] == [["c1"], ["c2"], ["c3"], ["c4"]]


def test_a_published_dns_record_is_permanent_not_an_orphan() -> None:
    world = World()
    output_of(perform(world, "t5", "dns.publish", {"name": "web.example", "address": "10.0.0.1"}))
    audit = world.audit()
    assert audit["live"] == [] and audit["orphans"] == [] and is_back_to_start(audit)
    assert [r["kind"] for r in audit["permanent"]] == ["dns-record"]


def test_dns_names_conflict_across_works_and_the_verifier_sees_it_saga7() -> None:
    world = World()
    payload = {"name": "web.example", "address": "10.0.0.1"}
    assert verify("dns.name-available", world, payload, "run-2")[0]
    record = output_of(perform(world, "k1", "dns.publish", payload))["recordId"]
    ok, detail = verify("dns.name-available", world, payload, "run-2")
    assert not ok and "run-1" in detail and record in detail
    assert verify("dns.name-available", world, payload, WORK)[0]
    assert not verify("dns.name-available", world, payload)[0]
    assert verify("dns.name-available", world, {}) == (False, "payload.name must be a non-empty string")
    taken = world.perform("run-2", 1, "k2", "dns.publish", payload)
    assert (taken.status, taken.body["type"], taken.body["recordId"]) == (409, "/problems/conflict", record)
    again = output_of(perform(world, "k3", "dns.publish", payload))  # the same work republishing: nothing new
    assert again["recordId"] == record and len(world.audit()["permanent"]) == 1
    with pytest.raises(UnknownVerifier, match=r"no verifier 'dns\.nope'"):
        verify("dns.nope", world, payload)


# --------------------------------------------------------------------------- faults


def test_an_error_fault_fires_times_times_then_the_operation_succeeds() -> None:
    world = World()
    world.arm(Fault("vm.provision", "error", times=2, problem="rate-limited", extensions={"retryAfter": 1}))
    for key in ("k1", "k2"):
        answer = perform(world, key, "vm.provision", {"name": "web"})
        assert (answer.status, answer.body["type"], answer.body["retryAfter"]) == (
            429,
            "/problems/rate-limited",
            1,
        )
    assert world.faults() == [] and world.audit()["live"] == []
    output_of(perform(world, "k1", "vm.provision", {"name": "web"}))  # the same key, now without a fault
    effect = world.effect("k1")
    assert effect is not None and (effect.requests, effect.applied) == (2, 1)


def test_error_faults_take_the_kinds_status_or_an_explicit_one() -> None:
    world = World()
    world.arm(Fault("vm.terminate", "error", problem="auth-revoked"))
    world.arm(Fault("vm.terminate", "error", problem="quota-gone", status=507, detail="no more VMs"))
    first = perform(world, "k1", "vm.terminate", {"vmId": "vm-x"})
    second = perform(world, "k2", "vm.terminate", {"vmId": "vm-x"})
    assert (first.status, first.body["type"], first.body["title"]) == (
        403,
        "/problems/auth-revoked",
        "Credentials revoked",
    )
    assert (second.status, second.body["type"], second.body["detail"]) == (
        507,
        "/problems/quota-gone",
        "no more VMs",
    )


def test_a_partial_output_leaves_the_resource_behind_and_a_retry_adopts_it() -> None:
    world = World()
    world.arm(Fault("vm.provision", "error", status=500, problem="unavailable", partial_output=True))
    failed = perform(world, "k1", "vm.provision", {"name": "web"})
    assert failed.status == 500
    vm = failed.body["partialOutput"]["vmId"]
    audit = world.audit()
    assert [r["id"] for r in audit["live"]] == [vm] == [r["id"] for r in audit["orphans"]]
    assert world.probe("k1") is None  # no success was ever answered
    retried = output_of(perform(world, "k1", "vm.provision", {"name": "web"}))
    assert retried == {"vmId": vm}
    audit = world.audit()
    assert len(audit["live"]) == 1 and audit["orphans"] == [] and audit["effects"][0]["applied"] == 1


def test_a_partial_output_can_be_compensated_first() -> None:
    """SAGA-3: a failed step with partial effects has its own compensator run first."""
    world = World()
    world.arm(Fault("ip.reserve", "error", problem="unavailable", partial_output=True))
    ip = perform(world, "k1", "ip.reserve", {"region": "eu"}).body["partialOutput"]["ipId"]
    output_of(perform(world, "c1", "ip.release", {"ipId": ip}))
    assert is_back_to_start(world.audit())


def test_a_timeout_after_commit_applies_the_effect_and_the_probe_finds_it_rec6() -> None:
    world = World()
    world.arm(Fault("ip.reserve", "timeout-after-commit", delay_s=7.5))
    answer = perform(world, "k1", "ip.reserve", {"region": "eu"})
    assert answer.status == 200 and answer.delay_s == 7.5
    assert world.probe("k1") == answer.body
    retry = perform(world, "k1", "ip.reserve", {"region": "eu"})
    assert retry.replay and retry.body == answer.body and retry.delay_s == 0.0
    assert world.audit()["effects"][0]["applied"] == 1


def test_a_timeout_before_commit_applies_nothing() -> None:
    world = World()
    world.arm(Fault("ip.reserve", "timeout-before-commit", delay_s=3.0))
    answer = perform(world, "k1", "ip.reserve", {"region": "eu"})
    assert (answer.status, answer.body["type"], answer.delay_s) == (503, "/problems/unavailable", 3.0)
    assert world.probe("k1") is None and world.audit()["live"] == []
    output_of(perform(world, "k1", "ip.reserve", {"region": "eu"}))
    assert world.audit()["effects"][0] == {
        "key": "k1",
        "workId": WORK,
        "operation": "ip.reserve",
        "requests": 2,
        "applied": 1,
        "succeeded": True,
    }


def test_faults_fire_per_operation_in_order_and_only_on_matching_payloads() -> None:
    world = World()
    world.arm(Fault("vm.provision", "error", problem="conflict", match={"name": "db"}))
    world.arm(Fault("vm.provision", "error", problem="rate-limited"))
    assert perform(world, "k0", "ip.reserve", {"region": "eu"}).status == 200  # another operation
    assert perform(world, "k1", "vm.provision", {"name": "web"}).status == 429  # the first does not match
    assert perform(world, "k2", "vm.provision", {"name": "db"}).status == 409
    assert perform(world, "k3", "vm.provision", {"name": "db"}).status == 200
    assert world.clear_faults() == 0


def test_replays_and_stale_requests_do_not_consume_faults() -> None:
    world = World()
    output_of(perform(world, "k1", "vm.provision", {"name": "web"}, epoch=2))
    armed = world.arm(Fault("vm.provision", "error", problem="unavailable"))
    assert perform(world, "k1", "vm.provision", {"name": "web"}, epoch=2).replay
    assert perform(world, "k2", "vm.provision", {"name": "db"}, epoch=1).status == 409
    assert world.faults() == [armed.to_json()] and armed.fired == 0


def test_nominal_durations_are_scaled_into_the_answers_delay() -> None:
    world = World(time_scale=0.5)
    assert perform(world, "k1", "vm.provision", {"name": "web"}).delay_s == pytest.approx(0.06)
    assert perform(world, "k1", "vm.provision", {"name": "web"}).delay_s == 0.0  # a replay is a lookup
    assert OPERATIONS["sandbox.compile"].nominal_ms == 4200
    assert World().perform(WORK, 1, "k", "vm.provision", {"name": "web"}).delay_s == 0.0
    with pytest.raises(ValueError, match="time_scale"):
        World(time_scale=-1.0)


_OPS = st.sampled_from(["provision", "terminate", "fault", "stale"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_OPS, st.integers(0, 3), st.integers(1, 3)), max_size=40))
def test_no_key_is_ever_applied_twice_whatever_the_retries_exe6(steps: list[tuple[str, int, int]]) -> None:
    world = World()
    answers: dict[str, dict[str, Any]] = {}
    for action, index, epoch in steps:
        if action == "fault":
            world.arm(Fault("vm.provision", "error", partial_output=epoch == 2))
            continue
        key = f"{action}-{index}"
        if action == "provision":
            answer = perform(world, key, "vm.provision", {"name": f"n{index}"}, epoch=3)
        elif action == "terminate":
            vm = world.audit()["live"][0]["id"] if world.audit()["live"] else "vm-none"
            key = f"{key}-{vm}"
            answer = world.perform("run-9", 1, key, "vm.terminate", {"vmId": vm})
        else:
            fenced = world.highest_epoch(WORK) == 3 and key not in answers
            answer = perform(world, key, "vm.provision", {"name": "stale"}, epoch=1)
            assert not fenced or answer.body["type"] == "/problems/stale-epoch"
        if answer.ok:
            assert answers.setdefault(key, answer.body) == answer.body  # a replay answers the same
            assert world.probe(key) == answer.body
    audit = world.audit()
    assert audit["duplicates"] == []
    assert all(effect["applied"] <= 1 for effect in audit["effects"])
    vms_created = {r["createdByKey"] for r in audit["live"] + audit["released"]}
    assert len(vms_created) == len(audit["live"]) + len(audit["released"])


# --------------------------------------------------------------------------- registrations, config


def test_tools_json_registers_every_forward_operation_consistently_saga2_saga5() -> None:
    tools = load_tool_registrations()
    forward = [spec.name for spec in OPERATIONS.values() if spec.role == "create"]
    assert [tool["name"] for tool in tools] == forward
    for tool in tools:
        spec = OPERATIONS[tool["operation"]]
        assert tool["gatewayTool"] == "env" and tool["idempotent"] and tool["probe"]
        jsonschema.Draft202012Validator.check_schema(tool["parameters"])
        assert tool["parameters"] == spec.parameters and tool["parameters"]["additionalProperties"] is False
        assert tool["cost"]["durationMs"] == spec.nominal_ms
        assert tool["domain"] in ("local", "internal", "external")
        if tool["reversibility"] == "III":
            assert "compensator" not in tool and spec.permanent
            assert all(name in ("dns.name-available",) for name in tool["verifiers"])
            continue
        assert tool["reversibility"] in ("I", "II") and not tool["outbound"] and not spec.permanent
        compensator = OPERATIONS[tool["compensator"]["operation"]]
        assert compensator.role == "release" and compensator.resource_kind == spec.resource_kind
        assert tool["compensator"]["cost"]["durationMs"] == compensator.nominal_ms
        bind = tool["compensator"]["bind"]
        assert sorted(bind) == sorted(compensator.parameters["required"])
        assert all(source.removeprefix("output.") in spec.outputs for source in bind.values())
    by_name = {tool["name"]: tool for tool in tools}
    assert by_name["dns.publish"]["verifiers"] == ["dns.name-available"]
    assert by_name["notify.send"]["outbound"] is True and by_name["notify.send"]["reversibility"] == "III"
    assert {by_name[n]["reversibility"] for n in ("sandbox.compile", "cache.warm")} == {"I"}
    assert json.loads(json.dumps(tools)) == tools


def test_compensator_bindings_from_tools_json_drive_a_real_unwind() -> None:
    """Every registered compensator, bound from its forward output, releases what was created."""
    world = World()
    vm = output_of(perform(world, "setup", "vm.provision", {"name": "base"}))["vmId"]
    examples = {
        "vm.provision": {"name": "web"},
        "ip.reserve": {"region": "eu"},
        "sandbox.compile": {"vmId": vm, "source": "x"},
        "firewall.write": {"vmId": vm, "port": 22},
        "payment.hold": {"account": "a", "amount": 5},
        "cache.warm": {"name": "c"},
    }
    stack = []
    for tool in load_tool_registrations():
        if tool["reversibility"] == "III":
            continue
        output = output_of(perform(world, f"f-{tool['name']}", tool["operation"], examples[tool["name"]]))
        bound = {
            name: output[source.removeprefix("output.")]
            for name, source in tool["compensator"]["bind"].items()
        }
        stack.append((tool["compensator"]["operation"], bound))
    for index, (operation, payload) in enumerate(reversed(stack)):
        output_of(perform(world, f"c-{index}", operation, payload))
    output_of(perform(world, "teardown", "vm.terminate", {"vmId": vm}))
    assert is_back_to_start(world.audit())


def test_main_reads_its_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = TenureSettings()
    assert (defaults.sim_host, defaults.sim_port, defaults.sim_time_scale) == ("127.0.0.1", 9200, 0.0)
    env = {"TENURE_SIM_HOST": "0.0.0.0", "TENURE_SIM_PORT": "9300", "TENURE_SIM_TIME_SCALE": "0.5"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    configured = TenureSettings()
    assert (configured.sim_host, configured.sim_port, configured.sim_time_scale) == ("0.0.0.0", 9300, 0.5)
    for bad in ("70000", "x"):
        monkeypatch.setenv("TENURE_SIM_PORT", bad)
        with pytest.raises(ValidationError):
            TenureSettings()
    monkeypatch.setenv("TENURE_SIM_PORT", "9300")
    for bad_scale in ("-1", "nan", "inf", "fast"):
        monkeypatch.setenv("TENURE_SIM_TIME_SCALE", bad_scale)
        with pytest.raises(ValidationError):
            TenureSettings()


# --------------------------------------------------------------------------- for the fault scoreboard (DUR-3)


def test_a_fault_armed_for_a_work_id_fires_only_for_that_works_requests_dur3() -> None:
    world = World()
    world.arm(Fault("vm.provision", "error", problem="exhausted", work_id="run-b"))
    assert perform(world, "a1", "vm.provision", {"name": "web"}, work="run-a").status == 200
    assert world.faults()[0]["workId"] == "run-b" and world.faults()[0]["remaining"] == 1
    failed = perform(world, "b1", "vm.provision", {"name": "web"}, work="run-b")
    assert (failed.status, failed.body["type"]) == (507, "/problems/exhausted")
    assert world.faults() == []


def test_a_corrupt_answer_applies_the_effect_and_the_probe_has_the_true_body_dur3() -> None:
    world = World()
    world.arm(Fault("vm.provision", "corrupt-answer"))
    answer = perform(world, "k1", "vm.provision", {"name": "web"})
    assert answer.status == 200 and answer.raw_body is not None
    with pytest.raises(ValueError):
        json.loads(answer.raw_body)
    stored = world.probe("k1")
    assert stored is not None and stored["output"]["vmId"].startswith("vm-")
    whole = json.dumps(stored, sort_keys=True, separators=(",", ":"))
    assert len(answer.raw_body) < len(whole) and whole.startswith(answer.raw_body)
    retry = perform(world, "k1", "vm.provision", {"name": "web"})  # the same key: the true body, no new VM
    assert retry.replay and retry.body == stored and retry.raw_body is None
    assert len(world.audit()["live"]) == 1


def test_a_corrupt_answer_fault_on_a_refused_request_answers_the_refusal() -> None:
    world = World()
    world.arm(Fault("sandbox.compile", "corrupt-answer"))
    answer = perform(world, "k1", "sandbox.compile", {"vmId": "vm-none", "source": "x"})
    assert answer.status == 404 and answer.raw_body is None


def test_semantic_duplicates_are_the_same_effect_applied_under_several_keys_dur3() -> None:
    world = World()
    vm = output_of(perform(world, "k1", "vm.provision", {"name": "web"}))["vmId"]
    perform(world, "k2", "vm.provision", {"name": "web"})  # a naive retry with a fresh key: a second VM
    perform(world, "k3", "vm.provision", {"name": "web"}, work="run-2")  # another work: not a duplicate
    perform(world, "r1", "vm.terminate", {"vmId": vm})
    perform(world, "r2", "vm.terminate", {"vmId": vm})  # changes nothing: not an effect
    perform(world, "d1", "dns.publish", {"name": "a.example", "address": "10.0.0.1"})
    perform(world, "d2", "dns.publish", {"name": "a.example", "address": "10.0.0.1"})  # the same record
    assert world.audit()["duplicates"] == []  # no key was applied twice
    assert world.audit()["semanticDuplicates"] == [
        {
            "workId": WORK,
            "operation": "vm.provision",
            "payload": {"name": "web"},
            "keys": ["k1", "k2"],
            "applied": 2,
        }
    ]


def test_the_audit_can_be_limited_to_one_work_id_dur3() -> None:
    world = World()
    perform(world, "a1", "vm.provision", {"name": "web"}, work="run-a", epoch=2)
    perform(world, "b1", "vm.provision", {"name": "web"}, work="run-b")
    perform(world, "b2", "vm.provision", {"name": "web"}, work="run-b")
    world.arm(Fault("ip.reserve", "error", work_id="run-a"))
    world.arm(Fault("ip.reserve", "error", work_id="run-b"))
    mine = world.audit("run-a")
    assert mine["workId"] == "run-a"
    assert [r["workId"] for r in mine["live"]] == ["run-a"]
    assert [e["key"] for e in mine["effects"]] == ["a1"]
    assert mine["epochs"] == {"run-a": 2} and [f["workId"] for f in mine["faults"]] == ["run-a"]
    assert mine["semanticDuplicates"] == [] and not mine["backToStart"]
    theirs = world.audit("run-b")
    assert len(theirs["live"]) == 2 and theirs["semanticDuplicates"][0]["keys"] == ["b1", "b2"]
    assert world.audit("run-none")["live"] == [] and world.audit("run-none")["backToStart"]
    assert len(world.audit()["live"]) == 3


def test_a_compile_error_names_the_mistake_so_two_mistakes_read_differently_rec5() -> None:
    world = World()
    vm = output_of(perform(world, "k1", "vm.provision", {"name": "web"}))["vmId"]
    first = perform(world, "k2", "sandbox.compile", {"vmId": vm, "source": "a\nsyntax-error: wrong-type\nb"})
    second = perform(world, "k3", "sandbox.compile", {"vmId": vm, "source": "a\nsyntax-error: typo"})
    assert first.body["detail"] == "syntax error at line 2: wrong-type"
    assert second.body["detail"] == "syntax error at line 2: typo"
