"""Structured logs: one JSON object per line on stderr, so operators can grep and ship them.

Every line names its `service`. Where a line is about one run, one record or one request, the
call site passes the context explicitly with `log_fields(run_id=..., partition=..., ...)` as the
`extra` of the call (no ambient context variables: what a line says is visible where it is
logged). uvicorn's own loggers, its access log included, go through the same formatter
(`uvicorn_log_config`); the access log is off unless TENURE_ACCESS_LOG is set, and its lines
carry method, path, status and client as fields.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["configure_logging", "log_fields", "uvicorn_log_config"]

# The context a line can carry, by keyword, with the JSON field each one becomes.
_CONTEXT_FIELDS = {
    "run_id": "runId",
    "attempt_id": "attemptId",
    "epoch": "epoch",
    "partition": "partition",
    "offset": "offset",
    "correlation_id": "correlationId",
    "command_id": "commandId",
    "topic": "topic",
}
_ACCESS_ARGS = ("client", "method", "path", "httpVersion", "status")


def log_fields(**context: Any) -> dict[str, Any]:
    """`extra=` for a logging call: the given context (None values left out) as JSON fields."""
    unknown = set(context) - set(_CONTEXT_FIELDS)
    if unknown:
        raise TypeError(f"unknown log context {sorted(unknown)}; known: {sorted(_CONTEXT_FIELDS)}")
    return {"fields": {_CONTEXT_FIELDS[k]: v for k, v in context.items() if v is not None}}


class _JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            entry.update(zip(_ACCESS_ARGS, record.args, strict=True))
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "INFO", service: str = "tenure") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Our own logger keeps its handler and level even when a framework (faust's worker)
    # reconfigures the root logger after us.
    ours = logging.getLogger("tenure")
    ours.handlers[:] = [handler]
    ours.setLevel(level.upper())
    ours.propagate = False
    logging.getLogger("tenure").info("starting", extra={"fields": {"service": service}})


def uvicorn_log_config(level: str = "WARNING") -> dict[str, Any]:
    """uvicorn's `log_config`: its loggers keep no handler of their own and propagate to the root
    logger, whose handler `configure_logging` set, so their lines are JSON like every other."""
    quiet = {"handlers": [], "propagate": True, "level": level.upper()}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {
            "uvicorn": quiet,
            "uvicorn.error": quiet,
            # The access log is switched on by uvicorn's `access_log` flag; at INFO when it is.
            "uvicorn.access": {"handlers": [], "propagate": True, "level": "INFO"},
        },
    }
