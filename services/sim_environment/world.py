"""Pure core of the simulated environment: an "external world" of VMs, IPs, builds, firewall rules,
DNS records, payment holds, messages and caches that Tenure's effect gateway acts upon.

It is deliberately NOT part of Tenure: like a real provider it checks the sender's fencing epoch
itself (LEASE-3), never applies an effect twice under one idempotency key and answers the
"did it happen?" probe (REC-6), so tests can prove a saga's unwind left the world as it found it
(SAGA-3, SAGA-4). No I/O, no clock, no sleeping, no lock: the app adds the lock and does the
sleeping that an :class:`Answer`'s ``delay_s`` asks for. Rules of :meth:`World.perform`, in order:

0. The operation must be one this world knows (a malformed request, not an effect).
1. Idempotency. The first request under a key binds the key to (work id, operation, payload). A
   different request under a known key is a 409 ``idempotency-key-conflict``; the same request
   whose effect answered success gets the stored body again, whatever epoch it carries.
2. Fencing. An epoch below the highest this work id presented is a 409 ``stale-epoch`` and
   changes nothing; otherwise the epoch becomes the work id's bar, even if the request then
   fails: it proved a newer holder exists.
3. Armed faults for the operation, first matching one first (see :class:`Fault`); a fault armed
   for a work id fires only for that work's requests, so concurrent runs never take each other's.
4. The operation: payload schema, preconditions, then the effect. An effect applied under a key
   whose answer was lost or turned into an error (a partial output) is never applied again: a
   retry under the same key adopts it. That keeps ``applied`` at most 1 per key.

The audit also finds *semantic* duplicates: the same (work id, operation, payload) that changed
the world more than once under different keys, which is what a client retrying with a fresh key
after a lost answer does (the fault-injection benchmark counts them as duplicated effects). A
repeat that changes nothing (releasing a released resource, republishing the same DNS record)
is not an effect and is not counted.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from services.sim_environment.operations import (
    OPERATIONS,
    PROBLEM_KINDS,
    OperationSpec,
    canonical_json,
    problem,
)

__all__ = [
    "FAULT_KINDS",
    "OPERATIONS",
    "PROBLEM_KINDS",
    "Answer",
    "ArmedFault",
    "EffectRecord",
    "Fault",
    "FaultKind",
    "OperationSpec",
    "Resource",
    "World",
    "canonical_json",
    "is_back_to_start",
    "problem",
]

FaultKind = Literal["error", "timeout-after-commit", "timeout-before-commit", "corrupt-answer"]
FAULT_KINDS: tuple[FaultKind, ...] = (
    "error",
    "timeout-after-commit",
    "timeout-before-commit",
    "corrupt-answer",
)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Answer:
    """What the world answers; the app sleeps ``delay_s`` (outside its lock) before sending it."""

    status: int
    body: dict[str, Any]
    delay_s: float = 0.0
    replay: bool = False
    # Sent instead of ``body`` when set: a malformed answer (fault "corrupt-answer").
    raw_body: str | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True)
class Fault:
    """A failure armed for the next matching requests of ``operation``.

    - ``error``: answer ``status``/``problem`` (defaults from :data:`PROBLEM_KINDS`). With
      ``partial_output`` the effect IS applied and left behind, and the error carries
      ``"partialOutput": <output>``; no success is stored, so the probe says 404.
    - ``timeout-after-commit``: apply the effect, store the success, answer it ``delay_s`` late.
    - ``timeout-before-commit``: apply nothing, answer 503 ``unavailable`` ``delay_s`` late.
    - ``corrupt-answer``: apply the effect and store its success (the probe answers the true
      body), but answer 200 with a truncated, unparseable JSON body.
    ``match``: payload values that must all be equal for the fault to fire; ``work_id``: when set,
    only requests with that ``X-Work-Id`` fire it."""

    operation: str
    kind: FaultKind
    times: int = 1
    status: int | None = None
    problem: str = "unavailable"
    detail: str | None = None
    partial_output: bool = False
    delay_s: float = 10.0
    match: Mapping[str, Any] = field(default_factory=dict)
    extensions: Mapping[str, Any] = field(default_factory=dict)
    work_id: str | None = None

    def matches(self, operation: str, payload: Mapping[str, Any], work_id: str | None = None) -> bool:
        if operation != self.operation:
            return False
        if self.work_id is not None and work_id != self.work_id:
            return False
        return all(name in payload and payload[name] == value for name, value in self.match.items())

    def to_json(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "kind": self.kind,
            "times": self.times,
            "status": self.status,
            "problem": self.problem,
            "detail": self.detail,
            "partialOutput": self.partial_output,
            "delayS": self.delay_s,
            "match": dict(self.match),
            "extensions": dict(self.extensions),
            "workId": self.work_id,
        }


@dataclass
class ArmedFault:
    fault_id: str
    fault: Fault
    remaining: int
    fired: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "faultId": self.fault_id,
            **self.fault.to_json(),
            "remaining": self.remaining,
            "fired": self.fired,
        }


@dataclass
class Resource:
    kind: str
    resource_id: str
    created_by_key: str
    work_id: str
    operation: str
    params: dict[str, Any]
    permanent: bool = False
    alive: bool = True
    released_by_key: str | None = None
    # Every key whose release reached this resource: more than one means a compensator was sent
    # twice under different keys (harmless, semantically idempotent, but worth seeing).
    release_keys: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": self.kind,
            "id": self.resource_id,
            "createdByKey": self.created_by_key,
            "workId": self.work_id,
            "operation": self.operation,
            "params": copy.deepcopy(self.params),
        }
        if not self.alive:
            body["releasedByKey"] = self.released_by_key
            body["releaseKeys"] = list(self.release_keys)
        return body


@dataclass
class EffectRecord:
    """Everything known about one idempotency key."""

    key: str
    work_id: str
    operation: str
    payload_json: str
    requests: int = 0
    applied: int = 0
    # The application changed the world (a new resource, a live one released); a repeat that
    # found its work already done (a second release, the same DNS record again) did not.
    effective: bool = False
    output: dict[str, Any] | None = None  # set once the effect is applied, answered or not
    success_body: dict[str, Any] | None = None  # set once a success was answered: what the probe sees

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "workId": self.work_id,
            "operation": self.operation,
            "requests": self.requests,
            "applied": self.applied,
            "succeeded": self.success_body is not None,
        }


class _Refused(Exception):
    """An operation's own refusal (bad payload, failed precondition): nothing was applied."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body["detail"])
        self.body = body


