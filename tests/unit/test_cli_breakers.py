"""`tenure breakers` and the breaker lines of `tenure tail` (issue 13 part 3, BRK-1, BRK-2).

The CLI talks to the real API app over tests/support/api_harness.py (its HTTP client is swapped
for the in-process one; everything else, the operator key included, is the CLI's own). The
tail's rendering is checked on every kind of breaker event the breaker's pure core records.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.common.contracts import SUCCESS, TRANSPORT_FAILURE, ForceOpenBreaker, ResetBreaker
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.topics import BREAKERS_EVENTS
from services.tenure_cli import main as cli
from services.tenure_cli import topic_tools
from tests.support.api_harness import InMemoryTenure
from tests.support.cli_api import cli_on_api, run_cli
from tests.support.tenure import free_port
from tests.unit.breakers.support import Breaker, disable, force_open, report, request, reset

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,olga-key=olga:operator"
ENDPOINT = "env/vm.provision"


@pytest.fixture()
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, InMemoryTenure]]:
    with cli_on_api(tmp_path, monkeypatch, KEYS) as (client, tenure):
        yield client, tenure


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, *argv)


def _open(tenure: InMemoryTenure) -> None:
    tenure.report_outcomes(ENDPOINT, [SUCCESS] * 2 + [TRANSPORT_FAILURE] * 8)


def test_list_is_a_table_and_json_on_request_brk_1(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _, tenure = api
    code, out, _ = _run(capsys, "breakers", "--api-key", "rita-key")
    assert code == 0 and "No breakers" in out
    tenure.report_outcomes("ledger", [SUCCESS])
    _open(tenure)
    code, out, _ = _run(capsys, "breakers", "--api-key", "rita-key")
    assert code == 0, out
    header, *rows = out.strip().splitlines()
    assert header.split() == [
        "ENDPOINT",
        "STATUS",
        "FAILS-FAST",
        "ERROR-RATE",
        "WINDOW",
        "COOLDOWN-LEFT",
        "CANARY",
        "AGE",
    ]
    assert [row.split()[:5] for row in rows] == [
        [ENDPOINT, "open", "yes", "80%", "8/10"],
        ["ledger", "closed", "no", "0%", "0/1"],
    ]
    code, out, _ = _run(capsys, "breakers", "-o", "json", "--status", "open", "--api-key", "rita-key")
    body = json.loads(out)
    assert code == 0 and [b["endpoint"] for b in body["breakers"]] == [ENDPOINT]
    argv = ("breakers", "list", "--status", "closed", "-o", "json", "--api-key", "rita-key")
    code, out, _ = _run(capsys, *argv)
    assert code == 0 and [b["endpoint"] for b in json.loads(out)["breakers"]] == ["ledger"]


def test_get_describes_the_breaker_and_its_transitions_brk_1(
    api: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, tenure = api
    _open(tenure)
    monkeypatch.setenv("TENURE_CLI_API_KEY", "rita-key")  # the key from the settings
    code, out, _ = _run(capsys, "breakers", "get", ENDPOINT)
    assert code == 0, out
    assert f"Endpoint:     {ENDPOINT}" in out and "Status:       open (calls fail fast)" in out
    assert "8 of 10 calls failed (80%; W = 20)" in out
    assert "OPENED: 8/10 calls failed (80% > 50%); calls fail fast for 30s" in out
    for argv in (("breakers", "get", ENDPOINT, "-o", "json"), ("breakers", "-o", "json", "get", ENDPOINT)):
        code, out, _ = _run(capsys, *argv)
        assert code == 0 and json.loads(out)["transitions"][0]["type"] == "BreakerOpened"
    code, _, err = _run(capsys, "breakers", "get", "nowhere")
    assert code == 1 and "HTTP 404 breaker-not-found" in err


def test_an_operator_forces_open_and_resets_with_a_reason_brk_2(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, tenure = api
    tenure.report_outcomes(ENDPOINT, [SUCCESS])
    code, out, err = _run(
        capsys, "breakers", "force-open", ENDPOINT, "--reason", "vendor maintenance", "--api-key", "olga-key"
    )
    assert code == 0, err
    assert "Status:       forced-open (calls fail fast)" in out and "Reason:       vendor maintenance" in out
    assert "FORCED OPEN by olga (was closed): vendor maintenance" in out
    (command,) = tenure.commands_of(ForceOpenBreaker)
    assert (command.actor, command.reason) == ("olga", "vendor maintenance")
    code, out, err = _run(
        capsys,
        "breakers",
        "reset",
        ENDPOINT,
        "--reason",
        "vendor is back",
        "--api-key",
        "olga-key",
        "--idempotency-key",
        "rst-1",
        "-o",
        "json",
    )
    assert code == 0, err
    assert json.loads(out)["status"] == "closed" and json.loads(out)["reason"] == "vendor is back"
    code, out, _ = _run(
        capsys,
        "breakers",
        "reset",
        ENDPOINT,
        "--reason",
        "vendor is back",
        "--api-key",
        "olga-key",
        "--idempotency-key",
        "rst-1",
        "-o",
        "json",
    )
    assert code == 0 and json.loads(out)["replayed"] is True
    assert len(tenure.commands_of(ResetBreaker)) == 1


def test_a_submitter_is_refused_and_nothing_is_recorded_brk_2(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, tenure = api
    tenure.report_outcomes(ENDPOINT, [SUCCESS])
    for action in ("force-open", "disable", "reset"):
        code, out, err = _run(capsys, "breakers", action, ENDPOINT, "--reason", "x", "--api-key", "rita-key")
        assert code == 1 and out == "" and "HTTP 403 forbidden" in err, err
    code, _, err = _run(capsys, "breakers", "force-open", ENDPOINT, "--reason", "x")  # no key at all
    assert code == 1 and "HTTP 401 unauthenticated" in err
    assert tenure.commands_of(ForceOpenBreaker) == []


def test_an_override_needs_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["breakers", "force-open", ENDPOINT])
    assert exited.value.code == 2 and "--reason" in capsys.readouterr().err


def test_an_api_that_does_not_answer_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = _run(capsys, "breakers", "--api-url", url)
    assert code == 1 and out == ""
    assert err.startswith(f"tenure breakers: cannot reach the API at {url}") and "Traceback" not in err


# --- tenure tail ----------------------------------------------------------------------------------


def test_tail_follows_the_breakers_by_default() -> None:
    assert BREAKERS_EVENTS.name in topic_tools.DEFAULT_TAIL_TOPICS


def _every_breaker_event() -> list[Any]:
    """One history with every kind of breaker event, from the breaker's own pure core."""
    breaker = Breaker()
    breaker.outcomes([SUCCESS] * 2 + [TRANSPORT_FAILURE] * 8)  # outcomes, then BreakerOpened
    breaker.tick(30_000)  # BreakerHalfOpened
    granted = breaker.send(request("gw-a"))
    breaker.tick(60_000)  # CanaryExpired
    granted = breaker.send(request("gw-b"))
    assert isinstance(granted, tuple)
    breaker.send(report(granted[-1].canary_id, TRANSPORT_FAILURE, instance="gw-b"))  # BreakerReopened
    breaker.tick(60_000)
    granted = breaker.send(request("gw-a"))
    assert isinstance(granted, tuple)
    breaker.send(report(granted[-1].canary_id, SUCCESS, instance="gw-a"))  # BreakerClosed
    for command in (force_open("vendor incident"), disable("breaker misbehaves"), reset("recovered")):
        breaker.send(command)
    return breaker.events


