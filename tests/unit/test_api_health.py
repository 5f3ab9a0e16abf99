"""Liveness and readiness of the command API (issue 10): /healthz and /readyz.

/healthz answers while the process serves and says whether it runs in development mode;
/readyz checks Kafka, the views store and the decision and policy followers, and is a 503
problem with Retry-After naming what is not ready. Over tests/support/api_harness.py, whose
broker, views and followers can be made to fail one by one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.command_api import context
from services.command_api.app import create_app
from services.command_api.context import ViewReader
from services.common.auth import DEVELOPMENT_MODE_WARNING
from services.common.decisions import FollowerHealth
from tests.support.api_harness import InMemoryTenure, api_client

CHECKS = [
    "kafka",
    "views",
    "runDecisions",
    "trajectoryDecisions",
    "watchdogDecisions",
    "blockPolicy",
    "breakers",
    "breakerDecisions",
]


def test_healthz_is_liveness_and_reports_development_mode(tmp_path: Path) -> None:
    with api_client(tmp_path) as (client, tenure):
        tenure.mode = "down"  # liveness does not depend on Kafka
        body = client.get("/healthz").json()
        assert body == {"status": "ok", "service": "tenure-command-api", "developmentMode": True}
    with api_client(tmp_path, api_keys="k=alice:submitter") as (client, _):
        response = client.get("/healthz")  # no credentials needed for a probe
        assert response.status_code == 200 and response.json()["developmentMode"] is False


def test_readyz_is_200_with_every_check_when_all_is_well(tmp_path: Path) -> None:
    with api_client(tmp_path, api_keys="k=alice:submitter") as (client, _):
        response = client.get("/readyz")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "ready" and body["developmentMode"] is False
        assert list(body["checks"]) == CHECKS
        assert all(check["ready"] is True and check["detail"] for check in body["checks"].values())


def _not_ready(response: Any) -> dict[str, Any]:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert int(response.headers["retry-after"]) >= 1
    body: dict[str, Any] = response.json()
    assert body["type"] == "/problems/not-ready" and list(body["checks"]) == CHECKS
    return body


def test_readyz_names_kafka_when_no_broker_answers(tmp_path: Path) -> None:
    with api_client(tmp_path) as (client, tenure):
        tenure.mode = "down"
        body = _not_ready(client.get("/readyz"))
        assert body["notReady"] == ["kafka"]
        kafka = body["checks"]["kafka"]
        assert kafka["ready"] is False and "all brokers down" in kafka["detail"]


def test_readyz_names_the_views_when_the_store_is_not_there(tmp_path: Path) -> None:
    tenure = InMemoryTenure()
    deps = tenure.dependencies(tmp_path)
    deps.views = ViewReader(tmp_path / "no-views", tenure.codec)  # what the API opens without projections
    with TestClient(create_app(lambda: deps)) as client:
        body = _not_ready(client.get("/readyz"))
        assert body["notReady"] == ["views"] and "not built yet" in body["checks"]["views"]["detail"]


def test_readyz_names_decision_followers_and_the_policy_that_are_not_following(tmp_path: Path) -> None:
    with api_client(tmp_path) as (client, tenure):
        tenure.run_book.state = FollowerHealth(False, "consuming fails: broker transport failure")
        tenure.blocks.current = False
        body = _not_ready(client.get("/readyz"))
        assert body["notReady"] == ["runDecisions", "blockPolicy"]
        assert "consuming fails" in body["detail"]
        tenure.run_book.state = FollowerHealth(True, "following", 0)
        tenure.blocks.current = True
        assert client.get("/readyz").status_code == 200


def test_the_api_says_development_mode_loudly_once_when_it_opens_its_dependencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The docstring of command_api/auth.py promised this warning; open_dependencies gives it."""

    class Offline:  # stands in for every Kafka client open_dependencies creates
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.kwargs = kwargs

        def deliver_kept(self, decoded: Any) -> None:
            """The decision follower's hook, handed to the projection (never called here)."""

    clients = (
        "CommandPublisher",
        "DecisionListener",
        "BlockList",
        "ApiBreakerBoard",
        "QuarantineBoard",
        "ApiProjection",  # follows the view topics into the API's own store
    )
    for name in (*clients, "ScheduleBoard"):
        monkeypatch.setattr(context, name, Offline)
    monkeypatch.setenv("TENURE_API_KEYS", "")
    with caplog.at_level(logging.WARNING, logger="tenure.auth"):
        deps = context.open_dependencies("127.0.0.1:1", tmp_path / "views", 2.0, tmp_path / "artifacts")
    assert [r.getMessage() for r in caplog.records] == [DEVELOPMENT_MODE_WARNING]
    # The publisher gives up on a command a little after its request did (not librdkafka's 300 s).
    assert 2.0 < deps.publisher.kwargs["delivery_timeout_s"] <= 6.0  # type: ignore[attr-defined]

    caplog.clear()
    monkeypatch.setenv("TENURE_API_KEYS", "k=alice:submitter")
    with caplog.at_level(logging.WARNING, logger="tenure.auth"):
        context.open_dependencies("127.0.0.1:1", tmp_path / "views", 2.0, tmp_path / "artifacts")
    assert not caplog.records
