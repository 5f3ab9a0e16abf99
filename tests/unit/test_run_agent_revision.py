"""EXE-14: a run names what it runs. The agentRevisionId a schedule (or the submitter) gives a
run travels SubmitRun -> RunSubmitted -> the RunState (the aggregate's own evolve) -> the state
codec -> the Run view (GET /runs/{id}, the listing), and POST /runs accepts it directly, bounded
like every identifier. States and views stored before the field existed read as "none named".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from services.common.contracts import RunSubmitted, SubmitRun
from services.lease_coordinator.domain import Rejection, RunState, decide, evolve
from services.lease_coordinator.state_codec import decode_state, encode_state, state_record
from services.projections.views import fold_run, render_run
from tests.support.api_harness import api_client

from .strategies import submit_command

NOW = 1_767_225_600_500
KEYS = "rita-key=rita:submitter,olga-key=olga:operator"
RITA = {"Authorization": "Bearer rita-key"}
PROBLEM_JSON = "application/problem+json"


def _submitted(command: SubmitRun) -> RunSubmitted:
    decision = decide(None, command, NOW)
    assert not isinstance(decision, Rejection), decision
    (event,) = decision
    assert isinstance(event, RunSubmitted)
    return event


def _pinned(revision: str | None = "agrev-2026-03") -> SubmitRun:
    return dataclasses.replace(submit_command(), agent_revision_id=revision)


# --- the aggregate and its codec -----------------------------------------------------------------


def test_evolve_of_run_submitted_keeps_the_agent_revision_exe_14() -> None:
    state = evolve(None, _submitted(_pinned()))
    assert state.agent_revision_id == "agrev-2026-03"
    assert evolve(None, _submitted(_pinned(None))).agent_revision_id is None


def test_the_state_codec_round_trips_the_agent_revision_exe_14() -> None:
    for revision in ("agrev-2026-03", None):
        state = evolve(None, _submitted(_pinned(revision)))
        assert state_record(state)["agent_revision_id"] == revision
        assert decode_state(encode_state(state)) == state


def test_a_state_stored_before_runs_named_a_revision_decodes_with_none_exe_14() -> None:
    state = evolve(None, _submitted(_pinned(None)))
    record = state_record(state)
    record.pop("agent_revision_id")
    decoded: RunState = decode_state(json.dumps(record).encode())
    assert decoded == state and decoded.agent_revision_id is None


# --- the Run view ------------------------------------------------------------------------------


def test_the_run_view_shows_the_agent_revision_and_null_when_none_exe_14() -> None:
    pinned = fold_run([_submitted(_pinned())])
    unpinned = fold_run([_submitted(_pinned(None))])
    assert pinned is not None and unpinned is not None
    assert render_run(pinned)["agentRevisionId"] == "agrev-2026-03"
    assert render_run(unpinned)["agentRevisionId"] is None


# --- POST /runs --------------------------------------------------------------------------------


@pytest.fixture()
def api(tmp_path: Path) -> Any:
    with api_client(tmp_path, api_keys=KEYS) as pair:
        yield pair


def _submit(client: Any, key: str, **changes: Any) -> Any:
    body = {"tenant": "acme", "executionSpec": {"agent": "triage-bot"}, "timeoutSeconds": 600, **changes}
    return client.post("/runs", headers={**RITA, "Idempotency-Key": key}, json=body)


def test_post_runs_accepts_an_agent_revision_and_the_view_and_listing_show_it_exe_14(api: Any) -> None:
    client, tenure = api
    created = _submit(client, "k-1", agentRevisionId="agrev-2026-03")
    assert created.status_code == 201, created.text
    run_id = created.json()["runId"]
    (command,) = tenure.commands_of(SubmitRun)
    assert command.agent_revision_id == "agrev-2026-03"
    assert client.get(f"/runs/{run_id}", headers=RITA).json()["agentRevisionId"] == "agrev-2026-03"
    listed = {item["runId"]: item for item in client.get("/runs", headers=RITA).json()["items"]}
    assert listed[run_id]["agentRevisionId"] == "agrev-2026-03"

    plain = _submit(client, "k-2")
    assert plain.status_code == 201 and plain.json()["agentRevisionId"] is None


def test_a_repeat_with_another_agent_revision_is_a_conflict_naming_it_exe_14(api: Any) -> None:
    client, tenure = api
    assert _submit(client, "k-1", agentRevisionId="agrev-1").status_code == 201
    assert _submit(client, "k-1", agentRevisionId="agrev-1").status_code == 200
    conflict = _submit(client, "k-1", agentRevisionId="agrev-2")
    assert conflict.status_code == 409 and conflict.json()["fields"] == ["agentRevisionId"]
    assert _submit(client, "k-1").json()["fields"] == ["agentRevisionId"]
    assert len(tenure.commands_of(SubmitRun)) == 1


@pytest.mark.parametrize(
    "revision",
    ["", "a" * 201, "agrev\n1", "agrev\x001", "agrev\x7f", 7, ["agrev-1"]],
    ids=["empty", "too-long", "line-feed", "nul", "del", "number", "list"],
)
def test_a_malformed_agent_revision_is_a_422_problem_and_nothing_is_published_exe_14(
    api: Any, revision: Any
) -> None:
    client, tenure = api
    refused = _submit(client, "k-bad", agentRevisionId=revision)
    assert refused.status_code == 422, refused.text
    assert refused.headers["content-type"] == PROBLEM_JSON
    assert refused.json()["type"] == "/problems/validation-failed"
    assert tenure.commands_of(SubmitRun) == []


def test_the_submit_body_publishes_agent_revision_in_openapi_exe_14(api: Any) -> None:
    client, _ = api
    schema = client.get("/openapi.json").json()["components"]["schemas"]["SubmitRunRequest"]
    field = schema["properties"]["agentRevisionId"]
    assert "agentRevisionId" not in schema.get("required", [])
    assert any(option.get("maxLength") == 200 for option in field.get("anyOf", [field]))
