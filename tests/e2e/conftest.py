"""Fixtures for tests that run against the real broker."""

from __future__ import annotations

import pytest

from services.common.kafka import create_topics
from services.common.topics import TOPICS


@pytest.fixture(scope="session")
def tenure_topics(kafka_bootstrap: str) -> str:
    """The broker with Tenure's topics created from the catalog (idempotent)."""
    create_topics(kafka_bootstrap, TOPICS)
    return kafka_bootstrap
