"""Screenshots of the console's main pages into docs/console/ (issue 17): `make console-screenshots`.

The same set-up as the browser tests: the console scene over the in-process harness, served by
uvicorn, shown in Debian's headless Chromium, signed in as an operator.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from selenium.webdriver.common.by import By

from tests.support.console_browser import chromium, missing_browser, serve_harness, wait_for
from tests.support.console_scene import KEYS, ConsoleTenure, build_scene, quarantine_scene

__all__ = ["main"]

WIDTH = 1440
MAX_HEIGHT = 2200


def _shoot(driver: Any, url: str, ready: str, out: Path) -> None:
    driver.set_window_size(WIDTH, 900)
    driver.get(url)
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, ready), f"{ready} on {url}")
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(WIDTH, min(MAX_HEIGHT, height + 160))
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, ready), f"{ready} on {url}")
    driver.save_screenshot(str(out))
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/console"))
    args = parser.parse_args(argv)
    why = missing_browser()
    if why is not None:
        print(why, file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    tenure = ConsoleTenure()
    with tempfile.TemporaryDirectory() as tmp, serve_harness(Path(tmp), KEYS, tenure) as (base, _):
        with httpx.Client(base_url=base, timeout=10) as client:
            scene = build_scene(client, tenure)
        quarantine_scene(tenure, scene)
        with chromium(WIDTH, 900) as driver:
            driver.get(base + "/ui/runs")
            driver.execute_script("sessionStorage.setItem('tenure.apiKey', 'olga-key')")
            pages = [
                ("runs.png", "/ui/runs", "table.runs"),
                ("run-timeline.png", f"/ui/runs/{scene.frozen}", "ol.timeline"),
                ("run-lease.png", f"/ui/runs/{scene.frozen}/lease", "section.lease"),
                ("run-trajectory.png", f"/ui/runs/{scene.frozen}/trajectory", ".trajectory .decision"),
                ("run-watchdog.png", f"/ui/runs/{scene.looping}/watchdog", "#watchdog table"),
                ("run-quarantine.png", f"/ui/runs/{scene.frozen}/quarantine", "table.taint"),
                ("breakers.png", "/ui/breakers", "table.breakers"),
                ("incidents.png", "/ui/incidents", "section.incident"),
                ("schedules.png", "/ui/schedules", "table.schedules"),
            ]
            for name, path, ready in pages:
                _shoot(driver, base + path, ready, args.out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