def _tail_line(event: Any, offset: int) -> str:
    codec = MessageCodec()
    out = codec.outbound(BREAKERS_EVENTS.name, event.run_id, event)
    record = InboundRecord(BREAKERS_EVENTS.name, 0, offset, out.key, out.value, (), event.occurred_at)
    return topic_tools._pretty(topic_tools.decode_for_humans(codec, record))


def test_tail_renders_each_breaker_event_as_one_readable_line_brk_1_brk_2() -> None:
    events = _every_breaker_event()
    kinds = {type(e).__name__ for e in events}
    assert len(kinds) == 10, kinds  # every breaker event type is in the history
    lines: dict[str, str] = {}
    for offset, event in enumerate(events):  # the first of each kind
        lines.setdefault(type(event).__name__, _tail_line(event, offset))
    expected = {
        "CallOutcomeRecorded": "success from gw-a in 10 ms",
        "BreakerOpened": "OPENED: 8/10 calls failed (80% > 50%); calls fail fast for 30s, half-open at 20",
        "BreakerHalfOpened": "HALF-OPEN after a 30s cooldown: one canary may probe",
        "CanaryGranted": "granted to gw-a until 20",
        "CanaryExpired": "expired unreported; the slot is free",
        "BreakerReopened": "RE-OPENED: the canary of gw-b failed (transport-failure); cooldown 30s -> 1m00s",
        "BreakerClosed": "CLOSED: the canary of gw-a succeeded in 12 ms after",
        "BreakerForcedOpen": "FORCED OPEN by user:ops (was closed): vendor incident",
        "BreakerDisabled": "DISABLED by user:ops (was forced-open): breaker misbehaves",
        "BreakerReset": "RESET to closed by user:ops (was disabled): recovered",
    }
    failed = _tail_line(events[2], 2)  # the first transport failure
    assert "CallOutcomeRecorded" in failed and "transport-failure from gw-a in 10 ms, a failure" in failed
    for kind, fragment in expected.items():
        line = lines[kind]
        assert fragment in line, (kind, line)
        assert "\n" not in line and line.endswith("]") and ENDPOINT in line
        assert "=" not in line.split(ENDPOINT, 1)[1].split("[")[0], line  # a sentence, not k=v pairs
