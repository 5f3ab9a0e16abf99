"""The web console served by the real API process over the real broker (issue 17).

The lease coordinator, the projector and the API run as processes (tests/support/tenure.py) on
the session's Kafka broker. The browser reads what the projector folded, through the API's
RocksDB secondary and its real boards (breakers, schedules, quarantine). It filters the runs,
sees a heartbeat sent through the API appear on the run's timeline, and finds every board page
answering.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from services.common.kafka import create_topics
from services.common.topics import TOPICS
from tests.support.console_browser import open_page, rows, sign_in, wait_for
from tests.support.tenure import TenureSystem, claim, heartbeat, submit

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(180)]

KEYS = "olga-key=olga:operator,rita-key=rita:submitter"


@pytest.fixture(scope="module")
def system(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    create_topics(kafka_bootstrap, TOPICS)
    # Every renewal on runs.events (none kept off it, issue 16): the test watches one arrive live.
    s = TenureSystem(
        kafka_bootstrap,
        tmp_path_factory.mktemp("console-e2e"),
        TENURE_API_KEYS=KEYS,
        TENURE_LEASE_KEEPALIVE_FRACTION="0",
    )
    s.start()
    try:
        yield s
    finally:
        s.stop()


def test_the_console_over_the_real_api_shows_runs_and_a_live_timeline(
    system: TenureSystem, browser: Any
) -> None:
    # A tenant of its own: the projector folds every run that earlier modules left on this broker,
    # and this test's runs must be the whole of its filtered list, whichever modules ran first.
    tenant = f"console-{uuid4().hex[:8]}"
    with system.client("rita-key") as client:
        queued = submit(client, f"{tenant}-queued", tenant=tenant)["runId"]
        running = submit(client, f"{tenant}-running", tenant=tenant)["runId"]
        grant = claim(client, running, lease_seconds=60, heartbeat_seconds=20)
        assert grant.status_code == 201, grant.text
        assert heartbeat(client, grant.json(), 1).status_code == 200

        sign_in(browser, system.base, "olga-key", f"/ui/runs?tenant={tenant}")
        wait_for(lambda: {queued, running} <= set(rows(browser)), "both runs")
        Select(browser.find_element(By.ID, "filter-status")).select_by_value("running")
        browser.find_element(By.ID, "apply-filters").click()
        wait_for(lambda: rows(browser) == [running], "only the running run")
        browser.find_element(By.CSS_SELECTOR, f'tr[data-run-id="{running}"] a.run-link').click()
        events = "ol.timeline li.event"
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, events)) == 3, "the run's three events")
        assert heartbeat(client, grant.json(), 2).status_code == 200
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, events)) == 4, "the heartbeat, live", 10)
        newest = browser.find_element(By.CSS_SELECTOR, events)
        assert newest.get_attribute("data-type") == "LeaseRenewed" and "by rita" in newest.text

    for page, container in (
        ("/ui/breakers", "breakers"),
        ("/ui/schedules", "schedules"),
        ("/ui/incidents", "incidents"),
    ):
        open_page(browser, system.base + page)
        element = browser.find_element(By.ID, container)
        wait_for(lambda element=element: element.get_attribute("data-state") == "ok", f"{page} answered", 15)