class World:
    """The simulated external world. Deterministic: the same calls give the same answers and ids."""

    def __init__(self, time_scale: float = 0.0) -> None:
        if not time_scale >= 0.0 or time_scale == float("inf"):
            raise ValueError(f"time_scale must be a finite number >= 0, got {time_scale!r}")
        self.time_scale = time_scale
        self._resources: dict[str, Resource] = {}
        self._effects: dict[str, EffectRecord] = {}
        self._epochs: dict[str, int] = {}
        self._faults: list[ArmedFault] = []
        self._faults_armed = 0

    # ------------------------------------------------------------------ effects

    def perform(self, work_id: str, epoch: int, key: str, operation: str, payload: dict[str, Any]) -> Answer:
        spec = OPERATIONS.get(operation)
        if spec is None:
            known = ", ".join(OPERATIONS)
            return Answer(422, problem("schema-invalid", f"unknown operation {operation!r}; known: {known}"))
        payload_json = canonical_json(payload)
        record = self._effects.get(key)
        if record is None:
            record = self._effects[key] = EffectRecord(key, work_id, operation, payload_json)
        record.requests += 1
        differences = [
            name
            for name, mine, theirs in (
                ("workId", work_id, record.work_id),
                ("operation", operation, record.operation),
                ("payload", payload_json, record.payload_json),
            )
            if mine != theirs
        ]
        if differences:
            return Answer(
                409,
                problem(
                    "idempotency-key-conflict",
                    f"Idempotency-Key {key!r} already names a different request "
                    f"(differs in {', '.join(differences)})",
                    differences=differences,
                ),
            )
        if record.success_body is not None:
            return Answer(200, copy.deepcopy(record.success_body), replay=True)
        highest = self._epochs.get(work_id)
        if highest is not None and epoch < highest:
            return Answer(
                409,
                problem(
                    "stale-epoch",
                    f"epoch {epoch} is below the highest epoch {highest} seen for work {work_id!r}",
                    workId=work_id,
                    presentedEpoch=epoch,
                    highestEpoch=highest,
                ),
            )
        self._epochs[work_id] = max(epoch, highest or 0)
        delay = spec.nominal_ms / 1000 * self.time_scale
        fault = self._take_fault(operation, payload, work_id)
        if fault is None:
            return self._execute(record, spec, payload, delay, answer_success=True)
        if fault.kind == "timeout-before-commit":
            detail = fault.detail or f"{operation} timed out before commit: nothing was applied"
            return Answer(503, problem("unavailable", detail, **fault.extensions), fault.delay_s)
        if fault.kind == "timeout-after-commit":
            answer = self._execute(record, spec, payload, delay, answer_success=True)
            return replace(answer, delay_s=answer.delay_s + fault.delay_s)
        if fault.kind == "corrupt-answer":
            answer = self._execute(record, spec, payload, delay, answer_success=True)
            if not answer.ok:
                return answer
            whole = canonical_json(answer.body)
            return replace(answer, raw_body=whole[: max(1, len(whole) // 2)])
        detail = fault.detail or f"injected {fault.problem} fault on {operation}"
        if not fault.partial_output:
            body = problem(fault.problem, detail, fault.status, **fault.extensions)
            return Answer(body["status"], body, delay)
        answer = self._execute(record, spec, payload, delay, answer_success=False)
        if not answer.ok:
            return answer
        partial = answer.body["output"]
        body = problem(fault.problem, detail, fault.status, **fault.extensions, partialOutput=partial)
        return Answer(body["status"], body, delay)

    def probe(self, key: str) -> dict[str, Any] | None:
        """REC-6: the stored success body under ``key``, or None if no success was ever answered."""
        record = self._effects.get(key)
        if record is None or record.success_body is None:
            return None
        return copy.deepcopy(record.success_body)

    def _execute(
        self,
        record: EffectRecord,
        spec: OperationSpec,
        payload: dict[str, Any],
        delay: float,
        *,
        answer_success: bool,
    ) -> Answer:
        if record.output is None:
            try:
                record.output = self._apply(record, spec, payload)
            except _Refused as refused:
                return Answer(refused.body["status"], refused.body, delay)
            record.applied += 1
        body = {"operation": spec.name, "output": copy.deepcopy(record.output)}
        if answer_success:
            record.success_body = copy.deepcopy(body)
        return Answer(200, body, delay)

    def _apply(self, record: EffectRecord, spec: OperationSpec, payload: dict[str, Any]) -> dict[str, Any]:
        errors = sorted(
            spec.validator.iter_errors(payload),
            key=lambda e: (e.validator != "required", [str(p) for p in e.absolute_path], e.message),
        )
        if errors:
            error = errors[0]
            if error.validator == "required":
                missing = [name for name in spec.parameters["required"] if name not in payload]
                raise _Refused(
                    problem(
                        "missing-parameter", f"{spec.name} needs payload.{missing[0]}", parameter=missing[0]
                    )
                )
            where = ".".join(["payload", *(str(p) for p in error.absolute_path)])
            raise _Refused(problem("schema-invalid", f"{spec.name}: {where}: {error.message}", field=where))
        if spec.role == "release":
            return self._release(record, spec, str(payload[spec.id_field]))
        check = _PRECONDITIONS.get(spec.name)
        if check is not None:
            check(self, record, payload)
        return self._create(record, spec, payload)

    def _create(self, record: EffectRecord, spec: OperationSpec, payload: dict[str, Any]) -> dict[str, Any]:
        digest = _digest(record.key)
        resource_id = f"{spec.id_field.removesuffix('Id')}-{digest[:10]}"
        if spec.name == "dns.publish":
            existing = self.dns_record(str(payload["name"]))
            if existing is not None:  # the same work publishing the same name again: nothing new
                return {"recordId": existing.resource_id}
        record.effective = True
        self._resources[resource_id] = Resource(
            spec.resource_kind,
            resource_id,
            record.key,
            record.work_id,
            spec.name,
            copy.deepcopy(payload),
            permanent=spec.permanent,
        )
        output: dict[str, Any] = {spec.id_field: resource_id}
        if spec.name == "ip.reserve":
            octets = bytes.fromhex(digest[10:16])
            output["address"] = f"10.{octets[0]}.{octets[1]}.{octets[2] % 254 + 1}"
            self._resources[resource_id].params["address"] = output["address"]
        return output

    def _release(self, record: EffectRecord, spec: OperationSpec, resource_id: str) -> dict[str, Any]:
        resource = self._resources.get(resource_id)
        if resource is None or resource.kind != spec.resource_kind:
            raise _Refused(
                problem(
                    "not-found",
                    f"{spec.name}: no {spec.resource_kind} {resource_id!r}",
                    resourceId=resource_id,
                )
            )
        resource.release_keys.append(record.key)
        already_released = not resource.alive
        if resource.alive:  # a second release (under another key) is a success that changes nothing
            resource.alive, resource.released_by_key = False, record.key
            record.effective = True
        return {spec.id_field: resource_id, spec.released_flag: True, "alreadyReleased": already_released}

    def live_resource(self, kind: str, resource_id: str) -> Resource | None:
        resource = self._resources.get(resource_id)
        return resource if resource is not None and resource.kind == kind and resource.alive else None

    def dns_record(self, name: str) -> Resource | None:
        """The DNS record published under ``name`` (the world's own object: read, do not change)."""
        for resource in self._resources.values():
            if resource.kind == "dns-record" and resource.params.get("name") == name:
                return resource
        return None

    # ------------------------------------------------------------------ faults

    def arm(self, fault: Fault) -> ArmedFault:
        if fault.operation not in OPERATIONS:
            raise ValueError(f"unknown operation {fault.operation!r}")
        if fault.times < 1:
            raise ValueError(f"times must be at least 1, got {fault.times}")
        self._faults_armed += 1
        armed = ArmedFault(f"fault-{self._faults_armed}", fault, fault.times)
        self._faults.append(armed)
        return armed

    def clear_faults(self) -> int:
        cleared = len(self._faults)
        self._faults = []
        return cleared

    def faults(self) -> list[dict[str, Any]]:
        return [armed.to_json() for armed in self._faults]

    def _take_fault(self, operation: str, payload: Mapping[str, Any], work_id: str) -> Fault | None:
        for armed in self._faults:
            if armed.fault.matches(operation, payload, work_id):
                armed.remaining -= 1
                armed.fired += 1
                if armed.remaining == 0:
                    self._faults.remove(armed)
                return armed.fault
        return None

    # ------------------------------------------------------------------ reading

    def resources(self) -> list[Resource]:
        return [copy.deepcopy(resource) for resource in self._resources.values()]

    def effect(self, key: str) -> EffectRecord | None:
        record = self._effects.get(key)
        return copy.deepcopy(record) if record is not None else None

    def highest_epoch(self, work_id: str) -> int | None:
        return self._epochs.get(work_id)

    def semantic_duplicates(self, work_id: str | None = None) -> list[dict[str, Any]]:
        """(work id, operation, payload) groups that changed the world more than once, under any
        keys: the duplicated effects of a client that retried with a fresh key (oldest first)."""
        groups: dict[tuple[str, str, str], list[EffectRecord]] = {}
        for record in self._effects.values():
            if record.effective and (work_id is None or record.work_id == work_id):
                groups.setdefault((record.work_id, record.operation, record.payload_json), []).append(record)
        return [
            {
                "workId": work,
                "operation": operation,
                "payload": json.loads(payload_json),
                "keys": [record.key for record in records],
                "applied": len(records),
            }
            for (work, operation, payload_json), records in groups.items()
            if len(records) > 1
        ]

    def audit(self, work_id: str | None = None) -> dict[str, Any]:
        """The world's state for assertions (SAGA-4: back to start after an unwind).

        ``live``: compensable resources still in place; ``released``: the compensated ones;
        ``permanent``: DNS records and sent messages (a pivot's effect is not an orphan);
        ``effects``: per key, requests received and times applied; ``duplicates``: keys applied
        more than once (always empty unless this world is broken); ``semanticDuplicates``: see
        :meth:`semantic_duplicates`; ``orphans``: live resources whose creating request never
        answered success, so only a ``partialOutput`` told of them. With ``work_id`` everything is
        limited to that work's resources, effects, epoch and armed faults."""

        def mine(owner: str | None) -> bool:
            return work_id is None or owner == work_id

        resources = [r for r in self._resources.values() if mine(r.work_id)]
        effects = [record for record in self._effects.values() if mine(record.work_id)]
        live = [r for r in resources if r.alive and not r.permanent]
        audit: dict[str, Any] = {
            "live": [r.to_json() for r in live],
            "released": [r.to_json() for r in resources if not r.alive],
            "permanent": [r.to_json() for r in resources if r.permanent],
            "effects": [record.to_json() for record in effects],
            "duplicates": [record.key for record in effects if record.applied > 1],
            "semanticDuplicates": self.semantic_duplicates(work_id),
            "orphans": [r.to_json() for r in live if self._effects[r.created_by_key].success_body is None],
            "epochs": {work: epoch for work, epoch in self._epochs.items() if mine(work)},
            "faults": [armed.to_json() for armed in self._faults if mine(armed.fault.work_id)],
        }
        if work_id is not None:
            audit["workId"] = work_id
        audit["backToStart"] = is_back_to_start(audit)
        return audit


def _needs_live_vm(world: World, record: EffectRecord, payload: Mapping[str, Any]) -> None:
    vm_id = str(payload["vmId"])
    if world.live_resource("vm", vm_id) is None:
        raise _Refused(problem("not-found", f"{record.operation}: no live vm {vm_id!r}", resourceId=vm_id))


def _check_compile(world: World, record: EffectRecord, payload: Mapping[str, Any]) -> None:
    _needs_live_vm(world, record, payload)
    source = str(payload["source"])
    if "syntax-error" in source:
        at = source.index("syntax-error")
        line = source[:at].count("\n") + 1
        # What follows the marker on its line names the mistake, so two different mistakes read
        # differently (REC-5 tells a new error from a repeated one by its text).
        what = source[at + len("syntax-error") :].split("\n", 1)[0].strip(" :")
        detail = f"syntax error at line {line}" + (f": {what}" if what else "")
        raise _Refused(problem("compile-error", detail, line=line))


def _check_dns(world: World, record: EffectRecord, payload: Mapping[str, Any]) -> None:
    existing = world.dns_record(str(payload["name"]))
    if existing is None:
        return
    if existing.work_id != record.work_id or existing.params.get("address") != payload["address"]:
        raise _Refused(
            problem(
                "conflict",
                f"name {payload['name']!r} is already published by work {existing.work_id!r} "
                f"as {existing.params.get('address')!r}",
                recordId=existing.resource_id,
            )
        )


_PRECONDITIONS: dict[str, Callable[[World, EffectRecord, Mapping[str, Any]], None]] = {
    "sandbox.compile": _check_compile,
    "firewall.write": _needs_live_vm,
    "dns.publish": _check_dns,
}


def is_back_to_start(audit: Mapping[str, Any]) -> bool:
    """SAGA-4: nothing compensable is left in place; permanent effects (a pivot's) do not count."""
    return not audit["live"]
