"""The web console in a real browser: uvicorn serving the API over the in-process harness in a
thread, and Debian's headless Chromium driven by selenium.

Selenium must not download a browser or a driver (selenium-manager has no network here): both
are Debian's, at fixed paths, installed by `make browser-deps`.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from selenium.webdriver.common.by import By

from services.command_api.app import create_app
from tests.support.api_harness import InMemoryTenure
from tests.support.system import free_port

__all__ = [
    "CHROMEDRIVER",
    "CHROMIUM",
    "chromium",
    "missing_browser",
    "open_page",
    "rows",
    "serve_harness",
    "sign_in",
    "wait_for",
]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists() and shutil.which(Path(path).name) is None:
            return f"{path} is missing: run `make browser-deps` (Debian's chromium and chromium-driver)"
    return None


@contextmanager
def serve_harness(
    tmp: Path, api_keys: str, tenure: InMemoryTenure | None = None
) -> Iterator[tuple[str, InMemoryTenure]]:
    """The real app on a real port (uvicorn in a thread) over an InMemoryTenure: (base URL, it)."""
    system = tenure or InMemoryTenure()
    app = create_app(lambda: system.dependencies(tmp, api_keys, decision_timeout_s=5.0))
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="console-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the API did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", system
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def chromium(width: int = 1440, height: int = 1000) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 10.0) -> Any:
    """`check()` once it is truthy (exceptions count as not yet), else AssertionError naming `what`."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # a stale element or a fragment not swapped in yet
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last})" if last else ""))


# --- driving the console ---------------------------------------------------------------------------


def open_page(driver: Any, url: str) -> None:
    driver.get(url)
    wait_for(lambda: driver.execute_script("return document.readyState") == "complete", f"{url} to load")


def sign_in(driver: Any, base: str, key: str, path: str = "/ui/runs") -> None:
    open_page(driver, base + path)
    driver.execute_script("sessionStorage.clear()")
    open_page(driver, base + path)
    form = wait_for(lambda: driver.find_element(By.ID, "sign-in").is_displayed(), "the sign-in form")
    assert form
    driver.find_element(By.ID, "api-key").send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#sign-in-form button").click()
    wait_for(lambda: driver.find_element(By.CSS_SELECTOR, "#whoami .principal").text, "the principal shown")


def rows(driver: Any) -> list[str]:
    found = driver.find_elements(By.CSS_SELECTOR, "table.runs tbody tr")
    return [r.get_attribute("data-run-id") for r in found]
