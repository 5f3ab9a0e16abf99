"""The HTTP stack's own floor: Tenure's server settings around one route that does no work.

`python -m bench._floor_app PORT` serves `POST /runs/{runId}/trajectory/steps` with a pydantic
body shaped like a step proposal and answers a 202 ticket, through `serve_http` (uvicorn on
uvloop and httptools, Tenure's keep-alive), but with none of Tenure's middlewares, auth,
commands, Kafka or views. What a request costs here is what FastAPI and uvicorn cost on this
machine; everything the command API spends above it is Tenure's (bench/step_floor.py).
"""

from __future__ import annotations

import sys
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from services.common.http_serve import serve_http
from services.common.settings import TenureSettings

__all__ = ["app", "main"]

app = FastAPI()


class Proposal(BaseModel):
    attemptId: str = Field(min_length=1, max_length=200)
    leaseEpoch: int = Field(ge=0, le=2**63 - 1)
    tool: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)


@app.post("/runs/{run_id}/trajectory/steps", status_code=202)
async def propose(run_id: str, body: Proposal) -> dict[str, Any]:
    return {"runId": run_id, "stepIndex": 0, "dispatch": 1, "version": 3, "tool": body.tool}


def main() -> None:
    serve_http(app, "127.0.0.1", int(sys.argv[1]), TenureSettings())


if __name__ == "__main__":
    main()
