"""Fixtures of the console's browser tests: one API (uvicorn over the in-process harness, with the
console scene) and one headless Chromium per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.console_browser import chromium, missing_browser, serve_harness
from tests.support.console_scene import KEYS, ConsoleTenure, Scene, build_scene, quarantine_scene


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ConsoleTenure, Scene]]:
    tenure = ConsoleTenure()
    with serve_harness(Path(tmp_path_factory.mktemp("console")), KEYS, tenure) as (base, _):
        with httpx.Client(base_url=base, timeout=10) as client:
            scene = build_scene(client, tenure)
        quarantine_scene(tenure, scene)
        yield base, tenure, scene


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    why = missing_browser()
    if why is not None:
        pytest.fail(why)  # never a skip: a browser test that did not run has not passed
    with chromium() as driver:
        yield driver
