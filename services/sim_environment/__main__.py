"""`python -m services.sim_environment`: serve the simulated environment with uvicorn.

Environment: TENURE_SIM_HOST (default 127.0.0.1; 0.0.0.0 inside a container), TENURE_SIM_PORT
(default 9200), TENURE_SIM_TIME_SCALE (default 0: answer at once; 1.0: every operation takes its
nominal duration, e.g. a 4.2 s sandbox compile). Its state lives in memory: a restart (or
``POST /reset``) starts from an empty world.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import uvicorn

from services.sim_environment.app import create_app

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "SimConfigError",
    "listen_host",
    "listen_port",
    "main",
    "time_scale",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9200


class SimConfigError(ValueError):
    """An environment variable has a value the simulated environment cannot use."""


def listen_host(env: Mapping[str, str]) -> str:
    return env.get("TENURE_SIM_HOST", "").strip() or DEFAULT_HOST


def listen_port(env: Mapping[str, str]) -> int:
    raw = env.get("TENURE_SIM_PORT", "").strip()
    if not raw:
        return DEFAULT_PORT
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise SimConfigError(f"TENURE_SIM_PORT must be a TCP port (1-65535), got {raw!r}")
    return int(raw)


def time_scale(env: Mapping[str, str]) -> float:
    raw = env.get("TENURE_SIM_TIME_SCALE", "").strip()
    if not raw:
        return 0.0
    try:
        scale = float(raw)
    except ValueError:
        scale = -1.0
    if not math.isfinite(scale) or scale < 0:
        raise SimConfigError(f"TENURE_SIM_TIME_SCALE must be a finite number >= 0, got {raw!r}")
    return scale


def main() -> None:
    env = dict(os.environ)
    app = create_app(time_scale=time_scale(env))
    uvicorn.run(app, host=listen_host(env), port=listen_port(env), log_level="warning")


if __name__ == "__main__":
    main()
