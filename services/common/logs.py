"""Structured logs: one JSON object per line on stderr, so operators can grep and ship them."""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["configure_logging"]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "INFO", service: str = "tenure") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter())
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
