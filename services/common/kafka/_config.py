"""librdkafka settings shared by every client Tenure creates."""

from __future__ import annotations

from typing import Any

from services.common.kafka._client_settings import client_config

__all__ = ["base_config", "normalise_headers"]


def base_config(bootstrap_servers: str, client_id: str) -> dict[str, Any]:
    """Tenure's per-client id, then the operator's properties (TLS, SASL, a client.id of their
    own for quotas...; services/common/kafka/_client_settings.py), then what Tenure manages."""
    return {
        "client.id": client_id,
        **client_config().properties,
        "bootstrap.servers": bootstrap_servers,
        # Java's default partitioner, so a record keyed by runId lands on the same partition
        # whichever client (Java, librdkafka, aiokafka) produced it: co-partitioning depends on it.
        "partitioner": "murmur2_random",
    }


def normalise_headers(raw: Any) -> tuple[tuple[str, bytes], ...]:
    if not raw:
        return ()
    return tuple((str(k), bytes(v) if v is not None else b"") for k, v in raw)
