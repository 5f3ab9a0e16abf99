"""The web console in real headless Chromium (issue 17): sign in, filter the runs, open a run and
watch its timeline change live, resolve an incident as an operator after a submitter is refused.

The API is the real app served by uvicorn over the in-process harness (tests/browser/conftest.py);
the browser is Debian's chromium driven by selenium (make browser-deps).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.support.console_browser import open_page, rows, sign_in, wait_for
from tests.support.console_scene import OLGA, RITA, SCRIPT, heartbeat

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


def test_a_key_is_asked_once_then_the_runs_list_filters_by_status_and_opens_a_run(
    live: Any, browser: Any
) -> None:
    base, _, scene = live
    open_page(browser, base + "/ui/runs")
    browser.execute_script("sessionStorage.clear()")
    open_page(browser, base + "/ui/runs")
    wait_for(lambda: browser.find_element(By.ID, "sign-in").is_displayed(), "the sign-in form")
    assert rows(browser) == [], "no data without a key"
    sign_in(browser, base, "rita-key")
    assert wait_for(lambda: len(rows(browser)) == 4 and rows(browser), "the runs") == [
        scene.queued,
        scene.frozen,
        scene.cancelled,
        scene.looping,
    ]
    assert "rita" in browser.find_element(By.ID, "whoami").text
    assert "rita-key" not in browser.current_url
    Select(browser.find_element(By.ID, "filter-status")).select_by_value("cancelled")
    browser.find_element(By.ID, "apply-filters").click()
    wait_for(lambda: rows(browser) == [scene.cancelled], "only the cancelled run")
    assert "status=cancelled" in browser.current_url
    browser.find_element(By.CSS_SELECTOR, f'tr[data-run-id="{scene.cancelled}"] a.run-link').click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "ol.timeline li.event"), "the run's timeline")
    timeline = browser.find_element(By.CSS_SELECTOR, "ol.timeline").text
    assert "RunCancelled" in timeline and "by rita" in timeline
    assert SCRIPT in timeline, "the reason's markup is shown as text"
    assert browser.execute_script("return document.querySelectorAll('main script').length") == 0


def test_the_run_timeline_updates_live_when_a_command_is_sent_through_the_api(
    live: Any, browser: Any
) -> None:
    base, _, scene = live
    sign_in(browser, base, "rita-key", f"/ui/runs/{scene.frozen}")
    events = "ol.timeline li.event"
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, events), "the timeline")
    before = len(browser.find_elements(By.CSS_SELECTOR, events))
    browser.execute_script("window.__sameDocument = true")
    with httpx.Client(base_url=base, timeout=10) as client:
        heartbeat(client, scene.lease, 10)
    wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, events)) == before + 1, "the new event", 8)
    newest = browser.find_element(By.CSS_SELECTOR, events)
    assert newest.get_attribute("data-type") == "LeaseRenewed"
    assert "sequence" in newest.text and "10" in newest.text
    assert browser.execute_script("return window.__sameDocument") is True, "updated in place, not reloaded"
    browser.find_element(By.LINK_TEXT, "Lease").click()
    wait_for(lambda: "Renewals (4)" in browser.find_element(By.ID, "lease").text, "the lease's renewals")
    browser.find_element(By.LINK_TEXT, "Trajectory").click()
    wait_for(lambda: "BACKWARD_ROLLBACK" in browser.find_element(By.ID, "trajectory").text, "the decision")


def test_a_submitter_is_refused_and_an_operator_resolves_the_incident(live: Any, browser: Any) -> None:
    base, _, scene = live
    incident = f'section.incident[data-incident-id="{scene.incident_id}"]'
    sign_in(browser, base, "rita-key", "/ui/incidents")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, incident), "the incident")
    assert "needs the operator role" in browser.find_element(By.ID, "incidents").text
    browser.find_element(By.CSS_SELECTOR, f"{incident} form.resolve button").click()
    flash = wait_for(lambda: browser.find_element(By.ID, "flash").text, "the refusal")
    assert flash.startswith("Not resolved. 403") and "operator" in flash
    assert browser.find_elements(By.CSS_SELECTOR, incident), "still open"

    browser.find_element(By.ID, "sign-out").click()
    sign_in(browser, base, "olga-key", "/ui/incidents")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, incident), "the incident")
    form = f"{incident} form.resolve"
    Select(browser.find_element(By.CSS_SELECTOR, f"{form} select")).select_by_value("compensated-manually")
    browser.find_element(By.CSS_SELECTOR, f"{form} input[name=note]").send_keys("VM terminated by hand")
    browser.find_element(By.CSS_SELECTOR, f"{form} button").click()
    wait_for(lambda: "resolved: compensated-manually" in browser.find_element(By.ID, "flash").text, "success")
    wait_for(lambda: not browser.find_elements(By.CSS_SELECTOR, incident), "the incident to leave the list")
    with httpx.Client(base_url=base, timeout=10) as client:
        trajectory = client.get(f"/runs/{scene.frozen}/trajectory", headers=OLGA).json()
        assert trajectory["incidents"][-1]["resolvedBy"] == "olga"
        assert trajectory["incidents"][-1]["resolutionNote"] == "VM terminated by hand"
        assert client.get("/incidents", headers=RITA).json()["items"] == []
